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
//! Spans are plain `tracing` spans: the sidecar exports them over OTLP when
//! tracing is configured; without a subscriber that wants them they cost a
//! disabled-callsite check. Attributes are names, kinds and types only,
//! never metadata values.

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
        otel.status_code = Empty,
        otel.status_message = Empty,
    )
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
    span.record("otel.status_message", message);
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
        otel.status_message = Empty,
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
