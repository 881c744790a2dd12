//! The running set — the one owner of what is running: which instance
//! serves each component, the configuration and layers it was built from,
//! and the generation published to handles. They change together, in one
//! place: [`RunningSet::commit`].

mod close;
mod components;
mod layers;
mod marks;
mod restore;
mod start;
mod status;
mod watch_plan;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::assemble::{Assembled, StartTimeouts};
use crate::component::{ComponentKey, Handover, KeyParts};
use crate::config::{ComponentSpec, Config, Layers, Sections, ValidConfig};
use crate::handle::{Generation, Instance, Live, LiveGeneration, Members};
use crate::redact::Redactor;
use crate::registry::Registry;

pub(crate) use components::Components;
pub(crate) use layers::RunningLayers;
#[cfg(test)]
pub(crate) use marks::FORCED_RETRIES;
pub(crate) use marks::{Mark, Marks, MarksLeft};
pub(crate) use restore::HeldToo;
pub(crate) use start::{NotStarted, CANCELLED_START_UNWIND};
pub use status::ComponentStatus;
pub(crate) use watch_plan::{WatchPlan, WatchedRef};

/// A running component: how it was declared (shared with the
/// configuration that declared it) and what was started.
#[derive(Debug, Clone)]
pub(crate) struct Running {
    pub(crate) spec: Arc<ComponentSpec>,
    pub(crate) assembled: Assembled,
}

/// A consistent view of the running set, for a reload to build on
/// (shared, not copied).
pub(crate) struct Snapshot {
    /// The generation serving.
    pub(crate) generation: u64,
    /// The effective configuration.
    pub(crate) config: Arc<ValidConfig>,
    /// The layers it was merged from.
    pub(crate) layers: RunningLayers,
    /// What runs.
    pub(crate) components: Arc<Components>,
    /// The components whose running entry is not what their declaration
    /// says (see [`RunningSet::restore`]): a reload re-resolves them and
    /// applies their update again, as if forced, although the
    /// declaration did not change (best effort, and only until their
    /// retries failed [`marks::FORCED_RETRIES`] times in a row).
    pub(crate) not_as_declared: Marks,
}

/// What a reload hands over to become the running set.
pub(crate) struct Commit {
    /// The new effective configuration.
    pub(crate) config: ValidConfig,
    /// The layers it was merged from.
    pub(crate) layers: RunningLayers,
    /// What runs from now on.
    pub(crate) components: Arc<Components>,
    /// The components whose instance may differ from the running set's
    /// (what the reload acted on): only their handles are republished.
    pub(crate) acted_on: BTreeSet<ComponentKey>,
    /// Whether any instance or section changed: only then is a new
    /// generation published.
    pub(crate) publish: bool,
    /// The marked components the reload left as they ran, although it
    /// acted on them: their marks stay.
    pub(crate) marks_left: MarksLeft,
}

struct State {
    config: Arc<ValidConfig>,
    layers: RunningLayers,
    components: Arc<Components>,
    /// The one record of which running entries are not what their
    /// declaration says: a put-back that kept the new references with the
    /// previous values marks its component; a commit that acts on it (its
    /// update, a rebuild, its removal) clears the mark, unless the reload
    /// left it as it ran (see [`MarksLeft`]).
    not_as_declared: Marks,
    /// Set by [`RunningSet::close_all`]: no commit after it (a reload a
    /// shutdown left behind would publish instances nobody closes).
    closed: bool,
}

/// The owner of the running set.
pub(crate) struct RunningSet {
    live: LiveGeneration,
    /// The runtime's handover area: made at start, kept across reloads,
    /// given to every component this set assembles.
    handover: Handover,
    state: Mutex<State>,
    plan: watch::Sender<Arc<WatchPlan>>,
}

impl RunningSet {
    /// Starts every component of `config` level by level (see
    /// [`start::start_all`]) and publishes generation 1.
    #[cfg(test)]
    pub(crate) async fn start(
        config: ValidConfig,
        registry: &Registry,
        timeouts: StartTimeouts,
        redactor: &Redactor,
    ) -> Result<Self, NotStarted> {
        let never = CancellationToken::new();
        Self::start_until(config, registry, timeouts, redactor, &never).await
    }

