//! Connections are bounded on both listeners: one that says nothing is
//! closed after `idle_timeout`, and so is one with no request in flight
//! whatever bytes it moves (a request head trickled in, a gRPC channel
//! answering the server's pings), while a request that keeps moving bytes
//! is not cut; at most `max_connections` are open at once (the next client
//! is served once a slot frees), and after shutdown a connection still
//! sending its request head is cut after `shutdown_grace`, so the servers
//! stop, and so is one whose call runs with a request pipelined behind
//! it. Timing options no deadline can be computed from are refused at
//! bind.

use crate::support::{grpc, sidecar};

use std::net::SocketAddr;
use std::time::Duration;

use rewire::prelude::*;
use rewire::sidecar::{ApiError, ApiOptions, ApiServer};
use rewire::{DeleteRequest, GetRequest, SetRequest, StateEntry, StateError};
use sidecar::Sidecar;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

const CONFIG: &str = r#"{"components": {"state": {"orders": {"type": "memory"}}}}"#;

/// Waits until the server closes `stream` (EOF or an error).
async fn closed_by_server(stream: &mut TcpStream) {
    let mut buf = [0u8; 1024];
    let closed = tokio::time::timeout(grpc::PATIENCE, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => continue,
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "the server kept the connection open");
}

#[tokio::test]
async fn idle_connections_are_closed_on_both_listeners() {
    let options = ApiOptions {
        idle_timeout: Duration::from_millis(300),
        ..ApiOptions::default()
    };
    let sidecar = Sidecar::start(CONFIG, options).await;
    for addr in [sidecar.grpc_addr, sidecar.http_addr] {
        let mut silent = TcpStream::connect(addr).await.unwrap();
        closed_by_server(&mut silent).await;
        // Half a request head, then nothing.
        let mut half = TcpStream::connect(addr).await.unwrap();
        half.write_all(b"GET /v1.0/healthz HTTP/1.1\r\nHost: x\r\n")
            .await
            .unwrap();
        closed_by_server(&mut half).await;
    }
    sidecar.stop().await;
}

