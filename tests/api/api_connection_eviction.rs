//! At the connection cap, a new client takes the slot of the connection
//! idle the longest (a request done, none in flight) instead of waiting
//! for the idle timeout (120 s): HTTP/1 closes it, HTTP/2 sends GOAWAY
//! first, gRPC closes it as the idle timeout would. A connection with a
//! request in flight is never evicted: when every one is busy, the new
//! client waits for a slot as before.

use crate::support::{grpc, sidecar};

use std::net::SocketAddr;
use std::time::Duration;

use rewire::sidecar::ApiOptions;
use sidecar::Sidecar;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const CONFIG: &str = r#"{"components": {"state": {"orders": {"type": "memory"}}}}"#;

/// A new client at the cap is served within this (before: the 120 s idle
/// timeout).
const AT_ONCE: Duration = Duration::from_secs(1);

/// The cap of every test here: small, so that a few clients fill it.
fn capped(max_connections: usize) -> ApiOptions {
    ApiOptions {
        max_connections,
        ..ApiOptions::default()
    }
}

/// The head of the next answer on `stream` (up to its blank line); empty
/// when the server closed it first.
async fn answer_head(stream: &mut TcpStream) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    let read = tokio::time::timeout(grpc::PATIENCE, async {
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

/// A keep-alive HTTP/1 connection that made one request (answered 204,
/// no body) and now idles.
async fn idle_keep_alive(addr: SocketAddr) -> TcpStream {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET /v1.0/healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let answer = answer_head(&mut stream).await;
    assert!(answer.starts_with("HTTP/1.1 204"), "{answer}");
    stream
}

/// Whether the server closed `stream` within `within` (EOF or an error).
async fn closed_within(stream: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 256];
    tokio::time::timeout(within, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => continue,
            }
        }
    })
    .await
    .is_ok()
}

/// A new client's `/v1.0/healthz`, given `within` to be answered.
async fn new_client_served(addr: SocketAddr, within: Duration) -> bool {
    let client = reqwest::Client::builder().timeout(within).build().unwrap();
    let answered = client
        .get(format!("http://{addr}/v1.0/healthz"))
        .send()
        .await;
    matches!(answered, Ok(response) if response.status().is_success())
}

