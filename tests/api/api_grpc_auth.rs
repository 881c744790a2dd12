//! Tokens and limits on the gRPC API: with an app token set, every Dapr
//! call must carry it in `dapr-api-token`; the Lifecycle API wants the
//! admin token (in `rewire-admin-token`, or `dapr-api-token`); a request
//! larger than `max_request_bytes` gets `RESOURCE_EXHAUSTED` naming the
//! limit.

use crate::support::grpc;
use crate::support::sidecar;

use grpc::common::StateItem;
use grpc::dapr::{GetMetadataRequest, SaveStateRequest};
use grpc::lifecycle::GetStatusRequest;
use grpc::with_header;
use rewire::sidecar::auth::{ADMIN_TOKEN_HEADER, APP_TOKEN_HEADER};
use rewire::sidecar::{ApiOptions, ApiToken};
use sidecar::Sidecar;
use tonic::{Code, Request, Status};
use tonic_types::StatusExt;

const CONFIG: &str =
    r#"{"appId": "shop", "components": {"state": {"orders": {"type": "memory"}}}}"#;
const APP_TOKEN: &str = "app-token-0123";
const ADMIN_TOKEN: &str = "admin-token-4567";
const LIMIT: usize = 64 * 1024;

async fn sidecar() -> Sidecar {
    let options = ApiOptions {
        app_token: Some(ApiToken::new(APP_TOKEN)),
        admin_token: Some(ApiToken::new(ADMIN_TOKEN)),
        max_request_bytes: LIMIT,
        ..ApiOptions::default()
    };
    Sidecar::start(CONFIG, options).await
}

fn save(size: usize) -> SaveStateRequest {
    SaveStateRequest {
        store_name: "orders".into(),
        states: vec![StateItem {
            key: "k".into(),
            value: vec![7; size],
            ..StateItem::default()
        }],
    }
}

/// Asserts `status` is Dapr's refusal of a call without the right token
/// (`checkAPITokenInContext`): `UNAUTHENTICATED` "Unauthorized" with the
/// `ErrorInfo` of its `ErrorFromHTTPResponseCode(401, detail)`.
fn assert_dapr_refusal(status: &Status, detail: &str) {
    assert_eq!(
        (status.code(), status.message()),
        (Code::Unauthenticated, "Unauthorized"),
        "{status:?}"
    );
    let info = status.get_details_error_info().expect("an ErrorInfo");
    assert_eq!(
        (info.reason.as_str(), info.domain.as_str()),
        ("Unauthorized", "dapr.io")
    );
    assert_eq!(
        info.metadata.get("http.code").map(String::as_str),
        Some("401")
    );
    assert_eq!(
        info.metadata.get("http.error_message").map(String::as_str),
        Some(detail)
    );
}

/// A Dapr call without the token, or with another, is refused as Dapr
/// refuses it (failed before the fix: "missing or invalid dapr-api-token"
/// and no details); the token itself is never echoed.
#[tokio::test]
async fn dapr_calls_need_the_app_token() {
    let sidecar = sidecar().await;
    let mut client = grpc::dapr_client(sidecar.grpc_url()).await;
    let missing = client
        .get_metadata(GetMetadataRequest {})
        .await
        .expect_err("no token");
    assert_dapr_refusal(&missing, "missing api token in request metadata");
    for wrong in ["app-token-012", "app-token-01234", ADMIN_TOKEN, ""] {
        let request = with_header(GetMetadataRequest {}, APP_TOKEN_HEADER, wrong);
        let status = client.get_metadata(request).await.expect_err("wrong token");
        assert_dapr_refusal(&status, "authentication error: api token mismatch");
        assert!(!format!("{status:?}").contains(APP_TOKEN), "{status:?}");
    }
    let request = with_header(save(10), APP_TOKEN_HEADER, APP_TOKEN);
    client
        .save_state(request)
        .await
        .expect("the right token passes");
    let unauthenticated = client
        .save_state(Request::new(save(10)))
        .await
        .expect_err("no token");
    assert_dapr_refusal(&unauthenticated, "missing api token in request metadata");
    sidecar.stop().await;
}

