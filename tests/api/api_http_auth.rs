//! The app token over HTTP: with `app_token` set, every route but the two
//! health probes answers 401 without the `dapr-api-token` header (or with
//! a wrong one) and serves with it; a Dapr route's refusal is Dapr's plain
//! text, an admin route's (status, metrics) a JSON error; a body over
//! `max_request_bytes` is 413.

use crate::support::sidecar;

use reqwest::{Client, Method, RequestBuilder, Response, StatusCode};
use rewire::sidecar::{ApiOptions, ApiToken};
use serde_json::{json, Value};
use sidecar::Sidecar;

const TOKEN: &str = "app-token-7f3a";

const CONFIG: &str = r#"{"appId": "shop", "components": {
    "state": {"orders": {"type": "memory"}},
    "config_store": {"settings": {"type": "memory", "metadata": {"items": {"a": "1"}}}},
    "secret_store": {"env": {"type": "env"}}
}}"#;

/// Every route served (plus an unknown one), with a body where it takes one.
fn routes() -> Vec<(Method, &'static str, Option<Value>)> {
    vec![
        (
            Method::POST,
            "/v1.0/state/orders",
            Some(json!([{"key": "k", "value": 1}])),
        ),
        (Method::GET, "/v1.0/state/orders/k", None),
        (Method::DELETE, "/v1.0/state/orders/k", None),
        (
            Method::POST,
            "/v1.0/state/orders/bulk",
            Some(json!({"keys": ["k"]})),
        ),
        (Method::GET, "/v1.0/secrets/env/PATH", None),
        (Method::GET, "/v1.0/secrets/env/bulk", None),
        (Method::GET, "/v1.0/configuration/settings?key=a", None),
        (
            Method::GET,
            "/v1.0-alpha1/configuration/settings?key=a",
            None,
        ),
        (Method::GET, "/v1.0/metadata", None),
        (Method::GET, "/metrics", None),
        (Method::GET, "/v1.0/rewire/status", None),
        (Method::GET, "/v1.0/not-a-route", None),
    ]
}

fn request(
    client: &Client,
    base: &str,
    (method, path, body): &(Method, &str, Option<Value>),
) -> RequestBuilder {
    let builder = client.request(method.clone(), format!("{base}{path}"));
    match body {
        Some(body) => builder.json(body),
        None => builder,
    }
}

async fn send(builder: RequestBuilder) -> Response {
    builder.send().await.expect("request failed")
}

async fn body_json(response: Response) -> Value {
    response.json().await.expect("not JSON")
}

/// A refusal as Dapr's `APITokenAuthMiddleware` writes it (Go's
/// `http.Error`: plain text, `nosniff`), or, on the sidecar's admin routes,
/// its JSON error.
async fn assert_refusal(response: Response, path: &str) {
    if ["/metrics", "/v1.0/rewire/status"].contains(&path) {
        assert_eq!(
            body_json(response).await["errorCode"],
            "ERR_API_UNAUTHORIZED",
            "{path}"
        );
        return;
    }
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned)
    };
    assert_eq!(
        header("content-type").as_deref(),
        Some("text/plain; charset=utf-8"),
        "{path}"
    );
    assert_eq!(
        header("x-content-type-options").as_deref(),
        Some("nosniff"),
        "{path}"
    );
    let body = response.text().await.expect("a body");
    assert_eq!(body, "invalid api token\n", "{path}");
}

fn options() -> ApiOptions {
    ApiOptions {
        app_token: Some(ApiToken::new(TOKEN)),
        ..ApiOptions::default()
    }
}

#[tokio::test]
async fn every_route_but_health_needs_the_token() {
    let sidecar = Sidecar::start(CONFIG, options()).await;
    let client = Client::new();
    let base = sidecar.http_url();

    for route in routes() {
        let without = send(request(&client, &base, &route)).await;
        assert_eq!(
            without.status(),
            StatusCode::UNAUTHORIZED,
            "{} {}",
            route.0,
            route.1
        );
        assert_refusal(without, route.1).await;
        let wrong =
            send(request(&client, &base, &route).header("dapr-api-token", "app-token-7f3b")).await;
        assert_eq!(
            wrong.status(),
            StatusCode::UNAUTHORIZED,
            "{} {}",
            route.0,
            route.1
        );
        assert_refusal(wrong, route.1).await;
        let with = send(request(&client, &base, &route).header("dapr-api-token", TOKEN)).await;
        assert_ne!(
            with.status(),
            StatusCode::UNAUTHORIZED,
            "{} {}",
            route.0,
            route.1
        );
        assert!(
            with.status().as_u16() < 500,
            "{} {}: {}",
            route.0,
            route.1,
            with.status()
        );
    }

    for probe in ["/v1.0/healthz", "/v1.0/healthz/outbound"] {
        let response = send(client.get(format!("{base}{probe}"))).await;
        assert_eq!(response.status(), StatusCode::NO_CONTENT, "{probe}");
    }
    sidecar.stop().await;
}

#[tokio::test]
async fn a_body_over_the_limit_is_413() {
    let sidecar = Sidecar::start(CONFIG, options()).await;
    let client = Client::new();
    let base = sidecar.http_url();
    let big = "x".repeat(5 * 1024 * 1024);
    let body = json!([{"key": "big", "value": big}]).to_string();

    for path in ["/v1.0/state/orders", "/v1.0/state/orders/bulk"] {
        let response = send(
            client
                .post(format!("{base}{path}"))
                .header("dapr-api-token", TOKEN)
                .body(body.clone()),
        )
        .await;
        assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE, "{path}");
        let error = body_json(response).await;
        assert_eq!(error["errorCode"], "ERR_BODY_TOO_LARGE");
        assert!(
            error["message"]
                .as_str()
                .unwrap_or_default()
                .contains("4194304"),
            "{error}"
        );
    }

    // Just under the limit is served.
    let fits = json!([{"key": "fits", "value": "x".repeat(1024 * 1024)}]).to_string();
    let response = send(
        client
            .post(format!("{base}/v1.0/state/orders"))
            .header("dapr-api-token", TOKEN)
            .body(fits),
    )
    .await;
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
    sidecar.stop().await;
}
