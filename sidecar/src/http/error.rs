//! Dapr-style JSON errors: `{"errorCode": "ERR_…", "message": "…"}` with
//! Dapr's status codes and messages, so the Dapr SDKs report them as they
//! would report Dapr's own; where Dapr attaches rich details, a `details`
//! array as dapr/kit's `JSONErrorValue` writes it.

use std::time::Duration;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use rewire_runtime::{ConfigError, SecretError, StateError};

use super::error_details::details_json;
use crate::dapr::{ConfigOpError, ErrorDetail, RequestLimitError, SecretOpError, StateOpError};

/// Why an HTTP call failed. Messages never carry a secret value: component
/// errors are scrubbed by the shared Dapr operations ([`crate::dapr`])
/// before they get here.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// No state store with that name in the generation serving.
    #[error("state store {store} is not found")]
    StateStoreNotFound {
        /// The store asked for.
        store: String,
        /// The sidecar's app id (Dapr's details name it).
        app_id: String,
    },
    /// No state store at all in the generation serving.
    #[error("state store {store} is not configured")]
    StateStoresNotConfigured {
        /// The store asked for (Dapr's message names it).
        store: String,
        /// The sidecar's app id (Dapr's details name it).
        app_id: String,
    },
    /// No secret store with that name.
    #[error("failed finding secret store with key {0}")]
    SecretStoreNotFound(String),
    /// No configuration store with that name (Dapr's message and 500).
    #[error("configuration store {0} not found")]
    ConfigStoreNotFound(String),
    /// The body could not be understood.
    #[error("failed deserializing HTTP body: {0}")]
    Malformed(String),
    /// The body of a request to a component could not be understood.
    #[error("failed deserializing HTTP body for {component}: {problem}")]
    MalformedBody {
        /// `kind \`name\``.
        component: String,
        /// What is wrong (the item and field, when known).
        problem: String,
    },
    /// The query string could not be understood.
    #[error("failed deserializing the query string: {0}")]
    MalformedQuery(String),
    /// A path parameter could not be decoded (`%FF`: no UTF-8).
    #[error("failed decoding the URL path: {0}")]
    MalformedPath(String),
    /// The request is understood but refused: over one of the sidecar's
    /// bounds, a key Dapr refuses, an unknown option.
    #[error("{0}")]
    Invalid(String),
    /// The body is larger than `max_request_bytes`.
    #[error("request body is larger than the limit of {limit} bytes")]
    BodyTooLarge {
        /// The limit, in bytes.
        limit: usize,
    },
    /// The listener is reading as many request bytes as it holds at once
    /// (`max_request_bytes_in_flight`): the client may retry.
    #[error("{0}")]
    BodiesBusy(String),
    /// An answer would be larger than `max_response_bytes`.
    #[error("{0}")]
    ResponseTooLarge(String),
    /// A save failed.
    #[error("failed saving state in state store {store}: {source}")]
    StateSave {
        /// The store.
        store: String,
        /// Why.
        source: StateError,
    },
    /// A read failed.
    #[error("fail to get {key} from state store {store}: {source}")]
    StateGet {
        /// The store.
        store: String,
        /// The key.
        key: String,
        /// Why.
        source: StateError,
    },
    /// A delete failed.
    #[error("failed deleting state with key {key} from state store {store}: {source}")]
    StateDelete {
        /// The store.
        store: String,
        /// The key.
        key: String,
        /// Why.
        source: StateError,
    },
    /// A bulk delete failed (no HTTP route deletes in bulk; gRPC's
    /// `DeleteBulkState` shares the operation).
    #[error("failed deleting state in state store {store}: {source}")]
    StateBulkDelete {
        /// The store.
        store: String,
        /// Why.
        source: StateError,
    },
    /// A bulk read failed as a whole.
    #[error("failed bulk get in state store {store}: {source}")]
    StateBulkGet {
        /// The store.
        store: String,
        /// Why.
        source: StateError,
    },
    /// A secret could not be read.
    #[error("failed getting secret with key {name} from secret store {store}: {source}")]
    SecretGet {
        /// The store.
        store: String,
        /// The secret's name.
        name: String,
        /// Why (never a value).
        source: SecretError,
    },
    /// The secrets of a store could not be read.
    #[error("failed getting secrets from secret store {store}: {source}")]
    SecretBulkGet {
        /// The store.
        store: String,
        /// Why (never a value).
        source: SecretError,
    },
    /// Configuration items could not be read.
    #[error("failed to get {keys:?} from Configuration store {store}: {source}")]
    ConfigGet {
        /// The store.
        store: String,
        /// The keys asked for.
        keys: Vec<String>,
        /// Why.
        source: ConfigError,
    },
    /// A configuration subscription could not be made.
    #[error("failed to subscribe to {keys:?} from Configuration store {store}: {source}")]
    ConfigSubscribe {
        /// The store.
        store: String,
        /// The keys asked for.
        keys: Vec<String>,
        /// Why.
        source: ConfigError,
    },
    /// Components are not ready (`kind/name: reason` each).
    #[error("dapr is not ready: {} component(s) not ready", .0.len())]
    NotReady(Vec<String>),
    /// Components are not ready; the caller presented no token, so which
    /// and why is withheld.
    #[error("dapr is not ready: present the API token in header `dapr-api-token` for details")]
    NotReadyWithheld,
    /// The admin token is missing or wrong (status, metrics).
    #[error("missing or invalid admin token in header `rewire-admin-token`")]
    AdminUnauthorized,
    /// No such route, or not with this method (Dapr answers 404 for both;
    /// a path that is no route is never read as a key).
    #[error("method {method} {path} is not found")]
    RouteNotFound {
        /// The HTTP method.
        method: String,
        /// The path.
        path: String,
    },
    /// The call took longer than `request_timeout`.
    #[error("the request did not complete within {0:?}")]
    Timeout(Duration),
    /// An error of an area that maps its own Dapr code and status (locks,
    /// state transactions).
    #[error("{message}")]
    Api {
        /// The HTTP status.
        status: StatusCode,
        /// Dapr's error code.
        code: &'static str,
        /// The message.
        message: String,
    },
    /// As [`HttpError::Api`], with Dapr's rich details.
    #[error("{message}")]
    Detailed {
        /// The HTTP status.
        status: StatusCode,
        /// Dapr's error code.
        code: &'static str,
        /// The message.
        message: String,
        /// The `details` of the body.
        detail: Box<ErrorDetail>,
    },
}

