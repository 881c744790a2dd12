//! The `sidecar` benchmark: what the sidecar hop costs. It measures the
//! latency of GetState of one small key, one call at a time, through each
//! path an application can take, all in the same run:
//!
//! 1. the memory state store called in-process through a
//!    `StateStoreHandle` (the baseline),
//! 2. the same store through the sidecar's gRPC API (tonic `DaprClient`
//!    over loopback),
//! 3. the same store through the sidecar's HTTP API (`reqwest`, one
//!    keep-alive connection),
//! 4. a plain `GET` to a real `redis-server` (`redis` crate, multiplexed
//!    connection): a network round trip to a real store, for scale,
//! 5. the `redis` state store through the sidecar's gRPC API,
//! 6. and 7. paths 3 and 5 again with tracing on (every call sampled) and
//!    the OTLP exporter pointing at a dead endpoint (connection refused):
//!    what tracing costs a call when the collector is gone,
//! 8. path 3 with tracing on and a live collector (an in-bench OTLP/HTTP
//!    sink answering 200): against 6, what a dead collector costs,
//! 9. and 10. paths 1 and 3 on a second memory store targeted by a
//!    resiliency policy (timeout, exponential retry, circuit breaker): what
//!    a policy costs a call that succeeds (in-process through
//!    `Generation::guarded`, as the sidecar's APIs call it).
//!
//! Tracing is switched on for the blocks of 6–8 only
//! (`telemetry::apply`), off for the others, in the same process and run.
//!
//! It prints p50 and p99 of each, and their ratios to the in-process call
//! and to the direct Redis `GET`. See docs/BENCHMARKS.md, section "Sidecar
//! overhead: GetState".
//!
//! The sidecar (runtime and API servers) runs on its own multi-threaded
//! tokio runtime, as the `rewire` binary does; the callers run on a
//! current-thread runtime on the main thread, as an application in another
//! process would. A run calls the paths in turn, 100 calls of one, then
//! 100 of the next (the order rotating from block to block), so that a
//! change of machine load hits all of them alike; the warm-up runs are
//! thrown away and the percentiles are taken over every call of the
//! measured runs.
//!
//! `cargo bench --bench sidecar` runs it in full (2 warm-up + 7 runs of
//! 5,000 calls per path, about 15 s); `REWIRE_BENCH_QUICK=1` makes it a
//! tenth of that. Invoked without `--bench` (as `cargo test --all-targets`
//! does) it makes a smoke pass of 50 calls per path. Without
//! `redis-server` on the `PATH` it says so and skips the Redis rows only.
//! Nothing here asserts on time.
//!
//! Then, with Redis, the load part ([`load`]): GET at 8 connections
//! through the sidecar's HTTP and gRPC APIs (the `redis` store) against a
//! direct Redis `GET` at the same concurrency, throughput and p50.

mod floor;
mod load;

use testkit::bench as support;

use testkit::redis as redis_server;

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis_server::RedisServer;
use rewire::config::{parse, validate};
use rewire::resilience::Retries;
use rewire::sidecar::grpc::proto::dapr::proto::runtime::v1::dapr_client::DaprClient;
use rewire::sidecar::grpc::proto::dapr::proto::runtime::v1::GetStateRequest;
use rewire::sidecar::{ApiOptions, ApiServer};
use rewire::{
    ComponentKey, GetRequest, Kind, Registry, Runtime, RuntimeOptions, SetRequest, StateStoreHandle,
};
use tokio_util::sync::CancellationToken;
use tonic::transport::{Channel, Endpoint};

use support::timing::{human, Mode};

/// The key read on every path.
const KEY: &str = "greeting";
/// Its value: a small JSON string (18 bytes).
const VALUE: &[u8] = br#""hello, sidecar!!""#;
/// The memory store.
const MEMORY: &str = "cache";
/// The memory store targeted by a resiliency policy.
const GUARDED: &str = "guarded";
/// The redis store.
const REDIS: &str = "orders";
/// The key of the direct Redis `GET` (a plain string key).
const DIRECT_KEY: &str = "bench:direct:greeting";
/// Calls per path per run in `Full` mode (`Mode::ops` scales it).
const CALLS: u64 = 5_000;
/// Calls of one path in a row: a run takes the paths in turn, a block of
/// each (the order rotating from block to block), so that a change of the
/// machine's state hits every path alike within a run.
const BLOCK: usize = 100;

