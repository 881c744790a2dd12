//! `rewire status` follows no redirect: the tokens it sends
//! (`dapr-api-token`, `rewire-admin-token`) would go wherever a redirect
//! points. A redirect is reported as "not a rewire sidecar" (exit 1).
//! Nor does it, or the sidecar calling its app, go through a proxy named
//! in the environment (`HTTP_PROXY`, `ALL_PROXY`): the tokens, and every
//! event meant for the app on this host, would go to the proxy.
//! Nor does `rewire status` read an answer without bound.

use std::io::{Read, Write};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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

/// The proxy variables reqwest reads, each set to `proxy` on `command`
/// (and none that exempts a host).
fn through_proxy(command: &mut std::process::Command, proxy: &str) {
    for name in ["HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"] {
        command.env(name, format!("http://{proxy}"));
    }
    for name in ["NO_PROXY", "no_proxy", "HTTPS_PROXY", "https_proxy"] {
        command.env_remove(name);
    }
}

/// A loopback listener standing for a proxy (or an app): counts the
/// connections whose first bytes contain `wanted` (any connection when
/// empty), then answers `answer` and closes. Its address and the count.
fn recording_listener(wanted: &'static str, answer: &'static str) -> (String, Arc<AtomicUsize>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let seen = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&seen);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
            let mut head = [0u8; 1024];
            let read = stream.read(&mut head).unwrap_or(0);
            let text = String::from_utf8_lossy(&head[..read]);
            if wanted.is_empty() || text.contains(wanted) {
                counted.fetch_add(1, Ordering::SeqCst);
            }
            let _ = stream.write_all(answer.as_bytes());
        }
    });
    (addr, seen)
}

/// `rewire status` with a proxy in the environment connects to the
/// sidecar's address itself: the proxy gets no connection, so never the
/// admin token. Before: reqwest sent the request, tokens included, to the
/// proxy.
#[test]
fn status_sends_its_tokens_through_no_proxy_from_the_environment() {
    let (proxy, proxied) = recording_listener("", "");
    // Nothing listens there: the status fails, told as unreachable.
    let unused = format!("127.0.0.1:{}", testkit::free_port());
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_rewire"));
    command
        .args(["status", "--http-addr", &unused])
        .env("REWIRE_ADMIN_TOKEN", "s3cret")
        .env_remove("DAPR_API_TOKEN")
        .env_remove("REWIRE_API_TOKEN");
    through_proxy(&mut command, &proxy);
    let out = testkit::output(&mut command);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        proxied.load(Ordering::SeqCst),
        0,
        "the proxy got the status request: {stderr}"
    );
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("cannot reach the sidecar at http://{unused}")),
        "{stderr}"
    );
}

/// `rewire run --app-port` with a proxy in the environment asks the app
/// on this host for its subscriptions itself: the app gets
/// `GET /dapr/subscribe`, the proxy nothing. Before: the sidecar's app
/// client sent it (and every event after it) to the proxy.
#[test]
fn the_sidecar_calls_its_app_through_no_proxy_from_the_environment() {
    let (proxy, proxied) = recording_listener("", "");
    let (app, asked) = recording_listener(
        "GET /dapr/subscribe",
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n[]",
    );
    let app_port = app.rsplit(':').next().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("rewire.json");
    std::fs::write(
        &config,
        r#"{"components": {"state": {"orders": {"type": "memory"}}}}"#,
    )
    .unwrap();
    let grpc = format!("127.0.0.1:{}", testkit::free_port());
    let http = format!("127.0.0.1:{}", testkit::free_port());
    let log = dir.path().join("rewire.log");
    let mut sidecar = testkit::ChildProcess::new("rewire run", log, move || {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_rewire"));
        command
            .args(["run", "--grpc-addr", &grpc, "--http-addr", &http])
            .args(["--app-port", &app_port, "--config"])
            .arg(&config)
            .env("NO_COLOR", "1");
        through_proxy(&mut command, &proxy);
        command
    });
    if let Err(err) = sidecar.start_until_logged(Duration::from_secs(30), "Sidecar APIs listening.")
    {
        panic!("sidecar did not start: {err}");
    }
    // The first ask goes out once the app listens (at once here): wait for
    // it to reach one of the two.
    let deadline = Instant::now() + Duration::from_secs(30);
    while asked.load(Ordering::SeqCst) == 0
        && proxied.load(Ordering::SeqCst) == 0
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    let log = sidecar.log();
    assert_eq!(
        proxied.load(Ordering::SeqCst),
        0,
        "the proxy got the app's call:\n{log}"
    );
    assert!(
        asked.load(Ordering::SeqCst) > 0,
        "the app was not asked:\n{log}"
    );
}

/// A peer that streams a status body without end (no `Content-Length`)
/// is cut off past 16 MiB: `rewire status` exits 1 naming the limit.
/// Before: the whole body was read into memory (400 MB streamed took the
/// CLI to 858 MB).
#[test]
fn status_cuts_off_a_body_larger_than_its_limit() {
    const LIMIT: usize = 16 * 1024 * 1024;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let server = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        stream
            .set_write_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let mut head = [0u8; 2048];
        let _ = stream.read(&mut head);
        let _ = stream.write_all(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n{\"pad\": \"");
        let chunk = vec![b'x'; 64 * 1024];
        let mut sent = 0;
        // Just past the limit; the CLI hangs up once past it.
        while sent <= LIMIT {
            if stream.write_all(&chunk).is_err() {
                return;
            }
            sent += chunk.len();
        }
    });
    let out = testkit::output(
        std::process::Command::new(env!("CARGO_BIN_EXE_rewire"))
            .args(["status", "--http-addr", &addr])
            .env_remove("DAPR_API_TOKEN")
            .env_remove("REWIRE_API_TOKEN")
            .env_remove("REWIRE_ADMIN_TOKEN"),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("larger than 16 MiB"), "{stderr}");
    server.join().unwrap();
}
