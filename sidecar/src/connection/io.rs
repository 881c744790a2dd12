//! One accepted connection: reads and writes go to the socket; a read or
//! write that has waited longer than the idle timeout fails with
//! `TimedOut` — counted from the last byte while a request is in flight,
//! from the end of the last request (or the connection's arrival) while
//! none is, whatever bytes move then ([`InFlight`]), the first-request
//! timeout from its arrival while it has never started one (once extended
//! by [`FIRST_REQUEST_GRACE`] for bytes read at that deadline), and from when the
//! oldest response still waiting for the client handed over its last chunk,
//! whatever bytes move then (a client that grants no window) —, and every one fails
//! once the shutdown cut comes, so the server drops the connection either
//! way.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::{Instant, Sleep};
use tokio_rustls::server::TlsStream;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tonic::transport::server::Connected;

use super::ConnectionLimits;
use crate::in_flight::{deadline_after, Epoch, InFlight};
use crate::tls::PeerInfo;

/// How long a connection that had not started its first request by its
/// deadline is kept, once, when bytes were read at or after the deadline:
/// a request starts when its service is first polled, after the read, so
/// one read just then would otherwise be dropped unanswered.
const FIRST_REQUEST_GRACE: Duration = Duration::from_secs(1);

/// The socket of a connection: plain, or TLS after the handshake.
pub enum Transport {
    /// Plain text.
    Plain(TcpStream),
    /// TLS (handshake done).
    Tls(Box<TlsStream<TcpStream>>),
}

/// Forwards a poll to the socket, whichever it is.
macro_rules! forward {
    ($self:expr, $stream:ident => $call:expr) => {
        match $self {
            Transport::Plain($stream) => $call,
            Transport::Tls($stream) => $call,
        }
    };
}

impl AsyncRead for Transport {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        forward!(self.get_mut(), s => Pin::new(s).poll_read(cx, buf))
    }
}

impl AsyncWrite for Transport {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        forward!(self.get_mut(), s => Pin::new(s).poll_write(cx, buf))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        forward!(self.get_mut(), s => Pin::new(s).poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        forward!(self.get_mut(), s => Pin::new(s).poll_shutdown(cx))
    }
}

/// An accepted connection, holding its slot under the cap until dropped.
///
/// A byte moving costs a clock read, not a timer update: the idle timer is
/// armed for the deadline as it was, and when it fires for a connection
/// that moved since, it is armed again for the deadline from the last byte.
pub struct Connection {
    stream: Transport,
    idle_timeout: Duration,
    /// Until its first request starts, closed at this.
    first_request_by: Instant,
    /// Until when [`FIRST_REQUEST_GRACE`] keeps it past `first_request_by`,
    /// once granted (never again).
    first_request_grace: Option<Instant>,
    /// When a byte last moved.
    last_moved: Instant,
    /// Fires at the idle deadline it was last armed for (at or before the
    /// one from `last_moved`).
    idle: Pin<Box<Sleep>>,
    /// Its requests in flight.
    in_flight: InFlight,
    /// The epochs of its responses waiting for the client.
    epoch: Epoch,
    /// Cancelled at the shutdown cut (a cheap check while bytes move).
    cut_token: CancellationToken,
    /// Its wait, polled when the socket is not ready.
    cut: Pin<Box<WaitForCancellationFutureOwned>>,
    _slot: OwnedSemaphorePermit,
}

impl Connection {
    /// `stream`, bounded by `limits`, holding `slot`.
    pub(super) fn new(
        stream: Transport,
        limits: &ConnectionLimits,
        slot: OwnedSemaphorePermit,
    ) -> Self {
        let now = Instant::now();
        let first_request_by =
            deadline_after(now, limits.first_request_timeout.min(limits.idle_timeout));
        Self {
            stream,
            idle_timeout: limits.idle_timeout,
            first_request_by,
            first_request_grace: None,
            last_moved: now,
            idle: Box::pin(tokio::time::sleep_until(first_request_by)),
            in_flight: InFlight::with_replies(&limits.replies),
            epoch: Epoch::new(now),
            cut_token: limits.cut.clone(),
            cut: Box::pin(limits.cut.clone().cancelled_owned()),
            _slot: slot,
        }
    }