#[tokio::test]
async fn at_the_cap_a_new_client_evicts_the_longest_idle_http1_connection() {
    let sidecar = Sidecar::start(CONFIG, capped(4)).await;
    let mut idle = Vec::new();
    for _ in 0..4 {
        idle.push(idle_keep_alive(sidecar.http_addr).await);
        // Each idle from a later instant than the one before.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        new_client_served(sidecar.http_addr, AT_ONCE).await,
        "a new client waited behind idle keep-alive connections"
    );
    let mut longest_idle = idle.remove(0);
    assert!(
        closed_within(&mut longest_idle, AT_ONCE).await,
        "the longest-idle connection was not the one closed"
    );
    // The others are still open and serve their next request.
    for stream in &mut idle {
        stream
            .write_all(b"GET /v1.0/healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let answer = answer_head(stream).await;
        assert!(answer.starts_with("HTTP/1.1 204"), "{answer:?}");
    }
    sidecar.stop().await;
}

/// An upload whose head was sent and whose body is sent only in part:
/// a request in flight. The connection made a request before, so it
/// would be evictable if it were idle.
async fn upload_in_flight(addr: SocketAddr, body: &[u8]) -> TcpStream {
    let mut stream = idle_keep_alive(addr).await;
    let head = format!(
        "POST /v1.0/state/orders HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(&body[..body.len() / 2]).await.unwrap();
    stream
}

#[tokio::test]
async fn connections_with_a_request_in_flight_are_never_evicted() {
    let sidecar = Sidecar::start(CONFIG, capped(2)).await;
    let body = br#"[{"key":"k","value":"an upload in flight"}]"#;
    let mut first = upload_in_flight(sidecar.http_addr, body).await;
    let mut second = upload_in_flight(sidecar.http_addr, body).await;
    // Every connection busy: a new client waits, as before.
    assert!(
        !new_client_served(sidecar.http_addr, Duration::from_secs(1)).await,
        "a connection with a request in flight lost its slot"
    );
    // Neither upload was cut, nor its connection asked to close: each
    // ends and is answered, keep-alive.
    for stream in [&mut first, &mut second] {
        stream.write_all(&body[body.len() / 2..]).await.unwrap();
        let answer = answer_head(stream).await;
        assert!(answer.starts_with("HTTP/1.1 204"), "{answer:?}");
        assert!(
            !answer.to_ascii_lowercase().contains("connection: close"),
            "a connection with a request in flight was evicted: {answer:?}"
        );
    }
    // Both idle now: the next new client evicts one at once.
    assert!(
        new_client_served(sidecar.http_addr, AT_ONCE).await,
        "a connection idle again was not evicted"
    );
    sidecar.stop().await;
}

/// One HTTP/2 frame.
fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut frame = u32::try_from(payload.len()).unwrap().to_be_bytes()[1..].to_vec();
    frame.extend_from_slice(&[kind, flags]);
    frame.extend_from_slice(&stream.to_be_bytes());
    frame.extend_from_slice(payload);
    frame
}

const HEADERS: u8 = 0x1;
const SETTINGS: u8 = 0x4;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const END_STREAM: u8 = 0x1;
const ACK: u8 = 0x1;

/// Reads frames from a raw HTTP/2 client, acknowledging the server's
/// SETTINGS and PINGs, until `until` says so of one (kind, flags, stream,
/// payload); `None` if the connection ended first.
async fn read_frames_until(
    client: &mut TcpStream,
    mut until: impl FnMut(u8, u8, u32, &[u8]) -> bool,
) -> Option<Vec<u8>> {
    let mut head = [0u8; 9];
    tokio::time::timeout(grpc::PATIENCE, async {
        while client.read_exact(&mut head).await.is_ok() {
            let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
            let mut payload = vec![0u8; len];
            client.read_exact(&mut payload).await.ok()?;
            let (kind, flags) = (head[3], head[4]);
            let stream = u32::from_be_bytes(head[5..9].try_into().unwrap()) & 0x7fff_ffff;
            match (kind, flags & ACK) {
                (SETTINGS, 0) => client.write_all(&frame(SETTINGS, ACK, 0, &[])).await.ok()?,
                (PING, 0) => client
                    .write_all(&frame(PING, ACK, 0, &payload))
                    .await
                    .ok()?,
                _ => {}
            }
            if until(kind, flags, stream, &payload) {
                return Some(payload);
            }
        }
        None
    })
    .await
    .expect("the server neither answered nor closed")
}

#[tokio::test]
async fn an_evicted_http2_connection_receives_goaway_before_it_closes() {
    let sidecar = Sidecar::start(CONFIG, capped(1)).await;
    let mut h2 = TcpStream::connect(sidecar.http_addr).await.unwrap();
    // HPACK: `:method GET`, `:scheme http` (static entries), `:path
    // /v1.0/healthz` (a literal on static name 4).
    let mut block = vec![0x82, 0x86, 0x04, 13];
    block.extend_from_slice(b"/v1.0/healthz");
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend(frame(SETTINGS, 0, 0, &[]));
    out.extend(frame(HEADERS, 0x4 | END_STREAM, 1, &block));
    h2.write_all(&out).await.unwrap();
    let answered = read_frames_until(&mut h2, |kind, flags, stream, _| {
        stream == 1 && flags & END_STREAM != 0 && kind != GOAWAY
    })
    .await;
    assert!(answered.is_some(), "the HTTP/2 request was not answered");
    // Its one request done, the connection idles and holds the only slot.
    // A client answering the server's PINGs, as hyper's graceful shutdown
    // asks, until the server closes.
    let answering = tokio::spawn(async move {
        let goaway = read_frames_until(&mut h2, |kind, _, _, _| kind == GOAWAY).await;
        let closed = read_frames_until(&mut h2, |_, _, _, _| false).await;
        (goaway, closed.is_none())
    });
    assert!(
        new_client_served(sidecar.http_addr, AT_ONCE).await,
        "a new client waited behind an idle HTTP/2 connection"
    );
    let (goaway, closed) = answering.await.unwrap();
    let goaway = goaway.expect("closed without a GOAWAY");
    let error = u32::from_be_bytes(goaway[4..8].try_into().unwrap());
    assert_eq!(error, 0, "GOAWAY NO_ERROR");
    assert!(closed, "still open after its GOAWAY");
    sidecar.stop().await;
}

#[tokio::test]
async fn at_the_cap_a_new_grpc_client_evicts_an_idle_channel() {
    let sidecar = Sidecar::start(CONFIG, capped(1)).await;
    let mut idle = grpc::dapr_client(sidecar.grpc_url()).await;
    idle.get_metadata(grpc::dapr::GetMetadataRequest {})
        .await
        .expect("the first client is served");
    let answered = tokio::time::timeout(AT_ONCE, async {
        let mut newcomer = grpc::dapr_client(sidecar.grpc_url()).await;
        newcomer
            .get_metadata(grpc::dapr::GetMetadataRequest {})
            .await
    })
    .await
    .expect("a new gRPC client waited behind an idle channel");
    assert!(answered.is_ok(), "{answered:?}");
    sidecar.stop().await;
}
