//! Precedence: the file, then the overlay (common key, then the app's own
//! key), then control-plane pushes. The effective configuration is
//! recomputed from the layers on every change, with the layer each value
//! came from.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::hash::{BuildHasher, Hash, Hasher, RandomState};
use std::sync::{Arc, Mutex};

use serde::Serialize;

use super::model::{ComponentSpec, Config, OverlaySpec};
use super::patch::{ComponentPatch, ConfigPatch};
use crate::component::ComponentKey;
use crate::problem::Problem;

/// Where a value of the effective configuration came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Layer {
    /// The configuration file (or `Runtime::apply`).
    File,
    /// The overlay's common key.
    Overlay,
    /// The overlay's app-specific key (`<key>.<appId>`).
    OverlayApp,
    /// A push through the Lifecycle API.
    ControlPlane,
}

/// A control-plane decision about one component.
#[derive(Debug, Clone, PartialEq)]
pub enum Push {
    /// The component is declared so, replacing every lower layer, except
    /// what the patch leaves `None`: its scopes, and each kind of ref it
    /// does not give (a Layotto push gives none), stay the lower layers'
    /// and follow their changes. An inherited secretRef or
    /// configurationRef that fills a field the patch sets is dropped.
    Declare(ComponentPatch),
    /// The component as the lower layers declare it, with the patch laid
    /// over it field by field (Layotto's push, which carries metadata
    /// only): the metadata fields it sets win (a `null` removes one), the
    /// rest, type and refs stay the lower layers' and follow their
    /// changes; an inherited secretRef or configurationRef that fills a
    /// field the patch sets is dropped. Amending a pushed component lays
    /// the amendment over that push. As Layotto's, an amendment never adds
    /// a component: one the layers do not have in force (never declared,
    /// or removed by a push) is refused, and so is an amendment that sets
    /// nothing.
    Amend(ComponentPatch),
    /// What `rewire apply` pushes (the Lifecycle `AmendConfiguration`):
    /// an `Amend` when the component is in force and the patch gives no
    /// type or the type in force; otherwise a `Declare` of the component
    /// whole, each kind of ref it does not give declared empty (a
    /// component not in force is added; a type change declares the
    /// component whole: the fields given are all it has, none of the old
    /// type's fields or refs carried into a type that may not know them).
    /// Resolved when laid, against the layers at that point, inside the
    /// serialised reload: a file reload that adds or removes the component
    /// just before is seen. [`Layers::apply`] stores the resolved push,
    /// never this one.
    AmendOrDeclare(ComponentPatch),
    /// The component is removed, whatever lower layers say.
    Remove,
}

impl Push {
    /// `AmendOrDeclare(patch)` resolved against `in_force`, the type of
    /// the component the layers declare now (`None`: not in force).
    fn amend_or_declare(patch: ComponentPatch, in_force: Option<&str>) -> Push {
        let same_type = |in_force: &str| patch.type_name.as_deref().is_none_or(|t| t == in_force);
        match in_force {
            Some(in_force) if same_type(in_force) => Push::Amend(patch),
            _ => Push::Declare(ComponentPatch {
                component_refs: patch.component_refs.or_else(|| Some(Vec::new())),
                secret_refs: patch.secret_refs.or_else(|| Some(Vec::new())),
                configuration_refs: patch.configuration_refs.or_else(|| Some(Vec::new())),
                ..patch
            }),
        }
    }
}

/// A change to one layer of the configuration.
// A whole file is the common change and moves a few times per reload:
// not worth a box in the public type.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum LayerChange {
    /// A new base configuration.
    File(Config),
    /// New overlay documents, with where they were read. A read from an
    /// overlay other than the one the file names, or for another app id
    /// than the file's, is ignored (see [`Layers::apply`]).
    Overlay {
        /// The common key's document (`None`: the key holds none).
        common: Option<ConfigPatch>,
        /// The app-specific key's document, the overlay both were read
        /// from and the app id the read was made for (see
        /// [`LayerChange::overlay_read`]). `None`: no app-specific
        /// document and no word on where the read was made; the documents
        /// are then laid while the file names any overlay.
        read: Option<OverlayRead>,
    },
    /// A control-plane decision about one component.
    Push(ComponentKey, Push),
    /// The control plane lets go of one component: the file and the
    /// overlay say again what it is.
    Release(ComponentKey),
}

/// The part of an overlay read that [`LayerChange::Overlay`] carries after
/// the common key's document.
#[derive(Debug, Clone, PartialEq)]
pub struct OverlayRead {
    /// The overlay (store and common key) both documents were read from.
    pub from: OverlaySpec,
    /// The app id the read was made for: the app-specific key read was
    /// `<key>.<app_id>`.
    pub app_id: String,
    /// The app-specific key's document (`None`: absent or empty).
    pub app: Option<ConfigPatch>,
}

impl LayerChange {
    /// The overlay documents `common` and `app` read from `from` for the
    /// app `app_id` (`app` from `<key>.<app_id>`).
    pub fn overlay_read(
        from: OverlaySpec,
        app_id: impl Into<String>,
        common: Option<ConfigPatch>,
        app: Option<ConfigPatch>,
    ) -> Self {
        let app_id = app_id.into();
        Self::Overlay {
            common,
            read: Some(OverlayRead { from, app_id, app }),
        }
    }
}

/// Where each part of one component's effective declaration came from.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ComponentSources {
    /// The layer that set `type`.
    #[serde(rename = "type")]
    pub type_name: Option<Layer>,
    /// The layer that set each metadata field.
    pub metadata: BTreeMap<String, Layer>,
    /// The layer that set the refs.
    pub refs: Option<Layer>,
}

/// The layers of a runtime's configuration.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Layers {
    /// The base configuration.
    pub file: Config,
    /// The overlay's common document.
    pub overlay: Option<ConfigPatch>,
    /// The overlay's app-specific document.
    pub overlay_app: Option<ConfigPatch>,
    /// Control-plane pushes, by component.
    pub pushes: BTreeMap<ComponentKey, Push>,
    /// The overlay components layings skipped and warned about (see
    /// [`SkippedOverlay`]).
    pub(crate) skipped: SkippedOverlay,
}

/// The untyped overlay components that nothing below declares, skipped by
/// layings and warned about, each with a digest of what the overlay
/// documents said of it then; shared by the copies of one runtime's
/// layers, so each skip (a component, and what the documents say of it)
/// is warned about once: not at every recompute, nor again after a laying
/// that did not skip it (the layers in force, laid between two tries of a
/// candidate that is rejected or rolled back). Other documents of it
/// skipped are news. Holds a keyed digest of the documents, never the
/// documents themselves (they may carry secrets inline), for at most
/// [`SKIPS_REMEMBERED`] components, or as many as one laying skips when it
/// skips more (the overlay documents bound those): the oldest that the
/// laying in progress did not skip is forgotten first (costing one more
/// warning if it is skipped again), never one it skipped (else a laying
/// skipping more than the bound would forget skips it remembered first,
/// and warn about all of them again at every laying). Not part of what
/// the layers say: any two are equal.
#[derive(Debug, Clone, Default)]
pub(crate) struct SkippedOverlay(Arc<SkipMemory>);

/// At most this many skipped components are remembered, but for those the
/// laying in progress skips (see [`SkippedOverlay`]).
pub(crate) const SKIPS_REMEMBERED: usize = 1_024;

/// What [`SkippedOverlay`] shares.
#[derive(Debug, Default)]
struct SkipMemory {
    /// The digest's key, drawn per memory.
    keys: RandomState,
    warned: Mutex<WarnedSkips>,
}

/// The skips warned about: a digest of the documents by component, and
/// the components in the order they were first remembered.
#[derive(Debug, Default)]
struct WarnedSkips {
    digests: BTreeMap<ComponentKey, u64>,
    oldest_first: VecDeque<ComponentKey>,
}

