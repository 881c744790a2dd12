//! What the sidecar holds for clients that do not read their answers is
//! bounded in bytes, per connection and per listener: a client granting
//! no HTTP/2 window (or an HTTP/1 client that pipelines and never reads)
//! asking for a large value again and again is refused `RESOURCE_EXHAUSTED`
//! (HTTP 429) once its answers held pass the budget, at once rather than
//! held until the idle timeout, while clients that read are served; once
//! the client reads or goes, calls pass again.

use crate::support::{grpc, sidecar};

use std::time::Duration;

use prost::Message;
use rewire::sidecar::ApiOptions;
use sidecar::Sidecar;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::oneshot;
use tonic::codegen::http::{Request, Response};
use tonic::codegen::Bytes;

const CONFIG: &str = r#"{"components": {"state": {"orders": {"type": "memory"}}}}"#;
const MIB: usize = 1024 * 1024;
/// The value the tests ask for, and its gRPC answer's size (the value,
/// the message's framing).
const VALUE: usize = MIB;

/// Saves `len` bytes under `big` through the gRPC API.
async fn save_big(sidecar: &Sidecar, len: usize) {
    let mut client = grpc::dapr_client(sidecar.grpc_url()).await;
    client
        .save_state(grpc::dapr::SaveStateRequest {
            store_name: "orders".into(),
            states: vec![grpc::common::StateItem {
                key: "big".into(),
                value: vec![b'v'; len],
                ..Default::default()
            }],
        })
        .await
        .expect("saved");
}

/// A raw HTTP/2 client that grants no window (SETTINGS_INITIAL_WINDOW_SIZE
/// 0): it reads no answer's body until told to make room.
struct NotReading {
    sender: h2::client::SendRequest<Bytes>,
    /// Makes room: a window for every stream, and reads on.
    read: Option<oneshot::Sender<()>>,
    driven: tokio::task::JoinHandle<()>,
    addr: std::net::SocketAddr,
}

impl NotReading {
    async fn connect(addr: std::net::SocketAddr) -> Self {
        let tcp = TcpStream::connect(addr).await.unwrap();
        let (sender, mut connection) = h2::client::Builder::new()
            .initial_window_size(0)
            .handshake::<_, Bytes>(tcp)
            .await
            .expect("handshake");
        let (read, told) = oneshot::channel::<()>();
        // Driven throughout (it answers the server's pings), until told to
        // make room.
        let driven = tokio::spawn(async move {
            tokio::select! {
                _ = &mut connection => return,
                _ = told => {}
            }
            connection.set_target_window_size(64 * MIB as u32);
            let _ = connection.set_initial_window_size(4 * MIB as u32);
            let _ = connection.await;
        });
        Self {
            sender,
            read: Some(read),
            driven,
            addr,
        }
    }

    /// Asks for `key` and waits for the answer's head.
    async fn get_state(&mut self, key: &str) -> Response<h2::RecvStream> {
        let message = grpc::dapr::GetStateRequest {
            store_name: "orders".into(),
            key: key.into(),
            ..Default::default()
        }
        .encode_to_vec();
        let mut framed = vec![0u8];
        framed.extend_from_slice(&u32::try_from(message.len()).unwrap().to_be_bytes());
        framed.extend_from_slice(&message);
        let request = Request::post(format!(
            "http://{}/dapr.proto.runtime.v1.Dapr/GetState",
            self.addr
        ))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
        let sender = self.sender.clone().ready().await.expect("takes calls");
        self.sender = sender;
        let (answer, mut body) = self.sender.send_request(request, false).expect("sent");
        body.send_data(Bytes::from(framed), true)
            .expect("request body");
        tokio::time::timeout(grpc::PATIENCE, answer)
            .await
            .expect("the answer's head in time")
            .expect("the answer's head")
    }

    /// Makes room for every answer.
    fn read(&mut self) {
        if let Some(read) = self.read.take() {
            let _ = read.send(());
        }
    }
}

impl Drop for NotReading {
    fn drop(&mut self) {
        self.driven.abort();
    }
}

/// The gRPC status of a trailers-only answer (a refusal); `None` for an
/// answer whose message follows.
fn refused_with(answer: &Response<h2::RecvStream>) -> Option<String> {
    answer
        .headers()
        .get("grpc-status")
        .map(|status| status.to_str().unwrap_or_default().to_owned())
}

/// Every data byte of an answer.
async fn read_whole(answer: Response<h2::RecvStream>) -> usize {
    let mut body = answer.into_body();
    let mut read = 0;
    tokio::time::timeout(grpc::PATIENCE, async {
        while let Some(data) = body.data().await {
            let data = data.expect("data");
            read += data.len();
            let _ = body.flow_control().release_capacity(data.len());
        }
    })
    .await
    .expect("the answer read in time");
    read
}

/// A reading client's `GetState` of `big`: the value's length, or the
/// refusal.
async fn get_big(sidecar: &Sidecar) -> Result<usize, tonic::Status> {
    let mut client = grpc::dapr_client(sidecar.grpc_url()).await;
    let answer = client
        .get_state(grpc::dapr::GetStateRequest {
            store_name: "orders".into(),
            key: "big".into(),
            ..Default::default()
        })
        .await?;
    Ok(answer.into_inner().data.len())
}