impl HttpError {
    /// Dapr's error code.
    pub fn code(&self) -> &'static str {
        match self {
            Self::StateStoreNotFound { .. } => "ERR_STATE_STORE_NOT_FOUND",
            Self::StateStoresNotConfigured { .. } => "ERR_STATE_STORE_NOT_CONFIGURED",
            Self::SecretStoreNotFound(_) => "ERR_SECRET_STORE_NOT_FOUND",
            Self::ConfigStoreNotFound(_) => "ERR_CONFIGURATION_STORE_NOT_FOUND",
            Self::Malformed(_)
            | Self::MalformedBody { .. }
            | Self::MalformedQuery(_)
            | Self::MalformedPath(_)
            | Self::Invalid(_) => "ERR_MALFORMED_REQUEST",
            Self::BodyTooLarge { .. } => "ERR_BODY_TOO_LARGE",
            Self::BodiesBusy(_) => "ERR_TOO_MANY_REQUESTS",
            Self::ResponseTooLarge(_) => "ERR_RESPONSE_TOO_LARGE",
            Self::StateSave { .. } => "ERR_STATE_SAVE",
            Self::StateGet { .. } => "ERR_STATE_GET",
            Self::StateDelete { .. } => "ERR_STATE_DELETE",
            Self::StateBulkDelete { .. } => "ERR_STATE_DELETE_BULK",
            Self::StateBulkGet { .. } => "ERR_STATE_BULK_GET",
            Self::SecretGet { .. } | Self::SecretBulkGet { .. } => "ERR_SECRET_GET",
            Self::ConfigGet { .. } => "ERR_CONFIGURATION_GET",
            Self::ConfigSubscribe { .. } => "ERR_CONFIGURATION_SUBSCRIBE",
            Self::NotReady(_) | Self::NotReadyWithheld => "ERR_HEALTH_NOT_READY",
            Self::AdminUnauthorized => "ERR_API_UNAUTHORIZED",
            Self::RouteNotFound { .. } => "ERR_NOT_FOUND",
            Self::Timeout(_) => "ERR_TIMEOUT",
            Self::Api { code, .. } | Self::Detailed { code, .. } => code,
        }
    }

    /// The HTTP status, as Dapr answers it.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::StateStoreNotFound { .. }
            | Self::Malformed(_)
            | Self::MalformedBody { .. }
            | Self::MalformedQuery(_)
            | Self::MalformedPath(_)
            | Self::Invalid(_) => StatusCode::BAD_REQUEST,
            Self::BodyTooLarge { .. } | Self::ResponseTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Self::BodiesBusy(_) => StatusCode::TOO_MANY_REQUESTS,
            Self::StateSave { source, .. }
            | Self::StateDelete { source, .. }
            | Self::StateBulkDelete { source, .. } => state_status(source),
            Self::StateGet { .. }
            | Self::StateBulkGet { .. }
            | Self::SecretGet { .. }
            | Self::SecretBulkGet { .. }
            | Self::ConfigGet { .. }
            | Self::ConfigSubscribe { .. }
            | Self::NotReady(_)
            | Self::NotReadyWithheld
            | Self::StateStoresNotConfigured { .. }
            // Dapr's `Configuration(name).StoreNotFound()` is a 500 (gRPC
            // `INVALID_ARGUMENT`); before its standardized configuration
            // errors it answered 400.
            | Self::ConfigStoreNotFound(_) => StatusCode::INTERNAL_SERVER_ERROR,
            // Dapr's `ErrSecretStoreNotFound` is a 401 (and gRPC's
            // `INVALID_ARGUMENT`).
            Self::SecretStoreNotFound(_) | Self::AdminUnauthorized => StatusCode::UNAUTHORIZED,
            Self::RouteNotFound { .. } => StatusCode::NOT_FOUND,
            Self::Timeout(_) => StatusCode::GATEWAY_TIMEOUT,
            Self::Api { status, .. } | Self::Detailed { status, .. } => *status,
        }
    }

    /// Dapr's rich details of this error, where Dapr attaches some.
    pub fn detail(&self) -> Option<ErrorDetail> {
        match self {
            Self::StateStoreNotFound { app_id, .. } => {
                Some(ErrorDetail::state_store_not_found(app_id))
            }
            Self::StateStoresNotConfigured { app_id, .. } => {
                Some(ErrorDetail::state_stores_not_configured(app_id))
            }
            Self::Detailed { detail, .. } => Some(detail.as_ref().clone()),
            _ => None,
        }
    }

    /// The JSON body.
    pub(crate) fn body(&self) -> Value {
        let mut body = json!({ "errorCode": self.code(), "message": self.to_string() });
        if let Self::NotReady(components) = self {
            body["notReady"] = json!(components);
        }
        if let Some(detail) = self.detail() {
            body["details"] = details_json(&detail);
        }
        body
    }
}

