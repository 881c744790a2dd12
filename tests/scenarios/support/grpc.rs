//! gRPC helpers: clients of the generated services over a tonic channel,
//! and waiting for a stream's next message.

use std::time::Duration;

pub use rewire::sidecar::grpc::proto::dapr::proto::runtime::v1 as dapr;
pub use rewire::sidecar::grpc::proto::rewire::lifecycle::v1 as lifecycle;

use dapr::dapr_client::DaprClient;
use lifecycle::lifecycle_client::LifecycleClient;
use tonic::transport::{Channel, Endpoint};

/// How long a test waits for anything that should happen at once.
pub const PATIENCE: Duration = Duration::from_secs(10);

/// The longest any one gRPC call of a test may take.
const CALL_WITHIN: Duration = Duration::from_secs(60);

/// A channel to the gRPC API at `url`.
pub async fn channel(url: String) -> Channel {
    Endpoint::from_shared(url)
        .expect("bad url")
        .connect_timeout(PATIENCE)
        // No call of a test waits this long unless the sidecar hangs:
        // then the call fails instead of hanging the suite.
        .timeout(CALL_WITHIN)
        .connect()
        .await
        .expect("cannot connect")
}

/// A client of the Dapr service at `url`.
pub async fn dapr_client(url: String) -> DaprClient<Channel> {
    DaprClient::new(channel(url).await)
}

/// A client of the Lifecycle service at `url`.
pub async fn lifecycle_client(url: String) -> LifecycleClient<Channel> {
    LifecycleClient::new(channel(url).await)
}

/// Waits (at most [`PATIENCE`]) for the next message of a stream.
pub async fn next<T>(stream: &mut tonic::Streaming<T>) -> Option<Result<T, tonic::Status>> {
    tokio::time::timeout(PATIENCE, stream.message())
        .await
        .unwrap_or_else(|_| panic!("no message within {PATIENCE:?}"))
        .transpose()
}
