//! [`Error`]: why a call failed.

use std::time::Duration;

/// Why a call to etcd failed. The text carries the server's own message
/// (`etcdserver: authentication failed, …`), never a password.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// An endpoint is not a valid URL.
    #[error("invalid endpoint `{endpoint}`: {reason}")]
    Endpoint {
        /// The endpoint given.
        endpoint: String,
        /// What is wrong with it.
        reason: String,
    },
    /// No endpoint was given.
    #[error("no endpoint given")]
    NoEndpoint,
    /// The server answered with an error status.
    #[error("{}: {}", .0.code(), .0.message())]
    Status(tonic::Status),
    /// The call did not finish within the limit.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// The server refused the call's auth token, and no login (this
    /// call's, or the one of another call it waited for) finished within
    /// the limit — or one did, and left too little of it for the call
    /// made again, or for the call after a login made first (the token
    /// known stale). The server answered: not [unreachable](Self::is_unreachable),
    /// so the client stays on it. (A login made before the call, the token
    /// being known stale, that runs out is [`Timeout`](Self::Timeout): that
    /// member has not answered.)
    #[error("the server refused the auth token and no login finished within {0:?}")]
    LoginTimeout(Duration),
    /// An answer announced itself larger than the client accepts
    /// ([`ConnectOptions::max_response_size`](crate::ConnectOptions::max_response_size)):
    /// refused before any of it is buffered. The server answered: not
    /// [unreachable](Self::is_unreachable).
    #[error("the answer is larger than the {limit} bytes this client accepts{}: {}", raise_hint(*.setting), .status.message())]
    TooLarge {
        /// The limit, in bytes.
        limit: usize,
        /// The setting that raises it, if the client's owner named one.
        setting: Option<&'static str>,
        /// What the gRPC decoder said (it gives the size announced).
        status: tonic::Status,
    },
}

/// ` (raise `setting`)`, or nothing.
fn raise_hint(setting: Option<&'static str>) -> String {
    setting.map_or_else(String::new, |setting| format!(" (raise `{setting}`)"))
}

/// The limit on an answer a client accepts, and the setting that raises
/// it: turns the gRPC decoder's refusal of a larger answer into
/// [`Error::TooLarge`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ResponseLimit {
    /// The largest answer accepted, in bytes.
    pub(crate) bytes: usize,
    /// The setting that raises it, named in the error.
    pub(crate) setting: Option<&'static str>,
}

impl ResponseLimit {
    /// The error for `status`: [`Error::TooLarge`] when it is the gRPC
    /// decoder refusing an answer over this limit, else `status` as is.
    pub(crate) fn error(self, status: tonic::Status) -> Error {
        let over_limit = status.code() == tonic::Code::OutOfRange
            && status.message().contains(DECODED_TOO_LARGE);
        if over_limit {
            Error::TooLarge {
                limit: self.bytes,
                setting: self.setting,
                status,
            }
        } else {
            Error::Status(status)
        }
    }
}

/// tonic's message when an answer announces more than the limit:
/// "decoded message length too large: found N bytes, the limit is: M bytes".
const DECODED_TOO_LARGE: &str = "message length too large";

impl Error {
    /// The gRPC status, when the server answered with one.
    pub fn status(&self) -> Option<&tonic::Status> {
        match self {
            Self::Status(status) => Some(status),
            _ => None,
        }
    }

    /// Whether the member did not answer usefully — refused or dropped
    /// the connection (a request in flight on a connection that dies is
    /// `Cancelled`), answered nothing within the limit, or has no leader —
    /// so that another member may.
    pub fn is_unreachable(&self) -> bool {
        match self {
            Self::Timeout(_) => true,
            Self::Status(status) => matches!(
                status.code(),
                tonic::Code::Unavailable
                    | tonic::Code::Unknown
                    | tonic::Code::DeadlineExceeded
                    | tonic::Code::Cancelled
            ),
            Self::Endpoint { .. }
            | Self::NoEndpoint
            | Self::LoginTimeout(_)
            | Self::TooLarge { .. } => false,
        }
    }

    /// Whether the server refused the client itself — its credentials
    /// (a login refused: `authentication failed`) or its permissions on
    /// the keys — so that asking again does not help until they change.
    pub fn is_refusal(&self) -> bool {
        self.status().is_some_and(|s| {
            matches!(
                s.code(),
                tonic::Code::Unauthenticated
                    | tonic::Code::PermissionDenied
                    | tonic::Code::InvalidArgument
            )
        })
    }