#[tokio::test]
async fn answers_held_for_a_grpc_client_not_reading_are_bounded_per_connection() {
    let options = ApiOptions {
        max_response_bytes_in_flight_per_connection: 2 * MIB + MIB / 2,
        ..ApiOptions::default()
    };
    let sidecar = Sidecar::start(CONFIG, options).await;
    save_big(&sidecar, VALUE).await;
    let mut client = NotReading::connect(sidecar.grpc_addr).await;
    // Two answers of 1 MiB fit in 2.5 MiB; the third is refused at once,
    // its value not held.
    let held = vec![client.get_state("big").await, client.get_state("big").await];
    for answer in &held {
        assert_eq!(refused_with(answer), None, "{:?}", answer.headers());
    }
    for _ in 0..3 {
        let refused = client.get_state("big").await;
        assert_eq!(refused_with(&refused).as_deref(), Some("8"));
        let message = refused.headers()["grpc-message"]
            .to_str()
            .unwrap_or_default();
        assert!(
            message.contains("max_response_bytes_in_flight_per_connection"),
            "{message}"
        );
    }
    // Small answers still fit, and another connection that reads gets
    // the value.
    let small = client.get_state("missing").await;
    assert_eq!(refused_with(&small), None);
    assert_eq!(get_big(&sidecar).await.expect("served"), VALUE);
    // Once the client reads, it is answered again.
    client.read();
    for answer in held {
        assert!(read_whole(answer).await > VALUE);
    }
    let again = client.get_state("big").await;
    assert_eq!(refused_with(&again), None, "{:?}", again.headers());
    assert!(read_whole(again).await > VALUE);
    sidecar.stop().await;
}

#[tokio::test]
async fn answers_held_for_grpc_clients_not_reading_are_bounded_per_listener() {
    let options = ApiOptions {
        max_response_bytes_in_flight: 2 * MIB + MIB / 2,
        ..ApiOptions::default()
    };
    let sidecar = Sidecar::start(CONFIG, options).await;
    save_big(&sidecar, VALUE).await;
    let mut first = NotReading::connect(sidecar.grpc_addr).await;
    let mut second = NotReading::connect(sidecar.grpc_addr).await;
    let held = (first.get_state("big").await, second.get_state("big").await);
    assert_eq!(refused_with(&held.0), None);
    assert_eq!(refused_with(&held.1), None);
    // The listener holds 2 MiB: a third connection's answer is refused,
    // even though that client reads.
    let refused = get_big(&sidecar)
        .await
        .expect_err("past the listener's budget");
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
    assert!(
        refused.message().contains("max_response_bytes_in_flight)"),
        "{}",
        refused.message()
    );
    // Once a client that held answers goes, they are let go of.
    drop(held.0);
    drop(first);
    let served = tokio::time::timeout(grpc::PATIENCE, async {
        loop {
            if let Ok(len) = get_big(&sidecar).await {
                return len;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("answers were refused after the client holding them went");
    assert_eq!(served, VALUE);
    drop(held.1);
    sidecar.stop().await;
}

/// An HTTP/1 client pipelining `GET`s of `big` with a small receive
/// buffer, which never reads.
async fn pipelining_not_reading(sidecar: &Sidecar) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut stream = socket.connect(sidecar.http_addr).await.unwrap();
    let get = "GET /v1.0/state/orders/big HTTP/1.1\r\nHost: x\r\n\r\n".repeat(3);
    stream.write_all(get.as_bytes()).await.unwrap();
    stream
}

#[tokio::test]
async fn answers_held_for_http1_clients_not_reading_are_bounded_per_listener() {
    // Values of 8 MiB, larger than what the kernel's socket buffers take
    // off a stalled answer; the listener holds two at most.
    let value = 8 * MIB;
    let options = ApiOptions {
        max_request_bytes: 2 * value,
        max_response_bytes_in_flight: 2 * value,
        ..ApiOptions::default()
    };
    let sidecar = Sidecar::start(CONFIG, options).await;
    let http = testkit::http_client();
    let saved = http
        .post(format!("{}/v1.0/state/orders", sidecar.http_url()))
        .header("content-type", "application/json")
        .body(format!(
            r#"[{{"key":"big","value":"{}"}}]"#,
            "v".repeat(value)
        ))
        .send()
        .await
        .expect("an answer");
    assert_eq!(saved.status(), reqwest::StatusCode::NO_CONTENT);
    let get = || {
        http.get(format!("{}/v1.0/state/orders/big", sidecar.http_url()))
            .send()
    };
    let first = pipelining_not_reading(&sidecar).await;
    let second = pipelining_not_reading(&sidecar).await;
    // Their answers are held (what the socket buffers did not take): a
    // third client's answer is refused once they are.
    let refused = tokio::time::timeout(grpc::PATIENCE, async {
        loop {
            let answer = get().await.expect("an answer");
            if !answer.status().is_success() {
                return answer;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("an answer past the listener's budget was never refused");
    let status = refused.status();
    let text = refused.text().await.unwrap_or_default();
    assert_eq!(status, reqwest::StatusCode::TOO_MANY_REQUESTS, "{text}");
    assert!(
        text.contains(r#""errorCode":"ERR_TOO_MANY_REQUESTS""#)
            && text.contains("max_response_bytes_in_flight)"),
        "{text}"
    );
    // Once the clients go, their answers are let go of.
    drop((first, second));
    let served = tokio::time::timeout(grpc::PATIENCE, async {
        loop {
            let answer = get().await.expect("an answer");
            if answer.status().is_success() {
                return answer.bytes().await.expect("the value").len();
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("answers were refused after the clients holding them went");
    assert_eq!(served, value + 2, "the JSON string, quoted");
    sidecar.stop().await;
}
