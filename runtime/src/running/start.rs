//! Start-up: assemble level after level, each level concurrently; on a
//! failure or a cancellation, close what started in reverse order.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::close::close_in_reverse;
use super::{staged_sharing, Components, Running};
use crate::assemble::{
    assemble, Assembled, AssemblyContext, ComponentFailure, FailedStep, StartTimeouts,
};
use crate::assembly_tasks::ComponentTasks;
use crate::closing::CLOSE_TIMEOUT;
use crate::component::Handover;
use crate::config::{ComponentSpec, ValidConfig};
use crate::guarded::panic_message;
use crate::handle::LiveGeneration;
use crate::redact::Redactor;
use crate::registry::Registry;

/// Why a start-up did not finish; everything it started was closed.
#[derive(Debug)]
pub(crate) enum NotStarted {
    /// Components failed to start.
    Failed(Vec<ComponentFailure>),
    /// The start-up was cancelled; `abandoned` closes timed out or
    /// panicked (of finished levels' components, and of those the
    /// cancellation cut short or whose `init` failed).
    Cancelled { abandoned: usize },
}

/// How long a cancelled start-up takes at most, from its cancellation to
/// every component it started closed: the level in progress is cut short
/// (each of its components' `close` bounded by `CLOSE_TIMEOUT`), and the
/// finished levels share what is left (see `close_in_reverse`). Not
/// counted: an `init` or `close` that blocks its thread.
pub(crate) const CANCELLED_START_UNWIND: Duration = Duration::from_secs(8);

// The level cut short takes up to `CLOSE_TIMEOUT`: it must fit, and leave
// time for the finished levels.
const _: () = assert!(CANCELLED_START_UNWIND.as_millis() > CLOSE_TIMEOUT.as_millis());

/// Starts every component of `config`; on a failure, or once `stop` is
/// cancelled, closes what started. A cancellation cuts the level in
/// progress short (each of its assemblies closes what it built, bounded
/// by `CLOSE_TIMEOUT`) and waits for it, then closes every level started
/// so far, last first, each level's components at once, all by
/// [`CANCELLED_START_UNWIND`] after the cancellation.
pub(super) async fn start_all(
    config: &ValidConfig,
    registry: &Registry,
    timeouts: StartTimeouts,
    live: &LiveGeneration,
    redactor: &Redactor,
    handover: &Handover,
    stop: &CancellationToken,
) -> Result<Components, NotStarted> {
    let mut components = Components::new();
    let levels = config.graph.level_nodes();
    let declared = Declared::of(config);
    let mut cancelled_at = None;
    let abandoned_unstarted = Arc::new(AtomicUsize::new(0));
    let unstarted = || abandoned_unstarted.load(Ordering::Relaxed);
    for (number, level) in levels.iter().enumerate() {
        if stop.is_cancelled() {
            let by = Instant::now() + CANCELLED_START_UNWIND;
            let abandoned =
                close_levels(config, &levels[..number], &mut components, Some(by)).await;
            return Err(NotStarted::Cancelled {
                abandoned: abandoned + unstarted(),
            });
        }
        let cx = Arc::new(AssemblyContext {
            app_id: config.config.app_id.clone(),
            live: live.clone(),
            staged: Arc::new(staged_sharing(&components)),
            timeouts,
            redactor: redactor.clone(),
            config_dir: config.config.base_dir.clone(),
            handover: handover.clone(),
            stop: stop.clone(),
            abandoned_closes: Arc::clone(&abandoned_unstarted),
        });
        let specs: Vec<Arc<ComponentSpec>> =
            level.iter().filter_map(|&node| declared.at(node)).collect();
        let assembling = assemble_all(specs, registry, Arc::clone(&cx));
        let (started, failures) = noting_cancel(assembling, stop, &mut cancelled_at).await;
        // The staged generation shares `components`: gone, the inserts
        // below change the map in place instead of copying its nodes.
        drop(cx);
        for (spec, assembled) in started {
            tracing::info!(component = %spec.key, "Component started.");
            components.insert(spec.key.clone(), Arc::new(Running { spec, assembled }));
        }
        for failure in failures.iter().filter(|f| f.step != FailedStep::Cancelled) {
            tracing::error!(component = ?failure.component, step = %failure.step, error = %failure.message, "Component failed to start.");
        }
        if stop.is_cancelled() {
            tracing::warn!(
                level = number,
                "Start-up cancelled: closing the components started."
            );
            let by = cancelled_at.unwrap_or_else(Instant::now) + CANCELLED_START_UNWIND;
            let abandoned =
                close_levels(config, &levels[..=number], &mut components, Some(by)).await;
            return Err(NotStarted::Cancelled {
                abandoned: abandoned + unstarted(),
            });
        }
        if !failures.is_empty() {
            close_levels(config, &levels[..=number], &mut components, None).await;
            return Err(NotStarted::Failed(failures));
        }
    }
    Ok(components)
}

