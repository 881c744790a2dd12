//! The configuration file as a reload trigger: every settled change of its
//! content (plain writes, rename-writes, Kubernetes ConfigMap `..data`
//! swaps) is parsed and queued; an invalid or half-written file is recorded
//! as rejected and the next good write applies.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::TriggerContext;
use crate::config::{folder_of, parse, read_config_bytes};
use crate::fs_watch::{FileWatch, OnChange};
use crate::reload::{ReloadRequest, Trigger};

fn digest(bytes: &[u8]) -> u64 {
    let mut hasher = DefaultHasher::new();
    bytes.hash(&mut hasher);
    hasher.finish()
}

/// Watches the configuration file at `path`: when its content changes,
/// the new content is sent as the base configuration (through the reload
/// queue, so bursts coalesce). `resync` re-reads it periodically in case
/// an event is lost. The watch ends at shutdown.
pub(crate) fn watch_config_file(cx: &TriggerContext, path: PathBuf, resync: Duration) -> FileWatch {
    let first = read_config_bytes(&path).ok();
    let last = Arc::new(Mutex::new(first.map(|b| digest(&b))));
    let stop = cx.stopped.child_token();
    let cx = cx.clone();
    let watched = path.clone();
    let on_change: OnChange = Arc::new(move || {
        let cx = cx.clone();
        let path = watched.clone();
        let last = Arc::clone(&last);
        Box::pin(async move { config_file_changed(&cx, &path, &last).await })
    });
    FileWatch::start(path, on_change, Some(resync), stop)
}

async fn config_file_changed(cx: &TriggerContext, path: &Path, last: &Mutex<Option<u64>>) {
    let read = {
        let path = path.to_path_buf();
        tokio::task::spawn_blocking(move || read_config_bytes(&path)).await
    };
    let bytes = match read {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(problems)) => {
            // Recorded once per distinct problem, not at every resync.
            let hash = digest(problems.to_string().as_bytes());
            let mut last = last.lock().unwrap_or_else(|p| p.into_inner());
            if *last != Some(hash) {
                *last = Some(hash);
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
    {
        let mut last = last.lock().unwrap_or_else(|p| p.into_inner());
        if *last == Some(hash) {
            return;
        }
        *last = Some(hash);
    }
    match parse(&bytes) {
        Ok(mut config) => {
            config.base_dir = folder_of(path);
            tracing::info!(path = %path.display(), "Configuration file changed.");
            cx.request(ReloadRequest::new(config, Trigger::File));
        }
        Err(problems) => cx.reject(Trigger::File, problems.to_string()),
    }
}
