//! The `Lifecycle` service: a control plane pushes one component's whole
//! configuration (`ApplyConfiguration`) or the fields to change
//! (`AmendConfiguration`), removes a component, releases a pushed
//! component back to the file, or reads the status.
//!
//! Amending is its own RPC, not a flag on `ApplyConfiguration`: a sidecar
//! that predates it answers `UNIMPLEMENTED`, where it would have skipped an
//! unknown field and taken the amendment for a whole declaration (wiping
//! every field and ref the amendment left out).
//!
//! Every push is answered before its caller's deadline, with its outcome or
//! `queued` (`lifecycle_wait`).
//!
//! A push the runtime does not take is not a gRPC error: it is answered
//! `accepted = false` with every reason (a NACK, as in Envoy's xDS), and the
//! running generation keeps serving. Only a request that names no component,
//! or gives more refs of a kind than a push may, is refused
//! (`INVALID_ARGUMENT`). Every answer gives at most [`MAX_REASONS`]
//! reasons, each cut as a reload record's error lines are: a push cannot
//! make its answer larger than itself.

use std::collections::HashMap;
use std::future::Future;

use prost::Message;
use tonic::{Request, Response, Status};
use tracing::{Instrument, Span};

use rewire_runtime::{Action, ComponentKey, Outcome, ReloadError, ReloadRecord, Runtime};

use super::lifecycle_patch::{held_bytes, malformed, patch_of, too_many_refs, Declares};
use super::lifecycle_wait::{cut_short, queued_reason, CallerClock, PushQueue, Waited};
use super::observe::{caller, observed};
use super::proto::rewire::lifecycle::v1 as pb;
use super::proto::rewire::lifecycle::v1::lifecycle_server::Lifecycle;
use crate::dapr::Call;
use crate::ApiState;

/// The `rewire.lifecycle.v1.Lifecycle` service.
pub(super) struct LifecycleApi {
    state: ApiState,
    pushes: PushQueue,
}

impl LifecycleApi {
    /// Serves `state`; pushes are answered within `timeout`.
    pub(super) fn new(state: ApiState, timeout: std::time::Duration) -> Self {
        Self {
            state,
            pushes: PushQueue::new(timeout),
        }
    }

    /// A push taken as `declares` says: rewire's `ApplyConfiguration`
    /// declares the component whole, its `AmendConfiguration` the fields it
    /// gives (or the component whole when not in force), Layotto's the
    /// fields it sets. `method` names the call in metrics and logs.
    /// `answer` turns the push's answer into the call's, inside the
    /// observed call: an error it makes (Layotto's NACK) is counted with
    /// its own code and fitted to trailers as every call's error is.
    pub(super) async fn apply_configuration_with<T>(
        &self,
        method: &'static str,
        request: Request<pb::DynamicConfiguration>,
        declares: Declares,
        answer: impl FnOnce(pb::ApplyConfigurationResponse) -> Result<T, Status>,
    ) -> Result<Response<T>, Status> {
        let clock = CallerClock::of(&request);
        observed(&self.state, method, caller(&request), |call| async move {
            let wait = (&self.pushes, &clock);
            apply(call, request.into_inner(), declares, wait)
                .await
                .and_then(answer)
        })
        .await
        .map(Response::new)
    }
}

#[tonic::async_trait]
impl Lifecycle for LifecycleApi {
    async fn apply_configuration(
        &self,
        request: Request<pb::DynamicConfiguration>,
    ) -> Result<Response<pb::ApplyConfigurationResponse>, Status> {
        // The push is the component whole: its refs are declared, none
        // when its lists are empty (proto3 cannot tell them from absent).
        self.apply_configuration_with("ApplyConfiguration", request, Declares::Whole, Ok)
            .await
    }

    async fn amend_configuration(
        &self,
        request: Request<pb::DynamicConfiguration>,
    ) -> Result<Response<pb::ApplyConfigurationResponse>, Status> {
        self.apply_configuration_with("AmendConfiguration", request, Declares::FieldsOrNew, Ok)
            .await
    }

    async fn remove_component(
        &self,
        request: Request<pb::RemoveComponentRequest>,
    ) -> Result<Response<pb::ApplyConfigurationResponse>, Status> {
        let clock = CallerClock::of(&request);
        observed(&self.state, "RemoveComponent", caller(&request), |call| {
            remove(call, request.into_inner(), (&self.pushes, &clock))
        })
        .await
        .map(Response::new)
    }

