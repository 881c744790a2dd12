//! A push is never `CANCELLED` for something applied later: behind a reload
//! whose `init` hangs (init timeout 2 s here), a push whose caller allows
//! 1 s is answered within that second — `queued`, behind how many, not
//! applied yet — and is then applied; the hung push itself gets its
//! rolled-back NACK with the reason before its caller's 10 s deadline.
//! The deadline counts from the request's arrival: a push whose body
//! comes late is still answered before its caller's deadline.

use crate::support::{grpc, sidecar, valid};

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use grpc::lifecycle::{ComponentConfig, DynamicConfiguration};
use rewire::prelude::*;
use rewire::sidecar::ApiOptions;
use rewire::{ComponentKey, Registry, Runtime, RuntimeOptions, StartTimeouts};
use serde::Deserialize;
use sidecar::Sidecar;
use tonic::Request;

/// Set once a hanging `init` has started.
static HUNG: AtomicBool = AtomicBool::new(false);

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct HangMeta {
    hang_init: bool,
}

/// A component whose `init` never answers when `hangInit` is set.
#[derive(rewire::Component)]
#[component(kind = "worker", type = "test.push_deadline.hang")]
struct Hang {
    #[metadata]
    meta: HangMeta,
}

#[async_trait]
impl Component for Hang {
    async fn init(&mut self, _cx: &InitContext) -> Result<(), ComponentError> {
        if self.meta.hang_init {
            HUNG.store(true, Ordering::SeqCst);
            std::future::pending::<()>().await;
        }
        Ok(())
    }
}

fn push(
    kind: &str,
    name: &str,
    type_name: &str,
    metadata: &[(&str, &str)],
    within: Duration,
) -> Request<DynamicConfiguration> {
    let config = ComponentConfig {
        kind: kind.into(),
        name: name.into(),
        r#type: type_name.into(),
        metadata: metadata
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..ComponentConfig::default()
    };
    let mut request = Request::new(DynamicConfiguration {
        component_config: Some(config),
        based_on_generation: None,
    });
    request.set_timeout(within);
    request
}

