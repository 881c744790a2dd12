//! Checking a parsed configuration against the registry and itself: types,
//! metadata, references and cycles, with every problem collected.

use std::collections::BTreeSet;

use super::model::{ComponentSpec, Config};
use crate::component::{ComponentKey, Kind};
use crate::config::{ConfigDiff, DependencyGraph};
use crate::metadata::MetadataError;
use crate::problem::{Problem, Problems};
use crate::registry::{ComponentDescriptor, Registry};
use declared::Declared;
use undeclared::Undeclared;

/// A configuration that passed validation, with its dependency graph.
#[derive(Debug, Clone)]
pub struct ValidConfig {
    /// The configuration.
    pub config: Config,
    /// Its dependency graph (acyclic).
    pub graph: DependencyGraph,
}

/// Validates a configuration built in code (or [`parse`](super::parse)d)
/// against `registry`: every problem is collected. A document is better
/// read with [`ValidConfig::from_slice`], which also reports the problems
/// of the components that did not parse.
pub fn validate(config: Config, registry: &Registry) -> Result<ValidConfig, Problems> {
    validate_declared(config, registry, &BTreeSet::new())
}

/// [`validate`], where `broken` are components the document declares but
/// that did not parse (already reported): references to them are not
/// reported again.
pub(crate) fn validate_declared(
    config: Config,
    registry: &Registry,
    broken: &BTreeSet<ComponentKey>,
) -> Result<ValidConfig, Problems> {
    validate_against(config, registry, broken, None)
}

/// [`validate`] of a reload's candidate, `diff` from the `running`
/// configuration (which passed against the same registry): a component
/// declared exactly as before is not checked again, only what it
/// references when a target went or changed its scopes, and the running
/// graph is kept when no component was added, removed, retyped or
/// re-referenced. A one-component change costs in proportion to it.
pub(crate) fn validate_reload(
    config: Config,
    registry: &Registry,
    running: &ValidConfig,
    diff: &ConfigDiff,
) -> Result<ValidConfig, Problems> {
    let earlier = Earlier { running, diff };
    validate_against(config, registry, &BTreeSet::new(), Some(earlier))
}

impl ValidConfig {
    /// Validates `candidate` as a reload from this configuration does: a
    /// component declared exactly as here passed already (against the same
    /// `registry`) and is not checked again, only what it references when a
    /// target went or changed its scopes. The outcome is [`validate`]'s;
    /// the cost is in proportion to the change (and a diff by digests).
    pub fn validate_next(&self, candidate: Config, registry: &Registry) -> Result<Self, Problems> {
        let diff = ConfigDiff::for_reload(&self.config, &candidate);
        validate_reload(candidate, registry, self, &diff)
    }
}

/// The configuration a candidate was diffed from, which passed.
#[derive(Clone, Copy)]
struct Earlier<'a> {
    running: &'a ValidConfig,
    diff: &'a ConfigDiff,
}

impl Earlier<'_> {
    /// Whether `key` is declared exactly as when it passed.
    fn passed(&self, key: &ComponentKey) -> bool {
        self.diff.is_identical(key)
    }

    /// The declarations of `key` before and now, for a key in both.
    fn both<'c>(
        &'c self,
        key: &ComponentKey,
        config: &'c Config,
    ) -> Option<(&'c ComponentSpec, &'c ComponentSpec)> {
        Some((
            self.running.config.components.get(key)?,
            config.components.get(key)?,
        ))
    }

    /// The keys not declared exactly as before (added or redeclared).
    fn unpassed(&self) -> impl Iterator<Item = &ComponentKey> {
        self.diff.added.iter().chain(self.redeclared())
    }

    /// The keys in both whose declaration changed in any way.
    fn redeclared(&self) -> impl Iterator<Item = &ComponentKey> {
        self.diff.changed.keys().chain(&self.diff.rewritten)
    }

    /// Whether every component is still there and admits the same users:
    /// then the references of a component declared as before still hold.
    fn targets_hold(&self, config: &Config) -> bool {
        self.diff.removed.is_empty()
            && self.redeclared().all(|key| {
                self.both(key, config)
                    .is_some_and(|(old, new)| old.scopes == new.scopes)
            })
    }

    /// The running graph, when it is this configuration's too.
    fn graph(&self, config: &Config) -> Option<DependencyGraph> {
        let same = self.diff.added.is_empty()
            && self.diff.removed.is_empty()
            && self.redeclared().all(|key| {
                self.both(key, config).is_some_and(|(old, new)| {
                    old.type_name == new.type_name && old.dependencies() == new.dependencies()
                })
            });
        same.then(|| self.running.graph.clone())
    }
}

