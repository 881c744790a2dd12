//! The etcd launcher of `testkit`, and bounded helpers for reading config
//! subscriptions.

use std::time::Duration;

use rewire_runtime::{ConfigItem, ConfigSubscription};
use tokio::time::{timeout, Instant};

pub use testkit::etcd::{free_port, EtcdServer, EtcdTls};

/// Reads the items of `sub` until `done` holds for all items read so far;
/// panics after `limit`, naming `what` and the items read.
pub async fn items_until(
    sub: &mut ConfigSubscription,
    what: &str,
    limit: Duration,
    done: impl Fn(&[ConfigItem]) -> bool,
) -> Vec<ConfigItem> {
    let mut items = Vec::new();
    let deadline = Instant::now() + limit;
    while !done(&items) {
        let left = deadline.saturating_duration_since(Instant::now());
        match timeout(left, sub.changes.recv()).await {
            Ok(Some(change)) => items.extend(change.items),
            Ok(None) => panic!(
                "subscription closed waiting for {what}; got {}",
                show(&items)
            ),
            Err(_) => panic!("no {what} within {limit:?}; got {}", show(&items)),
        }
    }
    items
}

/// The items `sub` receives within `quiet` (to show nothing more comes).
pub async fn items_within(sub: &mut ConfigSubscription, quiet: Duration) -> Vec<ConfigItem> {
    let mut items = Vec::new();
    let deadline = Instant::now() + quiet;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match timeout(left, sub.changes.recv()).await {
            Ok(Some(change)) => items.extend(change.items),
            Ok(None) | Err(_) => return items,
        }
    }
}

/// `[key=value@version, ...]`, with group and label, for messages.
pub fn show(items: &[ConfigItem]) -> String {
    let shown: Vec<String> = items
        .iter()
        .map(|i| {
            let group = i
                .group
                .as_deref()
                .map(|g| format!("{g}/"))
                .unwrap_or_default();
            let label = i
                .label
                .as_deref()
                .map(|l| format!("@{l}"))
                .unwrap_or_default();
            format!("{group}{}{label}={:?}#{}", i.key, i.value, i.version)
        })
        .collect();
    format!("[{}]", shown.join(", "))
}

/// The values `key` took in `items`, in order.
pub fn values_of(items: &[ConfigItem], key: &str) -> Vec<String> {
    items
        .iter()
        .filter(|i| i.key == key)
        .map(|i| i.value.clone())
        .collect()
}

/// etcd's `/metrics` page (with the HTTP head), over plain HTTP/1.0.
pub async fn metrics(server: &EtcdServer) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let endpoint = server.endpoint();
    let mut stream = tokio::net::TcpStream::connect(&endpoint)
        .await
        .unwrap_or_else(|e| panic!("connect {endpoint}: {e}"));
    let request = format!("GET /metrics HTTP/1.0\r\nHost: {endpoint}\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut text = String::new();
    stream.read_to_string(&mut text).await.expect("read");
    text
}