#[tokio::test]
async fn lifecycle_calls_need_the_admin_token() {
    let sidecar = sidecar().await;
    let mut client = grpc::lifecycle_client(sidecar.grpc_url()).await;
    let missing = client
        .get_status(GetStatusRequest {})
        .await
        .expect_err("no token");
    assert_eq!(missing.code(), Code::Unauthenticated);
    assert_eq!(missing.message(), "missing or invalid rewire-admin-token");
    let app_token = with_header(GetStatusRequest {}, ADMIN_TOKEN_HEADER, APP_TOKEN);
    let status = client
        .get_status(app_token)
        .await
        .expect_err("the app token is not the admin token");
    assert_eq!(status.code(), Code::Unauthenticated);
    let app_token = with_header(GetStatusRequest {}, APP_TOKEN_HEADER, APP_TOKEN);
    assert_eq!(
        client
            .get_status(app_token)
            .await
            .map(|_| ())
            .map_err(|s| s.code()),
        Err(Code::Unauthenticated)
    );

    for header in [ADMIN_TOKEN_HEADER, APP_TOKEN_HEADER] {
        let request = with_header(GetStatusRequest {}, header, ADMIN_TOKEN);
        let status = client
            .get_status(request)
            .await
            .unwrap_or_else(|e| panic!("admin token in {header}: {e}"));
        assert_eq!(status.into_inner().generation, 1);
    }
    sidecar.stop().await;
}

#[tokio::test]
async fn oversized_requests_get_a_clear_error() {
    let sidecar = sidecar().await;
    let mut client = grpc::dapr_client(sidecar.grpc_url()).await;
    let request = with_header(save(LIMIT + 1), APP_TOKEN_HEADER, APP_TOKEN);
    let status = client.save_state(request).await.expect_err("too large");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(
        status
            .message()
            .contains(&format!("the limit is {LIMIT} bytes (max_request_bytes)")),
        "{}",
        status.message()
    );
    assert!(
        status.message().contains("request message of"),
        "{}",
        status.message()
    );

    let fits = with_header(save(LIMIT / 2), APP_TOKEN_HEADER, APP_TOKEN);
    client
        .save_state(fits)
        .await
        .expect("a request under the limit passes");
    sidecar.stop().await;
}

#[tokio::test]
async fn without_an_admin_token_the_app_token_guards_the_lifecycle_api() {
    let options = ApiOptions {
        app_token: Some(ApiToken::new(APP_TOKEN)),
        ..ApiOptions::default()
    };
    let sidecar = Sidecar::start(CONFIG, options).await;
    let mut client = grpc::lifecycle_client(sidecar.grpc_url()).await;
    let missing = client
        .get_status(GetStatusRequest {})
        .await
        .expect_err("no token");
    assert_eq!(missing.code(), Code::Unauthenticated);
    let request = with_header(GetStatusRequest {}, APP_TOKEN_HEADER, APP_TOKEN);
    client.get_status(request).await.unwrap_or_else(|e| {
        panic!("the app token opens the lifecycle API when no admin token is set: {e}")
    });
    sidecar.stop().await;
}

/// A library embedder who configures TLS (and a Lifecycle CA, which stands
/// in for the admin token) but hands `serve` a state with no TLS loaded
/// gets an error, not a plain-text listener open to every Lifecycle call.
#[tokio::test]
async fn tls_configured_but_not_loaded_is_refused_by_both_servers() {
    use rewire::sidecar::tls::{ListenerTls, ServingTls, TlsSettings};
    use rewire::sidecar::{grpc as grpc_server, http, ApiError, ApiMetrics, ApiState};
    use std::sync::Arc;

    let runtime = crate::support::start(CONFIG).await.expect("start");
    let listener_tls = || ListenerTls {
        cert: "/nonexistent/server.pem".into(),
        key: "/nonexistent/server.key".into(),
        client_ca: None,
    };
    let state = |tls: TlsSettings| ApiState {
        runtime: runtime.clone(),
        options: Arc::new(ApiOptions {
            tls,
            ..ApiOptions::default()
        }),
        metrics: Arc::new(ApiMetrics::new()),
        tls: ServingTls::default(),
    };
    let listener = || async {
        tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind")
    };
    let shutdown = tokio_util::sync::CancellationToken::new();
    let grpc_tls = TlsSettings {
        grpc: Some(listener_tls()),
        lifecycle_client_ca: Some("/nonexistent/admins.pem".into()),
        ..TlsSettings::default()
    };
    let served = testkit::soon(
        "gRPC serve to answer",
        grpc_server::serve(state(grpc_tls), listener().await, shutdown.clone()),
    )
    .await;
    assert!(matches!(served, Err(ApiError::Tls(_))), "{served:?}");
    let http_tls = TlsSettings {
        http: Some(listener_tls()),
        ..TlsSettings::default()
    };
    let served = testkit::soon(
        "HTTP serve to answer",
        http::serve(state(http_tls), listener().await, shutdown.clone()),
    )
    .await;
    assert!(matches!(served, Err(ApiError::Tls(_))), "{served:?}");
    runtime.shutdown().await;
}
