//! Reloads driven through a [`Reloader`] over components made here, with
//! a subscriber that keeps every span and its fields: what a reload
//! records, and what its trace shows.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};

use async_trait::async_trait;
use serde_json::{Map, Value};
use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::Interest;
use tracing::{Event, Metadata as TraceMetadata, Subscriber};

use super::*;
use crate::component::{Component, ComponentError, InPlace, InPlaceUpdate, InitContext};
use crate::config::{parse, validate, Config};
use crate::handle::Instance;
use crate::metadata::{Metadata, MetadataError};
use crate::registry::{Buildable, ComponentDescriptor, Inject};

// Its staging component is shared with the runtime's tests (a watched ref
// after a staged update panics).
mod edge_cases;
mod moved_ref_put_back;
mod put_back_hung;
mod removed_in_use;
mod secret_rotation;
pub(crate) mod staged_panic;
mod unreverted_rollback;

/// `fail`s or `panic`s in `init` when told; else starts.
struct TestComponent {
    fail: bool,
    panic: bool,
}

#[async_trait]
impl Component for TestComponent {
    async fn init(&mut self, _cx: &InitContext) -> Result<(), ComponentError> {
        if self.panic {
            panic!("init exploded near hunter2-the-secret");
        }
        if self.fail {
            return Err(ComponentError::new("refused to start"));
        }
        Ok(())
    }
}

impl Inject for TestComponent {}

/// Takes no update in place (`update_in_place` refuses, left to the
/// commit by default); `fail`s in `init` when its metadata says
/// `failInit`.
struct Refusing {
    fail: bool,
}

#[async_trait]
impl Component for Refusing {
    async fn init(&mut self, _cx: &InitContext) -> Result<(), ComponentError> {
        if self.fail {
            return Err(ComponentError::new("refused to start"));
        }
        Ok(())
    }

    fn as_in_place(&self) -> Option<&dyn InPlaceUpdate> {
        Some(self)
    }
}

#[async_trait]
impl InPlaceUpdate for Refusing {
    async fn update_in_place(&self, _metadata: &Metadata) -> Result<InPlace, ComponentError> {
        Err(ComponentError::new("not in place"))
    }
}

impl Inject for Refusing {}

impl Buildable for Refusing {
    fn into_instance(self: Box<Self>) -> Instance {
        Instance::Custom(Arc::new(*self))
    }
}

impl Buildable for TestComponent {
    fn into_instance(self: Box<Self>) -> Instance {
        Instance::Custom(Arc::new(*self))
    }
}

pub(crate) fn any_metadata(_: &Map<String, Value>, _: &[String]) -> Result<(), MetadataError> {
    Ok(())
}

fn build(
    metadata: &Metadata,
    fail: bool,
    panic: bool,
) -> Result<Box<dyn Buildable>, MetadataError> {
    let _ = metadata;
    Ok(Box::new(TestComponent { fail, panic }))
}

type Build = fn(&Metadata) -> Result<Box<dyn Buildable>, MetadataError>;

