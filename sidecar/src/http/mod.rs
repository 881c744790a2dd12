//! HTTP: health, the Dapr state/secret/configuration/metadata routes,
//! metrics and status.
//!
//! The state GET of a plain key is routed by `HotPath`, before the router;
//! it is observed and answered as the router would. `HotPath` also cleans
//! every path, and sends a `GET` or `DELETE` of a key named `bulk` or
//! `transaction` to the key route, as Dapr's router falls back to `{key}`.
//! On Dapr's routes a `+` in a path parameter is a space (`path_params`).
//!
//! Every other call goes through one middleware, `observe`, which in turn:
//! opens its trace span, checks `auth` (the app token; the admin token for
//! status and metrics), bounds it by `deadline` (`request_timeout`), runs
//! its handler and records its metrics. A handler loads the generation serving
//! once (a [`Call`](crate::dapr::Call)) and uses that snapshot throughout.
//! Handlers are thin: they decode the request, run the shared Dapr
//! operation ([`crate::dapr`]) and encode its answer or error. Bodies are
//! limited to `max_request_bytes` (413). Errors are Dapr's JSON errors
//! ([`HttpError`]); unknown routes, and known routes with another method,
//! answer 404 `ERR_NOT_FOUND`.

mod auth;
mod call;
mod configuration;
mod deadline;
mod error;
mod error_details;
mod file;
mod health;
mod hot_path;
mod input;
mod lock;
mod metadata;
mod metrics;
mod observe;
mod path_params;
mod pubsub;
mod rewire_error;
mod routes;
mod secrets;
mod sequencer;
mod state;
mod state_query;
mod state_transaction;
mod status;

use axum::extract::DefaultBodyLimit;
use axum::http::{Method, Uri};
use axum::routing::{get, post, put};
use axum::{middleware, Extension, Router};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use error::HttpError;

use hot_path::HotPath;

use std::sync::Arc;

use axum::extract::Request;
use axum::serve::Listener;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use tower_service::Service;

use crate::connection::{accept_loop, ConnectionLimits, CountRequests};
use crate::{ApiError, ApiState};

/// The HTTP API as a router (for serving, or for tests that drive it
/// without a socket). Served, it is behind `HotPath`, which cleans paths
/// and routes a few of them first.
pub fn router(state: ApiState) -> Router {
    router_until(state, CancellationToken::new())
}

/// The router; the configuration subscriptions it opens end when `stop` is
/// cancelled.
fn router_until(state: ApiState, stop: CancellationToken) -> Router {
    let updates = configuration::updates(&state, stop);
    Router::new()
        .route(routes::HEALTHZ, get(health::healthz))
        .route(routes::HEALTHZ_OUTBOUND, get(health::outbound))
        .route(routes::STATE, post(state::save).put(state::save))
        .route(
            routes::STATE_BULK,
            post(state::bulk_get).put(state::bulk_get),
        )
        .route(
            routes::STATE_TRANSACTION,
            post(state_transaction::execute).put(state_transaction::execute),
        )
        .route(routes::STATE_KEY, get(state::get).delete(state::delete))
        .route(
            routes::STATE_QUERY_ALPHA1,
            post(state_query::query).put(state_query::query),
        )
        .route(routes::LOCK, post(lock::try_lock))
        .route(routes::UNLOCK, post(lock::unlock))
        .route(routes::SECRETS_BULK, get(secrets::bulk))
        .route(routes::SECRET, get(secrets::get))
        .route(routes::CONFIGURATION, get(configuration::get))
        .route(routes::CONFIGURATION_ALPHA1, get(configuration::get))
        // The subscriptions' state only on their routes: a layer on the
        // whole router would clone it into every request's extensions.
        // A `GET` that changes state is not served to a `HEAD` (axum's
        // default), whose answer, stripped of its body, would hide the
        // change: here and on the sequencer's route.
        .route(
            routes::CONFIGURATION_SUBSCRIBE,
            get(configuration::subscribe)
                .head(not_found)
                .layer(Extension(updates.clone())),
        )
        .route(
            routes::CONFIGURATION_SUBSCRIBE_ALPHA1,
            get(configuration::subscribe)
                .head(not_found)
                .layer(Extension(updates.clone())),
        )
        .route(
            routes::CONFIGURATION_UNSUBSCRIBE,
            get(configuration::unsubscribe)
                .head(not_found)
                .layer(Extension(updates.clone())),
        )
        .route(
            routes::CONFIGURATION_UNSUBSCRIBE_ALPHA1,
            get(configuration::unsubscribe)
                .head(not_found)
                .layer(Extension(updates)),
        )
        .route(routes::PUBLISH, post(pubsub::publish).put(pubsub::publish))
        .route(
            routes::PUBLISH_BULK,
            post(pubsub::bulk_publish).put(pubsub::bulk_publish),
        )
        .route(
            routes::PUBLISH_BULK_V1,
            post(pubsub::bulk_publish).put(pubsub::bulk_publish),
        )
        .route(routes::METADATA, get(metadata::get))
        .route(routes::METADATA_KEY, put(metadata::put))
        .route(routes::METRICS, get(metrics::get))
        .route(routes::STATUS, get(status::get))
        .route(
            routes::SEQUENCER,
            post(sequencer::next_id)
                .get(sequencer::next_id)
                .head(not_found),
        )
        .route(routes::FILES, get(file::list))
        .route(
            routes::FILE,
            put(file::put)
                .get(file::get)
                .head(file::stat)
                .delete(file::delete),
        )
        .fallback(not_found)
        .method_not_allowed_fallback(not_found)
        .layer(DefaultBodyLimit::max(state.options.max_request_bytes))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            observe::observe,
        ))
        .with_state(state)
}

