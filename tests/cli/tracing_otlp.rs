//! Distributed tracing end to end: `rewire run` exporting to an in-test
//! OTLP/HTTP receiver. A call carrying a `traceparent` yields spans of that
//! trace for the API call and its redis command; a reload is a trace of
//! its own with a span per component action; the config file's `tracing`
//! section turns export on without a restart; a reload is traced even
//! when requests are sampled at rate 0. A call's span names the generation
//! that served it. No span attribute holds a secret. A program hosting
//! the runtime as a library (`Host`) exports its reloads alike. A call the
//! server failed (HTTP 5xx, gRPC `INTERNAL`...) is an error span with its
//! code; a call refused for its token makes no span.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::routing::post;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use rewire::sidecar::grpc::proto::dapr::proto::common::v1::StateItem;
use rewire::sidecar::grpc::proto::dapr::proto::runtime::v1::dapr_client::DaprClient;
use rewire::sidecar::grpc::proto::dapr::proto::runtime::v1::{GetStateRequest, SaveStateRequest};
use testkit::redis::RedisServer;
use testkit::{free_port, ChildProcess};

const PASSWORD: &str = "trace-secret-4711";
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";
const WAIT: Duration = Duration::from_secs(30);

/// An OTLP/HTTP receiver keeping every span it is sent.
struct Receiver {
    addr: SocketAddr,
    spans: Arc<Mutex<Vec<Span>>>,
}

