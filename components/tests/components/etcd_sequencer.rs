//! The `etcd` sequencer against real etcd servers: concurrent STRONG
//! clients never see an id twice and each sees its ids grow, also across a
//! rebuild onto another cluster (with `highWaterFile`).

use crate::sequencers::{clients_taking, sequencer, Current};
use crate::support::etcd_server::EtcdServer;

use std::sync::{Arc, RwLock};

use rewire_runtime::{Increment, NextIdRequest};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strong_ids_never_repeat_across_a_rebuild_on_another_cluster() {
    let (a, b) = (EtcdServer::start().await, EtcdServer::start().await);
    let dir = tempfile::tempdir().unwrap();
    let marks = dir.path().join("marks.json").display().to_string();
    let metadata = |endpoint: String| json!({"endpoints": endpoint, "keyPrefix": "/ids/", "highWaterFile": marks});
    let old = sequencer("etcd", metadata(a.endpoint())).await;
    let current: Current = Arc::new(RwLock::new(old));
    let swap = current.clone();
    let b_metadata = metadata(b.endpoint());
    clients_taking(current.clone(), 500, || async move {
        let new = sequencer("etcd", b_metadata).await;
        *swap.write().unwrap() = new;
    })
    .await;
    // Layotto's key layout, under the prefix.
    let on_b: i64 = b
        .value("/ids/sequencer|||orders")
        .await
        .unwrap()
        .parse()
        .unwrap();
    assert!(on_b > 0);
    let sequencer = current.read().unwrap().clone();
    let request = |key: &str| NextIdRequest {
        key: key.into(),
        increment: Increment::Strong,
        ..NextIdRequest::default()
    };
    assert_eq!(sequencer.get_next_id(request("fresh")).await, Ok(1));
    assert!(sequencer.get_next_id(request("")).await.is_err());
}

#[tokio::test]
async fn an_unreachable_cluster_fails_init_naming_endpoints() {
    let metadata = json!({"endpoints": "127.0.0.1:1", "dialTimeout": "300ms"});
    let err = crate::common::start("sequencer", "etcd", metadata)
        .await
        .unwrap_err();
    assert!(err.contains("`endpoints`"), "{err}");
}

const ROOT_PASSWORD: &str = "s3cret-root-pw";

fn next(key: &str) -> NextIdRequest {
    NextIdRequest {
        key: key.into(),
        increment: Increment::Strong,
        ..NextIdRequest::default()
    }
}

/// With a user set, the sequencer logs in when it starts: the login times
/// out on a first listed member that hangs (`dialTimeout`) and is made on
/// the next one, within init's limit (a `dialTimeout` per member).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_logs_in_past_a_first_listed_member_that_hangs() {
    let cluster = testkit::etcd_cluster::EtcdCluster::start(3).await;
    let follower = (cluster.leader().await + 1) % 3;
    let root = cluster.client().await;
    root.user_add("root", ROOT_PASSWORD).await.unwrap();
    root.user_grant_role("root", "root").await.unwrap();
    root.auth_enable().await.unwrap();
    cluster.pause(follower);
    let metadata = json!({
        "endpoints": cluster.endpoints_from(follower), "keyPrefix": "/ids/",
        "username": "root", "password": ROOT_PASSWORD, "dialTimeout": "1s"
    });
    let started = tokio::time::timeout(
        std::time::Duration::from_secs(20),
        crate::common::start("sequencer", "etcd", metadata),
    )
    .await
    .expect("init hung");
    cluster.resume(follower);
    let sequencer = match started {
        Ok(rewire_runtime::Instance::Sequencer(sequencer)) => sequencer,
        other => panic!("start with the first member hung: {other:?}"),
    };
    assert_eq!(sequencer.get_next_id(next("orders")).await, Ok(1));
}

/// A user whose role may use only `keyPrefix` starts the sequencer (its
/// start-up probe reads under the prefix) and takes ids.
#[tokio::test]
async fn a_user_allowed_only_the_key_prefix_starts_and_takes_ids() {
    let mut server = EtcdServer::start().await;
    server.enable_auth(ROOT_PASSWORD).await;
    let root = server.client().await;
    root.role_add("ids-only").await.unwrap();
    root.role_grant_prefix("ids-only", "/ids/").await.unwrap();
    root.user_add("seq", "seq-pw-1").await.unwrap();
    root.user_grant_role("seq", "ids-only").await.unwrap();
    let metadata = json!({
        "endpoints": server.endpoint(), "keyPrefix": "/ids/",
        "username": "seq", "password": "seq-pw-1", "dialTimeout": "2s"
    });
    let sequencer = match crate::common::start("sequencer", "etcd", metadata).await {
        Ok(rewire_runtime::Instance::Sequencer(sequencer)) => sequencer,
        other => panic!("start as a user allowed only /ids/: {other:?}"),
    };
    assert_eq!(sequencer.get_next_id(next("orders")).await, Ok(1));
    assert_eq!(
        server.value("/ids/sequencer|||orders").await.as_deref(),
        Some("1")
    );
}
