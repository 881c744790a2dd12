//! A sequencer through real reloads: 8 clients take STRONG ids through the
//! runtime's handle while one reload switches its redis server in place
//! and another rebuilds it as another type on the same high-water file.
//! During each reload every client's request is held in flight on the old
//! server (`CLIENT PAUSE WRITE`), so the old instance's replies arrive after
//! the new one serves: they are refused (the sequencer logs each refusal,
//! counted here) and asked again above the floor. No request fails, no id
//! repeats, each client's ids keep growing, and the old counters stop.

use crate::support::reload::{actions, apply_ok, start, wait_until};

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rewire::{Action, Increment, NextIdRequest, SequencerHandle};
use serde_json::json;
use testkit::redis::RedisServer;
use tracing::instrument::WithSubscriber;
use tracing_subscriber::layer::SubscriberExt;

const CLIENTS: usize = 8;
/// Ids each client takes before the first reload, and after each reload.
const IDS_PER_PHASE: usize = 500;
/// What the redis sequencer logs (at debug) when it drops a reply and asks
/// again.
const REFUSED: &str = "Sequencer reply dropped; asking again.";
/// How long a paused server holds commands at most (a test that fails
/// midway does not leave them held): well under the bound of one command
/// (`dialTimeout` + `readTimeout` + `writeTimeout`, 11 s by default).
const PAUSE_MS: &str = "5000";

fn config(type_name: &str, metadata: serde_json::Value) -> String {
    json!({"appId": "ids", "components": {"sequencer": {
        "ids": {"type": type_name, "metadata": metadata}
    }}})
    .to_string()
}

/// Counts the sequencer's refusals per phase of the test (0: before any
/// reload; 1: from the in-place switch on; 2: from the rebuild on).
#[derive(Clone, Default)]
struct Refusals {
    phase: Arc<AtomicUsize>,
    counts: Arc<[AtomicUsize; 3]>,
}

impl Refusals {
    fn enter(&self, phase: usize) {
        self.phase.store(phase, Ordering::SeqCst);
    }

    fn during(&self, phase: usize) -> usize {
        self.counts[phase].load(Ordering::SeqCst)
    }

    fn all(&self) -> [usize; 3] {
        [self.during(0), self.during(1), self.during(2)]
    }
}

/// Finds the `message` field of an event.
struct Message(Option<String>);

