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
//! the watch carries on.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::file_seen::{digest, follow_generations, Seen, SharedSeen};
use super::TriggerContext;
use crate::config::{folder_of, parse, read_config_bytes, Problems};
use crate::fs_read::{detached_within, Abandoned, CONFIG_READ_DEADLINE};
use crate::fs_watch::{FileWatch, OnChange};
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
    let on_change: OnChange = Arc::new(move || {
        let cx = trigger.clone();
        let path = watched.clone();
        let seen = Arc::clone(&shared);
        Box::pin(async move { config_file_changed(&cx, &path, &seen).await })
    });
    follow_generations(cx, seen, Arc::clone(&on_change), stop.clone());
    FileWatch::start(path, on_change, Some(resync), stop)
}

async fn config_file_changed(cx: &TriggerContext, path: &Path, seen: &SharedSeen) {
    let owned = path.to_path_buf();
    let read = move || read_config_bytes(&owned);
    changed(cx, path, seen, CONFIG_READ_DEADLINE, read).await;
}

/// Reads the file with `read` (given up after `deadline`), then sends
/// what changed.
async fn changed<R>(
    cx: &TriggerContext,
    path: &Path,
    seen: &SharedSeen,
    deadline: Duration,
    read: R,
) where
    R: FnOnce() -> Result<Vec<u8>, Problems> + Send + 'static,
{
    // Held to the end: one read, parse and send at a time.
    let mut seen = seen.lock().await;
    let generation = cx.plan.borrow().generation;
    let bytes = match detached_within(deadline, read).await {
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
    use crate::reload::queue::{queue, QueueReceiver, Queued};
    use crate::running::WatchPlan;

    fn context() -> (TriggerContext, QueueReceiver) {
        let (sender, receiver) = queue();
        let plan = WatchPlan {
            generation: 1,
            app_id: String::new(),
            overlay: None,
            overlay_in_force: (None, None),
            refs: Vec::new(),
        };
        let (_, plan) = tokio::sync::watch::channel(Arc::new(plan));
        let cx = TriggerContext {
            queue: sender,
            plan,
            stopped: tokio_util::sync::CancellationToken::new(),
            live: Live::new(),
            secret_poll_interval: Duration::from_secs(60),
            overlay_tried: Arc::default(),
            file_in_force: Arc::new(|_| false),
        };
        (cx, receiver)
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
        changed(&cx, path, &seen, deadline, hung).await;
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
        // The watch is not stuck: the next read, good, is sent.
        let good = || Ok(GOOD.as_bytes().to_vec());
        changed(&cx, path, &seen, deadline, good).await;
        assert!(
            matches!(queued.try_recv(), Ok(Queued::Reload(r)) if r.trigger == Trigger::File),
            "the good write is not sent"
        );
    }
}
