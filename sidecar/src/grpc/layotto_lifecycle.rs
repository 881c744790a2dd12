//! Layotto's `Lifecycle.ApplyConfiguration`, served by rewire's own
//! Lifecycle implementation: the push is the same reload, through the same
//! queue, with the same deadline. Layotto's answer has no fields, so a push
//! rewire does not take is a gRPC error carrying every reason (made inside
//! the observed call: cut to fit in trailers, counted with its code).
//!
//! Layotto's `ComponentConfig` carries metadata only: its push sets the
//! fields it gives, laid over what the file (or overlay) declares, whose
//! other fields, type, secretRef, configurationRef and componentRef stay
//! in force under it (an inherited secretRef or configurationRef filling a
//! field the push sets gives way to the push). A second push lays its
//! fields over the first's.
//!
//! As Layotto's, the push changes a component in force and nothing else:
//! an empty `kind`, `name` or `metadata` is `INVALID_ARGUMENT`, and so is
//! a component that is not in force (never declared, or removed by
//! rewire's `RemoveComponent`), checked inside the serialised reload so a
//! removal queued first is not raced. Layotto names custom components
//! `custom_component.<kind>`; the push reaches rewire's `<kind>`.

use std::sync::Arc;

use rewire_runtime::ReloadRecord;
use tonic::{Code, Request, Response, Status};

use super::lifecycle::LifecycleApi;
use super::lifecycle_patch::Declares;
use super::proto::rewire::lifecycle::v1 as rewire_pb;
use super::proto::spec::proto::runtime::v1 as pb;
use super::proto::spec::proto::runtime::v1::lifecycle_server::Lifecycle;

/// `spec.proto.runtime.v1.Lifecycle`, over rewire's Lifecycle service.
pub(super) struct LayottoLifecycleApi {
    rewire: Arc<LifecycleApi>,
}

impl LayottoLifecycleApi {
    /// Serves Layotto's pushes with `rewire`'s implementation.
    pub(super) fn new(rewire: Arc<LifecycleApi>) -> Self {
        Self { rewire }
    }
}

#[tonic::async_trait]
impl Lifecycle for LayottoLifecycleApi {
    async fn apply_configuration(
        &self,
        request: Request<pb::DynamicConfiguration>,
    ) -> Result<Response<pb::ApplyConfigurationResponse>, Status> {
        let (metadata, extensions, message) = request.into_parts();
        if let Some(config) = &message.component_config {
            required(config)?;
        }
        let component_config = message
            .component_config
            .map(|config| rewire_pb::ComponentConfig {
                kind: rewire_kind(config.kind),
                name: config.name,
                metadata: config.metadata,
                ..rewire_pb::ComponentConfig::default()
            });
        let push = rewire_pb::DynamicConfiguration {
            component_config,
            based_on_generation: None,
        };
        // The NACK becomes an error inside the observed call, so it is
        // counted with its code and fitted to trailers.
        self.rewire
            .apply_configuration_with(
                "ApplyConfiguration",
                Request::from_parts(metadata, extensions, push),
                Declares::Fields,
                |answer| match status_of(&answer) {
                    None => Ok(pb::ApplyConfigurationResponse {}),
                    Some(status) => Err(status),
                },
            )
            .await
    }
}

/// The prefix of Layotto's name for a custom kind
/// (`custom_component.<kind>`, as Layotto's runtime registers them).
const CUSTOM_KIND_PREFIX: &str = "custom_component.";

/// rewire's kind for Layotto's `kind`: a custom kind without Layotto's
/// prefix, any other as it is.
fn rewire_kind(kind: String) -> String {
    match kind.strip_prefix(CUSTOM_KIND_PREFIX) {
        Some(custom) => custom.to_string(),
        None => kind,
    }
}

/// `INVALID_ARGUMENT` for the first field Layotto requires that `config`
/// leaves empty (in Layotto's order and words): its push changes a
/// component's metadata, so a push without any is refused, not stored.
/// An empty kind or name is left to rewire's check, which counts the call.
fn required(config: &pb::ComponentConfig) -> Result<(), Status> {
    let named = !config.kind.is_empty() && !config.name.is_empty();
    if named && config.metadata.is_empty() {
        return Err(Status::invalid_argument("field metadata is not configured"));
    }
    Ok(())
}