#[tokio::test]
async fn a_push_behind_a_hung_init_is_answered_queued_in_time_then_applied() {
    let options = RuntimeOptions {
        timeouts: StartTimeouts {
            init: Duration::from_secs(2),
            ..StartTimeouts::default()
        },
        ..RuntimeOptions::default()
    };
    let config = valid(r#"{"components": {"state": {"orders": {"type": "memory"}}}}"#);
    let runtime = Runtime::start(config, Registry::collected(), options)
        .await
        .expect("start failed");
    let sidecar = Sidecar::serve(runtime, ApiOptions::default()).await;
    let mut first = grpc::lifecycle_client(sidecar.grpc_url()).await;
    let mut second = grpc::lifecycle_client(sidecar.grpc_url()).await;

    let hung = tokio::spawn(async move {
        let request = push(
            "worker",
            "w",
            "test.push_deadline.hang",
            &[("hangInit", "true")],
            Duration::from_secs(10),
        );
        first.apply_configuration(request).await
    });
    // The hung push holds the reload before the second one is sent.
    let started = Instant::now();
    while !HUNG.load(Ordering::SeqCst) {
        assert!(
            started.elapsed() < grpc::PATIENCE,
            "the hanging init never started"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let request = push("state", "audit", "memory", &[], Duration::from_secs(1));
    let queued = second
        .apply_configuration(request)
        .await
        .expect("the push behind was not answered (CANCELLED or DEADLINE_EXCEEDED)")
        .into_inner();
    assert!(!queued.accepted);
    assert_eq!(queued.outcome, "queued", "{:?}", queued.errors);
    assert!(
        queued
            .errors
            .iter()
            .any(|e| e.contains("queued behind 1") && e.contains("not applied yet")),
        "{:?}",
        queued.errors
    );

    // Answered before its caller's 10 s deadline (past it, the server
    // itself ends the call CANCELLED), and by the init timeout: a push
    // still waiting at 9 s would have been answered `queued`.
    let hung = hung
        .await
        .expect("task")
        .expect("the hung push was not answered before its deadline")
        .into_inner();
    assert!(!hung.accepted);
    assert_eq!(hung.outcome, "rolled_back", "{:?}", hung.errors);
    assert!(
        hung.errors
            .iter()
            .any(|e| e.contains("worker/w") && e.contains("init timed out")),
        "{:?}",
        hung.errors
    );

    // The queued push is then applied, as its answer said it would be.
    let audit = ComponentKey::new("state", "audit");
    let applied = tokio::time::timeout(grpc::PATIENCE, async {
        while !sidecar
            .runtime
            .generation()
            .iter()
            .any(|(key, _)| *key == audit)
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(applied.is_ok(), "the queued push was never applied");
    sidecar.stop().await;
}

/// Set while a `test.push_deadline.hold` init is to wait (30 s at most).
static HOLDING: AtomicBool = AtomicBool::new(false);
/// Set once a `test.push_deadline.hold` init is waiting.
static HELD: AtomicBool = AtomicBool::new(false);

/// A worker whose `init` waits while [`HOLDING`] is set.
#[derive(rewire::Component, Default)]
#[component(kind = "worker", type = "test.push_deadline.hold")]
struct Hold {}

#[async_trait]
impl Component for Hold {
    async fn init(&mut self, _cx: &InitContext) -> Result<(), ComponentError> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while HOLDING.load(Ordering::SeqCst) && Instant::now() < deadline {
            HELD.store(true, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(())
    }
}

/// A push (over a raw HTTP/2 stream) whose caller allows 2 s and whose
/// body comes 1.2 s after its head, behind a reload that is held: it is
/// answered `queued` by its deadline, counted from the head's arrival.
/// Before: the answer was due 1.8 s after the handler ran (once the body
/// was in), so tonic cut the call at 2 s, for a push applied later.
#[tokio::test]
async fn a_push_whose_body_comes_late_is_still_answered_before_its_deadline() {
    use prost::Message;
    use tonic::codegen::Bytes;

    let config = valid(r#"{"components": {"state": {"orders": {"type": "memory"}}}}"#);
    let runtime = Runtime::start(config, Registry::collected(), RuntimeOptions::default())
        .await
        .expect("start failed");
    let sidecar = Sidecar::serve(runtime, ApiOptions::default()).await;
    let mut holder = grpc::lifecycle_client(sidecar.grpc_url()).await;
    HOLDING.store(true, Ordering::SeqCst);
    let held = tokio::spawn(async move {
        let request = push(
            "worker",
            "held",
            "test.push_deadline.hold",
            &[],
            grpc::PATIENCE,
        );
        holder.apply_configuration(request).await
    });
    let started = Instant::now();
    while !HELD.load(Ordering::SeqCst) {
        assert!(started.elapsed() < grpc::PATIENCE, "the hold never started");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    let tcp = tokio::net::TcpStream::connect(sidecar.grpc_addr)
        .await
        .unwrap();
    let (mut sender, connection) = h2::client::handshake(tcp).await.expect("handshake");
    let driven = tokio::spawn(connection);
    let request = tonic::codegen::http::Request::post(format!(
        "http://{}/rewire.lifecycle.v1.Lifecycle/ApplyConfiguration",
        sidecar.grpc_addr
    ))
    .header("content-type", "application/grpc")
    .header("te", "trailers")
    .header("grpc-timeout", "2000m")
    .body(())
    .unwrap();
    let (answer, mut body) = sender.send_request(request, false).expect("sent");
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let message = push("state", "late", "memory", &[], Duration::from_secs(2))
        .into_inner()
        .encode_to_vec();
    let mut framed = vec![0u8];
    framed.extend_from_slice(&u32::try_from(message.len()).unwrap().to_be_bytes());
    framed.extend_from_slice(&message);
    body.send_data(Bytes::from(framed), true)
        .expect("request body");

    let answer = tokio::time::timeout(grpc::PATIENCE, answer)
        .await
        .expect("the head in time")
        .expect("the head");
    let grpc_status = |headers: &tonic::codegen::http::HeaderMap| {
        headers
            .get("grpc-status")
            .map(|v| v.to_str().unwrap_or("?").to_string())
    };
    let (head, mut received) = answer.into_parts();
    let mut bytes = Vec::new();
    let mut trailers = None;
    if grpc_status(&head.headers).is_none() {
        while let Some(chunk) = received.data().await {
            let chunk = chunk.expect("the answer's body");
            let _ = received.flow_control().release_capacity(chunk.len());
            bytes.extend_from_slice(&chunk);
        }
        trailers = received.trailers().await.expect("trailers");
    }
    let status = grpc_status(&head.headers)
        .or_else(|| trailers.as_ref().and_then(grpc_status))
        .expect("a grpc-status");
    let said = |headers: &tonic::codegen::http::HeaderMap| {
        headers
            .get("grpc-message")
            .map(|v| v.to_str().unwrap_or("?").to_string())
    };
    let message = said(&head.headers).or_else(|| trailers.as_ref().and_then(said));
    assert_eq!(status, "0", "not answered OK: {message:?}");
    let answered =
        grpc::lifecycle::ApplyConfigurationResponse::decode(&bytes[5..]).expect("an answer");
    assert!(
        answered.accepted || answered.outcome == "queued",
        "{answered:?}"
    );

    HOLDING.store(false, Ordering::SeqCst);
    let _ = held.await;
    driven.abort();
    sidecar.stop().await;
}
