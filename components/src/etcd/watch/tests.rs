//! The watch task against fake members ([`fake_member`](super::super::fake_member)):
//! a member behind the last revision seen after a failover, a member
//! silent on the stream, the answer to a progress request, a response
//! over `maxResponseBytes` (whole or in fragments), and the backoff after
//! a watch created and failing at once.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rewire_etcd::{Client, ConnectOptions, DEFAULT_MAX_RESPONSE_SIZE};
use rewire_runtime::{ComponentKey, ConfigQuery, ConfigSubscription};
use tokio::sync::Notify;
use tokio::time::timeout;
use tokio_util::sync::CancellationToken;

use super::super::cache::{Entry, KvCache, SharedCache, Snapshot};
use super::super::fake_member::{
    created, events, fragment, FakeMember, Kv, RangeAnswer, WatchPlan,
};
use super::super::fanout::Fanout;
use super::super::keys::KeyLayout;
use super::super::metadata::EtcdMetadata;
use super::super::subscribers::Subscribers;
use super::{Follower, Watchdog};

/// The revision the watch has seen when the tests start.
const LAST_SEEN: i64 = 10;
/// Bound on each wait of a test.
const PATIENCE: Duration = Duration::from_secs(15);

/// The one key under the prefix at [`LAST_SEEN`].
const AT_LAST_SEEN: Kv = ("/p/k", "v10", LAST_SEEN);

/// A range answer: the key at [`LAST_SEEN`] for a read at it, `current`
/// (at revision `revision`) for a read of the current values.
fn ranges(revision: i64, current: Kv) -> RangeAnswer {
    Box::new(move |at| match at {
        LAST_SEEN => (revision, vec![AT_LAST_SEEN]),
        _ => (revision, vec![current]),
    })
}

/// A follower of `/p/` on the members at `urls` that has seen
/// [`AT_LAST_SEEN`]; its fanout, and a subscription to key `k`.
async fn follower(urls: &[String]) -> (Follower, Arc<Fanout>, ConfigSubscription) {
    follower_limited(urls, DEFAULT_MAX_RESPONSE_SIZE).await
}

/// [`follower`], taking answers of up to `max_response_bytes`.
async fn follower_limited(
    urls: &[String],
    max_response_bytes: usize,
) -> (Follower, Arc<Fanout>, ConfigSubscription) {
    let endpoints: Vec<&str> = urls
        .iter()
        .map(|url| url.trim_start_matches("http://"))
        .collect();
    let mut metadata = EtcdMetadata::new(endpoints.join(","));
    metadata.key_prefix = "/p/".into();
    metadata.watch_retry_ms = 20;
    metadata.max_response_bytes = Some(max_response_bytes as u64);
    let settings = metadata.settings().expect("settings");
    let options = ConnectOptions {
        connect_timeout: Duration::from_secs(2),
        timeout: Duration::from_secs(2),
        max_response_size: max_response_bytes,
        ..ConnectOptions::default()
    };
    let client = Client::connect(urls, options).await.expect("connect");
    let (path, value, mod_revision) = AT_LAST_SEEN;
    let entry = Entry {
        value: value.into(),
        mod_revision,
    };
    let snapshot = Snapshot {
        revision: LAST_SEEN,
        entries: BTreeMap::from([(path.to_string(), entry)]),
    };
    let cache: SharedCache = Arc::new(Mutex::new(KvCache::new(snapshot)));
    let hub = Arc::new(Subscribers::default());
    let subscription = hub.subscribe(ConfigQuery {
        keys: vec!["k".into()],
        ..ConfigQuery::default()
    });
    let fanout = Arc::new(Fanout::default());
    assert!(fanout.add(1, hub));
    let follower = Follower::new(
        ComponentKey::new("configuration", "etcd"),
        client,
        settings,
        KeyLayout::new("/p/"),
        Arc::clone(&fanout),
        cache,
        LAST_SEEN,
    );
    (follower, fanout, subscription)
}

/// The values of key `k` published, until (and with) `last`.
async fn values_until(subscription: &mut ConfigSubscription, last: &str) -> Vec<String> {
    let mut values = Vec::new();
    while values.last().map(String::as_str) != Some(last) {
        let change = timeout(PATIENCE, subscription.changes.recv())
            .await
            .unwrap_or_else(|_| panic!("no `{last}` within {PATIENCE:?}; got {values:?}"))
            .expect("the subscription is open");
        values.extend(change.items.into_iter().map(|item| item.value));
    }
    values
}