    /// Whether the answer was too large to be received: over
    /// [`ConnectOptions::max_response_size`](crate::ConnectOptions::max_response_size)
    /// here, or over what the server sends. A smaller request (fewer
    /// ranges at once) may be answered.
    pub fn is_too_large(&self) -> bool {
        if matches!(self, Self::TooLarge { .. }) {
            return true;
        }
        self.status().is_some_and(|s| match s.code() {
            // tonic: "decoded message length too large".
            tonic::Code::OutOfRange => s.message().contains(DECODED_TOO_LARGE),
            // grpc-go: "trying to send message larger than max".
            tonic::Code::ResourceExhausted => s.message().contains("larger than max"),
            _ => false,
        })
    }

    /// Whether a read at an old revision failed because that revision is
    /// not in the server's history: compacted away, or newer than the
    /// server's own revision.
    pub fn is_revision_unavailable(&self) -> bool {
        self.status().is_some_and(|s| {
            s.code() == tonic::Code::OutOfRange && s.message().contains("mvcc: required revision")
        })
    }

    /// Whether the server refused the auth token as expired or unknown,
    /// as issued before the auth settings changed, or missing (sent none
    /// while authentication was off, and it is on again): a fresh login
    /// helps.
    pub(crate) fn is_invalid_token(&self) -> bool {
        self.status().is_some_and(|s| match s.code() {
            tonic::Code::Unauthenticated => s.message().contains("invalid auth token"),
            tonic::Code::InvalidArgument => {
                s.message().contains(AUTH_OLD_REVISION) || s.message().contains(USER_EMPTY)
            }
            _ => false,
        })
    }

    /// Whether the server refused a login because it has authentication
    /// off: calls need no token there.
    pub(crate) fn is_auth_not_enabled(&self) -> bool {
        self.status().is_some_and(|s| {
            s.code() == tonic::Code::FailedPrecondition
                && s.message().contains("authentication is not enabled")
        })
    }
}

/// etcd's message when a token predates a change of users or roles.
const AUTH_OLD_REVISION: &str = "revision of auth store is old";

/// etcd's message for a call without a token while authentication is on.
const USER_EMPTY: &str = "user name is empty";

/// etcd's reason for a watch its user's roles do not cover — and, in older
/// releases, for any token it refuses.
pub(crate) const PERMISSION_DENIED: &str = "permission denied";

/// Whether the reason etcd gave for canceling a watch in its stream says
/// the token was refused — unknown or expired (`invalid auth token`; older
/// etcd releases say `permission denied` for it, as for a user whose
/// roles do not cover the keys), issued before the auth settings changed,
/// or missing — so that logging in again may help.
pub(crate) fn is_auth_cancel(reason: &str) -> bool {
    [
        "invalid auth token",
        PERMISSION_DENIED,
        AUTH_OLD_REVISION,
        USER_EMPTY,
        "Unauthenticated",
    ]
    .iter()
    .any(|needle| reason.contains(needle))
}

impl From<tonic::Status> for Error {
    fn from(status: tonic::Status) -> Self {
        Self::Status(status)
    }
}

#[cfg(test)]
mod tests {
    use super::Error;

    #[test]
    fn answers_over_either_side_s_limit_are_too_large_and_nothing_else_is() {
        let too_large = [
            tonic::Status::out_of_range(
                "Error, decoded message length too large: found 6291462 bytes, the limit is: 4194304 bytes",
            ),
            tonic::Status::resource_exhausted(
                "grpc: trying to send message larger than max (2147483648 vs. 2147483647)",
            ),
        ];
        for status in too_large {
            assert!(Error::Status(status.clone()).is_too_large(), "{status:?}");
        }
        let others = [
            // etcd's own OutOfRange: a compacted revision.
            tonic::Status::out_of_range("etcdserver: mvcc: required revision has been compacted"),
            tonic::Status::resource_exhausted("etcdserver: mvcc: database space exceeded"),
            tonic::Status::unavailable("connection refused"),
        ];
        for status in others {
            assert!(!Error::Status(status.clone()).is_too_large(), "{status:?}");
        }
        assert!(!Error::Timeout(std::time::Duration::from_secs(1)).is_too_large());
    }

    #[test]
    fn a_connection_that_died_under_a_call_is_unreachable_and_a_refusal_is_not() {
        // What tonic answers for a call in flight when the member is killed.
        let died = tonic::Status::cancelled("operation was canceled");
        assert!(Error::Status(died).is_unreachable());
        let refused = tonic::Status::invalid_argument("etcdserver: authentication failed");
        let refusal = Error::Status(refused);
        assert!(!refusal.is_unreachable() && refusal.is_refusal());
    }
}
