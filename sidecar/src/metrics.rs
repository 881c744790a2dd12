//! Prometheus metrics: reloads by outcome, reload duration, generation,
//! components by kind, requests and their latency by API and store (the
//! series of a store removed dropped at the next reload applied), and
//! circuit breakers by component.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use rewire_runtime::{Action, Outcome, ReloadRecord, Runtime};

use crate::result_code::ResultCode;

mod breakers;
mod label_text;
mod request_series;

use label_text::LabelText;
use request_series::RequestSeries;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReloadLabels {
    outcome: String,
    trigger: String,
}

/// Labels of the components of one kind: a custom kind is free text (as
/// its component's code names it), written escaped.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: LabelText<String>,
}

/// Labels of one request: all but the store are fixed names, and the
/// store's name is shared with the call, so counting a request copies no
/// string. The store's name is free text, written escaped.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    api: &'static str,
    method: &'static str,
    store: Option<LabelText<Arc<str>>>,
    code: ResultCode,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LatencyLabels {
    api: &'static str,
    method: &'static str,
}

/// Buckets of the request latency histogram, doubling from 50 µs.
const REQUEST_BUCKETS: u16 = 22;

/// The sidecar's metrics registry.
pub struct ApiMetrics {
    registry: Mutex<Registry>,
    reloads: Family<ReloadLabels, Counter>,
    reload_seconds: Histogram,
    generation: Gauge,
    components: Family<KindLabels, Gauge>,
    requests: Family<RequestLabels, Counter>,
    request_seconds: Family<LatencyLabels, Histogram>,
    /// Both request families' series by label set, for the hot path.
    request_series: RequestSeries,
    subscribers_dropped: Counter,
    breakers: breakers::BreakerMetrics,
    /// The uploads running (both servers'), counted against
    /// `ApiOptions::max_uploads`.
    uploads: crate::upload_slots::UploadSlots,
    /// The downloads running (both servers'), counted against
    /// `ApiOptions::max_downloads`.
    downloads: crate::connection::DownloadSlots,
}

impl std::fmt::Debug for ApiMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiMetrics")
    }
}

