//! gRPC: `dapr.proto.runtime.v1.Dapr` (the subset rewire serves),
//! `rewire.lifecycle.v1.Lifecycle`, and Layotto's
//! `spec.proto.runtime.v1.Runtime` and `.Lifecycle`, on one server.
//!
//! Every call loads the generation serving once and uses that snapshot
//! throughout, so it sees one consistent component set even while a reload
//! swaps instances. Methods of Dapr's API that are not in the subset answer
//! `UNIMPLEMENTED` (the generated server does that for unknown paths).
//!
//! * The app token (`dapr-api-token`) guards the Dapr service and the admin
//!   token (`rewire-admin-token`) the Lifecycle service, each through its
//!   own interceptor (`auth`).
//! * Requests larger than [`ApiOptions::max_request_bytes`] are refused with
//!   `RESOURCE_EXHAUSTED` naming the size and the limit (`limits`).
//! * Unary Dapr and Layotto calls are cut after
//!   [`ApiOptions::request_timeout`]; Lifecycle calls answer before
//!   [`ApiOptions::push_timeout`] (at least the init timeout plus 15 s) or
//!   the caller's deadline; streams (configuration subscriptions) last
//!   until unsubscribed, the client leaves, or the server shuts down.
//!   Every call but Layotto's `PutFile` is also cut after the longer of
//!   the two (`call_bound`); an upload is cut only when no chunk arrives
//!   for `request_timeout` (`layotto_file`). The caller's `grpc-timeout`
//!   bounds every call.
//! * Every call is counted in the request metrics (`observe`).
//! * The data-plane unary calls (Dapr's and Layotto's) in their plain form
//!   are answered in front of the routes (`hot_path`), by the same
//!   handlers, without tonic's router and codec; anything unusual about
//!   one goes through the routes as every other call does.
//! * The handlers are thin: they turn messages into calls of the shared
//!   Dapr operations ([`crate::dapr`]) and their errors into statuses
//!   (`status`).
//!
//! [`ApiOptions::max_request_bytes`]: crate::ApiOptions::max_request_bytes
//! [`ApiOptions::request_timeout`]: crate::ApiOptions::request_timeout
//! [`ApiOptions::push_timeout`]: crate::ApiOptions::push_timeout

mod auth;
mod call_bound;
mod checked_codec;
mod dapr;
mod dapr_config;
mod dapr_lock;
mod dapr_metadata;
mod dapr_pubsub;
mod dapr_pubsub_stream;
mod dapr_secrets;
mod dapr_state;
mod dapr_state_transaction;
mod decoded;
mod endable_stream;
mod hot_path;
mod layotto;
mod layotto_config;
mod layotto_convert;
mod layotto_date;
mod layotto_file;
mod layotto_lifecycle;
pub(crate) mod layotto_pubsub;
mod lifecycle;
mod lifecycle_patch;
mod lifecycle_wait;
mod limits;
mod observe;
pub(crate) mod open_subscriptions;
pub mod proto;
mod status;
pub(crate) mod subscription_forward;
pub(crate) mod subscription_queue;
mod subscriptions;
mod unary_body;

use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Server;

use crate::auth::{ADMIN_TOKEN_HEADER, APP_TOKEN_HEADER};
use crate::connection::{accept_loop, ConnectionLimits, CountRequestsLayer};
use crate::tls::RequireClientCert;
use crate::{ApiError, ApiState};
use auth::{Refusal, RequireToken};
use call_bound::CallBoundLayer;
use dapr::DaprApi;
use decoded::HoldDecodedLayer;
use hot_path::HotPathLayer;
use layotto::LayottoApi;
use layotto_lifecycle::LayottoLifecycleApi;
use lifecycle::LifecycleApi;
use limits::ClearLimit;
use proto::dapr::proto::runtime::v1::dapr_server::DaprServer;
use proto::rewire::lifecycle::v1::lifecycle_server::LifecycleServer;
use proto::spec::proto::runtime::v1::lifecycle_server::LifecycleServer as LayottoLifecycleServer;
use proto::spec::proto::runtime::v1::runtime_server::RuntimeServer as LayottoRuntimeServer;

/// Streams (calls and subscriptions) open at once on one connection.
const MAX_STREAMS_PER_CONNECTION: u32 = 256;
/// Header bytes one request may carry.
const MAX_HEADER_BYTES: u32 = 16 * 1024;
/// Streams one connection may make the server reset for its own protocol
/// errors before it is closed: h2's own default, which tonic turns off.
const MAX_LOCAL_ERROR_RESETS: usize = 1024;

/// The shortest wait between the server's HTTP/2 pings.
const MIN_PING_INTERVAL: Duration = Duration::from_millis(1);

/// The longest wait between the server's HTTP/2 pings: hyper adds it to
/// an instant, so options [`ApiServer::bind`](crate::ApiServer::bind)
/// would refuse (`Duration::MAX`) cannot overflow it.
const MAX_PING_INTERVAL: Duration = Duration::from_secs(24 * 3600);

/// How often a connection is pinged (and how long an answer may take): a
/// third of `idle_timeout`, so a live client's quiet stream stays open;
/// never zero, and at most a day.
fn ping_interval(idle_timeout: Duration) -> Duration {
    (idle_timeout / 3).clamp(MIN_PING_INTERVAL, MAX_PING_INTERVAL)
}