/// `custom` types `ok`, `fail` (init fails), `panic` (init panics) and
/// `refusing` ([`Refusing`]).
fn registry() -> Registry {
    let mut registry = Registry::default();
    let builds: [(&'static str, Build); 4] = [
        ("ok", |m| build(m, false, false)),
        ("fail", |m| build(m, true, false)),
        ("panic", |m| build(m, false, true)),
        ("refusing", |m| {
            let fail = m.get("failInit") == Some(&Value::Bool(true));
            Ok(Box::new(Refusing { fail }))
        }),
    ];
    for (type_name, build) in builds {
        registry.register(ComponentDescriptor {
            kind: "custom",
            type_name,
            description: "",
            example_metadata: "{}",
            validate: any_metadata,
            build,
            check_refs: None,
            in_place: None,
        });
    }
    registry
}

/// A configuration of `custom` components, each `(name, type)`.
fn config_of(components: &[(String, &str)]) -> Config {
    let custom: Map<String, Value> = components
        .iter()
        .map(|(name, type_name)| (name.clone(), serde_json::json!({ "type": type_name })))
        .collect();
    let text = serde_json::json!({ "components": { "custom": custom } }).to_string();
    parse(text.as_bytes()).unwrap_or_else(|p| panic!("{p}"))
}

fn named(prefix: &str, count: usize) -> Vec<(String, &'static str)> {
    (0..count).map(|i| (format!("{prefix}{i}"), "ok")).collect()
}

async fn reloader_of(components: &[(String, &str)]) -> Arc<Reloader> {
    reloader_of_config(config_of(components)).await
}

async fn reloader_of_config(config: Config) -> Arc<Reloader> {
    reloader_with(registry(), config).await
}

async fn reloader_with(registry: Registry, config: Config) -> Arc<Reloader> {
    let config = validate(config, &registry).unwrap_or_else(|p| panic!("{p}"));
    let redactor = Redactor::default();
    let running = RunningSet::start(config, &registry, StartTimeouts::default(), &redactor)
        .await
        .unwrap_or_else(|f| panic!("{f:?}"));
    let settings = ReloadSettings {
        timeouts: StartTimeouts::default(),
        drain_grace: Duration::from_secs(1),
    };
    Arc::new(Reloader::new(
        running,
        Arc::new(registry),
        settings,
        redactor,
        10,
    ))
}

/// One span as recorded: its name and every field recorded on it.
#[derive(Debug, Clone)]
struct Recorded {
    name: &'static str,
    metadata: &'static TraceMetadata<'static>,
    fields: BTreeMap<String, String>,
}

/// Keeps every span (ids are indexes + 1) and tracks the entered ones, on
/// a current-thread runtime (every task is polled on this thread). Spans
/// named `disabled` are not wanted.
#[derive(Clone, Default)]
pub(crate) struct Capture {
    spans: Arc<Mutex<Vec<Recorded>>>,
    entered: Arc<Mutex<Vec<Id>>>,
    disabled: Option<&'static str>,
}

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl tracing::field::Visit for Fields<'_> {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.insert(field.name().to_string(), value.to_string());
    }
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0
            .insert(field.name().to_string(), format!("{value:?}"));
    }
}

impl Subscriber for Capture {
    // Asked on every span: tests running at once each have their own
    // subscriber, and a cached `never` from one would hide spans from
    // another.
    fn register_callsite(&self, _: &'static TraceMetadata<'static>) -> Interest {
        Interest::sometimes()
    }
    fn enabled(&self, metadata: &TraceMetadata<'_>) -> bool {
        Some(metadata.name()) != self.disabled
    }
    fn new_span(&self, attributes: &Attributes<'_>) -> Id {
        let mut fields = BTreeMap::new();
        attributes.record(&mut Fields(&mut fields));
        let mut spans = self.spans.lock().unwrap_or_else(|p| p.into_inner());
        spans.push(Recorded {
            name: attributes.metadata().name(),
            metadata: attributes.metadata(),
            fields,
        });
        Id::from_u64(spans.len() as u64)
    }
    fn record(&self, span: &Id, values: &Record<'_>) {
        let mut spans = self.spans.lock().unwrap_or_else(|p| p.into_inner());
        let index = usize::try_from(span.into_u64() - 1).unwrap_or(usize::MAX);
        if let Some(recorded) = spans.get_mut(index) {
            values.record(&mut Fields(&mut recorded.fields));
        }
    }
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, _: &Event<'_>) {}
    fn enter(&self, span: &Id) {
        self.entered
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(span.clone());
    }
    fn exit(&self, span: &Id) {
        let mut entered = self.entered.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(at) = entered.iter().rposition(|id| id == span) {
            entered.remove(at);
        }
    }
    fn current_span(&self) -> tracing_core::span::Current {
        let entered = self.entered.lock().unwrap_or_else(|p| p.into_inner());
        let spans = self.spans.lock().unwrap_or_else(|p| p.into_inner());
        let current = entered.last().and_then(|id| {
            let index = usize::try_from(id.into_u64() - 1).ok()?;
            Some((id.clone(), spans.get(index)?.metadata))
        });
        match current {
            Some((id, metadata)) => tracing_core::span::Current::new(id, metadata),
            None => tracing_core::span::Current::none(),
        }
    }
}

impl Capture {
    fn named(&self, name: &str) -> Vec<BTreeMap<String, String>> {
        let spans = self.spans.lock().unwrap_or_else(|p| p.into_inner());
        spans
            .iter()
            .filter(|s| s.name == name)
            .map(|s| s.fields.clone())
            .collect()
    }

