//! Dapr's lock routes: `POST /v1.0-alpha1/lock/{store}` (`{"resourceId",
//! "lockOwner", "expiryInSeconds"}` → `{"success": bool}`) and `POST
//! /v1.0-alpha1/unlock/{store}` (`{"resourceId", "lockOwner"}` →
//! `{"status": 0|1|2|3}`), on the shared [`LockOps`](crate::dapr::LockOps)
//! that gRPC uses too. Errors carry the codes and statuses of Dapr's
//! `pkg/messages` (Dapr attaches no error details to lock errors).

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde::{Deserialize, Deserializer, Serialize};

use rewire_runtime::{echoed, LockError, UnlockStatus};

use super::error::HttpError;
use super::input::{json_body, RawBody};
use super::path_params::PathParams;
use crate::dapr::{Call, LockOpError};
use crate::ApiState;

/// A try-lock, as Dapr's HTTP API takes it (protobuf JSON: camelCase or
/// the proto's own names).
#[derive(Debug, Deserialize)]
struct TryLock {
    #[serde(default, alias = "resource_id", rename = "resourceId")]
    resource_id: String,
    #[serde(default, alias = "lock_owner", rename = "lockOwner")]
    lock_owner: String,
    #[serde(
        default,
        alias = "expiry_in_seconds",
        rename = "expiryInSeconds",
        deserialize_with = "whole_number"
    )]
    expiry_in_seconds: i64,
}

/// An unlock, as Dapr's HTTP API takes it.
#[derive(Debug, Deserialize)]
struct Unlock {
    #[serde(default, alias = "resource_id", rename = "resourceId")]
    resource_id: String,
    #[serde(default, alias = "lock_owner", rename = "lockOwner")]
    lock_owner: String,
}

/// Whether the lock was taken.
#[derive(Debug, Serialize)]
pub struct TryLockAnswer {
    success: bool,
}

/// The unlock outcome as Dapr's enum number.
#[derive(Debug, Serialize)]
pub struct UnlockAnswer {
    status: i32,
}

/// `POST /v1.0-alpha1/lock/{store}`.
pub async fn try_lock(
    State(state): State<ApiState>,
    call: Call,
    PathParams(store_name): PathParams<String>,
    body: RawBody,
) -> Result<Json<TryLockAnswer>, HttpError> {
    // As Dapr: the body is read first, then the request checked and the
    // store looked up (by the operation, in Dapr's order).
    let request: TryLock = json_body(body, state.options.max_request_bytes)?;
    let store = call.lock_store(&store_name);
    let success = store
        .try_lock(
            request.resource_id,
            request.lock_owner,
            request.expiry_in_seconds,
        )
        .await?;
    Ok(Json(TryLockAnswer { success }))
}

/// `POST /v1.0-alpha1/unlock/{store}`.
pub async fn unlock(
    State(state): State<ApiState>,
    call: Call,
    PathParams(store_name): PathParams<String>,
    body: RawBody,
) -> Result<Json<UnlockAnswer>, HttpError> {
    let request: Unlock = json_body(body, state.options.max_request_bytes)?;
    let store = call.lock_store(&store_name);
    let status = store
        .unlock(request.resource_id, request.lock_owner)
        .await?;
    Ok(Json(UnlockAnswer {
        status: unlock_number(status),
    }))
}

/// Dapr's `UnlockResponse.Status` numbers.
fn unlock_number(status: UnlockStatus) -> i32 {
    match status {
        UnlockStatus::Success => 0,
        UnlockStatus::LockDoesNotExist => 1,
        UnlockStatus::LockBelongsToOthers => 2,
    }
}

/// A JSON number, or a string holding one (protobuf JSON's int64 form);
/// `null` is 0. Read as it comes, without building a value: an array or
/// object is refused at its first byte, and a value quoted in the error is
/// cut short.
fn whole_number<'de, D: Deserializer<'de>>(deserializer: D) -> Result<i64, D::Error> {
    deserializer.deserialize_any(WholeNumber)
}

/// The visitor of [`whole_number`].
struct WholeNumber;

impl WholeNumber {
    fn not_whole<E: serde::de::Error>(shown: &str) -> E {
        E::custom(format!("`{}` is not a whole number", echoed(shown)))
    }
}

impl serde::de::Visitor<'_> for WholeNumber {
    type Value = i64;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a whole number, or a string holding one")
    }

    fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<i64, E> {
        Ok(n)
    }

    fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<i64, E> {
        i64::try_from(n).map_err(|_| Self::not_whole(&n.to_string()))
    }

    fn visit_f64<E: serde::de::Error>(self, n: f64) -> Result<i64, E> {
        Err(Self::not_whole(&n.to_string()))
    }

    fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<i64, E> {
        s.trim().parse().map_err(|_| Self::not_whole(s))
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<i64, E> {
        Ok(0)
    }

    fn visit_none<E: serde::de::Error>(self) -> Result<i64, E> {
        Ok(0)
    }
}