/// One way to read the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    InProcess,
    Grpc,
    Http,
    RedisDirect,
    RedisGrpc,
    HttpTraced,
    RedisGrpcTraced,
    HttpTracedLive,
    InProcessPolicy,
    HttpPolicy,
}

impl Path {
    fn label(self) -> &'static str {
        match self {
            Path::InProcess => "in-process: memory store via `StateStoreHandle` (baseline)",
            Path::Grpc => "sidecar gRPC: memory store (`DaprClient::get_state`)",
            Path::Http => "sidecar HTTP: memory store (`GET /v1.0/state/cache/greeting`)",
            Path::RedisDirect => "direct Redis `GET` (redis crate, multiplexed)",
            Path::RedisGrpc => "sidecar gRPC: redis store (`HMGET` behind it)",
            Path::HttpTraced => "sidecar HTTP: memory store, traced, exporter dead",
            Path::RedisGrpcTraced => "sidecar gRPC: redis store, traced, exporter dead",
            Path::HttpTracedLive => "sidecar HTTP: memory store, traced, exporter live",
            Path::InProcessPolicy => {
                "in-process: memory store under a resiliency policy (`Generation::guarded`)"
            }
            Path::HttpPolicy => "sidecar HTTP: memory store under a resiliency policy",
        }
    }

    /// Where this path's spans go: `None` (tracing off), the dead address
    /// or the live sink.
    fn collector<'a>(self, dead: &'a str, live: &'a str) -> Option<&'a str> {
        match self {
            Path::HttpTraced | Path::RedisGrpcTraced => Some(dead),
            Path::HttpTracedLive => Some(live),
            _ => None,
        }
    }
}

