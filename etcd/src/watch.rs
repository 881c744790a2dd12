//! [`WatchStream`]: one watch on a key or prefix, as a stream of responses.

use std::sync::Arc;

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::client::{Client, Members, TokenInterceptor};
use crate::error::{is_auth_cancel, Error, ResponseLimit};
use crate::pb::{
    watch_request::RequestUnion, WatchCreateRequest, WatchProgressRequest, WatchRequest,
    WatchResponse,
};

/// The responses of one watch. Dropping it ends the watch.
///
/// The watch runs on the member the client used when it was opened; when
/// the stream fails or ends, the client moves on from that member, so the
/// next watch (and call) goes to another one.
#[derive(Debug)]
pub struct WatchStream {
    /// The request side: open while the watch runs; progress requests
    /// go through it.
    requests: mpsc::Sender<WatchRequest>,
    responses: tonic::Streaming<WatchResponse>,
    members: Arc<Members>,
    member: usize,
    token: TokenInterceptor,
    /// The login generation of the token the watch was opened with (read
    /// just before it was sent: a login in between makes it look older,
    /// which at worst asks for one login more).
    generation: u64,
    /// The limit on a response, named in the error for a larger one.
    limit: ResponseLimit,
}

impl WatchStream {
    /// The next response; `None` once the server ended the stream.
    ///
    /// etcd checks the auth token of a watch when it creates it, and
    /// refuses an unknown or expired one (after a restart, or once the
    /// token's TTL lapsed) by canceling the watch in the stream rather than
    /// failing the call. Such a cancel makes the client log in again before
    /// its next call, so that the next watch carries a fresh token — but
    /// `permission denied` for a token logged in for after an earlier
    /// refusal does not: the user's roles do not cover the keys, and a
    /// login per retry would not change that (see
    /// `TokenInterceptor::refused_watch`).
    pub async fn message(&mut self) -> Result<Option<WatchResponse>, Error> {
        let next = self
            .responses
            .message()
            .await
            .map_err(|status| self.limit.error(status));
        match &next {
            Ok(Some(response)) if response.canceled => {
                if is_auth_cancel(&response.cancel_reason) {
                    self.token
                        .refused_watch(self.generation, &response.cancel_reason);
                } else {
                    self.token.watch_went_on();
                }
            }
            Ok(Some(response)) if response.created => self.token.watch_went_on(),
            Ok(Some(_)) => {}
            _ => {
                self.token.watch_went_on();
                self.members.skip(self.member);
            }
        }
        next
    }

    /// Asks the member to answer on the stream with its revision (a
    /// response without events whose `watch_id` is -1: it concerns every
    /// watch of the stream): proof that it still serves the stream,
    /// which its keep-alive pings are not (a member whose apply loop is
    /// stuck answers them). Returns false when the request could not be
    /// queued: the one before it is still unsent, the member is not
    /// reading the stream.
    ///
    /// The answer's revision is no progress of the watch: etcd 3.4 answers
    /// with its current revision even while the watch still catches up on
    /// older events, and the answer may overtake events already queued
    /// (etcd issue 15220).
    pub fn request_progress(&self) -> bool {
        let request = WatchRequest {
            request_union: Some(RequestUnion::ProgressRequest(WatchProgressRequest {})),
        };
        self.requests.try_send(request).is_ok()
    }

    /// Ends the watch as the member's fault (it went silent): the client
    /// moves on from the member, as after a failed stream, so the next
    /// watch (and call) goes to another one.
    pub fn abandon(self) {
        self.token.watch_went_on();
        self.members.skip(self.member);
    }
}

impl Client {
    /// Starts the watch `create` (the client's time limit applies to
    /// opening the stream, not to the responses). The watch requires a
    /// leader: a member cut off from the cluster's leader ends it (an
    /// `Unavailable` "no leader" error) rather than go silent.
    pub async fn watch(&self, create: WatchCreateRequest) -> Result<WatchStream, Error> {
        let members = self.members();
        // The member failover runs the call on, not the one in use when the
        // call reads it (another call may have moved on meanwhile): a
        // failure of this stream must skip this member.
        let (stream, member, generation) = self
            .call_on(|member, s| {
                let mut watch_api = self.watch_api(s);
                let create = create.clone();
                let generation = self.token().generation();
                async move {
                    let (requests, receiver) = mpsc::channel(1);
                    let first = WatchRequest {
                        request_union: Some(RequestUnion::CreateRequest(create)),
                    };
                    // The channel has room for the first request.
                    let _ = requests.try_send(first);
                    let mut request = tonic::Request::new(ReceiverStream::new(receiver));
                    request.metadata_mut().insert(
                        "hasleader",
                        tonic::metadata::AsciiMetadataValue::from_static("true"),
                    );
                    let response = watch_api.watch(request).await?;
                    Ok(response.map(|responses| ((requests, responses), member, generation)))
                }
            })
            .await?;
        let (requests, responses) = stream;
        Ok(WatchStream {
            requests,
            responses,
            members,
            member,
            token: self.token().clone(),
            generation,
            limit: self.limit(),
        })
    }
}