fn validate_against(
    config: Config,
    registry: &Registry,
    broken: &BTreeSet<ComponentKey>,
    earlier: Option<Earlier<'_>>,
) -> Result<ValidConfig, Problems> {
    let mut problems = Problems::default();
    let passed = |key: &ComponentKey| earlier.is_some_and(|e| e.passed(key));
    let targets_hold = earlier.is_some_and(|e| e.targets_hold(&config));
    let kept_graph = earlier.and_then(|e| e.graph(&config));
    let checks = Checks {
        registry,
        broken,
        passed: &passed,
        undeclared: Undeclared::new(&config),
    };
    // Refused componentRefs, found while each component is in cache and
    // reported at the end unless the component turns out troubled.
    let mut refused: Vec<Problem> = Vec::new();
    let (graph, fresh) = match earlier {
        // What passed still holds: only the others are looked at.
        Some(earlier) if targets_hold => {
            let mut unpassed: Vec<&ComponentSpec> = earlier
                .unpassed()
                .filter_map(|key| config.components.get(key).map(|spec| &**spec))
                .collect();
            unpassed.sort_by(|a, b| a.key.cmp(&b.key));
            let declared = Declared::looked_up(&config);
            for (node, spec) in unpassed.into_iter().enumerate() {
                checks.check(&declared, node, spec, &mut problems, &mut refused);
            }
            match kept_graph {
                Some(running) => (running, false),
                None => (DependencyGraph::build(&config), true),
            }
        }
        // Everything is checked against the running graph, which fits.
        _ if kept_graph.is_some() => {
            let declared = Declared::looked_up(&config);
            for (node, spec) in config.components.values().enumerate() {
                checks.check(&declared, node, spec, &mut problems, &mut refused);
            }
            (kept_graph.unwrap_or_default(), false)
        }
        // Everything is checked while the new graph is built (acyclic once
        // its cycles are reported).
        _ => (
            checks.check_building(&config, &mut problems, &mut refused),
            true,
        ),
    };
    check_sections(&config, broken, &mut problems);
    let in_cycles = if fresh {
        report_cycles(&graph, &mut problems)
    } else {
        BTreeSet::new()
    };
    if !refused.is_empty() {
        report_refused(&config, broken, refused, in_cycles, &mut problems);
    }
    problems.into_result(ValidConfig { config, graph })
}

/// The checks of each component, and what they are made against.
struct Checks<'a> {
    registry: &'a Registry,
    /// Components declared but not parsed (already reported).
    broken: &'a BTreeSet<ComponentKey>,
    /// Whether a component is declared exactly as when it passed before.
    passed: &'a dyn Fn(&ComponentKey) -> bool,
    /// Words the references to components not declared.
    undeclared: Undeclared<'a>,
}

