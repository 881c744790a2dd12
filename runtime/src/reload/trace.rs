//! A reload as a trace of its own: a root span `rewire.reload` (its
//! trigger, attempt, outcome and generation as attributes) that starts once
//! the reload has its turn (`rewire.queued_ms`: how long it waited behind
//! the reload before it, which the span's duration leaves out), with one child
//! `rewire.component` per component action — `kept`, `in_place`,
//! `rebuilt`, `added`, `removed`, `failed`, `rolled_back` — whose duration
//! is the work done for it (init and readiness of a new instance). A
//! reload rolled back or rejected, and each component that failed, has the
//! span status `ERROR` with the (scrubbed) reason. Above
//! [`KEPT_SPANS_LIMIT`] kept components, the kept ones are only counted
//! (`rewire.kept` on the root span), not given a span each.
//!
//! The root span links to the span that caused the reload (a push's
//! `rewire.api` span; for a retry, the attempt that rolled back before
//! it, and so back to the first): `follows_from`, which OpenTelemetry
//! exports as a span link. The components a watched value forced are
//! named on it (`rewire.forced`, the first [`FORCED_NAMES_LIMIT`]).
//!
//! Spans are plain `tracing` spans: the sidecar exports them over OTLP when
//! tracing is configured; without a subscriber that wants them they cost a
//! disabled-callsite check. Attributes are names, kinds and types only,
//! never metadata values.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use tracing::field::Empty;
use tracing::Span;

use super::actions::Action;
use super::history::{Outcome, ReloadRecord, Trigger};
use crate::component::ComponentKey;

/// The root span of one reload: a new trace, whatever span is current.
pub(super) fn reload_span(trigger: &Trigger, attempt: u32) -> Span {
    tracing::info_span!(
        parent: None,
        "rewire.reload",
        rewire.trigger = %trigger,
        rewire.attempt = attempt,
        rewire.outcome = Empty,
        rewire.generation = Empty,
        rewire.queued_ms = Empty,
        rewire.kept = Empty,
        rewire.forced = Empty,
        otel.status_code = Empty,
        otel.status_description = Empty,
    )
}

/// Links the reload span `span` to the span that caused the reload,
/// `cause` (still open: a closed span can no longer be linked to).
pub(super) fn link_cause(span: &Span, cause: Option<&Span>) {
    if let Some(cause) = cause {
        span.follows_from(cause);
    }
}

/// At most this many forced components are named on a reload span; the
/// others are counted (`… and N more`).
pub(super) const FORCED_NAMES_LIMIT: usize = 32;

/// Records on the reload span `span` the components `forced` into the
/// reload (`kind/name`, names only), when there are any: the first
/// [`FORCED_NAMES_LIMIT`], then how many more.
pub(super) fn record_forced(span: &Span, forced: &BTreeSet<ComponentKey>) {
    let count = forced.len();
    if count == 0 || span.is_disabled() {
        return;
    }
    let mut names: Vec<String> = forced
        .iter()
        .take(FORCED_NAMES_LIMIT)
        .map(ToString::to_string)
        .collect();
    if count > FORCED_NAMES_LIMIT {
        names.push(format!("… and {} more", count - FORCED_NAMES_LIMIT));
    }
    span.record("rewire.forced", names.join(", "));
}

/// Records how the reload `record` ended on its root span `span`: a
/// reload rolled back or rejected is an error, with the record's
/// (scrubbed) error as the status message.
pub(super) fn record_ending(span: &Span, record: &ReloadRecord) {
    span.record("rewire.outcome", outcome_name(record.outcome));
    span.record("rewire.generation", record.generation);
    // An applied reload with an error: a component's update failed after
    // the commit (see `put_back`).
    if matches!(record.outcome, Outcome::RolledBack | Outcome::Rejected) || record.error.is_some() {
        record_error(span, record.error.as_deref().unwrap_or_default());
    }
}

/// Records on the reload span `span` how long the reload waited for the
/// one before it to end (`queued`).
pub(super) fn record_queued(span: &Span, queued: Duration) {
    span.record(
        "rewire.queued_ms",
        u64::try_from(queued.as_millis()).unwrap_or(u64::MAX),
    );
}