    async fn release_component(
        &self,
        request: Request<pb::ReleaseComponentRequest>,
    ) -> Result<Response<pb::ApplyConfigurationResponse>, Status> {
        let clock = CallerClock::of(&request);
        observed(&self.state, "ReleaseComponent", caller(&request), |call| {
            release(call, request.into_inner(), (&self.pushes, &clock))
        })
        .await
        .map(Response::new)
    }

    async fn get_status(
        &self,
        request: Request<pb::GetStatusRequest>,
    ) -> Result<Response<pb::GetStatusResponse>, Status> {
        observed(
            &self.state,
            "GetStatus",
            caller(&request),
            |call| async move {
                let status = call.runtime().status().await;
                let status_json = serde_json::to_string(&status)
                    .map_err(|e| Status::internal(format!("cannot serialise the status: {e}")))?;
                Ok(pb::GetStatusResponse {
                    generation: status.generation,
                    status_json,
                })
            },
        )
        .await
        .map(Response::new)
    }
}

/// `ApplyConfiguration`: declares the component (whole, or the fields the
/// push sets), answering ACK or NACK.
async fn apply(
    call: Call,
    req: pb::DynamicConfiguration,
    declares: Declares,
    wait: Wait<'_>,
) -> Result<pb::ApplyConfigurationResponse, Status> {
    let wire = req.encoded_len();
    let config = req
        .component_config
        .ok_or_else(|| Status::invalid_argument("component_config is required"))?;
    let key = key_of(&config.kind, &config.name)?;
    label_if_running(&call, &key);
    if let Some(reason) = too_many_refs(&config) {
        return Err(Status::invalid_argument(format!("{key}: {reason}")));
    }
    // A malformed push is a NACK at once, full backlog or not: only a push
    // that may be taken is worth retrying as is.
    if let Some(problems) = malformed(&config) {
        return Ok(nack(&call, Outcome::Rejected, named(&call, &key, problems)));
    }
    // Counted in the backlog as parsed, before parsing: pushes being
    // parsed together cannot pass the budget either. The JSON text is
    // given back once parsed (the patch holds what it parsed into).
    let mut admitted = wait.0.admit(held_bytes(&config, wire))?;
    let text = config.metadata_json.len();
    // The push stores only what it declares: an empty type keeps the type
    // in force, scopes (and unsaid refs) stay the lower layers', and
    // whether an amendment amends or declares the component whole, all
    // resolved inside the serialised reload (against the layers as a file
    // reload queued first left them).
    let patch = match patch_of(config, declares) {
        Ok(patch) => {
            admitted.give_back(text);
            patch
        }
        Err(problems) => {
            return Ok(nack(&call, Outcome::Rejected, named(&call, &key, problems)));
        }
    };
    let runtime = call.runtime().clone();
    let applied = key.clone();
    let generation = req.based_on_generation;
    let reload = async move {
        match declares {
            Declares::Whole => runtime.apply_component(applied, patch, generation).await,
            Declares::Fields => runtime.amend_component(applied, patch, generation).await,
            Declares::FieldsOrNew => {
                runtime
                    .amend_or_declare_component(applied, patch, generation)
                    .await
            }
        }
    };
    let reload = caused_by_this_call(call.runtime().clone(), reload);
    let waited = wait.0.run(wait.1, admitted, reload).await?;
    // A component the push added is running now.
    label_if_running(&call, &key);
    answer(&call, waited)
}

/// `RemoveComponent`: removes the component, answering ACK or NACK.
async fn remove(
    call: Call,
    req: pb::RemoveComponentRequest,
    wait: Wait<'_>,
) -> Result<pb::ApplyConfigurationResponse, Status> {
    let key = key_of(&req.kind, &req.name)?;
    label_if_running(&call, &key);
    let admitted = wait.0.admit(req.encoded_len())?;
    let runtime = call.runtime().clone();
    let reload = async move { runtime.remove_component(key, req.based_on_generation).await };
    let reload = caused_by_this_call(call.runtime().clone(), reload);
    answer(&call, wait.0.run(wait.1, admitted, reload).await?)
}

/// `ReleaseComponent`: lets go of a push, answering ACK or NACK.
async fn release(
    call: Call,
    req: pb::ReleaseComponentRequest,
    wait: Wait<'_>,
) -> Result<pb::ApplyConfigurationResponse, Status> {
    let key = key_of(&req.kind, &req.name)?;
    label_if_running(&call, &key);
    let admitted = wait.0.admit(req.encoded_len())?;
    let runtime = call.runtime().clone();
    let reload = async move {
        runtime
            .release_component(key, req.based_on_generation)
            .await
    };
    let reload = caused_by_this_call(call.runtime().clone(), reload);
    answer(&call, wait.0.run(wait.1, admitted, reload).await?)
}

