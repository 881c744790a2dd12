//! How the Dapr operations' errors become gRPC statuses, with Dapr's codes
//! (their messages are already Dapr's gRPC wording).

use rewire_runtime::{ConfigError, LockError, StateError};
use tonic::{Code, Status};

use crate::dapr::{ConfigOpError, LockOpError, RequestLimitError, SecretOpError, StateOpError};

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
            StateOpError::NotConfigured => Code::FailedPrecondition,
            StateOpError::BulkTooLarge { .. } => Code::ResourceExhausted,
            StateOpError::TransactionsNotSupported(_) | StateOpError::UnsupportedOperation(_) => {
                Code::Unimplemented
            }
            // Dapr answers INTERNAL for any failed transaction, a stale
            // etag included; a malformed one is still the caller's.
            StateOpError::Transaction { source, .. } => match source {
                StateError::EtagInvalid(_) | StateError::Invalid(_) => Code::InvalidArgument,
                _ => Code::Internal,
            },
            _ => err.store_error().map_or(Code::InvalidArgument, state_code),
        };
        Status::new(code, err.to_string())
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
        };
        Status::new(code, err.to_string())
    }
}

/// Invalid requests (no resource, no owner, no expiry) are
/// `INVALID_ARGUMENT`; no lock store at all is `FAILED_PRECONDITION`.
impl From<LockOpError> for Status {
    fn from(err: LockOpError) -> Self {
        if let LockOpError::NotConfigured = err {
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
        let none = Status::from(StateOpError::NotConfigured);
        assert_eq!(none.code(), Code::FailedPrecondition);
        assert_eq!(none.message(), "state store is not configured");
        assert_eq!(
            save_failed(StateError::Backend("down".into())).code(),
            Code::Internal
        );
    }

    #[test]
    fn unknown_stores_are_invalid_arguments_naming_the_store() {
        let status = Status::from(StateOpError::NotFound("orders".into()));
        assert_eq!(status.code(), Code::InvalidArgument);
        assert_eq!(status.message(), "state store `orders` is not found");
        let status = Status::from(LockOpError::NotFound("l".into()));
        assert_eq!(status.message(), "lock store `l` is not found");
        assert_eq!(code_name(Code::InvalidArgument), "INVALID_ARGUMENT");
    }

    #[test]
    fn lock_requests_are_checked_as_dapr_does() {
        let status = Status::from(LockOpError::ResourceIdEmpty("l".into()));
        assert_eq!(status.code(), Code::InvalidArgument);
        assert_eq!(status.message(), "ResourceId is empty in lock store `l`");
        let status = Status::from(LockOpError::NotConfigured);
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
}