    /// The component spans of `component` (`custom/x`).
    fn component(&self, component: &str) -> Vec<BTreeMap<String, String>> {
        self.named("rewire.component")
            .into_iter()
            .filter(|f| f.get("rewire.component").map(String::as_str) == Some(component))
            .collect()
    }

    fn kept(&self) -> usize {
        self.named("rewire.component")
            .iter()
            .filter(|f| f.get("rewire.action").map(String::as_str) == Some("kept"))
            .count()
    }
}

fn field<'a>(fields: &'a BTreeMap<String, String>, name: &str) -> Option<&'a str> {
    fields.get(name).map(String::as_str)
}

#[tokio::test]
async fn a_panicked_reload_task_is_still_recorded_as_rolled_back_and_scrubbed() {
    let reloader = reloader_of(&[]).await;
    reloader.redactor.remember("hunter2-the-secret");
    let mut events = reloader.events();
    let recording = record::Recording::start(Trigger::Api, 0);
    let task = tokio::spawn(async {
        if true {
            panic!("boom near hunter2-the-secret");
        }
        Err(ReloadError::Stopped)
    });
    let error = reloader
        .joined(recording, &OnceLock::new(), task)
        .await
        .unwrap_err();
    assert!(
        matches!(&error, ReloadError::RolledBack(f) if f.len() == 1),
        "{error}"
    );
    let history = reloader.history();
    assert_eq!(history.len(), 1, "no record of the panicked reload");
    let record = &history[0];
    assert_eq!(record.outcome, Outcome::RolledBack);
    assert_eq!(record.trigger, Trigger::Api);
    let text = record.error.as_deref().unwrap_or_default();
    assert!(text.starts_with("the reload panicked: boom near"), "{text}");
    assert!(!text.contains("hunter2"), "not scrubbed: {text}");
    assert!(!error.to_string().contains("hunter2"), "{error}");
    let sent = events.try_recv().expect("no event for metrics");
    assert_eq!(sent.outcome, Outcome::RolledBack);
}

#[tokio::test]
async fn a_rolled_back_reload_and_its_failed_components_are_errors_in_the_trace() {
    let capture = Capture::default();
    let _default = tracing::subscriber::set_default(capture.clone());
    let reloader = reloader_of(&named("k", 2)).await;
    reloader.redactor.remember("hunter2-the-secret");
    let mut candidate = named("k", 2);
    candidate.push(("failing".into(), "fail"));
    candidate.push(("panicking".into(), "panic"));
    let request = ReloadRequest::new(config_of(&candidate), Trigger::Api);
    let result = reloader.reload(request).await;
    assert!(
        matches!(result, Err(ReloadError::RolledBack(_))),
        "{result:?}"
    );

    let roots = capture.named("rewire.reload");
    assert_eq!(roots.len(), 1, "{roots:?}");
    let root = &roots[0];
    assert_eq!(field(root, "rewire.outcome"), Some("rolled_back"));
    assert_eq!(field(root, "otel.status_code"), Some("ERROR"));
    let message = field(root, "otel.status_description").unwrap_or_default();
    assert_eq!(Some(message), reloader.history()[0].error.as_deref());
    assert!(message.contains("custom/failing"), "{message}");
    assert!(!message.contains("hunter2"), "{message}");

    for (component, why) in [
        ("custom/failing", "init failed: refused to start"),
        ("custom/panicking", "panicked: init exploded near"),
    ] {
        let spans = capture.component(component);
        assert_eq!(spans.len(), 1, "{component}: {spans:?}");
        let span = &spans[0];
        assert_eq!(field(span, "rewire.action"), Some("failed"), "{component}");
        assert_eq!(
            field(span, "otel.status_code"),
            Some("ERROR"),
            "{component}"
        );
        let message = field(span, "otel.status_description").unwrap_or_default();
        assert!(message.contains(why), "{component}: {message}");
        assert!(!message.contains("hunter2"), "{component}: {message}");
    }
    // Kept components are no errors.
    let kept = capture.component("custom/k0");
    assert_eq!(field(&kept[0], "otel.status_code"), None);

    // An applied reload is not an error either.
    let request = ReloadRequest::new(config_of(&named("k", 3)), Trigger::Api);
    reloader.reload(request).await.expect("applies");
    let roots = capture.named("rewire.reload");
    assert_eq!(field(&roots[1], "rewire.outcome"), Some("applied"));
    assert_eq!(field(&roots[1], "otel.status_code"), None);
}