impl tracing::field::Visit for Message {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = Some(format!("{value:?}"));
        }
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Refusals {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        let mut message = Message(None);
        event.record(&mut message);
        if message.0.as_deref() == Some(REFUSED) {
            let phase = self.phase.load(Ordering::SeqCst);
            self.counts[phase].fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// One STRONG id of `orders`; a failed request fails the test.
async fn next_id(handle: &SequencerHandle, who: &str) -> i64 {
    let request = NextIdRequest {
        key: "orders".into(),
        increment: Increment::Strong,
        ..NextIdRequest::default()
    };
    let sequencer = handle
        .load()
        .unwrap_or_else(|err| panic!("{who}: no sequencer: {err}"));
    sequencer
        .get_next_id(request)
        .await
        .unwrap_or_else(|err| panic!("{who}: a request failed: {err}"))
}

/// `count` ids taken by the test itself.
async fn take(handle: &SequencerHandle, count: usize) -> Vec<i64> {
    let mut ids = Vec::with_capacity(count);
    for _ in 0..count {
        ids.push(next_id(handle, "the test").await);
    }
    ids
}

/// The counter of `orders` on `server` (0 if it has none).
async fn counter(server: &RedisServer) -> i64 {
    let value = server
        .query(&["GET", "sequencer|||ids||orders"])
        .await
        .expect("GET the counter");
    value.first().map_or(0, |v| v.parse().expect("a number"))
}

/// Waits until every client reports it took [`IDS_PER_PHASE`] ids after
/// `reloads` reloads; fails after a minute.
async fn wait_for_all(reloads: usize, reports: &mut tokio::sync::mpsc::Receiver<usize>) {
    let mut clients = 0;
    let waiting = async {
        while clients < CLIENTS {
            let phase = reports.recv().await.expect("a client ended early");
            assert!(
                phase <= reloads,
                "a report of phase {phase} before {reloads}"
            );
            if phase == reloads {
                clients += 1;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(60), waiting)
        .await
        .unwrap_or_else(|_| panic!("not every client took its ids after {reloads} reloads"));
}

/// Holds every write (scripts included) on `server` until unpaused.
async fn pause_writes(server: &RedisServer) {
    server
        .query(&["CLIENT", "PAUSE", PAUSE_MS, "WRITE"])
        .await
        .expect("CLIENT PAUSE");
}

async fn unpause(server: &RedisServer) {
    server
        .query(&["CLIENT", "UNPAUSE"])
        .await
        .expect("CLIENT UNPAUSE");
}

/// What the test tells the clients, and what they tell it back.
#[derive(Clone, Default)]
struct Steps {
    /// Reloads committed.
    reloads: Arc<AtomicUsize>,
    /// The reload whose old server is about to pause (0: none yet).
    paused: Arc<AtomicUsize>,
    /// Per reload: clients that started a request once told of its pause.
    held: Arc<[AtomicUsize; 3]>,
}

/// One client: takes ids until 2 reloads are done and it took
/// [`IDS_PER_PHASE`] after them, reporting on `progress` each time it took
/// that many after 0, 1 and 2 reloads. Its ids, and per reload (1 and 2)
/// whether a request of it started before the reload and ended after it.
async fn take_until_told(
    handle: SequencerHandle,
    steps: Steps,
    progress: tokio::sync::mpsc::Sender<usize>,
    client: usize,
) -> (Vec<i64>, [bool; 3]) {
    let who = format!("client {client}");
    let mut ids: Vec<i64> = Vec::new();
    let mut after = [0usize; 3];
    let mut crossed = [false; 3];
    let mut held = [false; 3];
    loop {
        let done = steps.reloads.load(Ordering::SeqCst);
        if done == 2 && after[2] >= IDS_PER_PHASE {
            return (ids, crossed);
        }
        // Told the next reload's server pauses: this request, or the next
        // (if this one gets through before the pause), is held there until
        // that reload is done.
        let paused = steps.paused.load(Ordering::SeqCst);
        if paused > done && !held[paused] {
            held[paused] = true;
            steps.held[paused].fetch_add(1, Ordering::SeqCst);
        }
        let id = next_id(&handle, &who).await;
        let ended = steps.reloads.load(Ordering::SeqCst);
        crossed[done + 1..=ended].fill(true);
        if let Some(last) = ids.last() {
            assert!(id > *last, "{who}: id {id} after {last}");
        }
        ids.push(id);
        after[done] += 1;
        if after[done] == IDS_PER_PHASE {
            progress.try_send(done).expect("room for every report");
        }
    }
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
    let handle = runtime.sequencer("ids");
    let refusals = Refusals::default();
    let logs = tracing::Dispatch::new(tracing_subscriber::registry().with(refusals.clone()));

    // Clients take ids until told the second reload is done, then
    // IDS_PER_PHASE more; each reports when it took IDS_PER_PHASE after
    // 0, 1 and 2 reloads (counting the requests it started after them).
    let steps = Steps::default();
    let (progress, mut reports) = tokio::sync::mpsc::channel::<usize>(3 * CLIENTS);
    let clients: Vec<_> = (0..CLIENTS)
        .map(|client| {
            let taking = take_until_told(handle.clone(), steps.clone(), progress.clone(), client);
            tokio::spawn(taking.with_subscriber(logs.clone()))
        })
        .collect();
    drop(progress);
    wait_for_all(0, &mut reports).await;

    // In place onto b, with a request of every client held on a.
    refusals.enter(1);
    steps.paused.store(1, Ordering::SeqCst);
    pause_writes(&a).await;
    wait_until("every client has a request held on a", || {
        steps.held[1].load(Ordering::SeqCst) == CLIENTS
    })
    .await;
    let switched = apply_ok(&runtime, &on_b).await;
    steps.reloads.store(1, Ordering::SeqCst);
    unpause(&a).await;
    assert_eq!(
        actions(&switched),
        [("sequencer/ids".to_string(), Action::UpdatedInPlace)]
    );
    wait_for_all(1, &mut reports).await;
    // Every request a client had on a ended before its first one after
    // the switch: a's counter is final.
    let a_after_switch = counter(&a).await;

    // Rebuilt in memory, with a request of every client held on b; the new
    // instance hands out more ids than there are held requests while they
    // wait, so every held reply lies below them.
    refusals.enter(2);
    steps.paused.store(2, Ordering::SeqCst);
    pause_writes(&b).await;
    wait_until("every client has a request held on b", || {
        steps.held[2].load(Ordering::SeqCst) == CLIENTS
    })
    .await;
    let rebuilt = apply_ok(&runtime, &in_memory).await;
    assert_eq!(
        actions(&rebuilt),
        [("sequencer/ids".to_string(), Action::Rebuilt)]
    );
    let mut own = take(&handle, 2 * CLIENTS).await;
    steps.reloads.store(2, Ordering::SeqCst);
    unpause(&b).await;
    wait_for_all(2, &mut reports).await;

    let mut all = HashSet::new();
    let mut taken = 0;
    let mut crossing = [0usize; 3];
    for task in clients {
        let (ids, crossed) = task.await.unwrap();
        for reload in [1, 2] {
            crossing[reload] += usize::from(crossed[reload]);
        }
        for id in ids {
            taken += 1;
            assert!(all.insert(id), "id {id} handed out twice");
        }
    }
    // A request held on the old server is in flight across its reload.
    assert!(
        crossing[1] >= 1 && crossing[2] >= 1,
        "clients with a request in flight across reload 1 and 2: {crossing:?}"
    );
    // Only the in-memory instance serves now: the servers' counters stay.
    let b_after_rebuild = counter(&b).await;
    own.extend(take(&handle, 100).await);
    for id in own {
        taken += 1;
        assert!(all.insert(id), "id {id} handed out twice");
    }
    assert_eq!(all.len(), taken);
    assert!(taken >= CLIENTS * 3 * IDS_PER_PHASE + 2 * CLIENTS + 100);
    assert_eq!(
        counter(&a).await,
        a_after_switch,
        "a served after the switch"
    );
    assert!(b_after_rebuild > 0, "b never served");
    assert_eq!(
        counter(&b).await,
        b_after_rebuild,
        "b served after the rebuild"
    );
    // The replies held in flight were refused and asked again, at each
    // reload; none before the first.
    let counted = refusals.all();
    assert_eq!(counted[0], 0, "refusals before any reload: {counted:?}");
    assert!(
        counted[1] >= 1,
        "no reply refused after the switch: {counted:?}"
    );
    assert!(
        counted[2] >= 1,
        "no reply refused after the rebuild: {counted:?}"
    );
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