#[tokio::test]
async fn a_request_moving_bytes_is_not_idle_until_it_stops() {
    let options = ApiOptions {
        idle_timeout: Duration::from_millis(600),
        ..ApiOptions::default()
    };
    let sidecar = Sidecar::start(CONFIG, options).await;
    let mut slow = TcpStream::connect(sidecar.http_addr).await.unwrap();
    // The head at once, then the body a byte at a time over four idle
    // timeouts: a request in flight, moving.
    let body = br#"[{"key":"k","value":"a slow value"}]"#;
    let head = format!(
        "POST /v1.0/state/orders HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    slow.write_all(head.as_bytes()).await.unwrap();
    let drip = Duration::from_millis(2400) / body.len() as u32;
    for byte in body {
        slow.write_all(&[*byte]).await.unwrap();
        tokio::time::sleep(drip).await;
    }
    let answer = answer_head(&mut slow).await;
    assert!(
        answer.starts_with("HTTP/1.1 204"),
        "not served on the connection that kept moving: {answer}"
    );
    // Its idle time counts from the end of that request, not from its
    // start or the connection's (both over four idle timeouts ago): the
    // connection still serves the next request, which reads the value.
    slow.write_all(b"GET /v1.0/state/orders/k HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let probe = answer_head(&mut slow).await;
    assert!(
        probe.starts_with("HTTP/1.1 200"),
        "the connection was not kept once its request ended: {probe}"
    );
    // Then silence: closed.
    closed_by_server(&mut slow).await;
    sidecar.stop().await;
}

/// The head of the next answer on `stream` (up to its blank line), or
/// what came before the server closed it.
async fn answer_head(stream: &mut TcpStream) -> String {
    let mut head = Vec::new();
    let read = tokio::time::timeout(grpc::PATIENCE, async {
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            match stream.read(&mut byte).await {
                Ok(1) => head.push(byte[0]),
                _ => return,
            }
        }
    })
    .await;
    assert!(read.is_ok(), "no answer, and the connection stayed open");
    String::from_utf8_lossy(&head).into_owned()
}

#[tokio::test]
async fn a_request_head_trickled_in_is_cut_at_the_idle_timeout() {
    let options = ApiOptions {
        idle_timeout: Duration::from_millis(300),
        ..ApiOptions::default()
    };
    let sidecar = Sidecar::start(CONFIG, options).await;
    let mut slow = TcpStream::connect(sidecar.http_addr).await.unwrap();
    // A head a byte every 100 ms would take four idle timeouts: no
    // request is in flight until it is whole, so the bytes do not count.
    let head = b"GET /v1.0/healthz HTTP/1.1\r\nHost: x\r\n\r\n";
    let drip = Duration::from_millis(1200) / head.len() as u32;
    let mut cut = false;
    for byte in head {
        if slow.write_all(&[*byte]).await.is_err() {
            cut = true;
            break;
        }
        tokio::time::sleep(drip).await;
    }
    let mut answer = Vec::new();
    let read = tokio::time::timeout(grpc::PATIENCE, slow.read_to_end(&mut answer)).await;
    assert!(read.is_ok(), "the trickling connection was kept open");
    assert!(
        cut || !answer.starts_with(b"HTTP/1.1 204"),
        "a head trickled over four idle timeouts was served"
    );
    sidecar.stop().await;
}

#[tokio::test]
async fn a_grpc_connection_without_calls_is_closed_though_it_answers_pings() {
    // Pings every 100 ms, which the client's channel answers; one
    // connection at a time.
    let options = ApiOptions {
        idle_timeout: Duration::from_millis(300),
        max_connections: 1,
        ..ApiOptions::default()
    };
    let sidecar = Sidecar::start(CONFIG, options).await;
    let call = |url: String| async move {
        let mut client = grpc::dapr_client(url).await;
        client
            .get_metadata(grpc::dapr::GetMetadataRequest {})
            .await
            .map(|_| client)
    };
    let first = tokio::time::timeout(grpc::PATIENCE, call(sidecar.grpc_url()))
        .await
        .expect("the first call in time")
        .expect("the first call");
    // The first client keeps its channel and makes no call: its
    // connection is closed after the idle timeout, freeing the one slot.
    let second = tokio::time::timeout(grpc::PATIENCE, call(sidecar.grpc_url())).await;
    assert!(
        matches!(second, Ok(Ok(_))),
        "a channel without calls kept the only slot: {:?}",
        second.map(|r| r.err())
    );
    drop(first);
    sidecar.stop().await;
}

#[tokio::test]
async fn bodies_parked_past_the_listeners_budget_are_refused_until_they_go() {
    // One body at most 16 KiB; the listener holds 2 × 16 + 64 KiB of
    // bodies being read (its budget: one largest body and its framing,
    // read and decoded, at least).
    let options = ApiOptions {
        max_request_bytes: 16 * 1024,
        max_request_bytes_in_flight: 0,
        ..ApiOptions::default()
    };
    let sidecar = Sidecar::start(CONFIG, options).await;
    let value = "v".repeat(16 * 1024 - 64);
    let body = format!(r#"[{{"key":"k","value":"{value}"}}]"#);
    let head = format!(
        "POST /v1.0/state/orders HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    // Six clients park a body each, all but its last byte sent.
    let mut parked = Vec::new();
    for _ in 0..6 {
        let mut client = TcpStream::connect(sidecar.http_addr).await.unwrap();
        client.write_all(head.as_bytes()).await.unwrap();
        client
            .write_all(&body.as_bytes()[..body.len() - 1])
            .await
            .unwrap();
        parked.push(client);
    }
    let http = testkit::http_client();
    let save = || {
        http.post(format!("{}/v1.0/state/orders", sidecar.http_url()))
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
    };
    // The parked bodies are read as they come: wait until one more body
    // is refused, then check the refusal says why.
    let refused = tokio::time::timeout(grpc::PATIENCE, async {
        loop {
            let answer = save().await.expect("an answer");
            if !answer.status().is_success() {
                return answer;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("a body past the budget was never refused");
    let status = refused.status();
    let text = refused.text().await.unwrap_or_default();
    assert_eq!(status, reqwest::StatusCode::TOO_MANY_REQUESTS, "{text}");
    assert!(
        text.contains("ERR_TOO_MANY_REQUESTS") && text.contains("try again shortly"),
        "{text}"
    );
    // Once the parked bodies go, bodies are read again.
    drop(parked);
    let saved = tokio::time::timeout(grpc::PATIENCE, async {
        loop {
            let answer = save().await.expect("an answer");
            if answer.status().is_success() {
                return answer.status();
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("bodies were refused after the parked ones went");
    assert_eq!(saved, reqwest::StatusCode::NO_CONTENT);
    sidecar.stop().await;
}

async fn healthz(addr: SocketAddr) -> reqwest::Result<reqwest::StatusCode> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_millis(500))
        .build()?;
    let response = client
        .get(format!("http://{addr}/v1.0/healthz"))
        .send()
        .await?;
    Ok(response.status())
}

#[tokio::test]
async fn at_the_cap_new_clients_wait_for_a_free_slot() {
    let options = ApiOptions {
        max_connections: 2,
        ..ApiOptions::default()
    };
    let sidecar = Sidecar::start(CONFIG, options).await;
    let first = TcpStream::connect(sidecar.http_addr).await.unwrap();
    let _second = TcpStream::connect(sidecar.http_addr).await.unwrap();
    assert!(
        healthz(sidecar.http_addr).await.is_err(),
        "a third connection was served over the cap of 2"
    );
    drop(first);
    let served = tokio::time::timeout(grpc::PATIENCE, async {
        loop {
            if let Ok(status) = healthz(sidecar.http_addr).await {
                return status;
            }
        }
    })
    .await
    .expect("never served after a slot freed");
    assert!(served.is_success(), "{served}");
    sidecar.stop().await;
}

#[tokio::test]
async fn shutdown_cuts_stalled_connections_after_the_grace() {
    let options = ApiOptions {
        shutdown_grace: Duration::from_millis(200),
        ..ApiOptions::default()
    };
    let sidecar = Sidecar::start(CONFIG, options).await;
    let _idle_grpc = TcpStream::connect(sidecar.grpc_addr).await.unwrap();
    let mut half = TcpStream::connect(sidecar.http_addr).await.unwrap();
    half.write_all(b"POST /v1.0/state/orders HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let stopped = tokio::time::timeout(grpc::PATIENCE, sidecar.stop()).await;
    assert!(stopped.is_ok(), "a stalled connection held the servers up");
}

/// A client that grants no flow-control window (SETTINGS_INITIAL_WINDOW_SIZE
/// 0) and never sends WINDOW_UPDATE, while its connection answers the
/// server's keepalive pings: the answer to its `GetState` (1 MiB, held by
/// the server until the client makes room) must not keep the connection —
/// and the answer — for ever; the connection ends once the answer has
/// waited for the idle timeout, whatever bytes move.
#[tokio::test]
async fn an_answer_the_client_grants_no_window_for_ends_its_connection() {
    use prost::Message;

    let options = ApiOptions {
        idle_timeout: Duration::from_secs(1),
        ..ApiOptions::default()
    };
    let sidecar = Sidecar::start(CONFIG, options).await;
    let value = vec![b'v'; 1024 * 1024];
    let mut client = grpc::dapr_client(sidecar.grpc_url()).await;
    client
        .save_state(grpc::dapr::SaveStateRequest {
            store_name: "orders".into(),
            states: vec![grpc::common::StateItem {
                key: "big".into(),
                value: value.clone(),
                ..Default::default()
            }],
        })
        .await
        .expect("saved");
    drop(client);

    let tcp = TcpStream::connect(sidecar.grpc_addr).await.unwrap();
    let (mut sender, connection) = h2::client::Builder::new()
        .initial_window_size(0)
        .handshake::<_, tonic::codegen::Bytes>(tcp)
        .await
        .expect("handshake");
    // Driven throughout: it answers the server's pings.
    let driven = tokio::spawn(connection);
    let get_state = |key: &str| {
        let message = grpc::dapr::GetStateRequest {
            store_name: "orders".into(),
            key: key.into(),
            ..Default::default()
        }
        .encode_to_vec();
        let mut framed = vec![0u8];
        framed.extend_from_slice(&u32::try_from(message.len()).unwrap().to_be_bytes());
        framed.extend_from_slice(&message);
        let request = tonic::codegen::http::Request::post(format!(
            "http://{}/dapr.proto.runtime.v1.Dapr/GetState",
            sidecar.grpc_addr
        ))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
        (request, tonic::codegen::Bytes::from(framed))
    };
    let (request, framed) = get_state("big");
    let (answer, mut body) = sender.send_request(request, false).expect("sent");
    body.send_data(framed, true).expect("request body");
    let answer = tokio::time::timeout(grpc::PATIENCE, answer)
        .await
        .expect("the head in time")
        .expect("the head");
    assert_eq!(answer.status(), 200);
    // The body is never read, no capacity released.
    let _held = answer.into_body();
    // The held answer does not end the connection at once: it still
    // serves the next call (its head; its body is held too).
    let mut sender = sender
        .ready()
        .await
        .expect("the connection still takes calls");
    let (request, framed) = get_state("missing");
    let (probe, mut body) = sender.send_request(request, false).expect("sent");
    body.send_data(framed, true).expect("request body");
    let probe = tokio::time::timeout(grpc::PATIENCE, probe)
        .await
        .expect("the probe's head in time")
        .expect("the connection served the next call");
    assert_eq!(probe.status(), 200);
    // Then it ends, pings answered and all; the wait only catches "never".
    let ended = tokio::time::timeout(grpc::PATIENCE, driven).await;
    assert!(
        ended.is_ok(),
        "the server kept the connection holding an answer the client made no room for"
    );
    sidecar.stop().await;
}

/// A client whose every request the server must reset (a malformed
/// `content-length`, a stream error the service never sees) is cut once it
/// has drawn 1,024 resets, with GOAWAY ENHANCE_YOUR_CALM, rather than
/// drawing resets for as long as it likes (RUSTSEC-2024-0003).
#[tokio::test]
async fn a_grpc_client_drawing_endless_stream_resets_is_cut() {
    const HEADERS: u8 = 0x1;
    const RST_STREAM: u8 = 0x3;
    const GOAWAY: u8 = 0x7;
    const ENHANCE_YOUR_CALM: u32 = 0xb;
    let frame = |kind: u8, flags: u8, stream: u32, payload: &[u8]| {
        let mut frame = u32::try_from(payload.len()).unwrap().to_be_bytes()[1..].to_vec();
        frame.extend_from_slice(&[kind, flags]);
        frame.extend_from_slice(&stream.to_be_bytes());
        frame.extend_from_slice(payload);
        frame
    };
    // HPACK: `:method POST`, `:scheme http`, `:path /` (static entries),
    // then `content-length: x`, a literal on static name 28.
    let block = [0x83, 0x86, 0x84, 0x0f, 0x0d, 0x01, b'x'];
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let mut client = TcpStream::connect(sidecar.grpc_addr).await.unwrap();
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend(frame(0x4, 0, 0, &[]));
    // END_STREAM | END_HEADERS on streams 1, 3, 5, ...: past the cap.
    for n in 0..1_200u32 {
        out.extend(frame(HEADERS, 0x5, 2 * n + 1, &block));
    }
    // The server may stop reading once it has cut the connection.
    let _ = client.write_all(&out).await;
    let (mut resets, mut goaway) = (0, None);
    let read = tokio::time::timeout(grpc::PATIENCE, async {
        let mut head = [0u8; 9];
        while client.read_exact(&mut head).await.is_ok() {
            let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
            let mut payload = vec![0u8; len];
            if client.read_exact(&mut payload).await.is_err() {
                break;
            }
            match head[3] {
                RST_STREAM => resets += 1,
                GOAWAY => {
                    goaway = Some(u32::from_be_bytes(payload[4..8].try_into().unwrap()));
                    break;
                }
                _ => {}
            }
        }
    })
    .await;
    assert_eq!(
        goaway,
        Some(ENHANCE_YOUR_CALM),
        "{resets} streams reset, and no GOAWAY ENHANCE_YOUR_CALM (timed out: {})",
        read.is_err()
    );
    assert!(resets <= 1_024, "{resets} streams reset past the cap");
    sidecar.stop().await;
}

/// An HTTP/1 request head is buffered up to 80 KiB, not hyper's default
/// 400 KiB: a head of 100 KiB of headers, sent and then stalled, is
/// refused at once (431, the connection closed) instead of being held
/// until the idle timeout; a URI near hyper's own 64 KiB limit is served.
#[tokio::test]
async fn an_http1_head_past_the_buffer_is_refused_not_held() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let mut long_uri = TcpStream::connect(sidecar.http_addr).await.unwrap();
    let key = "k".repeat(63 * 1024);
    let head = format!("GET /v1.0/state/orders/{key} HTTP/1.1\r\nHost: x\r\n\r\n");
    long_uri.write_all(head.as_bytes()).await.unwrap();
    let answer = answer_head(&mut long_uri).await;
    assert!(answer.starts_with("HTTP/1.1 204"), "{answer}");

    let mut stalled = TcpStream::connect(sidecar.http_addr).await.unwrap();
    let mut head = b"GET /v1.0/healthz HTTP/1.1\r\nHost: x\r\n".to_vec();
    for n in 0..100 {
        head.extend_from_slice(format!("x-pad-{n}: {}\r\n", "p".repeat(1000)).as_bytes());
    }
    // No blank line: the head never ends. The server may stop reading.
    let _ = stalled.write_all(&head).await;
    let mut answer = Vec::new();
    let mut buf = [0u8; 1024];
    let closed = tokio::time::timeout(grpc::PATIENCE, async {
        loop {
            match stalled.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => answer.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    assert!(
        closed.is_ok(),
        "a 100 KiB head was held, the connection open"
    );
    assert!(
        answer.is_empty() || answer.starts_with(b"HTTP/1.1 431"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    sidecar.stop().await;
}

/// Woken when the hanging store's read has started.
static HANGING_GET_STARTED: tokio::sync::Notify = tokio::sync::Notify::const_new();

/// A state store whose reads never end (a backend that stopped answering).
#[derive(rewire::Component)]
#[component(kind = "state", type = "test.api.connections.hanging_get")]
struct HangingGet {}

#[async_trait]
impl Component for HangingGet {}

#[async_trait]
impl StateStore for HangingGet {
    async fn get(&self, _: GetRequest) -> Result<Option<StateEntry>, StateError> {
        HANGING_GET_STARTED.notify_one();
        std::future::pending().await
    }
    async fn set(&self, _: SetRequest) -> Result<(), StateError> {
        Ok(())
    }
    async fn delete(&self, _: DeleteRequest) -> Result<(), StateError> {
        Ok(())
    }
}

/// A call with an HTTP/1 request pipelined behind it (hyper holds that one
/// in its buffer and reads the socket no more until the call ends) is cut
/// with its connection at the end of the shutdown grace, not kept until
/// `request_timeout`. Before, the cut reached the connection only through
/// a socket read or write waiting, and the servers waited for the call.
#[tokio::test]
async fn shutdown_cuts_a_call_with_a_request_pipelined_behind_it() {
    let options = ApiOptions {
        shutdown_grace: Duration::from_millis(200),
        request_timeout: Duration::from_secs(60),
        ..ApiOptions::default()
    };
    let config =
        r#"{"components": {"state": {"slow": {"type": "test.api.connections.hanging_get"}}}}"#;
    let sidecar = Sidecar::start(config, options).await;
    let mut client = TcpStream::connect(sidecar.http_addr).await.unwrap();
    client
        .write_all(
            b"GET /v1.0/state/slow/k HTTP/1.1\r\nHost: x\r\n\r\n\
              GET /v1.0/healthz HTTP/1.1\r\nHost: x\r\n\r\n",
        )
        .await
        .unwrap();
    testkit::within(
        grpc::PATIENCE,
        "the hanging read started",
        HANGING_GET_STARTED.notified(),
    )
    .await;
    // Well under request_timeout, well over the grace.
    let stopped = tokio::time::timeout(Duration::from_secs(10), sidecar.stop()).await;
    assert!(
        stopped.is_ok(),
        "the servers waited for a call with a request pipelined behind it"
    );
}

/// An `idle_timeout` no deadline can be computed from (`Duration::MAX`)
/// is refused at bind, naming it. Before, it panicked in every
/// connection's task ("overflow when adding duration to instant").
#[tokio::test]
async fn an_idle_timeout_past_any_deadline_is_refused_naming_it() {
    let runtime = crate::support::start(CONFIG).await.expect("start failed");
    let options = ApiOptions {
        idle_timeout: Duration::MAX,
        ..ApiOptions::default()
    };
    let any = "127.0.0.1:0".parse().unwrap();
    let bound = ApiServer::bind(runtime.clone(), options, any, any, CancellationToken::new()).await;
    let Err(refused) = bound else {
        panic!("bound with idle_timeout Duration::MAX");
    };
    assert!(
        matches!(refused, ApiError::Options(_)) && refused.to_string().contains("idle_timeout"),
        "{refused}"
    );
    runtime.shutdown().await;
}
