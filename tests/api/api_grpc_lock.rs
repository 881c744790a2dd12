//! The Dapr lock RPCs over gRPC: contention, unlock by a non-owner
//! (`LOCK_BELONGS_TO_OTHERS`), of a lock nobody holds
//! (`LOCK_DOES_NOT_EXIST`), and Dapr's validation errors.

use crate::support::grpc;
use crate::support::sidecar;

use grpc::dapr::unlock_response::Status as UnlockStatus;
use grpc::dapr::{TryLockRequest, UnlockRequest};
use rewire::sidecar::ApiOptions;
use sidecar::Sidecar;
use tonic::transport::Channel;
use tonic::Code;

type Client = grpc::dapr::dapr_client::DaprClient<Channel>;

const CONFIG: &str = r#"{"appId": "shop", "components": {"lock": {"locks": {"type": "memory"}}}}"#;

fn try_lock(resource: &str, owner: &str, seconds: i32) -> TryLockRequest {
    TryLockRequest {
        store_name: "locks".into(),
        resource_id: resource.into(),
        lock_owner: owner.into(),
        expiry_in_seconds: seconds,
    }
}

fn unlock(resource: &str, owner: &str) -> UnlockRequest {
    UnlockRequest {
        store_name: "locks".into(),
        resource_id: resource.into(),
        lock_owner: owner.into(),
    }
}

async fn taken(client: &mut Client, resource: &str, owner: &str) -> bool {
    let answer = client.try_lock_alpha1(try_lock(resource, owner, 60)).await;
    answer.expect("try lock").into_inner().success
}

async fn unlocked(client: &mut Client, resource: &str, owner: &str) -> UnlockStatus {
    let answer = client.unlock_alpha1(unlock(resource, owner)).await;
    answer.expect("unlock").into_inner().status()
}

#[tokio::test]
async fn contention_and_owner_only_unlock() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let mut client = grpc::dapr_client(sidecar.grpc_url()).await;
    assert!(taken(&mut client, "order-1", "alice").await);
    assert!(!taken(&mut client, "order-1", "bob").await, "held by alice");
    assert!(
        taken(&mut client, "order-2", "bob").await,
        "another resource is free"
    );

    assert_eq!(
        unlocked(&mut client, "order-1", "bob").await,
        UnlockStatus::LockBelongsToOthers
    );
    assert_eq!(
        unlocked(&mut client, "order-1", "alice").await,
        UnlockStatus::Success
    );
    assert_eq!(
        unlocked(&mut client, "order-1", "alice").await,
        UnlockStatus::LockDoesNotExist
    );
    assert_eq!(
        unlocked(&mut client, "never", "alice").await,
        UnlockStatus::LockDoesNotExist
    );
    assert!(taken(&mut client, "order-1", "bob").await, "free again");
    sidecar.stop().await;
}

#[tokio::test]
async fn malformed_requests_are_invalid_arguments() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let mut client = grpc::dapr_client(sidecar.grpc_url()).await;
    for (request, expected) in [
        (try_lock("", "alice", 10), "ResourceId is empty"),
        (try_lock("r", "", 10), "LockOwner is empty"),
        (try_lock("r", "alice", 0), "ExpiryInSeconds is not positive"),
    ] {
        let status = client.try_lock_alpha1(request).await.expect_err("invalid");
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(status.message().contains(expected), "{}", status.message());
    }
    let status = client
        .unlock_alpha1(unlock("r", ""))
        .await
        .expect_err("invalid");
    assert_eq!(status.code(), Code::InvalidArgument);
    let mut elsewhere = try_lock("r", "alice", 10);
    elsewhere.store_name = "nope".into();
    let status = client
        .try_lock_alpha1(elsewhere)
        .await
        .expect_err("no such store");
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(status.message(), "lock store nope not found");
    sidecar.stop().await;
}
