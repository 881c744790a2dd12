//! What a delivery's log lines show of an event: its publisher writes its
//! CloudEvent `id`, of any length and with any characters, and the log
//! writer escapes no newline.

use std::io::Write;
use std::sync::Mutex;

use tracing::subscriber::Interest;
use tracing_subscriber::layer::{Layer as _, SubscriberExt as _};

use super::*;

/// What the log writer wrote.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
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

/// A second dispatcher alive for the whole test run. While only one is
/// registered, tracing decides a new callsite's interest by the default
/// of the thread that reaches it first: another test's thread, without a
/// subscriber, would turn a warning off for the thread capturing it. With
/// two, it asks every registered one (and rechecks per event).
fn keep_interest_per_event() {
    static NONE: std::sync::OnceLock<tracing::Dispatch> = std::sync::OnceLock::new();
    NONE.get_or_init(|| tracing::Dispatch::new(tracing::subscriber::NoSubscriber::default()));
}

/// The process's log format writing to `captured`, events only (a
/// subscriber taking spans would turn on the `rewire.*` spans other tests
/// assert off).
fn log_to(captured: &Captured) -> tracing::subscriber::DefaultGuard {
    keep_interest_per_event();
    let writer = captured.clone();
    let events_only = tracing_subscriber::filter::dynamic_filter_fn(|m, _| m.is_event())
        .with_callsite_filter(|m| {
            if m.is_event() {
                Interest::always()
            } else {
                Interest::never()
            }
        });
    let layer = tracing_subscriber::fmt::layer()
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .with_filter(events_only);
    tracing::subscriber::set_default(tracing_subscriber::registry().with(layer))
}

/// An expired event whose id forges a log line (`\n`, then a line of the
/// sidecar's format) and runs to 100 KB, its dead letter refused: each
/// warning is one line of bounded length, the id cut and its newline
/// escaped (logged raw: a forged `INFO` line, and 100 KB per warning).
#[tokio::test]
async fn an_expired_events_id_is_logged_cut_on_one_line() {
    let runtime = runtime_with(serde_json::json!({})).await;
    let sink = Arc::new(Counting::default());
    let (_task, _retire) = deliver_with_dead_letters(
        &runtime,
        "forged-ids",
        Some("forged-ids-refused"),
        sink.clone(),
    )
    .await;
    let forged = "2025-01-01T00:00:00.000000Z  INFO rewire: Reload finished.";
    let id = format!("x\n{forged}\r\n{}", "y".repeat(100_000));
    let event = serde_json::json!({"specversion": "1.0", "id": id, "source": "s",
        "type": "t", "data": "x", "expiration": "2001-01-01T00:00:00Z"});

    let captured = Captured::default();
    let outcome = {
        let _logging = log_to(&captured);
        let outcome = feed_cloud_event("forged-ids", event).await;
        settled(outcome).await
    };
    assert_eq!(outcome, DeliveryOutcome::Success);
    assert_eq!(published_to("forged-ids-refused"), 1, "dead letter tried");

    let logged = captured.text();
    let lines: Vec<&str> = logged.lines().collect();
    let warned = |what: &str| lines.iter().filter(|l| l.contains(what)).count();
    assert_eq!(warned("past its expiration"), 1, "{logged}");
    assert_eq!(warned("dead-letter topic failed"), 1, "{logged}");
    assert_eq!(lines.len(), 2, "one line per warning: {logged}");
    for line in &lines {
        assert!(line.len() < 1024, "{} bytes: {line:.300}", line.len());
        assert!(line.contains(r"id=x\n2025-01-01"), "{line}");
        assert!(line.contains('…'), "cut: {line}");
    }
    assert_eq!(sink.sent.load(Ordering::SeqCst), 0, "sent to the app");
    runtime.shutdown().await;
}
