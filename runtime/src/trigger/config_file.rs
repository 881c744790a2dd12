//! The configuration file as a reload trigger: every settled change of its
//! content (plain writes, rename-writes, Kubernetes ConfigMap `..data`
//! swaps) is parsed and queued; an invalid or half-written file is recorded
//! as rejected and the next good write applies.
//!
//! The first read (when the watch starts) compares the file with the
//! configuration the runtime runs, not with an earlier read: a write made
//! while the runtime was starting is applied.
//!
//! A read is bounded in time ([`CONFIG_READ_DEADLINE`], on a thread of its
//! own): one that never returns (a hung mount) is recorded as rejected and
//! the watch carries on. While that read stays blocked, the watch starts no
//! other (one stuck thread at most, not one per event or re-read): each is
//! recorded as still in progress, and the first after it returns reads.
//!
//! No read (an event, a periodic re-read, a new generation, a control-plane
//! change) reads the file while it is being written in place, and one that
//! sees it written meanwhile is discarded (see [`crate::fs_watch`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::file_seen::{
    digest, follow_generations, lock_once_written, written_since, Seen, SharedSeen,
};
use super::TriggerContext;
use crate::config::{folder_of, parse, read_config_bytes, Problems};
use crate::fs_read::{Abandoned, DetachedReader, CONFIG_READ_DEADLINE};
use crate::fs_watch::{FileWatch, OnChange, Writers};
use crate::reload::{ReloadRequest, Trigger};

/// Watches the configuration file at `path`: when its content changes,
/// the new content is sent as the base configuration (through the reload
/// queue, so bursts coalesce). `resync` re-reads it periodically in case
/// an event is lost. The watch ends at shutdown.
pub(crate) fn watch_config_file(cx: &TriggerContext, path: PathBuf, resync: Duration) -> FileWatch {
    let seen = SharedSeen::default();
    let stop = cx.stopped.child_token();
    let trigger = cx.clone();
    let watched = path.clone();
    let shared = Arc::clone(&seen);
    // The watch's reads: one stuck in the kernel at most.
    let reader = Arc::new(DetachedReader::default());
    // The file's writers, seen by the watch, waited for by every read.
    let writers = Arc::new(Writers::default());
    let being_written = Arc::clone(&writers);
    let on_change: OnChange = Arc::new(move || {
        let cx = trigger.clone();
        let path = watched.clone();
        let seen = Arc::clone(&shared);
        let reader = Arc::clone(&reader);
        let writers = Arc::clone(&being_written);
        Box::pin(async move { config_file_changed(&cx, &path, &seen, &reader, &writers).await })
    });
    follow_generations(cx, seen, Arc::clone(&on_change), stop.clone());
    cx.source_reads
        .register(stop.clone(), Arc::clone(&on_change));
    FileWatch::start_sharing(path, on_change, Some(resync), stop, writers)
}

async fn config_file_changed(
    cx: &TriggerContext,
    path: &Path,
    seen: &SharedSeen,
    reader: &DetachedReader,
    writers: &Writers,
) {
    let owned = path.to_path_buf();
    let read = move || read_config_bytes(&owned);
    let watch = FileReads {
        seen,
        reader,
        writers,
    };
    changed(cx, path, watch, CONFIG_READ_DEADLINE, read).await;
}

/// What the reads of the file share.
#[derive(Clone, Copy)]
struct FileReads<'a> {
    seen: &'a SharedSeen,
    reader: &'a DetachedReader,
    writers: &'a Writers,
}

/// Reads the file with `read` through `reader` (given up after
/// `deadline`; not started while an earlier read is stuck; not while the
/// file is being written, and discarded if it was written meanwhile),
/// then sends what changed.
async fn changed<R>(
    cx: &TriggerContext,
    path: &Path,
    watch: FileReads<'_>,
    deadline: Duration,
    read: R,
) where
    R: FnOnce() -> Result<Vec<u8>, Problems> + Send + 'static,
{
    let FileReads {
        seen,
        reader,
        writers,
    } = watch;
    // Held to the end: one read, parse and send at a time.
    let Some((mut seen, count)) = lock_once_written(seen, writers).await else {
        return;
    };
    let generation = cx.plan.borrow().generation;
    let bytes = match reader.read_within(deadline, read).await {
        // Maybe half-written: read again once its writer closes it.
        Ok(_) if written_since(writers, count) => return,
        Ok(Ok(bytes)) => bytes,
        Ok(Err(problems)) => {
            return reject_once(cx, &mut seen, generation, problems.to_string());
        }
        Err(abandoned @ Abandoned::TimedOut(_)) => {
            let problem = format!(
                "reading configuration file {} {abandoned}; given up (the next change or re-read tries again)",
                path.display()
            );
            return reject_once(cx, &mut seen, generation, problem);
        }
        Err(abandoned @ Abandoned::StillReading) => {
            let problem = format!(
                "reading configuration file {} {abandoned} (the next change or re-read tries again)",
                path.display()
            );
            return reject_once(cx, &mut seen, generation, problem);
        }
        Err(err) => {
            tracing::warn!(path = %path.display(), error = %err, "Reading the configuration file failed.");
            return;
        }
    };
    let hash = digest(&bytes);
    if seen.is_done(hash, generation) {
        return;
    }
    match parse(&bytes) {
        Ok(mut config) => {
            config.base_dir = folder_of(path);
            // In force, and nothing else sent that could go in force
            // after it (queued, in flight, retried): nothing to do.
            if (cx.file_in_force)(&config) && !seen.other_sent(hash) {
                seen.settled(hash);
                return;
            }
            seen.sent(hash, generation);
            tracing::info!(path = %path.display(), "Configuration file changed.");
            cx.request(ReloadRequest::new(config, Trigger::File));
        }
        Err(problems) => {
            seen.settled(hash);
            cx.reject(Trigger::File, problems.to_string());
        }
    }
}