impl Checks<'_> {
    /// Checks `spec`, checked `node`-th: what it is on its own (unless it
    /// passed before), then what it references.
    fn check(
        &self,
        declared: &Declared<'_>,
        node: usize,
        spec: &ComponentSpec,
        problems: &mut Problems,
        refused: &mut Vec<Problem>,
    ) {
        if self.check_alone(spec, problems, refused) {
            check_targets(declared, node, spec, self, problems);
        }
    }

    /// Checks every component of `config` and builds its graph: what each
    /// component is on its own is checked in the graph's pass over the
    /// declarations (each is fetched once, where two passes fetch it twice
    /// once the configuration outgrows the cache), what it references in a
    /// pass over the graph's dense tables. Problems come out in the order
    /// [`check`](Self::check) gives them.
    fn check_building(
        &self,
        config: &Config,
        problems: &mut Problems,
        refused: &mut Vec<Problem>,
    ) -> DependencyGraph {
        let mut specs: Vec<&ComponentSpec> = Vec::with_capacity(config.components.len());
        // Whether each node admits every user (declares no scopes).
        let mut open: Vec<bool> = Vec::with_capacity(config.components.len());
        // The problems of components with any, and whether their targets
        // are to be checked too, by node.
        let mut alone: Vec<(usize, Problems, bool)> = Vec::new();
        let (graph, resolved) = DependencyGraph::build_visiting(config, |node, spec| {
            specs.push(spec);
            open.push(spec.scopes.is_none());
            let mut found = Problems::default();
            let check_targets = self.check_alone(spec, &mut found, refused);
            if !found.is_empty() || !check_targets {
                alone.push((node, found, check_targets));
            }
        });
        let declared = Declared::by_node(config, &graph, &specs, &open, &resolved);
        let mut alone = alone.into_iter().peekable();
        for (node, &spec) in specs.iter().enumerate() {
            let check = match alone.next_if(|(at, ..)| *at == node) {
                Some((_, found, check_targets)) => {
                    problems.0.extend(found.0);
                    check_targets
                }
                None => true,
            };
            // A component whose every reference found another component
            // open to all has nothing to report: its declaration is not
            // read again.
            if check && !declared.targets_open(node) {
                check_targets(&declared, node, spec, self, problems);
            }
        }
        graph
    }

    /// Checks what `spec` is on its own, unless it passed before: its key,
    /// type, metadata and injected fields; the componentRefs its type
    /// refuses go to `refused` (not when its key is malformed: that is its
    /// one problem). Whether its targets are to be checked too (not when
    /// its key is malformed).
    fn check_alone(
        &self,
        spec: &ComponentSpec,
        problems: &mut Problems,
        refused: &mut Vec<Problem>,
    ) -> bool {
        if (self.passed)(&spec.key) {
            return true;
        }
        let descriptor = self.registry.get(spec.key.kind.as_str(), &spec.type_name);
        match key_problem(&spec.key, &spec.key.name) {
            // Its key is its one problem: one naming it whole (a refused
            // ref's) would show a name too long whole.
            Some(problem) => {
                problems.push(problem);
                false
            }
            None => {
                check_component(spec, descriptor, self.registry, problems);
                refused.extend(refused_refs(spec, descriptor));
                true
            }
        }
    }
}

/// Checks what the top-level sections name: the overlay's store, the
/// subscriptions' pub/subs, the resiliency targets and the secret scopes'
/// stores.
fn check_sections(config: &Config, broken: &BTreeSet<ComponentKey>, problems: &mut Problems) {
    if let Some(overlay) = &config.overlay {
        if !config
            .components
            .contains_key(&ComponentKey::new(Kind::ConfigStore, &overlay.store))
        {
            problems.push(Problem::file(format!(
                "overlay.store: no config store named `{}`",
                overlay.store
            )));
        }
    }
    // Subscriptions name pub/sub components only.
    if !config.sections.subscriptions.0.is_empty() {
        let pubsubs: BTreeSet<ComponentKey> = config
            .components
            .keys()
            .chain(broken)
            .filter(|key| key.kind == Kind::PubSub)
            .cloned()
            .collect();
        problems
            .0
            .extend(config.sections.subscriptions.check_pubsubs(&pubsubs));
    }
    problems.0.extend(
        config
            .sections
            .resiliency
            .problems(config.components.keys()),
    );
    problems.0.extend(
        config
            .sections
            .secrets
            .problems(config.components.keys().chain(broken)),
    );
}

/// Reports each cycle of a new graph: the components on one.
fn report_cycles(graph: &DependencyGraph, problems: &mut Problems) -> BTreeSet<ComponentKey> {
    let mut in_cycles = BTreeSet::new();
    for cycle in graph.cycles() {
        in_cycles.extend(cycle.iter().cloned());
        let path: Vec<String> = cycle.iter().map(ComponentKey::to_string).collect();
        problems.push(Problem::component(
            &cycle[0],
            format!("reference cycle: {}", path.join(" -> ")),
        ));
    }
    in_cycles
}