/// An OTLP/HTTP sink on the runtime this is awaited on: accepts every
/// export; returns its address.
async fn start_sink() -> String {
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(|_body: axum::body::Bytes| async {
            (
                [("content-type", "application/x-protobuf")],
                Vec::<u8>::new(),
            )
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("sink bind");
    let addr = listener.local_addr().expect("sink address");
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr.to_string()
}

/// Tracing settings: every call sampled and exported to `collector` when
/// given, else off.
fn tracing_settings(collector: Option<&str>) -> rewire::sidecar::telemetry::TraceSettings {
    use rewire::sidecar::telemetry::{SamplerChoice, TraceSettings};
    TraceSettings {
        endpoint: collector.map(|at| format!("http://{at}/v1/traces")),
        protocol: rewire::config::OtelProtocol::Http,
        sampler: SamplerChoice::AlwaysOn,
        service_name: "sidecar-bench".into(),
        export_timeout: Duration::from_secs(10),
        tls: Default::default(),
    }
}

/// The sidecar: a runtime serving its APIs on free loopback ports.
struct Sidecar {
    runtime: Runtime,
    grpc_addr: SocketAddr,
    http_addr: SocketAddr,
    shutdown: CancellationToken,
    server: ApiServer,
}

impl Sidecar {
    /// Starts `json` and serves it on ports picked by the OS (on the tokio
    /// runtime this is awaited on).
    async fn start(json: &str) -> Self {
        let config = parse(json.as_bytes()).expect("bench config does not parse");
        let valid = validate(config, &Registry::collected()).expect("bench config is invalid");
        let runtime = Runtime::start(valid, Registry::collected(), RuntimeOptions::default())
            .await
            .expect("runtime start failed");
        let shutdown = CancellationToken::new();
        let any: SocketAddr = "127.0.0.1:0".parse().expect("loopback address");
        let server = ApiServer::bind(
            runtime.clone(),
            ApiOptions::default(),
            any,
            any,
            shutdown.clone(),
        )
        .await
        .expect("bind failed");
        Self {
            runtime,
            grpc_addr: server.grpc_addr,
            http_addr: server.http_addr,
            shutdown,
            server,
        }
    }

    /// Stops the servers and the runtime.
    async fn stop(self) {
        self.shutdown.cancel();
        self.server.stopped().await.expect("server failed");
        self.runtime.shutdown().await;
    }
}

/// The callers of every path, living on the callers' runtime.
struct Callers {
    handle: StateStoreHandle,
    /// The runtime, for the generation whose policies guard a call.
    runtime: Runtime,
    /// The store under a policy.
    guarded: StateStoreHandle,
    guarded_url: String,
    grpc: DaprClient<Channel>,
    http: reqwest::Client,
    http_url: String,
    redis: Option<MultiplexedConnection>,
}

impl Callers {
    /// Reads the key once through `path`; returns how long the call took.
    async fn call(&mut self, path: Path) -> Duration {
        let started = Instant::now();
        let data = match path {
            Path::InProcess => {
                let store = self
                    .handle
                    .load()
                    .unwrap_or_else(|e| panic!("state/{MEMORY}: {e}"));
                let request = GetRequest {
                    key: KEY.to_string(),
                    ..GetRequest::default()
                };
                store
                    .get(request)
                    .await
                    .expect("in-process get")
                    .map(|entry| entry.data)
            }
            Path::Grpc | Path::RedisGrpc | Path::RedisGrpcTraced => {
                let store_name = if path == Path::Grpc { MEMORY } else { REDIS };
                let request = GetStateRequest {
                    store_name: store_name.to_string(),
                    key: KEY.to_string(),
                    ..GetStateRequest::default()
                };
                let reply = self
                    .grpc
                    .get_state(request)
                    .await
                    .unwrap_or_else(|e| panic!("gRPC GetState from {store_name}: {e}"));
                Some(reply.into_inner().data)
            }
            Path::InProcessPolicy => {
                let store = self
                    .guarded
                    .load()
                    .unwrap_or_else(|e| panic!("state/{GUARDED}: {e}"));
                let generation = self.runtime.generation();
                let key = ComponentKey::new(Kind::State, GUARDED);
                generation
                    .guarded(&key, Retries::Allowed, || {
                        store.get(GetRequest {
                            key: KEY.to_string(),
                            ..GetRequest::default()
                        })
                    })
                    .await
                    .expect("in-process guarded get")
                    .map(|entry| entry.data)
            }
            Path::Http | Path::HttpTraced | Path::HttpTracedLive | Path::HttpPolicy => {
                let url = if path == Path::HttpPolicy {
                    &self.guarded_url
                } else {
                    &self.http_url
                };
                let response = self.http.get(url).send().await.expect("HTTP GET");
                let status = response.status();
                let body = response.bytes().await.expect("HTTP GET body");
                if !status.is_success() {
                    panic!("HTTP GET: {status}");
                }
                Some(body.to_vec())
            }
            Path::RedisDirect => {
                let conn = self.redis.as_mut().expect("no redis connection");
                redis::cmd("GET")
                    .arg(DIRECT_KEY)
                    .query_async::<Option<Vec<u8>>>(conn)
                    .await
                    .expect("redis GET")
            }
        };
        let elapsed = started.elapsed();
        if data.as_deref() != Some(VALUE) {
            panic!("{path:?} read {data:?}, not the stored value");
        }
        elapsed
    }
}

/// The latencies of one path.
struct Measured {
    path: Path,
    /// Every call of the measured runs.
    calls: Vec<Duration>,
    /// p50 of each measured run.
    run_p50s: Vec<Duration>,
}

impl Measured {
    fn p(&mut self, p: f64) -> Duration {
        percentile(&mut self.calls, p)
    }
}

/// The `rewire` binary's allocator, so what is measured is what ships.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: rewire::MiMalloc = rewire::MiMalloc;

fn main() {
    rewire::components::link();
    // The tracing layer, as `rewire run` installs it (off until applied);
    // logs quiet unless RUST_LOG says otherwise (tracing is switched often).
    if std::env::var_os("RUST_LOG").is_none() {
        std::env::set_var("RUST_LOG", "warn");
    }
    rewire::init_logging();
    let mode = Mode::from_env();
    let plan = mode.plan();
    let calls = mode.ops(CALLS);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let server_rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("sidecar tokio runtime");
    let client_rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("caller tokio runtime");
    let workers = server_rt.metrics().num_workers();
    println!(
        "# rewire sidecar bench ({mode:?} mode: GetState of one {}-byte value; {} warm-up + {} measured runs of {calls} sequential calls per path; {cores} cores, sidecar on {workers} tokio workers, callers on the main thread)\n",
        VALUE.len(),
        plan.warmup,
        plan.runs
    );
    println!("Load average before: {}\n", load_average());
    let started = Instant::now();

    // A real redis-server, if there is one.
    let redis = if redis_installed() {
        Some(client_rt.block_on(RedisServer::start()))
    } else {
        println!("redis-server is not installed (not on the PATH): skipping the two Redis rows.\n");
        None
    };

    // The sidecar: two memory stores (one under a resiliency policy), and
    // a redis store when Redis runs.
    let mut stores = serde_json::json!({MEMORY: {"type": "memory"}, GUARDED: {"type": "memory"}});
    if let Some(server) = &redis {
        stores[REDIS] =
            serde_json::json!({"type": "redis", "metadata": {"redisHost": server.addr()}});
    }
    let resiliency = serde_json::json!({
        "policies": {
            "timeouts": {"bench": "5s"},
            "retries": {"bench": {"policy": "exponential", "duration": "100ms", "maxInterval": "2s", "maxRetries": 3}},
            "circuitBreakers": {"bench": {"maxRequests": 1, "interval": "0s", "timeout": "30s", "trip": "consecutiveFailures > 5"}}
        },
        "targets": {"components": {GUARDED: {"outbound": {"timeout": "bench", "retry": "bench", "circuitBreaker": "bench"}}}}
    });
    let config = serde_json::json!({
        "appId": "sidecar-bench",
        "components": {"state": stores},
        "resiliency": resiliency,
    });
    let sidecar = server_rt.block_on(Sidecar::start(&config.to_string()));
    // The export task runs on the sidecar's runtime.
    let dead = format!("127.0.0.1:{}", testkit::free_port());
    let live = server_rt.block_on(async {
        rewire::sidecar::telemetry::apply(&tracing_settings(None));
        start_sink().await
    });

    // The key, written in every store.
    let set = |key: &str| SetRequest {
        key: key.to_string(),
        value: VALUE.to_vec(),
        ..SetRequest::default()
    };
    server_rt.block_on(async {
        let mut names = vec![MEMORY, GUARDED];
        if redis.is_some() {
            names.push(REDIS);
        }
        for name in names {
            let store = sidecar
                .runtime
                .state_store(name)
                .load()
                .unwrap_or_else(|e| panic!("state/{name}: {e}"));
            store
                .set(set(KEY))
                .await
                .unwrap_or_else(|e| panic!("set in state/{name}: {e}"));
        }
    });

    let mut callers = client_rt.block_on(async {
        let channel = Endpoint::from_shared(format!("http://{}", sidecar.grpc_addr))
            .expect("gRPC url")
            .connect_timeout(Duration::from_secs(10))
            .connect()
            .await
            .expect("gRPC connect");
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(1)
            .build()
            .expect("HTTP client");
        let redis_conn = match &redis {
            Some(server) => {
                let mut conn = server.connection().await;
                redis::cmd("SET")
                    .arg(DIRECT_KEY)
                    .arg(VALUE)
                    .query_async::<()>(&mut conn)
                    .await
                    .expect("redis SET");
                Some(conn)
            }
            None => None,
        };
        Callers {
            handle: sidecar.runtime.state_store(MEMORY),
            runtime: sidecar.runtime.clone(),
            guarded: sidecar.runtime.state_store(GUARDED),
            guarded_url: format!("http://{}/v1.0/state/{GUARDED}/{KEY}", sidecar.http_addr),
            grpc: DaprClient::new(channel),
            http,
            http_url: format!("http://{}/v1.0/state/{MEMORY}/{KEY}", sidecar.http_addr),
            redis: redis_conn,
        }
    });

    let mut paths = vec![
        Path::InProcess,
        Path::Grpc,
        Path::Http,
        Path::HttpTraced,
        Path::HttpTracedLive,
        Path::InProcessPolicy,
        Path::HttpPolicy,
    ];
    if redis.is_some() {
        paths.extend([Path::RedisDirect, Path::RedisGrpc, Path::RedisGrpcTraced]);
    }
    let mut measured: Vec<Measured> = paths
        .iter()
        .map(|&path| Measured {
            path,
            calls: Vec::new(),
            run_p50s: Vec::new(),
        })
        .collect();

    // `REWIRE_BENCH_ONLY=load` runs the load part alone.
    let only_load = std::env::var("REWIRE_BENCH_ONLY").is_ok_and(|v| v.trim() == "load");
    client_rt.block_on(async {
        if only_load {
            return;
        }
        for run in 0..plan.warmup + plan.runs {
            // This run's calls of each path, made in blocks taken in turn.
            let mut this_run: Vec<Vec<Duration>> =
                vec![Vec::with_capacity(calls as usize); paths.len()];
            let mut round = 0;
            while this_run[0].len() < calls as usize {
                let block = BLOCK.min(calls as usize - this_run[0].len());
                for j in 0..paths.len() {
                    let v = (round + j) % paths.len();
                    let collector = paths[v].collector(&dead, &live);
                    rewire::sidecar::telemetry::apply(&tracing_settings(collector));
                    for _ in 0..block {
                        this_run[v].push(callers.call(paths[v]).await);
                    }
                }
                round += 1;
            }
            if run >= plan.warmup {
                for (m, mut samples) in measured.iter_mut().zip(this_run) {
                    m.calls.extend_from_slice(&samples);
                    m.run_p50s.push(percentile(&mut samples, 50.0));
                }
            }
        }
    });

    if !only_load {
        report(&mut measured);
    }

    // Concurrency: 8 connections against the redis store and Redis itself.
    if let Some(server) = &redis {
        let targets = load::Targets {
            redis: server,
            direct_key: DIRECT_KEY,
            http_addr: sidecar.http_addr,
            grpc_addr: sidecar.grpc_addr,
            store: REDIS,
            key: KEY,
            value: VALUE,
        };
        load::run(&client_rt, mode, &targets);
    }

    // The callers' connections are driven by their runtime: drop them and
    // the runtime (closing the sockets) before the servers wait for them.
    drop(callers);
    drop(client_rt);
    server_rt.block_on(sidecar.stop());
    drop(redis);
    println!(
        "Bench finished in {}; load average after: {}.",
        human(started.elapsed()),
        load_average()
    );
}

/// Prints the table and the differences that matter.
fn report(measured: &mut [Measured]) {
    let p50s: Vec<Duration> = measured.iter_mut().map(|m| m.p(50.0)).collect();
    let p99s: Vec<Duration> = measured.iter_mut().map(|m| m.p(99.0)).collect();
    let at = |path: Path| measured.iter().position(|m| m.path == path);
    let base = at(Path::InProcess).unwrap_or(0);
    let direct = at(Path::RedisDirect);
    let rows: Vec<Vec<String>> = measured
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let (lo, hi) = (
                m.run_p50s.iter().min().copied().unwrap_or_default(),
                m.run_p50s.iter().max().copied().unwrap_or_default(),
            );
            let vs_redis = |values: &[Duration]| match direct {
                Some(d) => ratio(values[i], values[d]),
                None => "n/a".into(),
            };
            vec![
                m.path.label().to_string(),
                human(p50s[i]),
                human(p99s[i]),
                ratio(p50s[i], p50s[base]),
                ratio(p99s[i], p99s[base]),
                vs_redis(&p50s),
                vs_redis(&p99s),
                format!("{}–{}", human(lo), human(hi)),
            ]
        })
        .collect();
    support::print_table(
        &[
            "GetState path",
            "p50",
            "p99",
            "p50 vs in-process",
            "p99 vs in-process",
            "p50 vs Redis GET",
            "p99 vs Redis GET",
            "p50 per run (min–max)",
        ],
        &rows,
    );
    let samples = measured.first().map_or(0, |m| m.calls.len());
    println!("({samples} calls per path; percentiles over all of them, nearest rank.)\n");
    let added = |a: Path, b: Path| -> Option<String> {
        let (a, b) = (at(a)?, at(b)?);
        Some(format!(
            "p50 {}, p99 {}",
            signed(p50s[a], p50s[b]),
            signed(p99s[a], p99s[b])
        ))
    };
    if let Some(text) = added(Path::Grpc, Path::InProcess) {
        println!("* sidecar gRPC hop over in-process: {text}");
    }
    if let Some(text) = added(Path::Http, Path::InProcess) {
        println!("* sidecar HTTP hop over in-process: {text}");
    }
    if let Some(text) = added(Path::RedisGrpc, Path::RedisDirect) {
        println!("* redis store via sidecar gRPC over direct Redis GET: {text}");
    }
    let traced = |a: Path, b: Path| -> Option<String> {
        let (a, b) = (at(a)?, at(b)?);
        Some(format!(
            "p50 {} ({}), p99 {}",
            signed(p50s[a], p50s[b]),
            ratio(p50s[a], p50s[b]),
            signed(p99s[a], p99s[b])
        ))
    };
    if let Some(text) = traced(Path::HttpTraced, Path::Http) {
        println!("* tracing on, exporter dead, over tracing off (HTTP, memory): {text}");
    }
    if let Some(text) = traced(Path::HttpTraced, Path::HttpTracedLive) {
        println!("* exporter dead over exporter live, tracing on (HTTP, memory): {text}");
    }
    if let Some(text) = traced(Path::HttpTracedLive, Path::Http) {
        println!("* tracing on, exporter live, over tracing off (HTTP, memory): {text}");
    }
    if let Some(text) = traced(Path::RedisGrpcTraced, Path::RedisGrpc) {
        println!("* tracing on, exporter dead, over tracing off (gRPC, redis): {text}");
    }
    if let Some(text) = traced(Path::InProcessPolicy, Path::InProcess) {
        println!("* resiliency policy over none (in-process, memory): {text}");
    }
    if let Some(text) = traced(Path::HttpPolicy, Path::Http) {
        println!("* resiliency policy over none (HTTP, memory): {text}");
    }
    let stats = rewire::sidecar::telemetry::stats();
    println!(
        "* spans: {} exported, {} dropped (queue full), {} dropped (export failed)",
        stats.exported.get(),
        stats.dropped_queue_full.get(),
        stats.dropped_export_failed.get()
    );
    println!();
}