/// The push's `reload`, run inside the call's own span (its `rewire.api`
/// span, current here): the reload's request, made in it, links the
/// reload's trace to the push, and the generation the reload produced
/// (or, when it did not apply, the one still running) is recorded on the
/// call's span as `rewire.generation` once the reload ends. A push
/// answered `queued` keeps its span until then: it ends with its reload.
fn caused_by_this_call<F>(
    runtime: Runtime,
    reload: F,
) -> impl Future<Output = Result<ReloadRecord, ReloadError>> + Send + 'static
where
    F: Future<Output = Result<ReloadRecord, ReloadError>> + Send + 'static,
{
    async move {
        let result = reload.await;
        let generation = match &result {
            Ok(record) => record.generation,
            Err(_) => runtime.generation().number,
        };
        let call = Span::current();
        if !call.is_disabled() {
            call.record("rewire.generation", generation);
        }
        result
    }
    .instrument(Span::current())
}

/// The push's own `problems`, each after `key` scrubbed, made one line and
/// cut once (a name may be megabytes, and each reason is scrubbed whole
/// before it is cut).
fn named(call: &Call, key: &ComponentKey, problems: Vec<String>) -> Vec<String> {
    let key = one_line_kept(&call.runtime().redact(&key.to_string()));
    problems.iter().map(|p| format!("{key}: {p}")).collect()
}

/// Labels the call's metric with `key` only when it names a component
/// running now: names a caller makes up never become labels (see
/// [`StoreLabel`](crate::dapr::StoreLabel)); others count under the
/// unknown store's empty label.
fn label_if_running(call: &Call, key: &ComponentKey) {
    if call.runtime().generation().get(key).is_some() {
        call.label(&key.to_string());
    }
}

fn key_of(kind: &str, name: &str) -> Result<ComponentKey, Status> {
    match (kind.is_empty(), name.is_empty()) {
        (false, false) => Ok(ComponentKey::new(kind, name)),
        (true, _) => Err(Status::invalid_argument(
            "the component's `kind` is required",
        )),
        (false, true) => Err(Status::invalid_argument(
            "the component's `name` is required",
        )),
    }
}

/// The push queue (bounded: a push past its backlog is
/// `RESOURCE_EXHAUSTED`) and the caller's deadline, from its request's
/// arrival.
type Wait<'a> = (&'a PushQueue, &'a CallerClock);

/// The answer to a reload: ACK with the record, NACK with every reason,
/// or `queued` when it had not finished when the answer was due.
fn answer(call: &Call, waited: Waited) -> Result<pb::ApplyConfigurationResponse, Status> {
    let result = match waited {
        Waited::Done(result) => result,
        Waited::Queued { ahead, waited } => {
            let mut queued = nack(call, Outcome::Rejected, [queued_reason(ahead, waited)]);
            queued.outcome = "queued".to_string();
            return Ok(queued);
        }
    };
    match result {
        Ok(record) => Ok(ack(&record, |line| call.runtime().redact(line))),
        Err(ReloadError::Invalid(problems)) => Ok(nack(call, Outcome::Rejected, problems.iter())),
        Err(err @ ReloadError::Stale { .. }) => {
            Ok(nack(call, Outcome::Rejected, [err.to_string()]))
        }
        Err(ReloadError::RolledBack(failures)) => {
            Ok(nack(call, Outcome::RolledBack, failures.iter()))
        }
        Err(err @ ReloadError::Stopped) => Err(cut_short(err.to_string())),
    }
}

