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
//! in time per step (a file read, a folder entry looked at: a folder of a
//! thousand manifests on a slow mount is read as long as it moves on, up to
//! a cap), and while one given up has not returned no other is started
//! (one stuck thread at most for the sources).
//!
//! The two watches share the writers of their files too: no read of the
//! sources (an event or periodic re-read of either watch, a new
//! generation, a control-plane change) reads while a file of either is
//! being written (see [`crate::fs_watch`]).

use std::sync::Arc;
use std::time::Duration;

use super::config_file::reject_once;
use super::file_seen::{digest, follow_generations, lock_once_written, written_since, SharedSeen};
use super::TriggerContext;
use crate::config::{ConfigSources, Problems};
use crate::fs_read::{Abandoned, DetachedReader, ProgressDeadlines, CONFIG_SOURCES_READ};
use crate::fs_watch::{FileWatch, OnChange, Writers};
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
    // The files being written, of both watches.
    let writers = Arc::new(Writers::default());
    let being_written = Arc::clone(&writers);
    let on_change: OnChange = Arc::new(move || {
        let cx = trigger.clone();
        let shared = Arc::clone(&shared);
        let seen = Arc::clone(&last);
        let reader = Arc::clone(&reader);
        let writers = Arc::clone(&being_written);
        Box::pin(async move { sources_changed(&cx, shared, &seen, &reader, &writers).await })
    });
    let stop = cx.stopped.child_token();
    follow_generations(cx, seen, Arc::clone(&on_change), stop.clone());
    cx.source_reads
        .register(stop.clone(), Arc::clone(&on_change));
    let mut watches = Vec::new();
    if let Some(file) = sources.file {
        watches.push(FileWatch::start_sharing(
            file,
            Arc::clone(&on_change),
            Some(resync),
            stop.clone(),
            Arc::clone(&writers),
        ));
    }
    if let Some(dir) = sources.resources {
        let watch = FileWatch::start_folder_sharing(dir, on_change, Some(resync), stop, writers);
        watches.push(watch);
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
    writers: &Writers,
) {
    let read = {
        let shared = Arc::clone(&shared);
        move || shared.0.read()
    };
    let parse = move |texts: &_| {
        let (sources, registry) = &*shared;
        sources.parse(texts, registry)
    };
    let sources = Sources {
        seen,
        reader,
        writers,
    };
    read_and_send(cx, sources, CONFIG_SOURCES_READ, read, parse).await;
}

/// What the reads of one set of sources share.
#[derive(Clone, Copy)]
struct Sources<'a> {
    seen: &'a SharedSeen,
    reader: &'a DetachedReader,
    writers: &'a Writers,
}