/// Records on the reload span `span` that the reload was refused, the
/// sidecar shutting down (`rewire.outcome` `stopped`, not an error:
/// nothing was tried), with the `generation` still serving.
pub(super) fn record_stopped(span: &Span, generation: u64) {
    span.record("rewire.outcome", "stopped");
    span.record("rewire.generation", generation);
}

/// Marks `span` as an error, with `message` (already scrubbed).
fn record_error(span: &Span, message: &str) {
    span.record("otel.status_code", "ERROR");
    span.record("otel.status_description", message);
}

/// A child of the current reload span for the action on `key`.
pub(super) fn component_span(key: &ComponentKey, type_name: &str) -> Span {
    tracing::info_span!(
        "rewire.component",
        rewire.component = %key,
        rewire.kind = key.kind.as_str(),
        rewire.type = type_name,
        rewire.action = Empty,
        rewire.init_ms = Empty,
        otel.status_code = Empty,
        otel.status_description = Empty,
    )
}

/// Records on `span` the action taken (or `failed`) and the time it took
/// since `started`.
pub(super) fn record_action(span: &Span, action: Action, started: Instant) {
    span.record("rewire.action", action_name(action));
    span.record(
        "rewire.init_ms",
        u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
    );
}

/// From this many kept components on, a reload gives them no span each:
/// `rewire.kept` on the root span counts them (a reload of one component
/// among thousands would otherwise flood the export queue).
pub(super) const KEPT_SPANS_LIMIT: usize = 256;

/// Records on `span` that the component failed (`message`, already
/// scrubbed), and the time it took since `started`.
pub(super) fn record_failed(span: &Span, message: &str, started: Instant) {
    record_action(span, Action::Failed, started);
    record_error(span, message);
}

/// Counts the `count` components of `kept` (key and type) on the current
/// (reload) span, and gives each a `kept` span when there are no more than
/// [`KEPT_SPANS_LIMIT`]; nothing at all when the reload span is not
/// recorded (tracing off): a large running set is not walked for nothing.
pub(super) fn instant_kept<'a>(
    count: usize,
    kept: impl Iterator<Item = (&'a ComponentKey, &'a str)>,
) {
    let reload = Span::current();
    if reload.is_disabled() {
        return;
    }
    reload.record("rewire.kept", u64::try_from(count).unwrap_or(u64::MAX));
    if count > KEPT_SPANS_LIMIT {
        return;
    }
    for (key, type_name) in kept {
        instant_action(key, type_name, Action::Unchanged);
    }
}

/// A span for an action that did no work (`kept`, `removed`).
pub(super) fn instant_action(key: &ComponentKey, type_name: &str, action: Action) {
    let span = component_span(key, type_name);
    span.record("rewire.action", action_name(action));
    span.record("rewire.init_ms", 0_u64);
}

/// The span of undoing `key`'s step after a failed transaction.
pub(super) fn rolled_back_span(key: &ComponentKey, type_name: &str) -> Span {
    let span = component_span(key, type_name);
    span.record("rewire.action", "rolled_back");
    span
}

/// The attribute value of `action`.
pub(super) fn action_name(action: Action) -> &'static str {
    match action {
        Action::Unchanged => "kept",
        Action::UpdatedInPlace => "in_place",
        Action::Rebuilt => "rebuilt",
        Action::Added => "added",
        Action::Removed => "removed",
        Action::Failed => "failed",
    }
}

