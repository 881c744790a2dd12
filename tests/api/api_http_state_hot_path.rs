//! The state GET of a plain key is routed before the router (the hot
//! path); a path with anything percent-encoded goes through the router.
//! Both must answer alike: the same status, headers that matter and body,
//! for a stored key, a missing key, an unknown store, request metadata in
//! the query, and with the app token required.

use crate::support::sidecar;

use reqwest::{Client, Response, StatusCode};
use rewire::sidecar::{ApiOptions, ApiToken};
use serde_json::json;
use sidecar::Sidecar;

const CONFIG: &str =
    r#"{"appId": "shop", "components": {"state": {"orders": {"type": "memory"}}}}"#;

const TOKEN: &str = "hot-path-token-19c2";

/// What a client can see of an answer.
#[derive(Debug, PartialEq)]
struct Seen {
    status: StatusCode,
    content_type: Option<String>,
    etag: Option<String>,
    body: String,
}

async fn seen(response: Response) -> Seen {
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let (content_type, etag) = (header("content-type"), header("etag"));
    Seen {
        status: response.status(),
        content_type,
        etag,
        body: response.text().await.unwrap_or_default(),
    }
}

/// GETs `store`/`tail` plainly (the hot path) and with the store's first
/// letter percent-encoded (the router), and returns both answers.
async fn both_ways(
    client: &Client,
    base: &str,
    store: &str,
    tail: &str,
    token: Option<&str>,
) -> (Seen, Seen) {
    let encoded = format!("%{:02X}{}", store.as_bytes()[0], &store[1..]);
    let mut answers = Vec::new();
    for store in [store, encoded.as_str()] {
        let mut request = client.get(format!("{base}/v1.0/state/{store}/{tail}"));
        if let Some(token) = token {
            request = request.header("dapr-api-token", token);
        }
        answers.push(seen(request.send().await.expect("request failed")).await);
    }
    let router = answers.pop().expect("two answers");
    let hot = answers.pop().expect("two answers");
    (hot, router)
}

#[tokio::test]
async fn the_hot_path_answers_as_the_router_does() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let client = Client::new();
    let base = sidecar.http_url();
    let value = r#"{"zeta":1, "alpha":2.50}"#;
    let saved = client
        .post(format!("{base}/v1.0/state/orders"))
        .header("content-type", "application/json")
        .body(format!(r#"[{{"key": "o-1", "value": {value}}}]"#))
        .send()
        .await
        .expect("save failed");
    assert_eq!(saved.status(), StatusCode::NO_CONTENT);

    let cases = [
        ("orders", "o-1", StatusCode::OK),
        (
            "orders",
            "o-1?metadata.partitionKey=p&consistency=strong",
            StatusCode::OK,
        ),
        ("orders", "missing", StatusCode::NO_CONTENT),
        ("nope", "o-1", StatusCode::BAD_REQUEST),
    ];
    for (store, tail, status) in cases {
        let (hot, router) = both_ways(&client, &base, store, tail, None).await;
        assert_eq!(hot.status, status, "{store}/{tail}: {hot:?}");
        assert_eq!(hot, router, "{store}/{tail}");
    }
    let (hot, _) = both_ways(&client, &base, "orders", "o-1", None).await;
    assert_eq!(hot.body, value, "the stored bytes, as sent");
    assert_eq!(hot.content_type.as_deref(), Some("application/json"));
    assert!(hot.etag.is_some());
    let (hot, router) = both_ways(&client, &base, "nope", "o-1", None).await;
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&hot.body).ok(),
        Some(
            json!({"errorCode": "ERR_STATE_STORE_NOT_FOUND", "message": "state store nope is not found",
                "details": [{"@type": "type.googleapis.com/google.rpc.ErrorInfo",
                    "reason": "DAPR_STATE_NOT_FOUND", "domain": "dapr.io", "metadata": {"appID": "shop"}}]})
        )
    );
    assert_eq!(hot, router);
    sidecar.stop().await;
}

#[tokio::test]
async fn the_hot_path_needs_the_token_as_the_router_does() {
    let options = ApiOptions {
        app_token: Some(ApiToken::new(TOKEN)),
        ..ApiOptions::default()
    };
    let sidecar = Sidecar::start(CONFIG, options).await;
    let client = Client::new();
    let base = sidecar.http_url();
    for (token, status) in [
        (None, StatusCode::UNAUTHORIZED),
        (Some("wrong"), StatusCode::UNAUTHORIZED),
        (Some(TOKEN), StatusCode::NO_CONTENT),
    ] {
        let (hot, router) = both_ways(&client, &base, "orders", "k", token).await;
        assert_eq!(hot.status, status, "{token:?}");
        assert_eq!(hot, router, "{token:?}");
    }
    sidecar.stop().await;
}
