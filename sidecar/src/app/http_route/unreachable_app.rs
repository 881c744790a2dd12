//! An app that cannot be reached (nothing listens on its port: a restart,
//! a deploy) is waited for: its events spend no attempt and are not
//! dead-lettered meanwhile, and are delivered once it listens again; an
//! app that answers, even with errors, spends its attempts as before. A
//! subscription that ends while its app is unreachable hands its events
//! back to the broker.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rewire_runtime::DeliveryOutcome;

use crate::app::HttpRoute;
use crate::dapr::delivery_tests::*;
use crate::dapr::{EventSink, TopicEvent, MAX_ATTEMPTS};

/// A local port nothing listens on (bound, then let go).
async fn closed_port() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    listener.local_addr().expect("port").port()
}

/// An app on `port` whose `POST /orders` answers `status`, telling `got`
/// of each event's id.
async fn app_on(
    port: u16,
    status: u16,
    got: tokio::sync::mpsc::UnboundedSender<String>,
) -> tokio::task::JoinHandle<()> {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .expect("the app's port");
    let app = axum::Router::new().route(
        "/orders",
        axum::routing::post(move |body: axum::body::Bytes| {
            let got = got.clone();
            async move {
                let event: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
                let _ = got.send(event["id"].as_str().unwrap_or_default().to_string());
                axum::http::StatusCode::from_u16(status).expect("a status")
            }
        }),
    );
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    })
}

/// An [`HttpRoute`] to `POST /orders` on `port`.
fn route_to(port: u16) -> Arc<HttpRoute> {
    crate::tls::install_ring_provider();
    let client = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("an HTTP client");
    Arc::new(HttpRoute::new(
        client,
        format!("http://127.0.0.1:{port}/orders"),
    ))
}

/// The app's port is closed when the event comes and opens 3 s later (its
/// five attempts took 1.5 s): the event waits for it, reaches it, and its
/// dead-letter topic gets nothing (before, it was dead-lettered within
/// 1.5 s and never reached the app).
#[tokio::test]
async fn an_event_waits_for_an_app_that_is_not_listening_and_is_not_dead_lettered() {
    let runtime = runtime_with(serde_json::json!({})).await;
    let port = closed_port().await;
    let (_task, _retire) = deliver_with_dead_letters(
        &runtime,
        "restarting",
        Some("restarting-dlq"),
        route_to(port),
    )
    .await;
    let outcome = feed_event("restarting", "r1").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (got, mut received) = tokio::sync::mpsc::unbounded_channel();
    let _app = app_on(port, 200, got).await;
    assert_eq!(settled(outcome).await, DeliveryOutcome::Success);
    assert_eq!(published_to("restarting-dlq"), 0, "dead-lettered");
    // Told before the app answered, which settled the event.
    let reached = received.try_recv().ok();
    assert_eq!(reached.as_deref(), Some("r1"), "reached the app");
    runtime.shutdown().await;
}

/// An app that answers `500` to every event spends the event's attempts
/// and it is dead-lettered, as before: only an app that could not be
/// reached is waited for.
#[tokio::test]
async fn an_app_answering_500_still_has_its_event_dead_lettered() {
    let runtime = runtime_with(serde_json::json!({})).await;
    let port = closed_port().await;
    let (got, mut received) = tokio::sync::mpsc::unbounded_channel();
    let _app = app_on(port, 500, got).await;
    let (_task, _retire) =
        deliver_with_dead_letters(&runtime, "failing", Some("failing-dlq"), route_to(port)).await;
    let outcome = feed_event("failing", "f1").await;
    assert_eq!(settled(outcome).await, DeliveryOutcome::Success);
    assert_eq!(published_to("failing-dlq"), 1, "dead-lettered");
    let mut attempts = 0;
    while received.try_recv().is_ok() {
        attempts += 1;
    }
    assert_eq!(attempts, MAX_ATTEMPTS, "each attempt reached the app");
    runtime.shutdown().await;
}

/// A subscriber that can never be reached, counting the sends.
#[derive(Default)]
struct NeverReachable {
    sent: AtomicU32,
}

#[tonic::async_trait]
impl EventSink for NeverReachable {
    async fn send(&self, _: &TopicEvent, _: Duration) -> DeliveryOutcome {
        DeliveryOutcome::Retry
    }

