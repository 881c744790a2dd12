//! The accept loop: takes a slot under the cap, then a connection; on an
//! accept error (`EMFILE`, `ENFILE`, `ENOBUFS`...) waits with a doubling
//! backoff instead of retrying at once, logging once per streak.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Semaphore};
use tokio_stream::Stream;
use tokio_util::sync::CancellationToken;

use super::{Connection, ConnectionLimits, Transport};
use crate::tls::LiveTls;

/// The longest a client may take to complete the TLS handshake.
pub const HANDSHAKE_LIMIT: Duration = Duration::from_secs(10);

/// The longest a connection may take to start its first request (after
/// the handshake, with TLS): a slot is taken before each accept, so
/// silent connections at the cap would lock every client out for the
/// idle timeout.
pub const FIRST_REQUEST_LIMIT: Duration = Duration::from_secs(10);

/// The first wait after an accept error.
const FIRST_BACKOFF: Duration = Duration::from_millis(5);
/// The longest wait between accept attempts after errors.
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// Waits between accept attempts that fail: doubling from 5 ms to 1 s,
/// back to none after a success.
#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            next: FIRST_BACKOFF,
        }
    }
}

impl Backoff {
    /// One more failure: how long to wait before the next attempt.
    pub fn failed(&mut self) -> Duration {
        let wait = self.next;
        self.next = (self.next * 2).min(MAX_BACKOFF);
        wait
    }

    /// A success: the next failure waits the least again.
    pub fn succeeded(&mut self) {
        *self = Self::default();
    }
}

/// The connections accepted on one listener, for the server that serves
/// them (a stream for tonic, an `axum::serve::Listener` for axum).
pub struct Accepted {
    receiver: mpsc::Receiver<(Connection, SocketAddr)>,
    local: SocketAddr,
}

/// Accepts on `listener` under `limits` until `stop` is cancelled; with
/// `tls`, each connection's handshake runs on its own task (within
/// [`HANDSHAKE_LIMIT`]) with the configuration in force when it arrived.
pub fn accept_loop(
    listener: TcpListener,
    limits: ConnectionLimits,
    stop: CancellationToken,
    tls: Option<Arc<LiveTls>>,
) -> Accepted {
    let local = listener
        .local_addr()
        .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
    let (sender, receiver) = mpsc::channel(1);
    let listener = Arc::new(listener);
    let accept = move || {
        let listener = Arc::clone(&listener);
        async move { listener.accept().await }
    };
    tokio::spawn(run(accept, limits, stop, sender, tls));
    Accepted { receiver, local }
}

/// The loop itself, over any accept function (tests give a failing one).
async fn run<F, Fut>(
    mut accept: F,
    limits: ConnectionLimits,
    stop: CancellationToken,
    sender: mpsc::Sender<(Connection, SocketAddr)>,
    tls: Option<Arc<LiveTls>>,
) where
    F: FnMut() -> Fut,
    Fut: Future<Output = io::Result<(TcpStream, SocketAddr)>>,
{
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let mut backoff = Backoff::default();
    loop {
        let slot = tokio::select! {
            () = stop.cancelled() => return,
            slot = Arc::clone(&slots).acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_) => return,
            },
        };
        let accepted = tokio::select! {
            () = stop.cancelled() => return,
            accepted = accept() => accepted,
        };
        match accepted {
            Ok((stream, peer)) => {
                backoff.succeeded();
                // Small answers and stream messages go out at once: with
                // Nagle, an event written right after another answer on
                // the same connection waited for the client's delayed ACK
                // (some 40 ms).
                let _ = stream.set_nodelay(true);
                let Some(tls) = &tls else {
                    let connection = Connection::new(Transport::Plain(stream), &limits, slot);
                    if sender.send((connection, peer)).await.is_err() {
                        return;
                    }
                    continue;
                };
                let (acceptor, limits, sender) = (tls.acceptor(), limits.clone(), sender.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_LIMIT, acceptor.accept(stream)).await {
                        Ok(Ok(stream)) => {
                            let transport = Transport::Tls(Box::new(stream));
                            let connection = Connection::new(transport, &limits, slot);
                            let _ = sender.send((connection, peer)).await;
                        }
                        Ok(Err(error)) => {
                            tracing::debug!(%peer, error = %error, "TLS handshake failed.");
                        }
                        Err(_) => {
                            tracing::debug!(%peer, limit = ?HANDSHAKE_LIMIT, "TLS handshake too slow; connection dropped.");
                        }
                    }
                });
            }
            Err(error) => {
                let wait = backoff.failed();
                if wait == FIRST_BACKOFF || wait == MAX_BACKOFF {
                    tracing::warn!(error = %error, retry_in = ?wait, "Cannot accept a connection; backing off.");
                }
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(wait) => {}
                }
            }
        }
    }
}

impl Stream for Accepted {
    type Item = Result<Connection, io::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.receiver
            .poll_recv(cx)
            .map(|next| next.map(|(connection, _)| Ok(connection)))
    }
}

impl axum::serve::Listener for Accepted {
    type Io = Connection;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.receiver.recv().await {
            Some(accepted) => accepted,
            // The loop stopped (shutdown): nothing more will come.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(self.local)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn backoff_doubles_to_a_second_and_resets() {
        let mut backoff = Backoff::default();
        let waits: Vec<_> = (0..10).map(|_| backoff.failed()).collect();
        assert_eq!(waits[0], Duration::from_millis(5));
        assert_eq!(waits[1], Duration::from_millis(10));
        assert_eq!(waits[9], Duration::from_secs(1));
        backoff.succeeded();
        assert_eq!(backoff.failed(), Duration::from_millis(5));
    }

    #[tokio::test(start_paused = true)]
    async fn accept_errors_are_backed_off_not_spun_on() {
        let attempts = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&attempts);
        let accept = move || {
            counted.fetch_add(1, Ordering::SeqCst);
            async { Err(io::Error::from_raw_os_error(24)) } // EMFILE
        };
        let limits = ConnectionLimits {
            max_connections: 4,
            idle_timeout: Duration::from_secs(60),
            first_request_timeout: FIRST_REQUEST_LIMIT,
            cut: CancellationToken::new(),
            replies: crate::reply_budget::ReplyLimits::unbounded(),
        };
        let stop = CancellationToken::new();
        let (sender, _receiver) = mpsc::channel(1);
        let loop_task = tokio::spawn(run(accept, limits, stop.clone(), sender, None));
        tokio::time::sleep(Duration::from_secs(10)).await;
        stop.cancel();
        tokio::time::timeout(Duration::from_secs(60), loop_task)
            .await
            .expect("the loop ends within a minute of stop")
            .expect("the loop ends on stop");
        // 5 ms doubling to 1 s: 8 attempts in the first 1.3 s, then one a
        // second; a spinning loop would make millions.
        let made = attempts.load(Ordering::SeqCst);
        assert!((10..=20).contains(&made), "{made} attempts in 10 s");
    }
}