/// Runs `level` to its end, noting in `cancelled_at` when `stop` is
/// cancelled meanwhile (the unwinding's deadline counts from then).
async fn noting_cancel<T>(
    level: impl Future<Output = T>,
    stop: &CancellationToken,
    cancelled_at: &mut Option<Instant>,
) -> T {
    let mut level = std::pin::pin!(level);
    loop {
        tokio::select! {
            biased;
            done = &mut level => return done,
            () = stop.cancelled(), if cancelled_at.is_none() => {
                *cancelled_at = Some(Instant::now());
            }
        }
    }
}

/// Closes the components of `levels` (graph nodes) found in `components`,
/// last level first, all by `by` if given. Only what started is in
/// `components`: closing the levels so far closes exactly that. Returns
/// how many closes were abandoned.
async fn close_levels(
    config: &ValidConfig,
    levels: &[Vec<usize>],
    components: &mut Components,
    by: Option<Instant>,
) -> usize {
    let started: Vec<Vec<_>> = levels
        .iter()
        .map(|level| {
            level
                .iter()
                .map(|&node| config.graph.key_at(node))
                .collect()
        })
        .collect();
    close_in_reverse(&started, components, by).await
}

/// The declarations of a validated configuration by graph node: node `i`
/// is the `i`-th key, so a level's declarations are found without a
/// search (a graph that does not match its configuration, which only a
/// hand-made [`ValidConfig`] can have, is searched by key instead).
struct Declared<'c> {
    config: &'c ValidConfig,
    in_key_order: Vec<&'c Arc<ComponentSpec>>,
}

impl<'c> Declared<'c> {
    fn of(config: &'c ValidConfig) -> Self {
        let components = &config.config.components;
        let in_key_order = match components.in_key_order_if_made() {
            Some(table) => table.iter().collect(),
            None => components.values().collect(),
        };
        Self {
            config,
            in_key_order,
        }
    }

    /// The declaration of node `node`.
    fn at(&self, node: usize) -> Option<Arc<ComponentSpec>> {
        let graph = &self.config.graph;
        match self.in_key_order.get(node) {
            Some(spec) if graph.is_node_of(node, &spec.key) => Some(Arc::clone(spec)),
            _ => self
                .config
                .config
                .components
                .get(&graph.key_at(node))
                .cloned(),
        }
    }
}

/// What [`assemble_all`] started, in key order.
type Started = Vec<(Arc<ComponentSpec>, Assembled)>;