/// Reports the `refused` componentRefs, but not of a component that
/// references one that did not parse, has another problem or is on a
/// cycle (those come first).
fn report_refused(
    config: &Config,
    broken: &BTreeSet<ComponentKey>,
    refused: Vec<Problem>,
    mut troubled: BTreeSet<ComponentKey>,
    problems: &mut Problems,
) {
    troubled.extend(
        config
            .components
            .values()
            .filter(|spec| spec.component_refs.iter().any(|r| broken.contains(&r.key)))
            .map(|spec| spec.key.clone()),
    );
    troubled.extend(problems.iter().filter_map(|p| p.component.clone()));
    problems.0.extend(refused.into_iter().filter(|p| {
        p.component
            .as_ref()
            .is_none_or(|key| !troubled.contains(key))
    }));
}

/// Offers `spec` its componentRefs as start-up will, so a ref no field
/// takes, or a required one missing, is found before start: the problem,
/// if any (worded as start-up words it, so validate and run agree). The
/// check runs the component's own code (its `Default`, its
/// `check_injected`): a panic there is this component's problem, not the
/// end of the validation (nor of the reload running it).
fn refused_refs(spec: &ComponentSpec, descriptor: Option<&ComponentDescriptor>) -> Option<Problem> {
    let check_refs = descriptor?.check_refs?;
    let checked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        check_refs(&mut spec.component_refs.iter().map(|r| &r.key))
    }));
    let refused = match checked {
        Ok(checked) => checked.err()?,
        Err(payload) => {
            let message = crate::guarded::panic_message(payload.as_ref());
            return Some(Problem::component(
                &spec.key,
                secret_values::refs_panic_problem(message),
            ));
        }
    };
    let message = match refused.index {
        Some(i) => format!("componentRef[{i}]: {}", refused.error),
        None => refused.error.to_string(),
    };
    Some(Problem::component(&spec.key, message))
}

/// Checks one component's injected fields, type and metadata.
fn check_component(
    spec: &ComponentSpec,
    descriptor: Option<&ComponentDescriptor>,
    registry: &Registry,
    problems: &mut Problems,
) {
    let key = &spec.key;
    let injected_fields = spec.injected_fields();
    let mut injected = BTreeSet::new();
    for field in &injected_fields {
        if !injected.insert(field) {
            problems.push(Problem::component(
                key,
                format!("metadata field `{field}` is injected by more than one secretRef/configurationRef"),
            ));
        }
    }
    report_repeated_refs(spec, problems);
    if let Some(too_many) = crate::redact::too_many_secret_values(&spec.metadata) {
        problems.push(Problem::component(key, too_many));
    }
    if let Some(descriptions) = registry.submitted_twice(key.kind.as_str(), &spec.type_name) {
        let origins = registry
            .submitted_twice_at(key.kind.as_str(), &spec.type_name)
            .unwrap_or_default();
        problems.push(Problem::component(
            key,
            submitted_twice(spec, descriptions, origins),
        ));
        return;
    }
    match descriptor {
        Some(descriptor) => {
            // The check runs the component's own `Deserialize` (a
            // `deserialize_with`, a `TryFrom`): a panic there is this
            // component's problem, not the end of the validation.
            let checked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                (descriptor.validate)(&spec.metadata, &injected_fields)
            }));
            match checked {
                Ok(Ok(())) => {}
                Ok(Err(err)) => {
                    problems.push(Problem::component(key, metadata_message(spec, &err)));
                }
                Err(payload) => problems.push(Problem::component(
                    key,
                    secret_values::panic_problem(
                        spec,
                        crate::guarded::panic_message(payload.as_ref()),
                    ),
                )),
            }
        }
        None => problems.push(Problem::component(key, unknown_type(registry, spec))),
    }
}

/// Reports a componentRef naming a component an earlier one already
/// names: each `#[inject]` field takes one ref, so the second would
/// silently fill another field of that kind (or none: an error at start).
/// Checked with the declaration alone, not with its targets: a component
/// whose targets are all open skips those checks.
fn report_repeated_refs(spec: &ComponentSpec, problems: &mut Problems) {
    if spec.component_refs.len() < 2 {
        return;
    }
    let mut first_at = std::collections::BTreeMap::new();
    for (i, r) in spec.component_refs.iter().enumerate() {
        let first = *first_at.entry(&r.key).or_insert(i);
        if first != i {
            problems.push(Problem::component(
                &spec.key,
                format!(
                    "componentRef[{i}]: references `{}` again (componentRef[{first}])",
                    r.key
                ),
            ));
        }
    }
}

