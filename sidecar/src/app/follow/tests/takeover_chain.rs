//! A topic taken over again before the subscription that took it over
//! delivered anything (A → B → C, and A → B → A): with the memory
//! broker's semantics, every event reaches the app once, and what the
//! retiring ones hold goes by the routes of the one that runs.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use rewire_runtime::{ComponentKey, PublishRequest, Runtime};
use tokio::sync::mpsc::UnboundedReceiver;

use super::OrdersFollowed;
use super::{held_app_by_route, order, orders_config, running_are, MemoryLikeBroker};

impl MemoryLikeBroker {
    /// Subscriptions to `topic` whose delivery has not ended.
    fn open_subscriptions(&self, topic: &str) -> usize {
        let topics = self.topics.lock().unwrap_or_else(|p| p.into_inner());
        topics
            .get(topic)
            .map_or(0, |queues| queues.iter().filter(|q| !q.is_closed()).count())
    }
}

/// Waits until one subscription to `orders` is left: the retiring ones
/// ended (they end once caught up, or within the drain bounds).
async fn retirements_ended(runtime: &Runtime) {
    let broker = runtime
        .component(ComponentKey::new("pubsub", "p"))
        .load_as::<MemoryLikeBroker>()
        .expect("the memory-like broker");
    let wait = async {
        while broker.open_subscriptions("orders") > 1 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(300), wait)
        .await
        .expect("the retiring subscriptions ended within their limit");
}

async fn publish(runtime: &Runtime, orders: std::ops::Range<u32>) {
    let broker = runtime.pubsub("p").load().expect("the pub/sub runs");
    for n in orders {
        let request: PublishRequest = order(n);
        broker.publish(request).await.expect("published");
    }
}

/// Adds what the app gets to `by_order` until it holds every order of
/// `0..count`.
async fn got_all(
    got: &mut UnboundedReceiver<(String, u32)>,
    by_order: &mut BTreeMap<u32, Vec<String>>,
    count: usize,
) {
    let all = async {
        while by_order.len() < count {
            let (route, n) = got.recv().await.expect("the app runs");
            by_order.entry(n).or_default().push(route);
        }
    };
    if tokio::time::timeout(Duration::from_secs(60), all)
        .await
        .is_err()
    {
        let missing: BTreeSet<usize> = (0..count)
            .filter(|n| !by_order.contains_key(&(*n as u32)))
            .collect();
        panic!("the app did not get {missing:?} within a minute");
    }
}

/// The orders that came more than once, with their routes.
fn repeated(by_order: &BTreeMap<u32, Vec<String>>) -> BTreeMap<u32, Vec<String>> {
    by_order
        .iter()
        .filter(|(_, routes)| routes.len() > 1)
        .map(|(n, routes)| (*n, routes.clone()))
        .collect()
}

/// Publishes orders `0..40` to `orders-a` (the slow app holds the 32 it
/// sent), has the reloads `then` take the topic over twice without a
/// publish between them, publishes `40..80` and lets the app answer: the
/// orders, by the routes they came, once the retiring subscriptions ended.
async fn taken_over_twice(
    then: [&[(&str, &str)]; 2],
    runs: [&str; 2],
) -> BTreeMap<u32, Vec<String>> {
    let (channel, mut got, open) = held_app_by_route().await;
    let mut orders = OrdersFollowed::start(channel).await;
    let runtime = orders.runtime.clone();
    publish(&runtime, 0..40).await;
    let mut by_order = BTreeMap::new();
    got_all(&mut got, &mut by_order, 32).await;
    for (config, running) in then.into_iter().zip(runs) {
        runtime
            .apply(orders_config(config))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        running_are(&mut orders.running, &[running]).await;
    }
    publish(&runtime, 40..80).await;
    open.send_replace(true);
    got_all(&mut got, &mut by_order, 80).await;
    retirements_ended(&runtime).await;
    while let Ok((route, n)) = got.try_recv() {
        by_order.entry(n).or_default().push(route);
    }
    orders.stop().await;
    by_order
}

/// Asserts each order of `by_order` came once. Which route an order came
/// by is not asserted: `/b`'s subscription may deliver a few orders before
/// the second reload replaces it, on a loaded machine (before the reload
/// that removes it, those are its to deliver).
fn each_once(by_order: &BTreeMap<u32, Vec<String>>) {
    assert_eq!(repeated(by_order), BTreeMap::new(), "delivered again");
}

/// A → B → C: `orders-a` is taken over by `a-orders` (first by name),
/// which a reload removes for `orders-c` before it delivered anything.
/// Each order comes once (it came three times: A, retiring for B, which
/// delivered nothing, never caught up, and B sent what C sent).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_taken_over_twice_in_quick_succession_delivers_each_event_once() {
    let by_order = taken_over_twice(
        [
            &[("orders-a", "/a"), ("a-orders", "/b")],
            &[("orders-c", "/c")],
        ],
        ["a-orders", "orders-c"],
    )
    .await;
    each_once(&by_order);
}

/// A → B → A: the reload that had `a-orders` take over is undone before
/// it delivered anything; `orders-a` runs again (a new subscription).
/// Each order comes once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_undone_at_once_delivers_each_event_once() {
    let by_order = taken_over_twice(
        [
            &[("orders-a", "/a"), ("a-orders", "/b")],
            &[("orders-a", "/a")],
        ],
        ["a-orders", "orders-a"],
    )
    .await;
    each_once(&by_order);
}