/// Reads the sources with `read` through `reader` (given up when it stops
/// moving on, see [`ProgressDeadlines`]; not started while an earlier read
/// is stuck; not before no file of theirs is being written, and discarded
/// if one was written meanwhile), parses what changed with `parse` and
/// sends it.
async fn read_and_send<T, R, P>(
    cx: &TriggerContext,
    sources: Sources<'_>,
    deadlines: ProgressDeadlines,
    read: R,
    parse: P,
) where
    T: std::hash::Hash + Send + 'static,
    R: FnOnce() -> Result<T, Problems> + Send + 'static,
    P: FnOnce(&T) -> Result<crate::config::Config, Problems> + Send + 'static,
{
    let Sources {
        seen,
        reader,
        writers,
    } = sources;
    // Held to the end: one read, parse and send at a time.
    let Some((mut seen, count)) = lock_once_written(seen, writers).await else {
        return;
    };
    let generation = cx.plan.borrow().generation;
    let done = |hash: u64| seen.is_done(hash, generation);
    let in_force = Arc::clone(&cx.file_in_force);
    let read = match reader.read_with_progress(deadlines, read).await {
        Err(Abandoned::TimedOut(waited)) if waited == deadlines.in_all => Ok(Read::TimedOut(format!(
            "reading the configuration sources did not finish within {}; given up (the next change or re-read tries again)",
            shown(waited)
        ))),
        Err(Abandoned::TimedOut(waited)) => Ok(Read::TimedOut(format!(
            "reading the configuration sources read no file for {}; given up (the next change or re-read tries again)",
            shown(waited)
        ))),
        Err(abandoned @ Abandoned::StillReading) => Ok(Read::TimedOut(format!(
            "reading the configuration sources {abandoned} (the next change or re-read tries again)"
        ))),
        Err(Abandoned::Failed(err)) => Err(err),
        // Maybe half-written: read again once its writer closes it.
        Ok(_) if written_since(writers, count) => Ok(Read::Unchanged),
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
                tokio::task::spawn_blocking(move || match parse(&texts) {
                    Ok(config) if in_force(&config) && !other_sent => Read::InForce(hash),
                    Ok(config) => Read::Changed(hash, Box::new(config)),
                    Err(problems) => Read::Refused(hash, problems),
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

/// `d` as people write it: `5 s`, `250 ms`.
fn shown(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("{} s", d.as_secs())
    } else {
        format!("{} ms", d.as_millis())
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::path::PathBuf;

    use super::*;
    use crate::component::{ComponentKey, Kind};
    use crate::config::LayerChange;
    use crate::fs_read::note_progress;
    use crate::fs_watch::MIN_RESYNC;
    use crate::handle::Live;
    use crate::metadata::{decode_for_validation, MetadataError, NoMetadata};
    use crate::registry::ComponentDescriptor;
    use crate::reload::queue::{QueueReceiver, Queued};

    fn unbuildable(_: &crate::Metadata) -> Result<Box<dyn crate::Buildable>, MetadataError> {
        Err(MetadataError::Invalid {
            field: ".".into(),
            message: "test registry cannot build".into(),
        })
    }

    /// A registry knowing `state.in-memory` (rewire's `memory`).
    fn registry() -> Registry {
        let mut registry = Registry::default();
        registry.register(ComponentDescriptor {
            kind: "state",
            type_name: "memory",
            description: "",
            example_metadata: "{}",
            validate: |m, i| decode_for_validation::<NoMetadata>(m, i),
            build: unbuildable,
            check_refs: None,
            in_place: None,
        });
        registry
    }

    /// A Dapr manifest of the in-memory state store `name`.
    fn manifest(name: &str) -> String {
        format!(
            "apiVersion: dapr.io/v1alpha1\nkind: Component\nmetadata:\n  name: {name}\n\
             spec:\n  type: state.in-memory\n  version: v1\n"
        )
    }

    /// A new empty folder for the test `name`.
    fn folder(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("rewire-sources-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
        dir
    }

    fn resources(dir: &std::path::Path) -> ConfigSources {
        ConfigSources {
            file: None,
            resources: Some(dir.to_path_buf()),
            app_id: None,
        }
    }

    /// Whether `request` sends a base configuration declaring `state/second`.
    fn declares_second(request: &ReloadRequest) -> bool {
        let second = ComponentKey::new(Kind::State, "second");
        request.changes.iter().any(|change| {
            matches!(change, LayerChange::File(config) if config.components.contains_key(&second))
        })
    }

    /// Starts watching `sources` (`all.yaml` of `dir` holding `first` and
    /// `second`), and waits for the first read, which sends the whole file
    /// (nothing is in force here).
    async fn watching(
        dir: &std::path::Path,
        sources: ConfigSources,
        resync: Duration,
    ) -> (TriggerContext, QueueReceiver, Vec<FileWatch>) {
        let whole = format!("{}---\n{}", manifest("first"), manifest("second"));
        std::fs::write(dir.join("all.yaml"), whole).unwrap_or_else(|e| panic!("{e}"));
        let (cx, mut queued) = TriggerContext::for_tests(Live::new(), "");
        let watches = watch_config_sources(&cx, sources, registry(), resync);
        let sent = tokio::time::timeout(Duration::from_secs(10), queued.recv()).await;
        match sent {
            Ok(Some(Queued::Reload(request))) => assert!(declares_second(&request)),
            other => panic!("the first read is not sent: {other:?}"),
        }
        (cx, queued, watches)
    }

    /// Rewrites `all.yaml` of `dir` in place on a thread: truncated, then
    /// after `pause` document 1, and 500 ms later `---` and document 2.
    fn rewrite_in_two_writes(
        dir: &std::path::Path,
        pause: Duration,
    ) -> std::thread::JoinHandle<std::io::Result<()>> {
        let path = dir.join("all.yaml");
        let (first, second) = (manifest("first"), manifest("second"));
        std::thread::spawn(move || -> std::io::Result<()> {
            let mut file = std::fs::File::create(&path)?;
            std::thread::sleep(pause);
            file.write_all(first.as_bytes())?;
            std::thread::sleep(Duration::from_millis(500));
            file.write_all(format!("---\n{second}").as_bytes())
        })
    }

    /// Checks that no reload queued within `period` lacks `second`: a
    /// half-written manifest would remove it and lose its data.
    async fn none_half_written(queued: &mut QueueReceiver, period: Duration) {
        collect_reloads(queued, period, |request| {
            assert!(
                declares_second(request),
                "a half-written manifest was sent: state/second removed"
            );
        })
        .await;
    }

    /// Waits for the writer, stops the watches and removes `dirs`.
    async fn finish(
        writer: std::thread::JoinHandle<std::io::Result<()>>,
        watches: Vec<FileWatch>,
        dirs: &[&std::path::Path],
    ) {
        writer
            .join()
            .unwrap_or_else(|_| panic!("the writer panicked"))
            .unwrap_or_else(|e| panic!("{e}"));
        for watch in watches {
            watch.stop().await;
        }
        for dir in dirs {
            std::fs::remove_dir_all(dir).unwrap_or_else(|e| panic!("{e}"));
        }
    }

    /// Rewrites `all.yaml` of `dir` in place in two writes 500 ms apart
    /// (document 1, then `---` and document 2) and checks that no reload
    /// queued meanwhile or in the 3 s after lacks `second`.
    async fn written_in_two_steps_is_never_sent_half_written(name: &str, resync: Duration) {
        let dir = folder(name);
        let (_cx, mut queued, watches) = watching(&dir, resources(&dir), resync).await;
        // The truncation is seen before the first document lands.
        let writer = rewrite_in_two_writes(&dir, Duration::from_millis(100));
        none_half_written(&mut queued, Duration::from_secs(3)).await;
        finish(writer, watches, &[&dir]).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_manifest_whose_writer_stays_open_past_5_s_is_read_once_it_is_closed() {
        let dir = folder("slow-writer");
        let (_cx, mut queued, watches) =
            watching(&dir, resources(&dir), Duration::from_secs(3600)).await;
        // `kustomize build > all.yaml` fetching its bases for 6 s: truncated,
        // then nothing until its output.
        let writer = rewrite_in_two_writes(&dir, Duration::from_secs(6));
        none_half_written(&mut queued, Duration::from_secs(9)).await;
        finish(writer, watches, &[&dir]).await;
    }

    /// The configuration's sources: a valid JSON file in a folder of its
    /// own (`file_dir`) and the manifests of `dir`.
    fn file_and_resources(file_dir: &std::path::Path, dir: &std::path::Path) -> ConfigSources {
        let file = file_dir.join("rewire.json");
        std::fs::write(&file, "{}").unwrap_or_else(|e| panic!("{e}"));
        ConfigSources {
            file: Some(file),
            ..resources(dir)
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_config_file_watchs_re_reads_wait_for_a_manifest_being_written() {
        let (dir, file_dir) = (folder("shared-writers"), folder("shared-writers-file"));
        let sources = file_and_resources(&file_dir, &dir);
        let (_cx, mut queued, watches) = watching(&dir, sources, MIN_RESYNC).await;
        let writer = rewrite_in_two_writes(&dir, Duration::from_millis(100));
        none_half_written(&mut queued, Duration::from_secs(3)).await;
        finish(writer, watches, &[&dir, &file_dir]).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_control_plane_read_waits_for_a_manifest_being_written() {
        let (dir, file_dir) = (folder("control-read"), folder("control-read-file"));
        let sources = file_and_resources(&file_dir, &dir);
        let (cx, mut queued, watches) = watching(&dir, sources, Duration::from_secs(3600)).await;
        let writer = rewrite_in_two_writes(&dir, Duration::from_millis(100));
        tokio::time::sleep(Duration::from_millis(300)).await;
        let read = cx.source_reads.read_now().await;
        assert!(read.is_ok(), "{read:?}");
        none_half_written(&mut queued, Duration::from_secs(3)).await;
        finish(writer, watches, &[&dir, &file_dir]).await;
    }

    /// Calls `check` on every reload queued within `period`.
    async fn collect_reloads(
        queued: &mut QueueReceiver,
        period: Duration,
        check: impl Fn(&ReloadRequest),
    ) {
        let until = tokio::time::Instant::now() + period;
        while let Ok(Some(message)) = tokio::time::timeout_at(until, queued.recv()).await {
            if let Queued::Reload(request) = message {
                check(&request);
            }
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_manifest_written_in_place_in_two_writes_is_read_once_its_writer_closed_it() {
        written_in_two_steps_is_never_sent_half_written("two-writes", Duration::from_secs(3600))
            .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn with_periodic_re_reads_a_manifest_written_in_two_writes_is_read_once_closed() {
        written_in_two_steps_is_never_sent_half_written("two-writes-polled", Duration::ZERO).await;
    }

    #[tokio::test]
    async fn a_folder_read_slower_than_one_step_may_take_is_sent_while_it_moves_on() {
        let dir = folder("slow");
        std::fs::write(dir.join("first.yaml"), manifest("first")).unwrap_or_else(|e| panic!("{e}"));
        let (cx, mut queued) = TriggerContext::for_tests(Live::new(), "");
        let sources = resources(&dir);
        let deadlines = ProgressDeadlines {
            without_progress: Duration::from_millis(200),
            in_all: Duration::from_secs(30),
        };
        // 20 files of 40 ms each (a slow mount): 800 ms in all, four times
        // what one step may take.
        let read = {
            let sources = sources.clone();
            move || {
                for _ in 0..20 {
                    std::thread::sleep(Duration::from_millis(40));
                    note_progress();
                }
                sources.read()
            }
        };
        let registry = registry();
        let parse = move |texts: &_| sources.parse(texts, &registry);
        let (seen, reader) = (SharedSeen::default(), DetachedReader::default());
        let writers = Writers::default();
        let sources = Sources {
            seen: &seen,
            reader: &reader,
            writers: &writers,
        };
        read_and_send(&cx, sources, deadlines, read, parse).await;
        let sent = queued.try_recv();
        assert!(
            matches!(sent, Ok(Queued::Reload(_))),
            "the slow read is not sent: {sent:?}"
        );
        std::fs::remove_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
    }
}