#[tokio::test]
async fn a_rejected_reload_is_an_error_in_the_trace() {
    let capture = Capture::default();
    let _default = tracing::subscriber::set_default(capture.clone());
    let reloader = reloader_of(&named("k", 1)).await;
    let request = ReloadRequest::new(config_of(&[("x".into(), "nope")]), Trigger::File);
    let result = reloader.reload(request).await;
    assert!(matches!(result, Err(ReloadError::Invalid(_))), "{result:?}");
    let roots = capture.named("rewire.reload");
    assert_eq!(field(&roots[0], "rewire.outcome"), Some("rejected"));
    assert_eq!(field(&roots[0], "otel.status_code"), Some("ERROR"));
    let message = field(&roots[0], "otel.status_description").unwrap_or_default();
    assert!(message.contains("nope"), "{message}");
}

/// A reload rejected over a component whose type runs to 1 MiB keeps,
/// logs, exports and shows a bounded error that still says what is wrong
/// (whole, it was kept 100 times over and returned by every status call);
/// one whose name does is refused for its name, shown cut.
#[tokio::test]
async fn a_rejected_reload_over_a_huge_name_records_a_bounded_error() {
    let capture = Capture::default();
    let _default = tracing::subscriber::set_default(capture.clone());
    let reloader = reloader_of(&named("k", 1)).await;
    let huge = "n".repeat(1 << 20);
    let request = ReloadRequest::new(config_of(&[("x".into(), &huge)]), Trigger::Api);
    let result = reloader.reload(request).await;
    assert!(matches!(result, Err(ReloadError::Invalid(_))), "{result:?}");
    let history = reloader.history();
    let error = history[0].error.as_deref().unwrap_or_default();
    assert!(error.len() < 8 * 1024, "{} bytes kept", error.len());
    assert!(
        error.starts_with("custom/x: unknown type `nnn"),
        "{error:.200}"
    );
    assert!(error.contains('…'), "cut: {error:.200}");
    assert!(
        error.contains("for kind `custom`"),
        "the problem is gone: {error}"
    );
    let roots = capture.named("rewire.reload");
    let message = field(&roots[0], "otel.status_description").unwrap_or_default();
    assert_eq!(message, error, "the span's status is the record's error");

    let request = ReloadRequest::new(config_of(&[(huge, "ok")]), Trigger::Api);
    let result = reloader.reload(request).await;
    assert!(matches!(result, Err(ReloadError::Invalid(_))), "{result:?}");
    let error = reloader.history()[1].error.clone().unwrap_or_default();
    assert!(
        error.starts_with("custom/nnn") && error.contains("…: name: ") && error.len() < 256,
        "{error:.300}"
    );
}

#[tokio::test]
async fn kept_components_get_a_span_each_only_up_to_the_limit() {
    let capture = Capture::default();
    let _default = tracing::subscriber::set_default(capture.clone());

    // A few kept: a span each, and counted.
    let few = named("k", 3);
    let reloader = reloader_of(&few).await;
    let mut candidate = few.clone();
    candidate.push(("new".into(), "ok"));
    let request = ReloadRequest::new(config_of(&candidate), Trigger::Api);
    reloader.reload(request).await.expect("applies");
    assert_eq!(capture.kept(), 3);
    let roots = capture.named("rewire.reload");
    assert_eq!(field(&roots[0], "rewire.kept"), Some("3"));

    // Past the limit: counted only.
    let many = named("k", trace::KEPT_SPANS_LIMIT + 1);
    let reloader = reloader_of(&many).await;
    let mut candidate = many.clone();
    candidate.push(("new".into(), "ok"));
    let request = ReloadRequest::new(config_of(&candidate), Trigger::Api);
    reloader.reload(request).await.expect("applies");
    assert_eq!(capture.kept(), 3, "kept spans past the limit");
    let roots = capture.named("rewire.reload");
    let count = (trace::KEPT_SPANS_LIMIT + 1).to_string();
    assert_eq!(field(&roots[1], "rewire.kept"), Some(count.as_str()));
    assert_eq!(capture.component("custom/new").len(), 2, "the added ones");
}