    async fn send_if_reachable(&self, _: &TopicEvent, _: Duration) -> Option<DeliveryOutcome> {
        self.sent.fetch_add(1, Ordering::SeqCst);
        None
    }

    async fn reachable(&self) {
        std::future::pending().await
    }

    async fn closed(&self) {
        std::future::pending().await
    }
}

/// The wait for an unreachable app ends with its subscription: a retired
/// one ends at its limit and hands the event back to the broker, neither
/// dead-lettered nor acknowledged, and sends nothing more.
#[tokio::test(start_paused = true)]
async fn an_event_waiting_for_its_app_goes_back_to_the_broker_when_its_subscription_ends() {
    let runtime = runtime_with(serde_json::json!({})).await;
    let sink = Arc::new(NeverReachable::default());
    let (task, retire) =
        deliver_with_dead_letters(&runtime, "unreached", Some("unreached-dlq"), sink.clone()).await;
    let outcome = feed_event("unreached", "u1").await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(
        sink.sent.load(Ordering::SeqCst),
        1,
        "sent once, then waited"
    );
    assert_eq!(
        retired_and_settled(retire, task, outcome).await,
        Some(DeliveryOutcome::Retry),
        "handed back to the broker"
    );
    assert_eq!(published_to("unreached-dlq"), 0, "dead-lettered");
    runtime.shutdown().await;
}

/// A subscriber that cannot be reached while `down` sends are left, then
/// answers SUCCESS; its port is always taken for open (`reachable` at
/// once), as when something else listens there.
struct DownFor {
    down: AtomicU32,
    sent: AtomicU32,
}

#[tonic::async_trait]
impl EventSink for DownFor {
    async fn send(&self, _: &TopicEvent, _: Duration) -> DeliveryOutcome {
        DeliveryOutcome::Success
    }

    async fn send_if_reachable(&self, _: &TopicEvent, _: Duration) -> Option<DeliveryOutcome> {
        self.sent.fetch_add(1, Ordering::SeqCst);
        let left = self.down.load(Ordering::SeqCst);
        if left == 0 {
            return Some(DeliveryOutcome::Success);
        }
        self.down.store(left - 1, Ordering::SeqCst);
        None
    }

    async fn closed(&self) {
        std::future::pending().await
    }
}

/// Sends that cannot reach the subscriber spend no attempt however many
/// there are (here more than [`MAX_ATTEMPTS`]), and are spaced by a
/// backoff even when its port is taken for open at once.
#[tokio::test(start_paused = true)]
async fn unreachable_sends_spend_no_attempt_and_are_spaced_apart() {
    let runtime = runtime_with(serde_json::json!({})).await;
    let sink = Arc::new(DownFor {
        down: AtomicU32::new(MAX_ATTEMPTS * 2),
        sent: AtomicU32::new(0),
    });
    let (_task, _retire) =
        deliver_with_dead_letters(&runtime, "flapping", Some("flapping-dlq"), sink.clone()).await;
    let outcome = feed_event("flapping", "b1").await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        sink.sent.load(Ordering::SeqCst) < 6,
        "sent without a backoff"
    );
    assert_eq!(settled(outcome).await, DeliveryOutcome::Success);
    assert_eq!(sink.sent.load(Ordering::SeqCst), MAX_ATTEMPTS * 2 + 1);
    assert_eq!(published_to("flapping-dlq"), 0, "dead-lettered");
    runtime.shutdown().await;
}

/// An event whose `expiration` passes while its app is down (its port
/// closed for 3 s, the event living 1 s) is not delivered late once the
/// app listens again: it goes to the dead-letter topic and is
/// acknowledged, as an event already past its expiration when it came
/// (before, it was sent to the app however long ago it expired).
#[tokio::test]
async fn an_event_that_expires_while_its_app_is_down_is_dead_lettered_not_delivered() {
    let runtime = runtime_with(serde_json::json!({})).await;
    let port = closed_port().await;
    let (_task, _retire) = deliver_with_dead_letters(
        &runtime,
        "expires-waiting",
        Some("expires-waiting-dlq"),
        route_to(port),
    )
    .await;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs();
    let event = serde_json::json!({"specversion": "1.0", "id": "e1", "source": "s",
        "type": "t", "data": "x", "expiration": rewire_runtime::rfc3339_utc(now + 1)});
    let outcome = feed_cloud_event("expires-waiting", event).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (got, mut received) = tokio::sync::mpsc::unbounded_channel();
    let _app = app_on(port, 200, got).await;
    assert_eq!(settled(outcome).await, DeliveryOutcome::Success);
    assert_eq!(published_to("expires-waiting-dlq"), 1, "dead-lettered");
    assert_eq!(received.try_recv().ok(), None, "delivered after it expired");
    runtime.shutdown().await;
}