/// What the overlay's common and app-specific documents say of a skipped
/// component.
type SkippedPatches = (Option<ComponentPatch>, Option<ComponentPatch>);

impl PartialEq for SkippedOverlay {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl SkippedOverlay {
    /// Warns about each skip in `skipped` not warned about yet (a
    /// component never warned about, or whose documents said otherwise
    /// when it was), and remembers it; returns the components warned
    /// about.
    fn remember(&self, skipped: BTreeMap<ComponentKey, SkippedPatches>) -> Vec<ComponentKey> {
        let digests: Vec<(ComponentKey, u64)> = skipped
            .into_iter()
            .map(|(key, patches)| {
                let digest = self.digest(&patches);
                (key, digest)
            })
            .collect();
        let mut warned = self.0.warned.lock().unwrap_or_else(|p| p.into_inner());
        let mut news = Vec::new();
        for (key, digest) in &digests {
            if warned.digests.get(key) == Some(digest) {
                continue;
            }
            tracing::warn!(
                component = %key,
                "Overlay component {key} skipped: nothing below declares it and neither overlay document gives its `type`; give `type` to add it."
            );
            warned.insert(key.clone(), *digest);
            news.push(key.clone());
        }
        if !news.is_empty() {
            let skipping: BTreeSet<&ComponentKey> = digests.iter().map(|(key, _)| key).collect();
            warned.forget_oldest_but(&skipping);
        }
        news
    }

    /// How many components are remembered.
    #[cfg(test)]
    fn len(&self) -> usize {
        let warned = self.0.warned.lock().unwrap_or_else(|p| p.into_inner());
        warned.digests.len()
    }

    /// A digest of `patches`, keyed by this memory's key.
    fn digest(&self, patches: &SkippedPatches) -> u64 {
        let mut hasher = self.0.keys.build_hasher();
        for patch in [&patches.0, &patches.1] {
            match patch {
                Some(patch) => {
                    1u8.hash(&mut hasher);
                    hash_patch(patch, &mut hasher);
                }
                None => 0u8.hash(&mut hasher),
            }
        }
        hasher.finish()
    }
}

impl WarnedSkips {
    /// Remembers `digest` for `key` (see [`Self::forget_oldest_but`] for
    /// the bound).
    fn insert(&mut self, key: ComponentKey, digest: u64) {
        if self.digests.insert(key.clone(), digest).is_none() {
            self.oldest_first.push_back(key);
        }
    }

    /// Forgets the components remembered first, but for those in
    /// `skipping` (the laying in progress skips them: forgotten, they
    /// would be warned about again at its next laying), until at most
    /// [`SKIPS_REMEMBERED`] are remembered, or only those in `skipping`.
    fn forget_oldest_but(&mut self, skipping: &BTreeSet<&ComponentKey>) {
        let mut excess = self.digests.len().saturating_sub(SKIPS_REMEMBERED);
        if excess == 0 {
            return;
        }
        let Self {
            digests,
            oldest_first,
        } = self;
        oldest_first.retain(|key| {
            if excess == 0 || skipping.contains(key) {
                return true;
            }
            digests.remove(key);
            excess -= 1;
            false
        });
    }
}

/// Feeds every field of `patch` to `hasher` (metadata values as their
/// JSON text).
fn hash_patch(patch: &ComponentPatch, hasher: &mut impl Hasher) {
    patch.type_name.hash(hasher);
    patch.metadata.len().hash(hasher);
    for (field, value) in &patch.metadata {
        field.hash(hasher);
        value.to_string().hash(hasher);
    }
    let component_refs = patch
        .component_refs
        .as_ref()
        .map(|refs| refs.iter().map(|r| &r.key).collect::<Vec<_>>());
    component_refs.hash(hasher);
    patch.secret_refs.hash(hasher);
    patch.configuration_refs.hash(hasher);
    patch.scopes.hash(hasher);
}

impl Layers {
    /// Layers holding only `file`.
    pub fn new(file: Config) -> Self {
        Self {
            file,
            ..Self::default()
        }
    }

    /// Layers holding only `file`, warning about skipped overlay
    /// components through `skipped` (the runtime's memory of them).
    pub(crate) fn sharing_skips(file: Config, skipped: &SkippedOverlay) -> Self {
        Self {
            skipped: skipped.clone(),
            ..Self::new(file)
        }
    }

    /// Lays `change` over these layers. A file that names no overlay drops
    /// the overlay documents, and one with another app id the app-specific
    /// document (see [`Self::changed`]); overlay documents laid over a
    /// file naming no overlay are ignored (stale: read from the overlay
    /// the previous file named), as are documents read from an overlay
    /// (store or key) other than the one the file names (read before a
    /// file that moved the overlay), or for another app id than the
    /// file's (read before a file that changed it: the app-specific
    /// document is another app's). A push without
    /// `type` keeps the type in force now (read here, inside the
    /// serialised reload, so a concurrent type change is not undone);
    /// removing, releasing or amending a component the layers do not
    /// have is refused (checked here too, so a removal queued first is not
    /// raced), and so is an amendment that sets nothing. `AmendOrDeclare`
    /// is resolved here, against the layers as they are now.
    pub fn apply(&mut self, change: LayerChange) -> Result<(), Problem> {
        match change {
            LayerChange::Push(key, Push::AmendOrDeclare(patch)) => {
                let push = Push::amend_or_declare(patch, self.type_in_force(&key).as_deref());
                return self.apply(LayerChange::Push(key, push));
            }
            LayerChange::File(file) => {
                if file.overlay.is_none() {
                    self.overlay = None;
                }
                if !self.keeps_overlay_app(&file) {
                    self.overlay_app = None;
                }
                self.file = file;
            }
            LayerChange::Overlay { common, read } => {
                let Some(named) = &self.file.overlay else {
                    // Read before a file that names no overlay replaced
                    // the one naming it (queued behind it, or merged after
                    // it in a burst): no watch is left to clear documents
                    // laid now, so they are stale.
                    tracing::info!(
                        "Overlay documents ignored: the configuration file names no overlay now (read before it changed)."
                    );
                    return Ok(());
                };
                let (from, app) = match read {
                    Some(OverlayRead { from, app_id, app }) => (Some((from, app_id)), app),
                    None => (None, None),
                };
                let (from, app_id) = from.unzip();
                if let Some(from) = from.filter(|from| from != named) {
                    // Read before a file that moved the overlay (queued
                    // behind it, or by the old watch before the new one
                    // replaced it): the new overlay's watch sends its own.
                    tracing::info!(
                        read_store = %from.store,
                        read_key = %from.key,
                        store = %named.store,
                        key = %named.key,
                        "Overlay documents ignored: read from an overlay the configuration file no longer names (read before it moved the overlay to another store or key)."
                    );
                    return Ok(());
                }
                if let Some(read_for) = app_id.filter(|id| *id != self.file.app_id) {
                    // Read before a file that changed the app id (queued
                    // behind it, or by the old watch before the new one
                    // replaced it): its app-specific document is the
                    // other app's; the new app id's watch sends its own.
                    tracing::info!(
                        read_for = %read_for,
                        app_id = %self.file.app_id,
                        "Overlay documents ignored: read for an app id the configuration file no longer gives (read before it changed the app id)."
                    );
                    return Ok(());
                }
                self.overlay = common;
                self.overlay_app = app;
            }
            LayerChange::Push(key, Push::Declare(mut patch)) => {
                if patch.type_name.is_none() {
                    patch.type_name = self.type_in_force(&key);
                }
                self.pushes.insert(key, Push::Declare(patch));
            }
            LayerChange::Push(key, Push::Amend(patch)) => {
                if patch == ComponentPatch::default() {
                    return Err(Problem::component(
                        &key,
                        "an amendment must set a field (metadata is required)",
                    ));
                }
                if self.type_in_force(&key).is_none() {
                    return Err(Problem::component(
                        &key,
                        "component not found: an amendment changes a component in force, \
                         it does not add or revive one",
                    ));
                }
                // In force, so not removed by a push: a push of it, if
                // any, declares or amends it.
                let laid = match self.pushes.remove(&key) {
                    Some(Push::Declare(pushed)) => Push::Declare(pushed.then(patch)),
                    Some(Push::Amend(pushed)) => Push::Amend(pushed.then(patch)),
                    // Only when set in `pushes` directly (`apply` stores
                    // it resolved): still resolved when laid.
                    Some(Push::AmendOrDeclare(pushed)) => Push::AmendOrDeclare(pushed.then(patch)),
                    Some(Push::Remove) | None => Push::Amend(patch),
                };
                self.pushes.insert(key, laid);
            }
            LayerChange::Push(key, Push::Remove) => {
                if !self.pushes.contains_key(&key) && self.type_in_force(&key).is_none() {
                    return Err(Problem::component(&key, "no such component to remove"));
                }
                self.pushes.insert(key, Push::Remove);
            }
            LayerChange::Release(key) => {
                if self.pushes.remove(&key).is_none() {
                    return Err(Problem::component(
                        &key,
                        "no control-plane push of this component to release",
                    ));
                }
            }
        }
        Ok(())
    }

