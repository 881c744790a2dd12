//! What the sidecar holds for clients that do not read their answers is
//! bounded in bytes, per connection and per listener: a client granting
//! no HTTP/2 window asking for a large value again and again is refused
//! `RESOURCE_EXHAUSTED` (HTTP 429) once its answers held pass the budget,
//! at once rather than held until the idle timeout, while clients that
//! read (holding nothing) are served whatever others hold; once the
//! client reads or goes, calls pass again. An HTTP/1 client that
//! pipelines and never reads holds one answer at a time.

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

pub(crate) const CONFIG: &str = r#"{"components": {"state": {"orders": {"type": "memory"}}}}"#;
pub(crate) const MIB: usize = 1024 * 1024;
/// The value the tests ask for, and its gRPC answer's size (the value,
/// the message's framing).
pub(crate) const VALUE: usize = MIB;

/// Saves `len` bytes under `big` through the gRPC API.
pub(crate) async fn save_big(sidecar: &Sidecar, len: usize) {
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
pub(crate) struct NotReading {
    sender: h2::client::SendRequest<Bytes>,
    /// Makes room: a window for every stream, and reads on.
    read: Option<oneshot::Sender<()>>,
    driven: tokio::task::JoinHandle<()>,
    addr: std::net::SocketAddr,
}

impl NotReading {
    pub(crate) async fn connect(addr: std::net::SocketAddr) -> Self {
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
        let request = grpc::dapr::GetStateRequest {
            store_name: "orders".into(),
            key: key.into(),
            ..Default::default()
        };
        self.grpc("/dapr.proto.runtime.v1.Dapr/GetState", &request)
            .await
    }

    /// Calls the unary gRPC method at `path` with `message` and waits for
    /// the answer's head.
    pub(crate) async fn grpc(
        &mut self,
        path: &str,
        message: &impl Message,
    ) -> Response<h2::RecvStream> {
        self.grpc_as(path, message, &[], &[]).await
    }

    /// [`Self::grpc`] with the extra `headers` and `after` the message
    /// frame in the body (ways a client may ask for the same call).
    pub(crate) async fn grpc_as(
        &mut self,
        path: &str,
        message: &impl Message,
        headers: &[(&str, &str)],
        after: &[u8],
    ) -> Response<h2::RecvStream> {
        let message = message.encode_to_vec();
        let mut framed = vec![0u8];
        framed.extend_from_slice(&u32::try_from(message.len()).unwrap().to_be_bytes());
        framed.extend_from_slice(&message);
        framed.extend_from_slice(after);
        let mut request = Request::post(format!("http://{}{path}", self.addr))
            .header("content-type", "application/grpc")
            .header("te", "trailers");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        self.send(request.body(()).unwrap(), Bytes::from(framed))
            .await
    }

    /// Sends `method` `path` (an HTTP API call) with `body` and waits for
    /// the answer's head.
    pub(crate) async fn http(
        &mut self,
        method: &str,
        path: &str,
        body: &str,
    ) -> Response<h2::RecvStream> {
        let request = Request::builder()
            .method(method)
            .uri(format!("http://{}{path}", self.addr))
            .header("content-type", "application/json")
            .body(())
            .unwrap();
        self.send(request, Bytes::from(body.to_owned())).await
    }

    /// Sends `request` with `body` and waits for the answer's head.
    async fn send(&mut self, request: Request<()>, body: Bytes) -> Response<h2::RecvStream> {
        let sender = self.sender.clone().ready().await.expect("takes calls");
        self.sender = sender;
        let (answer, mut sending) = self.sender.send_request(request, false).expect("sent");
        sending.send_data(body, true).expect("request body");
        tokio::time::timeout(grpc::PATIENCE, answer)
            .await
            .expect("the answer's head in time")
            .expect("the answer's head")
    }

    /// Makes room for every answer.
    pub(crate) fn read(&mut self) {
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
pub(crate) fn refused_with(answer: &Response<h2::RecvStream>) -> Option<String> {
    answer
        .headers()
        .get("grpc-status")
        .map(|status| status.to_str().unwrap_or_default().to_owned())
}

/// Every data byte of an answer, counted.
pub(crate) async fn read_whole(answer: Response<h2::RecvStream>) -> usize {
    read_body(answer).await.len()
}

/// Every data byte of an answer.
pub(crate) async fn read_body(answer: Response<h2::RecvStream>) -> Vec<u8> {
    let mut body = answer.into_body();
    let mut read = Vec::new();
    tokio::time::timeout(grpc::PATIENCE, async {
        while let Some(data) = body.data().await {
            let data = data.expect("data");
            read.extend_from_slice(&data);
            let _ = body.flow_control().release_capacity(data.len());
        }
    })
    .await
    .expect("the answer read in time");
    read
}

/// A reading client's `GetState` of `big`: the value's length, or the
/// refusal.
pub(crate) async fn get_big(sidecar: &Sidecar) -> Result<usize, tonic::Status> {
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
    // The listener holds 2 MiB: another answer to a client already
    // holding one is refused...
    let refused = second.get_state("big").await;
    assert_eq!(refused_with(&refused).as_deref(), Some("8"));
    let message = refused.headers()["grpc-message"]
        .to_str()
        .unwrap_or_default();
    assert!(
        message.contains("max_response_bytes_in_flight)"),
        "{message}"
    );
    // ...but a client that reads (holding nothing) is served meanwhile.
    for _ in 0..3 {
        assert_eq!(get_big(&sidecar).await.expect("served"), VALUE);
    }
    // Once a client that held answers goes, they are let go of.
    drop(held.0);
    drop(first);
    let served = tokio::time::timeout(grpc::PATIENCE, async {
        loop {
            let answer = second.get_state("big").await;
            if refused_with(&answer).is_none() {
                return answer;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("answers were refused after the client holding them went");
    drop((served, held.1));
    sidecar.stop().await;
}

/// An SDK fanning out on one channel: 32 concurrent `GetState`s of the
/// largest value a sidecar with the default options takes (its save just
/// within `max_request_bytes`) are all answered, although they are built
/// faster than the channel reads them.
#[tokio::test]
async fn a_client_reading_32_concurrent_large_values_on_one_channel_is_served() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let largest = ApiOptions::default().max_request_bytes - 64;
    save_big(&sidecar, largest).await;
    let client = grpc::dapr_client(sidecar.grpc_url()).await;
    let mut calls = tokio::task::JoinSet::new();
    for _ in 0..32 {
        let mut client = client.clone();
        calls.spawn(async move {
            client
                .get_state(grpc::dapr::GetStateRequest {
                    store_name: "orders".into(),
                    key: "big".into(),
                    ..Default::default()
                })
                .await
                .map(|answer| answer.into_inner().data.len())
        });
    }
    for answer in calls.join_all().await {
        assert_eq!(answer.expect("served"), largest);
    }
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
async fn http1_clients_not_reading_hold_one_answer_each_while_readers_are_served() {
    // Values of 8 MiB, larger than what the kernel's socket buffers take
    // off a stalled answer; the listener's budget is two of them.
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
    // Their answers are held (what the socket buffers did not take), past
    // the listener's budget together; a client that reads is served
    // meanwhile (HTTP/1 answers one request at a time, so a connection
    // holds one answer: the listener bound is its budget plus one answer
    // per connection).
    for _ in 0..40 {
        let answer = get().await.expect("an answer");
        let status = answer.status();
        let body = answer.bytes().await.expect("the answer");
        assert_eq!(
            status,
            reqwest::StatusCode::OK,
            "{}",
            String::from_utf8_lossy(&body)
        );
        assert_eq!(body.len(), value + 2, "the JSON string, quoted");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    drop((first, second));
    sidecar.stop().await;
}
