//! An upload, for every transport, bounded by inactivity rather than by a
//! whole-call timeout: one that keeps sending proceeds however long it
//! takes (the store bounds its size, `maxFileSize`), and is cut when no
//! bytes arrive for the idle bound (`request_timeout`) while the store
//! waits for them. The store is then told through its body (a read error),
//! so it cleans up as after any failed write; the call answers
//! [`UploadError::Idle`]. A store that itself stops taking bytes is given
//! twice the bound after its last progress, then the upload is abandoned
//! ([`UploadError::StoreStalled`]).
//!
//! The store's write runs under the file store's circuit breaker alone,
//! not its resiliency `timeout` (which would cut an upload that keeps
//! sending): a write the store fails, or a store that stalls, counts as
//! its failure; a write cut by the client (its body broke off, or went
//! idle) counts neither way, so no client can open the breaker on
//! everyone else's calls. The timeout (without one, the store's grace)
//! still bounds what the breaker waits for: past it, an upload hands its
//! half-open trial place back and runs on (one trickling upload never
//! blocks the store's other calls); and an upload whose call is dropped
//! (its client gave up) is the store's failure if the store had kept it
//! waiting that long (a hung store opens its breaker), else counted
//! neither way (the store was waiting for the client).

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Bytes;
use rewire_runtime::resilience::Failure;
use rewire_runtime::{echoed, FileError, FileInfo, FileStore, PutFileRequest};
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
    /// As many uploads as `ApiOptions::max_uploads` run already.
    #[error(
        "uploading file `{name}` to file store `{store}`: the sidecar's bound on uploads running \
         at once (max_uploads: {max}, HTTP file PUTs and Layotto PutFile calls together) is \
         reached; retry once one has finished"
    )]
    TooMany {
        /// The store.
        store: String,
        /// The file.
        name: String,
        /// The bound.
        max: usize,
    },
    /// The store refused or failed the write.
    #[error(transparent)]
    File(#[from] FileOpError),
}

impl From<crate::upload_slots::UploadsFull> for UploadError {
    fn from(full: crate::upload_slots::UploadsFull) -> Self {
        let crate::upload_slots::UploadsFull { store, name, max } = full;
        Self::TooMany { store, name, max }
    }
}

/// How the store's write of an upload failed, as its breaker counts it:
/// the store's failures, not the client's.
#[derive(Debug)]
enum WriteFailed {
    /// The store's own error: a failure when it is one.
    Store(FileError),
    /// The store's error while the client's body had failed (broken off,
    /// or idle): the client's doing, never the store's failure.
    ClientBody(FileError),
    /// The store took no bytes for the grace it is given: its failure.
    Stalled,
}

impl WriteFailed {
    /// A policy's refusal (an open breaker), as the store's error.
    fn refused(reason: String) -> Self {
        Self::Store(FileError::Backend(reason))
    }
}

impl Failure for WriteFailed {
    fn is_failure(&self) -> bool {
        match self {
            Self::Store(error) => error.is_failure(),
            Self::ClientBody(_) => false,
            Self::Stalled => true,
        }
    }

    /// A write the client's body cut short says nothing of the store:
    /// counted neither way (not a success closing a half-open breaker).
    fn tells_of_component(&self) -> bool {
        !matches!(self, Self::ClientBody(_))
    }
}

/// When the upload last moved: a chunk taken, or the store asking for one;
/// and whether the client's body failed.
struct Progress {
    last: Mutex<Moved>,
    /// No bytes arrived for the idle bound.
    idle: AtomicBool,
    /// The client's body ended in an error (its connection or stream
    /// broke off).
    broken: AtomicBool,
}

/// The upload's last move.
#[derive(Clone, Copy)]
struct Moved {
    at: Instant,
    /// Whether the store then asked for a chunk (it waits for the client)
    /// rather than took one (the client waits for the store).
    store_asked: bool,
}

impl Progress {
    fn new() -> Self {
        Self {
            last: Mutex::new(Moved {
                at: Instant::now(),
                store_asked: false,
            }),
            idle: AtomicBool::new(false),
            broken: AtomicBool::new(false),
        }
    }

    /// Whether the client's body failed: idle, or broken off.
    fn client_failed(&self) -> bool {
        self.idle.load(Ordering::Acquire) || self.broken.load(Ordering::Acquire)
    }

    /// The upload moves now: the store asks for a chunk (`store_asked`),
    /// or takes one (or the body's end).
    fn moved(&self, store_asked: bool) {
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = Moved {
            at: Instant::now(),
            store_asked,
        };
    }

    fn last(&self) -> Instant {
        self.last.lock().unwrap_or_else(|p| p.into_inner()).at
    }

