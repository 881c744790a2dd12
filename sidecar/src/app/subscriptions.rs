//! The app's subscriptions: programmatic ones, from the app's
//! `GET /dapr/subscribe` (Dapr's JSON: `pubsubname`, `topic`, `route` or
//! `routes` with `rules` and `default`, `deadLetterTopic`, `metadata`),
//! and declared ones (the configuration's `subscriptions` section).

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::time::Duration;

use rewire_runtime::config::{RawRoutes, Subscription, SubscriptionRoutes};
use rewire_runtime::Generation;
use serde::Deserialize;
use serde_json::Value;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::http_route::BodyNotRead;
use super::AppChannel;
use crate::dapr::logged;

/// Subscriptions taken from one app, at most.
pub const MAX_SUBSCRIPTIONS: usize = 1024;

/// The first [`MAX_SUBSCRIPTIONS`] of the subscriptions an app listed
/// with `call` (gRPC's `ListTopicSubscriptions`, Dapr's or Layotto's),
/// and how many past them are left out: said in a warning, never
/// silently.
pub(super) fn at_most_taken<T>(call: &str, mut listed: Vec<T>) -> (Vec<T>, usize) {
    let left_out = listed.len().saturating_sub(MAX_SUBSCRIPTIONS);
    if left_out > 0 {
        tracing::warn!(call, listed = listed.len(), taken = MAX_SUBSCRIPTIONS, left_out, "The app listed more subscriptions than are taken; the first {MAX_SUBSCRIPTIONS} are, the {left_out} after them are left out and none of their events delivered.");
        listed.truncate(MAX_SUBSCRIPTIONS);
    }
    (listed, left_out)
}

/// One subscription of the app.
#[derive(Debug, Clone, PartialEq)]
pub struct AppSubscription {
    /// The pub/sub component.
    pub pubsub_name: String,
    /// The topic.
    pub topic: String,
    /// The app's paths events are posted to: the first rule that matches
    /// the event, else the default.
    pub routes: SubscriptionRoutes,
    /// Where events that fail for good go.
    pub dead_letter_topic: Option<String>,
    /// Subscription metadata, passed to the broker.
    pub metadata: BTreeMap<String, String>,
}

impl AppSubscription {
    /// The subscription a declared one (`subscriptions` section) means.
    pub fn declared(subscription: &Subscription) -> Self {
        Self {
            pubsub_name: subscription.pubsub_name.clone(),
            topic: subscription.topic.clone(),
            routes: subscription.routes.clone(),
            dead_letter_topic: subscription.dead_letter_topic.clone(),
            metadata: subscription.metadata.clone(),
        }
    }