/// A send that cannot connect while the app listens (here its HTTP client
/// goes through a proxy that refuses connections; so too an untrusted
/// certificate) is not taken for an app that is down: waiting for its
/// port, open all along, would never mend it. Its attempts are spent and
/// it is dead-lettered (before, it was sent again for ever, never
/// settled, nothing said above debug).
#[tokio::test]
async fn an_event_that_cannot_connect_to_a_listening_app_spends_its_attempts() {
    let runtime = runtime_with(serde_json::json!({})).await;
    let (port, proxy) = (closed_port().await, closed_port().await);
    let (got, mut received) = tokio::sync::mpsc::unbounded_channel();
    let _app = app_on(port, 200, got).await;
    crate::tls::install_ring_provider();
    let client = reqwest::Client::builder()
        .proxy(reqwest::Proxy::all(format!("http://127.0.0.1:{proxy}")).expect("a proxy"))
        .build()
        .expect("an HTTP client");
    let route = Arc::new(HttpRoute::new(
        client,
        format!("http://127.0.0.1:{port}/orders"),
    ));
    let (_task, _retire) =
        deliver_with_dead_letters(&runtime, "proxied", Some("proxied-dlq"), route).await;
    let outcome = feed_event("proxied", "p1").await;
    assert_eq!(settled(outcome).await, DeliveryOutcome::Success);
    assert_eq!(published_to("proxied-dlq"), 1, "dead-lettered");
    assert_eq!(received.try_recv().ok(), None, "reached the app");
    runtime.shutdown().await;
}

/// Events waiting for an app that stays down are said once, as a warning
/// for the subscription, after 30 s (not a line per event, nor only at
/// debug level).
#[tokio::test(start_paused = true)]
async fn events_waiting_long_for_their_app_are_warned_of_once() {
    let runtime = runtime_with(serde_json::json!({})).await;
    let sink = Arc::new(NeverReachable::default());
    let (_task, _retire) = deliver_with_dead_letters(&runtime, "down-long", None, sink).await;
    let captured = Captured::default();
    let _logging = log_to(&captured);
    let _first = feed_event("down-long", "d1").await;
    let _second = feed_event("down-long", "d2").await;
    tokio::time::sleep(Duration::from_secs(20)).await;
    let warned = || captured.text().matches("waiting for the app").count();
    assert_eq!(warned(), 0, "warned early: {}", captured.text());
    tokio::time::sleep(Duration::from_secs(40)).await;
    assert_eq!(warned(), 1, "{}", captured.text());
    assert!(captured.text().contains("2 events"), "{}", captured.text());
    runtime.shutdown().await;
}

/// What the log writer wrote (warnings and above).
#[derive(Clone, Default)]
struct Captured(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let mut written = self.0.lock().unwrap_or_else(|p| p.into_inner());
        written.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        let written = self.0.lock().unwrap_or_else(|p| p.into_inner());
        String::from_utf8_lossy(&written).into_owned()
    }
}

/// Warnings written to `captured` on this thread (events only; a second
/// dispatcher kept alive so that a callsite's interest is asked per event,
/// as `logged_ids` does).
fn log_to(captured: &Captured) -> tracing::subscriber::DefaultGuard {
    use tracing::subscriber::Interest;
    use tracing_subscriber::layer::{Layer as _, SubscriberExt as _};
    static NONE: std::sync::OnceLock<tracing::Dispatch> = std::sync::OnceLock::new();
    NONE.get_or_init(|| tracing::Dispatch::new(tracing::subscriber::NoSubscriber::default()));
    let writer = captured.clone();
    let warnings = tracing_subscriber::filter::dynamic_filter_fn(|m, _| {
        m.is_event() && *m.level() <= tracing::Level::WARN
    })
    .with_callsite_filter(|m| match m.is_event() {
        true => Interest::always(),
        false => Interest::never(),
    });
    let layer = tracing_subscriber::fmt::layer()
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .with_filter(warnings);
    tracing::subscriber::set_default(tracing_subscriber::registry().with(layer))
}
