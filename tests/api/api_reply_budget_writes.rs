//! The reply budget refuses only answers a client can ask for again: the
//! answer of a call that changed state (a lock taken, an id handed out)
//! is sent whatever the budget holds, or the change would be made and its
//! outcome lost (the client's own lock then locks it out, an id is spent
//! unseen).

use crate::api_reply_budget::{read_body, refused_with, save_big, NotReading, MIB};
use crate::support::{grpc, sidecar};

use rewire::sidecar::ApiOptions;
use serde_json::{json, Value};
use sidecar::Sidecar;

const CONFIG: &str = r#"{"components": {
    "state": {"orders": {"type": "memory"}},
    "lock": {"locks": {"type": "memory"}}
}}"#;

/// A listener budget one answer of 1 MiB fills: once a connection holds
/// one, the listener refuses it any other.
fn small_listener_budget() -> ApiOptions {
    ApiOptions {
        max_response_bytes_in_flight: MIB / 2,
        ..ApiOptions::default()
    }
}

fn take_lock(owner: &str) -> String {
    json!({"resourceId": "order-1", "lockOwner": owner, "expiryInSeconds": 60}).to_string()
}

#[tokio::test]
async fn a_lock_taken_over_http_past_the_reply_budget_is_answered() {
    let sidecar = Sidecar::start(CONFIG, small_listener_budget()).await;
    save_big(&sidecar, MIB).await;
    let mut client = NotReading::connect(sidecar.http_addr).await;
    let big = "/v1.0/state/orders/big";
    let held = client.http("GET", big, "").await;
    assert_eq!(held.status(), 200);
    // A read past the budget is refused (the client may ask again)...
    assert_eq!(client.http("GET", big, "").await.status(), 429);
    // ...but a lock taken is answered: refusing it would leave the lock
    // held by a client told to try again.
    let lock = "/v1.0-alpha1/lock/locks";
    let taken = client.http("POST", lock, &take_lock("alice")).await;
    assert_eq!(taken.status(), 200);
    let other = testkit::http_client()
        .post(format!("{}{lock}", sidecar.http_url()))
        .body(take_lock("bob"))
        .header("content-type", "application/json")
        .send()
        .await
        .expect("an answer");
    let other: Value = other.json().await.expect("JSON");
    assert_eq!(other, json!({"success": false}));
    client.read();
    let taken: Value = serde_json::from_slice(&read_body(taken).await).expect("JSON");
    assert_eq!(taken, json!({"success": true}));
    drop(held);
    sidecar.stop().await;
}

#[tokio::test]
async fn a_lock_taken_over_grpc_past_the_reply_budget_is_answered() {
    let sidecar = Sidecar::start(CONFIG, small_listener_budget()).await;
    save_big(&sidecar, MIB).await;
    let mut client = NotReading::connect(sidecar.grpc_addr).await;
    let get = grpc::dapr::GetStateRequest {
        store_name: "orders".into(),
        key: "big".into(),
        ..Default::default()
    };
    let get_state = "/dapr.proto.runtime.v1.Dapr/GetState";
    let held = client.grpc(get_state, &get).await;
    assert_eq!(refused_with(&held), None);
    let refused = client.grpc(get_state, &get).await;
    assert_eq!(refused_with(&refused).as_deref(), Some("8"));
    let lock = grpc::dapr::TryLockRequest {
        store_name: "locks".into(),
        resource_id: "order-1".into(),
        lock_owner: "alice".into(),
        expiry_in_seconds: 60,
    };
    let taken = client
        .grpc("/dapr.proto.runtime.v1.Dapr/TryLockAlpha1", &lock)
        .await;
    assert_eq!(refused_with(&taken), None, "{:?}", taken.headers());
    client.read();
    let body = read_body(taken).await;
    let answer: grpc::dapr::TryLockResponse =
        prost::Message::decode(&body[5..]).expect("a TryLockResponse");
    assert!(answer.success);
    drop(held);
    sidecar.stop().await;
}