    /// A copy of these layers with `change` laid over them; a new file
    /// replaces the old one without copying it first. A file that names no
    /// overlay drops the overlay documents (no watch is left to clear
    /// them); one that names an overlay, even at another key or store,
    /// keeps them until the watch of the overlay it names replaces them
    /// (a read from the overlay it no longer names is ignored meanwhile),
    /// but for the app-specific document when the file gives another app
    /// id: that document is the old app's (the new app id's watch reads
    /// its own).
    pub fn changed(&self, change: LayerChange) -> Result<Self, Problem> {
        if let LayerChange::File(file) = change {
            let overlaid = file.overlay.is_some();
            let keeps_app = self.keeps_overlay_app(&file);
            return Ok(Self {
                overlay: self.overlay.clone().filter(|_| overlaid),
                overlay_app: self.overlay_app.clone().filter(|_| keeps_app),
                file,
                pushes: self.pushes.clone(),
                skipped: self.skipped.clone(),
            });
        }
        let mut changed = self.clone();
        changed.apply(change)?;
        Ok(changed)
    }

    /// Whether the app-specific overlay document stays laid under `file`:
    /// it names an overlay, and gives the same app id (the document was
    /// read from `<key>.<app id>`).
    fn keeps_overlay_app(&self, file: &Config) -> bool {
        file.overlay.is_some() && file.app_id == self.file.app_id
    }

    /// The type of `key` in the effective configuration, if declared.
    fn type_in_force(&self, key: &ComponentKey) -> Option<String> {
        self.effective_config()
            .components
            .get(key)
            .map(|spec| spec.type_name.clone())
    }

    /// The effective configuration and the source of each value.
    pub fn effective(&self) -> (Config, BTreeMap<ComponentKey, ComponentSources>) {
        let (config, sources, _warned) = self.laid(true);
        (config, sources)
    }

    /// The effective configuration alone (what a reload validates; the
    /// sources are not worked out).
    pub fn effective_config(&self) -> Config {
        self.laid(false).0
    }

    /// The skipped overlay components a laying of these layers warns
    /// about now.
    #[cfg(test)]
    pub(crate) fn skips_warned(&self) -> Vec<ComponentKey> {
        self.laid(false).2
    }

    /// The layers laid over each other; the sources only when `tracked`;
    /// and the skipped overlay components warned about by this laying.
    fn laid(
        &self,
        tracked: bool,
    ) -> (
        Config,
        BTreeMap<ComponentKey, ComponentSources>,
        Vec<ComponentKey>,
    ) {
        let sources = match tracked {
            true => self
                .file
                .components
                .iter()
                .map(|(key, spec)| (key.clone(), whole(spec.metadata.keys(), Layer::File)))
                .collect(),
            false => BTreeMap::new(),
        };
        let mut effective = Effective {
            sources,
            tracked,
            config: self.file.clone(),
            skipped: BTreeSet::new(),
        };
        let app_documents = self.overlay_app.iter().flat_map(|p| &p.components);
        let app_types: BTreeMap<&ComponentKey, &String> = app_documents
            .filter_map(|(key, component)| Some((key, component.type_name.as_ref()?)))
            .collect();
        for (key, component) in self.overlay.iter().flat_map(|p| &p.components) {
            // The two documents are one patch of the key: a type the app
            // document gives adds the component with the common fields.
            let typed_by_app = match (&component.type_name, app_types.get(key)) {
                (None, Some(type_name)) if !effective.config.components.contains_key(key) => {
                    Some((*type_name).clone())
                }
                _ => None,
            };
            match typed_by_app {
                Some(type_name) => {
                    let typed = ComponentPatch {
                        type_name: Some(type_name),
                        ..component.clone()
                    };
                    effective.overlay(Layer::Overlay, key, &typed);
                }
                None => effective.overlay(Layer::Overlay, key, component),
            }
        }
        for (key, component) in self.overlay_app.iter().flat_map(|p| &p.components) {
            effective.overlay(Layer::OverlayApp, key, component);
        }
        for (key, push) in &self.pushes {
            effective.push(key, push);
        }
        let skipped = effective
            .skipped
            .into_iter()
            .map(|key| {
                let said = |document: &Option<ConfigPatch>| {
                    document.as_ref()?.components.get(&key).cloned()
                };
                let patches = (said(&self.overlay), said(&self.overlay_app));
                (key, patches)
            })
            .collect();
        let warned = self.skipped.remember(skipped);
        (effective.config, effective.sources, warned)
    }
}

/// The effective configuration being laid, with where each value came from.
struct Effective {
    config: Config,
    sources: BTreeMap<ComponentKey, ComponentSources>,
    /// Whether `sources` are worked out.
    tracked: bool,
    /// The untyped overlay components skipped: nothing below declares
    /// them.
    skipped: BTreeSet<ComponentKey>,
}

impl Effective {
    /// Lays one overlay component over what is there, field by field: a
    /// field it sets wins over an inherited ref that would fill it (the
    /// assembly would otherwise overwrite the field with the ref's value).
    /// One that nothing below declares is added only when it gives its
    /// type: an amendment without one (of a component the file stopped
    /// declaring, say) is skipped, as a [`Push::Amend`] of it is, rather
    /// than adding the component from the amended fields alone, typed by
    /// its name (and recorded in `skipped`).
    fn overlay(&mut self, layer: Layer, key: &ComponentKey, component: &ComponentPatch) {
        let added = match self.config.components.get_mut(key) {
            Some(spec) => {
                let spec = Arc::make_mut(spec);
                component.apply_to(spec);
                yield_to_pushed_fields(component, spec);
                false
            }
            None if component.type_name.is_none() => {
                self.skipped.insert(key.clone());
                return;
            }
            None => {
                let spec = component.clone().into_spec(key.clone());
                self.config.components.insert(key.clone(), Arc::new(spec));
                true
            }
        };
        if !self.tracked {
            return;
        }
        let source = self.sources.entry(key.clone()).or_default();
        if added {
            *source = whole(std::iter::empty(), layer);
        }
        if component.type_name.is_some() {
            source.type_name = Some(layer);
        }
        for (field, value) in &component.metadata {
            if value.is_null() {
                source.metadata.remove(field);
            } else {
                source.metadata.insert(field.clone(), layer);
            }
        }
        let refs_given = component.component_refs.is_some()
            || component.secret_refs.is_some()
            || component.configuration_refs.is_some();
        if refs_given {
            source.refs = Some(layer);
        }
    }