    /// The error for a connection that must end, if it must. When the
    /// socket is not ready (`waiting`), the cut and the idle timer are
    /// polled, so either wakes the connection.
    fn ended(&mut self, cx: &mut Context<'_>, waiting: bool) -> Option<io::Error> {
        let cut = if waiting {
            self.cut.as_mut().poll(cx).is_ready()
        } else {
            self.cut_token.is_cancelled()
        };
        if cut {
            return Some(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "the server is shutting down",
            ));
        }
        if waiting && self.idle_for_too_long(cx) {
            let message = if self.in_flight.never_started() {
                "connection started no request in time".to_owned()
            } else {
                format!("connection idle for {:?}", self.idle_timeout)
            };
            return Some(io::Error::new(io::ErrorKind::TimedOut, message));
        }
        None
    }

    /// The connection's requests in flight, for the server to count them.
    pub fn in_flight(&self) -> &InFlight {
        &self.in_flight
    }

    /// Whether the connection has been idle for the idle timeout: no
    /// request in flight since then, or, while one is, no byte moved, or
    /// a response waited that long for the client (whatever bytes moved);
    /// or it has started no request by its first-request deadline.
    /// Until then the timer is left armed for the deadline as it stands.
    fn idle_for_too_long(&mut self, cx: &mut Context<'_>) -> bool {
        while self.idle.as_mut().poll(cx).is_ready() {
            let now = Instant::now();
            let idle_since = self.in_flight.idle_since();
            let from = idle_since.unwrap_or(self.last_moved);
            let mut deadline = deadline_after(from, self.idle_timeout);
            // None open (read first), and none ever started.
            if idle_since.is_some() && self.in_flight.never_started() {
                deadline = deadline.min(self.first_request_by);
                // Bytes read at or after the deadline: once, time for the
                // request they may hold to start.
                if self.last_moved >= deadline && self.first_request_grace.is_none() {
                    self.first_request_grace = Some(self.last_moved + FIRST_REQUEST_GRACE);
                }
                if let Some(grace) = self.first_request_grace {
                    deadline = deadline.max(grace);
                }
            }
            if let Some(waited_out) =
                self.in_flight
                    .waited_out_at(&mut self.epoch, now, self.idle_timeout)
            {
                deadline = deadline.min(waited_out);
            }
            if deadline <= now {
                return true;
            }
            self.idle.as_mut().reset(deadline);
        }
        false
    }

    /// A byte moved: the idle deadline counts from now.
    fn touch(&mut self) {
        self.last_moved = Instant::now();
    }

    /// Maps a read or write through the cut and the idle timer: one that
    /// is ready moved bytes.
    fn bounded<T>(
        &mut self,
        cx: &mut Context<'_>,
        poll: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        if poll.is_ready() {
            self.touch();
        }
        self.waited(cx, poll)
    }

    /// Maps a socket poll through the cut and the idle timer, without
    /// counting it as bytes moved (a flush: the bytes moved at the write,
    /// and a flush with nothing to send moves none).
    fn waited<T>(
        &mut self,
        cx: &mut Context<'_>,
        poll: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        match poll {
            Poll::Ready(result) => Poll::Ready(result),
            Poll::Pending => match self.ended(cx, true) {
                Some(error) => Poll::Ready(Err(error)),
                None => Poll::Pending,
            },
        }
    }
}

impl AsyncRead for Connection {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Some(error) = this.ended(cx, false) {
            return Poll::Ready(Err(error));
        }
        let poll = Pin::new(&mut this.stream).poll_read(cx, buf);
        this.bounded(cx, poll)
    }
}

impl AsyncWrite for Connection {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if let Some(error) = this.ended(cx, false) {
            return Poll::Ready(Err(error));
        }
        let poll = Pin::new(&mut this.stream).poll_write(cx, buf);
        this.bounded(cx, poll)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.stream).poll_flush(cx);
        this.waited(cx, poll)
    }

    /// Bounded as a write: closing TLS writes its `close_notify`, which a
    /// client that stopped reading never takes, so the close ends at the
    /// idle timeout or the shutdown cut like any write (hyper closes
    /// `Connection: close` and idle keep-alive connections through it).
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Some(error) = this.ended(cx, false) {
            return Poll::Ready(Err(error));
        }
        let poll = Pin::new(&mut this.stream).poll_shutdown(cx);
        this.waited(cx, poll)
    }
}

impl Connected for Connection {
    type ConnectInfo = PeerInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        match &self.stream {
            Transport::Plain(tcp) => PeerInfo {
                tcp: tcp.connect_info(),
                certificates: None,
                in_flight: self.in_flight.clone(),
            },
            Transport::Tls(tls) => {
                let (tcp, session) = tls.get_ref();
                PeerInfo {
                    tcp: tcp.connect_info(),
                    certificates: session.peer_certificates().map(|chain| {
                        Arc::new(chain.iter().map(|c| c.clone().into_owned()).collect())
                    }),
                    in_flight: self.in_flight.clone(),
                }
            }
        }
    }
}