/// Bytes of an HTTP/1 request head hyper buffers at most: a URI at
/// hyper's own limit (64 KiB) and 16 KiB of headers. hyper's default
/// (about 400 KiB) let a head sent nearly whole and then stalled hold that
/// much on each connection, without a token, until the idle timeout; a
/// longer head is answered 431 and the connection closed.
const MAX_HEAD_BUFFER: usize = 80 * 1024;

/// Bytes of an answer h2 buffers per stream ahead of the client's window
/// (h2's default: 400 KiB). hyper hands h2 the next slice of an answer
/// whenever the stream has room in this buffer, and bytes handed on leave
/// the reply budget: a client granting a huge window and then not reading
/// the socket would hold this much per stream outside the budget (about
/// 80 MiB per connection over hyper's 200 streams at h2's default).
const MAX_SEND_BUFFER_PER_STREAM: usize = 64 * 1024;

/// Serves HTTP on `listener` until `shutdown` is cancelled; calls in
/// flight finish first (within `shutdown_grace`, then every connection is
/// cut). Connections are bounded ([`crate::connection`]).
pub async fn serve(
    state: ApiState,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> Result<(), ApiError> {
    crate::tls::install_ring_provider();
    // TLS configured but not loaded (library use) fails closed.
    state
        .tls
        .check_against(&state.options.tls)
        .map_err(ApiError::Tls)?;
    let limits = ConnectionLimits::after_shutdown(&state.options, &shutdown);
    let cut = limits.cut.clone();
    let mut accepted = accept_loop(listener, limits, shutdown.clone(), state.tls.http.clone());
    let budget = state.options.body_budget();
    let router = router_until(state.clone(), shutdown.child_token());
    let hot_path = HotPath::new(router, state);
    // axum's own loop (`axum::serve`), but with hyper's builder in hand:
    // axum's cannot bound the HTTP/1 head buffer.
    let mut builder = Builder::new(TokioExecutor::new());
    builder.http1().max_buf_size(MAX_HEAD_BUFFER);
    builder
        .http2()
        .enable_connect_protocol()
        .max_send_buf_size(MAX_SEND_BUFFER_PER_STREAM);
    let graceful = GracefulShutdown::new();
    loop {
        let (connection, _) = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = Listener::accept(&mut accepted) => accepted,
        };
        // Each request counts in its connection's requests in flight,
        // held by the connection's service (nothing looked up or added
        // per request).
        let counted = CountRequests::for_connection(
            hot_path.clone(),
            connection.in_flight().clone(),
            Arc::clone(&budget),
        );
        let service = hyper::service::service_fn(move |request: Request<Incoming>| {
            let mut service = counted.clone();
            async move {
                let request = request.map(axum::body::Body::new);
                std::future::poll_fn(|cx| service.poll_ready(cx)).await?;
                service.call(request).await
            }
        });
        let (builder, watcher, cut) = (builder.clone(), graceful.watcher(), cut.clone());
        tokio::spawn(async move {
            let served = builder.serve_connection_with_upgrades(TokioIo::new(connection), service);
            // At the cut the connection goes, with the call it runs: its
            // socket alone may not be polled then (an HTTP/1 request
            // pipelined behind a running call is left in hyper's buffer,
            // and the socket read until that call ends).
            tokio::select! {
                served = watcher.watch(served) => if let Err(error) = served {
                    tracing::trace!(error = %error, "HTTP connection ended with an error.");
                },
                () = cut.cancelled() => {
                    tracing::trace!("HTTP connection cut at the end of the shutdown grace.");
                }
            }
        });
    }
    // Stop accepting (the loop holds the listener), then let the calls in
    // flight finish: the shutdown grace cuts the connections after that.
    drop(accepted);
    graceful.shutdown().await;
    Ok(())
}

async fn not_found(method: Method, uri: Uri) -> HttpError {
    HttpError::RouteNotFound {
        method: method.to_string(),
        path: uri.path().to_string(),
    }
}