    /// The declared subscriptions of `generation` (its `subscriptions`
    /// section) whose `scopes` take its app, by name.
    pub fn declared_for(
        generation: &Generation,
    ) -> impl Iterator<Item = (&str, AppSubscription)> + '_ {
        let app_id = generation.app_id();
        generation
            .sections()
            .subscriptions
            .0
            .iter()
            .filter(move |(_, declared)| declared.applies_to(app_id))
            .map(|(name, declared)| (name.as_str(), Self::declared(declared)))
    }

    /// Routes of an app's listed entry from Dapr's `route` / `routes`,
    /// as Dapr's `getSubscriptionsHTTP` takes them: `routes.default`
    /// wins over `route` when both are set (a declared subscription in
    /// the configuration file refuses the two disagreeing instead). With
    /// neither nor any rule, the routes are empty: such an entry is left
    /// out, as Dapr's `filterSubscriptions` does.
    pub(super) fn routes_of(
        route: Option<String>,
        routes: Option<RawRoutes>,
    ) -> Result<SubscriptionRoutes, String> {
        let has_default = routes
            .as_ref()
            .and_then(|routes| routes.default.as_deref())
            .is_some_and(|default| !default.trim().is_empty());
        let route = if has_default { None } else { route };
        SubscriptionRoutes::from_dapr(route, routes)
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Declared {
    #[serde(alias = "pubsubName")]
    pubsubname: String,
    topic: String,
    #[serde(default)]
    route: Option<String>,
    #[serde(default)]
    routes: Option<RawRoutes>,
    #[serde(default)]
    dead_letter_topic: Option<String>,
    #[serde(default)]
    metadata: HashMap<String, String>,
    /// Dapr's `bulkSubscribe` (`enabled`, `maxMessagesCount`,
    /// `maxAwaitDurationMs`): only `enabled` is read.
    #[serde(default)]
    bulk_subscribe: Option<Value>,
}

/// Whether a `bulkSubscribe` value turns bulk delivery on (`enabled` true;
/// a string `"true"` too, as the sidecar reads metadata leniently).
fn bulk_enabled(bulk_subscribe: Option<&Value>) -> bool {
    match bulk_subscribe.and_then(|bulk| bulk.get("enabled")) {
        Some(Value::Bool(enabled)) => *enabled,
        Some(Value::String(enabled)) => enabled.eq_ignore_ascii_case("true"),
        _ => false,
    }
}

/// Whether the app's subscription to `topic` of `pubsub` can be taken:
/// one that asks for bulk delivery cannot until bulk delivery exists (its
/// handler takes a batch, so each event posted alone would be answered
/// as if handled, and lost); it is refused with a warning naming it.
pub(super) fn refuses_bulk(pubsub: &str, topic: &str, bulk: bool) -> bool {
    if bulk {
        tracing::warn!(pubsub = %logged(pubsub), topic = %logged(topic), "The app's subscription asks for bulk delivery (bulkSubscribe), which rewire does not support; it is refused and none of its events are delivered.");
    }
    bulk
}

/// The subscriptions of a Dapr `/dapr/subscribe` answer. An entry that
/// cannot be taken is left out with a warning naming it (its index,
/// pub/sub and topic, control characters escaped: the app's text cannot
/// split the log line), and the others taken, as the gRPC listing does:
/// one that is malformed or has a rule rewire cannot read, one with no
/// route at all (as Dapr's `filterSubscriptions`: "has an empty routes"),
/// and one with `bulkSubscribe` enabled (events are delivered one at a
/// time, which a bulk handler would acknowledge unread). An answer that is
/// no array, or lists more than [`MAX_SUBSCRIPTIONS`], is an error.
pub fn parse_subscriptions(value: &Value) -> Result<Vec<AppSubscription>, String> {
    let (taken, left_out) = parse_listing(value)?;
    for entry in left_out {
        tracing::warn!(index = entry.index, pubsub = %logged(&entry.pubsub), topic = %logged(&entry.topic), reason = %logged(&entry.reason), "An entry of the app's subscriptions cannot be taken; it is left out, the others are taken.");
    }
    Ok(taken)
}

/// An entry of the app's listing left out ([`parse_listing`]).
#[derive(Debug, PartialEq)]
struct LeftOut {
    /// Its place in the listing.
    index: usize,
    /// Its `pubsubname`, as far as it can be read (else empty).
    pubsub: String,
    /// Its `topic`, as far as it can be read (else empty).
    topic: String,
    /// Why.
    reason: String,
}

impl LeftOut {
    fn new(index: usize, entry: &Value, reason: String) -> Self {
        let text = |names: &[&str]| {
            names
                .iter()
                .find_map(|name| entry.get(*name).and_then(Value::as_str))
                .unwrap_or_default()
                .to_string()
        };
        Self {
            index,
            pubsub: text(&["pubsubname", "pubsubName"]),
            topic: text(&["topic"]),
            reason,
        }
    }
}

/// [`parse_subscriptions`]: the entries taken, and those left out.
fn parse_listing(value: &Value) -> Result<(Vec<AppSubscription>, Vec<LeftOut>), String> {
    let entries = value
        .as_array()
        .ok_or_else(|| "subscriptions must be a JSON array".to_string())?;
    if entries.len() > MAX_SUBSCRIPTIONS {
        return Err(format!(
            "{} subscriptions, more than the {MAX_SUBSCRIPTIONS} allowed",
            entries.len()
        ));
    }
    let mut taken = Vec::with_capacity(entries.len());
    let mut left_out = Vec::new();
    for (i, entry) in entries.iter().enumerate() {
        let declared: Declared = match serde_json::from_value(entry.clone()) {
            Ok(declared) => declared,
            Err(err) => {
                left_out.push(LeftOut::new(i, entry, err.to_string()));
                continue;
            }
        };
        let routes = match AppSubscription::routes_of(declared.route, declared.routes) {
            Ok(routes) if routes.rules.is_empty() && routes.default.is_none() => {
                let reason = "no `route` nor `routes` (empty routes, as Dapr removes it)";
                left_out.push(LeftOut::new(i, entry, reason.to_string()));
                continue;
            }
            Ok(routes) => routes,
            Err(err) => {
                left_out.push(LeftOut::new(i, entry, err));
                continue;
            }
        };
        let bulk = bulk_enabled(declared.bulk_subscribe.as_ref());
        if refuses_bulk(&declared.pubsubname, &declared.topic, bulk) {
            continue;
        }
        taken.push(AppSubscription {
            pubsub_name: declared.pubsubname,
            topic: declared.topic,
            routes,
            dead_letter_topic: declared.dead_letter_topic.filter(|t| !t.is_empty()),
            metadata: declared.metadata.into_iter().collect(),
        });
    }
    Ok((taken, left_out))
}

/// The most of the app's list of subscriptions read (Dapr's default body
/// limit): hundreds of topics with routing rules fit; an answer of
/// gigabytes is never held.
const MAX_LIST_BYTES: usize = 4 * 1024 * 1024;

/// The app's own subscriptions, asked with [`ask_until_answered`]: none
/// when it answers 404 or something malformed (said in the log), or gives
/// no usable answer for [`ASK_FOR`]; `None` once `shutdown` is cancelled.
pub(super) async fn ask_app(
    client: &reqwest::Client,
    channel: &AppChannel,
    shutdown: &CancellationToken,
) -> Option<Vec<AppSubscription>> {
    let url = channel.url("dapr/subscribe");
    ask_until_answered("GET /dapr/subscribe", ASK_FOR, shutdown, || {
        ask_once(client, &url)
    })
    .await
}

/// One `GET /dapr/subscribe`, bounded by the client's own timeout.
pub(super) async fn ask_once(client: &reqwest::Client, url: &str) -> Listing {
    let answer = match client.get(url).send().await {
        Ok(answer) => answer,
        Err(err) => return Listing::Unanswered(err.without_url().to_string()),
    };
    if answer.status() == reqwest::StatusCode::NOT_FOUND {
        return Listing::Answered(Vec::new());
    }
    if !answer.status().is_success() {
        return Listing::Unanswered(format!("status {}", answer.status()));
    }
    let close_delimited = !has_framing(answer.headers());
    let parsed = match super::http_route::answer_body(answer, MAX_LIST_BYTES).await {
        Ok(body) => match serde_json::from_slice::<Value>(&body) {
            // A body delimited by the connection's close that ends midway
            // through its JSON (the app closed early): no answer to go by,
            // asked again. An empty one is malformed, and so is one that
            // came whole by its `content-length` or chunks (a cut one
            // fails as it is read).
            Err(err) if err.is_eof() && close_delimited && !body.trim_ascii().is_empty() => {
                return Listing::Unanswered("the answer's body ended early".to_string())
            }
            parsed => parsed
                .map_err(|e| e.to_string())
                .and_then(|v| parse_subscriptions(&v)),
        },
        Err(BodyNotRead::TooLarge) => Err(format!(
            "answer larger than {} MiB",
            MAX_LIST_BYTES / (1024 * 1024)
        )),
        // Cut short (reset, timed out): no answer to go by, asked again.
        Err(BodyNotRead::Failed(why)) => {
            return Listing::Unanswered(format!("the answer's body failed: {why}"))
        }
    };
    match parsed {
        Ok(subscriptions) => Listing::Answered(subscriptions),
        Err(err) => {
            tracing::warn!(url = %url, error = %err, "The app's subscriptions are malformed; none taken.");
            Listing::Answered(Vec::new())
        }
    }
}

/// Whether an answer with `headers` says where its body ends: a
/// `content-length`, or `chunked` last in its `transfer-encoding`. One
/// with neither ends where the connection does, so a close cuts it short
/// unseen.
fn has_framing(headers: &reqwest::header::HeaderMap) -> bool {
    let chunked = headers
        .get_all(reqwest::header::TRANSFER_ENCODING)
        .iter()
        .next_back()
        .and_then(|value| value.to_str().ok())
        .and_then(|codings| codings.rsplit(',').next())
        .is_some_and(|last| last.trim().eq_ignore_ascii_case("chunked"));
    chunked || headers.contains_key(reqwest::header::CONTENT_LENGTH)
}

/// How long the app is asked for its subscriptions before the sidecar
/// gives up on them: its port may be open (a mesh proxy, a framework still
/// starting) while its first answers fail (503, `UNAVAILABLE`), and the
/// list is taken once for the process's life, so, as Dapr, it is asked
/// again with backoff.
pub(super) const ASK_FOR: Duration = Duration::from_secs(15);
/// The pause after the first failed ask, doubled after each up to
/// [`LONGEST_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(200);
const LONGEST_PAUSE: Duration = Duration::from_secs(2);

/// One ask of the app for its subscriptions.
pub(super) enum Listing {
    /// An answer to go by: its subscriptions, or none for good (HTTP 404,
    /// gRPC `UNIMPLEMENTED`, a malformed list).
    Answered(Vec<AppSubscription>),
    /// No usable answer (unreachable, reset, 5xx, `UNAVAILABLE`, timed
    /// out, a body cut short midway or ending midway through its JSON):
    /// asked again. Why, for the log.
    Unanswered(String),
}

/// Asks with `ask` until it is answered, pausing with exponential backoff
/// between failures for `patience` in all, then gives up with an error
/// (none taken). `None` as soon as `shutdown` is cancelled, mid-ask or
/// mid-pause, so that stopping is never held by an app that never answers.
pub(super) async fn ask_until_answered<A, F>(
    call: &str,
    patience: Duration,
    shutdown: &CancellationToken,
    mut ask: A,
) -> Option<Vec<AppSubscription>>
where
    A: FnMut() -> F,
    F: Future<Output = Listing>,
{
    let deadline = Instant::now() + patience;
    let mut pause = FIRST_PAUSE;
    let mut attempt = 0u32;
    loop {
        attempt += 1;
        let listing = tokio::select! {
            () = shutdown.cancelled() => return None,
            listing = ask() => listing,
        };
        let reason = match listing {
            Listing::Answered(subscriptions) => return Some(subscriptions),
            Listing::Unanswered(reason) => reason,
        };
        if Instant::now() >= deadline {
            tracing::error!(call, attempts = attempt, error = %reason, "The app never listed its subscriptions within {patience:?}; none of its programmatic subscriptions are taken until the sidecar restarts.");
            return Some(Vec::new());
        }
        if attempt == 1 {
            tracing::warn!(call, error = %reason, "The app did not list its subscriptions; asked again for up to {patience:?}.");
        } else {
            tracing::debug!(call, attempt, error = %reason, "The app did not list its subscriptions; asked again.");
        }
        tokio::select! {
            () = shutdown.cancelled() => return None,
            () = tokio::time::sleep(pause) => {}
        }
        pause = (pause * 2).min(LONGEST_PAUSE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_list_larger_than_read_is_refused_and_not_read_through() {
        let total = 32 * 1024 * 1024;
        let (port, served) =
            super::super::http_route::tests::app_answering_a_huge_document(total).await;
        crate::tls::install_ring_provider();
        let client = reqwest::Client::new();
        let listed = tokio::time::timeout(
            std::time::Duration::from_secs(10),
            ask_app(&client, &AppChannel::local(port), &CancellationToken::new()),
        )
        .await
        .expect("answered in time")
        .expect("not stopped");
        assert!(listed.is_empty());
        let (sent, whole) = tokio::time::timeout(std::time::Duration::from_secs(10), served)
            .await
            .expect("the app saw the client let go")
            .expect("no panic");
        assert!(!whole, "the whole answer was read ({sent} bytes)");
        assert!(sent < total / 2, "{sent} bytes were taken");
    }

    /// Hundreds of topics with routing rules come to more than a
    /// delivery's 64 KiB: the list is read whole.
    #[tokio::test]
    async fn a_list_of_a_thousand_subscriptions_is_taken() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let list: Vec<_> = (0..1000)
            .map(|i| {
                serde_json::json!({"pubsubname": "pubsub", "topic": format!("topic-{i}"),
                    "routes": {"rules": [{"match": "event.type == \"widget\"", "path": "/widgets"}],
                               "default": format!("/orders/{i}")}})
            })
            .collect();
        let body = serde_json::to_vec(&list).expect("json");
        assert!(body.len() > super::super::http_route::MAX_ANSWER_BYTES);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.expect("accept");
            let mut head = Vec::new();
            let mut buf = [0u8; 4096];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = socket.read(&mut buf).await.expect("request");
                assert!(n > 0, "the request ended early");
                head.extend_from_slice(&buf[..n]);
            }
            let mut answer = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                body.len()
            )
            .into_bytes();
            answer.extend_from_slice(&body);
            let _ = socket.write_all(&answer).await;
        });
        crate::tls::install_ring_provider();
        let listed = tokio::time::timeout(
            std::time::Duration::from_secs(10),
            ask_app(
                &reqwest::Client::new(),
                &AppChannel::local(port),
                &CancellationToken::new(),
            ),
        )
        .await
        .expect("answered in time")
        .expect("not stopped");
        assert_eq!(listed.len(), 1000);
    }

    /// An app whose `GET /dapr/subscribe` answers `503` `failures` times
    /// (a framework still starting, or a mesh proxy before it), then lists
    /// one subscription; its port and count of asks.
    async fn app_unavailable_first(
        failures: usize,
    ) -> (u16, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let asked = std::sync::Arc::new(AtomicUsize::new(0));
        let counted = std::sync::Arc::clone(&asked);
        let app = axum::Router::new().route(
            "/dapr/subscribe",
            axum::routing::get(move || {
                let asked = counted.fetch_add(1, Ordering::SeqCst) + 1;
                async move {
                    if asked <= failures {
                        return (axum::http::StatusCode::SERVICE_UNAVAILABLE, "starting")
                            .into_response();
                    }
                    axum::Json(serde_json::json!([
                        {"pubsubname": "bus", "topic": "orders", "route": "/orders"}
                    ]))
                    .into_response()
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        tokio::spawn(async move { axum::serve(listener, app).await });
        (port, asked)
    }

    /// The first answer of [`app_cutting_its_first_listing_short`]: a
    /// `200 OK` whose body (`content-length` 200) is cut short.
    const CUT_SHORT_BY_LENGTH: &str =
        "HTTP/1.1 200 OK\r\ncontent-length: 200\r\n\r\n[{\"pubsubname\":\"p\"";

    /// An app on a raw socket whose first connection answers `first`, then
    /// closes, and whose later ones answer a one-entry list; its port and
    /// count of connections.
    async fn app_cutting_its_first_listing_short(
        first: &'static str,
    ) -> (u16, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let connections = std::sync::Arc::new(AtomicUsize::new(0));
        let counted = std::sync::Arc::clone(&connections);
        tokio::spawn(async move {
            loop {
                let Ok((mut socket, _)) = listener.accept().await else {
                    return;
                };
                let nth = counted.fetch_add(1, Ordering::SeqCst) + 1;
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match socket.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let answer = if nth == 1 {
                    first.to_string()
                } else {
                    let body = r#"[{"pubsubname":"p","topic":"orders","route":"/orders"}]"#;
                    format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    )
                };
                let _ = socket.write_all(answer.as_bytes()).await;
                let _ = socket.shutdown().await;
            }
        });
        (port, connections)
    }

    /// A listing whose body breaks midway (a reset after a `200` head) is
    /// no answer: asked again, and the next full answer taken. Before, it
    /// read as an empty, malformed list: no subscriptions until restart.
    #[tokio::test]
    async fn a_listing_cut_short_midway_is_asked_again_and_taken() {
        let (port, connections) = app_cutting_its_first_listing_short(CUT_SHORT_BY_LENGTH).await;
        assert_asked_again_and_taken(port, &connections).await;
    }

    /// A listing whose body has no length nor chunks (it ends where the
    /// connection does) and ends midway through its JSON is no answer:
    /// asked again, and the next full answer taken. Before, the body read
    /// whole, and its JSON, cut short, as malformed: none taken for good.
    #[tokio::test]
    async fn a_close_delimited_listing_ending_midway_is_asked_again_and_taken() {
        let first = "HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n[{\"pubsubname\":\"p\"";
        let (port, connections) = app_cutting_its_first_listing_short(first).await;
        assert_asked_again_and_taken(port, &connections).await;
    }

    /// A listing that came whole by its `content-length` (or chunks) but
    /// ends midway through its JSON (`[`) is malformed at once: none
    /// taken, asked once. Before, it was asked again for 15 s, then logged
    /// as never listed instead of malformed.
    #[tokio::test]
    async fn a_whole_framed_listing_ending_midway_is_malformed_at_once() {
        let by_length = "HTTP/1.1 200 OK\r\ncontent-length: 1\r\n\r\n[";
        let by_chunks = "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n1\r\n[\r\n0\r\n\r\n";
        for first in [by_length, by_chunks] {
            let (port, connections) = app_cutting_its_first_listing_short(first).await;
            crate::tls::install_ring_provider();
            let listed = tokio::time::timeout(
                Duration::from_secs(10),
                ask_app(
                    &reqwest::Client::new(),
                    &AppChannel::local(port),
                    &CancellationToken::new(),
                ),
            )
            .await
            .expect("answered in time")
            .expect("not stopped");
            assert!(listed.is_empty(), "{first:?}: {listed:?}");
            let asked = connections.load(std::sync::atomic::Ordering::SeqCst);
            assert_eq!(asked, 1, "{first:?}: asked once");
        }
    }

    /// Asks the app on `port` (of [`app_cutting_its_first_listing_short`])
    /// for its listing: its second answer is taken, on a second connection.
    async fn assert_asked_again_and_taken(port: u16, connections: &std::sync::atomic::AtomicUsize) {
        crate::tls::install_ring_provider();
        let listed = tokio::time::timeout(
            Duration::from_secs(10),
            ask_app(
                &reqwest::Client::new(),
                &AppChannel::local(port),
                &CancellationToken::new(),
            ),
        )
        .await
        .expect("answered in time")
        .expect("not stopped");
        let topics: Vec<&str> = listed.iter().map(|s| s.topic.as_str()).collect();
        assert_eq!(topics, ["orders"]);
        assert_eq!(connections.load(std::sync::atomic::Ordering::SeqCst), 2);
    }

    use axum::response::IntoResponse;

    /// The first answers of an app still starting (503 for ~5 s: more
    /// than the 5 asks over ~2 s once made) are asked again: its
    /// subscription is taken, not lost until a restart.
    #[tokio::test]
    async fn a_list_answered_503_five_times_first_is_asked_again_and_taken() {
        let (port, asked) = app_unavailable_first(5).await;
        crate::tls::install_ring_provider();
        let listed = tokio::time::timeout(
            Duration::from_secs(20),
            ask_app(
                &reqwest::Client::new(),
                &AppChannel::local(port),
                &CancellationToken::new(),
            ),
        )
        .await
        .expect("answered in time")
        .expect("not stopped");
        let topics: Vec<&str> = listed.iter().map(|s| s.topic.as_str()).collect();
        assert_eq!(topics, ["orders"]);
        assert_eq!(asked.load(std::sync::atomic::Ordering::SeqCst), 6);
    }

    /// Stopping is not held by an app that never lists its subscriptions.
    #[tokio::test]
    async fn asking_stops_at_shutdown() {
        let (port, asked) = app_unavailable_first(usize::MAX).await;
        crate::tls::install_ring_provider();
        let shutdown = CancellationToken::new();
        let stop = shutdown.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            stop.cancel();
        });
        let listed = tokio::time::timeout(
            Duration::from_secs(3),
            ask_app(&reqwest::Client::new(), &AppChannel::local(port), &shutdown),
        )
        .await
        .expect("stopped in time");
        assert!(listed.is_none());
        assert!(asked.load(std::sync::atomic::Ordering::SeqCst) >= 2);
    }

    /// Asking gives up, with none taken, once its patience is spent.
    #[tokio::test]
    async fn asking_gives_up_with_none_after_its_patience() {
        let asked = std::sync::atomic::AtomicUsize::new(0);
        let listed = tokio::time::timeout(
            Duration::from_secs(5),
            ask_until_answered(
                "test",
                Duration::from_millis(500),
                &CancellationToken::new(),
                || {
                    asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    std::future::ready(Listing::Unanswered("refused".into()))
                },
            ),
        )
        .await
        .expect("gave up in time")
        .expect("not stopped");
        assert!(listed.is_empty());
        // Pauses of 200 ms then 400 ms: a third ask, past the patience.
        assert_eq!(asked.load(std::sync::atomic::Ordering::SeqCst), 3);
    }

    /// A gRPC listing past [`MAX_SUBSCRIPTIONS`] keeps the first ones and
    /// says how many are left out (before: cut silently).
    #[test]
    fn a_grpc_listing_past_the_most_taken_says_how_many_are_left_out() {
        let (taken, left_out) = at_most_taken("test", (0..MAX_SUBSCRIPTIONS + 7).collect());
        assert_eq!((taken.len(), left_out), (MAX_SUBSCRIPTIONS, 7));
        assert_eq!(taken.last(), Some(&(MAX_SUBSCRIPTIONS - 1)));
        let (taken, left_out) = at_most_taken("test", vec![1, 2]);
        assert_eq!((taken, left_out), (vec![1, 2], 0));
    }

    /// A subscription asking for bulk delivery is refused (until bulk
    /// delivery exists): each event posted alone to its batch handler
    /// would be answered `200 {"statuses": []}` and acknowledged unread.
    #[test]
    fn a_bulk_subscription_is_refused_and_the_others_taken() {
        let value = serde_json::json!([
            {"pubsubname": "p", "topic": "batched", "route": "/batch",
             "bulkSubscribe": {"enabled": true, "maxMessagesCount": 100, "maxAwaitDurationMs": 40}},
            {"pubsubname": "p", "topic": "single", "route": "/single"},
            {"pubsubname": "p", "topic": "off", "route": "/off", "bulkSubscribe": {"enabled": false}}
        ]);
        let parsed = parse_subscriptions(&value).expect("valid");
        let topics: Vec<&str> = parsed.iter().map(|s| s.topic.as_str()).collect();
        assert_eq!(topics, ["single", "off"]);
    }

    #[test]
    fn daprs_shapes_parse_and_bad_entries_are_named() {
        let value = serde_json::json!([
            {"pubsubname": "p", "topic": "a", "route": "/orders"},
            {"pubsubname": "p", "topic": "b", "routes": {"default": "/b", "rules": []}, "deadLetterTopic": "dlq"},
            {"pubsubname": "p", "topic": "c"}
        ]);
        let (parsed, left_out) = parse_listing(&value).expect("valid");
        let routes: Vec<Option<&str>> =
            parsed.iter().map(|s| s.routes.default.as_deref()).collect();
        assert_eq!(routes, [Some("/orders"), Some("/b")]);
        assert_eq!(parsed[1].dead_letter_topic.as_deref(), Some("dlq"));
        assert_eq!(
            (left_out[0].index, left_out[0].topic.as_str()),
            (2, "c"),
            "no route: left out"
        );
        let v2 = serde_json::json!([{"pubsubname": "p", "topic": "t", "routes": {
            "rules": [{"match": "event.type == \"widget\"", "path": "/widgets"}], "default": "/products"}}]);
        let parsed = parse_subscriptions(&v2).expect("valid");
        let event = |t: &str| {
            serde_json::json!({"type": t})
                .as_object()
                .cloned()
                .unwrap_or_default()
        };
        assert_eq!(
            parsed[0].routes.path_for(&event("widget")),
            Some("/widgets")
        );
        assert_eq!(
            parsed[0].routes.path_for(&event("gadget")),
            Some("/products")
        );
        let bad = serde_json::json!([
            {"pubsubname": "p", "topic": "t", "routes": {
                "rules": [{"match": "event.type ~ 1", "path": "/x"}]}},
            {"pubsubname": "q"}
        ]);
        let (parsed, left_out) = parse_listing(&bad).expect("a listing");
        assert!(parsed.is_empty());
        let named: Vec<(usize, &str, &str)> = left_out
            .iter()
            .map(|l| (l.index, l.pubsub.as_str(), l.topic.as_str()))
            .collect();
        assert_eq!(named, [(0, "p", "t"), (1, "q", "")]);
        assert!(
            left_out[0]
                .reason
                .starts_with("`routes.rules[0].match`: unsupported character `~`"),
            "{}",
            left_out[0].reason
        );
        assert!(
            left_out[1].reason.starts_with("missing field `topic`"),
            "{}",
            left_out[1].reason
        );
    }

    /// As Dapr's `getSubscriptionsHTTP`: `routes.default` wins over a
    /// `route` that differs. Before, the entry was refused, and with it
    /// the whole listing.
    #[test]
    fn routes_default_wins_over_a_differing_route_as_in_dapr() {
        let value = serde_json::json!([
            {"pubsubname": "p", "topic": "t", "route": "/old", "routes": {"default": "/new"}},
            {"pubsubname": "p", "topic": "u", "route": "/only", "routes": {"rules": [
                {"match": "event.type == \"widget\"", "path": "/widgets"}]}}
        ]);
        let parsed = parse_subscriptions(&value).expect("valid");
        let defaults: Vec<Option<&str>> =
            parsed.iter().map(|s| s.routes.default.as_deref()).collect();
        assert_eq!(defaults, [Some("/new"), Some("/only")]);
        assert_eq!(parsed[1].routes.rules.len(), 1);
    }

    /// One entry with a rule rewire cannot read is left out, named; the
    /// rest of the listing is taken (as the gRPC listing does). Before,
    /// the whole listing was refused: no subscription at all.
    #[test]
    fn an_entry_with_an_unreadable_rule_is_left_out_and_the_rest_taken() {
        let value = serde_json::json!([
            {"pubsubname": "p", "topic": "a", "route": "/a"},
            {"pubsubname": "p", "topic": "cel", "routes": {
                "rules": [{"match": "event.data.items.exists(i, i.n > 1)", "path": "/x"}],
                "default": "/cel"}},
            {"pubsubname": "p", "topic": "b", "route": "/b"}
        ]);
        let (parsed, left_out) = parse_listing(&value).expect("a listing");
        let topics: Vec<&str> = parsed.iter().map(|s| s.topic.as_str()).collect();
        assert_eq!(topics, ["a", "b"]);
        let named: Vec<(usize, &str, &str)> = left_out
            .iter()
            .map(|l| (l.index, l.pubsub.as_str(), l.topic.as_str()))
            .collect();
        assert_eq!(named, [(1, "p", "cel")]);
        assert_eq!(parse_subscriptions(&value).expect("valid").len(), 2);
    }

    /// An entry with neither `route` nor `routes` (nor an empty `routes`)
    /// is dropped, as Dapr's `filterSubscriptions` does. Before, it was
    /// subscribed and its events posted to `/<topic>`.
    #[test]
    fn an_entry_with_no_route_is_dropped_as_in_dapr() {
        let value = serde_json::json!([
            {"pubsubname": "p", "topic": "none"},
            {"pubsubname": "p", "topic": "empty", "route": "", "routes": {"rules": [], "default": ""}},
            {"pubsubname": "p", "topic": "kept", "route": "/kept"}
        ]);
        let (parsed, left_out) = parse_listing(&value).expect("a listing");
        let topics: Vec<&str> = parsed.iter().map(|s| s.topic.as_str()).collect();
        assert_eq!(topics, ["kept"]);
        let dropped: Vec<&str> = left_out.iter().map(|l| l.topic.as_str()).collect();
        assert_eq!(dropped, ["none", "empty"]);
    }

    /// Runs `f` with the warnings it logs captured, as a log writer
    /// writes them.
    fn logs_of(f: impl FnOnce()) -> String {
        use std::sync::{Arc, Mutex};
        #[derive(Clone, Default)]
        struct Captured(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Captured {
            fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(bytes);
                Ok(bytes.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_max_level(tracing::Level::WARN)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, f);
        let bytes = captured.0.lock().unwrap().clone();
        String::from_utf8(bytes).unwrap()
    }

    /// The pub/sub, topic and reason of an entry left out, and of a bulk
    /// subscription refused, are the app's text: logged with control
    /// characters escaped, one line per warning. Before, a line feed in
    /// them split the line (a forged log line).
    #[test]
    fn an_entry_left_out_is_logged_on_one_line_whatever_the_app_wrote() {
        let listing = serde_json::json!([
            {"pubsubname": "p\nERROR forged", "topic": "t\nx"},
            {"pubsubname": "p", "topic": "t\nbulk", "route": "/b",
             "bulkSubscribe": {"enabled": true}},
            {"pubsubname": "p", "topic": "t", "route": "/t", "metadata": {"k": "v\nforged"}},
        ]);
        let mut taken = Vec::new();
        let logs = logs_of(|| taken = parse_subscriptions(&listing).expect("an array"));
        assert_eq!(taken.len(), 1);
        assert_eq!(logs.lines().count(), 2, "{logs}");
        assert!(
            logs.contains(r"p\nERROR forged") && logs.contains(r"t\nx"),
            "{logs}"
        );
        assert!(logs.contains(r"t\nbulk"), "{logs}");
    }
}
