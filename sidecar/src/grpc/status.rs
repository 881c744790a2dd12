//! How the Dapr operations' errors become gRPC statuses, with Dapr's codes
//! (their messages are already Dapr's gRPC wording) and, where Dapr
//! attaches them, its rich error details.

use rewire_runtime::{ConfigError, LockError, StateError};
use tonic::{Code, Status};
use tonic_types::{BadRequest, ErrorDetail as RpcDetail, ErrorInfo, Help, ResourceInfo, StatusExt};

use crate::dapr::{
    ConfigOpError, ErrorDetail, LockOpError, RequestLimitError, SecretOpError, StateOpError,
    DAPR_DOMAIN,
};

/// A status of `code` and `message` carrying Dapr's `detail`, when there
/// is one, as its details in the order Dapr's builders add them:
/// `google.rpc.BadRequest`, `Help`, `ResourceInfo`, then `ErrorInfo`.
pub(crate) fn dapr_status(code: Code, message: String, detail: Option<ErrorDetail>) -> Status {
    let Some(detail) = detail else {
        return Status::new(code, message);
    };
    let mut details: Vec<RpcDetail> = Vec::with_capacity(4);
    if let Some(violation) = detail.field_violation {
        details.push(BadRequest::with_violation(violation.field, violation.description).into());
    }
    if let Some(link) = detail.help {
        details.push(Help::with_link(link.description, link.url).into());
    }
    if let Some(resource) = detail.resource {
        details.push(
            ResourceInfo::new(
                resource.resource_type,
                resource.resource_name,
                "",
                resource.description,
            )
            .into(),
        );
    }
    details.push(ErrorInfo::new(detail.reason, DAPR_DOMAIN, detail.metadata).into());
    Status::with_error_details_vec(code, message, details)
}

/// The canonical gRPC name of `code` (`OK`, `INVALID_ARGUMENT`...), as the
/// metrics label it.
pub(super) fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

/// A state store's code, as Dapr answers it: an etag mismatch is
/// `ABORTED`, a malformed etag `INVALID_ARGUMENT`, anything else the store
/// answered (a request it refused included) `INTERNAL`.
fn state_code(err: &StateError) -> Code {
    match err {
        StateError::EtagMismatch(_) => Code::Aborted,
        StateError::EtagInvalid(_) => Code::InvalidArgument,
        StateError::Invalid(_) | StateError::Backend(_) => Code::Internal,
        StateError::Unsupported(_) => Code::Unimplemented,
    }
}

/// A store the call names is not running: `INVALID_ARGUMENT`, as Dapr;
/// no state store at all: `FAILED_PRECONDITION`.
impl From<StateOpError> for Status {
    fn from(err: StateOpError) -> Self {
        let code = match &err {
            StateOpError::NotConfigured { .. } => Code::FailedPrecondition,
            StateOpError::BulkTooLarge { .. } => Code::ResourceExhausted,
            StateOpError::TransactionsNotSupported(_) | StateOpError::UnsupportedOperation(_) => {
                Code::Unimplemented
            }
            // Dapr answers INTERNAL for any failed transaction (its
            // `Multi` failed): a stale or malformed etag, a request the
            // store refused.
            StateOpError::Transaction { .. } => Code::Internal,
            _ => err.store_error().map_or(Code::InvalidArgument, state_code),
        };
        let detail = err.detail();
        dapr_status(code, err.to_string(), detail)
    }
}

/// A request over one of the sidecar's bounds is the caller's:
/// `INVALID_ARGUMENT`, naming the bound and the component.
impl From<RequestLimitError> for Status {
    fn from(err: RequestLimitError) -> Self {
        Status::invalid_argument(err.to_string())
    }
}

/// Dapr answers `INTERNAL` for a missing secret too; no secret store at
/// all is `FAILED_PRECONDITION`.
impl From<SecretOpError> for Status {
    fn from(err: SecretOpError) -> Self {
        let code = match err {
            SecretOpError::NotConfigured => Code::FailedPrecondition,
            SecretOpError::NotFound(_) => Code::InvalidArgument,
            SecretOpError::Denied { .. } => Code::PermissionDenied,
            SecretOpError::Get { .. } | SecretOpError::BulkGet { .. } => Code::Internal,
        };
        Status::new(code, err.to_string())
    }
}