#[tokio::test]
async fn no_kept_spans_when_the_reload_span_is_off_whatever_the_log_level() {
    // Log output at INFO (every span and event enabled), tracing off (the
    // reload span not wanted): kept spans are not made.
    let capture = Capture {
        disabled: Some("rewire.reload"),
        ..Capture::default()
    };
    let _default = tracing::subscriber::set_default(capture.clone());
    let few = named("k", 3);
    let reloader = reloader_of(&few).await;
    let mut candidate = few.clone();
    candidate.push(("new".into(), "ok"));
    let request = ReloadRequest::new(config_of(&candidate), Trigger::Api);
    reloader.reload(request).await.expect("applies");
    assert_eq!(capture.kept(), 0);
}

#[tokio::test]
async fn a_retry_shows_its_attempt_in_the_record_the_status_json_and_the_span() {
    let capture = Capture::default();
    let _default = tracing::subscriber::set_default(capture.clone());
    let reloader = reloader_of(&named("k", 1)).await;
    let fresh = ReloadRequest::new(config_of(&named("k", 2)), Trigger::File);
    let retried = ReloadRequest {
        attempt: 3,
        ..ReloadRequest::new(config_of(&named("k", 3)), Trigger::File)
    };
    reloader.reload(fresh).await.expect("applies");
    reloader.reload(retried).await.expect("applies");
    let attempts: Vec<u32> = reloader.history().iter().map(|r| r.attempt).collect();
    assert_eq!(attempts, [0, 3]);
    let json = serde_json::to_value(&reloader.history()[1]).unwrap_or_default();
    assert_eq!(json["attempt"], 3, "{json}");
    let roots = capture.named("rewire.reload");
    let shown: Vec<Option<&str>> = roots.iter().map(|r| field(r, "rewire.attempt")).collect();
    assert_eq!(shown, [Some("0"), Some("3")]);
}

#[tokio::test]
async fn a_reload_queued_behind_another_records_the_wait_and_starts_its_span_on_its_turn() {
    let capture = Capture::default();
    let _default = tracing::subscriber::set_default(capture.clone());
    let reloader = reloader_of(&named("k", 1)).await;
    // A reload in progress (or hung) holds the turn.
    let turn = reloader.serial.lock().await;
    let queued = {
        let reloader = Arc::clone(&reloader);
        let request = ReloadRequest::new(config_of(&named("k", 2)), Trigger::Api);
        tokio::spawn(async move { reloader.reload(request).await })
    };
    // Every task on this thread runs until the reload waits for its turn.
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        capture.named("rewire.reload").is_empty(),
        "the reload's span started while it waited"
    );
    drop(turn);
    queued.await.expect("joins").expect("applies");

    let roots = capture.named("rewire.reload");
    assert_eq!(roots.len(), 1, "{roots:?}");
    let waited: u64 = field(&roots[0], "rewire.queued_ms")
        .and_then(|ms| ms.parse().ok())
        .unwrap_or_else(|| panic!("no rewire.queued_ms: {roots:?}"));
    assert!(waited >= 300, "rewire.queued_ms = {waited}");
    assert_eq!(field(&roots[0], "rewire.outcome"), Some("applied"));

    // A reload that did not wait says so.
    let request = ReloadRequest::new(config_of(&named("k", 3)), Trigger::Api);
    reloader.reload(request).await.expect("applies");
    let roots = capture.named("rewire.reload");
    let waited: u64 = field(&roots[1], "rewire.queued_ms")
        .and_then(|ms| ms.parse().ok())
        .unwrap_or(u64::MAX);
    assert!(waited < 300, "rewire.queued_ms = {waited}");
}

#[tokio::test]
async fn a_reload_refused_at_shutdown_has_an_outcome_on_its_span() {
    let capture = Capture::default();
    let _default = tracing::subscriber::set_default(capture.clone());
    let reloader = reloader_of(&named("k", 1)).await;
    reloader.stopped.cancel();
    let request = ReloadRequest::new(config_of(&named("k", 2)), Trigger::File);
    let result = reloader.reload(request).await;
    assert!(matches!(result, Err(ReloadError::Stopped)), "{result:?}");
    let roots = capture.named("rewire.reload");
    assert_eq!(roots.len(), 1, "{roots:?}");
    assert_eq!(field(&roots[0], "rewire.outcome"), Some("stopped"));
    assert_eq!(field(&roots[0], "rewire.generation"), Some("1"));
    assert_eq!(field(&roots[0], "otel.status_code"), None);
}

