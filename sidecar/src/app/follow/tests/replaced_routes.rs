//! A subscription replaced under the same id and pub/sub and topic (its
//! metadata changed, which needs a new broker subscription) retires by
//! the routes of the one replacing it, as one taken over by another id
//! does: the routes it had are gone with the reload.

use std::collections::BTreeMap;
use std::time::Duration;

use rewire_runtime::{ComponentKey, Runtime};

use super::{held_app_by_route, order, parse, MemoryLikeBroker, OrdersFollowed};

/// `orders-a` on the pub/sub `p` and topic `orders`, by `route`, with
/// `metadata`.
fn orders_a(route: &str, metadata: serde_json::Value) -> rewire_runtime::config::Config {
    parse(
        serde_json::json!({"appId": "app",
            "components": {"pubsub": {"p": {"type": "test.follow.memory"}}},
            "subscriptions": {"orders-a": {"pubsubname": "p", "topic": "orders",
                "route": route, "metadata": metadata}}})
        .to_string()
        .as_bytes(),
    )
    .unwrap_or_else(|p| panic!("{p}"))
}

/// Waits until `count` subscriptions to `orders` are open.
async fn subscriptions_are(runtime: &Runtime, count: usize) {
    let broker = runtime
        .component(ComponentKey::new("pubsub", "p"))
        .load_as::<MemoryLikeBroker>()
        .expect("the memory-like broker");
    let open = || {
        let topics = broker.topics.lock().unwrap_or_else(|p| p.into_inner());
        topics
            .get("orders")
            .map_or(0, |queues| queues.iter().filter(|q| !q.is_closed()).count())
    };
    let wait = async {
        while open() != count {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(60), wait)
        .await
        .unwrap_or_else(|_| panic!("{count} subscriptions not open within a minute"));
}

/// Adds what the app gets to `by_order` until it holds `count` orders.
async fn got_until(
    got: &mut tokio::sync::mpsc::UnboundedReceiver<(String, u32)>,
    by_order: &mut BTreeMap<u32, Vec<String>>,
    count: usize,
) {
    let all = async {
        while by_order.len() < count {
            let (route, n) = got.recv().await.expect("the app runs");
            by_order.entry(n).or_default().push(route);
        }
    };
    tokio::time::timeout(Duration::from_secs(60), all)
        .await
        .unwrap_or_else(|_| panic!("the app did not get {count} orders in a minute"));
}

/// Orders `0..40` are published to `orders-a` by `/a` (the held app has
/// the 32 sent); a reload changes its metadata and its route to `/b`.
/// The 8 it still holds, and what comes next, arrive by `/b` (they went
/// by the removed `/a`), each once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_replaced_under_its_id_retires_by_the_new_routes() {
    let (channel, mut got, open) = held_app_by_route().await;
    let orders = OrdersFollowed::start(channel).await;
    let runtime = orders.runtime.clone();
    let publish = |from: u32, to: u32| {
        let runtime = runtime.clone();
        async move {
            let broker = runtime.pubsub("p").load().expect("the pub/sub runs");
            for n in from..to {
                broker.publish(order(n)).await.expect("published");
            }
        }
    };
    publish(0, 40).await;
    let mut by_order: BTreeMap<u32, Vec<String>> = BTreeMap::new();
    got_until(&mut got, &mut by_order, 32).await;
    runtime
        .apply(orders_a("/b", serde_json::json!({"rev": "2"})))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    subscriptions_are(&runtime, 2).await;
    publish(40, 60).await;
    open.send_replace(true);
    got_until(&mut got, &mut by_order, 60).await;
    // Whatever came meanwhile (an order sent twice).
    tokio::time::sleep(Duration::from_millis(300)).await;
    while let Ok((route, n)) = got.try_recv() {
        by_order.entry(n).or_default().push(route);
    }
    let wrong: BTreeMap<u32, Vec<String>> = by_order
        .into_iter()
        .filter(|(n, routes)| routes.len() > 1 || (*n >= 32 && routes.iter().any(|r| r == "a")))
        .collect();
    assert_eq!(wrong, BTreeMap::new(), "by the removed route, or twice");
    orders.stop().await;
}
