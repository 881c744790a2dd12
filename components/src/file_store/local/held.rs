//! What a `local` put keeps while its blocking work runs: the upload's
//! hold ([`PutFileRequest::upload_hold`], the sidecar's place among
//! `max_uploads`). A blocking write, sync or rename runs on the blocking
//! pool to its end even when the put's future is dropped (its client gave
//! up); on a hung disk it can run for as long as the disk hangs, holding
//! its open files. Each such task keeps a clone of the hold, so the place
//! is given back only once the last of them has ended, and no more than
//! `max_uploads` puts' blocking writes exist at once.

use std::any::Any;
use std::fs::File;
use std::future::Future;
use std::io::Write;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use rewire_runtime::{FileError, PutFileRequest};
use tokio::io::AsyncWrite;
use tokio::task::JoinHandle;

/// The hold of the upload a put serves (none outside an upload): cloned
/// into each blocking task of the put.
#[derive(Clone, Default)]
pub(super) struct Held(Option<Arc<dyn Any + Send + Sync>>);

impl std::fmt::Debug for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Held").field(&self.0.is_some()).finish()
    }
}

impl Held {
    /// The hold of the upload whose put the calling task runs.
    pub(super) fn of_upload() -> Self {
        Self(PutFileRequest::upload_hold())
    }

    /// Runs the blocking `op` off the runtime, keeping the hold until it
    /// has returned (however long after the put's future is gone).
    pub(super) async fn blocking<T: Send + 'static>(
        &self,
        op: impl FnOnce() -> Result<T, FileError> + Send + 'static,
    ) -> Result<T, FileError> {
        let held = self.clone();
        tokio::task::spawn_blocking(move || {
            let answer = op();
            drop(held);
            answer
        })
        .await
        .map_err(|err| FileError::Backend(format!("the file store's task failed: {err}")))?
    }

    /// A test's hung disk: blocks the calling write until it is let go.
    #[cfg(test)]
    fn stall_if_hung(&self) {
        if let Some(disk) = self.0.as_ref().and_then(|h| h.downcast_ref::<HungDisk>()) {
            disk.stall();
        }
    }
}

/// A put's file, written on the blocking pool one chunk at a time, as
/// `tokio::fs::File` is (a chunk is taken at once and written behind: its
/// error, if any, is the next write's or the flush's), each write keeping
/// the put's hold until it returns.
pub(super) struct HeldFile {
    file: Arc<File>,
    held: Held,
    /// The write running now, if any. Dropped (the put abandoned), it runs
    /// on with its own clones of the file and the hold: the file is
    /// closed, then the hold let go, when it ends.
    writing: Option<JoinHandle<std::io::Result<()>>>,
}

impl HeldFile {
    /// `file`, written keeping `held`.
    pub(super) fn new(file: File, held: Held) -> Self {
        Self {
            file: Arc::new(file),
            held,
            writing: None,
        }
    }

    /// Syncs the file to disk and answers its metadata, then closes it:
    /// all on the blocking pool, keeping the hold until done. Any write
    /// still running is waited for first.
    pub(super) async fn sync_and_close(
        mut self,
        name: &str,
    ) -> Result<std::fs::Metadata, FileError> {
        std::future::poll_fn(|cx| Pin::new(&mut self).poll_flush(cx))
            .await
            .map_err(|err| FileError::Backend(format!("writing `{name}`: {err}")))?;
        let (file, held) = (Arc::clone(&self.file), self.held.clone());
        drop(self);
        let name = name.to_string();
        held.blocking(move || {
            file.sync_all()
                .map_err(|err| super::backend("syncing", &name, err))?;
            file.metadata()
                .map_err(|err| super::backend("reading", &name, err))
        })
        .await
    }

    /// Waits for the running write, if any: its error.
    fn poll_written(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let Some(writing) = self.writing.as_mut() else {
            return Poll::Ready(Ok(()));
        };
        let written = ready!(Pin::new(writing).poll(cx));
        self.writing = None;
        Poll::Ready(written.map_err(std::io::Error::other).and_then(|w| w))
    }
}

impl AsyncWrite for HeldFile {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = &mut *self;
        ready!(this.poll_written(cx))?;
        let (file, held, bytes) = (Arc::clone(&this.file), this.held.clone(), buf.to_vec());
        this.writing = Some(tokio::task::spawn_blocking(move || {
            #[cfg(test)]
            held.stall_if_hung();
            let written = (&*file).write_all(&bytes);
            drop(file);
            drop(held);
            written
        }));
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.poll_written(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.poll_flush(cx)
    }
}

/// A hung disk, for tests: given as an upload's hold, every write of the
/// put stalls until [`HungDisk::new`]'s `open` sender is dropped (within a
/// minute at most); tells when a write stalls and when the hold is let go.
#[cfg(test)]
pub(super) struct HungDisk {
    stalled: tokio::sync::mpsc::UnboundedSender<()>,
    open: std::sync::Mutex<std::sync::mpsc::Receiver<()>>,
    released: tokio::sync::mpsc::UnboundedSender<()>,
}

/// The test's ends of a [`HungDisk`].
#[cfg(test)]
pub(super) struct DiskProbes {
    /// A message each time a write stalls.
    pub stalled: tokio::sync::mpsc::UnboundedReceiver<()>,
    /// Dropped, lets every stalled write go.
    pub open: std::sync::mpsc::Sender<()>,
    /// A message once the hold is let go (the disk dropped).
    pub released: tokio::sync::mpsc::UnboundedReceiver<()>,
}

#[cfg(test)]
impl HungDisk {
    pub(super) fn new() -> (Self, DiskProbes) {
        let (stalled, stalled_rx) = tokio::sync::mpsc::unbounded_channel();
        let (open_tx, open) = std::sync::mpsc::channel();
        let (released, released_rx) = tokio::sync::mpsc::unbounded_channel();
        let disk = Self {
            stalled,
            open: std::sync::Mutex::new(open),
            released,
        };
        let probes = DiskProbes {
            stalled: stalled_rx,
            open: open_tx,
            released: released_rx,
        };
        (disk, probes)
    }

    fn stall(&self) {
        let _ = self.stalled.send(());
        let open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let _ = open.recv_timeout(std::time::Duration::from_secs(60));
    }
}

#[cfg(test)]
impl Drop for HungDisk {
    fn drop(&mut self) {
        let _ = self.released.send(());
    }
}