/// Checks what one component references is declared and admits it
/// (except the `checks`' broken components).
fn check_targets(
    declared: &Declared<'_>,
    node: usize,
    spec: &ComponentSpec,
    checks: &Checks<'_>,
    problems: &mut Problems,
) {
    let key = &spec.key;
    let (broken, undeclared) = (checks.broken, &checks.undeclared);
    for (i, r) in spec.component_refs.iter().enumerate() {
        let target = declared.target(node, i, &r.key);
        // The one declaration of this key is this one.
        if target.is_some_and(|target| std::ptr::eq(target, spec)) {
            problems.push(Problem::component(
                key,
                format!("componentRef[{i}]: a component cannot reference itself"),
            ));
        } else if !broken.contains(&r.key) {
            let at = || format!("componentRef[{i}]");
            check_target(undeclared, key, at, &r.key, target, problems);
        }
    }
    let injected_from = spec.component_refs.len();
    for (i, r) in spec.injected_refs().enumerate() {
        let store = r.store();
        if !broken.contains(&store) {
            let target = declared.target(node, injected_from + i, &store);
            check_target(undeclared, key, || r.position(), &store, target, problems);
        }
    }
}

/// Names the ref when the unknown field is one a ref injects; never quotes
/// the value of a secret field ([`secret_values`]).
fn metadata_message(spec: &crate::config::ComponentSpec, err: &MetadataError) -> String {
    if let Some(hidden) = secret_values::hiding_secret_value(spec, err) {
        return hidden;
    }
    let MetadataError::UnknownField { field, known, .. } = err else {
        return err.to_string();
    };
    let injected_by = spec
        .injected_refs()
        .find(|r| r.inject_as() == field)
        .map(|r| r.position());
    match injected_by {
        Some(at) => format!(
            "{at}: injects metadata field `{field}`, which this component does not have (set `injectAs`; known fields: {})",
            if known.is_empty() { "none".to_string() } else { known.join(", ") }
        ),
        None => err.to_string(),
    }
}

/// What is wrong with a component's kind or name, if anything (`name` is
/// the key's, read from wherever it is in cache). The file's loader
/// checks names as it reads them; this catches what reaches validation
/// another way (a push), and what the loader lets through.
fn key_problem(key: &ComponentKey, name: &str) -> Option<Problem> {
    // First: every later problem shows the name whole, which may be
    // megabytes (with a newline or a `/` in it).
    if name.len() > MAX_NAME_BYTES {
        // Only a cut of the name is shown. A file-level problem: its
        // component's key would be shown whole (its control characters
        // escaped by the problem's display).
        return Some(Problem::file(format!(
            "{}/{}: name: a component name must be at most {MAX_NAME_BYTES} bytes (as a Kubernetes object's), not {}",
            cut(key.kind.as_str()),
            cut(name),
            name.len()
        )));
    }
    if key
        .kind
        .as_str()
        .chars()
        .chain(name.chars())
        .any(char::is_control)
    {
        // Shown escaped: a raw newline would split the problem's line.
        return Some(Problem::file(format!(
            "{}/{}: a component kind or name must not contain control characters (such as a newline)",
            key.kind.as_str().escape_debug(),
            key.name.escape_debug()
        )));
    }
    if key.kind.as_str().trim().is_empty() {
        return Some(Problem::component(
            key,
            "a component kind must not be blank",
        ));
    }
    if name.is_empty() || name.contains('/') {
        return Some(Problem::component(
            key,
            "a component name must be non-empty and contain no `/`",
        ));
    }
    None
}

/// The longest component name, in bytes: a Kubernetes object name's bound
/// (DNS-1123 subdomain), which Dapr's component names are. A name is
/// written into every status, metric label, log line and span about its
/// component: a longer one would make each of them as large.
pub(crate) const MAX_NAME_BYTES: usize = 253;

/// How much of a kind or name a problem shows of one too long.
const SHOWN_BYTES: usize = 32;

