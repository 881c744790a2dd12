//! gRPC: `dapr.proto.runtime.v1.Dapr` (the subset rewire serves) and
//! `rewire.lifecycle.v1.Lifecycle`, on one server.

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::{ApiError, ApiState};

/// Serves gRPC on `listener` until `shutdown` is cancelled.
pub async fn serve(state: ApiState, listener: TcpListener, shutdown: CancellationToken) -> Result<(), ApiError> {
    let _ = (state, listener);
    shutdown.cancelled().await;
    Err(ApiError::Grpc("the gRPC API is not built yet".into()))
}
