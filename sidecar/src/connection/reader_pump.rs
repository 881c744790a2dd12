//! A file (or any reader) sent to a client in chunks, held only while the
//! client takes them: a task reads it onto a short queue, and lets go of
//! it (an open descriptor, pinned data) once the client has taken no chunk
//! for [`CLIENT_READS_WITHIN`] — else a client that reads nothing (an
//! HTTP/2 window of 0, its pings answered) would hold it for as long as
//! its connection lives. Both file APIs send their contents through it:
//! gRPC `GetFile` and the HTTP file `GET`.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tonic::codegen::Bytes;

/// Chunks queued for a slow reader.
pub(crate) const QUEUED_CHUNKS: usize = 4;
/// How long a client may take no chunk before the reader is let go of.
pub(crate) const CLIENT_READS_WITHIN: Duration = Duration::from_secs(30);

/// How a pump ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Pumped {
    /// The reader ended or failed (its error sent as the last message),
    /// or the client left.
    Done,
    /// The client took no message for the bound.
    Stalled,
}

/// Reads `body` in chunks of at most `chunk` bytes, each made a message
/// by `message` (a read error too, as the last), and sends them to `out`
/// until `body` ends or fails, the client leaves, or it takes no message
/// for `within`. `body` is dropped on return; `out` is the caller's, to
/// close once it has recorded how the pump ended.
pub(crate) async fn pump<T>(
    mut body: impl AsyncRead + Unpin,
    chunk: usize,
    out: &mpsc::Sender<T>,
    message: impl Fn(io::Result<Vec<u8>>) -> T,
    within: Duration,
) -> Pumped {
    let mut buffer = vec![0; chunk];
    loop {
        // A client that leaves while the reader is slow to answer lets go
        // of it at once, not after the read.
        let read = tokio::select! {
            () = out.closed() => return Pumped::Done,
            read = body.read(&mut buffer) => read,
        };
        let read = match read {
            Ok(0) => return Pumped::Done,
            Ok(n) => Ok(buffer[..n].to_vec()),
            Err(err) => Err(err),
        };
        let failed = read.is_err();
        match tokio::time::timeout(within, out.send(message(read))).await {
            Ok(Ok(())) if !failed => {}
            Ok(_) => return Pumped::Done,
            Err(_) => return Pumped::Stalled,
        }
    }
}

/// `body` as a stream of chunks of at most `chunk` bytes for an HTTP
/// response, read by a task of its own through [`pump`]: the stream fails
/// (`TimedOut`, after what was queued) if the client took no chunk for
/// [`CLIENT_READS_WITHIN`], by when `body` has been dropped.
pub(crate) fn pumped(
    body: impl AsyncRead + Unpin + Send + 'static,
    chunk: usize,
) -> impl Stream<Item = io::Result<Bytes>> + Send + Unpin + 'static {
    pumped_within(body, chunk, CLIENT_READS_WITHIN)
}

fn pumped_within(
    body: impl AsyncRead + Unpin + Send + 'static,
    chunk: usize,
    within: Duration,
) -> Chunks {
    let (out, queued) = mpsc::channel(QUEUED_CHUNKS);
    let stalled = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&stalled);
    tokio::spawn(async move {
        let ended = pump(body, chunk, &out, |read| read.map(Bytes::from), within).await;
        if ended == Pumped::Stalled {
            // Before `out` closes: the stream sees it once the queue ends.
            flag.store(true, Ordering::Release);
        }
        drop(out);
    });
    Chunks {
        queued,
        stalled,
        within,
        done: false,
    }
}

/// The chunks [`pumped`] queued, then its verdict.
struct Chunks {
    queued: mpsc::Receiver<io::Result<Bytes>>,
    stalled: Arc<AtomicBool>,
    within: Duration,
    done: bool,
}

impl Stream for Chunks {
    type Item = io::Result<Bytes>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.done {
            return Poll::Ready(None);
        }
        match self.queued.poll_recv(cx) {
            Poll::Ready(None) => {
                self.done = true;
                if self.stalled.load(Ordering::Acquire) {
                    return Poll::Ready(Some(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("the client took no chunk for {:?}", self.within),
                    ))));
                }
                Poll::Ready(None)
            }
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_stream::StreamExt;

    /// An endless reader that says when it is dropped.
    struct Endless(Arc<AtomicBool>);

    impl AsyncRead for Endless {
        fn poll_read(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            buf.put_slice(&vec![7; buf.remaining()]);
            Poll::Ready(Ok(()))
        }
    }

    impl Drop for Endless {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Release);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_nobody_reads_lets_go_of_its_reader_after_the_bound() {
        let dropped = Arc::new(AtomicBool::new(false));
        let mut chunks = pumped(Endless(Arc::clone(&dropped)), 16);
        tokio::time::sleep(CLIENT_READS_WITHIN - Duration::from_secs(1)).await;
        assert!(!dropped.load(Ordering::Acquire), "let go of too early");
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(dropped.load(Ordering::Acquire), "the reader is still held");
        // A client reading at last: the queued chunks, then the failure.
        let mut taken = 0;
        let last = loop {
            match chunks.next().await {
                Some(Ok(chunk)) => taken += chunk.len(),
                other => break other,
            }
        };
        assert_eq!(taken, 16 * QUEUED_CHUNKS);
        let Some(Err(err)) = last else {
            panic!("the stream ended as if whole: {last:?}")
        };
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(chunks.next().await.is_none());
    }

    /// A reader that never answers and says when it is dropped.
    struct Hung(Arc<AtomicBool>);

    impl AsyncRead for Hung {
        fn poll_read(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            _: &mut tokio::io::ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            Poll::Pending
        }
    }

    impl Drop for Hung {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Release);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_leaves_lets_go_of_a_reader_that_does_not_answer() {
        let dropped = Arc::new(AtomicBool::new(false));
        let chunks = pumped(Hung(Arc::clone(&dropped)), 16);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!dropped.load(Ordering::Acquire));
        drop(chunks);
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(
            dropped.load(Ordering::Acquire),
            "the reader is held after the client left"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_read_in_time_comes_whole() {
        let contents: Vec<u8> = (0..100u8).collect();
        let mut chunks = pumped(io::Cursor::new(contents.clone()), 16);
        let mut read = Vec::new();
        while let Some(chunk) = chunks.next().await {
            tokio::time::sleep(CLIENT_READS_WITHIN - Duration::from_secs(1)).await;
            read.extend_from_slice(&chunk.expect("a chunk"));
        }
        assert_eq!(read, contents);
    }
}
