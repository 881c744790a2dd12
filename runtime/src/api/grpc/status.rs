//! How component errors become gRPC statuses, with Dapr's codes and
//! messages.

use tonic::{Code, Status};

use crate::kinds::{ConfigError, LockError, SecretError, StateError};

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

/// A store the call names is not running (Dapr: `InvalidArgument`,
/// "state store x is not found").
pub(super) fn not_found(what: &str, name: &str) -> Status {
    Status::invalid_argument(format!("{what} `{name}` is not found"))
}

/// A state store error, prefixed with what was being done (Dapr's codes:
/// an etag mismatch is `ABORTED`, a malformed etag `INVALID_ARGUMENT`).
pub(super) fn state_error(doing: &str, err: &StateError) -> Status {
    let code = match err {
        StateError::EtagMismatch(_) => Code::Aborted,
        StateError::EtagInvalid(_) | StateError::Invalid(_) => Code::InvalidArgument,
        StateError::Backend(_) => Code::Internal,
    };
    Status::new(code, format!("{doing}: {err}"))
}

/// A secret store error (Dapr answers `INTERNAL` for a missing secret too:
/// "failed getting secret with key k from secret store s: ...").
pub(super) fn secret_error(doing: &str, err: &SecretError) -> Status {
    Status::internal(format!("{doing}: {err}"))
}

/// A configuration store error.
pub(super) fn config_error(doing: &str, err: &ConfigError) -> Status {
    let code = match err {
        ConfigError::Unsupported(_) => Code::Unimplemented,
        ConfigError::Invalid(_) => Code::InvalidArgument,
        ConfigError::Backend(_) => Code::Internal,
    };
    Status::new(code, format!("{doing}: {err}"))
}

/// A lock store error.
pub(super) fn lock_error(doing: &str, err: &LockError) -> Status {
    let code = match err {
        LockError::Invalid(_) => Code::InvalidArgument,
        LockError::Backend(_) => Code::Internal,
    };
    Status::new(code, format!("{doing}: {err}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etag_errors_get_dapr_codes() {
        let mismatch = state_error(
            "failed saving state in state store `s`",
            &StateError::EtagMismatch("k".into()),
        );
        assert_eq!(mismatch.code(), Code::Aborted);
        assert!(
            mismatch.message().contains("etag mismatch"),
            "{}",
            mismatch.message()
        );
        let invalid = state_error("x", &StateError::EtagInvalid("k".into()));
        assert_eq!(invalid.code(), Code::InvalidArgument);
        assert_eq!(
            state_error("x", &StateError::Backend("down".into())).code(),
            Code::Internal
        );
    }

    #[test]
    fn unknown_stores_are_invalid_arguments_naming_the_store() {
        let status = not_found("state store", "orders");
        assert_eq!(status.code(), Code::InvalidArgument);
        assert_eq!(status.message(), "state store `orders` is not found");
        assert_eq!(code_name(Code::InvalidArgument), "INVALID_ARGUMENT");
    }
}