/// An error of Dapr's `code`, with its `detail` when there is one.
fn api_error(
    status: StatusCode,
    code: &'static str,
    message: String,
    detail: Option<ErrorDetail>,
) -> HttpError {
    match detail {
        Some(detail) => HttpError::Detailed {
            status,
            code,
            message,
            detail: Box::new(detail),
        },
        None => HttpError::Api {
            status,
            code,
            message,
        },
    }
}

/// Dapr's statuses for write errors: a stale etag is a conflict, a
/// malformed one a bad request, anything else the store answered (a
/// request it refused included, e.g. a `ttlInSeconds` that is no number)
/// a 500. The sidecar's own checks (keys, bounds, options) are
/// [`HttpError::Invalid`] and never get here.
fn state_status(error: &StateError) -> StatusCode {
    match error {
        StateError::EtagMismatch(_) => StatusCode::CONFLICT,
        StateError::EtagInvalid(_) => StatusCode::BAD_REQUEST,
        StateError::Invalid(_) | StateError::Backend(_) | StateError::Unsupported(_) => {
            StatusCode::INTERNAL_SERVER_ERROR
        }
    }
}

/// The shared state operations' errors, in Dapr's HTTP wording.
impl From<StateOpError> for HttpError {
    fn from(err: StateOpError) -> Self {
        match err {
            invalid @ StateOpError::InvalidKey { .. } => {
                let detail = invalid.detail();
                api_error(
                    StatusCode::BAD_REQUEST,
                    "ERR_MALFORMED_REQUEST",
                    invalid.to_string(),
                    detail,
                )
            }
            StateOpError::NotFound { store, app_id } => Self::StateStoreNotFound { store, app_id },
            StateOpError::NotConfigured { store, app_id } => {
                Self::StateStoresNotConfigured { store, app_id }
            }
            too_large @ StateOpError::BulkTooLarge { .. } => {
                Self::ResponseTooLarge(too_large.to_string())
            }
            StateOpError::Get { store, key, source } => Self::StateGet { store, key, source },
            StateOpError::BulkGet { store, source } => Self::StateBulkGet { store, source },
            StateOpError::Save { store, source } => Self::StateSave { store, source },
            StateOpError::Delete { store, key, source } => Self::StateDelete { store, key, source },
            StateOpError::BulkDelete { store, source } => Self::StateBulkDelete { store, source },
            limit @ StateOpError::Limit(_) => Self::Invalid(limit.to_string()),
            transaction @ (StateOpError::TransactionsNotSupported(_)
            | StateOpError::UnsupportedOperation(_)
            | StateOpError::TooManyOperations { .. }
            | StateOpError::Transaction { .. }) => transaction_error(transaction),
        }
    }
}

