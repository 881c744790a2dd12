//! Admin data needs the admin token, on HTTP as on gRPC: with
//! `REWIRE_ADMIN_TOKEN` set, status and `/metrics` refuse callers without
//! it (the app token is not enough), like Lifecycle `GetStatus`; without an
//! admin token the app token guards them. An unhealthy `/v1.0/healthz`
//! lists components and their errors (backend addresses) only to callers
//! presenting a token.

use crate::support::grpc;
use crate::support::sidecar;

use std::sync::atomic::{AtomicBool, Ordering};

use reqwest::{Client, StatusCode};
use rewire::prelude::*;
use rewire::sidecar::{ApiOptions, ApiToken};
use serde_json::Value;
use sidecar::Sidecar;
use tonic::Code;

const APP: &str = "app-token-1a2b";
const ADMIN: &str = "admin-token-3c4d";
/// Where the unready probe says its backend is: must not reach strangers.
const BACKEND: &str = "10.9.8.7:6379";

/// Set once the sidecar has started (start waits for readiness).
static UNREADY: AtomicBool = AtomicBool::new(false);

#[derive(rewire::Component)]
#[component(kind = "probe", type = "test.admin.unready")]
struct Unready {}

#[async_trait]
impl Component for Unready {
    async fn readiness(&self) -> Readiness {
        if UNREADY.load(Ordering::SeqCst) {
            return Readiness::NotReady(format!("cannot reach {BACKEND}"));
        }
        Readiness::Ready
    }
}

const CONFIG: &str = r#"{"components": {"probe": {"p": {"type": "test.admin.unready"}}}}"#;
/// A sidecar whose components are all ready.
const READY: &str = r#"{"components": {"state": {"s": {"type": "memory"}}}}"#;

async fn get(sidecar: &Sidecar, path: &str, headers: &[(&str, &str)]) -> (StatusCode, String) {
    let mut request = Client::new().get(format!("{}{path}", sidecar.http_url()));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.expect("request failed");
    (response.status(), response.text().await.unwrap_or_default())
}

#[tokio::test]
async fn with_an_admin_token_status_and_metrics_need_it_as_get_status_does() {
    for app_token in [None, Some(APP)] {
        let options = ApiOptions {
            app_token: app_token.map(ApiToken::new),
            admin_token: Some(ApiToken::new(ADMIN)),
            ..ApiOptions::default()
        };
        let sidecar = Sidecar::start(READY, options).await;
        for path in ["/v1.0/rewire/status", "/metrics"] {
            let (open, _) = get(&sidecar, path, &[]).await;
            assert_eq!(open, StatusCode::UNAUTHORIZED, "{path} without a token");
            let (app, _) = get(&sidecar, path, &[("dapr-api-token", APP)]).await;
            assert_eq!(app, StatusCode::UNAUTHORIZED, "{path} with the app token");
            let (admin, _) = get(&sidecar, path, &[("rewire-admin-token", ADMIN)]).await;
            assert_eq!(admin, StatusCode::OK, "{path} with the admin token");
        }
        let mut lifecycle = grpc::lifecycle_client(sidecar.grpc_url()).await;
        let refused = lifecycle
            .get_status(grpc::lifecycle::GetStatusRequest {})
            .await
            .expect_err("GetStatus without the admin token");
        assert_eq!(refused.code(), Code::Unauthenticated);
        sidecar.stop().await;
    }
}

#[tokio::test]
async fn unhealthy_detail_only_to_callers_with_a_token() {
    let options = ApiOptions {
        app_token: Some(ApiToken::new(APP)),
        ..ApiOptions::default()
    };
    let sidecar = Sidecar::start(CONFIG, options).await;
    UNREADY.store(true, Ordering::SeqCst);
    let (status, body) = get(&sidecar, "/v1.0/healthz", &[]).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(!body.contains(BACKEND), "leaked to a stranger: {body}");
    assert!(!body.contains("probe/p"), "leaked to a stranger: {body}");
    let (status, body) = get(&sidecar, "/v1.0/healthz", &[("dapr-api-token", APP)]).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    let body: Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(
        body["notReady"][0],
        format!("probe/p: cannot reach {BACKEND}")
    );
    sidecar.stop().await;
}