/// The shared lock operations' errors, with Dapr's HTTP codes.
impl From<LockOpError> for HttpError {
    fn from(err: LockOpError) -> Self {
        if let Some(LockError::Invalid(_)) = err.store_error() {
            // The store found the request malformed (an expiry past its
            // maximum, a resource over its limit): the caller's fault, as
            // gRPC's INVALID_ARGUMENT says.
            return HttpError::Api {
                status: StatusCode::BAD_REQUEST,
                code: "ERR_MALFORMED_REQUEST",
                message: err.to_string(),
            };
        }
        let (status, code) = match &err {
            // Dapr's answer when no lock store is configured at all.
            LockOpError::NotConfigured(_) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "ERR_LOCK_STORE_NOT_CONFIGURED",
            ),
            LockOpError::NotFound(_) => (StatusCode::BAD_REQUEST, "ERR_LOCK_STORE_NOT_FOUND"),
            LockOpError::ResourceIdEmpty(_)
            | LockOpError::LockOwnerEmpty(_)
            | LockOpError::ExpiryNotPositive(_) => {
                (StatusCode::BAD_REQUEST, "ERR_MALFORMED_REQUEST")
            }
            // Dapr fails building the key (500 `ERR_TRY_LOCK`); rewire
            // refuses the id as malformed, its message saying why.
            LockOpError::ResourceIdSeparator(_) => {
                (StatusCode::BAD_REQUEST, "ERR_MALFORMED_REQUEST")
            }
            LockOpError::TryLock { .. } => (StatusCode::INTERNAL_SERVER_ERROR, "ERR_TRY_LOCK"),
            LockOpError::Unlock { .. } => (StatusCode::INTERNAL_SERVER_ERROR, "ERR_UNLOCK"),
            // Layotto's gRPC-only lease renewal; not routed over HTTP.
            LockOpError::KeepAlive { .. } => {
                (StatusCode::INTERNAL_SERVER_ERROR, "ERR_LOCK_KEEP_ALIVE")
            }
        };
        HttpError::Api {
            status,
            code,
            message: err.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_take_dapr_json() {
        let lock: TryLock = serde_json::from_str(
            r#"{"resourceId": "r", "lockOwner": "o", "expiryInSeconds": "60"}"#,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            (lock.resource_id.as_str(), lock.lock_owner.as_str()),
            ("r", "o")
        );
        assert_eq!(lock.expiry_in_seconds, 60);
        let snake: TryLock =
            serde_json::from_str(r#"{"resource_id": "r", "expiry_in_seconds": 5}"#)
                .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(snake.expiry_in_seconds, 5);
        assert!(serde_json::from_str::<TryLock>(r#"{"expiryInSeconds": 1.5}"#).is_err());
        let null: TryLock =
            serde_json::from_str(r#"{"expiryInSeconds": null}"#).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(null.expiry_in_seconds, 0);
    }

    #[test]
    fn an_expiry_that_is_no_number_is_refused_quoted_short() {
        let long = "9".repeat(100_000) + "x";
        let body = serde_json::json!({"resourceId": "r", "expiryInSeconds": long}).to_string();
        let error = serde_json::from_str::<TryLock>(&body).expect_err("no number");
        let shown = error.to_string();
        assert!(shown.contains("is not a whole number"), "{shown}");
        assert!(shown.len() < 1_000, "quoted whole: {} bytes", shown.len());
        let huge = r#"{"expiryInSeconds": 1e300}"#;
        let error = serde_json::from_str::<TryLock>(huge).expect_err("no whole number");
        assert!(error.to_string().len() < 1_000, "{error}");
        // An array is refused as it starts, whatever follows.
        let array = format!("{{\"expiryInSeconds\": [{}", "[".repeat(10_000));
        let error = serde_json::from_str::<TryLock>(&array).expect_err("an array");
        assert!(error.to_string().contains("whole number"), "{error}");
    }

    #[test]
    fn errors_have_dapr_codes() {
        let err = HttpError::from(LockOpError::NotFound("l".into()));
        assert_eq!(
            (err.status(), err.code()),
            (StatusCode::BAD_REQUEST, "ERR_LOCK_STORE_NOT_FOUND")
        );
        for invalid in [
            LockOpError::ExpiryNotPositive("l".into()),
            LockOpError::ResourceIdEmpty("l".into()),
            LockOpError::LockOwnerEmpty("l".into()),
            LockOpError::ResourceIdSeparator("l".into()),
        ] {
            let err = HttpError::from(invalid);
            assert_eq!(
                (err.status(), err.code()),
                (StatusCode::BAD_REQUEST, "ERR_MALFORMED_REQUEST")
            );
        }
        let err = HttpError::from(LockOpError::NotConfigured("l".into()));
        assert_eq!(
            (err.status(), err.code()),
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "ERR_LOCK_STORE_NOT_CONFIGURED"
            )
        );
        let err = HttpError::from(LockOpError::TryLock {
            store: "l".into(),
            resource_id: "r".into(),
            source: LockError::Invalid("expiry past the maximum".into()),
        });
        assert_eq!(
            (err.status(), err.code()),
            (StatusCode::BAD_REQUEST, "ERR_MALFORMED_REQUEST")
        );
        assert_eq!(unlock_number(UnlockStatus::LockBelongsToOthers), 2);
    }
}