/// A transaction's errors, with Dapr's HTTP codes: a store without
/// transactions is a 500 `ERR_STATE_STORE_NOT_SUPPORTED`, any failed
/// transaction (its `Multi` failed: a stale or malformed etag, a request
/// the store refused) a 500 `ERR_STATE_TRANSACTION`.
fn transaction_error(err: StateOpError) -> HttpError {
    let (status, code) = match &err {
        StateOpError::TransactionsNotSupported(_) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            "ERR_STATE_STORE_NOT_SUPPORTED",
        ),
        StateOpError::UnsupportedOperation(_) => {
            (StatusCode::BAD_REQUEST, "ERR_NOT_SUPPORTED_STATE_OPERATION")
        }
        StateOpError::TooManyOperations { .. } => (
            StatusCode::BAD_REQUEST,
            "ERR_STATE_STORE_TOO_MANY_TRANSACTIONS",
        ),
        _ => (StatusCode::INTERNAL_SERVER_ERROR, "ERR_STATE_TRANSACTION"),
    };
    let detail = err.detail();
    api_error(status, code, err.to_string(), detail)
}

/// A request over one of the sidecar's bounds is a 400 naming it.
impl From<RequestLimitError> for HttpError {
    fn from(err: RequestLimitError) -> Self {
        Self::Invalid(err.to_string())
    }
}

