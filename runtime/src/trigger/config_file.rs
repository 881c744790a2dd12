//! The configuration file as a reload trigger: every settled change of its
//! content (plain writes, rename-writes, Kubernetes ConfigMap `..data`
//! swaps) is parsed and queued; an invalid or half-written file is recorded
//! as rejected and the next good write applies.
//!
//! The first read (when the watch starts) compares the file with the
//! configuration the runtime runs, not with an earlier read: a write made
//! while the runtime was starting is applied.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::file_seen::{digest, follow_generations, SharedSeen};
use super::TriggerContext;
use crate::config::{folder_of, parse, read_config_bytes};
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
    // Held to the end: one read, parse and send at a time.
    let mut seen = seen.lock().await;
    let generation = cx.plan.borrow().generation;
    let read = {
        let path = path.to_path_buf();
        tokio::task::spawn_blocking(move || read_config_bytes(&path)).await
    };
    let bytes = match read {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(problems)) => {
            // Recorded once per distinct problem, not at every resync.
            let hash = digest(&problems.to_string());
            if !seen.is_done(hash, generation) {
                seen.settled(hash);
                cx.reject(Trigger::File, problems.to_string());
            }
            return;
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
            if (cx.file_in_force)(&config) {
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
