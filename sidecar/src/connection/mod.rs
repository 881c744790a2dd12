//! The connections of both listeners, bounded: at most
//! [`ApiOptions::max_connections`](crate::ApiOptions::max_connections) open
//! per listener (beyond it, clients wait in the kernel's backlog), each
//! closed after [`ApiOptions::idle_timeout`](crate::ApiOptions::idle_timeout)
//! without a request in flight (whatever bytes move: keepalive pings, a
//! request head trickled in) or, while one is, without a byte read or
//! written, and every one cut once the shutdown
//! grace has passed. One that has not started its first request within
//! [`FIRST_REQUEST_LIMIT`] is closed then (silent connections would
//! otherwise hold every slot for the idle timeout). Accept errors
//! (`EMFILE` at the descriptor limit) are backed off, never spun on.
//!
//! * `accept`: the accept loop, one task per listener, handing connections
//!   to the server through a channel.
//! * `body_budget`: the request bytes a listener holds while reading
//!   bodies; `count_requests`: the service layer that counts each request
//!   in its connection's [`crate::in_flight`] and charges its body to the
//!   budget; `grpc_framing`: where a gRPC request stream stands in its
//!   messages, so that a long-lived one holds only the message being read.
//! * `io`: the connection itself, a `TcpStream` (or its TLS stream) with
//!   its idle timer, the shutdown cut and its slot under the cap.
//! * `reader_pump`: a file sent to a client, let go of when the client
//!   takes no chunk for a while (both file APIs).
//! * `replying`: a reply of known size, charged to its connection's and
//!   listener's [reply budgets](crate::reply_budget) until the server
//!   takes its bytes.

mod accept;
mod body_budget;
mod count_requests;
mod download_slots;
mod grpc_framing;
mod io;
mod reader_pump;
mod replying;

pub use accept::{accept_loop, Accepted, Backoff, FIRST_REQUEST_LIMIT, HANDSHAKE_LIMIT};
pub use body_budget::{BodyBudget, BodyCharge, BoxError, Budgeted};
pub use count_requests::{BodyRead, CountRequests, CountRequestsLayer, CountedAnswer, CountedBody};
pub use download_slots::{DownloadSlot, DownloadSlots, DownloadsFull, HeldReader};
pub use io::{Connection, Transport};
pub(crate) use reader_pump::{pump, pumped, Pumped, CLIENT_READS_WITHIN, QUEUED_CHUNKS};
pub use replying::{ReplyCharge, Replying, SLICE};

use std::time::Duration;

use tokio_util::sync::CancellationToken;

impl ConnectionLimits {
    /// The limits of `options`, cutting every connection `grace` after
    /// `shutdown` is cancelled.
    pub fn after_shutdown(options: &crate::ApiOptions, shutdown: &CancellationToken) -> Self {
        let cut = CancellationToken::new();
        let (shutdown, grace, cutting) = (shutdown.clone(), options.shutdown_grace, cut.clone());
        tokio::spawn(async move {
            shutdown.cancelled().await;
            tokio::time::sleep(grace).await;
            cutting.cancel();
        });
        Self {
            max_connections: options.max_connections,
            idle_timeout: options.idle_timeout,
            first_request_timeout: FIRST_REQUEST_LIMIT,
            cut,
            replies: options.reply_limits(),
        }
    }
}

/// How connections are bounded.
#[derive(Debug, Clone)]
pub struct ConnectionLimits {
    /// Connections open at once per listener, at most.
    pub max_connections: usize,
    /// Closed after this long without a request in flight or, while one
    /// is, without a byte read or written.
    pub idle_timeout: Duration,
    /// Closed after this long (or the idle timeout, if shorter) when its
    /// first request has not started: request head not read (HTTP/1), or
    /// preface and first HEADERS not (HTTP/2).
    pub first_request_timeout: Duration,
    /// Cancelled when every connection must end now.
    pub cut: CancellationToken,
    /// Reply bytes held for clients that have not taken them, per
    /// connection and for the listener.
    pub replies: crate::reply_budget::ReplyLimits,
}