    /// How long the store has kept the client waiting on it (writing the
    /// last chunk it took, or committing the file); `None` while the store
    /// waits for the client, or once the client's body failed: a client
    /// giving up then says nothing of the store.
    fn store_held_up_for(&self) -> Option<Duration> {
        if self.client_failed() {
            return None;
        }
        let last = *self.last.lock().unwrap_or_else(|p| p.into_inner());
        (!last.store_asked).then(|| last.at.elapsed())
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
            this.progress.moved(true);
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
                    if matches!(chunk, Some(Err(_))) {
                        this.progress.broken.store(true, Ordering::Release);
                    }
                    this.waiting = false;
                    this.progress.moved(false);
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
    /// Writes `chunks` as `name` (all or nothing, within the store's
    /// bound), cut when no chunk arrives for `idle` while the store waits
    /// for one (see the module's notes).
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
        let progress = Arc::new(Progress::new());
        let bounded = IdleBounded {
            chunks,
            idle,
            timer: Box::pin(tokio::time::sleep(idle)),
            waiting: false,
            progress: Arc::clone(&progress),
        };
        let request = PutFileRequest {
            name: name.clone(),
            body: Box::pin(tokio_util::io::StreamReader::new(bounded)),
            metadata,
        };
        let store_grace = idle.saturating_mul(2);
        let write = watched_write(self.store(), request, &progress, store_grace);
        let held_up = || progress.store_held_up_for();
        let written = self
            .call()
            .guarded_admitted(
                self.target(),
                write,
                (held_up, store_grace),
                WriteFailed::refused,
            )
            .await;
        if progress.idle.load(Ordering::Acquire) {
            return Err(UploadError::Idle {
                store: self.name().to_string(),
                name,
                idle,
            });
        }
        let action = || format!("put file `{}`", echoed(&name));
        match written {
            Ok(info) => Ok(info),
            Err(WriteFailed::Stalled) => Err(UploadError::StoreStalled {
                store: self.name().to_string(),
                name: name.clone(),
                waited: store_grace,
            }),
            Err(WriteFailed::Store(error)) => Err(self.failed(action(), error).into()),
            // The client's own doing: answered as a bad request whatever
            // the store made of it.
            Err(WriteFailed::ClientBody(error)) => {
                let error = match error {
                    FileError::Backend(reason) => FileError::Invalid(reason),
                    other => other,
                };
                Err(self.failed(action(), error).into())
            }
        }
    }
}

