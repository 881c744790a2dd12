//! The configuration's sources as a reload trigger: the JSON file and the
//! folder of Dapr manifests are watched (a manifest added, changed, renamed
//! or removed; rename-writes; ConfigMap `..data` swaps), and every settled
//! change of their content is put together and queued as the new base
//! configuration — the same reload as the file's. An invalid manifest is
//! recorded as rejected and the running generation stays.
//!
//! The two watches share what was seen last, under one lock held across
//! read, parse and send: they cannot queue older content after newer. The
//! first read compares with the configuration the runtime runs, so a
//! change made while the runtime was starting is applied. A read is bounded
//! in time, as the file's is, and while one given up has not returned no
//! other is started (one stuck thread at most for the sources).

use std::sync::Arc;
use std::time::Duration;

use super::config_file::reject_once;
use super::file_seen::{digest, follow_generations, SharedSeen};
use super::TriggerContext;
use crate::config::{ConfigSources, Problems};
use crate::fs_read::{Abandoned, DetachedReader, CONFIG_READ_DEADLINE};
use crate::fs_watch::{FileWatch, OnChange};
use crate::registry::Registry;
use crate::reload::{ReloadRequest, Trigger};

/// Watches every source of `sources`; the watches end at shutdown, or all
/// together when one of them is stopped or dropped.
pub(crate) fn watch_config_sources(
    cx: &TriggerContext,
    sources: ConfigSources,
    registry: Registry,
    resync: Duration,
) -> Vec<FileWatch> {
    let seen = SharedSeen::default();
    let shared = Arc::new((sources.clone(), registry));
    let trigger = cx.clone();
    let last = Arc::clone(&seen);
    // The reads of both watches: one stuck in the kernel at most.
    let reader = Arc::new(DetachedReader::default());
    let on_change: OnChange = Arc::new(move || {
        let cx = trigger.clone();
        let shared = Arc::clone(&shared);
        let seen = Arc::clone(&last);
        let reader = Arc::clone(&reader);
        Box::pin(async move { sources_changed(&cx, shared, &seen, &reader).await })
    });
    let stop = cx.stopped.child_token();
    follow_generations(cx, seen, Arc::clone(&on_change), stop.clone());
    cx.source_reads
        .register(stop.clone(), Arc::clone(&on_change));
    let mut watches = Vec::new();
    if let Some(file) = sources.file {
        watches.push(FileWatch::start(
            file,
            Arc::clone(&on_change),
            Some(resync),
            stop.clone(),
        ));
    }
    if let Some(dir) = sources.resources {
        watches.push(FileWatch::start_folder(dir, on_change, Some(resync), stop));
    }
    watches
}

/// What a read of the sources came to.
enum Read {
    Unchanged,
    InForce(u64),
    Changed(u64, Box<crate::config::Config>),
    Refused(u64, Problems),
    TimedOut(String),
}

async fn sources_changed(
    cx: &TriggerContext,
    shared: Arc<(ConfigSources, Registry)>,
    seen: &SharedSeen,
    reader: &DetachedReader,
) {
    // Held to the end: one read, parse and send at a time.
    let mut seen = seen.lock().await;
    let generation = cx.plan.borrow().generation;
    let done = |hash: u64| seen.is_done(hash, generation);
    let in_force = Arc::clone(&cx.file_in_force);
    let read = {
        let (sources, _) = &*shared;
        let sources = sources.clone();
        reader
            .read_within(CONFIG_READ_DEADLINE, move || sources.read())
            .await
    };
    let read = match read {
        Err(abandoned @ Abandoned::TimedOut(_)) => Ok(Read::TimedOut(format!(
            "reading the configuration sources {abandoned}; given up (the next change or re-read tries again)"
        ))),
        Err(abandoned @ Abandoned::StillReading) => Ok(Read::TimedOut(format!(
            "reading the configuration sources {abandoned} (the next change or re-read tries again)"
        ))),
        Err(Abandoned::Failed(err)) => Err(err),
        Ok(Err(problems)) => {
            let hash = digest(&problems.to_string());
            Ok(if done(hash) {
                Read::Unchanged
            } else {
                Read::Refused(hash, problems)
            })
        }
        Ok(Ok(texts)) => {
            let hash = digest(&texts);
            // Other content sent last may go in force after this
            // content (queued, in flight, retried): this one is sent too.
            let other_sent = seen.other_sent(hash);
            if done(hash) {
                Ok(Read::Unchanged)
            } else {
                tokio::task::spawn_blocking(move || {
                    let (sources, registry) = &*shared;
                    match sources.parse(&texts, registry) {
                        Ok(config) if in_force(&config) && !other_sent => Read::InForce(hash),
                        Ok(config) => Read::Changed(hash, Box::new(config)),
                        Err(problems) => Read::Refused(hash, problems),
                    }
                })
                .await
                .map_err(|e| e.to_string())
            }
        }
    };
    match read {
        Ok(Read::Unchanged) => {}
        Ok(Read::InForce(hash)) => seen.settled(hash),
        Ok(Read::Changed(hash, config)) => {
            seen.sent(hash, generation);
            tracing::info!("Configuration sources changed.");
            cx.request(ReloadRequest::new(*config, Trigger::File));
        }
        Ok(Read::Refused(hash, problems)) => {
            seen.settled(hash);
            cx.reject(Trigger::File, problems.to_string());
        }
        Ok(Read::TimedOut(problem)) => reject_once(cx, &mut seen, generation, problem),
        Err(err) => tracing::warn!(error = %err, "Reading the configuration sources failed."),
    }
}
