//! [`WatchStream`]: one watch on a key or prefix, as a stream of responses.

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::client::Client;
use crate::error::Error;
use crate::pb::{
    watch_client::WatchClient, watch_request::RequestUnion, WatchCreateRequest, WatchRequest,
    WatchResponse,
};

/// The responses of one watch. Dropping it ends the watch.
#[derive(Debug)]
pub struct WatchStream {
    /// Kept so that the request side stays open while the watch runs.
    _requests: mpsc::Sender<WatchRequest>,
    responses: tonic::Streaming<WatchResponse>,
}

impl WatchStream {
    /// The next response; `None` once the server ended the stream.
    pub async fn message(&mut self) -> Result<Option<WatchResponse>, Error> {
        self.responses.message().await.map_err(Error::Status)
    }
}

impl Client {
    /// Starts the watch `create` (the client's time limit applies to
    /// opening the stream, not to the responses).
    pub async fn watch(&self, create: WatchCreateRequest) -> Result<WatchStream, Error> {
        self.call(|s| {
            let create = create.clone();
            async move {
                let (requests, receiver) = mpsc::channel(1);
                let first = WatchRequest {
                    request_union: Some(RequestUnion::CreateRequest(create)),
                };
                // The channel has room for the first request.
                let _ = requests.try_send(first);
                let response = WatchClient::new(s)
                    .watch(ReceiverStream::new(receiver))
                    .await?;
                Ok(response.map(|responses| WatchStream {
                    _requests: requests,
                    responses,
                }))
            }
        })
        .await
    }
}