/// Assembles `specs` concurrently; returns what started and what failed.
/// The assemblies share `cx` (one reference count each, not a copy of
/// every field).
///
/// Each assembly is first polled here, in the calling task: one that
/// finishes without waiting (most do: decode, inject and an `init` with
/// nothing to wait for) costs no task, no wake-up of another worker and no
/// join. One that waits is spawned and goes on concurrently with the rest,
/// so inits that wait (for a connection, or for each other) still overlap.
/// A panic fails the component it happened in.
pub(crate) async fn assemble_all(
    specs: Vec<Arc<ComponentSpec>>,
    registry: &Registry,
    cx: Arc<AssemblyContext>,
) -> (Started, Vec<ComponentFailure>) {
    let mut waiting = ComponentTasks::new();
    let mut started = Started::new();
    let mut failures = Vec::new();
    for spec in specs {
        let Some(descriptor) = registry
            .get(spec.key.kind.as_str(), &spec.type_name)
            .copied()
        else {
            failures.push(cx.fail(
                &spec.key,
                FailedStep::Metadata,
                format!("unknown type `{}`", spec.type_name),
            ));
            continue;
        };
        let declared = Arc::clone(&spec);
        let task_cx = Arc::clone(&cx);
        let mut assembly = Box::pin(async move {
            let result = assemble(&spec, &descriptor, &task_cx).await;
            (spec, result)
        });
        match poll_once(assembly.as_mut()).await {
            Ok(Poll::Ready((spec, result))) => settle(spec, result, &mut started, &mut failures),
            Ok(Poll::Pending) => waiting.spawn(declared.key.clone(), assembly),
            Err(panic) => {
                failures.push(cx.fail(&declared.key, FailedStep::Panicked, panic_message(&*panic)))
            }
        }
    }
    while let Some(joined) = waiting.join_next(&cx).await {
        match joined {
            Ok((spec, result)) => settle(spec, result, &mut started, &mut failures),
            Err(panicked) => failures.push(panicked),
        }
    }
    // Inits that waited finish in any order: log and file them in key order.
    started.sort_by(|a, b| a.0.key.cmp(&b.0.key));
    failures.sort_by(|a, b| a.component.cmp(&b.component));
    (started, failures)
}

/// Polls `assembly` once in the calling task, catching a panic.
async fn poll_once<F: Future + ?Sized>(
    mut assembly: Pin<&mut F>,
) -> std::thread::Result<Poll<F::Output>> {
    std::future::poll_fn(|task| {
        Poll::Ready(std::panic::catch_unwind(AssertUnwindSafe(|| {
            assembly.as_mut().poll(task)
        })))
    })
    .await
}

/// Files one finished assembly as started or failed.
fn settle(
    spec: Arc<ComponentSpec>,
    result: Result<Assembled, ComponentFailure>,
    started: &mut Started,
    failures: &mut Vec<ComponentFailure>,
) {
    match result {
        Ok(assembled) => started.push((spec, assembled)),
        Err(failure) => failures.push(failure),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::component::ComponentKey;
    use crate::config::{parse, DependencyGraph};

    fn declared(names: &[&str]) -> crate::config::Config {
        let components: Vec<String> = names
            .iter()
            .map(|name| format!(r#""{name}": {{"type": "memory"}}"#))
            .collect();
        let text = format!(
            r#"{{"components": {{"state": {{{}}}}}}}"#,
            components.join(",")
        );
        parse(text.as_bytes()).unwrap_or_else(|p| panic!("{p}"))
    }

    fn names(specs: impl Iterator<Item = Option<Arc<ComponentSpec>>>) -> Vec<Option<String>> {
        specs.map(|spec| spec.map(|s| s.key.to_string())).collect()
    }

    #[test]
    fn declarations_are_found_by_node_and_by_key_when_the_graph_is_another_configurations() {
        let config = declared(&["a", "c"]);
        let own = ValidConfig {
            graph: DependencyGraph::build(&config),
            config: config.clone(),
        };
        let by_node = Declared::of(&own);
        assert_eq!(
            names((0..2).map(|node| by_node.at(node))),
            [Some("state/a".to_string()), Some("state/c".to_string())]
        );

        // A hand-made pair: the graph numbers `b` where the configuration
        // has `c`, and `c` past its end.
        let mismatched = ValidConfig {
            graph: DependencyGraph::build(&declared(&["a", "b", "c"])),
            config,
        };
        let by_key = Declared::of(&mismatched);
        assert_eq!(
            names((0..3).map(|node| by_key.at(node))),
            [
                Some("state/a".to_string()),
                None,
                Some("state/c".to_string())
            ]
        );
        assert!(mismatched
            .graph
            .is_node_of(1, &ComponentKey::new("state", "b")));
        assert!(!mismatched
            .graph
            .is_node_of(3, &ComponentKey::new("state", "c")));
    }
}
