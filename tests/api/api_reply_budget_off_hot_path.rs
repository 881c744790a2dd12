//! A gRPC read the hot path declines is answered by tonic's codec, whose
//! answer has no exact size: it is charged to the reply budget as it is
//! produced, so a client cannot leave the budget by how it asks. Before,
//! a client not reading that sent `grpc-encoding: identity`, or an empty
//! second message after its request, had every 1 MiB answer held
//! uncharged (hyper holding tonic's one chunk while the window was 0).

use crate::api_reply_budget::{
    get_big, read_whole, refused_with, save_big, NotReading, CONFIG, MIB, VALUE,
};
use crate::support::{grpc, sidecar};

use std::time::Duration;

use rewire::sidecar::ApiOptions;
use sidecar::Sidecar;
use tonic::codegen::http::Response;

/// How long a held answer's status is waited for before it counts as
/// answered (held for a client granting no window, it never ends).
const HELD: Duration = Duration::from_secs(3);

/// A `GetState` of `key`, asked with `headers` and `after` the message.
async fn get_state_as(
    client: &mut NotReading,
    key: &str,
    headers: &[(&str, &str)],
    after: &[u8],
) -> Response<h2::RecvStream> {
    let request = grpc::dapr::GetStateRequest {
        store_name: "orders".into(),
        key: key.into(),
        ..Default::default()
    };
    client
        .grpc_as(
            "/dapr.proto.runtime.v1.Dapr/GetState",
            &request,
            headers,
            after,
        )
        .await
}

/// An answer's gRPC status and message, from its head (trailers-only) or
/// its trailers once its data ended; `None` while its data is held.
async fn status_of(answer: Response<h2::RecvStream>) -> Option<(String, String)> {
    let header = |headers: &tonic::codegen::http::HeaderMap, name: &str| {
        headers
            .get(name)
            .map(|value| value.to_str().unwrap_or_default().to_owned())
    };
    if let Some(status) = refused_with(&answer) {
        let message = header(answer.headers(), "grpc-message").unwrap_or_default();
        return Some((status, message));
    }
    let mut body = answer.into_body();
    tokio::time::timeout(HELD, async {
        while let Some(data) = body.data().await {
            let _ = data.expect("data");
        }
        let trailers = body.trailers().await.expect("trailers")?;
        let status = header(&trailers, "grpc-status")?;
        Some((
            status,
            header(&trailers, "grpc-message").unwrap_or_default(),
        ))
    })
    .await
    .ok()
    .flatten()
}

/// The per-connection test of `api_reply_budget`, each `GetState` asked
/// with `headers` and `after` its message.
async fn held_answers_are_bounded_when_asked(headers: &[(&str, &str)], after: &[u8]) {
    let options = ApiOptions {
        max_response_bytes_in_flight_per_connection: 2 * MIB + MIB / 2,
        ..ApiOptions::default()
    };
    let sidecar = Sidecar::start(CONFIG, options).await;
    save_big(&sidecar, VALUE).await;
    let mut client = NotReading::connect(sidecar.grpc_addr).await;
    // Two answers of 1 MiB fit in 2.5 MiB, each held charged; the third is
    // refused, its value not held.
    let mut held = Vec::new();
    for _ in 0..2 {
        let answer = get_state_as(&mut client, "big", headers, after).await;
        assert_eq!(refused_with(&answer), None, "{:?}", answer.headers());
        held.push(answer);
    }
    for _ in 0..3 {
        let refused = get_state_as(&mut client, "big", headers, after).await;
        let (status, message) = status_of(refused)
            .await
            .expect("the answer past the budget refused, not held");
        assert_eq!(status, "8", "{message}");
        assert!(
            message.contains("max_response_bytes_in_flight_per_connection"),
            "{message}"
        );
    }
    // Another connection that reads gets the value.
    assert_eq!(get_big(&sidecar).await.expect("served"), VALUE);
    // Once the client reads, the held answers come whole and it is
    // answered again.
    client.read();
    for answer in held {
        assert!(read_whole(answer).await > VALUE);
    }
    let again = get_state_as(&mut client, "big", headers, after).await;
    assert_eq!(refused_with(&again), None, "{:?}", again.headers());
    assert!(read_whole(again).await > VALUE);
    sidecar.stop().await;
}

#[tokio::test]
async fn answers_held_for_a_grpc_client_naming_the_identity_encoding_are_bounded() {
    held_answers_are_bounded_when_asked(&[("grpc-encoding", "identity")], &[]).await;
}

#[tokio::test]
async fn answers_held_for_a_grpc_client_sending_an_empty_second_message_are_bounded() {
    held_answers_are_bounded_when_asked(&[], &[0, 0, 0, 0, 0]).await;
}
