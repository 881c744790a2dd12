//! HTTP: health, the Dapr state/secret/configuration/metadata routes,
//! metrics and status.

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::{ApiError, ApiState};

/// Serves HTTP on `listener` until `shutdown` is cancelled.
pub async fn serve(state: ApiState, listener: TcpListener, shutdown: CancellationToken) -> Result<(), ApiError> {
    let _ = (state, listener);
    shutdown.cancelled().await;
    Err(ApiError::Http("the HTTP API is not built yet".into()))
}
