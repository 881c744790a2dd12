//! An upload, for every transport, bounded by inactivity rather than by a
//! whole-call timeout: one that keeps sending proceeds however long it
//! takes (the store bounds its size, `maxFileSize`), and is cut when no
//! bytes arrive for the idle bound (`request_timeout`) while the store
//! waits for them. The store is then told through its body (a read error),
//! so it cleans up as after any failed write; the call answers
//! [`UploadError::Idle`]. A store that itself stops taking bytes is given
//! twice the bound after its last progress, then the upload is abandoned
//! ([`UploadError::StoreStalled`]).

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Bytes;
use rewire_runtime::FileInfo;
use tokio::time::{Instant, Sleep};
use tokio_stream::Stream;

use super::file::{FileOpError, FileOps};

/// Why an upload failed.
#[derive(Debug, thiserror::Error)]
pub enum UploadError {
    /// The client sent nothing for the idle bound.
    #[error(
        "uploading file `{name}` to file store `{store}`: no bytes arrived for {idle:?} \
         (request_timeout); an upload may take as long as it needs while it keeps sending"
    )]
    Idle {
        /// The store.
        store: String,
        /// The file.
        name: String,
        /// The bound.
        idle: Duration,
    },
    /// The store took no bytes for twice the idle bound.
    #[error(
        "uploading file `{name}` to file store `{store}`: the store made no progress for \
         {waited:?} (twice request_timeout)"
    )]
    StoreStalled {
        /// The store.
        store: String,
        /// The file.
        name: String,
        /// How long it made none.
        waited: Duration,
    },
    /// The store refused or failed the write.
    #[error(transparent)]
    File(#[from] FileOpError),
}

/// When the upload last moved: a chunk taken, or the store asking for one.
struct Progress {
    last: Mutex<Instant>,
    idle: AtomicBool,
}

impl Progress {
    fn touch(&self) {
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
    }

    fn last(&self) -> Instant {
        *self.last.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A body's chunks, failing with [`std::io::ErrorKind::TimedOut`] when the
/// next does not arrive within `idle` of being asked for.
struct IdleBounded<S> {
    chunks: S,
    idle: Duration,
    timer: Pin<Box<Sleep>>,
    waiting: bool,
    progress: Arc<Progress>,
}

impl<S, B> Stream for IdleBounded<S>
where
    S: Stream<Item = Result<B, std::io::Error>> + Unpin,
    B: AsRef<[u8]>,
{
    type Item = Result<B, std::io::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if this.progress.idle.load(Ordering::Acquire) {
            return Poll::Ready(None);
        }
        if !this.waiting {
            // The wait starts when the store asks: time it spends writing
            // is not the client's.
            this.timer.as_mut().reset(Instant::now() + this.idle);
            this.waiting = true;
            this.progress.touch();
        }
        loop {
            match Pin::new(&mut this.chunks).poll_next(cx) {
                // No bytes, no progress: the wait runs on (empty messages
                // sent within the bound held an upload open forever).
                Poll::Ready(Some(Ok(chunk))) if chunk.as_ref().is_empty() => {
                    if this.timer.as_mut().poll(cx).is_ready() {
                        return Poll::Ready(Some(Err(this.gave_up())));
                    }
                }
                Poll::Ready(chunk) => {
                    this.waiting = false;
                    this.progress.touch();
                    return Poll::Ready(chunk);
                }
                Poll::Pending => break,
            }
        }
        if this.timer.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Some(Err(this.gave_up())));
        }
        Poll::Pending
    }
}

impl<S> IdleBounded<S> {
    /// Marks the upload idle; the error that ends its body.
    fn gave_up(&self) -> std::io::Error {
        self.progress.idle.store(true, Ordering::Release);
        let idle = self.idle;
        std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("no bytes arrived for {idle:?}"),
        )
    }
}

impl FileOps {
    /// Writes `chunks` as `name`, cut when no chunk arrives for `idle`
    /// while the store waits for one (see the module's notes).
    pub async fn put_streamed<S>(
        &self,
        name: String,
        chunks: S,
        metadata: BTreeMap<String, String>,
        idle: Duration,
    ) -> Result<FileInfo, UploadError>
    where
        S: Stream<Item = Result<Bytes, std::io::Error>> + Unpin + Send + 'static,
    {
        let progress = Arc::new(Progress {
            last: Mutex::new(Instant::now()),
            idle: AtomicBool::new(false),
        });
        let bounded = IdleBounded {
            chunks,
            idle,
            timer: Box::pin(tokio::time::sleep(idle)),
            waiting: false,
            progress: Arc::clone(&progress),
        };
        let body = Box::pin(tokio_util::io::StreamReader::new(bounded));
        let store_grace = idle.saturating_mul(2);
        let put = self.put(name.clone(), body, metadata);
        tokio::pin!(put);
        let stalled = loop {
            let due = progress.last() + store_grace;
            tokio::select! {
                put = &mut put => break put.map_err(UploadError::from),
                () = tokio::time::sleep_until(due) => {
                    if progress.last() + store_grace <= Instant::now() {
                        break Err(UploadError::StoreStalled {
                            store: self.name().to_string(),
                            name: name.clone(),
                            waited: store_grace,
                        });
                    }
                }
            }
        };
        if progress.idle.load(Ordering::Acquire) {
            return Err(UploadError::Idle {
                store: self.name().to_string(),
                name,
                idle,
            });
        }
        stalled
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_stream::StreamExt;

    fn chunk(text: &'static str) -> Result<Bytes, std::io::Error> {
        Ok(Bytes::from_static(text.as_bytes()))
    }

    #[tokio::test(start_paused = true)]
    async fn chunks_that_keep_coming_pass_and_a_pause_longer_than_the_bound_fails() {
        let idle = Duration::from_secs(1);
        let (sender, receiver) = tokio::sync::mpsc::channel(1);
        let progress = Arc::new(Progress {
            last: Mutex::new(Instant::now()),
            idle: AtomicBool::new(false),
        });
        let mut bounded = IdleBounded {
            chunks: tokio_stream::wrappers::ReceiverStream::new(receiver),
            idle,
            timer: Box::pin(tokio::time::sleep(idle)),
            waiting: false,
            progress: Arc::clone(&progress),
        };
        let sending = tokio::spawn(async move {
            for _ in 0..10 {
                tokio::time::sleep(Duration::from_millis(300)).await;
                sender.send(chunk("x")).await.expect("taken");
            }
            // Then silence, the sender kept open.
            tokio::time::sleep(Duration::from_secs(3600)).await;
            drop(sender);
        });
        for _ in 0..10 {
            assert!(bounded.next().await.expect("a chunk").is_ok());
        }
        let stalled = bounded.next().await.expect("an error").expect_err("idle");
        assert_eq!(stalled.kind(), std::io::ErrorKind::TimedOut);
        assert!(progress.idle.load(Ordering::Acquire));
        assert!(bounded.next().await.is_none());
        sending.abort();
    }
}
