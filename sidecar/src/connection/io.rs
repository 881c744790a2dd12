//! One accepted connection: reads and writes go to the socket; a read or
//! write that has waited longer than the idle timeout since the last byte
//! fails with `TimedOut`, and every one fails once the shutdown cut comes,
//! so the server drops the connection either way.

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
use tokio_util::sync::WaitForCancellationFutureOwned;
use tonic::transport::server::Connected;

use super::ConnectionLimits;
use crate::tls::PeerInfo;

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
pub struct Connection {
    stream: Transport,
    idle_timeout: Duration,
    idle: Pin<Box<Sleep>>,
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
        Self {
            stream,
            idle_timeout: limits.idle_timeout,
            idle: Box::pin(tokio::time::sleep(limits.idle_timeout)),
            cut: Box::pin(limits.cut.clone().cancelled_owned()),
            _slot: slot,
        }
    }

    /// The error for a connection that must end, if it must: polls the
    /// shutdown cut and, when the socket is not ready, the idle timer.
    fn ended(&mut self, cx: &mut Context<'_>, waiting: bool) -> Option<io::Error> {
        if self.cut.as_mut().poll(cx).is_ready() {
            return Some(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "the server is shutting down",
            ));
        }
        if waiting && self.idle.as_mut().poll(cx).is_ready() {
            return Some(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("connection idle for {:?}", self.idle_timeout),
            ));
        }
        None
    }

    /// A byte moved: the idle timer starts again.
    fn touch(&mut self) {
        let deadline = Instant::now() + self.idle_timeout;
        self.idle.as_mut().reset(deadline);
    }

    /// Maps a socket poll through the cut and the idle timer.
    fn bounded<T>(
        &mut self,
        cx: &mut Context<'_>,
        poll: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        match poll {
            Poll::Ready(result) => {
                self.touch();
                Poll::Ready(result)
            }
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
        this.bounded(cx, poll)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

impl Connected for Connection {
    type ConnectInfo = PeerInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        match &self.stream {
            Transport::Plain(tcp) => PeerInfo {
                tcp: tcp.connect_info(),
                certificates: None,
            },
            Transport::Tls(tls) => {
                let (tcp, session) = tls.get_ref();
                PeerInfo {
                    tcp: tcp.connect_info(),
                    certificates: session.peer_certificates().map(|chain| {
                        Arc::new(chain.iter().map(|c| c.clone().into_owned()).collect())
                    }),
                }
            }
        }
    }
}