#[tokio::test]
async fn a_member_behind_the_last_revision_seen_resumes_the_watch_without_a_re_read() {
    // After a failover the member has applied revision 9 only: it serves
    // the watch from 11 as the revisions come.
    let plan = WatchPlan {
        responses: vec![
            created(LAST_SEEN - 1),
            events(11, &[("/p/k", "v11", 11)]),
            events(12, &[("/p/k", "v12", 12)]),
        ],
        ..WatchPlan::default()
    };
    let member = FakeMember::new(vec![plan], ranges(12, ("/p/k", "v12", 12)));
    let (follower, _fanout, mut subscription) = follower(&[member.serve()]).await;
    let stop = CancellationToken::new();
    let task = tokio::spawn(follower.run(stop.clone()));

    // Both changes, not just the last one a re-read would find.
    assert_eq!(values_until(&mut subscription, "v12").await, ["v11", "v12"]);
    // One read, at the last revision seen (the history check); no read of
    // the current values (a re-read).
    assert_eq!(*member.ranges.lock().unwrap(), [LAST_SEEN]);
    assert_eq!(*member.watches.lock().unwrap(), [LAST_SEEN]);
    stop.cancel();
    task.await.expect("the watch task ends");
}

#[tokio::test]
async fn a_member_silent_on_the_watch_is_reported_and_left_for_the_next_one() {
    // Member A creates the watch, then sends nothing and answers no
    // progress request, its connection alive (its pings answered).
    // It answered one progress request first: it is known to answer.
    let silent = FakeMember::new(
        vec![WatchPlan {
            responses: vec![created(LAST_SEEN)],
            answers_progress: true,
            answer_revision: LAST_SEEN,
            answers_at_most: Some(1),
            ..WatchPlan::default()
        }],
        ranges(LAST_SEEN, AT_LAST_SEEN),
    );
    // Member B serves the watch once the test has seen the failure.
    let gate = Arc::new(Notify::new());
    let next = FakeMember::new(
        vec![WatchPlan {
            gate: Some(Arc::clone(&gate)),
            responses: vec![created(LAST_SEEN), events(11, &[("/p/k", "v11", 11)])],
            answers_progress: true,
            answer_revision: LAST_SEEN,
            ..WatchPlan::default()
        }],
        ranges(11, ("/p/k", "v11", 11)),
    );
    let (mut follower, fanout, mut subscription) = follower(&[silent.serve(), next.serve()]).await;
    follower.watchdog = Watchdog {
        quiet: Duration::from_millis(100),
        answer_within: Duration::from_millis(200),
    };
    let stop = CancellationToken::new();
    let task = tokio::spawn(follower.run(stop.clone()));

    let reason = timeout(PATIENCE, async {
        loop {
            if let Some((_, reason)) = fanout.watch_failure() {
                return reason;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the silent watch is reported failing");
    assert!(reason.contains("progress request"), "{reason}");
    assert!(silent.progress_requests.load(Ordering::Acquire) >= 2);

    gate.notify_one();
    assert_eq!(values_until(&mut subscription, "v11").await, ["v11"]);
    assert!(fanout.watch_failure().is_none(), "recovered on member B");
    assert_eq!(*silent.watches.lock().unwrap(), [LAST_SEEN]);
    assert_eq!(*next.watches.lock().unwrap(), [LAST_SEEN]);
    stop.cancel();
    task.await.expect("the watch task ends");
}

#[tokio::test]
async fn a_quiet_member_that_answers_progress_only_from_the_watch_start_is_kept() {
    // etcd 3.6.2+: a progress request is answered only once the member's
    // revision reaches the watch's start. A quiet cluster stays at the
    // last revision seen: watched from past it, the member would look
    // stuck and be left every 30 s.
    let quiet = FakeMember::new(
        vec![WatchPlan {
            responses: vec![created(LAST_SEEN)],
            answers_progress: true,
            answer_revision: LAST_SEEN,
            defers_progress_before_start: true,
            ..WatchPlan::default()
        }],
        ranges(LAST_SEEN, AT_LAST_SEEN),
    );
    let (mut follower, fanout, _subscription) = follower(&[quiet.serve()]).await;
    follower.watchdog = Watchdog {
        quiet: Duration::from_millis(100),
        answer_within: Duration::from_millis(200),
    };
    let stop = CancellationToken::new();
    let task = tokio::spawn(follower.run(stop.clone()));
    let asked_twice = async {
        while quiet.progress_requests.load(Ordering::Acquire) < 3 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    timeout(PATIENCE, asked_twice)
        .await
        .expect("progress asked for again and again");
    assert!(
        fanout.watch_failure().is_none(),
        "a quiet member taken for a stuck one"
    );
    assert_eq!(*quiet.watches.lock().unwrap(), [LAST_SEEN]);
    stop.cancel();
    task.await.expect("the watch task ends");
}

#[tokio::test]
async fn an_answer_to_a_progress_request_does_not_skip_events_still_to_come() {
    // etcd 3.4 answers with its current revision (50) while events below
    // it may still be on their way.
    let plan = WatchPlan {
        responses: vec![created(50)],
        answers_progress: true,
        answer_revision: 50,
        after_progress: vec![events(11, &[("/p/k", "v11", 11)])],
        ..WatchPlan::default()
    };
    let member = FakeMember::new(vec![plan], ranges(50, ("/p/k", "v11", 11)));
    let (mut follower, _fanout, mut subscription) = follower(&[member.serve()]).await;
    follower.watchdog = Watchdog {
        quiet: Duration::from_millis(50),
        answer_within: PATIENCE,
    };
    let stop = CancellationToken::new();
    let task = tokio::spawn(follower.run(stop.clone()));

    assert_eq!(values_until(&mut subscription, "v11").await, ["v11"]);
    assert!(member.progress_requests.load(Ordering::Acquire) >= 1);
    stop.cancel();
    task.await.expect("the watch task ends");
}

/// The limit on an answer in the tests of large responses.
const SMALL_LIMIT: usize = 4096;

/// A value of `size` bytes (leaked: the fake takes `'static` values).
fn large_value(size: usize) -> &'static str {
    "x".repeat(size).leak()
}

#[tokio::test]
async fn a_watch_response_over_the_limit_makes_a_re_read_not_a_retry_for_ever() {
    // The resumed watch catches up on 20 revisions in one response over
    // the limit; a retry from the same revision would get it again. (The
    // fake's responses come "trailers-only", for which tonic applies its
    // own 4 MiB limit, not the client's: the response is over both.)
    let too_large = || WatchPlan {
        responses: vec![
            created(LAST_SEEN),
            events(30, &[("/p/k", large_value(5 << 20), 30)]),
        ],
        ..WatchPlan::default()
    };
    let plans = vec![
        too_large(),
        WatchPlan {
            responses: vec![created(30)],
            ..WatchPlan::default()
        },
    ];
    let member = FakeMember::new(plans, ranges(30, ("/p/k", "v30", 30)));
    let (follower, _fanout, mut subscription) =
        follower_limited(&[member.serve()], SMALL_LIMIT).await;
    let stop = CancellationToken::new();
    let task = tokio::spawn(follower.run(stop.clone()));

    assert_eq!(values_until(&mut subscription, "v30").await, ["v30"]);
    // The re-read of the current values, no check of the old history.
    assert_eq!(*member.ranges.lock().unwrap(), [0]);
    assert!(member.fragmented_watches.load(Ordering::Acquire) >= 1);
    stop.cancel();
    task.await.expect("the watch task ends");
}

#[tokio::test]
async fn fragments_over_the_limit_in_all_make_a_re_read() {
    // Each fragment fits the limit; together they do not.
    let part = || large_value(SMALL_LIMIT * 3 / 4);
    let plan = WatchPlan {
        responses: vec![
            created(LAST_SEEN),
            fragment(30, &[("/p/k", part(), 11)]),
            fragment(30, &[("/p/k", part(), 12)]),
            events(30, &[("/p/k", part(), 13)]),
        ],
        ..WatchPlan::default()
    };
    let member = FakeMember::new(vec![plan], ranges(30, ("/p/k", "v30", 30)));
    let (follower, _fanout, mut subscription) =
        follower_limited(&[member.serve()], SMALL_LIMIT).await;
    let stop = CancellationToken::new();
    let task = tokio::spawn(follower.run(stop.clone()));

    // Nothing of the fragments is applied: the re-read gives the value.
    assert_eq!(values_until(&mut subscription, "v30").await, ["v30"]);
    assert_eq!(*member.ranges.lock().unwrap(), [0]);
    stop.cancel();
    task.await.expect("the watch task ends");
}

#[tokio::test]
async fn the_backoff_is_reset_by_a_response_applied_not_by_a_watch_created() {
    let created_then_ended = WatchPlan {
        responses: vec![created(LAST_SEEN)],
        ends: true,
        ..WatchPlan::default()
    };
    let delivered_then_ended = WatchPlan {
        responses: vec![created(LAST_SEEN), events(11, &[("/p/k", "v11", 11)])],
        ends: true,
        ..WatchPlan::default()
    };
    let member = FakeMember::new(
        vec![created_then_ended, delivered_then_ended],
        ranges(11, ("/p/k", "v11", 11)),
    );
    let (mut follower, _fanout, _subscription) = follower(&[member.serve()]).await;
    let first_wait = follower.backoff.next_wait();

    let interrupt = timeout(PATIENCE, follower.follow()).await.expect("follow");
    assert!(
        matches!(interrupt, super::Interrupt::Failed(_)),
        "{interrupt:?}"
    );
    assert!(
        follower.backoff.next_wait() > first_wait,
        "a watch created and ended at once keeps backing off"
    );

    let interrupt = timeout(PATIENCE, follower.follow()).await.expect("follow");
    assert!(
        matches!(interrupt, super::Interrupt::Failed(_)),
        "{interrupt:?}"
    );
    assert_eq!(
        follower.backoff.next_wait(),
        first_wait,
        "reset by the response"
    );
}

#[tokio::test]
async fn the_events_at_the_last_revision_seen_sent_again_do_not_reset_the_backoff() {
    // A watch made from `last_seen` gets that revision's events again
    // first; a stream cut after them (a proxy cutting streams) made no
    // progress and keeps backing off.
    let replayed_then_ended = WatchPlan {
        responses: vec![created(LAST_SEEN), events(LAST_SEEN, &[AT_LAST_SEEN])],
        ends: true,
        ..WatchPlan::default()
    };
    let member = FakeMember::new(vec![replayed_then_ended], ranges(LAST_SEEN, AT_LAST_SEEN));
    let (mut follower, _fanout, _subscription) = follower(&[member.serve()]).await;
    let first_wait = follower.backoff.next_wait();
    let interrupt = timeout(PATIENCE, follower.follow()).await.expect("follow");
    assert!(
        matches!(interrupt, super::Interrupt::Failed(_)),
        "{interrupt:?}"
    );
    assert!(
        follower.backoff.next_wait() > first_wait,
        "events already seen are no progress"
    );
}

#[tokio::test]
async fn an_answer_to_a_progress_request_resets_the_backoff() {
    // A quiet prefix: no event moves the watch on, but the member's
    // answer shows the stream worked; a cut after it (a proxy's stream
    // age) starts the retries from the first wait again.
    let answers_once = WatchPlan {
        responses: vec![created(LAST_SEEN)],
        answers_progress: true,
        answer_revision: LAST_SEEN,
        answers_at_most: Some(1),
        ..WatchPlan::default()
    };
    let member = FakeMember::new(vec![answers_once], ranges(LAST_SEEN, AT_LAST_SEEN));
    let (mut follower, _fanout, _subscription) = follower(&[member.serve()]).await;
    follower.watchdog = Watchdog {
        quiet: Duration::from_millis(50),
        answer_within: Duration::from_millis(100),
    };
    let first_wait = follower.backoff.next_wait();
    let interrupt = timeout(PATIENCE, follower.follow()).await.expect("follow");
    assert!(
        matches!(interrupt, super::Interrupt::Failed(_)),
        "{interrupt:?}"
    );
    assert_eq!(
        follower.backoff.next_wait(),
        first_wait,
        "reset by the answer"
    );
}