impl From<ConfigOpError> for Status {
    fn from(err: ConfigOpError) -> Self {
        if let ConfigOpError::NotConfigured = err {
            // Dapr's answer when no configuration store is configured.
            return Status::failed_precondition(err.to_string());
        }
        let code = match err.store_error() {
            None if matches!(err, ConfigOpError::TooLarge { .. }) => Code::ResourceExhausted,
            None => Code::InvalidArgument,
            Some(ConfigError::Unsupported(_)) => Code::Unimplemented,
            Some(ConfigError::Invalid(_)) => Code::InvalidArgument,
            Some(ConfigError::Backend(_)) => Code::Internal,
            // The store did not answer within the runtime's bound.
            Some(ConfigError::Timeout(_)) => Code::DeadlineExceeded,
        };
        Status::new(code, err.to_string())
    }
}

/// Invalid requests (no resource, no owner, no expiry) are
/// `INVALID_ARGUMENT`; no lock store at all is `FAILED_PRECONDITION`.
impl From<LockOpError> for Status {
    fn from(err: LockOpError) -> Self {
        if let LockOpError::NotConfigured(_) = err {
            // Dapr's and Layotto's answer when no lock store is configured.
            return Status::failed_precondition(err.to_string());
        }
        let code = match err.store_error() {
            None | Some(LockError::Invalid(_)) => Code::InvalidArgument,
            Some(LockError::Backend(_)) => Code::Internal,
            Some(LockError::Unsupported(_)) => Code::Unimplemented,
        };
        Status::new(code, err.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn save_failed(source: StateError) -> Status {
        Status::from(StateOpError::Save {
            store: "s".into(),
            source,
        })
    }

    #[test]
    fn etag_errors_get_dapr_codes() {
        let mismatch = save_failed(StateError::EtagMismatch("k".into()));
        assert_eq!(mismatch.code(), Code::Aborted);
        assert!(
            mismatch
                .message()
                .starts_with("failed saving state in state store `s`: ")
                && mismatch.message().contains("etag mismatch"),
            "{}",
            mismatch.message()
        );
        let invalid = save_failed(StateError::EtagInvalid("k".into()));
        assert_eq!(invalid.code(), Code::InvalidArgument);
        // A request the store refuses is INTERNAL, as Dapr answers it.
        assert_eq!(
            save_failed(StateError::Invalid("ttlInSeconds".into())).code(),
            Code::Internal
        );
        let none = Status::from(StateOpError::NotConfigured {
            store: "orders".into(),
            app_id: "shop".into(),
        });
        assert_eq!(none.code(), Code::FailedPrecondition);
        assert_eq!(none.message(), "state store orders is not configured");
        assert_eq!(
            save_failed(StateError::Backend("down".into())).code(),
            Code::Internal
        );
    }

    #[test]
    fn unknown_stores_are_invalid_arguments_naming_the_store() {
        let status = Status::from(StateOpError::NotFound {
            store: "orders".into(),
            app_id: "shop".into(),
        });
        assert_eq!(status.code(), Code::InvalidArgument);
        assert_eq!(status.message(), "state store orders is not found");
        // As Dapr's `StateStoreError::NotFound(appID)`: the app id, no
        // ResourceInfo.
        let info = status.get_details_error_info().expect("an ErrorInfo");
        assert_eq!(info.metadata.get("appID").map(String::as_str), Some("shop"));
        assert_eq!(status.get_error_details_vec().len(), 1);
        let status = Status::from(LockOpError::NotFound("l".into()));
        assert_eq!(status.message(), "lock store l not found");
        assert_eq!(code_name(Code::InvalidArgument), "INVALID_ARGUMENT");
    }

    #[test]
    fn any_failed_transaction_is_internal_as_in_dapr() {
        for source in [
            StateError::EtagMismatch("k".into()),
            StateError::EtagInvalid("k".into()),
            StateError::Invalid("ttlInSeconds".into()),
            StateError::Backend("down".into()),
        ] {
            let status = Status::from(StateOpError::Transaction {
                store: "s".into(),
                source,
            });
            assert_eq!(status.code(), Code::Internal, "{status:?}");
        }
    }

    #[test]
    fn illegal_keys_carry_dapr_details() {
        let status = Status::from(StateOpError::InvalidKey {
            store: "orders".into(),
            key: "a||b".into(),
            index: None,
            problem: "input key `a||b` can't contain `||`".into(),
        });
        assert_eq!(status.code(), Code::InvalidArgument);
        // As Dapr's `InvalidKeyName`: BadRequest, ResourceInfo, ErrorInfo.
        let details = status.get_error_details_vec();
        assert!(
            matches!(
                details.as_slice(),
                [
                    RpcDetail::BadRequest(_),
                    RpcDetail::ResourceInfo(_),
                    RpcDetail::ErrorInfo(_)
                ]
            ),
            "Dapr's order: {details:?}"
        );
        let info = status.get_details_error_info().expect("an ErrorInfo");
        assert_eq!(info.reason, "DAPR_STATE_ILLEGAL_KEY");
        assert_eq!(info.domain, "dapr.io");
        let resource = status.get_details_resource_info().expect("a ResourceInfo");
        assert_eq!(resource.resource_type, "state");
        assert_eq!(resource.resource_name, "orders");
        let bad = status.get_details_bad_request().expect("a BadRequest");
        assert_eq!(bad.field_violations[0].field, "a||b");
        // No detail: a plain status.
        let plain = save_failed(StateError::Backend("down".into()));
        assert!(plain.details().is_empty());
    }

    #[test]
    fn a_store_without_transactions_links_daprs_list_of_stores() {
        let status = Status::from(StateOpError::TransactionsNotSupported("orders".into()));
        assert_eq!(status.code(), Code::Unimplemented);
        let details = status.get_error_details_vec();
        let [RpcDetail::Help(help), RpcDetail::ResourceInfo(resource), RpcDetail::ErrorInfo(info)] =
            details.as_slice()
        else {
            panic!("Dapr's order (Help, ResourceInfo, ErrorInfo): {details:?}");
        };
        assert_eq!(
            help.links[0].url,
            "https://docs.dapr.io/reference/components-reference/supported-state-stores/"
        );
        assert_eq!(resource.resource_name, "orders");
        assert_eq!(info.reason, "DAPR_STATE_TRANSACTIONS_NOT_SUPPORTED");
    }

    #[test]
    fn lock_requests_are_checked_as_dapr_does() {
        let status = Status::from(LockOpError::ResourceIdEmpty("l".into()));
        assert_eq!(status.code(), Code::InvalidArgument);
        assert_eq!(status.message(), "ResourceId is empty in lock store l");
        let status = Status::from(LockOpError::NotConfigured("l".into()));
        assert_eq!(status.code(), Code::FailedPrecondition);
        assert_eq!(status.message(), "lock store is not configured");
    }

    #[test]
    fn no_secret_store_at_all_is_a_failed_precondition() {
        let status = Status::from(SecretOpError::NotConfigured);
        assert_eq!(status.code(), Code::FailedPrecondition);
        assert_eq!(status.message(), "secret store is not configured");
        let status = Status::from(SecretOpError::NotFound("vault".into()));
        assert_eq!(status.code(), Code::InvalidArgument);
    }

    /// A store that did not answer within the runtime's bound is
    /// `DEADLINE_EXCEEDED` (failed before: `INTERNAL`), the store named
    /// once; its own failure stays `INTERNAL`.
    #[test]
    fn a_config_store_timeout_is_deadline_exceeded_naming_the_store_once() {
        let subscribe_failed = |source| {
            Status::from(ConfigOpError::Subscribe {
                store: "cfg".into(),
                keys: vec!["\"k\"".into()],
                source,
            })
        };
        let timed_out = subscribe_failed(ConfigError::Timeout(
            "subscribe did not answer within 5s (the runtime's bound on a store call)".into(),
        ));
        assert_eq!(timed_out.code(), Code::DeadlineExceeded, "{timed_out:?}");
        assert_eq!(
            timed_out.message().matches("cfg").count(),
            1,
            "{timed_out:?}"
        );
        let failed = subscribe_failed(ConfigError::Backend("refused".into()));
        assert_eq!(failed.code(), Code::Internal, "{failed:?}");
    }
}