#[tokio::test]
async fn a_panicked_reload_is_recorded_on_its_own_span_not_a_second_trace() {
    let capture = Capture::default();
    let _default = tracing::subscriber::set_default(capture.clone());
    let reloader = reloader_of(&[]).await;
    let recording = record::Recording::start(Trigger::Api, 2);
    let traced = Arc::new(OnceLock::new());
    let task = tokio::spawn({
        let traced = Arc::clone(&traced);
        async move {
            // As `run` does once the reload has its turn.
            let _ = traced.set(trace::reload_span(&Trigger::Api, 2));
            if true {
                panic!("boom");
            }
            Err(ReloadError::Stopped)
        }
    });
    let result = reloader.joined(recording, &traced, task).await;
    assert!(
        matches!(result, Err(ReloadError::RolledBack(_))),
        "{result:?}"
    );
    let roots = capture.named("rewire.reload");
    assert_eq!(roots.len(), 1, "one reload, one root span: {roots:?}");
    assert_eq!(field(&roots[0], "rewire.outcome"), Some("rolled_back"));
    assert_eq!(field(&roots[0], "rewire.attempt"), Some("2"));
    assert_eq!(field(&roots[0], "otel.status_code"), Some("ERROR"));
    let message = field(&roots[0], "otel.status_description").unwrap_or_default();
    assert!(message.contains("the reload panicked: boom"), "{message}");
}

/// `custom/c` (`refusing`) at `rev`, `extra` adding metadata fields, and
/// `custom/k0`.
fn refusing_config(rev: u32, extra: &str) -> Config {
    let text = format!(
        r#"{{"components": {{"custom": {{
            "c": {{"type": "refusing", "metadata": {{"rev": {rev}{extra}}}}},
            "k0": {{"type": "ok"}}
        }}}}}}"#
    );
    parse(text.as_bytes()).unwrap_or_else(|p| panic!("{p}"))
}

#[tokio::test]
async fn an_update_left_to_the_commit_whose_rebuild_fails_there_is_failed_in_the_trace() {
    let capture = Capture::default();
    let _default = tracing::subscriber::set_default(capture.clone());
    let reloader = reloader_of_config(refusing_config(1, "")).await;

    // Left to the commit; there the update is refused and the rebuild's
    // init fails: the reload rolls back.
    let candidate = refusing_config(2, r#", "failInit": true"#);
    let result = reloader
        .reload(ReloadRequest::new(candidate, Trigger::Api))
        .await;
    let Err(ReloadError::RolledBack(failures)) = result else {
        panic!("the reload should roll back, got {result:?}");
    };
    let failed: Vec<String> = failures
        .iter()
        .filter_map(|f| f.component.as_ref().map(ToString::to_string))
        .collect();
    assert_eq!(failed, ["custom/c"], "{failures:?}");
    let record = &reloader.history()[0];
    assert_eq!(record.outcome, Outcome::RolledBack);
    let action = record.actions.get("custom/c");
    assert_eq!(action, Some(&Action::Failed), "{:?}", record.actions);

    // One span, failed: the undo does not take it for never made (kept).
    let spans = capture.component("custom/c");
    assert_eq!(spans.len(), 1, "{spans:?}");
    let span = &spans[0];
    assert_eq!(field(span, "rewire.action"), Some("failed"), "{span:?}");
    assert_eq!(field(span, "otel.status_code"), Some("ERROR"), "{span:?}");
    let message = field(span, "otel.status_description").unwrap_or_default();
    assert!(message.contains("refused to start"), "{message}");
}

/// A state store that stores nothing: something for [`Pair`] to hold.
#[derive(crate::Component)]
#[component(kind = "state", type = "reload_probe")]
struct ProbeStore {}

#[async_trait]
impl Component for ProbeStore {}

#[async_trait]
impl crate::StateStore for ProbeStore {
    async fn get(
        &self,
        _: crate::kinds::GetRequest,
    ) -> Result<Option<crate::kinds::StateEntry>, crate::kinds::StateError> {
        Ok(None)
    }
    async fn set(&self, _: crate::kinds::SetRequest) -> Result<(), crate::kinds::StateError> {
        Ok(())
    }
    async fn delete(&self, _: crate::kinds::DeleteRequest) -> Result<(), crate::kinds::StateError> {
        Ok(())
    }
}

/// Two unnamed fields of one kind: the componentRefs' order decides which
/// gets which store (a primary and its fail-over, say).
#[derive(crate::Component)]
#[component(kind = "custom", type = "pair")]
struct Pair {
    #[inject]
    first: crate::StateStoreHandle,
    #[inject]
    second: crate::StateStoreHandle,
}

#[async_trait]
impl Component for Pair {}

/// State stores `a` and `b`, and a [`Pair`] referencing them in `order`.
fn pair_config(order: [&str; 2]) -> Config {
    let refs: Vec<Value> = order
        .iter()
        .map(|name| serde_json::json!({ "type": "state", "name": name }))
        .collect();
    let text = serde_json::json!({ "components": {
        "state": { "a": { "type": "reload_probe" }, "b": { "type": "reload_probe" } },
        "custom": { "p": { "type": "pair", "componentRef": refs } }
    }})
    .to_string();
    parse(text.as_bytes()).unwrap_or_else(|p| panic!("{p}"))
}

#[tokio::test]
async fn reordered_component_refs_rebuild_the_component_with_its_fields_swapped() {
    let mut registry = registry();
    for (kind, type_name) in [("state", "reload_probe"), ("custom", "pair")] {
        let descriptor = Registry::collected().get(kind, type_name).copied();
        registry.register(
            descriptor.unwrap_or_else(|| panic!("the derive registers {kind}/{type_name}")),
        );
    }
    let reloader = reloader_with(registry, pair_config(["a", "b"])).await;
    let pair_key = crate::ComponentKey::new("custom", "p");
    let pair = crate::ComponentHandle::new(pair_key, reloader.running().live().clone());
    let first = || {
        let pair = pair.load_as::<Pair>().unwrap_or_else(|e| panic!("{e}"));
        pair.first.key().map(ToString::to_string)
    };
    assert_eq!(first().as_deref(), Some("state/a"));

    let record = reloader
        .reload(ReloadRequest::new(pair_config(["b", "a"]), Trigger::Api))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        record.actions.get("custom/p"),
        Some(&Action::Rebuilt),
        "{:?}",
        record.actions
    );
    assert_eq!(first().as_deref(), Some("state/b"), "the fail-over took");
}

