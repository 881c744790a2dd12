//! `rewire status` follows no redirect: the tokens it sends
//! (`dapr-api-token`, `rewire-admin-token`) would go wherever a redirect
//! points. A redirect is reported as "not a rewire sidecar" (exit 1).

use std::sync::{Arc, Mutex};

use axum::http::{header, HeaderMap, StatusCode};
use axum::routing::get;
use axum::Router;

/// Serves `app` on a free loopback port; returns its address.
async fn serve(app: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

#[tokio::test(flavor = "multi_thread")]
async fn status_does_not_carry_its_tokens_along_a_redirect() {
    // The second server records the headers of every request it gets.
    let seen: Arc<Mutex<Vec<HeaderMap>>> = Arc::default();
    let recorded = Arc::clone(&seen);
    let target = serve(Router::new().fallback(move |headers: HeaderMap| {
        let recorded = Arc::clone(&recorded);
        async move {
            recorded.lock().unwrap().push(headers);
            r#"{"generation": 1, "appId": "elsewhere", "components": [], "reloads": []}"#
        }
    }))
    .await;
    let location = format!("http://{target}/v1.0/rewire/status");
    let redirecting = serve(Router::new().route(
        "/v1.0/rewire/status",
        get(move || async move { (StatusCode::FOUND, [(header::LOCATION, location)]) }),
    ))
    .await;

    let addr = redirecting.clone();
    let out = tokio::task::spawn_blocking(move || {
        testkit::output(
            std::process::Command::new(env!("CARGO_BIN_EXE_rewire"))
                .args(["status", "--http-addr", &addr])
                .env("DAPR_API_TOKEN", "app-secret-31")
                .env("REWIRE_ADMIN_TOKEN", "admin-secret-31")
                .env_remove("REWIRE_API_TOKEN"),
        )
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let seen = seen.lock().unwrap();
    let leaked = seen
        .iter()
        .any(|h| h.contains_key("dapr-api-token") || h.contains_key("rewire-admin-token"));
    assert!(!leaked, "the redirect target got a token: {seen:?}");
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("not a rewire sidecar at {redirecting}")),
        "{stderr}"
    );
}