/// Records `problem` as a rejection, once per distinct problem (not at
/// every re-read).
pub(super) fn reject_once(cx: &TriggerContext, seen: &mut Seen, generation: u64, problem: String) {
    let hash = digest(&problem);
    if !seen.is_done(hash, generation) {
        seen.settled(hash);
        cx.reject(Trigger::File, problem);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handle::Live;
    use crate::reload::queue::{QueueReceiver, Queued};

    fn context() -> (TriggerContext, QueueReceiver) {
        TriggerContext::for_tests(Live::new(), "")
    }

    /// The reads of a file no watch follows (nothing being written).
    fn reads<'a>(seen: &'a SharedSeen, reader: &'a DetachedReader) -> FileReads<'a> {
        static NO_WRITERS: std::sync::OnceLock<Writers> = std::sync::OnceLock::new();
        FileReads {
            seen,
            reader,
            writers: NO_WRITERS.get_or_init(Writers::default),
        }
    }

    const GOOD: &str = r#"{"components": {"state": {"s": {"type": "memory"}}}}"#;

    #[tokio::test]
    async fn a_read_that_never_returns_is_reported_and_a_later_good_write_applies() {
        let (cx, mut queued) = context();
        let seen = SharedSeen::default();
        let path = Path::new("/config/rewire.json");
        let (_keep, never) = std::sync::mpsc::channel::<()>();
        let hung = move || {
            let _ = never.recv();
            Ok(Vec::new())
        };
        let deadline = Duration::from_millis(100);
        let reader = DetachedReader::default();
        changed(&cx, path, reads(&seen, &reader), deadline, hung).await;
        match queued.try_recv() {
            Ok(Queued::Rejected { trigger, error }) => {
                assert_eq!(trigger, Trigger::File);
                assert_eq!(
                    error,
                    "reading configuration file /config/rewire.json did not finish within \
                     100 ms; given up (the next change or re-read tries again)"
                );
            }
            other => panic!("the hung read is not reported: {other:?}"),
        }
        // The watch is not stuck: the next read, good, is sent (on a
        // reader of its own: the hung one is never released).
        let good = || Ok(GOOD.as_bytes().to_vec());
        let reader = DetachedReader::default();
        changed(&cx, path, reads(&seen, &reader), deadline, good).await;
        assert!(
            matches!(queued.try_recv(), Ok(Queued::Reload(r)) if r.trigger == Trigger::File),
            "the good write is not sent"
        );
    }

    #[tokio::test]
    async fn while_a_read_is_stuck_no_other_starts_and_once_it_returns_the_next_applies() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let (cx, mut queued) = context();
        let seen = SharedSeen::default();
        let reader = DetachedReader::default();
        let path = Path::new("/config/rewire.json");
        let deadline = Duration::from_millis(100);
        let starts = Arc::new(AtomicUsize::new(0));
        let (release, stuck) = std::sync::mpsc::channel::<()>();
        let (returned, has_returned) = std::sync::mpsc::channel::<()>();
        let counted = Arc::clone(&starts);
        let hung = move || {
            counted.fetch_add(1, Ordering::SeqCst);
            let _ = stuck.recv();
            let _ = returned.send(());
            Ok(Vec::new())
        };
        changed(&cx, path, reads(&seen, &reader), deadline, hung).await;
        assert!(matches!(queued.try_recv(), Ok(Queued::Rejected { .. })));
        // Three events or re-reads while it is stuck: no thread, no wait,
        // reported once.
        for _ in 0..3 {
            let counted = Arc::clone(&starts);
            let good = move || {
                counted.fetch_add(1, Ordering::SeqCst);
                Ok(GOOD.as_bytes().to_vec())
            };
            let started = std::time::Instant::now();
            changed(&cx, path, reads(&seen, &reader), deadline, good).await;
            assert!(started.elapsed() < deadline, "{:?}", started.elapsed());
        }
        assert_eq!(starts.load(Ordering::SeqCst), 1, "reading threads started");
        match queued.try_recv() {
            Ok(Queued::Rejected { error, .. }) => assert_eq!(
                error,
                "reading configuration file /config/rewire.json is not started: an earlier \
                 read, given up, has not returned yet (the next change or re-read tries again)"
            ),
            other => panic!("the read in progress is not reported: {other:?}"),
        }
        assert!(queued.try_recv().is_err(), "reported more than once");
        // Released, the stuck read returns; the next event reads and sends.
        release.send(()).unwrap();
        has_returned.recv_timeout(Duration::from_secs(5)).unwrap();
        let waited = std::time::Instant::now();
        loop {
            let counted = Arc::clone(&starts);
            let good = move || {
                counted.fetch_add(1, Ordering::SeqCst);
                Ok(GOOD.as_bytes().to_vec())
            };
            changed(&cx, path, reads(&seen, &reader), deadline, good).await;
            if let Ok(Queued::Reload(r)) = queued.try_recv() {
                assert_eq!(r.trigger, Trigger::File);
                break;
            }
            // The thread clears its mark an instant after it signals.
            assert!(
                waited.elapsed() < Duration::from_secs(5),
                "never read again"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(starts.load(Ordering::SeqCst), 2, "reading threads started");
    }
}
