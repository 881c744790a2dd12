//! The configuration's sources as a reload trigger: the JSON file and the
//! folder of Dapr manifests are watched (a manifest added, changed, renamed
//! or removed; rename-writes; ConfigMap `..data` swaps), and every settled
//! change of their content is put together and queued as the new base
//! configuration — the same reload as the file's. An invalid manifest is
//! recorded as rejected and the running generation stays.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::TriggerContext;
use crate::config::{ConfigSources, Problems};
use crate::fs_watch::{FileWatch, OnChange};
use crate::registry::Registry;
use crate::reload::{ReloadRequest, Trigger};

fn digest(value: &impl Hash) -> u64 {
    let mut hasher = DefaultHasher::new();
    value.hash(&mut hasher);
    hasher.finish()
}

/// Watches every source of `sources`; each watch ends at shutdown.
pub(crate) fn watch_config_sources(
    cx: &TriggerContext,
    sources: ConfigSources,
    registry: Registry,
    resync: Duration,
) -> Vec<FileWatch> {
    let first = sources.read().ok().map(|texts| digest(&texts));
    let last = Arc::new(Mutex::new(first));
    let shared = Arc::new((sources.clone(), registry));
    let trigger = cx.clone();
    let on_change: OnChange = Arc::new(move || {
        let cx = trigger.clone();
        let shared = Arc::clone(&shared);
        let last = Arc::clone(&last);
        Box::pin(async move { sources_changed(&cx, shared, &last).await })
    });
    let mut watches = Vec::new();
    if let Some(file) = sources.file {
        let stop = cx.stopped.child_token();
        watches.push(FileWatch::start(
            file,
            Arc::clone(&on_change),
            Some(resync),
            stop,
        ));
    }
    if let Some(dir) = sources.resources {
        let stop = cx.stopped.child_token();
        watches.push(FileWatch::start_folder(dir, on_change, Some(resync), stop));
    }
    watches
}

/// What a read of the sources came to.
enum Read {
    Unchanged,
    Changed(Box<crate::config::Config>),
    Refused(Problems),
}

async fn sources_changed(
    cx: &TriggerContext,
    shared: Arc<(ConfigSources, Registry)>,
    last: &Arc<Mutex<Option<u64>>>,
) {
    let last_seen = Arc::clone(last);
    let read = tokio::task::spawn_blocking(move || {
        let (sources, registry) = &*shared;
        let texts = match sources.read() {
            Ok(texts) => texts,
            Err(problems) if is_new(&last_seen, digest(&problems.to_string())) => {
                return Read::Refused(problems)
            }
            Err(_) => return Read::Unchanged,
        };
        if !is_new(&last_seen, digest(&texts)) {
            return Read::Unchanged;
        }
        match sources.parse(&texts, registry) {
            Ok(config) => Read::Changed(Box::new(config)),
            Err(problems) => Read::Refused(problems),
        }
    })
    .await;
    match read {
        Ok(Read::Unchanged) => {}
        Ok(Read::Changed(config)) => {
            tracing::info!("Configuration sources changed.");
            cx.request(ReloadRequest::new(*config, Trigger::File));
        }
        Ok(Read::Refused(problems)) => cx.reject(Trigger::File, problems.to_string()),
        Err(err) => tracing::warn!(error = %err, "Reading the configuration sources failed."),
    }
}

/// Whether `hash` differs from the last one seen (remembering it), so a
/// change is sent and a problem recorded once, not at every resync.
fn is_new(last: &Mutex<Option<u64>>, hash: u64) -> bool {
    let mut last = last.lock().unwrap_or_else(|p| p.into_inner());
    if *last == Some(hash) {
        return false;
    }
    *last = Some(hash);
    true
}