impl Receiver {
    async fn start() -> Self {
        let spans: Arc<Mutex<Vec<Span>>> = Arc::default();
        let kept = spans.clone();
        let app = axum::Router::new().route(
            "/v1/traces",
            post(move |body: Bytes| {
                let kept = kept.clone();
                async move {
                    let request = ExportTraceServiceRequest::decode(body).unwrap();
                    let mut kept = kept.lock().unwrap();
                    for resource in request.resource_spans {
                        for scope in resource.scope_spans {
                            kept.extend(scope.spans);
                        }
                    }
                    (
                        [("content-type", "application/x-protobuf")],
                        Vec::<u8>::new(),
                    )
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self { addr, spans }
    }

    /// Waits until `found` finds what it looks for in the spans received.
    async fn wait_for<T>(&self, what: &str, found: impl Fn(&[Span]) -> Option<T>) -> T {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            if let Some(result) = found(&self.spans.lock().unwrap()) {
                return result;
            }
            if tokio::time::Instant::now() > deadline {
                let names: Vec<String> = self.all().iter().map(|s| s.name.clone()).collect();
                panic!("no {what} within {WAIT:?}; spans received: {names:?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn all(&self) -> Vec<Span> {
        self.spans.lock().unwrap().clone()
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn attribute(span: &Span, key: &str) -> Option<String> {
    span.attributes.iter().find(|a| a.key == key).and_then(|a| {
        match a.value.as_ref()?.value.as_ref()? {
            AnyValue::StringValue(s) => Some(s.clone()),
            AnyValue::IntValue(i) => Some(i.to_string()),
            AnyValue::BoolValue(b) => Some(b.to_string()),
            AnyValue::DoubleValue(d) => Some(d.to_string()),
            _ => None,
        }
    })
}

fn start(config: &Path, http: &str, otlp: Option<SocketAddr>) -> ChildProcess {
    let grpc = format!("127.0.0.1:{}", free_port());
    start_batching(config, http, &grpc, otlp, "100")
}

/// [`start`] on `grpc`, exporting a batch every `delay_ms` milliseconds.
fn start_batching(
    config: &Path,
    http: &str,
    grpc: &str,
    otlp: Option<SocketAddr>,
    delay_ms: &'static str,
) -> ChildProcess {
    start_guarded(config, http, grpc, otlp, delay_ms, None)
}

/// [`start_batching`], its API guarded by the app token `token` when one
/// is given (`DAPR_API_TOKEN`).
fn start_guarded(
    config: &Path,
    http: &str,
    grpc: &str,
    otlp: Option<SocketAddr>,
    delay_ms: &'static str,
    token: Option<&'static str>,
) -> ChildProcess {
    let log = config.with_extension("log");
    let (config, http, grpc) = (config.to_path_buf(), http.to_string(), grpc.to_string());
    let mut sidecar = ChildProcess::new("rewire run", log, move || {
        let mut command = Command::new(env!("CARGO_BIN_EXE_rewire"));
        command
            .args([
                "run",
                "--grpc-addr",
                &grpc,
                "--http-addr",
                &http,
                "--config",
            ])
            .arg(&config)
            .env("NO_COLOR", "1")
            .env("OTEL_BSP_SCHEDULE_DELAY", delay_ms)
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            .env_remove("OTEL_TRACES_SAMPLER")
            .env_remove("DAPR_API_TOKEN");
        if let Some(otlp) = otlp {
            command.env("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{otlp}"));
        }
        if let Some(token) = token {
            command.env("DAPR_API_TOKEN", token);
        }
        command
    });
    if let Err(err) = sidecar.start_until_logged(WAIT, "Sidecar APIs listening.") {
        panic!("sidecar did not start: {err}");
    }
    sidecar
}

/// The `GetState` span of trace `trace_id` and its redis command's span,
/// once both arrived.
fn get_state_and_redis(spans: &[Span], trace_id: &str) -> Option<(Span, Span)> {
    let traced: Vec<&Span> = spans
        .iter()
        .filter(|s| hex(&s.trace_id) == trace_id)
        .collect();
    let api = traced.iter().find(|s| s.name == "GetState")?;
    let redis = traced
        .iter()
        .find(|s| attribute(s, "db.system").as_deref() == Some("redis"))?;
    Some(((*api).clone(), (*redis).clone()))
}

fn assert_no_secret(spans: &[Span]) {
    for span in spans {
        for a in &span.attributes {
            let value = format!("{:?}", a.value);
            assert!(
                !value.contains(PASSWORD),
                "secret in span {}: {}",
                span.name,
                a.key
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_with_a_traceparent_continues_the_trace_down_to_redis() {
    let receiver = Receiver::start().await;
    let redis = RedisServer::start_with_password(PASSWORD).await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("rewire.json");
    let json = serde_json::json!({
        "appId": "traced",
        "components": {"state": {"orders": {"type": "redis", "metadata": {
            "redisHost": redis.addr(), "redisPassword": PASSWORD
        }}}}
    });
    std::fs::write(&config, json.to_string()).unwrap();
    let http = format!("127.0.0.1:{}", free_port());
    let grpc = format!("127.0.0.1:{}", free_port());
    let _sidecar = start_batching(&config, &http, &grpc, Some(receiver.addr), "100");

    rewire::sidecar::tls::install_ring_provider();
    let answer = testkit::http_client()
        .get(format!("http://{http}/v1.0/state/orders/order-1"))
        .header("traceparent", format!("00-{TRACE_ID}-{CALLER_SPAN}-01"))
        .send()
        .await
        .unwrap();
    assert!(answer.status().is_success(), "{}", answer.status());

    let (api, redis_span) = receiver
        .wait_for("API and redis spans of the caller's trace", |spans| {
            get_state_and_redis(spans, TRACE_ID)
        })
        .await;
    assert_eq!(
        hex(&api.parent_span_id),
        CALLER_SPAN,
        "the API span continues the caller's"
    );
    assert_eq!(
        attribute(&api, "rewire.component").as_deref(),
        Some("state/orders")
    );
    assert_eq!(
        attribute(&api, "rewire.component_type").as_deref(),
        Some("redis")
    );
    assert_eq!(
        redis_span.parent_span_id, api.span_id,
        "the redis command is a child of the call"
    );
    assert!(redis_span.name.starts_with("redis "), "{}", redis_span.name);

    // The same over gRPC: `traceparent` in the call's metadata.
    const GRPC_TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
    const GRPC_CALLER: &str = "b7ad6b7169203331";
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{grpc}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = DaprClient::new(channel);
    let mut request = tonic::Request::new(GetStateRequest {
        store_name: "orders".into(),
        key: "order-1".into(),
        ..GetStateRequest::default()
    });
    request.metadata_mut().insert(
        "traceparent",
        format!("00-{GRPC_TRACE}-{GRPC_CALLER}-01").parse().unwrap(),
    );
    client.get_state(request).await.unwrap();
    let (api, redis_span) = receiver
        .wait_for("gRPC API and redis spans of the caller's trace", |spans| {
            get_state_and_redis(spans, GRPC_TRACE)
        })
        .await;
    assert_eq!(hex(&api.parent_span_id), GRPC_CALLER);
    assert_eq!(attribute(&api, "rpc.system").as_deref(), Some("grpc"));
    assert_eq!(redis_span.parent_span_id, api.span_id);
    assert_no_secret(&receiver.all());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_layotto_configuration_subscription_continues_the_callers_trace() {
    use rewire::sidecar::grpc::proto::spec::proto::runtime::v1::runtime_client::RuntimeClient;
    use rewire::sidecar::grpc::proto::spec::proto::runtime::v1::SubscribeConfigurationRequest;
    const STREAM_TRACE: &str = "5bf92f3577b34da6a3ce929d0e0e4737";
    const STREAM_CALLER: &str = "c7ad6b7169203332";
    let receiver = Receiver::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("rewire.json");
    let json = serde_json::json!({
        "appId": "traced",
        "components": {"config_store": {"settings": {"type": "memory"}}}
    });
    std::fs::write(&config, json.to_string()).unwrap();
    let http = format!("127.0.0.1:{}", free_port());
    let grpc = format!("127.0.0.1:{}", free_port());
    let _sidecar = start_batching(&config, &http, &grpc, Some(receiver.addr), "100");

    let channel = tonic::transport::Endpoint::from_shared(format!("http://{grpc}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = RuntimeClient::new(channel);
    let (requests, outgoing) = tokio::sync::mpsc::channel(1);
    let mut request = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(outgoing));
    request.metadata_mut().insert(
        "traceparent",
        format!("00-{STREAM_TRACE}-{STREAM_CALLER}-01")
            .parse()
            .unwrap(),
    );
    let answers = client.subscribe_configuration(request).await.unwrap();
    requests
        .send(SubscribeConfigurationRequest {
            store_name: "settings".into(),
            keys: vec!["timeout".into()],
            ..SubscribeConfigurationRequest::default()
        })
        .await
        .unwrap();
    // The subscription made on the stream is a span of the caller's trace,
    // a child of its span, naming the store (exported once it is in
    // place, while the stream stays open).
    let span = receiver
        .wait_for("the subscription's span in the caller's trace", |spans| {
            spans
                .iter()
                .find(|s| {
                    hex(&s.trace_id) == STREAM_TRACE && s.name == "layotto.SubscribeConfiguration"
                })
                .cloned()
        })
        .await;
    assert_eq!(hex(&span.parent_span_id), STREAM_CALLER);
    assert_eq!(attribute(&span, "rpc.system").as_deref(), Some("grpc"));
    assert_eq!(
        attribute(&span, "rewire.component").as_deref(),
        Some("config_store/settings")
    );
    drop((answers, requests));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_file_turns_export_on_and_a_reload_is_one_trace_of_its_actions() {
    let receiver = Receiver::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("rewire.json");
    let memory =
        |ttl: u32| serde_json::json!({"type": "memory", "metadata": {"defaultTtlInSeconds": ttl}});
    let write = |components: serde_json::Value, tracing: Option<serde_json::Value>| {
        let mut json =
            serde_json::json!({"appId": "reloaded", "components": {"state": components}});
        if let Some(tracing) = tracing {
            json["tracing"] = tracing;
        }
        std::fs::write(&config, json.to_string()).unwrap();
    };
    let kept =
        serde_json::json!({"kept": memory(10), "changed": memory(10), "removed": memory(10)});
    write(kept.clone(), None);
    let http = format!("127.0.0.1:{}", free_port());
    // No OTEL_* variable: only the file's section turns export on.
    let sidecar = start(&config, &http, None);

    let tracing = serde_json::json!({
        "samplingRate": "1",
        "otel": {"endpointAddress": receiver.addr.to_string(), "protocol": "http", "isSecure": false}
    });
    write(kept, Some(tracing.clone()));
    wait_logged(&sidecar, "Tracing: exporting spans over OTLP.").await;

    write(
        serde_json::json!({"kept": memory(10), "changed": memory(20), "added": memory(10)}),
        Some(tracing),
    );
    let (root, children) = receiver
        .wait_for("a reload trace with every component action", |spans| {
            let root = spans.iter().find(|s| {
                s.name == "rewire.reload"
                    && attribute(s, "rewire.outcome").as_deref() == Some("applied")
            })?;
            let children: BTreeMap<String, String> = spans
                .iter()
                .filter(|s| s.trace_id == root.trace_id && s.parent_span_id == root.span_id)
                .filter_map(|s| {
                    Some((
                        attribute(s, "rewire.component")?,
                        attribute(s, "rewire.action")?,
                    ))
                })
                .collect();
            (children.len() == 4).then(|| (root.clone(), children))
        })
        .await;
    assert!(
        root.parent_span_id.is_empty(),
        "a reload starts its own trace"
    );
    assert_eq!(attribute(&root, "rewire.trigger").as_deref(), Some("file"));
    assert_eq!(children["state/kept"], "kept");
    assert_eq!(children["state/added"], "added");
    assert_eq!(children["state/removed"], "removed");
    assert!(
        ["in_place", "rebuilt"].contains(&children["state/changed"].as_str()),
        "{children:?}"
    );
}

/// A reload is traced whatever the sampler says of calls; a rejected one
/// is a root span with status `ERROR` described by its error (before,
/// the description went to an `otel.status_message` attribute, which
/// tracing-opentelemetry does not read: the status had none).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_is_traced_even_when_requests_are_not_sampled() {
    let receiver = Receiver::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("rewire.json");
    // Requests sampled at rate 0: no new trace of a call is kept.
    let tracing = serde_json::json!({
        "samplingRate": "0",
        "otel": {"endpointAddress": receiver.addr.to_string(), "protocol": "http", "isSecure": false}
    });
    let write_typed = |type_name: &str, ttl: u32| {
        let json = serde_json::json!({
            "appId": "unsampled",
            "tracing": tracing,
            "components": {"state": {"cache": {"type": type_name, "metadata": {"defaultTtlInSeconds": ttl}}}}
        });
        std::fs::write(&config, json.to_string()).unwrap();
    };
    let write = |ttl: u32| write_typed("memory", ttl);
    write(10);
    let http = format!("127.0.0.1:{}", free_port());
    let sidecar = start(&config, &http, None);
    wait_logged(&sidecar, "Tracing: exporting spans over OTLP.").await;

    write(20);
    let (root, child) = receiver
        .wait_for("the reload's trace with its component span", |spans| {
            let root = spans.iter().find(|s| {
                s.name == "rewire.reload"
                    && attribute(s, "rewire.outcome").as_deref() == Some("applied")
            })?;
            let child = spans.iter().find(|s| {
                s.trace_id == root.trace_id
                    && s.parent_span_id == root.span_id
                    && attribute(s, "rewire.component").as_deref() == Some("state/cache")
            })?;
            Some((root.clone(), child.clone()))
        })
        .await;
    assert!(
        root.parent_span_id.is_empty(),
        "a reload starts its own trace"
    );
    assert_eq!(child.name, "rewire.component");

    write_typed("no-such-type", 20);
    let rejected = receiver
        .wait_for("the rejected reload's span", |spans| {
            spans
                .iter()
                .find(|s| {
                    s.name == "rewire.reload"
                        && attribute(s, "rewire.outcome").as_deref() == Some("rejected")
                })
                .cloned()
        })
        .await;
    assert!(rejected.parent_span_id.is_empty(), "{rejected:?}");
    let (code, description) = status_of(&rejected);
    assert_eq!(code, STATUS_ERROR, "{rejected:?}");
    assert!(description.contains("no-such-type"), "{rejected:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_still_queued_at_shutdown_are_exported() {
    let receiver = Receiver::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("rewire.json");
    let json = serde_json::json!({
        "appId": "flushed",
        "components": {"state": {"cache": {"type": "memory"}}}
    });
    std::fs::write(&config, json.to_string()).unwrap();
    let http = format!("127.0.0.1:{}", free_port());
    // Batches every 10 minutes: only the shutdown's flush sends the span.
    let grpc = format!("127.0.0.1:{}", free_port());
    let mut sidecar = start_batching(&config, &http, &grpc, Some(receiver.addr), "600000");
    rewire::sidecar::tls::install_ring_provider();
    let answer = testkit::http_client()
        .get(format!("http://{http}/v1.0/state/cache/k"))
        .header("traceparent", format!("00-{TRACE_ID}-{CALLER_SPAN}-01"))
        .send()
        .await
        .unwrap();
    assert!(answer.status().is_success(), "{}", answer.status());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        receiver.all().iter().all(|s| hex(&s.trace_id) != TRACE_ID),
        "exported before shutdown: the batch delay did not hold"
    );

    let status = tokio::task::spawn_blocking(move || {
        let status = sidecar.terminate_within(Duration::from_secs(20));
        (status, sidecar)
    })
    .await
    .unwrap();
    let (status, sidecar) = status;
    let status = status.unwrap_or_else(|e| panic!("{e}\n{}", sidecar.log_tail()));
    assert!(status.success(), "{status}\n{}", sidecar.log_tail());
    let api = receiver
        .all()
        .into_iter()
        .find(|s| hex(&s.trace_id) == TRACE_ID && s.name == "GetState");
    let api = api.unwrap_or_else(|| {
        panic!(
            "the call's span was not exported at shutdown\n{}",
            sidecar.log_tail()
        )
    });
    assert_eq!(hex(&api.parent_span_id), CALLER_SPAN);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_span_names_the_generation_that_served_it_across_a_reload() {
    let receiver = Receiver::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("rewire.json");
    let write = |ttl: u32| {
        let json = serde_json::json!({
            "appId": "generations",
            "components": {"state": {"orders": {"type": "memory", "metadata": {"defaultTtlInSeconds": ttl}}}}
        });
        std::fs::write(&config, json.to_string()).unwrap();
    };
    write(10);
    let http = format!("127.0.0.1:{}", free_port());
    let grpc = format!("127.0.0.1:{}", free_port());
    let _sidecar = start_batching(&config, &http, &grpc, Some(receiver.addr), "100");
    rewire::sidecar::tls::install_ring_provider();
    let client = testkit::http_client();
    let get_state = |trace_id: &'static str| {
        let request = client
            .get(format!("http://{http}/v1.0/state/orders/order-1"))
            .header("traceparent", format!("00-{trace_id}-{CALLER_SPAN}-01"));
        async move {
            let answer = request.send().await.unwrap();
            assert!(answer.status().is_success(), "{}", answer.status());
        }
    };
    let api_span = |trace_id: &'static str| {
        move |spans: &[Span]| {
            spans
                .iter()
                .find(|s| hex(&s.trace_id) == trace_id && s.name == "GetState")
                .cloned()
        }
    };
    const BEFORE: &str = "11111111111111111111111111111111";
    const AFTER: &str = "22222222222222222222222222222222";

    get_state(BEFORE).await;
    let before = receiver
        .wait_for("the call's span before the reload", api_span(BEFORE))
        .await;

    write(20);
    let reload = receiver
        .wait_for("the applied reload's span", |spans| {
            spans
                .iter()
                .find(|s| {
                    s.name == "rewire.reload"
                        && attribute(s, "rewire.outcome").as_deref() == Some("applied")
                })
                .cloned()
        })
        .await;
    get_state(AFTER).await;
    let after = receiver
        .wait_for("the call's span after the reload", api_span(AFTER))
        .await;

    assert_eq!(
        attribute(&before, "rewire.generation").as_deref(),
        Some("1"),
        "{before:?}"
    );
    assert_eq!(
        attribute(&reload, "rewire.generation").as_deref(),
        Some("2"),
        "{reload:?}"
    );
    assert_eq!(
        attribute(&after, "rewire.generation").as_deref(),
        Some("2"),
        "the call after the reload ran on the reload's generation: {after:?}"
    );
    assert_eq!(
        attribute(&after, "rewire.component").as_deref(),
        Some("state/orders")
    );
    assert!(
        attribute(&reload, "rewire.queued_ms").is_some(),
        "{reload:?}"
    );
}

/// The exported status of `span`: its code (`0` unset, `2` error) and
/// its description.
fn status_of(span: &Span) -> (i32, String) {
    span.status
        .as_ref()
        .map_or((0, String::new()), |s| (s.code, s.message.clone()))
}

/// OTLP's status code of an error span.
const STATUS_ERROR: i32 = 2;

/// A call the server failed ends its span with status `ERROR` and the code
/// answered (HTTP 500; gRPC `INTERNAL`, 13, described by the message
/// answered); the caller's error (HTTP 400) leaves the status unset, as
/// OpenTelemetry asks of servers. A call refused for lacking the app token
/// makes no span, though it carries a sampled `traceparent`: the trace it
/// names gets nothing from the sidecar. Nor does a health probe (open to
/// all) without the token: before, it continued the caller's sampled
/// trace, so a token-less flood of probes filled the export queue. One
/// with the token continues it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_call_is_an_error_span_and_a_call_without_the_token_makes_none() {
    const TOKEN: &str = "trace-token-0815";
    const HTTP_FAILED: &str = "61111111111111111111111111111111";
    const CALLERS_FAULT: &str = "62222222222222222222222222222222";
    const REFUSED: &str = "63333333333333333333333333333333";
    const GRPC_FAILED: &str = "64444444444444444444444444444444";
    const AFTER: &str = "65555555555555555555555555555555";
    const PROBE: &str = "66666666666666666666666666666666";
    const PROBE_WITH_TOKEN: &str = "67777777777777777777777777777777";
    let receiver = Receiver::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("rewire.json");
    let json = serde_json::json!({
        "appId": "failing",
        "components": {"state": {"orders": {"type": "memory"}}}
    });
    std::fs::write(&config, json.to_string()).unwrap();
    let http = format!("127.0.0.1:{}", free_port());
    let grpc = format!("127.0.0.1:{}", free_port());
    let _sidecar = start_guarded(
        &config,
        &http,
        &grpc,
        Some(receiver.addr),
        "100",
        Some(TOKEN),
    );
    rewire::sidecar::tls::install_ring_provider();
    let client = testkit::http_client();
    let traceparent = |trace_id: &str| format!("00-{trace_id}-{CALLER_SPAN}-01");

    // The store refuses a TTL that is no number: the server's error.
    let bad_ttl = serde_json::json!([
        {"key": "k", "value": "v", "metadata": {"ttlInSeconds": "soon"}}
    ]);
    let failed = client
        .post(format!("http://{http}/v1.0/state/orders"))
        .header("dapr-api-token", TOKEN)
        .header("traceparent", traceparent(HTTP_FAILED))
        .json(&bad_ttl)
        .send()
        .await
        .unwrap();
    assert_eq!(failed.status().as_u16(), 500);
    let callers_fault = client
        .get(format!("http://{http}/v1.0/state/unknown/k"))
        .header("dapr-api-token", TOKEN)
        .header("traceparent", traceparent(CALLERS_FAULT))
        .send()
        .await
        .unwrap();
    assert_eq!(callers_fault.status().as_u16(), 400);
    let refused = client
        .get(format!("http://{http}/v1.0/state/orders/k"))
        .header("dapr-api-token", "not-the-token")
        .header("traceparent", traceparent(REFUSED))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status().as_u16(), 401);
    for (trace_id, token) in [(PROBE, None), (PROBE_WITH_TOKEN, Some(TOKEN))] {
        let mut probe = client
            .get(format!("http://{http}/v1.0/healthz"))
            .header("traceparent", traceparent(trace_id));
        if let Some(token) = token {
            probe = probe.header("dapr-api-token", token);
        }
        let probed = probe.send().await.unwrap();
        assert!(probed.status().is_success(), "{}", probed.status());
    }

    let channel = tonic::transport::Endpoint::from_shared(format!("http://{grpc}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut dapr = DaprClient::new(channel);
    let mut request = tonic::Request::new(SaveStateRequest {
        store_name: "orders".into(),
        states: vec![StateItem {
            key: "k".into(),
            value: b"v".to_vec(),
            metadata: [("ttlInSeconds".to_string(), "soon".to_string())].into(),
            ..StateItem::default()
        }],
    });
    let metadata = request.metadata_mut();
    metadata.insert("dapr-api-token", TOKEN.parse().unwrap());
    metadata.insert("traceparent", traceparent(GRPC_FAILED).parse().unwrap());
    let status = dapr.save_state(request).await.expect_err("a TTL no number");
    assert_eq!(status.code(), tonic::Code::Internal, "{status:?}");

    // A call after all of them: once its span is in, theirs were sent
    // (spans are exported in the order they end).
    let after = client
        .get(format!("http://{http}/v1.0/state/orders/k"))
        .header("dapr-api-token", TOKEN)
        .header("traceparent", traceparent(AFTER))
        .send()
        .await
        .unwrap();
    assert!(after.status().is_success(), "{}", after.status());
    let of_trace = |trace_id: &'static str| {
        move |spans: &[Span]| {
            spans
                .iter()
                .find(|s| hex(&s.trace_id) == trace_id && s.name != "rewire.component")
                .cloned()
        }
    };
    receiver
        .wait_for("the last call's span", of_trace(AFTER))
        .await;
    let failed = receiver
        .wait_for("the failed HTTP call's span", of_trace(HTTP_FAILED))
        .await;
    assert_eq!(failed.name, "SaveState");
    assert_eq!(status_of(&failed).0, STATUS_ERROR, "{failed:?}");
    assert_eq!(
        attribute(&failed, "http.response.status_code").as_deref(),
        Some("500")
    );
    let callers_fault = receiver
        .wait_for(
            "the call to an unknown store's span",
            of_trace(CALLERS_FAULT),
        )
        .await;
    assert_eq!(status_of(&callers_fault).0, 0, "{callers_fault:?}");
    assert_eq!(
        attribute(&callers_fault, "http.response.status_code").as_deref(),
        Some("400")
    );
    let grpc_failed = receiver
        .wait_for("the failed gRPC call's span", of_trace(GRPC_FAILED))
        .await;
    let (code, description) = status_of(&grpc_failed);
    assert_eq!(code, STATUS_ERROR, "{grpc_failed:?}");
    assert!(description.contains("ttlInSeconds"), "{description}");
    assert_eq!(
        attribute(&grpc_failed, "rpc.grpc.status_code").as_deref(),
        Some("13")
    );
    let refused: Vec<String> = receiver
        .all()
        .iter()
        .filter(|s| hex(&s.trace_id) == REFUSED)
        .map(|s| s.name.clone())
        .collect();
    assert!(refused.is_empty(), "a refused call made spans: {refused:?}");
    let probe = receiver
        .wait_for(
            "the probe with the token's span",
            of_trace(PROBE_WITH_TOKEN),
        )
        .await;
    assert_eq!(probe.name, "Healthz");
    let unauthenticated: Vec<String> = receiver
        .all()
        .iter()
        .filter(|s| hex(&s.trace_id) == PROBE)
        .map(|s| s.name.clone())
        .collect();
    assert!(
        unauthenticated.is_empty(),
        "a probe without the token continued its caller's trace: {unauthenticated:?}"
    );
}

/// Waits until `line` is in the sidecar's log.
async fn wait_logged(sidecar: &ChildProcess, line: &str) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !sidecar.log().contains(line) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not logged: {line}\n{}",
            sidecar.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Set in the child process the `Host` tracing test runs itself in.
const HOST_CHILD: &str = "REWIRE_TEST_HOST_TRACING_CHILD";

/// A program hosting the runtime as a library (`Host`, no `rewire run`)
/// exports spans as its file's `tracing` section says: a change applied in
/// code is a `rewire.reload` span at the collector. Batches go every 10
/// minutes, so only the flush of `Host::shutdown` sends it. In a child
/// process: logging and the tracing pipeline are process-wide.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_exports_its_reloads_as_its_file_says_and_flushes_at_shutdown() {
    if !crate::support::child::is_child(HOST_CHILD) {
        return crate::support::child::run_alone(
            "tracing_otlp::a_host_exports_its_reloads_as_its_file_says_and_flushes_at_shutdown",
            HOST_CHILD,
            &[("OTEL_BSP_SCHEDULE_DELAY", "600000")],
            &[
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "OTEL_TRACES_SAMPLER",
            ],
        )
        .await;
    }
    rewire::init_logging();
    let receiver = Receiver::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("rewire.json");
    let file = |ttl: u32| {
        serde_json::json!({
            "appId": "hosted",
            "tracing": {
                "samplingRate": "1",
                "otel": {"endpointAddress": receiver.addr.to_string(), "protocol": "http", "isSecure": false}
            },
            "components": {"state": {"cache": {"type": "memory", "metadata": {"defaultTtlInSeconds": ttl}}}}
        })
        .to_string()
    };
    std::fs::write(&config, file(10)).unwrap();
    let host = rewire::Host::start(&config).await.unwrap();
    let changed = rewire::config::parse(file(20).as_bytes()).unwrap();
    host.apply(changed).await.unwrap();
    host.shutdown().await;

    let reload = receiver.all().into_iter().find(|s| {
        s.name == "rewire.reload" && attribute(s, "rewire.outcome").as_deref() == Some("applied")
    });
    let reload = reload.unwrap_or_else(|| {
        let names: Vec<String> = receiver.all().into_iter().map(|s| s.name).collect();
        panic!("no applied reload's span exported by shutdown; spans received: {names:?}")
    });
    assert_eq!(
        attribute(&reload, "rewire.generation").as_deref(),
        Some("2")
    );
}

/// A push carrying a `traceparent` is a span of the caller's trace; the
/// reload it caused is a trace of its own, linked to the push's span,
/// which names the generation the push produced: with several pushes at
/// once, each reload is found from its push, not by its timestamps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pushed_reloads_trace_links_to_the_push_that_caused_it() {
    use rewire::sidecar::grpc::proto::rewire::lifecycle::v1 as lifecycle;
    const PUSH_TRACE: &str = "6bf92f3577b34da6a3ce929d0e0e4738";
    const PUSH_CALLER: &str = "d7ad6b7169203334";
    let receiver = Receiver::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("rewire.json");
    let json = serde_json::json!({
        "appId": "pushed",
        "components": {"state": {"cache": {"type": "memory"}}}
    });
    std::fs::write(&config, json.to_string()).unwrap();
    let http = format!("127.0.0.1:{}", free_port());
    let grpc = format!("127.0.0.1:{}", free_port());
    let _sidecar = start_batching(&config, &http, &grpc, Some(receiver.addr), "100");

    let channel = tonic::transport::Endpoint::from_shared(format!("http://{grpc}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = lifecycle::lifecycle_client::LifecycleClient::new(channel);
    let mut request = tonic::Request::new(lifecycle::DynamicConfiguration {
        component_config: Some(lifecycle::ComponentConfig {
            kind: "state".into(),
            name: "pushed".into(),
            r#type: "memory".into(),
            ..lifecycle::ComponentConfig::default()
        }),
        based_on_generation: None,
    });
    request.metadata_mut().insert(
        "traceparent",
        format!("00-{PUSH_TRACE}-{PUSH_CALLER}-01").parse().unwrap(),
    );
    let answer = client
        .apply_configuration(request)
        .await
        .unwrap()
        .into_inner();
    assert!(answer.accepted, "{answer:?}");

    let (push, reload) = receiver
        .wait_for("the push's span and the reload linked to it", |spans| {
            let push = spans
                .iter()
                .find(|s| hex(&s.trace_id) == PUSH_TRACE && s.name == "ApplyConfiguration")?;
            let reload = spans.iter().find(|s| {
                s.name == "rewire.reload" && s.links.iter().any(|l| hex(&l.trace_id) == PUSH_TRACE)
            })?;
            Some((push.clone(), reload.clone()))
        })
        .await;
    assert_eq!(hex(&push.parent_span_id), PUSH_CALLER);
    assert!(
        reload.parent_span_id.is_empty() && reload.trace_id != push.trace_id,
        "a reload starts its own trace"
    );
    assert_eq!(reload.links.len(), 1, "{:?}", reload.links);
    assert_eq!(
        reload.links[0].span_id, push.span_id,
        "linked to the push's span"
    );
    assert_eq!(attribute(&reload, "rewire.trigger").as_deref(), Some("api"));
    assert_eq!(
        attribute(&reload, "rewire.outcome").as_deref(),
        Some("applied")
    );
    assert_eq!(
        attribute(&push, "rewire.generation"),
        Some(answer.generation.to_string()),
        "the push's span names the generation it produced"
    );
}