/// The gRPC error a refused push becomes: `INVALID_ARGUMENT` for a
/// rejected one, `ABORTED` when it rolled back, `DEADLINE_EXCEEDED` when it
/// is still queued (it will be applied); `INTERNAL` for one applied in
/// which an update failed after the commit ([`update_failed`]), with the
/// reasons (scrubbed in the ACK): Layotto's answer has no field to say it,
/// and an OK would tell its client the push is in force. `None` when it
/// was taken whole, whatever notes the record keeps about components that
/// did not fail (a marked one's retry that failed, kept as it runs).
pub(super) fn status_of(answer: &rewire_pb::ApplyConfigurationResponse) -> Option<Status> {
    if answer.accepted {
        if !update_failed(answer) {
            return None;
        }
        let reasons = answer.errors.join("\n");
        return Some(Status::internal(format!(
            "{} (generation {}), but a component's update failed after the commit: it is not \
             wholly in force (it runs as before, or with part of the push):\n{reasons}",
            answer.outcome, answer.generation
        )));
    }
    let code = match answer.outcome.as_str() {
        "rolled_back" => Code::Aborted,
        "queued" => Code::DeadlineExceeded,
        _ => Code::InvalidArgument,
    };
    let reasons = answer.errors.join("\n");
    Some(Status::new(
        code,
        format!(
            "{} (generation {} still serving):\n{reasons}",
            answer.outcome, answer.generation
        ),
    ))
}