/// An ACK: the record's generation, outcome and the actions of the
/// components the reload changed (not every one serving, nor every one
/// reached: an answer does not grow with the running set), and, when an
/// update failed after the commit (a staged in-place update that
/// panicked: that component runs as before, the pushed one or a dependent
/// the push re-resolved; or the reload panicked after its commit), the
/// reasons, one line each ([`ReloadRecord::failure_lines`]). The record's
/// notes about components that did not fail (a marked component's
/// best-effort retry that failed, kept as it runs) stay in the record
/// (status, logs): they are not the push's failure.
fn ack(record: &ReloadRecord, redact: impl Fn(&str) -> String) -> pb::ApplyConfigurationResponse {
    let mut lines: Vec<String> = record
        .failure_lines()
        .into_iter()
        .map(str::to_string)
        .collect();
    let unsaid: Vec<String> = record
        .actions
        .listed()
        .filter(|(_, action)| **action == Action::Failed)
        .map(|(key, _)| format!("{key}: "))
        .filter(|own| !lines.iter().any(|line| line.starts_with(own.as_str())))
        .collect();
    for own in unsaid {
        // Its reason is past the lines the record keeps.
        lines.push(format!(
            "{own}its update failed after the commit: it runs as before (the reload's record in the status says why)"
        ));
    }
    pb::ApplyConfigurationResponse {
        accepted: true,
        generation: record.generation,
        errors: bounded_reasons(lines, redact),
        outcome: snake_case(&record.outcome),
        actions: record
            .actions
            .listed()
            .map(|(component, action)| (component.to_string(), snake_case(action)))
            .collect(),
    }
}

/// A NACK: the generation still serving, and the reasons (secret values
/// scrubbed; bounded as [`bounded_reasons`] says).
fn nack<R: ToString>(
    call: &Call,
    outcome: Outcome,
    reasons: impl IntoIterator<Item = R>,
) -> pb::ApplyConfigurationResponse {
    pb::ApplyConfigurationResponse {
        accepted: false,
        generation: call.runtime().generation().number,
        errors: bounded_reasons(reasons, |r| call.runtime().redact(r)),
        outcome: snake_case(&outcome),
        actions: HashMap::new(),
    }
}

/// Most reasons an answer gives: as many lines as a reload record keeps of
/// its error (32, then one counting the rest).
const MAX_REASONS: usize = 33;

/// `reasons` as an answer gives them: the first [`MAX_REASONS`], each
/// scrubbed by `redact`, made one line (its line breaks spaces) then cut
/// as a record's error lines are ([`ReloadRecord::kept_error`]: about
/// 1 KiB, the middle cut to `…`), then `… and N more`: about 34 KiB in
/// all. Only those kept are made into text, scrubbed or copied: a push
/// can give hundreds of thousands.
fn bounded_reasons<R: ToString>(
    reasons: impl IntoIterator<Item = R>,
    redact: impl Fn(&str) -> String,
) -> Vec<String> {
    let mut reasons = reasons.into_iter();
    let mut kept: Vec<String> = reasons
        .by_ref()
        .take(MAX_REASONS)
        .map(|reason| one_line_kept(&redact(&reason.to_string())))
        .collect();
    let more = reasons.count();
    if more > 0 {
        kept.push(format!("… and {more} more"));
    }
    kept
}

/// A scrubbed reason made one line (a line break is a space) and cut as
/// a record's error line is: a reason of many lines would be kept as 32.
fn one_line_kept(scrubbed: &str) -> String {
    ReloadRecord::kept_error(&scrubbed.replace(['\n', '\r'], " "))
}

/// The serde name of an outcome or action (`rolled_back`, `updated_in_place`).
fn snake_case<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_value(value)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

#[cfg(test)]
mod bounds_tests;