/// `text`'s first [`SHOWN_BYTES`] (at a character boundary), then `…`,
/// when it is longer.
fn cut(text: &str) -> String {
    if text.len() <= SHOWN_BYTES {
        return text.to_string();
    }
    let mut end = SHOWN_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// A type two linked crates (or two derives) register: which one serves
/// would depend on link order. Each submission is named by the struct that
/// declared it, when known, and its description.
fn submitted_twice(
    spec: &ComponentSpec,
    descriptions: &[&str],
    origins: &[Option<&str>],
) -> String {
    let each = descriptions
        .iter()
        .enumerate()
        .map(
            |(i, d)| match (origins.get(i).copied().flatten(), d.is_empty()) {
                (Some(origin), true) => format!("`{origin}`"),
                (Some(origin), false) => format!("`{origin}` \"{d}\""),
                (None, true) => "(no description)".to_string(),
                (None, false) => format!("\"{d}\""),
            },
        )
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "type `{}` of kind `{}` is registered {} times in this binary ({each}): which one would serve depends on link order; give one another name (`#[component(type = \"…\")]`)",
        spec.type_name,
        spec.key.kind,
        descriptions.len()
    )
}

fn unknown_type(registry: &Registry, spec: &crate::config::ComponentSpec) -> String {
    let (kind, type_name) = (&spec.key.kind, &spec.type_name);
    let known = registry.types_of(kind.as_str());
    // `type` defaults to the name: say so when that may be what happened.
    let defaulted = if **type_name == *spec.key.name {
        "; `type` defaults to the component's name"
    } else {
        ""
    };
    let elsewhere = elsewhere(registry, spec);
    let message = match (type_name.is_empty(), known.is_empty()) {
        (true, true) => {
            format!("`type` is empty: no component types are registered for kind `{kind}`")
        }
        (true, false) => format!(
            "`type` is empty (registered for kind `{kind}`: {})",
            known.join(", ")
        ),
        (false, true) => format!(
            "unknown type `{type_name}`: no component types are registered for kind `{kind}`"
        ),
        (false, false) => format!(
            "unknown type `{type_name}` for kind `{kind}` (registered: {}{defaulted})",
            known.join(", ")
        ),
    };
    message + &elsewhere
}

/// Where an unknown type is registered instead, when that is under a
/// custom kind: most likely a misspelled kind (`state_store` for `state`)
/// in the type's `#[component(kind = ...)]` or in this configuration.
/// Built-in kinds are left out: many types (`memory`) serve several.
fn elsewhere(registry: &Registry, spec: &ComponentSpec) -> String {
    let (kind, type_name) = (&spec.key.kind, &spec.type_name);
    if type_name.is_empty() {
        return String::new();
    }
    let custom: Vec<String> = registry
        .other_kinds_of(kind.as_str(), type_name)
        .into_iter()
        .filter(|other| !Kind::BUILT_IN.iter().any(|k| k.as_str() == *other))
        .map(|other| format!("`{other}`"))
        .collect();
    if custom.is_empty() {
        return String::new();
    }
    let (kinds, them) = match custom.len() {
        1 => ("kind", "it"),
        _ => ("kinds", "one"),
    };
    format!(
        "; `{type_name}` is registered under {kinds} {}, not `{kind}`: declare the component under {them}, or, if the type is meant to serve `{kind}`, correct its `#[component(kind = ...)]`",
        custom.join(", ")
    )
}

/// Checks that `user` may reference `target`, declared as `found`; `at`
/// names the ref (worked out only for a problem).
fn check_target(
    undeclared: &Undeclared<'_>,
    user: &ComponentKey,
    at: impl Fn() -> String,
    target: &ComponentKey,
    found: Option<&ComponentSpec>,
    problems: &mut Problems,
) {
    if let Some(spec) = found {
        if !spec.allows(user) {
            let at = at();
            let scopes: Vec<String> = spec
                .scopes
                .iter()
                .flatten()
                .map(ComponentKey::to_string)
                .collect();
            let allowed = if scopes.is_empty() {
                "none".to_string()
            } else {
                scopes.join(", ")
            };
            problems.push(Problem::component(
                user,
                format!("{at}: `{target}` may not be referenced by `{user}` (its scopes allow: {allowed})"),
            ));
        }
        return;
    }
    let message = undeclared.message(&at(), target);
    problems.push(Problem::component(user, message));
}

mod declared;
mod secret_values;
#[cfg(test)]
mod tests;
mod undeclared;