/// The shared secret operations' errors, in Dapr's HTTP wording.
impl From<SecretOpError> for HttpError {
    fn from(err: SecretOpError) -> Self {
        match err {
            // Dapr's answer when no secret store is configured at all.
            SecretOpError::NotConfigured => Self::Api {
                status: StatusCode::INTERNAL_SERVER_ERROR,
                code: "ERR_SECRET_STORES_NOT_CONFIGURED",
                message: err.to_string(),
            },
            SecretOpError::NotFound(store) => Self::SecretStoreNotFound(store),
            // Dapr's answer for a secret its scope refuses.
            SecretOpError::Denied { .. } => Self::Api {
                status: StatusCode::FORBIDDEN,
                code: "ERR_PERMISSION_DENIED",
                message: err.to_string(),
            },
            SecretOpError::Get {
                store,
                name,
                source,
            } => Self::SecretGet {
                store,
                name,
                source,
            },
            SecretOpError::BulkGet { store, source } => Self::SecretBulkGet { store, source },
        }
    }
}

/// The shared configuration operations' errors, in Dapr's HTTP wording.
impl From<ConfigOpError> for HttpError {
    fn from(err: ConfigOpError) -> Self {
        match err {
            // Dapr's answer when no configuration store is configured at all.
            ConfigOpError::NotConfigured => Self::Api {
                status: StatusCode::INTERNAL_SERVER_ERROR,
                code: "ERR_CONFIGURATION_STORE_NOT_CONFIGURED",
                message: err.to_string(),
            },
            ConfigOpError::NotFound(store) => Self::ConfigStoreNotFound(store),
            too_large @ ConfigOpError::TooLarge { .. } => {
                Self::ResponseTooLarge(too_large.to_string())
            }
            limit @ (ConfigOpError::TooManyKeys { .. } | ConfigOpError::KeysTooLarge { .. }) => {
                Self::Invalid(limit.to_string())
            }
            ConfigOpError::Get {
                store,
                keys,
                source,
            } => Self::ConfigGet {
                store,
                keys,
                source,
            },
            // Writes are not routed over HTTP (Dapr has none); should one
            // be, it reads as the configuration error it is.
            ConfigOpError::Save {
                store,
                keys,
                source,
            }
            | ConfigOpError::Delete {
                store,
                keys,
                source,
            } => Self::ConfigGet {
                store,
                keys,
                source,
            },
            ConfigOpError::Subscribe {
                store,
                keys,
                source,
            } => Self::ConfigSubscribe {
                store,
                keys,
                source,
            },
        }
    }
}