    /// As [`start`](Self::start), cut short (everything started closed)
    /// once `stop` is cancelled.
    pub(crate) async fn start_until(
        config: ValidConfig,
        registry: &Registry,
        timeouts: StartTimeouts,
        redactor: &Redactor,
        stop: &CancellationToken,
    ) -> Result<Self, NotStarted> {
        let live = Live::for_components(config.config.components.len());
        let handover = Handover::new();
        let components = start::start_all(
            &config, registry, timeouts, &live, redactor, &handover, stop,
        )
        .await?;
        let components = Arc::new(components);
        live.publish(described(1, &config, &components));
        let state = State {
            layers: RunningLayers::started(),
            config: Arc::new(config),
            components,
            not_as_declared: Marks::default(),
            closed: false,
        };
        let plan = watch::channel(Arc::new(WatchPlan::of(
            1,
            &state.config,
            &state.layers,
            &state.components,
        )))
        .0;
        Ok(Self {
            live,
            handover,
            state: Mutex::new(state),
            plan,
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Marks the running `key` not as declared (as a put-back that kept
    /// the new refs with the previous values does), for tests of what a
    /// reload does with a marked component of any kind.
    #[cfg(test)]
    pub(crate) fn mark_not_as_declared(&self, key: &ComponentKey) {
        self.state()
            .not_as_declared
            .insert(key.clone(), Mark::default());
    }

    /// Where generations are published.
    pub(crate) fn live(&self) -> &LiveGeneration {
        &self.live
    }

    /// The runtime's handover area.
    pub(crate) fn handover(&self) -> &Handover {
        &self.handover
    }

    /// The number of the generation serving.
    pub(crate) fn generation_number(&self) -> u64 {
        self.live.current().number
    }

    /// A consistent view of the running set.
    pub(crate) fn snapshot(&self) -> Snapshot {
        let state = self.state();
        Snapshot {
            generation: self.generation_number(),
            config: state.config.clone(),
            layers: state.layers.clone(),
            components: state.components.clone(),
            not_as_declared: state.not_as_declared.clone(),
        }
    }

    /// The layers of the running configuration.
    pub(crate) fn layers(&self) -> Layers {
        let state = self.state();
        state.layers.whole(&state.config.config)
    }

    /// Whether `file` is the base (file) layer of the running
    /// configuration.
    pub(crate) fn file_is(&self, file: &Config) -> bool {
        let state = self.state();
        match &state.layers {
            RunningLayers::FileOnly(_) => state.config.config == *file,
            RunningLayers::Laid(layers) => layers.file == *file,
        }
    }

    /// Whether `sections` differ from the running configuration's.
    pub(crate) fn sections_differ(&self, sections: &Sections) -> bool {
        self.state().config.config.sections != *sections
    }

    /// The running configuration.
    pub(crate) fn config(&self) -> ValidConfig {
        ValidConfig::clone(&self.state().config)
    }

    /// Makes `commit` the running set: publishes its generation (when an
    /// instance changed) together with its configuration and layers, then
    /// tells the triggers what to watch. A component it acted on, or no
    /// longer runs, is as declared from then on (its mark, if any, is
    /// cleared: see [`Self::restore`]), unless the reload left it as it
    /// ran ([`Commit::marks_left`]: its mark stays, a failed retry
    /// counted). Returns the generation serving; gives `commit` back, not
    /// made, once [`close_all`](Self::close_all) has run.
    pub(crate) fn commit(&self, commit: Commit) -> Result<u64, Box<Commit>> {
        let mut state = self.state();
        if state.closed {
            return Err(Box::new(commit));
        }
        let mut number = self.generation_number();
        // A new app id alone (no component running) changes no instance,
        // but the generation's description: republished under its number.
        let app_id_changed = state.config.config.app_id != commit.config.config.app_id;
        if commit.publish {
            number += 1;
        }
        let components = commit.components;
        let not_as_declared = std::mem::take(&mut state.not_as_declared).after_commit(
            &commit.acted_on,
            &commit.marks_left,
            &components,
        );
        if commit.publish || app_id_changed {
            self.live.publish_changed(
                described(number, &commit.config, &components),
                Some(&commit.acted_on),
            );
        }
        let replaced = std::mem::replace(
            &mut *state,
            State {
                config: Arc::new(commit.config),
                layers: commit.layers,
                components,
                not_as_declared,
                closed: false,
            },
        );
        let plan = WatchPlan::of(number, &state.config, &state.layers, &state.components);
        self.plan.send_replace(Arc::new(plan));
        drop(state);
        drop_aside((replaced.config, replaced.layers, replaced.components));
        Ok(number)
    }

    /// What the triggers should watch, republished after every commit.
    pub(crate) fn watch_plan(&self) -> watch::Receiver<Arc<WatchPlan>> {
        self.plan.subscribe()
    }

    /// Publishes an empty generation and closes every component, users
    /// before the stores they use; returns how many closes were abandoned.
    /// With a deadline `by`, every level closes within its share of it, so
    /// the stores are closed too however many levels hang.
    pub(crate) async fn close_all(&self, by: Option<tokio::time::Instant>) -> usize {
        let (levels, components) = {
            let mut state = self.state();
            state.closed = true;
            let levels = state.config.graph.levels();
            let number = self.generation_number() + 1;
            let app_id = state.config.config.app_id.clone();
            let empty = Generation::new(number, BTreeMap::new()).serving(app_id);
            self.live.publish(empty);
            (levels, std::mem::take(&mut state.components))
        };
        let mut components = Arc::unwrap_or_clone(components);
        close::close_in_reverse(&levels, &mut components, by).await
    }
}

/// From this many components on, a replaced running set is freed on a
/// blocking thread; a smaller one is freed in place, which costs less than
/// waking that thread.
const FREED_ASIDE_FROM: usize = 1_000;

/// Lets go of a replaced configuration, its layers and its map of
/// components; a large one on a blocking thread, since freeing it takes
/// milliseconds the reload need not wait for. (Only the map: what it
/// retired is drained and closed on its own schedule.)
fn drop_aside(replaced: (Arc<ValidConfig>, RunningLayers, Arc<Components>)) {
    if replaced.2.len() < FREED_ASIDE_FROM {
        drop(replaced);
        return;
    }
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => drop(runtime.spawn_blocking(move || drop(replaced))),
        Err(_) => drop(replaced),
    }
}

/// What the next level of a start-up or a reload may reach while it is
/// assembled: every component of the new generation so far, shared as it
/// is (no map is built per level). Not only the level's direct
/// dependencies: an `init` that calls a dependency which loads its own
/// handle reaches further, and must find the new generation there too.
/// Later levels (the level's dependents) are not in it yet.
pub(crate) fn staged_sharing(components: &Components) -> Generation {
    let members: Arc<dyn Members> = Arc::new(components.clone());
    Generation::of(0, members)
}

/// The generation numbered `number` of `components`, shared as they are
/// (a publish copies no map), described with the app id and each
/// component's configured type (what the metadata APIs show), so a reader
/// needs nothing but the snapshot.
fn described(number: u64, config: &ValidConfig, components: &Arc<Components>) -> Generation {
    let members: Arc<dyn Members> = components.clone();
    Generation::of(number, members)
        .serving(&config.config.app_id)
        .with_sections(Arc::new(config.config.sections.clone()))
}

impl Members for Components {
    fn instance(&self, key: &dyn KeyParts) -> Option<&Instance> {
        self.get_parts(key)
            .map(|running| &running.assembled.instance)
    }

    fn instance_of(&self, key: &ComponentKey) -> Option<&Instance> {
        self.get(key).map(|running| &running.assembled.instance)
    }

    fn type_name(&self, key: &dyn KeyParts) -> Option<&str> {
        self.get_parts(key)
            .map(|running| running.spec.type_name.as_str())
    }

    fn each(&self) -> Box<dyn Iterator<Item = (&ComponentKey, &Instance)> + '_> {
        Box::new(
            self.iter()
                .map(|(key, running)| (key, &running.assembled.instance)),
        )
    }

    fn count(&self) -> usize {
        self.len()
    }
}
