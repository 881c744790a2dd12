//! gRPC: `dapr.proto.runtime.v1.Dapr` (the subset rewire serves) and
//! `rewire.lifecycle.v1.Lifecycle`, on one server.
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
//! * Unary Dapr calls are cut after [`ApiOptions::request_timeout`];
//!   Lifecycle calls answer before [`ApiOptions::push_timeout`] (at least
//!   the init timeout plus 15 s) or the caller's deadline; streams
//!   (configuration subscriptions) last until unsubscribed, the client
//!   leaves, or the server shuts down.
//! * Every call is counted in the request metrics (`observe`).
//! * The handlers are thin: they turn messages into calls of the shared
//!   Dapr operations ([`crate::dapr`]) and their errors into statuses
//!   (`status`).
//!
//! [`ApiOptions::max_request_bytes`]: crate::ApiOptions::max_request_bytes
//! [`ApiOptions::request_timeout`]: crate::ApiOptions::request_timeout
//! [`ApiOptions::push_timeout`]: crate::ApiOptions::push_timeout

mod auth;
mod dapr;
mod dapr_config;
mod dapr_lock;
mod dapr_metadata;
mod dapr_pubsub;
mod dapr_pubsub_stream;
mod dapr_secrets;
mod dapr_state;
mod lifecycle;
mod lifecycle_patch;
mod lifecycle_wait;
mod limits;
mod observe;
pub mod proto;
mod status;
mod subscription_forward;
mod subscription_queue;
mod subscriptions;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Server;

use crate::auth::{ADMIN_TOKEN_HEADER, APP_TOKEN_HEADER};
use crate::connection::{accept_loop, ConnectionLimits};
use crate::{ApiError, ApiState};
use auth::RequireToken;
use dapr::DaprApi;
use lifecycle::LifecycleApi;
use limits::ClearLimit;
use proto::dapr::proto::runtime::v1::dapr_server::DaprServer;
use proto::rewire::lifecycle::v1::lifecycle_server::LifecycleServer;

/// Streams (calls and subscriptions) open at once on one connection.
const MAX_STREAMS_PER_CONNECTION: u32 = 256;
/// Header bytes one request may carry.
const MAX_HEADER_BYTES: u32 = 16 * 1024;

/// Serves gRPC on `listener` until `shutdown` is cancelled; in-flight calls
/// finish first (within `shutdown_grace`, then every connection is cut),
/// and open configuration subscriptions end. Connections are bounded
/// ([`crate::connection`]).
pub async fn serve(
    state: ApiState,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> Result<(), ApiError> {
    let options = state.options.clone();
    let limit = options.max_request_bytes;
    let dapr = DaprServer::new(DaprApi::new(state.clone(), shutdown.clone()))
        .max_decoding_message_size(limit);
    let app_auth = RequireToken::new(options.app_token.clone(), &[APP_TOKEN_HEADER], &state);
    let push_timeout = lifecycle_wait::lifecycle_timeout(&state);
    let lifecycle = LifecycleServer::new(LifecycleApi::new(state.clone(), push_timeout))
        .max_decoding_message_size(limit);
    // The admin token may come in its own header or, as Dapr clients send
    // tokens, in `dapr-api-token`. Without an admin token, the app token (if
    // any) guards the Lifecycle API too: it is never more open than the app
    // API.
    let admin_auth = RequireToken::new(
        options
            .admin_token
            .clone()
            .or_else(|| options.app_token.clone()),
        &[ADMIN_TOKEN_HEADER, APP_TOKEN_HEADER],
        &state,
    );
    let limits = ConnectionLimits::after_shutdown(&options, &shutdown);
    let ping = options.idle_timeout / 3;
    let incoming = accept_loop(listener, limits, shutdown.clone());
    Server::builder()
        // The Dapr service bounds its calls by `request_timeout` itself.
        .timeout(options.request_timeout.max(push_timeout))
        .http2_keepalive_interval(Some(ping))
        .http2_keepalive_timeout(Some(ping))
        // Per-connection bounds: streams (subscriptions) and header bytes.
        .max_concurrent_streams(MAX_STREAMS_PER_CONNECTION)
        .http2_max_header_list_size(MAX_HEADER_BYTES)
        .add_service(InterceptedService::new(
            ClearLimit::new(dapr, limit),
            app_auth,
        ))
        .add_service(InterceptedService::new(
            ClearLimit::new(lifecycle, limit),
            admin_auth,
        ))
        .serve_with_incoming_shutdown(incoming, shutdown.cancelled())
        .await
        .map_err(|e| ApiError::Grpc(e.to_string()))
}
