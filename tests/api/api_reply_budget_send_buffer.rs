//! The HTTP listener's h2 buffers at most 64 KiB of an answer per stream
//! ahead of the client: bytes handed to h2 leave the reply budget, and at
//! h2's default (400 KiB per stream) a client granting a huge window and
//! then not reading the socket had whole answers of 400 KiB leave the
//! budget while they sat in the sidecar's memory.

use crate::api_reply_budget::{NotReading, MIB};
use crate::support::sidecar;

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use rewire::sidecar::ApiOptions;
use sidecar::Sidecar;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpSocket, TcpStream};
use tonic::codegen::http::Request;
use tonic::codegen::Bytes;

const CONFIG: &str = r#"{"components": {"state": {"orders": {"type": "memory"}}}}"#;
const KIB: usize = 1024;

/// A socket that stops reading when told: its peer's writes then pile up
/// in the peer.
struct StopsReading {
    tcp: TcpStream,
    stopped: Arc<AtomicBool>,
}

impl AsyncRead for StopsReading {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.stopped.load(Ordering::Acquire) {
            return Poll::Pending;
        }
        Pin::new(&mut self.tcp).poll_read(cx, buf)
    }
}

impl AsyncWrite for StopsReading {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
}

/// Saves `len` bytes of JSON string under `key` over HTTP.
async fn save(sidecar: &Sidecar, key: &str, len: usize) {
    let saved = testkit::http_client()
        .post(format!("{}/v1.0/state/orders", sidecar.http_url()))
        .header("content-type", "application/json")
        .body(format!(
            r#"[{{"key":"{key}","value":"{}"}}]"#,
            "v".repeat(len)
        ))
        .send()
        .await
        .expect("an answer");
    assert_eq!(saved.status(), 204);
}

/// The connection driven on, and its answers asked for (dropped, a
/// stream is reset).
type Asked = (tokio::task::JoinHandle<()>, Vec<h2::client::ResponseFuture>);

/// Asks for `count` answers of `key` over HTTP/2, granting every stream
/// the largest window, then reads nothing more.
async fn granting_all_then_not_reading(sidecar: &Sidecar, key: &str, count: usize) -> Asked {
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let tcp = socket.connect(sidecar.http_addr).await.unwrap();
    let stopped = Arc::new(AtomicBool::new(false));
    let io = StopsReading {
        tcp,
        stopped: Arc::clone(&stopped),
    };
    let huge = (1 << 31) - 1;
    let (mut sender, connection) = h2::client::Builder::new()
        .initial_window_size(huge)
        .initial_connection_window_size(huge)
        .handshake::<_, Bytes>(io)
        .await
        .expect("handshake");
    let driven = tokio::spawn(async move {
        let _ = connection.await;
    });
    // The settings exchanged, reading stops before the first answer.
    tokio::time::sleep(Duration::from_millis(200)).await;
    stopped.store(true, Ordering::Release);
    let mut asked = Vec::new();
    for _ in 0..count {
        sender = sender.ready().await.expect("takes calls");
        let request = Request::get(format!(
            "http://{}/v1.0/state/orders/{key}",
            sidecar.http_addr
        ))
        .body(())
        .unwrap();
        let (answer, _) = sender.send_request(request, true).expect("sent");
        asked.push(answer);
    }
    (driven, asked)
}

#[tokio::test]
async fn answers_to_a_client_granting_a_huge_window_but_not_reading_stay_charged() {
    // The kernel's socket buffers take a few MiB off the answers too,
    // whatever h2 buffers: the budget and the probe are sized past them.
    let options = ApiOptions {
        max_response_bytes_in_flight: 16 * MIB,
        max_request_bytes: 12 * MIB,
        ..ApiOptions::default()
    };
    let sidecar = Sidecar::start(CONFIG, options).await;
    save(&sidecar, "mid", 400 * KIB).await;
    save(&sidecar, "small", 10).await;
    save(&sidecar, "probe", 10 * MIB).await;
    // Answers of 400 KiB, more than the listener holds, each of which h2
    // would buffer whole at its default: the budget would be left empty.
    let (driven, asked) = granting_all_then_not_reading(&sidecar, "mid", 100).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    // A client holding one answer is refused 10 MiB more: the answers
    // not read (over 13 MiB once h2 and the kernel took theirs) are
    // still held against the listener's budget.
    let mut probe = NotReading::connect(sidecar.http_addr).await;
    let held = probe.http("GET", "/v1.0/state/orders/small", "").await;
    assert_eq!(held.status(), 200);
    let refused = probe.http("GET", "/v1.0/state/orders/probe", "").await;
    assert_eq!(refused.status(), 429, "the answers left the budget");
    driven.abort();
    drop((held, refused, probe, asked));
    sidecar.stop().await;
}