#[cfg(test)]
mod dependent_failure_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use rewire_runtime::Action;

    #[test]
    fn outcomes_and_actions_use_their_snake_case_names() {
        assert_eq!(snake_case(&Outcome::RolledBack), "rolled_back");
        assert_eq!(snake_case(&Outcome::NoChange), "no_change");
        assert_eq!(snake_case(&Action::UpdatedInPlace), "updated_in_place");
    }

    fn key(name: &str) -> ComponentKey {
        ComponentKey::new("custom", name)
    }

    /// An applied record whose reload did `actions`, with `error`.
    fn applied(error: Option<&str>, actions: &[(&str, Action)]) -> ReloadRecord {
        ReloadRecord {
            generation: 3,
            trigger: rewire_runtime::Trigger::Api,
            attempt: 0,
            outcome: Outcome::Applied,
            error: error.map(str::to_string),
            actions: actions.iter().map(|(n, a)| (key(n), *a)).collect(),
            duration_ms: 1,
            at_unix_ms: 1,
        }
    }

    #[test]
    fn an_applied_reload_whose_update_failed_after_the_commit_says_why() {
        let clean = ack(&applied(None, &[]), str::to_string);
        assert!(clean.accepted && clean.errors.is_empty(), "{clean:?}");

        let record = applied(
            Some("custom/s: staged update panicked: hunter2\ncustom/s: second"),
            &[("s", Action::Failed)],
        );
        let answer = ack(&record, |line| line.replace("hunter2", "***"));
        assert!(answer.accepted);
        assert_eq!(answer.outcome, "applied");
        assert_eq!(
            answer.errors,
            ["custom/s: staged update panicked: ***", "custom/s: second"]
        );
        assert_eq!(
            answer.actions.get("custom/s").map(String::as_str),
            Some("failed")
        );
        // Its reason cut from the record: the ACK still says it failed.
        let unsaid = ack(&applied(None, &[("s", Action::Failed)]), str::to_string);
        assert_eq!(unsaid.errors.len(), 1, "{unsaid:?}");
        assert!(unsaid.errors[0].starts_with("custom/s: its update failed after the commit"));
    }

    /// A push applied whole gets a clean ACK, though its record notes
    /// another component (marked, its best-effort retry failed, kept as
    /// it runs); the note stays in the record. Before: the note was the
    /// ACK's error, so Layotto answered `INTERNAL` and `rewire apply`
    /// exited 6 for a push in force.
    #[test]
    fn a_note_about_another_component_is_not_the_pushs_error() {
        let note = "custom/x: init failed: down; it is not as declared (an earlier update of it \
                    failed and could not be put back) and this reload only retried it: it is kept \
                    as it runs and the reload goes on without it";
        let record = applied(
            Some(note),
            &[("x", Action::Unchanged), ("y", Action::UpdatedInPlace)],
        );
        let answer = ack(&record, str::to_string);
        assert!(answer.accepted && answer.errors.is_empty(), "{answer:?}");
        assert_eq!(record.error.as_deref(), Some(note));
        // Nor is what counts more of them.
        let more = applied(
            Some(&format!("{note}\n… and 4 more lines")),
            &[("x", Action::Unchanged), ("y", Action::UpdatedInPlace)],
        );
        let answer = ack(&more, str::to_string);
        assert!(answer.errors.is_empty(), "{answer:?}");
        // Reached and found unchanged: counted in the record, not listed.
        assert_eq!(
            answer.actions,
            HashMap::from([("custom/y".to_string(), "updated_in_place".to_string())])
        );
    }

    /// A dependent's update the push caused (re-resolved from the pushed
    /// store, its staged update panicked when applied) fails the ACK too,
    /// with its reason. Before (ac67227): only the pushed component's
    /// lines were kept, so the ACK was clean and Layotto answered OK.
    #[test]
    fn a_dependents_failure_caused_by_the_push_is_in_the_ack() {
        let line = "custom/orders: staged in-place update panicked when applied: boom; \
                    its previous metadata was re-applied";
        let record = applied(
            Some(line),
            &[
                ("vault", Action::UpdatedInPlace),
                ("orders", Action::Failed),
            ],
        );
        let answer = ack(&record, str::to_string);
        assert_eq!(answer.errors, [line]);
        assert_eq!(
            answer.actions.get("custom/orders").map(String::as_str),
            Some("failed")
        );
    }

    /// A reload that panicked after its commit names no component: its
    /// line is the ACK's error. Before (ac67227): dropped, a clean ACK.
    #[test]
    fn a_panic_after_the_commit_is_in_the_ack() {
        let record = applied(
            Some("the reload panicked after its commit: boom"),
            &[("s", Action::UpdatedInPlace)],
        );
        let answer = ack(&record, str::to_string);
        assert_eq!(
            answer.errors,
            ["the reload panicked after its commit: boom"]
        );
    }

    /// A panic message of several lines keeps them all, what the put-back
    /// did included. Before (ac67227): only its first line.
    #[test]
    fn a_multi_line_reason_is_kept_whole() {
        let record = applied(
            Some(
                "custom/s: staged in-place update panicked when applied: a\n\
                 b; re-applying its previous metadata failed too: it may run with part of the new one",
            ),
            &[("s", Action::Failed)],
        );
        let answer = ack(&record, str::to_string);
        assert_eq!(answer.errors.len(), 2, "{answer:?}");
        assert!(answer.errors[1].contains("it may run with part of the new one"));
    }

    #[test]
    fn a_component_must_be_named() {
        assert_eq!(
            key_of("state", "s").ok(),
            Some(ComponentKey::new("state", "s"))
        );
        assert_eq!(
            key_of("", "s").map_err(|s| s.code()),
            Err(tonic::Code::InvalidArgument)
        );
        assert_eq!(
            key_of("state", "").map_err(|s| s.code()),
            Err(tonic::Code::InvalidArgument)
        );
    }
}