/// Whether an ACK says an update failed after the commit: an action
/// `failed` (the pushed component's, or a dependent's the push
/// re-resolved: its staged update panicked when applied), or an error
/// that is not a note about a component that did not fail (the reload
/// panicked after its commit; see [`ReloadRecord::failure_lines_among`]).
fn update_failed(answer: &rewire_pb::ApplyConfigurationResponse) -> bool {
    let acted: Vec<(&str, bool)> = answer
        .actions
        .iter()
        .map(|(key, action)| (key.as_str(), action == "failed"))
        .collect();
    acted.iter().any(|(_, failed)| *failed)
        || !ReloadRecord::failure_lines_among(answer.errors.iter().map(String::as_str), &acted)
            .is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(accepted: bool, outcome: &str) -> rewire_pb::ApplyConfigurationResponse {
        rewire_pb::ApplyConfigurationResponse {
            accepted,
            generation: 4,
            errors: vec!["state/a: unknown type x".into(), "state/a: second".into()],
            outcome: outcome.into(),
            actions: Default::default(),
        }
    }

    #[test]
    fn layottos_custom_kind_is_rewires_kind_and_metadata_is_required() {
        assert_eq!(rewire_kind("custom_component.hello".into()), "hello");
        assert_eq!(rewire_kind("state".into()), "state");
        assert_eq!(rewire_kind("pub_subs".into()), "pub_subs");
        let config = |kind: &str, name: &str, fields: &[&str]| pb::ComponentConfig {
            kind: kind.into(),
            name: name.into(),
            metadata: fields.iter().map(|f| (f.to_string(), "1".into())).collect(),
        };
        let refused = required(&config("state", "s", &[])).expect_err("no metadata");
        assert_eq!(refused.code(), Code::InvalidArgument);
        assert!(refused.message().contains("metadata"), "{refused:?}");
        assert!(required(&config("state", "s", &["a"])).is_ok());
        // An empty kind or name is refused by rewire's own check.
        assert!(required(&config("", "s", &[])).is_ok());
        assert!(required(&config("state", "", &[])).is_ok());
    }

    #[tokio::test]
    async fn a_rejected_push_quoting_a_long_name_fits_in_trailers_and_counts_its_code() {
        let state = crate::ApiState::empty().await;
        let rewire = LifecycleApi::new(state.clone(), std::time::Duration::from_secs(45));
        let layotto = LayottoLifecycleApi::new(Arc::new(rewire));
        let push = pb::DynamicConfiguration {
            component_config: Some(pb::ComponentConfig {
                kind: "state".into(),
                name: "n".repeat(100_000),
                metadata: [("redisHost".to_string(), "h:6379".to_string())].into(),
            }),
        };
        let refused = layotto
            .apply_configuration(Request::new(push))
            .await
            .expect_err("a component not in force is refused");
        assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
        let cap = super::super::observe::MAX_STATUS_MESSAGE + '…'.len_utf8();
        assert!(
            refused.message().len() <= cap && refused.message().ends_with('…'),
            "cut to fit in trailers: {} bytes",
            refused.message().len()
        );
        let text = state.metrics.render(&state.runtime);
        assert!(
            text.contains(r#"method="ApplyConfiguration",store="",code="INVALID_ARGUMENT"} 1"#),
            "counted with the code it answered: {text}"
        );
        state.runtime.shutdown().await;
    }

    #[test]
    fn a_refused_push_is_an_error_with_every_reason() {
        let clean = rewire_pb::ApplyConfigurationResponse {
            errors: Vec::new(),
            actions: [("state/a".to_string(), "updated_in_place".to_string())].into(),
            ..answer(true, "applied")
        };
        assert!(status_of(&clean).is_none());
        let refused = status_of;
        let rejected = refused(&answer(false, "rejected")).expect("an error");
        assert_eq!(rejected.code(), Code::InvalidArgument);
        assert!(rejected.message().contains("unknown type x"));
        assert!(rejected.message().contains("second"));
        assert!(rejected.message().contains("generation 4"));
        let rolled_back = refused(&answer(false, "rolled_back")).expect("an error");
        assert_eq!(rolled_back.code(), Code::Aborted);
        let queued = refused(&answer(false, "queued")).expect("an error");
        assert_eq!(queued.code(), Code::DeadlineExceeded);
    }

    /// A push applied in which a component's update failed after the
    /// commit is an error with its reasons, not OK: Layotto's answer has
    /// no field to say so. Before: OK, the client took it for in force.
    #[test]
    fn a_push_applied_whose_update_failed_after_the_commit_is_an_error() {
        let failed_with_reasons = rewire_pb::ApplyConfigurationResponse {
            actions: [("state/a".to_string(), "failed".to_string())].into(),
            ..answer(true, "applied")
        };
        let with_reasons = status_of(&failed_with_reasons).expect("an error");
        assert_eq!(with_reasons.code(), Code::Internal);
        let message = with_reasons.message();
        assert!(
            message.starts_with("applied (generation 4), but a component's update failed")
                && message.contains("unknown type x")
                && message.contains("second"),
            "{message}"
        );
        let failed_action = rewire_pb::ApplyConfigurationResponse {
            errors: Vec::new(),
            actions: [("state/a".to_string(), "failed".to_string())].into(),
            ..answer(true, "applied")
        };
        let failed = status_of(&failed_action).expect("an error");
        assert_eq!(failed.code(), Code::Internal);
    }

    /// A push applied is an error when another component's update failed
    /// after the commit (a dependent the push re-resolved, its staged
    /// update panicked), or when the reload panicked after its commit (a
    /// line naming no component). Before (ac67227): OK, only the pushed
    /// component's action judged.
    #[test]
    fn a_push_applied_is_an_error_when_any_update_failed_after_the_commit() {
        let other_failed = rewire_pb::ApplyConfigurationResponse {
            errors: vec!["state/x: staged in-place update panicked when applied: boom".into()],
            actions: [
                ("state/a".to_string(), "updated_in_place".to_string()),
                ("state/x".to_string(), "failed".to_string()),
            ]
            .into(),
            ..answer(true, "applied")
        };
        let status = status_of(&other_failed).expect("an error");
        assert_eq!(status.code(), Code::Internal);
        assert!(status.message().contains("state/x: staged"), "{status:?}");
        let panicked = rewire_pb::ApplyConfigurationResponse {
            errors: vec!["the reload panicked after its commit: boom".into()],
            actions: [("state/a".to_string(), "updated_in_place".to_string())].into(),
            ..answer(true, "applied")
        };
        assert_eq!(status_of(&panicked).map(|s| s.code()), Some(Code::Internal));
    }

    /// A push applied whole is OK, whatever note the record keeps about
    /// another component that did not fail (a marked one whose
    /// best-effort retry failed, kept as it runs, `unchanged`). Before
    /// ac67227: `INTERNAL` ("not wholly in force") for a push that was.
    #[test]
    fn a_push_applied_whole_is_ok_whatever_befell_another_component() {
        let no_change = rewire_pb::ApplyConfigurationResponse {
            errors: vec!["state/x: init failed: down; it is not as declared".into()],
            actions: [("state/x".to_string(), "unchanged".to_string())].into(),
            ..answer(true, "no_change")
        };
        assert!(status_of(&no_change).is_none());
    }
}