impl IntoResponse for HttpError {
    /// Logs the failure (its message Debug-escaped: a request value it
    /// quotes cannot break the line or forge another; the log's redacting
    /// writer scrubs secrets in that form too) and answers it.
    fn into_response(self) -> Response {
        tracing::debug!(code = self.code(), status = self.status().as_u16(), error = ?self.to_string(), "HTTP call failed.");
        (self.status(), Json(self.body())).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etag_errors_map_to_dapr_statuses() {
        let conflict = HttpError::StateSave {
            store: "s".into(),
            source: StateError::EtagMismatch("k".into()),
        };
        assert_eq!(conflict.status(), StatusCode::CONFLICT);
        assert_eq!(conflict.code(), "ERR_STATE_SAVE");
        let invalid = HttpError::StateDelete {
            store: "s".into(),
            key: "k".into(),
            source: StateError::EtagInvalid("k".into()),
        };
        assert_eq!(invalid.status(), StatusCode::BAD_REQUEST);
        assert!(
            invalid
                .to_string()
                .starts_with("failed deleting state with key k from state store s: "),
            "{invalid}"
        );
        let not_found = HttpError::from(StateOpError::NotFound {
            store: "x".into(),
            app_id: "shop".into(),
        });
        assert_eq!(not_found.body()["message"], "state store x is not found");
        let none = HttpError::from(StateOpError::NotConfigured {
            store: "x".into(),
            app_id: "shop".into(),
        });
        assert_eq!(none.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(none.code(), "ERR_STATE_STORE_NOT_CONFIGURED");
        assert_eq!(none.body()["message"], "state store x is not configured");
        let not_found = HttpError::from(ConfigOpError::NotFound("c".into()));
        assert_eq!(
            not_found.body()["message"],
            "configuration store c not found"
        );
        assert_eq!(not_found.status(), StatusCode::INTERNAL_SERVER_ERROR);
    }

    #[test]
    fn a_request_the_store_refuses_is_a_server_error_as_in_dapr() {
        let save = HttpError::from(StateOpError::Save {
            store: "s".into(),
            source: StateError::Invalid("ttlInSeconds `soon`".into()),
        });
        assert_eq!(save.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(save.code(), "ERR_STATE_SAVE");
        let delete = HttpError::from(StateOpError::Delete {
            store: "s".into(),
            key: "k".into(),
            source: StateError::Invalid("the key is empty".into()),
        });
        assert_eq!(delete.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(delete.code(), "ERR_STATE_DELETE");
        // The sidecar's own checks stay the caller's.
        let key = HttpError::from(StateOpError::InvalidKey {
            store: "s".into(),
            key: "a||b".into(),
            index: Some(0),
            problem: "bad".into(),
        });
        assert_eq!(key.status(), StatusCode::BAD_REQUEST);
        assert_eq!(key.code(), "ERR_MALFORMED_REQUEST");
    }

    #[test]
    fn any_failed_transaction_is_a_server_error_as_in_dapr() {
        for source in [
            StateError::EtagInvalid("k".into()),
            StateError::Invalid("the key is empty".into()),
            StateError::EtagMismatch("k".into()),
        ] {
            let failed = HttpError::from(StateOpError::Transaction {
                store: "s".into(),
                source,
            });
            assert_eq!(failed.status(), StatusCode::INTERNAL_SERVER_ERROR);
            assert_eq!(failed.code(), "ERR_STATE_TRANSACTION");
            assert!(failed.body().get("details").is_none());
        }
    }

    /// A request value quoted in an error message is logged escaped, on
    /// the failure's one line (failed before the fix: logged raw, so a
    /// `\n` in it started a forged line).
    #[test]
    fn an_error_quoting_a_line_break_is_logged_on_one_line() {
        use std::sync::{Arc, Mutex};
        use tracing_subscriber::layer::SubscriberExt as _;

        /// The log's bytes, as a log writer receives them.
        #[derive(Clone, Default)]
        struct Captured(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Captured {
            fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
                let mut written = self.0.lock().unwrap_or_else(|p| p.into_inner());
                written.extend_from_slice(bytes);
                Ok(bytes.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }

        let captured = Captured::default();
        let writer = captured.clone();
        let layer = tracing_subscriber::fmt::layer()
            .with_ansi(false)
            .with_writer(move || writer.clone());
        let subscriber = tracing_subscriber::registry().with(layer);
        let error = HttpError::Invalid("key `k\nFORGED  WARN rewire: forged` refused".into());
        let response = tracing::subscriber::with_default(subscriber, || error.into_response());

        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
        let written = captured.0.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let logged = String::from_utf8_lossy(&written);
        assert_eq!(logged.lines().count(), 1, "{logged}");
        assert!(logged.contains(r"k\nFORGED"), "{logged}");
    }

    #[test]
    fn not_ready_lists_the_components() {
        let error = HttpError::NotReady(vec!["state/a: warming up".into()]);
        assert_eq!(error.body()["notReady"][0], "state/a: warming up");
        assert_eq!(error.status(), StatusCode::INTERNAL_SERVER_ERROR);
    }

    #[test]
    fn no_secret_store_at_all_is_dapr_not_configured() {
        let none = HttpError::from(SecretOpError::NotConfigured);
        assert_eq!(none.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(none.code(), "ERR_SECRET_STORES_NOT_CONFIGURED");
        assert_eq!(none.body()["message"], "secret store is not configured");
        // A store that is not found is Dapr's 401, not a 400.
        let unknown = HttpError::from(SecretOpError::NotFound("vault".into()));
        assert_eq!(unknown.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(unknown.code(), "ERR_SECRET_STORE_NOT_FOUND");
    }
}
