//! A sequencer through real reloads: 8 clients take STRONG ids through the
//! runtime's handle while one reload switches its redis server in place
//! and another rebuilds it as another type on the same high-water file. No
//! id repeats; each client's ids keep growing.

use crate::support::reload::{actions, apply_ok, start};

use std::collections::HashSet;

use rewire::{Action, Increment, NextIdRequest};
use serde_json::json;
use testkit::redis::RedisServer;

const CLIENTS: usize = 8;
const IDS_PER_CLIENT: usize = 3_000;

fn config(type_name: &str, metadata: serde_json::Value) -> String {
    json!({"appId": "ids", "components": {"sequencer": {
        "ids": {"type": type_name, "metadata": metadata}
    }}})
    .to_string()
}

/// Waits until some client reports `phase` (or every client is done);
/// fails after a minute.
async fn wait_for(phase: usize, reports: &mut tokio::sync::mpsc::Receiver<usize>) {
    let waiting = async { while reports.recv().await.is_some_and(|p| p < phase) {} };
    tokio::time::timeout(std::time::Duration::from_secs(60), waiting)
        .await
        .unwrap_or_else(|_| panic!("no client reached phase {phase} in a minute"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_never_repeat_across_an_in_place_switch_and_a_rebuild() {
    let (a, b) = (RedisServer::start().await, RedisServer::start().await);
    let dir = tempfile::tempdir().unwrap();
    let marks = dir.path().join("marks.json").display().to_string();
    let on_a = config(
        "redis",
        json!({"redisHost": a.addr(), "highWaterFile": marks}),
    );
    let on_b = config(
        "redis",
        json!({"redisHost": b.addr(), "highWaterFile": marks}),
    );
    let in_memory = config("memory", json!({"highWaterFile": marks}));
    let runtime = start(&on_a).await;

    // Each client reports when it is a third and two thirds through.
    let (progress, mut reports) = tokio::sync::mpsc::channel::<usize>(2 * CLIENTS);
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let handle = runtime.sequencer("ids");
            let progress = progress.clone();
            tokio::spawn(async move {
                let mut ids: Vec<i64> = Vec::with_capacity(IDS_PER_CLIENT);
                for i in 0..IDS_PER_CLIENT {
                    if i > 0 && i % (IDS_PER_CLIENT / 3) == 0 {
                        let _ = progress.try_send(i / (IDS_PER_CLIENT / 3));
                    }
                    let request = NextIdRequest {
                        key: "orders".into(),
                        increment: Increment::Strong,
                        ..NextIdRequest::default()
                    };
                    let id = handle.load().unwrap().get_next_id(request).await.unwrap();
                    if let Some(last) = ids.last() {
                        assert!(id > *last, "id {id} after {last}");
                    }
                    ids.push(id);
                }
                ids
            })
        })
        .collect();
    drop(progress);

    wait_for(1, &mut reports).await;
    let switched = apply_ok(&runtime, &on_b).await;
    assert_eq!(
        actions(&switched),
        [("sequencer/ids".to_string(), Action::UpdatedInPlace)]
    );
    wait_for(2, &mut reports).await;
    let rebuilt = apply_ok(&runtime, &in_memory).await;
    assert_eq!(
        actions(&rebuilt),
        [("sequencer/ids".to_string(), Action::Rebuilt)]
    );

    let mut all = HashSet::new();
    for client in clients {
        for id in client.await.unwrap() {
            assert!(all.insert(id), "id {id} handed out twice");
        }
    }
    assert_eq!(all.len(), CLIENTS * IDS_PER_CLIENT);
    runtime.shutdown().await;
}

/// Ids go on across rebuilds that share no file with their predecessor:
/// onto a redis server whose counter lags (the file is added at the same
/// time, so the sequencer is rebuilt, and the new file is empty), to
/// another type, and with the file removed or changed.
#[tokio::test]
async fn ids_go_on_across_rebuilds_that_share_no_file() {
    let (a, b) = (RedisServer::start().await, RedisServer::start().await);
    b.query(&["SET", "sequencer|||ids-rebuilt||orders", "5"])
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = |name: &str| dir.path().join(name).display().to_string();
    let config = |type_name: &str, metadata| {
        json!({"appId": "ids-rebuilt", "components": {"sequencer": {
            "ids": {"type": type_name, "metadata": metadata}
        }}})
        .to_string()
    };
    let runtime = start(&config("redis", json!({"redisHost": a.addr()}))).await;
    let handle = runtime.sequencer("ids");
    let mut seen = HashSet::new();
    let mut last = 0;
    let take = |count: usize| {
        let handle = handle.clone();
        async move {
            let mut ids = Vec::new();
            for _ in 0..count {
                let request = NextIdRequest {
                    key: "orders".into(),
                    increment: Increment::Strong,
                    ..NextIdRequest::default()
                };
                ids.push(handle.load().unwrap().get_next_id(request).await.unwrap());
            }
            ids
        }
    };
    for id in take(50).await {
        assert!(seen.insert(id) && id > last, "{id} after {last}");
        last = id;
    }
    for (type_name, metadata) in [
        (
            "redis",
            json!({"redisHost": b.addr(), "highWaterFile": file("one.json")}),
        ),
        ("memory", json!({})),
        ("memory", json!({"highWaterFile": file("two.json")})),
        ("memory", json!({"highWaterFile": file("three.json")})),
        ("redis", json!({"redisHost": a.addr()})),
    ] {
        let record = apply_ok(&runtime, &config(type_name, metadata)).await;
        assert_eq!(
            actions(&record),
            [("sequencer/ids".to_string(), Action::Rebuilt)],
            "{type_name}"
        );
        for id in take(20).await {
            assert!(
                seen.insert(id) && id > last,
                "{type_name}: {id} after {last}"
            );
            last = id;
        }
    }
    runtime.shutdown().await;
}

/// A reload that changes only `appId` rebuilds the `memory` sequencer (no
/// `highWaterFile`); the rebuilt one goes on above every id its
/// predecessor handed out rather than starting again at 1.
#[tokio::test]
async fn a_memory_sequencer_rebuilt_for_a_new_app_id_goes_on_above_its_ids() {
    let config = |app_id: &str| {
        json!({"appId": app_id, "components": {"sequencer": {
            "ids": {"type": "memory", "metadata": {}}
        }}})
        .to_string()
    };
    let runtime = start(&config("a")).await;
    let handle = runtime.sequencer("ids");
    let next = || {
        let handle = handle.clone();
        async move {
            let request = NextIdRequest {
                key: "orders".into(),
                increment: Increment::Strong,
                ..NextIdRequest::default()
            };
            handle.load().unwrap().get_next_id(request).await.unwrap()
        }
    };
    for expected in 1..=5 {
        assert_eq!(next().await, expected);
    }
    let record = apply_ok(&runtime, &config("b")).await;
    assert_eq!(
        actions(&record),
        [("sequencer/ids".to_string(), Action::Rebuilt)]
    );
    let after = next().await;
    assert!(after > 5, "id {after} after 5: handed out again");
    runtime.shutdown().await;
}
