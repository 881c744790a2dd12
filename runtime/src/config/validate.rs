//! Checking a parsed configuration against the registry and itself: types,
//! metadata, references and cycles, with every problem collected.

use std::collections::BTreeSet;

use super::model::{ComponentSpec, Config};
use crate::component::{ComponentKey, Kind};
use crate::config::{ConfigDiff, DependencyGraph};
use crate::metadata::MetadataError;
use crate::problem::{Problem, Problems};
use crate::registry::{ComponentDescriptor, Registry};

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
    // When what passed still holds, only the others are looked at.
    let to_check: Vec<&ComponentSpec> = match earlier {
        Some(earlier) if targets_hold => {
            let mut unpassed: Vec<&ComponentSpec> = earlier
                .unpassed()
                .filter_map(|key| config.components.get(key))
                .collect();
            unpassed.sort_by(|a, b| a.key.cmp(&b.key));
            unpassed
        }
        _ => config.components.values().collect(),
    };
    // Refused componentRefs, found while each component is in cache and
    // reported at the end unless the component turns out troubled.
    let mut refused: Vec<Problem> = Vec::new();
    for &spec in &to_check {
        if passed(&spec.key) {
            if !targets_hold {
                check_targets(&config, spec, broken, &mut problems);
            }
            continue;
        }
        let descriptor = registry.get(spec.key.kind.as_str(), &spec.type_name);
        if let Some(problem) = key_problem(&spec.key) {
            problems.push(problem);
        } else {
            check_component(&config, spec, descriptor, registry, broken, &mut problems);
        }
        refused.extend(refused_refs(spec, descriptor));
    }
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
    problems.0.extend(
        config
            .sections
            .resiliency
            .problems(config.components.keys()),
    );
    let mut in_cycles = BTreeSet::new();
    // The running graph is acyclic: only a new one is looked at.
    let graph = match earlier.and_then(|e| e.graph(&config)) {
        Some(graph) => graph,
        None => {
            let graph = DependencyGraph::build(&config);
            for cycle in graph.cycles() {
                in_cycles.extend(cycle.iter().cloned());
                let path: Vec<String> = cycle.iter().map(ComponentKey::to_string).collect();
                problems.push(Problem::component(
                    &cycle[0],
                    format!("reference cycle: {}", path.join(" -> ")),
                ));
            }
            graph
        }
    };
    if !refused.is_empty() {
        // A component that references one that did not parse is not judged
        // on that reference again, nor one with another problem or on a
        // cycle (those come first).
        let mut troubled = in_cycles;
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
    problems.into_result(ValidConfig { config, graph })
}

/// Offers `spec` its componentRefs as start-up will, so a ref no field
/// takes, or a required one missing, is found before start: the problem,
/// if any (worded as start-up words it, so validate and run agree).
fn refused_refs(spec: &ComponentSpec, descriptor: Option<&ComponentDescriptor>) -> Option<Problem> {
    let check_refs = descriptor?.check_refs?;
    let refs: Vec<ComponentKey> = spec.component_refs.iter().map(|r| r.key.clone()).collect();
    let refused = check_refs(&refs).err()?;
    let message = match refused.index {
        Some(i) => format!("componentRef[{i}]: {}", refused.error),
        None => refused.error.to_string(),
    };
    Some(Problem::component(&spec.key, message))
}

/// Checks one component: its injected fields, its type and metadata, and
/// its references (except to `broken` components).
fn check_component(
    config: &Config,
    spec: &ComponentSpec,
    descriptor: Option<&ComponentDescriptor>,
    registry: &Registry,
    broken: &BTreeSet<ComponentKey>,
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
    match descriptor {
        Some(descriptor) => {
            if let Err(err) = (descriptor.validate)(&spec.metadata, &injected_fields) {
                problems.push(Problem::component(key, metadata_message(spec, &err)));
            }
        }
        None => problems.push(Problem::component(key, unknown_type(registry, spec))),
    }
    check_targets(config, spec, broken, problems);
}

/// Checks what one component references is declared and admits it
/// (except `broken` components).
fn check_targets(
    config: &Config,
    spec: &ComponentSpec,
    broken: &BTreeSet<ComponentKey>,
    problems: &mut Problems,
) {
    let key = &spec.key;
    for (i, r) in spec.component_refs.iter().enumerate() {
        if &r.key == key {
            problems.push(Problem::component(
                key,
                format!("componentRef[{i}]: a component cannot reference itself"),
            ));
        } else if !broken.contains(&r.key) {
            check_target(
                config,
                key,
                || format!("componentRef[{i}]"),
                &r.key,
                problems,
            );
        }
    }
    for r in spec.injected_refs() {
        let target = r.store();
        if !broken.contains(&target) {
            check_target(config, key, || r.position(), &target, problems);
        }
    }
}

/// Names the ref when the unknown field is one a ref injects.
fn metadata_message(spec: &crate::config::ComponentSpec, err: &MetadataError) -> String {
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

/// What is wrong with a component's kind or name, if anything. The file's
/// loader checks names as it reads them; this catches what reaches
/// validation another way (a push), and what the loader lets through.
fn key_problem(key: &ComponentKey) -> Option<Problem> {
    if key
        .kind
        .as_str()
        .chars()
        .chain(key.name.chars())
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
    if key.name.is_empty() || key.name.contains('/') {
        return Some(Problem::component(
            key,
            "a component name must be non-empty and contain no `/`",
        ));
    }
    None
}

fn unknown_type(registry: &Registry, spec: &crate::config::ComponentSpec) -> String {
    let (kind, type_name) = (&spec.key.kind, &spec.type_name);
    let known = registry.types_of(kind.as_str());
    // `type` defaults to the name: say so when that may be what happened.
    let defaulted = if *type_name == spec.key.name {
        "; `type` defaults to the component's name"
    } else {
        ""
    };
    match (type_name.is_empty(), known.is_empty()) {
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
    }
}

/// Checks that `user` may reference `target`; `at` names the ref (worked
/// out only for a problem).
fn check_target(
    config: &Config,
    user: &ComponentKey,
    at: impl Fn() -> String,
    target: &ComponentKey,
    problems: &mut Problems,
) {
    if let Some(spec) = config.components.get(target) {
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
    let at = at();
    let elsewhere: Vec<String> = config
        .components
        .keys()
        .filter(|k| k.name == target.name)
        .map(ComponentKey::to_string)
        .collect();
    // The same name under another kind is the likelier slip: say that alone.
    let message = if elsewhere.is_empty() {
        let hint = closest_of_kind(config, target)
            .map(|close| format!(" (did you mean `{close}`?)"))
            .unwrap_or_default();
        format!("{at}: references `{target}`, which is not declared{hint}")
    } else {
        format!(
            "{at}: references `{target}`, which is not declared; `{}` is, but it is not a {}",
            elsewhere.join("`, `"),
            target.kind
        )
    };
    problems.push(Problem::component(user, message));
}

/// The declared component of `target`'s kind whose name is closest to
/// `target`'s, if one is close enough to be a likely misspelling (the same
/// measure and threshold as metadata's did-you-mean).
fn closest_of_kind<'a>(config: &'a Config, target: &ComponentKey) -> Option<&'a ComponentKey> {
    let wanted = target.name.to_lowercase();
    config
        .components
        .keys()
        .filter(|k| k.kind == target.kind && k.name != target.name)
        .map(|k| (strsim::jaro_winkler(&wanted, &k.name.to_lowercase()), k))
        .filter(|(score, _)| *score > 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, k)| k)
}

#[cfg(test)]
mod tests;