    /// Lays one control-plane decision: it replaces the component whole,
    /// but for what the push does not say (see [`inherited`]).
    fn push(&mut self, key: &ComponentKey, push: &Push) {
        match push {
            Push::Declare(patch) => {
                let below = self.config.components.get(key).cloned();
                let mut spec = patch.clone().into_spec(key.clone());
                let refs_below = below
                    .as_deref()
                    .is_some_and(|below| inherited(patch, below, &mut spec));
                if self.tracked {
                    let mut source = whole(spec.metadata.keys(), Layer::ControlPlane);
                    if refs_below {
                        source.refs = self.sources.get(key).and_then(|s| s.refs);
                    }
                    self.sources.insert(key.clone(), source);
                }
                self.config.components.insert(key.clone(), Arc::new(spec));
            }
            Push::Amend(patch) => {
                // An amendment never adds a component: one the layers below
                // no longer declare (its file entry or overlay document
                // gone) stays gone, rather than coming back from the
                // pushed fields alone with its type taken from its name.
                if !self.config.components.contains_key(key) {
                    return;
                }
                self.overlay(Layer::ControlPlane, key, patch);
            }
            Push::AmendOrDeclare(patch) => {
                // Not stored by `Layers::apply`; set in `pushes` directly,
                // it is resolved against the layers below.
                let below = self.config.components.get(key);
                let in_force = below.map(|spec| spec.type_name.clone());
                let resolved = Push::amend_or_declare(patch.clone(), in_force.as_deref());
                self.push(key, &resolved);
            }
            Push::Remove => {
                self.config.components.remove(key);
                self.sources.remove(key);
            }
        }
    }
}

/// Gives `spec`, declared by `patch`, what the push does not say from the
/// declaration `below` it: the scopes (a push never says them) and each
/// kind of ref the push leaves `None` (a Layotto push: its proto has no
/// field for refs). An inherited secretRef or configurationRef that
/// injects a field the push sets is left out: the push's value wins, as
/// the top layer. Whether every ref came from below.
fn inherited(patch: &ComponentPatch, below: &ComponentSpec, spec: &mut ComponentSpec) -> bool {
    if patch.scopes.is_none() {
        spec.scopes = below.scopes.clone();
    }
    if patch.component_refs.is_none() {
        spec.component_refs = below.component_refs.clone();
    }
    if patch.secret_refs.is_none() {
        spec.secret_refs = below.secret_refs.clone();
    }
    if patch.configuration_refs.is_none() {
        spec.configuration_refs = below.configuration_refs.clone();
    }
    yield_to_pushed_fields(patch, spec);
    patch.component_refs.is_none()
        && patch.secret_refs.is_none()
        && patch.configuration_refs.is_none()
}

/// Drops the secretRefs and configurationRefs `spec` keeps from below
/// (those `patch` leaves unsaid) that fill a metadata field `patch` sets:
/// the overlay's or push's value wins, as the higher layer.
fn yield_to_pushed_fields(patch: &ComponentPatch, spec: &mut ComponentSpec) {
    let pushed = |field: &str| patch.metadata.get(field).is_some_and(|v| !v.is_null());
    if patch.secret_refs.is_none() {
        spec.secret_refs.retain(|r| !pushed(&r.inject_as));
    }
    if patch.configuration_refs.is_none() {
        spec.configuration_refs.retain(|r| !pushed(&r.inject_as));
    }
}

fn whole<'a>(fields: impl Iterator<Item = &'a String>, layer: Layer) -> ComponentSources {
    ComponentSources {
        type_name: Some(layer),
        metadata: fields.map(|f| (f.clone(), layer)).collect(),
        refs: Some(layer),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{parse, parse_patch};
    use serde_json::json;

    fn patch(text: &str) -> ConfigPatch {
        parse_patch(text.as_bytes()).unwrap_or_else(|p| panic!("{p}"))
    }

    #[test]
    fn app_overlay_beats_common_overlay_beats_file_and_pushes_beat_all() {
        let file = parse(br#"{"components": {"state": {"s": {"type": "memory", "metadata": {"a": "file", "b": "file", "c": "file"}}, "t": {}}}}"#)
            .unwrap_or_else(|p| panic!("{p}"));
        let mut layers = Layers::new(file);
        layers.overlay = Some(patch(
            r#"{"components": {"state": {"s": {"metadata": {"a": "common", "b": "common"}}}}}"#,
        ));
        layers.overlay_app = Some(patch(
            r#"{"components": {"state": {"s": {"metadata": {"a": "app"}}}}}"#,
        ));
        let s = ComponentKey::new("state", "s");
        let (config, sources) = layers.effective();
        assert_eq!(
            serde_json::Value::Object(config.components[&s].metadata.clone()),
            json!({"a": "app", "b": "common", "c": "file"})
        );
        assert_eq!(sources[&s].metadata["a"], Layer::OverlayApp);
        assert_eq!(sources[&s].metadata["b"], Layer::Overlay);
        assert_eq!(sources[&s].metadata["c"], Layer::File);
        let t = ComponentKey::new("state", "t");
        layers.pushes.insert(s.clone(), Push::Declare(patch(r#"{"components": {"state": {"s": {"type": "memory", "metadata": {"a": "push"}}}}}"#).components[&s].clone()));
        layers.pushes.insert(t.clone(), Push::Remove);
        let (config, sources) = layers.effective();
        assert_eq!(
            serde_json::Value::Object(config.components[&s].metadata.clone()),
            json!({"a": "push"})
        );
        assert_eq!(sources[&s].metadata["a"], Layer::ControlPlane);
        assert!(!config.components.contains_key(&t));
    }

    fn file(text: &str) -> Config {
        parse(text.as_bytes()).unwrap()
    }

    /// The app id of a file that gives none.
    const NO_APP_ID: &str = "";

    /// A file declaring no component, naming an overlay (and no app id).
    const OVERLAID_EMPTY: &str =
        r#"{"components": {}, "overlay": {"store": "cfg", "key": "rewire.components"}}"#;

    /// `state/s` from the common overlay document, and the file `text`
    /// after it names no overlay: what a watch read before the file changed
    /// is not laid.
    #[test]
    fn overlay_documents_laid_over_a_file_that_names_no_overlay_are_ignored() {
        let s = ComponentKey::new("state", "s");
        let overlaid = |value: &str| {
            let text = format!(
                r#"{{"components": {{"state": {{"s": {{"type": "memory", "metadata": {{"d": "{value}"}}}}}}}}}}"#
            );
            LayerChange::Overlay {
                common: Some(patch(&text)),
                read: None,
            }
        };
        let mut layers = Layers::new(file(OVERLAID_EMPTY));
        layers.apply(overlaid("d1")).unwrap();
        assert_eq!(layers.effective_config().components[&s].metadata["d"], "d1");

        // The operator removes the overlay section while a read of D2
        // (queued, or merged after the file in a burst) is on its way.
        layers
            .apply(LayerChange::File(file(r#"{"components": {}}"#)))
            .unwrap();
        assert_eq!(layers.overlay, None);
        layers.apply(overlaid("d2")).unwrap();
        assert_eq!(layers.overlay, None);
        assert!(!layers.effective_config().components.contains_key(&s));
        // The same through `changed`, as a reload lays its first change.
        let changed = layers.changed(overlaid("d2")).unwrap();
        assert_eq!(changed.overlay, None);

        // Named again, the overlay's watch lays its documents.
        layers
            .apply(LayerChange::File(file(OVERLAID_EMPTY)))
            .unwrap();
        layers.apply(overlaid("d3")).unwrap();
        assert_eq!(layers.effective_config().components[&s].metadata["d"], "d3");
    }

    /// The overlay at `key` of store `cfg`.
    fn cfg_overlay(key: &str) -> OverlaySpec {
        OverlaySpec {
            store: "cfg".into(),
            key: key.into(),
        }
    }

    /// The operator moves the overlay to another key, then to another
    /// store: a read from the overlay the file named before (queued
    /// behind the file, or made by the old watch before the new one
    /// replaced it) is ignored, the documents in force kept until the
    /// new overlay's watch replaces them; a read from the overlay the file
    /// names is laid.
    #[test]
    fn overlay_documents_read_from_the_overlay_a_file_moved_away_from_are_ignored() {
        let s = ComponentKey::new("state", "s");
        let read = |from: OverlaySpec, value: &str| {
            let text = format!(
                r#"{{"components": {{"state": {{"s": {{"type": "memory", "metadata": {{"d": "{value}"}}}}}}}}}}"#
            );
            let app = format!(
                r#"{{"components": {{"state": {{"s": {{"metadata": {{"app": "{value}"}}}}}}}}}}"#
            );
            LayerChange::overlay_read(from, NO_APP_ID, Some(patch(&text)), Some(patch(&app)))
        };
        let in_force = |layers: &Layers| {
            let config = layers.effective_config();
            let metadata = &config.components[&s].metadata;
            (metadata["d"].clone(), metadata["app"].clone())
        };
        let old = cfg_overlay("rewire.components");
        let mut layers = Layers::new(file(OVERLAID_EMPTY));
        layers.apply(read(old.clone(), "d1")).unwrap();
        assert_eq!(in_force(&layers), (json!("d1"), json!("d1")));

        // Moved to another key while a read of the old key's D2 is on
        // its way: D1 stays in force, D2 is not laid.
        let moved =
            file(r#"{"components": {}, "overlay": {"store": "cfg", "key": "rewire.moved"}}"#);
        layers.apply(LayerChange::File(moved)).unwrap();
        assert_eq!(in_force(&layers), (json!("d1"), json!("d1")), "kept");
        let before = layers.clone();
        layers.apply(read(old.clone(), "d2")).unwrap();
        assert_eq!(layers, before, "the old key's read is ignored");
        // The same through `changed`, as a reload lays its first change.
        assert_eq!(layers.changed(read(old.clone(), "d2")).unwrap(), before);
        // An empty read of the old key does not drop the documents either.
        layers
            .apply(LayerChange::overlay_read(
                old.clone(),
                NO_APP_ID,
                None,
                None,
            ))
            .unwrap();
        assert_eq!(layers, before);

        // The new key's watch lays its documents.
        let new_key = cfg_overlay("rewire.moved");
        layers.apply(read(new_key.clone(), "d3")).unwrap();
        assert_eq!(in_force(&layers), (json!("d3"), json!("d3")));

        // Moved to another store, the same key: the old store's read is
        // ignored, the new store's laid.
        layers
            .apply(LayerChange::File(file(
                r#"{"components": {}, "overlay": {"store": "cfg2", "key": "rewire.moved"}}"#,
            )))
            .unwrap();
        layers.apply(read(new_key, "d4")).unwrap();
        assert_eq!(in_force(&layers), (json!("d3"), json!("d3")));
        let new_store = OverlaySpec {
            store: "cfg2".into(),
            key: "rewire.moved".into(),
        };
        layers.apply(read(new_store, "d5")).unwrap();
        assert_eq!(in_force(&layers), (json!("d5"), json!("d5")));
    }

    /// The operator changes only the app id (shop to shop2): the
    /// app-specific document read from `<key>.shop` is dropped, by
    /// `apply` and by `changed` alike, the common one kept; a read made
    /// for shop (queued behind the file, or by the old watch before the
    /// new one replaced it) is not laid over shop2; shop2's read is.
    #[test]
    fn an_app_specific_document_read_for_another_app_id_is_dropped_and_not_laid() {
        let s = ComponentKey::new("state", "s");
        let shop_file = |app_id: &str| {
            file(&format!(
                r#"{{"appId": "{app_id}", "components": {{"state": {{"s": {{"type": "memory"}}}}}},
                    "overlay": {{"store": "cfg", "key": "rewire.components"}}}}"#
            ))
        };
        let common = patch(r#"{"components": {"state": {"s": {"metadata": {"c": "common"}}}}}"#);
        let read_for = |app_id: &str| {
            let app = format!(
                r#"{{"components": {{"state": {{"s": {{"metadata": {{"d": "{app_id}"}}}}}}}}}}"#
            );
            LayerChange::overlay_read(
                cfg_overlay("rewire.components"),
                app_id,
                Some(common.clone()),
                Some(patch(&app)),
            )
        };
        let d = |layers: &Layers| {
            let config = layers.effective_config();
            config.components[&s].metadata.get("d").cloned()
        };
        let mut layers = Layers::new(shop_file("shop"));
        layers.apply(read_for("shop")).unwrap();
        assert_eq!(d(&layers), Some(json!("shop")));

        // Only the app id changes: shop's document goes, the common one
        // stays.
        let changed = layers
            .changed(LayerChange::File(shop_file("shop2")))
            .unwrap();
        assert_eq!(changed.overlay_app, None, "changed keeps shop's document");
        assert_eq!(changed.overlay, Some(common.clone()));
        layers.apply(LayerChange::File(shop_file("shop2"))).unwrap();
        assert_eq!(layers.overlay_app, None, "apply keeps shop's document");
        assert_eq!(layers.overlay, Some(common.clone()));
        assert_eq!(d(&layers), None);

        // shop's read, late: not laid over shop2.
        let before = layers.clone();
        layers.apply(read_for("shop")).unwrap();
        assert_eq!(layers, before, "shop's read laid over shop2");
        assert_eq!(layers.changed(read_for("shop")).unwrap(), before);

        // shop2's read is.
        layers.apply(read_for("shop2")).unwrap();
        assert_eq!(d(&layers), Some(json!("shop2")));
        // The same file again (the app id unchanged) keeps it.
        layers.apply(LayerChange::File(shop_file("shop2"))).unwrap();
        assert_eq!(d(&layers), Some(json!("shop2")));
    }

    #[test]
    fn an_overlay_field_wins_over_the_files_ref_that_fills_it() {
        let s = ComponentKey::new("state", "orders");
        let mut layers = Layers::new(file(
            r#"{"components": {"state": {"orders": {"type": "redis",
                "metadata": {"redisDB": 3},
                "secretRef": [{"store": "vault", "name": "redis", "key": "password", "injectAs": "redisPassword"}],
                "configurationRef": [{"store": "etcd", "key": "orders.redisHost", "injectAs": "redisHost", "watch": true}]}}}}"#,
        ));
        layers.overlay = Some(patch(
            r#"{"components": {"state": {"orders": {"metadata": {"redisHost": "dr:6379"}}}}}"#,
        ));
        let (config, sources) = layers.effective();
        let spec = &config.components[&s];
        assert!(
            spec.configuration_refs.is_empty(),
            "the ref filling the overlay's field gives way: {:?}",
            spec.configuration_refs
        );
        assert_eq!(spec.metadata["redisHost"], "dr:6379");
        assert_eq!(sources[&s].metadata["redisHost"], Layer::Overlay);
        assert_eq!(
            spec.secret_refs.len(),
            1,
            "a ref filling another field stays"
        );

        // An overlay that gives its own refs keeps them.
        layers.overlay = Some(patch(
            r#"{"components": {"state": {"orders": {"metadata": {"redisHost": "dr:6379"},
                "configurationRef": [{"store": "etcd", "key": "dr.redisHost", "injectAs": "redisHost"}]}}}}"#,
        ));
        let config = layers.effective_config();
        let refs = &config.components[&s].configuration_refs;
        assert_eq!(refs.len(), 1);
        assert_eq!(refs[0].key, "dr.redisHost");
    }

    /// An overlay that amends components the file does not declare (it
    /// stopped declaring them) adds nothing: not `state/orders`, whose
    /// type would be taken from its name and fail every later reload, nor
    /// `state/redis`, which would be built from the overlay's fields alone.
    #[test]
    fn an_untyped_overlay_component_nothing_below_declares_is_skipped() {
        let mut layers = Layers::new(file(OVERLAID_EMPTY));
        layers
            .apply(LayerChange::Overlay {
                common: Some(patch(
                    r#"{"components": {"state": {"orders": {"metadata": {"redisHost": "dr:6379"}},
                        "redis": {"metadata": {"redisHost": "dr:6379"}}}}}"#,
                )),
                read: None,
            })
            .unwrap();
        let (config, sources) = layers.effective();
        for key in [
            ComponentKey::new("state", "orders"),
            ComponentKey::new("state", "redis"),
        ] {
            assert!(!config.components.contains_key(&key), "{key} added");
            assert!(!sources.contains_key(&key), "{key} has sources");
            assert!(!layers.effective_config().components.contains_key(&key));
        }
        // Declared by the file again, the amendment lays over it.
        layers
            .apply(LayerChange::File(file(
                r#"{"components": {"state": {"orders": {"type": "redis",
                    "metadata": {"redisHost": "a:6379"}}}},
                    "overlay": {"store": "cfg", "key": "rewire.components"}}"#,
            )))
            .unwrap();
        let config = layers.effective_config();
        let orders = &config.components[&ComponentKey::new("state", "orders")];
        assert_eq!(orders.metadata["redisHost"], "dr:6379");
        assert!(!config
            .components
            .contains_key(&ComponentKey::new("state", "redis")));
    }

    /// The common document sets a field of `state/orders`, the app
    /// document gives its type: one patch of the key, the component is
    /// added with both documents' fields. Untyped in both, it is skipped,
    /// warned about once, not at every recompute.
    #[test]
    fn a_type_the_app_document_gives_adds_the_component_with_the_common_fields() {
        let orders = ComponentKey::new("state", "orders");
        let mut layers = Layers::new(file(OVERLAID_EMPTY));
        layers
            .apply(LayerChange::overlay_read(
                cfg_overlay("rewire.components"),
                NO_APP_ID,
                Some(patch(
                    r#"{"components": {"state": {"orders": {"metadata": {"redisHost": "dr:6379"}}}}}"#,
                )),
                Some(patch(
                    r#"{"components": {"state": {"orders": {"type": "redis", "metadata": {"redisDB": "1"}}}}}"#,
                )),
            ))
            .unwrap();
        let (config, sources) = layers.effective();
        let spec = &config.components[&orders];
        assert_eq!(spec.type_name, "redis");
        assert_eq!(
            serde_json::Value::Object(spec.metadata.clone()),
            json!({"redisHost": "dr:6379", "redisDB": "1"})
        );
        assert_eq!(sources[&orders].type_name, Some(Layer::OverlayApp));
        assert_eq!(sources[&orders].metadata["redisHost"], Layer::Overlay);
        assert_eq!(sources[&orders].metadata["redisDB"], Layer::OverlayApp);

        // Untyped in both: skipped, and warned about when it starts being.
        let untyped = r#"{"components": {"state": {"orders": {"metadata": {"redisDB": "1"}}}}}"#;
        layers
            .apply(LayerChange::overlay_read(
                cfg_overlay("rewire.components"),
                NO_APP_ID,
                Some(patch(
                    r#"{"components": {"state": {"orders": {"metadata": {"redisHost": "dr:6379"}}}}}"#,
                )),
                Some(patch(untyped)),
            ))
            .unwrap();
        assert!(!layers.effective_config().components.contains_key(&orders));
        // Laid again (every reload does): not warned again.
        assert_eq!(layers.laid(false).2, Vec::new());
    }

    /// A candidate that skips an overlay component (the file stopped
    /// declaring it) warns about it when first laid; laid again after the
    /// layers in force, which do not skip it (the candidate rolled back
    /// and retried, say), the same skip is not warned about again. Another
    /// document of it skipped is.
    #[test]
    fn a_skip_is_warned_about_once_not_again_after_layers_that_do_not_skip_it() {
        let orders = ComponentKey::new("state", "orders");
        let amended = |host: &str| {
            let text = format!(
                r#"{{"components": {{"state": {{"orders": {{"metadata": {{"redisHost": "{host}"}}}}}}}}}}"#
            );
            LayerChange::overlay_read(
                cfg_overlay("rewire.components"),
                NO_APP_ID,
                Some(patch(&text)),
                None,
            )
        };
        let declared = file(
            r#"{"components": {"state": {"orders": {"type": "redis"}}},
                "overlay": {"store": "cfg", "key": "rewire.components"}}"#,
        );
        let in_force = Layers::new(declared).changed(amended("dr:6379")).unwrap();
        assert_eq!(in_force.laid(false).2, Vec::new(), "declared: not skipped");
        let candidate = in_force
            .changed(LayerChange::File(file(OVERLAID_EMPTY)))
            .unwrap();
        assert_eq!(candidate.laid(false).2, vec![orders.clone()]);
        for _ in 0..2 {
            assert_eq!(in_force.laid(false).2, Vec::new());
            assert_eq!(candidate.laid(false).2, Vec::new(), "the same skip again");
        }
        // Another document of it, skipped: news.
        let other = candidate.changed(amended("dr2:6379")).unwrap();
        assert_eq!(other.laid(false).2, vec![orders]);
    }

    /// Every laying skipping a component never skipped before: the skip
    /// memory stays within its bound, forgetting the oldest first (warned
    /// about again if skipped again), and holds no document.
    #[test]
    fn the_skip_memory_is_bounded_and_forgets_the_oldest_first() {
        let mut layers = Layers::new(file(OVERLAID_EMPTY));
        let skipping = |i: usize| {
            let text = format!(
                r#"{{"components": {{"state": {{"c{i}": {{"metadata": {{"note": "inline-value-{i}"}}}}}}}}}}"#
            );
            LayerChange::Overlay {
                common: Some(patch(&text)),
                read: None,
            }
        };
        for i in 0..10_000 {
            layers.apply(skipping(i)).unwrap();
            assert_eq!(layers.laid(false).2.len(), 1, "c{i} is news");
        }
        assert!(
            layers.skipped.len() <= 1_024,
            "{} skips remembered",
            layers.skipped.len()
        );
        // The latest is remembered, the oldest forgotten.
        assert_eq!(layers.laid(false).2, Vec::new(), "the latest again");
        layers.apply(skipping(0)).unwrap();
        assert_eq!(
            layers.laid(false).2,
            vec![ComponentKey::new("state", "c0")],
            "forgotten: warned about again"
        );
        assert!(
            !format!("{:?}", layers.skipped).contains("inline-value"),
            "the memory holds a document"
        );
    }

    /// One overlay skipping more components than the skip memory's bound
    /// (1,100 untyped components nothing declares): each is warned about
    /// at the first laying, none again at the next (a status poll lays
    /// the layers every few seconds). A later laying skipping something
    /// else brings the memory back within its bound.
    #[test]
    fn a_laying_skipping_more_than_the_bound_warns_about_each_skip_once() {
        let components: Vec<String> = (0..1_100)
            .map(|i| format!(r#""c{i}": {{"metadata": {{"note": "{i}"}}}}"#))
            .collect();
        let text = format!(
            r#"{{"components": {{"state": {{{}}}}}}}"#,
            components.join(", ")
        );
        let mut layers = Layers::new(file(OVERLAID_EMPTY));
        layers
            .apply(LayerChange::Overlay {
                common: Some(patch(&text)),
                read: None,
            })
            .unwrap();
        assert_eq!(layers.laid(false).2.len(), 1_100, "each skip is news");
        let again = layers.laid(false).2;
        assert!(again.is_empty(), "{} warned about again", again.len());
        assert_eq!(layers.skipped.len(), 1_100, "the skips laid are kept");

        let other = r#"{"components": {"state": {"other": {"metadata": {"note": "x"}}}}}"#;
        layers
            .apply(LayerChange::Overlay {
                common: Some(patch(other)),
                read: None,
            })
            .unwrap();
        assert_eq!(layers.laid(false).2.len(), 1);
        assert!(
            layers.skipped.len() <= SKIPS_REMEMBERED,
            "{} skips remembered",
            layers.skipped.len()
        );
    }

    #[test]
    fn a_push_keeps_the_type_in_force_and_follows_the_files_scopes() {
        let s = ComponentKey::new("state", "s");
        let mut layers = Layers::new(file(
            r#"{"components": {"state": {"s": {"type": "redis", "scopes": ["lock/a"]}}}}"#,
        ));
        let untyped = ComponentPatch::default();
        layers
            .apply(LayerChange::Push(s.clone(), Push::Declare(untyped)))
            .unwrap();
        // A later file narrows the scopes and changes the type: the push
        // keeps the type it was given, the scopes follow the file.
        layers
            .apply(LayerChange::File(file(
                r#"{"components": {"state": {"s": {"type": "memory", "scopes": []}}}}"#,
            )))
            .unwrap();
        let (config, _) = layers.effective();
        assert_eq!(config.components[&s].type_name, "redis");
        assert_eq!(config.components[&s].scopes, Some(Vec::new()));
        // Released, the file says again what it is.
        layers.apply(LayerChange::Release(s.clone())).unwrap();
        assert_eq!(layers.effective().0.components[&s].type_name, "memory");
    }

    #[test]
    fn removing_or_releasing_what_is_not_there_is_refused() {
        let mut layers = Layers::new(file(r#"{"components": {"state": {"s": {}}}}"#));
        let ghost = ComponentKey::new("state", "ghost");
        assert!(layers
            .apply(LayerChange::Push(ghost.clone(), Push::Remove))
            .is_err());
        assert!(layers.apply(LayerChange::Release(ghost)).is_err());
        let s = ComponentKey::new("state", "s");
        assert!(layers
            .apply(LayerChange::Push(s.clone(), Push::Remove))
            .is_ok());
        assert!(layers.apply(LayerChange::Release(s)).is_ok());
    }

    #[test]
    fn an_amending_push_lays_its_fields_over_the_layers_below_and_a_second_over_the_first() {
        let s = ComponentKey::new("state", "s");
        let mut layers = Layers::new(file(
            r#"{"components": {"state": {"s": {"type": "redis",
                "metadata": {"redisHost": "a:6379", "redisDB": 3, "enableTLS": true},
                "secretRef": [{"store": "vault", "name": "redis", "key": "password", "injectAs": "redisPassword"}],
                "configurationRef": [{"store": "cfg", "key": "orders.host", "injectAs": "redisHost", "watch": true}]}}}}"#,
        ));
        let fields = |text: &str| patch(text).components[&s].clone();
        // Layotto's push: a new host, nothing else said.
        layers
            .apply(LayerChange::Push(
                s.clone(),
                Push::Amend(fields(
                    r#"{"components": {"state": {"s": {"metadata": {"redisHost": "dr:6379"}}}}}"#,
                )),
            ))
            .unwrap();
        let (config, sources) = layers.effective();
        let spec = &config.components[&s];
        assert_eq!(spec.type_name, "redis");
        assert_eq!(
            serde_json::Value::Object(spec.metadata.clone()),
            json!({"redisHost": "dr:6379", "redisDB": 3, "enableTLS": true}),
            "the file's other fields stay in force"
        );
        assert_eq!(spec.secret_refs.len(), 1, "the secretRef is kept");
        assert!(
            spec.configuration_refs.is_empty(),
            "the ref filling the pushed field gives way to the push"
        );
        assert_eq!(sources[&s].metadata["redisHost"], Layer::ControlPlane);
        assert_eq!(sources[&s].metadata["redisDB"], Layer::File);
        assert_eq!(sources[&s].type_name, Some(Layer::File));
        assert_eq!(sources[&s].refs, Some(Layer::File));

        // A second push lays its fields over the first's; a null removes.
        layers
            .apply(LayerChange::Push(
                s.clone(),
                Push::Amend(fields(
                    r#"{"components": {"state": {"s": {"metadata": {"redisDB": "4", "enableTLS": null}}}}}"#,
                )),
            ))
            .unwrap();
        let config = layers.effective_config();
        assert_eq!(
            serde_json::Value::Object(config.components[&s].metadata.clone()),
            json!({"redisHost": "dr:6379", "redisDB": "4"})
        );

        // The fields the push does not set follow the file.
        layers
            .apply(LayerChange::File(file(
                r#"{"components": {"state": {"s": {"type": "redis",
                    "metadata": {"redisHost": "a:6379", "redisDB": 3, "redisUsername": "shop"}}}}}"#,
            )))
            .unwrap();
        let config = layers.effective_config();
        assert_eq!(
            serde_json::Value::Object(config.components[&s].metadata.clone()),
            json!({"redisHost": "dr:6379", "redisDB": "4", "redisUsername": "shop"})
        );

        // Released, the file says again what the component is.
        layers.apply(LayerChange::Release(s.clone())).unwrap();
        assert_eq!(
            layers.effective_config().components[&s].metadata["redisHost"],
            "a:6379"
        );

        // Over a whole push, an amendment amends that push.
        layers
            .apply(LayerChange::Push(
                s.clone(),
                Push::Declare(fields(
                    r#"{"components": {"state": {"s": {"type": "memory", "metadata": {"a": 1}}}}}"#,
                )),
            ))
            .unwrap();
        layers
            .apply(LayerChange::Push(
                s.clone(),
                Push::Amend(fields(
                    r#"{"components": {"state": {"s": {"metadata": {"b": 2}}}}}"#,
                )),
            ))
            .unwrap();
        let config = layers.effective_config();
        assert_eq!(config.components[&s].type_name, "memory");
        assert_eq!(
            serde_json::Value::Object(config.components[&s].metadata.clone()),
            json!({"a": 1, "b": 2})
        );
    }

    #[test]
    fn an_amendment_of_a_component_not_in_force_or_of_nothing_is_refused() {
        let s = ComponentKey::new("state", "s");
        let mut layers = Layers::new(file(
            r#"{"components": {"state": {"s": {"type": "redis", "metadata": {"redisDB": 1}}}},
                "overlay": {"store": "cfg", "key": "rewire.components"}}"#,
        ));
        let amend = |field: &str| {
            let mut patch = ComponentPatch::default();
            patch.metadata.insert(field.into(), json!("2"));
            Push::Amend(patch)
        };
        let before = layers.clone();
        // Nothing declares it: refused, nothing stored (no component
        // whose type defaults to its name).
        let ghost = ComponentKey::new("state", "memory");
        let refused = layers
            .apply(LayerChange::Push(ghost.clone(), amend("a")))
            .expect_err("not declared");
        assert!(refused.to_string().contains("not found"), "{refused}");
        // An amendment that sets nothing is refused too, declared or not.
        for key in [&s, &ghost] {
            let empty = Push::Amend(ComponentPatch::default());
            let refused = layers
                .apply(LayerChange::Push(key.clone(), empty))
                .expect_err("sets nothing");
            assert!(refused.to_string().contains("metadata"), "{refused}");
        }
        assert_eq!(layers, before, "a refused amendment changes nothing");

        // Removed by a push: an amendment does not revive it.
        layers
            .apply(LayerChange::Push(s.clone(), Push::Remove))
            .unwrap();
        let removed = layers.clone();
        assert!(layers
            .apply(LayerChange::Push(s.clone(), amend("redisDB")))
            .is_err());
        assert_eq!(layers, removed);
        assert!(!layers.effective_config().components.contains_key(&s));

        // Released, the file declares it again and it can be amended.
        layers.apply(LayerChange::Release(s.clone())).unwrap();
        layers
            .apply(LayerChange::Push(s.clone(), amend("redisDB")))
            .unwrap();
        assert_eq!(
            layers.effective_config().components[&s].metadata["redisDB"],
            "2"
        );
        // One only an overlay declares is in force, so it can be amended.
        let o = ComponentKey::new("state", "o");
        layers
            .apply(LayerChange::Overlay {
                common: Some(patch(
                    r#"{"components": {"state": {"o": {"type": "memory"}}}}"#,
                )),
                read: None,
            })
            .unwrap();
        layers
            .apply(LayerChange::Push(o.clone(), amend("x")))
            .unwrap();
        assert_eq!(layers.effective_config().components[&o].type_name, "memory");
        // The overlay stops declaring it: the stored amendment does not
        // bring it back (typed `o` from its name, with the pushed field
        // alone).
        layers
            .apply(LayerChange::Overlay {
                common: None,
                read: None,
            })
            .unwrap();
        assert!(!layers.effective_config().components.contains_key(&o));
    }

    #[test]
    fn a_push_that_says_no_refs_keeps_the_refs_below_and_one_that_says_them_replaces_them() {
        let s = ComponentKey::new("state", "s");
        let mut layers = Layers::new(file(
            r#"{"components": {"state": {"s": {"type": "redis", "metadata": {"redisDB": 1},
                "secretRef": [{"store": "vault", "name": "redis", "key": "password", "injectAs": "redisPassword"}],
                "configurationRef": [{"store": "cfg", "key": "orders.host", "injectAs": "redisHost", "watch": true},
                                     {"store": "cfg", "key": "orders.db", "injectAs": "redisDB"}],
                "componentRef": [{"type": "lock", "name": "l"}]}}}}"#,
        ));
        // Layotto's push: metadata only, no word on refs.
        let unsaid = patch(r#"{"components": {"state": {"s": {"metadata": {"redisDB": "2"}}}}}"#)
            .components[&s]
            .clone();
        assert_eq!(unsaid.secret_refs, None);
        layers
            .apply(LayerChange::Push(s.clone(), Push::Declare(unsaid)))
            .unwrap();
        let (config, sources) = layers.effective();
        let spec = &config.components[&s];
        assert_eq!(spec.type_name, "redis");
        assert_eq!(
            serde_json::Value::Object(spec.metadata.clone()),
            json!({"redisDB": "2"})
        );
        assert_eq!(spec.secret_refs.len(), 1, "the secretRef is kept");
        assert_eq!(spec.secret_refs[0].inject_as, "redisPassword");
        assert_eq!(spec.component_refs.len(), 1, "the componentRef is kept");
        // The watched configurationRef is kept; the one filling the field
        // the push sets gives way to the push.
        let kept: Vec<_> = spec
            .configuration_refs
            .iter()
            .map(|r| (r.inject_as.as_str(), r.watch))
            .collect();
        assert_eq!(kept, vec![("redisHost", true)]);
        assert_eq!(sources[&s].refs, Some(Layer::File));
        assert_eq!(sources[&s].metadata["redisDB"], Layer::ControlPlane);

        // The refs follow the file: a later file's secretRef is the one in
        // force under the push.
        layers
            .apply(LayerChange::File(file(
                r#"{"components": {"state": {"s": {"type": "redis",
                    "secretRef": [{"store": "vault", "name": "redis2", "key": "password", "injectAs": "redisPassword"}]}}}}"#,
            )))
            .unwrap();
        let config = layers.effective_config();
        assert_eq!(config.components[&s].secret_refs[0].name, "redis2");
        assert!(config.components[&s].configuration_refs.is_empty());

        // A push that says its refs (rewire's own Lifecycle API says all
        // three, empty or not) declares them whole.
        let said = ComponentPatch {
            secret_refs: Some(Vec::new()),
            component_refs: Some(Vec::new()),
            configuration_refs: Some(Vec::new()),
            ..ComponentPatch::default()
        };
        layers
            .apply(LayerChange::Push(s.clone(), Push::Declare(said)))
            .unwrap();
        let (config, sources) = layers.effective();
        assert!(config.components[&s].secret_refs.is_empty());
        assert_eq!(sources[&s].refs, Some(Layer::ControlPlane));

        // A component pushed without refs that nothing below declares has
        // none.
        let new = ComponentKey::new("state", "new");
        layers
            .apply(LayerChange::Push(
                new.clone(),
                Push::Declare(ComponentPatch::default()),
            ))
            .unwrap();
        let config = layers.effective_config();
        assert!(config.components[&new].secret_refs.is_empty());
        assert!(config.components[&new].component_refs.is_empty());
    }

    /// `rewire apply`'s push, resolved inside the serialised reload: a
    /// file that added the component just before is amended (its
    /// secretRef kept), a component not in force is declared whole, and
    /// a type change declares the component whole.
    #[test]
    fn amend_or_declare_is_resolved_against_the_layers_it_is_laid_over() {
        let o = ComponentKey::new("state", "o");
        let mut layers = Layers::new(file(r#"{"components": {"state": {}}}"#));
        let host = |type_name: Option<&str>| {
            let mut patch = ComponentPatch {
                type_name: type_name.map(str::to_string),
                ..ComponentPatch::default()
            };
            patch.metadata.insert("redisHost".into(), json!("dr:6379"));
            Push::AmendOrDeclare(patch)
        };
        // The file reload adding `state/o` is laid first (queued before
        // the push, after the push was received).
        layers
            .apply(LayerChange::File(file(
                r#"{"components": {"state": {"o": {"type": "redis",
                    "metadata": {"redisHost": "a:6379", "redisDB": 3},
                    "secretRef": [{"store": "vault", "name": "redis", "key": "password", "injectAs": "redisPassword"}]}}}}"#,
            )))
            .unwrap();
        layers
            .apply(LayerChange::Push(o.clone(), host(None)))
            .unwrap();
        let (config, sources) = layers.effective();
        let spec = &config.components[&o];
        assert_eq!(spec.secret_refs.len(), 1, "the file's secretRef is kept");
        assert_eq!(
            serde_json::Value::Object(spec.metadata.clone()),
            json!({"redisHost": "dr:6379", "redisDB": 3})
        );
        assert_eq!(sources[&o].refs, Some(Layer::File));
        assert!(
            matches!(layers.pushes[&o], Push::Amend(_)),
            "stored resolved"
        );

        // The same type given: still an amendment.
        layers
            .apply(LayerChange::Push(o.clone(), host(Some("redis"))))
            .unwrap();
        assert_eq!(
            layers.effective_config().components[&o].secret_refs.len(),
            1
        );

        // Another type: the component is what the push gives, no more.
        layers
            .apply(LayerChange::Push(o.clone(), host(Some("memory"))))
            .unwrap();
        let spec = &layers.effective_config().components[&o];
        assert_eq!(spec.type_name, "memory");
        assert_eq!(
            serde_json::Value::Object(spec.metadata.clone()),
            json!({"redisHost": "dr:6379"})
        );
        assert!(spec.secret_refs.is_empty(), "{:?}", spec.secret_refs);

        // Not in force (removed by a file reload just before): declared
        // whole, its type from the push, no refs, and it stays when the
        // file declares it again.
        let missing = ComponentKey::new("state", "missing");
        layers
            .apply(LayerChange::Push(missing.clone(), host(Some("redis"))))
            .unwrap();
        layers
            .apply(LayerChange::File(file(
                r#"{"components": {"state": {"missing": {"type": "redis", "metadata": {"redisDB": 5},
                    "secretRef": [{"store": "vault", "name": "redis", "key": "password"}]}}}}"#,
            )))
            .unwrap();
        let spec = &layers.effective_config().components[&missing];
        assert_eq!(spec.type_name, "redis");
        assert_eq!(
            serde_json::Value::Object(spec.metadata.clone()),
            json!({"redisHost": "dr:6379"})
        );
        assert!(spec.secret_refs.is_empty(), "declared whole: no refs");

        // Removed by a push: declared whole again, not refused.
        layers
            .apply(LayerChange::Push(missing.clone(), Push::Remove))
            .unwrap();
        layers
            .apply(LayerChange::Push(missing.clone(), host(None)))
            .unwrap();
        assert_eq!(
            layers.effective_config().components[&missing].type_name,
            "missing",
            "no type given, nothing in force: typed by its name, as a whole push"
        );
    }
}