/// Serves gRPC on `listener` until `shutdown` is cancelled; in-flight calls
/// finish first (within `shutdown_grace`, then every connection is cut),
/// and open configuration subscriptions end. Connections are bounded
/// ([`crate::connection`]).
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
    let options = state.options.clone();
    let limit = options.max_request_bytes;
    let dapr_api = std::sync::Arc::new(DaprApi::new(state.clone(), shutdown.clone()));
    let dapr = DaprServer::from_arc(dapr_api.clone()).max_decoding_message_size(limit);
    let app_auth = RequireToken::new(
        options.app_token.clone(),
        &[APP_TOKEN_HEADER],
        Refusal::Dapr,
        &state,
    );
    let push_timeout = lifecycle_wait::lifecycle_timeout(&state);
    let lifecycle_api = std::sync::Arc::new(LifecycleApi::new(state.clone(), push_timeout));
    let lifecycle =
        LifecycleServer::from_arc(lifecycle_api.clone()).max_decoding_message_size(limit);
    // Layotto's services: the same operations, tokens and limits; its
    // configuration streams count into the same queued total as Dapr's.
    let (queued, topic_streams) = (dapr_api.queued(), dapr_api.topic_streams());
    let layotto_api = std::sync::Arc::new(LayottoApi::new(
        state.clone(),
        shutdown.clone(),
        queued,
        topic_streams,
    ));
    let layotto =
        LayottoRuntimeServer::from_arc(layotto_api.clone()).max_decoding_message_size(limit);
    let hot_path = HotPathLayer::new(dapr_api, layotto_api, app_auth.clone(), limit);
    let layotto_lifecycle = LayottoLifecycleServer::new(LayottoLifecycleApi::new(lifecycle_api))
        .max_decoding_message_size(limit);
    // The admin token may come in its own header or, as Dapr clients send
    // tokens, in `dapr-api-token`. Without an admin token, the app token (if
    // any) guards the Lifecycle API too: it is never more open than the app
    // API. A Lifecycle client CA replaces that fallback (the certificate is
    // the admin credential), and is required in addition to an admin token.
    let lifecycle_ca = options.tls.lifecycle_client_ca.is_some();
    let admin_token = match (&options.admin_token, lifecycle_ca) {
        (Some(token), _) => Some(token.clone()),
        (None, false) => options.app_token.clone(),
        (None, true) => None,
    };
    let admin_auth = RequireToken::new(
        admin_token,
        &[ADMIN_TOKEN_HEADER, APP_TOKEN_HEADER],
        Refusal::NamingHeader,
        &state,
    );
    let admin_cert = RequireClientCert::for_state(&state);
    let limits = ConnectionLimits::after_shutdown(&options, &shutdown);
    let ping = ping_interval(options.idle_timeout);
    let body_budget = options.body_budget();
    let incoming = accept_loop(listener, limits, shutdown.clone(), state.tls.grpc.clone());
    Server::builder()
        .http2_keepalive_interval(Some(ping))
        .http2_keepalive_timeout(Some(ping))
        // Per-connection bounds: streams (subscriptions) and header bytes.
        .max_concurrent_streams(MAX_STREAMS_PER_CONNECTION)
        .http2_max_header_list_size(MAX_HEADER_BYTES)
        // h2's cap on streams the server resets for a client's errors
        // (RUSTSEC-2024-0003): tonic passes `None`, no cap, unless told;
        // past it the connection ends with GOAWAY ENHANCE_YOUR_CALM.
        .http2_max_local_error_reset_streams(Some(MAX_LOCAL_ERROR_RESETS))
        // Each call counts in its connection's requests in flight, and
        // its body in the listener's budget.
        .layer(CountRequestsLayer(std::sync::Arc::clone(&body_budget)))
        // Every call but an upload within the longer of `request_timeout`
        // and the Lifecycle timeout; each method bounds itself more tightly
        // where it can (an upload by inactivity). Not tonic's `timeout`,
        // which would cut an upload however steadily it sends; tonic still
        // honours the caller's `grpc-timeout`.
        .layer(CallBoundLayer::new(
            options.request_timeout.max(push_timeout),
        ))
        // What each call's request holds decoded, charged to the same
        // budget before it is decoded (`decoded`).
        .layer(HoldDecodedLayer::new(body_budget))
        // `GetState` in its plain form skips the routes (`hot_path`).
        .layer(hot_path)
        .add_service(InterceptedService::new(
            ClearLimit::new(dapr, limit),
            app_auth.clone(),
        ))
        .add_service(InterceptedService::new(
            ClearLimit::new(layotto, limit),
            app_auth,
        ))
        .add_service(InterceptedService::new(
            InterceptedService::new(ClearLimit::new(lifecycle, limit), admin_auth.clone()),
            admin_cert.clone(),
        ))
        .add_service(InterceptedService::new(
            InterceptedService::new(ClearLimit::new(layotto_lifecycle, limit), admin_auth),
            admin_cert,
        ))
        .serve_with_incoming_shutdown(incoming, shutdown.cancelled())
        .await
        .map_err(|e| ApiError::Grpc(e.to_string()))
}