#[cfg(test)]
mod tls_close;

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};
    use tokio::sync::Semaphore;
    use tokio_util::sync::CancellationToken;

    use super::{Connection, Transport};
    use crate::connection::ConnectionLimits;

    /// A connection accepted with `idle_timeout`, and its client.
    async fn accepted(idle_timeout: Duration) -> (Connection, TcpStream) {
        accepted_with(idle_timeout, idle_timeout).await
    }

    /// [`accepted`], its first request due within `first_request_timeout`.
    async fn accepted_with(
        idle_timeout: Duration,
        first_request_timeout: Duration,
    ) -> (Connection, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let client = TcpStream::connect(listener.local_addr().expect("addr"))
            .await
            .expect("connect");
        let (server, _) = listener.accept().await.expect("accept");
        let limits = ConnectionLimits {
            max_connections: 1,
            idle_timeout,
            first_request_timeout,
            cut: CancellationToken::new(),
            replies: crate::reply_budget::ReplyLimits::unbounded(),
        };
        let slot = Arc::new(Semaphore::new(1))
            .acquire_owned()
            .await
            .expect("slot");
        (
            Connection::new(Transport::Plain(server), &limits, slot),
            client,
        )
    }

    #[tokio::test]
    async fn bytes_moving_keep_a_request_open_and_silence_closes_it() {
        let idle = Duration::from_millis(200);
        let (mut server, mut client) = accepted(idle).await;
        // A request in flight throughout (its guard held past the close).
        let _request = server.in_flight().start();
        let reader = tokio::spawn(async move {
            let mut received = 0;
            let mut buf = [0u8; 16];
            loop {
                match server.read(&mut buf).await {
                    Ok(0) => return (received, None),
                    Ok(n) => received += n,
                    Err(err) => return (received, Some((err.kind(), std::time::Instant::now()))),
                }
            }
        });
        // A byte every 50 ms for four idle timeouts.
        for _ in 0..16 {
            client.write_all(b"x").await.expect("write");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let silent_since = std::time::Instant::now();
        let (received, error) = tokio::time::timeout(Duration::from_secs(5), reader)
            .await
            .expect("still open after silence")
            .expect("reader");
        assert_eq!(received, 16, "every byte was read before the close");
        let (kind, at) = error.expect("closed by the idle timer");
        assert_eq!(kind, std::io::ErrorKind::TimedOut);
        assert!(at.duration_since(silent_since) >= idle - Duration::from_millis(60));
    }

    #[tokio::test]
    async fn without_a_request_in_flight_bytes_moving_do_not_keep_it_open() {
        let idle = Duration::from_millis(200);
        let (mut server, mut client) = accepted(idle).await;
        let reader = tokio::spawn(async move {
            let mut buf = [0u8; 16];
            loop {
                match server.read(&mut buf).await {
                    Ok(0) => return None,
                    Ok(_) => {}
                    Err(err) => return Some(err.kind()),
                }
            }
        });
        // A byte every 50 ms for as long as it stays open (pings, or a
        // request head trickled in), at most four idle timeouts.
        for _ in 0..16 {
            if reader.is_finished() || client.write_all(b"x").await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(reader.is_finished(), "kept open by bytes alone");
        let error = reader.await.expect("reader");
        assert_eq!(error, Some(std::io::ErrorKind::TimedOut));
    }

    /// How long `server` stays open, reading until it ends, and how it ends.
    async fn open_for(mut server: Connection) -> (Duration, Option<std::io::ErrorKind>) {
        let since = std::time::Instant::now();
        let mut buf = [0u8; 16];
        let ended = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                match server.read(&mut buf).await {
                    Ok(0) => return None,
                    Ok(_) => {}
                    Err(err) => return Some(err.kind()),
                }
            }
        })
        .await
        .expect("closed within 5 s");
        (since.elapsed(), ended)
    }

    #[tokio::test]
    async fn a_connection_that_starts_no_request_is_closed_at_the_first_request_limit() {
        let first = Duration::from_millis(200);
        let (server, _client) = accepted_with(Duration::from_secs(60), first).await;
        let (open, ended) = open_for(server).await;
        assert_eq!(ended, Some(std::io::ErrorKind::TimedOut));
        assert!(open >= first - Duration::from_millis(60), "{open:?}");
    }

    /// A request read just after the first-request deadline, before its
    /// service was polled (which marks it started), is not cut unanswered:
    /// the connection gets one grace, and is closed after it all the same.
    #[tokio::test]
    async fn a_first_request_read_after_its_deadline_gets_one_grace() {
        let first = Duration::from_millis(200);
        let (mut server, mut client) = accepted_with(Duration::from_secs(60), first).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        client
            .write_all(b"GET / HTTP/1.1\r\n\r\n")
            .await
            .expect("write");
        // The reactor sees the bytes, so the first read takes them at once.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let mut buf = [0u8; 64];
        let read = server.read(&mut buf).await.expect("the request is read");
        assert_eq!(&buf[..read], b"GET / HTTP/1.1\r\n\r\n");
        let next = tokio::time::timeout(Duration::from_millis(100), server.read(&mut buf)).await;
        assert!(next.is_err(), "cut with the request read: {next:?}");
        // Never started: closed once the grace is over.
        let (open, ended) = open_for(server).await;
        assert_eq!(ended, Some(std::io::ErrorKind::TimedOut));
        assert!(open < Duration::from_secs(2), "{open:?}");
    }

    #[tokio::test]
    async fn once_a_request_has_started_the_idle_timeout_applies() {
        let (idle, first) = (Duration::from_millis(900), Duration::from_millis(100));
        let (server, _client) = accepted_with(idle, first).await;
        drop(server.in_flight().start());
        let (open, ended) = open_for(server).await;
        assert_eq!(ended, Some(std::io::ErrorKind::TimedOut));
        assert!(open >= idle - Duration::from_millis(100), "{open:?}");
    }
}