fn outcome_name(outcome: Outcome) -> &'static str {
    match outcome {
        Outcome::Applied => "applied",
        Outcome::NoChange => "no_change",
        Outcome::Rejected => "rejected",
        Outcome::RolledBack => "rolled_back",
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use tracing::span::{Attributes, Id, Record};
    use tracing::subscriber::Interest;
    use tracing::{Event, Metadata, Subscriber};

    use super::super::{ReloadRequest, ReloadSettings, Reloader, Trigger};
    use crate::assemble::StartTimeouts;
    use crate::component::ComponentKey;
    use crate::config::{validate, Config};
    use crate::redact::Redactor;
    use crate::registry::Registry;
    use crate::running::RunningSet;

    /// A span as recorded: its metadata and every field recorded on it.
    type Recorded = (&'static Metadata<'static>, BTreeMap<String, String>);

    /// Keeps every span (ids are indexes + 1), every `follows_from` (the
    /// span, the span it follows), the spans entered, on a current-thread
    /// runtime (every task is polled on this thread), and the handles
    /// open on each span (a span closes when its last handle goes).
    #[derive(Clone, Default)]
    struct Links {
        spans: Arc<Mutex<Vec<Recorded>>>,
        follows: Arc<Mutex<Vec<(u64, u64)>>>,
        entered: Arc<Mutex<Vec<Id>>>,
        handles: Arc<Mutex<BTreeMap<u64, usize>>>,
    }

    struct Fields<'a>(&'a mut BTreeMap<String, String>);

    impl tracing::field::Visit for Fields<'_> {
        fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
            self.0.insert(field.name().to_string(), value.to_string());
        }
        fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
            self.0
                .insert(field.name().to_string(), format!("{value:?}"));
        }
    }

    impl Subscriber for Links {
        // Asked on every span: other tests running at once have their own
        // subscriber.
        fn register_callsite(&self, _: &'static Metadata<'static>) -> Interest {
            Interest::sometimes()
        }
        fn enabled(&self, _: &Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, attributes: &Attributes<'_>) -> Id {
            let mut fields = BTreeMap::new();
            attributes.record(&mut Fields(&mut fields));
            let mut spans = self.spans.lock().unwrap_or_else(|p| p.into_inner());
            spans.push((attributes.metadata(), fields));
            let id = spans.len() as u64;
            self.handles
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(id, 1);
            Id::from_u64(id)
        }
        fn clone_span(&self, span: &Id) -> Id {
            let mut handles = self.handles.lock().unwrap_or_else(|p| p.into_inner());
            *handles.entry(span.into_u64()).or_default() += 1;
            span.clone()
        }
        fn try_close(&self, span: Id) -> bool {
            let mut handles = self.handles.lock().unwrap_or_else(|p| p.into_inner());
            let open = handles.entry(span.into_u64()).or_default();
            *open = open.saturating_sub(1);
            *open == 0
        }
        fn record(&self, span: &Id, values: &Record<'_>) {
            let mut spans = self.spans.lock().unwrap_or_else(|p| p.into_inner());
            let index = usize::try_from(span.into_u64() - 1).unwrap_or(usize::MAX);
            if let Some((_, fields)) = spans.get_mut(index) {
                values.record(&mut Fields(fields));
            }
        }
        fn record_follows_from(&self, span: &Id, follows: &Id) {
            let mut links = self.follows.lock().unwrap_or_else(|p| p.into_inner());
            links.push((span.into_u64(), follows.into_u64()));
        }
        fn event(&self, _: &Event<'_>) {}
        fn enter(&self, span: &Id) {
            let mut entered = self.entered.lock().unwrap_or_else(|p| p.into_inner());
            entered.push(span.clone());
        }
        fn exit(&self, span: &Id) {
            let mut entered = self.entered.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(at) = entered.iter().rposition(|id| id == span) {
                entered.remove(at);
            }
        }
        fn current_span(&self) -> tracing_core::span::Current {
            let entered = self.entered.lock().unwrap_or_else(|p| p.into_inner());
            let spans = self.spans.lock().unwrap_or_else(|p| p.into_inner());
            let current = entered.last().and_then(|id| {
                let index = usize::try_from(id.into_u64() - 1).ok()?;
                Some((id.clone(), spans.get(index)?.0))
            });
            match current {
                Some((id, metadata)) => tracing_core::span::Current::new(id, metadata),
                None => tracing_core::span::Current::none(),
            }
        }
    }

    impl Links {
        /// The ids and fields of the spans named `name`.
        fn named(&self, name: &str) -> Vec<(u64, BTreeMap<String, String>)> {
            let spans = self.spans.lock().unwrap_or_else(|p| p.into_inner());
            (1..)
                .zip(spans.iter())
                .filter(|(_, (metadata, _))| metadata.name() == name)
                .map(|(id, (_, fields))| (id, fields.clone()))
                .collect()
        }

        /// Whether the span `id` is closed (no handle on it left).
        fn closed(&self, id: u64) -> bool {
            let handles = self.handles.lock().unwrap_or_else(|p| p.into_inner());
            handles.get(&id) == Some(&0)
        }
    }

    /// A reloader running no component.
    async fn empty_reloader() -> Arc<Reloader> {
        let registry = Registry::default();
        let config = validate(Config::default(), &registry).unwrap_or_else(|p| panic!("{p}"));
        let redactor = Redactor::default();
        let running = RunningSet::start(config, &registry, StartTimeouts::default(), &redactor)
            .await
            .unwrap_or_else(|f| panic!("{f:?}"));
        let settings = ReloadSettings {
            timeouts: StartTimeouts::default(),
            drain_grace: Duration::from_secs(1),
        };
        let registry = Arc::new(registry);
        Arc::new(Reloader::new(running, registry, settings, redactor, 10))
    }

    #[tokio::test]
    async fn a_reload_links_to_its_cause_names_what_it_forces_and_leaves_its_span() {
        let links = Links::default();
        let _default = tracing::subscriber::set_default(links.clone());
        let reloader = empty_reloader().await;
        let push = tracing::info_span!("rewire.api");
        let forced: BTreeSet<ComponentKey> = (0..super::FORCED_NAMES_LIMIT + 8)
            .map(|i| ComponentKey::new("state", format!("s{i:02}")))
            .collect();
        let request = ReloadRequest {
            forced,
            ..ReloadRequest::of_changes(Trigger::WatchedRef, Vec::new())
        }
        .caused_by(push.clone())
        .leaving_its_span();
        let ran_as = request.ran_as.clone().expect("a slot was given");
        let _ = reloader.reload(request).await;

        let roots = links.named("rewire.reload");
        assert_eq!(roots.len(), 1, "one reload");
        let (root, fields) = &roots[0];
        let push = push.id().map(|id| id.into_u64());
        let follows = links.follows.lock().unwrap().clone();
        assert_eq!(
            follows,
            [(*root, push.unwrap_or_default())],
            "linked to the push"
        );
        let named: Vec<String> = (0..super::FORCED_NAMES_LIMIT)
            .map(|i| format!("state/s{i:02}"))
            .chain(["… and 8 more".to_string()])
            .collect();
        assert_eq!(fields.get("rewire.forced"), Some(&named.join(", ")));
        let left = ran_as
            .take()
            .and_then(|span| span.id())
            .map(|id| id.into_u64());
        assert_eq!(left, Some(*root), "the run left its root span for a retry");
    }

    #[tokio::test]
    async fn a_reload_asked_for_in_a_span_is_caused_by_it_and_one_forcing_nothing_names_none() {
        let links = Links::default();
        let _default = tracing::subscriber::set_default(links.clone());
        let reloader = empty_reloader().await;
        let push = tracing::info_span!("rewire.api");
        // As a control-plane push asks for its reload, inside its span.
        let request = push.in_scope(|| ReloadRequest::new(Config::default(), Trigger::Api));
        let _ = reloader.reload(request).await;
        let roots = links.named("rewire.reload");
        let push = push.id().map(|id| id.into_u64()).unwrap_or_default();
        let follows = links.follows.lock().unwrap().clone();
        assert_eq!(follows, [(roots[0].0, push)]);
        assert_eq!(roots[0].1.get("rewire.forced"), None);
    }

    #[tokio::test]
    async fn a_reload_of_a_kept_templates_clone_closes_its_root_span_when_it_returns() {
        let links = Links::default();
        let _default = tracing::subscriber::set_default(links.clone());
        let reloader = empty_reloader().await;
        // A host's template, reloaded by clone (a periodic forced reload).
        let template = ReloadRequest {
            forced: BTreeSet::from([ComponentKey::new("state", "s")]),
            ..ReloadRequest::of_changes(Trigger::WatchedRef, Vec::new())
        };
        let _ = reloader.reload(template.clone()).await;
        let roots = links.named("rewire.reload");
        assert_eq!(roots.len(), 1, "one reload");
        assert!(
            links.closed(roots[0].0),
            "the root span is closed (exportable) once the reload returns, \
             not held by the template"
        );
        assert!(template.ran_as.is_none(), "the template has no slot");
    }
}