impl Default for ApiMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl ApiMetrics {
    /// A registry with every metric registered.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("rewire");
        let reloads = Family::<ReloadLabels, Counter>::default();
        // 0.5 ms to 65.5 s: a rebuild may take the init timeout and the
        // readiness timeout (30 s + 10 s by default) before it fails.
        let reload_seconds = Histogram::new(exponential_buckets(0.0005, 2.0, 18));
        let generation = Gauge::default();
        let components = Family::<KindLabels, Gauge>::default();
        let requests = Family::<RequestLabels, Counter>::default();
        // 50 µs to 105 s: a call that times out (30 s by default, a
        // Lifecycle push 45 s) lands in a bucket of its own, not in `+Inf`
        // where every percentile past it would read the top bucket.
        let request_seconds = Family::<LatencyLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.00005, 2.0, REQUEST_BUCKETS))
        });
        registry.register("reloads", "Reloads by outcome and trigger", reloads.clone());
        registry.register(
            "reload_duration_seconds",
            "Duration of reload transactions",
            reload_seconds.clone(),
        );
        registry.register(
            "generation",
            "The generation of the component set serving",
            generation.clone(),
        );
        registry.register(
            "components",
            "Running components by kind",
            components.clone(),
        );
        registry.register(
            "requests",
            "API requests by API, method, store and result code",
            requests.clone(),
        );
        registry.register(
            "request_duration_seconds",
            "API request latency by API and method",
            request_seconds.clone(),
        );
        let subscribers_dropped = Counter::default();
        registry.register(
            "config_subscribers_dropped",
            "Configuration subscribers dropped for falling behind (bytes or messages queued)",
            subscribers_dropped.clone(),
        );
        let breakers = breakers::BreakerMetrics::register(&mut registry);
        crate::telemetry::stats().register(&mut registry);
        Self {
            breakers,
            subscribers_dropped,
            registry: Mutex::new(registry),
            reloads,
            reload_seconds,
            generation,
            components,
            requests,
            request_seconds,
            request_series: RequestSeries::default(),
            uploads: crate::upload_slots::UploadSlots::default(),
            downloads: crate::connection::DownloadSlots::default(),
        }
    }

    /// The uploads running, HTTP file `PUT`s and Layotto `PutFile`s
    /// together: each takes a place for as long as it runs.
    pub fn uploads(&self) -> &crate::upload_slots::UploadSlots {
        &self.uploads
    }

    /// The downloads running, HTTP file `GET`s and Layotto `GetFile`s
    /// together: each takes a place until its reader is let go of.
    pub fn downloads(&self) -> &crate::connection::DownloadSlots {
        &self.downloads
    }

    /// Counts every reload of `runtime` from now on (in the background).
    pub fn follow_reloads(self: &std::sync::Arc<Self>, runtime: &Runtime) {
        let mut events = runtime.reload_events();
        let metrics = std::sync::Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                let record = match events.recv().await {
                    Ok(record) => record,
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                };
                let Some(metrics) = metrics.upgrade() else {
                    return;
                };
                let outcome = serde_json::to_value(record.outcome)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default();
                metrics
                    .reloads
                    .get_or_create(&ReloadLabels {
                        outcome,
                        trigger: record.trigger.to_string(),
                    })
                    .inc();
                #[allow(clippy::cast_precision_loss)]
                metrics
                    .reload_seconds
                    .observe(record.duration_ms as f64 / 1000.0);
                metrics.forget_stores_gone(&record);
            }
        });
    }

    /// After a reload applied, drops the request series of every store no
    /// longer serving, whether labelled by its name or, by the Lifecycle
    /// API, by its `kind/name` key: a record names every component serving
    /// after it (and those it removed), so a record missed (the events
    /// lagged) is made up for by the next one.
    fn forget_stores_gone(&self, record: &ReloadRecord) {
        if record.outcome != Outcome::Applied {
            return;
        }
        let serving = record
            .actions
            .iter()
            .filter(|(_, action)| **action != Action::Removed)
            .map(|(key, _)| key);
        self.request_series.retain_serving(serving, &self.requests);
    }

    /// Counts one configuration subscriber dropped for falling behind.
    pub fn subscriber_dropped(&self) {
        self.subscribers_dropped.inc();
    }

    /// Records one API request.
    pub fn observe_request(
        &self,
        api: &'static str,
        method: &'static str,
        store: Option<Arc<str>>,
        code: ResultCode,
        elapsed: Duration,
    ) {
        let labels = RequestLabels {
            api,
            method,
            store: store.map(LabelText),
            code,
        };
        let series = self
            .request_series
            .of(labels, &self.requests, &self.request_seconds);
        series.count.inc();
        series.seconds.observe(elapsed.as_secs_f64());
    }

    /// The Prometheus text exposition, with the generation and component
    /// counts taken from `runtime` now.
    ///
    /// The registry's lock is held from the refresh of those gauges to the
    /// end of the encoding: a concurrent scrape clearing and refilling them
    /// cannot show its half-filled families in this one's text.
    pub fn render(&self, runtime: &Runtime) -> String {
        let registry = self.registry.lock().unwrap_or_else(|p| p.into_inner());
        let generation = runtime.generation();
        self.generation
            .set(i64::try_from(generation.number).unwrap_or(i64::MAX));
        self.components.clear();
        for (key, _) in generation.iter() {
            self.components
                .get_or_create(&KindLabels {
                    kind: LabelText(key.kind.to_string()),
                })
                .inc();
        }
        self.breakers.refresh(&generation);
        let mut out = String::new();
        if encode(&mut out, &registry).is_err() {
            out.clear();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use rewire_runtime::config::{parse, validate};
    use rewire_runtime::prelude::async_trait;
    use rewire_runtime::{
        Component, PubSub, PubSubError, PubSubSubscription, PublishRequest, Registry,
        RuntimeOptions, SubscribeRequest,
    };

    use super::*;

    /// A broker that does nothing: components to count.
    #[derive(rewire_runtime::Component, Default)]
    #[component(kind = "pubsub", type = "test.metrics.idle")]
    struct IdleBroker {}

    #[async_trait]
    impl Component for IdleBroker {}

    #[async_trait]
    impl PubSub for IdleBroker {
        async fn publish(&self, _: PublishRequest) -> Result<(), PubSubError> {
            Ok(())
        }

        async fn subscribe(&self, _: SubscribeRequest) -> Result<PubSubSubscription, PubSubError> {
            Ok(PubSubSubscription::channel(1).0)
        }
    }

    #[test]
    fn a_reload_as_long_as_the_start_timeouts_has_a_bucket_of_its_own() {
        let timeouts = rewire_runtime::StartTimeouts::default();
        let longest = (timeouts.init + timeouts.ready).as_secs_f64();
        let metrics = ApiMetrics::new();
        metrics.reload_seconds.observe(longest);
        let mut text = String::new();
        encode(&mut text, &metrics.registry.lock().unwrap()).unwrap();
        // The first bucket holding it is a finite one (`le` past it).
        let first = text
            .lines()
            .filter_map(|line| line.strip_prefix("rewire_reload_duration_seconds_bucket{le=\""))
            .find(|line| line.ends_with("} 1"))
            .and_then(|line| line.split_once('"'))
            .map(|(le, _)| le.to_string());
        let first = first.unwrap_or_else(|| panic!("no bucket counts it:\n{text}"));
        assert_ne!(first, "+Inf", "{text}");
        assert!(first.parse::<f64>().unwrap() >= longest, "{text}");
    }

    /// A call as long as the API's longest wait (the request timeout, a
    /// Lifecycle push's) counts in a finite bucket at least as long.
    #[test]
    fn a_request_as_long_as_the_api_timeouts_has_a_bucket_of_its_own() {
        let options = crate::ApiOptions::default();
        let longest = options.request_timeout.max(options.push_timeout);
        let metrics = ApiMetrics::new();
        let code = ResultCode::Grpc("DEADLINE_EXCEEDED");
        metrics.observe_request("grpc", "PublishEvent", None, code, longest);
        let mut text = String::new();
        encode(&mut text, &metrics.registry.lock().unwrap()).unwrap();
        let first = text
            .lines()
            .filter(|line| line.starts_with("rewire_request_duration_seconds_bucket{"))
            .find(|line| line.ends_with("} 1"))
            .and_then(|line| line.split_once("le=\""))
            .and_then(|(_, le)| le.split_once('"'))
            .map(|(le, _)| le.to_string());
        let first = first.unwrap_or_else(|| panic!("no bucket counts it:\n{text}"));
        assert_ne!(first, "+Inf", "{text}");
        assert!(
            first.parse::<f64>().unwrap() >= longest.as_secs_f64(),
            "{text}"
        );
    }

    /// A store's, a component's and a policy's names may hold `"` and `\`
    /// (validation refuses only control characters and `/`): written as
    /// is, one such label made Prometheus refuse the whole exposition.
    #[tokio::test]
    async fn free_text_label_values_are_escaped() {
        let json = serde_json::json!({
            "components": {"pubsub": {"a\"b\\": {"type": "test.metrics.idle"}}},
            "resiliency": {
                "policies": {"circuitBreakers": {
                    "c\"p\\": {"trip": "consecutiveFailures >= 2", "timeout": "60s"}
                }},
                "targets": {"components": {"a\"b\\": {"outbound": {"circuitBreaker": "c\"p\\"}}}}
            }
        });
        let file = parse(json.to_string().as_bytes()).unwrap_or_else(|p| panic!("{p}"));
        let registry = Registry::collected();
        let config = validate(file, &registry).unwrap_or_else(|p| panic!("{p}"));
        let runtime = Runtime::start(config, registry, RuntimeOptions::default())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let metrics = ApiMetrics::new();
        let store = Some(Arc::from("a\"b\\"));
        let code = ResultCode::Http(200);
        metrics.observe_request("http", "GetState", store, code, Duration::ZERO);
        let text = metrics.render(&runtime);
        runtime.shutdown().await;
        assert!(
            text.contains(r#"method="GetState",store="a\"b\\",code="200"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(
                r#"rewire_circuit_breaker_state{component="pubsub/a\"b\\",policy="c\"p\\",direction="outbound"} 0"#
            ),
            "{text}"
        );
    }

    /// A component of a custom kind whose name holds `"` and `\`, as its
    /// code may spell it.
    #[derive(rewire_runtime::Component, Default)]
    #[component(kind = "odd\"kind\\", type = "test.metrics.odd")]
    struct OddKind {}

    #[async_trait]
    impl Component for OddKind {}

    /// A custom kind's name is free text, written escaped in the
    /// components gauge: written as is, one such kind made Prometheus
    /// refuse the whole exposition.
    #[tokio::test]
    async fn a_custom_kind_label_is_escaped() {
        let json = serde_json::json!({
            "components": {"odd\"kind\\": {"x": {"type": "test.metrics.odd"}}}
        });
        let file = parse(json.to_string().as_bytes()).unwrap_or_else(|p| panic!("{p}"));
        let registry = Registry::collected();
        let config = validate(file, &registry).unwrap_or_else(|p| panic!("{p}"));
        let runtime = Runtime::start(config, registry, RuntimeOptions::default())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let text = ApiMetrics::new().render(&runtime);
        runtime.shutdown().await;
        assert!(
            text.contains(r#"rewire_components{kind="odd\"kind\\"} 1"#),
            "{text}"
        );
    }

    /// The configuration of idle brokers named `names`.
    fn brokers(names: &[&str]) -> rewire_runtime::config::Config {
        let brokers: serde_json::Map<String, serde_json::Value> = names
            .iter()
            .map(|name| {
                (
                    name.to_string(),
                    serde_json::json!({"type": "test.metrics.idle"}),
                )
            })
            .collect();
        let json = serde_json::json!({"components": {"pubsub": brokers}});
        parse(json.to_string().as_bytes()).unwrap_or_else(|p| panic!("{p}"))
    }

    /// A runtime serving idle brokers named `names`, and metrics following
    /// its reloads.
    async fn following(names: &[&str]) -> (Runtime, Arc<ApiMetrics>) {
        let registry = Registry::collected();
        let config = validate(brokers(names), &registry).unwrap_or_else(|p| panic!("{p}"));
        let runtime = Runtime::start(config, registry, RuntimeOptions::default())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let metrics = Arc::new(ApiMetrics::new());
        metrics.follow_reloads(&runtime);
        (runtime, metrics)
    }

    /// Applies brokers named `names` to `runtime`, then waits (10 s at
    /// most) for `metrics` to drop the series `gone` (the reload's event
    /// reaches them in the background); returns the text rendered then.
    async fn apply_and_wait_dropped(
        runtime: &Runtime,
        metrics: &ApiMetrics,
        names: &[&str],
        gone: &str,
    ) -> String {
        let record = runtime.apply(brokers(names)).await;
        let record = record.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(record.outcome, Outcome::Applied);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let mut text = metrics.render(runtime);
        while text.contains(gone) {
            assert!(
                std::time::Instant::now() < deadline,
                "{gone} never dropped:\n{text}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
            text = metrics.render(runtime);
        }
        text
    }

    /// The series of a `GetState` call on `store`, counted once.
    fn state_series(store: &str) -> String {
        format!(r#"method="GetState",store="{store}",code="200"}} 1"#)
    }

    /// The series of a Lifecycle `ApplyConfiguration` call labelled
    /// `key` (`kind/name`), counted once.
    fn lifecycle_series(key: &str) -> String {
        format!(r#"method="ApplyConfiguration",store="{key}",code="OK"}} 1"#)
    }

    /// Counts one Lifecycle `ApplyConfiguration` call labelled `key`.
    fn observe_lifecycle(metrics: &ApiMetrics, key: &str) {
        let code = ResultCode::Grpc("OK");
        let store = Some(Arc::from(key));
        metrics.observe_request("grpc", "ApplyConfiguration", store, code, Duration::ZERO);
    }

    /// Names pushed and renamed one after another would each keep their
    /// series for ever: a reload applied drops those of stores gone, and
    /// keeps the others' counts.
    #[tokio::test]
    async fn a_reload_drops_the_request_series_of_stores_no_longer_serving() {
        let (runtime, metrics) = following(&["old", "kept"]).await;
        let code = ResultCode::Http(200);
        for store in ["old", "kept"] {
            let store = Some(Arc::from(store));
            metrics.observe_request("http", "GetState", store, code, Duration::ZERO);
        }
        let text = metrics.render(&runtime);
        assert!(text.contains(&state_series("old")), "{text}");

        let text =
            apply_and_wait_dropped(&runtime, &metrics, &["kept", "new"], &state_series("old"))
                .await;
        runtime.shutdown().await;
        assert!(text.contains(&state_series("kept")), "{text}");
        assert_eq!(
            metrics.request_series.len(),
            1,
            "the index let go of it too"
        );
    }

    /// The Lifecycle API labels its calls with the component's key,
    /// `kind/name`: matched against names only, every such series was
    /// dropped at every reload applied (a push is one), so its counters
    /// restarted after almost every call.
    #[tokio::test]
    async fn a_reload_keeps_the_lifecycle_series_of_components_still_serving() {
        let (runtime, metrics) = following(&["old", "kept"]).await;
        observe_lifecycle(&metrics, "pubsub/kept");
        // Dropped by the same handling of the reload's event: once it is
        // gone, that event was handled.
        let store = Some(Arc::from("old"));
        let code = ResultCode::Http(200);
        metrics.observe_request("http", "GetState", store, code, Duration::ZERO);

        let text =
            apply_and_wait_dropped(&runtime, &metrics, &["kept", "new"], &state_series("old"))
                .await;
        runtime.shutdown().await;
        assert!(text.contains(&lifecycle_series("pubsub/kept")), "{text}");
        assert_eq!(metrics.request_series.len(), 1, "{text}");
    }

    /// The Lifecycle series of a component removed go with it, those of
    /// the components still serving stay.
    #[tokio::test]
    async fn a_reload_drops_the_lifecycle_series_of_components_removed() {
        let (runtime, metrics) = following(&["old", "kept"]).await;
        for key in ["pubsub/old", "pubsub/kept"] {
            observe_lifecycle(&metrics, key);
        }
        let text = metrics.render(&runtime);
        assert!(text.contains(&lifecycle_series("pubsub/old")), "{text}");

        let gone = lifecycle_series("pubsub/old");
        let text = apply_and_wait_dropped(&runtime, &metrics, &["kept", "new"], &gone).await;
        runtime.shutdown().await;
        assert!(text.contains(&lifecycle_series("pubsub/kept")), "{text}");
        assert_eq!(metrics.request_series.len(), 1, "{text}");
    }

    /// Components of the test's configuration.
    const BROKERS: usize = 64;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_scrapes_each_show_every_component() {
        let brokers: serde_json::Map<String, serde_json::Value> = (0..BROKERS)
            .map(|i| {
                let broker = serde_json::json!({"type": "test.metrics.idle"});
                (format!("b{i}"), broker)
            })
            .collect();
        let json = serde_json::json!({"components": {"pubsub": brokers}});
        let file = parse(json.to_string().as_bytes()).unwrap_or_else(|p| panic!("{p}"));
        let registry = Registry::collected();
        let config = validate(file, &registry).unwrap_or_else(|p| panic!("{p}"));
        let runtime = Runtime::start(config, registry, RuntimeOptions::default())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let metrics = ApiMetrics::new();
        let expected = format!("rewire_components{{kind=\"pubsub\"}} {BROKERS}\n");
        // Each scrape clears the gauges and counts the components again;
        // another scrape encoding meanwhile saw a part of them, or none.
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    for _ in 0..300 {
                        let text = metrics.render(&runtime);
                        assert!(text.contains(&expected), "{text}");
                    }
                });
            }
        });
        runtime.shutdown().await;
    }
}