/// `a / b` as `1.23×`: three significant figures (no decimals from
/// 100× on).
fn ratio(a: Duration, b: Duration) -> String {
    if b.is_zero() {
        return "n/a".into();
    }
    let r = a.as_secs_f64() / b.as_secs_f64();
    if r >= 100.0 {
        format!("{r:.0}×")
    } else if r >= 10.0 {
        format!("{r:.1}×")
    } else if r >= 1.0 || r == 0.0 {
        format!("{r:.2}×")
    } else {
        // Enough decimals for three significant figures (0.00285×).
        let decimals = (2.0 - r.log10().floor()).clamp(2.0, 9.0) as usize;
        format!("{r:.decimals$}×")
    }
}

/// `a - b` with its sign.
fn signed(a: Duration, b: Duration) -> String {
    if a >= b {
        format!("+{}", human(a - b))
    } else {
        format!("−{}", human(b - a))
    }
}

/// The `p`-th percentile (0–100) of `samples`, nearest rank.
fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    if samples.is_empty() {
        return Duration::ZERO;
    }
    samples.sort_unstable();
    let rank = ((p / 100.0) * samples.len() as f64).ceil() as usize;
    samples[rank.clamp(1, samples.len()) - 1]
}

/// Whether `redis-server` can be run.
fn redis_installed() -> bool {
    Command::new("redis-server")
        .arg("--version")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The 1, 5 and 15 minute load averages (other work on the machine skews
/// the numbers), where the system tells them.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|text| {
            text.split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_else(|| "unknown".into())
}