/// The store's write of `request`, given up on when the store makes no
/// progress for `grace` ([`WriteFailed::Stalled`]); its error told apart
/// by whether the client's body had failed.
async fn watched_write(
    store: &Arc<dyn FileStore>,
    request: PutFileRequest,
    progress: &Progress,
    grace: Duration,
) -> Result<FileInfo, WriteFailed> {
    let put = store.put(request);
    tokio::pin!(put);
    loop {
        let due = progress.last() + grace;
        tokio::select! {
            put = &mut put => {
                return put.map_err(|error| {
                    if progress.client_failed() {
                        WriteFailed::ClientBody(error)
                    } else {
                        WriteFailed::Store(error)
                    }
                });
            }
            () = tokio::time::sleep_until(due) => {
                if progress.last() + grace <= Instant::now() {
                    return Err(WriteFailed::Stalled);
                }
            }
        }
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
        let progress = Arc::new(Progress::new());
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

    /// A store that never reads the body it is given (a black-holed
    /// backend, a hung write).
    #[derive(rewire_runtime::Component, Default)]
    #[component(kind = "file", type = "test.upload.deaf")]
    struct DeafFiles {}

    /// A store that reads its body to the end, then keeps it.
    #[derive(rewire_runtime::Component, Default)]
    #[component(kind = "file", type = "test.upload.reading")]
    struct ReadingFiles {}

    #[rewire_runtime::prelude::async_trait]
    impl rewire_runtime::Component for DeafFiles {}

    #[rewire_runtime::prelude::async_trait]
    impl rewire_runtime::Component for ReadingFiles {}

    #[rewire_runtime::prelude::async_trait]
    impl FileStore for DeafFiles {
        async fn put(&self, _: PutFileRequest) -> Result<FileInfo, FileError> {
            std::future::pending().await
        }
        async fn get(&self, name: &str) -> Result<rewire_runtime::FileRead, FileError> {
            Err(FileError::NotFound(name.into()))
        }
        async fn list(
            &self,
            _: rewire_runtime::ListRequest,
        ) -> Result<rewire_runtime::ListPage, FileError> {
            Ok(rewire_runtime::ListPage::default())
        }
        async fn stat(&self, name: &str) -> Result<FileInfo, FileError> {
            Err(FileError::NotFound(name.into()))
        }
        async fn delete(&self, name: &str) -> Result<(), FileError> {
            Err(FileError::NotFound(name.into()))
        }
    }

    #[rewire_runtime::prelude::async_trait]
    impl FileStore for ReadingFiles {
        async fn put(&self, mut req: PutFileRequest) -> Result<FileInfo, FileError> {
            use tokio::io::AsyncReadExt;
            let mut whole = Vec::new();
            req.body
                .read_to_end(&mut whole)
                .await
                .map_err(|e| FileError::Invalid(e.to_string()))?;
            std::future::pending().await
        }
        async fn get(&self, name: &str) -> Result<rewire_runtime::FileRead, FileError> {
            Err(FileError::NotFound(name.into()))
        }
        async fn list(
            &self,
            _: rewire_runtime::ListRequest,
        ) -> Result<rewire_runtime::ListPage, FileError> {
            Ok(rewire_runtime::ListPage::default())
        }
        async fn stat(&self, name: &str) -> Result<FileInfo, FileError> {
            Err(FileError::NotFound(name.into()))
        }
        async fn delete(&self, name: &str) -> Result<(), FileError> {
            Err(FileError::NotFound(name.into()))
        }
    }

    /// A runtime whose file store `files` is of `type_name`, under a 1 s
    /// timeout and a breaker that opens at 2 consecutive failures.
    async fn guarded_store(type_name: &str) -> rewire_runtime::Runtime {
        use rewire_runtime::config::{parse, validate};
        let config = serde_json::json!({
            "appId": "app",
            "components": {"file": {"files": {"type": type_name}}},
            "resiliency": {
                "policies": {
                    "timeouts": {"short": "1s"},
                    "circuitBreakers": {"cb": {"trip": "consecutiveFailures >= 2",
                                               "timeout": "60s"}}
                },
                "targets": {"components": {"files": {"outbound": {
                    "timeout": "short", "circuitBreaker": "cb"
                }}}}
            }
        });
        let file = parse(config.to_string().as_bytes()).unwrap_or_else(|p| panic!("{p}"));
        let registry = rewire_runtime::Registry::collected();
        let config = validate(file, &registry).unwrap_or_else(|p| panic!("{p}"));
        let options = rewire_runtime::RuntimeOptions::default();
        rewire_runtime::Runtime::start(config, registry, options)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Uploads to `files`, the client sending one chunk then nothing more
    /// (its stream kept open), dropped by its client after 5 s (the
    /// sidecar's idle bound, 30 s, never reached); then the breaker's
    /// state and consecutive failures.
    async fn abandoned_uploads(
        runtime: &rewire_runtime::Runtime,
        count: usize,
    ) -> (rewire_runtime::resilience::BreakerState, u32) {
        let call = crate::dapr::Call::new(runtime, crate::dapr::StoreLabel::default());
        let files = call.file_store("files").unwrap_or_else(|e| panic!("{e}"));
        for i in 0..count {
            let chunks = tokio_stream::iter(vec![chunk("x")]).chain(tokio_stream::pending());
            let upload = files.put_streamed(
                format!("cut{i}.bin"),
                chunks,
                BTreeMap::new(),
                Duration::from_secs(30),
            );
            let cut = tokio::time::timeout(Duration::from_secs(5), upload).await;
            assert!(cut.is_err(), "the upload never ends: {cut:?}");
        }
        let key = rewire_runtime::ComponentKey::new(rewire_runtime::Kind::File, "files");
        let generation = runtime.generation();
        let status = generation
            .policies()
            .get(&key)
            .and_then(|applied| applied.breaker_status())
            .unwrap_or_else(|| panic!("`files` has a breaker"));
        (status.state, status.consecutive_failures)
    }

    #[tokio::test(start_paused = true)]
    async fn uploads_abandoned_while_the_store_holds_them_up_open_its_breaker() {
        use rewire_runtime::resilience::BreakerState;
        let runtime = guarded_store("test.upload.deaf").await;
        let state = abandoned_uploads(&runtime, 2).await;
        assert_eq!(state, (BreakerState::Open, 0), "a hung store opens it");
        runtime.shutdown().await;
    }

    #[tokio::test(start_paused = true)]
    async fn uploads_abandoned_while_the_store_waits_for_their_client_count_neither_way() {
        use rewire_runtime::resilience::BreakerState;
        let runtime = guarded_store("test.upload.reading").await;
        let state = abandoned_uploads(&runtime, 3).await;
        assert_eq!(state, (BreakerState::Closed, 0), "the clients gave up");
        runtime.shutdown().await;
    }
}