/// `secret_store/vault` (type `fixed`, its `cert` the metadata's `value`,
/// with a `round` besides) and `users` components (type `user`) injected
/// its `cert`.
fn hub_config(users: usize, round: u64) -> Config {
    let mut custom = Map::new();
    for i in 0..users {
        let refs = serde_json::json!([
            {"store": "vault", "name": "cert", "key": "cert", "injectAs": "cert"}
        ]);
        custom.insert(
            format!("user-{i}"),
            serde_json::json!({"type": "user", "secretRef": refs}),
        );
    }
    let vault = serde_json::json!({"type": "fixed", "metadata": {"value": "v", "round": round}});
    let text = serde_json::json!({"components": {
        "secret_store": {"vault": vault},
        "custom": custom,
    }});
    parse(text.to_string().as_bytes()).unwrap_or_else(|p| panic!("{p}"))
}

/// A reload of a store many components use reaches each (their refs read
/// again) and finds them unchanged: its written record counts them, it
/// does not list them. Before: each was written `unchanged`, 300 entries
/// a record (4,000 users made a record of ~1 MB).
#[tokio::test]
async fn a_record_counts_the_components_its_reload_reached_and_found_unchanged() {
    const USERS: usize = 300;
    let registry = secret_rotation::registry();
    let redactor = crate::redact::Redactor::default();
    let reloader = secret_rotation::reloader_of(hub_config(USERS, 0), registry, &redactor).await;
    for round in 1..=3 {
        let request = ReloadRequest::new(hub_config(USERS, round), Trigger::Api);
        let record = reloader
            .reload(request)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        // In memory, each user is still acted on: reached, unchanged.
        assert_eq!(record.actions.acted().count(), USERS + 1, "round {round}");
        assert_eq!(
            record.actions.get("custom/user-7"),
            Some(&Action::Unchanged)
        );
        let written = serde_json::to_value(&record).unwrap_or_default();
        assert_eq!(
            written["actions"],
            serde_json::json!({"secret_store/vault": "rebuilt"}),
            "{written}"
        );
        assert_eq!(written["unchanged"], serde_json::json!(USERS), "{written}");
        let size = written.to_string().len();
        assert!(size < 512, "a record of {size} bytes");
    }
    reloader.shutdown(None).await;
}
