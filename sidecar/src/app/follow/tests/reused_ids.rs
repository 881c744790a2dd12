//! Publishers that send their own CloudEvents may reuse an id (an order's
//! id for its created, paid and shipped events): during a hand-over, an
//! event of the retiring subscription's backlog sharing its `source` and
//! `id` with a later one the taker delivered is another event, still
//! delivered, and does not end the retiring one early.

use std::collections::BTreeSet;
use std::time::Duration;

use rewire_runtime::PublishRequest;
use tokio::sync::mpsc::UnboundedReceiver;

use super::{held_app_by_route, order, orders_config, running_are, OrdersFollowed};

/// Order `n` as a CloudEvent of id `x` (as [`order`] otherwise).
fn order_with_id_x(n: u32) -> PublishRequest {
    let event = serde_json::json!({"specversion": "1.0", "id": "x",
        "source": "test", "type": "t", "datacontenttype": "text/plain",
        "data": n.to_string()});
    PublishRequest {
        data: event.to_string().into_bytes(),
        ..order(n)
    }
}

/// Adds the orders the app gets to `arrived` until it holds `wanted`.
async fn arrived_all(
    got: &mut UnboundedReceiver<(String, u32)>,
    arrived: &mut BTreeSet<u32>,
    wanted: BTreeSet<u32>,
) {
    let all = async {
        while !wanted.is_subset(arrived) {
            let (_route, n) = got.recv().await.expect("the app runs");
            arrived.insert(n);
        }
    };
    if tokio::time::timeout(Duration::from_secs(60), all)
        .await
        .is_err()
    {
        let missing: BTreeSet<&u32> = wanted.difference(arrived).collect();
        panic!("the app did not get {missing:?} within a minute");
    }
}

/// Orders `0..32` fill the slow app (every slot of `orders-a` in flight);
/// then order 32 (id `x`) and the 10 orders `33..43` wait in `orders-a`'s
/// queue; `a-orders` takes the topic over and delivers order 43, also of
/// id `x`. Once the app answers, every order arrives. Before (keyed by
/// `source` and `id`), 32 was acknowledged unsent as "delivered" by 43,
/// and `orders-a`, taken for caught up, could end over its queue and drop
/// what it had not read of `33..43` (which `a-orders`, subscribed after
/// they were published, never got).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_reusing_an_id_during_a_takeover_is_still_delivered() {
    let (channel, mut got, open) = held_app_by_route().await;
    let mut orders = OrdersFollowed::start(channel).await;
    let runtime = orders.runtime.clone();
    let publish = |request: PublishRequest| {
        let runtime = runtime.clone();
        async move {
            let broker = runtime.pubsub("p").load().expect("the pub/sub runs");
            broker.publish(request).await.expect("published");
        }
    };
    let mut arrived = BTreeSet::new();
    for n in 0..32 {
        publish(order(n)).await;
    }
    arrived_all(&mut got, &mut arrived, (0..32).collect()).await;
    publish(order_with_id_x(32)).await;
    for n in 33..43 {
        publish(order(n)).await;
    }
    runtime
        .apply(orders_config(&[("orders-a", "/a"), ("a-orders", "/b")]))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    running_are(&mut orders.running, &["a-orders"]).await;
    publish(order_with_id_x(43)).await;
    // The taker has 43 at the app before the retiring one reads 32.
    arrived_all(&mut got, &mut arrived, BTreeSet::from([43])).await;

    open.send_replace(true);
    arrived_all(&mut got, &mut arrived, (0..44).collect()).await;
    orders.stop().await;
}
