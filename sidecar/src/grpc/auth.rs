//! Token checks, one interceptor per service: the Dapr and Layotto
//! services want the app token (refused as Dapr refuses it), the Lifecycle
//! service the admin token.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tonic::codegen::http::HeaderMap;
use tonic::service::Interceptor;
use tonic::{Code, Request, Status};
use tonic_types::{ErrorDetails, StatusExt};

use crate::dapr::DAPR_DOMAIN;
use crate::result_code::ResultCode;
use crate::{ApiMetrics, ApiState, ApiToken};

/// How a call without the token is answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Refusal {
    /// As Dapr's `checkAPITokenInContext`: `UNAUTHENTICATED` "Unauthorized"
    /// with the `ErrorInfo` of its `ErrorFromHTTPResponseCode(401, …)`.
    Dapr,
    /// `UNAUTHENTICATED` naming the first header (rewire's own APIs).
    NamingHeader,
}

/// Rejects a call that does not carry `token` in one of `headers` (when a
/// token is configured) with `UNAUTHENTICATED`.
#[derive(Clone)]
pub(super) struct RequireToken {
    token: Option<ApiToken>,
    headers: &'static [&'static str],
    refusal: Refusal,
    metrics: Arc<ApiMetrics>,
}

impl RequireToken {
    /// Requires `token` (if any) in one of `headers`, refused as `refusal`
    /// says (the first header is the one named).
    pub(super) fn new(
        token: Option<ApiToken>,
        headers: &'static [&'static str],
        refusal: Refusal,
        state: &ApiState,
    ) -> Self {
        Self {
            token,
            headers,
            refusal,
            metrics: state.metrics.clone(),
        }
    }

    /// Whether a call with `headers` passes: no token is required, or
    /// one of the headers carries it.
    pub(super) fn admits(&self, headers: &HeaderMap) -> bool {
        self.token.as_ref().is_none_or(|token| {
            self.headers
                .iter()
                .filter_map(|header| headers.get(*header))
                .any(|value| token.matches(value.as_bytes()))
        })
    }
}

impl Interceptor for RequireToken {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        if self.admits(request.metadata().as_ref()) {
            return Ok(request);
        }
        // The method is not known before the call is routed: rejected calls
        // are counted under one label.
        self.metrics.observe_request(
            "grpc",
            "Unauthenticated",
            None,
            ResultCode::Grpc("UNAUTHENTICATED"),
            Duration::ZERO,
        );
        Err(match self.refusal {
            Refusal::Dapr => {
                let missing = !self
                    .headers
                    .iter()
                    .any(|name| request.metadata().as_ref().contains_key(*name));
                dapr_refusal(missing)
            }
            Refusal::NamingHeader => {
                let header = self.headers.first().copied().unwrap_or_default();
                Status::unauthenticated(format!("missing or invalid {header}"))
            }
        })
    }
}

/// Dapr's answer to a call without the right `dapr-api-token`: its
/// `ErrorFromHTTPResponseCode(401, detail)` (the HTTP status text as the
/// message and reason; the detail says whether the token was missing or
/// did not match, never what it was).
fn dapr_refusal(missing: bool) -> Status {
    let detail = if missing {
        "missing api token in request metadata"
    } else {
        "authentication error: api token mismatch"
    };
    let metadata = HashMap::from([
        ("http.code".to_string(), "401".to_string()),
        ("http.error_message".to_string(), detail.to_string()),
    ]);
    let details = ErrorDetails::with_error_info("Unauthorized", DAPR_DOMAIN, metadata);
    Status::with_error_details(Code::Unauthenticated, "Unauthorized", details)
}
