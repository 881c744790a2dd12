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
