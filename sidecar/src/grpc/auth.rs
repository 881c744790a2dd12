//! Token checks, one interceptor per service: the Dapr service wants the app
//! token, the Lifecycle service the admin token.

use std::sync::Arc;
use std::time::Duration;

use tonic::codegen::http::HeaderMap;
use tonic::service::Interceptor;
use tonic::{Request, Status};

use crate::metrics::ResultCode;
use crate::{ApiMetrics, ApiState, ApiToken};

/// Rejects a call that does not carry `token` in one of `headers` (when a
/// token is configured) with `UNAUTHENTICATED`.
#[derive(Clone)]
pub(super) struct RequireToken {
    token: Option<ApiToken>,
    headers: &'static [&'static str],
    metrics: Arc<ApiMetrics>,
}

impl RequireToken {
    /// Requires `token` (if any) in one of `headers`; the first header is
    /// the one named in the error.
    pub(super) fn new(
        token: Option<ApiToken>,
        headers: &'static [&'static str],
        state: &ApiState,
    ) -> Self {
        Self {
            token,
            headers,
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
        let header = self.headers.first().copied().unwrap_or_default();
        Err(Status::unauthenticated(format!(
            "missing or invalid {header}"
        )))
    }
}
