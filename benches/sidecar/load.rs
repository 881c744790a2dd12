//! The load part of the `sidecar` bench: GET of one key at 8 connections
//! through the sidecar (HTTP and gRPC, the `redis` state store behind it)
//! against a direct Redis `GET` at the same concurrency on the same
//! `redis-server`, all in the same run: throughput and p50/p99.
//!
//! Two load tools, each against its own kind of baseline:
//!
//! * external: `wrk -t1 -c8` on the sidecar's HTTP route and `h2load -t1
//!   -c8 -m1` on its gRPC `GetState` (one stream at a time per HTTP/2
//!   connection) against `redis-benchmark -c8 -t get` (all three
//!   single-threaded C event loops);
//! * the bench's own clients on one current-thread tokio runtime (8 tasks,
//!   one connection each): `reqwest` (HTTP/1.1 keep-alive) and tonic
//!   `DaprClient` (one HTTP/2 connection each) against the `redis` crate
//!   (one multiplexed connection each).
//!
//! The paths take turns (a slice of each, the order rotating) so that a
//! change of machine load hits them alike. The external rows are skipped
//! when `redis-benchmark` is not installed, and each tool's row when the
//! tool is not (`apt-get install wrk nghttp2-client`).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use rewire::sidecar::grpc::proto::dapr::proto::runtime::v1::dapr_client::DaprClient;
use rewire::sidecar::grpc::proto::dapr::proto::runtime::v1::GetStateRequest;
use testkit::redis::RedisServer;
use tonic::transport::{Channel, Endpoint};

use crate::floor;
use crate::support::print_table;
use crate::support::timing::{human, Mode};

/// Concurrent connections of every path.
pub const CONNECTIONS: usize = 8;

/// One way to put load on the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    /// `redis-benchmark -c 8 -t get`.
    RedisBenchmark,
    /// `wrk -t1 -c8` on `GET /v1.0/state/{store}/{key}`.
    Wrk,
    /// `h2load -t1 -c8 -m1` on gRPC `GetState`.
    H2load,
    /// `wrk -t1 -c8` on the HTTP floor ([`crate::floor`]).
    FloorWrk,
    /// `h2load -t1 -c8 -m1` on the gRPC floor.
    FloorH2load,
    /// `h2load -t1 -c8 -m1` on the gRPC floor without tonic's router and
    /// codec.
    FloorBeforeRoutesH2load,
    /// The `redis` crate, 8 connections.
    RedisDirect,
    /// `reqwest`, 8 keep-alive connections.
    Http,
    /// tonic `DaprClient`, 8 HTTP/2 connections.
    Grpc,
}

impl Path {
    fn label(self) -> &'static str {
        match self {
            Path::RedisBenchmark => "direct Redis `GET` (`redis-benchmark -c 8 -t get`)",
            Path::Wrk => "sidecar HTTP, redis store (`wrk -t1 -c8`)",
            Path::H2load => "sidecar gRPC, redis store (`h2load -t1 -c8 -m1`)",
            Path::FloorWrk => "floor: the two hops alone, HTTP (tokio + redis crate; `wrk`)",
            Path::FloorH2load => "floor: the two hops alone, gRPC (tonic + redis crate; `h2load`)",
            Path::FloorBeforeRoutesH2load => {
                "floor: gRPC before tonic's router and codec (`h2load`)"
            }
            Path::RedisDirect => "direct Redis `GET` (bench client: redis crate, 8 connections)",
            Path::Http => "sidecar HTTP, redis store (bench client: reqwest, 8 connections)",
            Path::Grpc => "sidecar gRPC, redis store (bench client: tonic, 8 connections)",
        }
    }

    /// The baseline this path is set against.
    fn baseline(self) -> Path {
        match self {
            Path::RedisBenchmark
            | Path::Wrk
            | Path::H2load
            | Path::FloorWrk
            | Path::FloorH2load
            | Path::FloorBeforeRoutesH2load => Path::RedisBenchmark,
            Path::RedisDirect | Path::Http | Path::Grpc => Path::RedisDirect,
        }
    }
}

/// What one slice of load did.
#[derive(Debug, Default, Clone)]
struct Slice {
    requests: u64,
    elapsed: Duration,
    p50: Duration,
    p99: Duration,
}

/// What the load part needs of the bench: where everything listens.
pub struct Targets<'a> {
    /// The redis server the store and the direct paths use.
    pub redis: &'a RedisServer,
    /// The plain Redis key holding the value (direct paths).
    pub direct_key: &'a str,
    /// The sidecar's HTTP address.
    pub http_addr: std::net::SocketAddr,
    /// The sidecar's gRPC address.
    pub grpc_addr: std::net::SocketAddr,
    /// The redis state store's name.
    pub store: &'a str,
    /// The key, in the store.
    pub key: &'a str,
    /// The value stored: every answer is checked against it.
    pub value: &'a [u8],
}

/// Runs the load part on `client_rt` (a current-thread runtime) and prints
/// its table.
pub fn run(client_rt: &tokio::runtime::Runtime, mode: Mode, targets: &Targets<'_>) {
    let (slice, rounds) = match mode {
        Mode::Smoke => (Duration::from_millis(100), 1),
        Mode::Quick => (Duration::from_secs(1), 1),
        Mode::Full => (Duration::from_secs(3), 3),
    };
    println!(
        "## Load: GET at {CONNECTIONS} connections, redis store ({rounds} rounds of a {} slice per path, in turn)\n",
        human(slice)
    );
    let mut paths = vec![Path::RedisDirect, Path::Http, Path::Grpc];
    let external = mode != Mode::Smoke && installed("redis-benchmark", "--version");
    if external {
        paths.push(Path::RedisBenchmark);
        if installed("wrk", "-v") {
            paths.extend([Path::Wrk, Path::FloorWrk]);
        }
        if installed("h2load", "--version") {
            paths.extend([
                Path::H2load,
                Path::FloorH2load,
                Path::FloorBeforeRoutesH2load,
            ]);
        }
        // redis-benchmark's GET reads the literal key `key:__rand_int__`.
        client_rt.block_on(async {
            let mut conn = targets.redis.connection().await;
            redis::cmd("SET")
                .arg("key:__rand_int__")
                .arg(targets.value)
                .query_async::<()>(&mut conn)
                .await
                .expect("redis SET");
        });
    } else if mode != Mode::Smoke {
        println!("`redis-benchmark` is not installed: the external rows are skipped.\n");
    }
    let floors = external.then(|| floor::start(targets.redis.client(), targets.value));
    let floor = || {
        floors
            .as_ref()
            .expect("the floors run with the external tools")
    };
    let clients = client_rt.block_on(Clients::connect(targets));
    let mut slices: Vec<Vec<Slice>> = vec![Vec::new(); paths.len()];
    for round in 0..rounds {
        for j in 0..paths.len() {
            let v = (round + j) % paths.len();
            let measured = match paths[v] {
                Path::RedisBenchmark => redis_benchmark(targets, slice),
                Path::Wrk => wrk(&state_url(targets.http_addr, targets), slice),
                Path::H2load => h2load(targets.grpc_addr, targets, slice),
                Path::FloorWrk => wrk(&state_url(floor().http_addr, targets), slice),
                Path::FloorH2load => h2load(floor().grpc_addr, targets, slice),
                Path::FloorBeforeRoutesH2load => {
                    h2load(floor().grpc_before_routes_addr, targets, slice)
                }
                path => client_rt.block_on(clients.load(path, slice, targets)),
            };
            slices[v].push(measured);
        }
    }
    report(&paths, &slices);
}

/// The bench's own clients: 8 connections per path.
struct Clients {
    redis: Vec<MultiplexedConnection>,
    http: Vec<reqwest::Client>,
    grpc: Vec<DaprClient<Channel>>,
    http_url: String,
}

impl Clients {
    async fn connect(targets: &Targets<'_>) -> Self {
        let mut redis = Vec::new();
        let mut http = Vec::new();
        let mut grpc = Vec::new();
        for _ in 0..CONNECTIONS {
            redis.push(targets.redis.connection().await);
            http.push(
                reqwest::Client::builder()
                    .pool_max_idle_per_host(1)
                    .build()
                    .expect("HTTP client"),
            );
            let channel = Endpoint::from_shared(format!("http://{}", targets.grpc_addr))
                .expect("gRPC url")
                .connect_timeout(Duration::from_secs(10))
                .connect()
                .await
                .expect("gRPC connect");
            grpc.push(DaprClient::new(channel));
        }
        Self {
            redis,
            http,
            grpc,
            http_url: format!(
                "http://{}/v1.0/state/{}/{}",
                targets.http_addr, targets.store, targets.key
            ),
        }
    }

    /// Runs `path` on 8 tasks for `slice`.
    async fn load(&self, path: Path, slice: Duration, targets: &Targets<'_>) -> Slice {
        let started = Instant::now();
        let until = started + slice;
        let mut tasks = tokio::task::JoinSet::new();
        for c in 0..CONNECTIONS {
            let value = targets.value.to_vec();
            let (store, key, direct_key) = (
                targets.store.to_string(),
                targets.key.to_string(),
                targets.direct_key.to_string(),
            );
            let mut redis = self.redis[c].clone();
            let http = self.http[c].clone();
            let mut grpc = self.grpc[c].clone();
            let url = self.http_url.clone();
            tasks.spawn(async move {
                let mut times = Vec::with_capacity(100_000);
                while Instant::now() < until {
                    let call = Instant::now();
                    let data: Option<Vec<u8>> = match path {
                        Path::RedisDirect => redis::cmd("GET")
                            .arg(&direct_key)
                            .query_async(&mut redis)
                            .await
                            .expect("redis GET"),
                        Path::Http => {
                            let response = http.get(&url).send().await.expect("HTTP GET");
                            assert!(
                                response.status().is_success(),
                                "HTTP GET: {}",
                                response.status()
                            );
                            Some(response.bytes().await.expect("HTTP body").to_vec())
                        }
                        Path::Grpc => {
                            let request = GetStateRequest {
                                store_name: store.clone(),
                                key: key.clone(),
                                ..GetStateRequest::default()
                            };
                            let reply = grpc.get_state(request).await.expect("gRPC GetState");
                            Some(reply.into_inner().data)
                        }
                        Path::RedisBenchmark
                        | Path::Wrk
                        | Path::H2load
                        | Path::FloorWrk
                        | Path::FloorH2load
                        | Path::FloorBeforeRoutesH2load => {
                            unreachable!("external tools")
                        }
                    };
                    times.push(call.elapsed());
                    assert_eq!(
                        data.as_deref(),
                        Some(&value[..]),
                        "{path:?} read another value"
                    );
                }
                times
            });
        }
        let mut times: Vec<Duration> = tasks.join_all().await.into_iter().flatten().collect();
        let elapsed = started.elapsed();
        Slice {
            requests: times.len() as u64,
            elapsed,
            p50: percentile(&mut times, 50.0),
            p99: percentile(&mut times, 99.0),
        }
    }
}

/// `redis-benchmark -c 8 -t get` for about `slice` (the request count from
/// a short first pass).
fn redis_benchmark(targets: &Targets<'_>, slice: Duration) -> Slice {
    let run = |requests: u64| -> Slice {
        let started = Instant::now();
        let output = Command::new("redis-benchmark")
            .args(["-h", "127.0.0.1", "-p"])
            .arg(targets.redis.port().to_string())
            .args(["-c", &CONNECTIONS.to_string(), "-t", "get", "--csv", "-n"])
            .arg(requests.to_string())
            .stdin(Stdio::null())
            .output()
            .expect("redis-benchmark");
        let elapsed = started.elapsed();
        let text = String::from_utf8_lossy(&output.stdout);
        // "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
        let line = text
            .lines()
            .find(|l| l.starts_with("\"GET\""))
            .unwrap_or_else(|| panic!("redis-benchmark said: {text}"));
        let fields: Vec<f64> = line
            .split(',')
            .skip(1)
            .map(|f| f.trim_matches('"').parse().unwrap_or(0.0))
            .collect();
        let ms = |i: usize| Duration::from_secs_f64(fields.get(i).copied().unwrap_or(0.0) / 1e3);
        let rps = fields.first().copied().unwrap_or(0.0);
        Slice {
            requests,
            // The tool's own clock (connection set-up excluded).
            elapsed: if rps > 0.0 {
                Duration::from_secs_f64(requests as f64 / rps)
            } else {
                elapsed
            },
            p50: ms(3),
            p99: ms(5),
        }
    };
    let probe = run(20_000);
    let rate = probe.requests as f64 / probe.elapsed.as_secs_f64().max(1e-3);
    run(((rate * slice.as_secs_f64()) as u64).max(20_000))
}

/// The state GET URL of the key on the server at `addr`.
fn state_url(addr: std::net::SocketAddr, targets: &Targets<'_>) -> String {
    format!("http://{addr}/v1.0/state/{}/{}", targets.store, targets.key)
}

/// `wrk -t1 -c8 --latency` on `url` for `slice` (whole seconds, at least
/// one).
fn wrk(url: &str, slice: Duration) -> Slice {
    let seconds = slice.as_secs().max(1);
    let output = Command::new("wrk")
        .args(["-t1", "-c", &CONNECTIONS.to_string(), "--latency", "-d"])
        .arg(format!("{seconds}s"))
        .arg(url)
        .stdin(Stdio::null())
        .output()
        .expect("wrk");
    let text = String::from_utf8_lossy(&output.stdout);
    let value_after = |label: &str| -> Option<&str> {
        text.lines()
            .map(str::trim)
            .find_map(|l| l.strip_prefix(label))
            .map(str::trim)
    };
    if text.contains("Non-2xx") {
        panic!("wrk saw failed requests: {text}");
    }
    let rps: f64 = value_after("Requests/sec:")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("wrk said: {text}"));
    let elapsed = Duration::from_secs(seconds);
    Slice {
        requests: (rps * seconds as f64) as u64,
        elapsed,
        p50: value_after("50%").map(wrk_duration).unwrap_or_default(),
        p99: value_after("99%").map(wrk_duration).unwrap_or_default(),
    }
}

/// `h2load -t1 -c8 -m1` on gRPC `GetState` at `addr` for `slice` (whole
/// seconds, at least one): every request a unary call, the body one framed
/// `GetStateRequest`. Percentiles come from h2load's per-request log.
fn h2load(addr: std::net::SocketAddr, targets: &Targets<'_>, slice: Duration) -> Slice {
    use prost::Message;
    let seconds = slice.as_secs().max(1);
    let dir = tempfile::tempdir().expect("temp dir");
    let (body, log) = (dir.path().join("get.bin"), dir.path().join("h2load.log"));
    let message = GetStateRequest {
        store_name: targets.store.to_string(),
        key: targets.key.to_string(),
        ..Default::default()
    }
    .encode_to_vec();
    // gRPC framing: not compressed, then the length, big-endian.
    let mut framed = vec![0u8];
    framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
    framed.extend_from_slice(&message);
    std::fs::write(&body, framed).expect("write the request body");
    let output = Command::new("h2load")
        .args(["-t1", "-c", &CONNECTIONS.to_string(), "-m1", "-D"])
        .arg(seconds.to_string())
        .args(["-H", "content-type: application/grpc", "-H", "te: trailers"])
        .arg("-d")
        .arg(&body)
        .arg(format!("--log-file={}", log.display()))
        .arg(format!("http://{addr}/dapr.proto.runtime.v1.Dapr/GetState"))
        .stdin(Stdio::null())
        .output()
        .expect("h2load");
    let text = String::from_utf8_lossy(&output.stdout);
    // "status codes: 1000 2xx, 0 3xx, 0 4xx, 0 5xx"; "requests: ... 0 failed, 0 errored, 0 timeout"
    let clean = text.contains(" 0 3xx, 0 4xx, 0 5xx") && text.contains(" 0 failed, 0 errored");
    assert!(clean, "h2load saw failed requests: {text}");
    // Each line: start (µs since the epoch), status, duration (µs).
    let mut times: Vec<Duration> = std::fs::read_to_string(&log)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| line.split_whitespace().nth(2)?.parse().ok())
        .map(Duration::from_micros)
        .collect();
    assert!(!times.is_empty(), "h2load logged no request: {text}");
    Slice {
        requests: times.len() as u64,
        elapsed: Duration::from_secs(seconds),
        p50: percentile(&mut times, 50.0),
        p99: percentile(&mut times, 99.0),
    }
}

/// wrk's `123.45us`, `1.20ms`, `2.00s`.
fn wrk_duration(text: &str) -> Duration {
    let (number, scale) = if let Some(n) = text.strip_suffix("us") {
        (n, 1e-6)
    } else if let Some(n) = text.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = text.strip_suffix('s') {
        (n, 1.0)
    } else {
        (text, 1.0)
    };
    Duration::from_secs_f64(number.parse::<f64>().unwrap_or(0.0) * scale)
}

/// Prints throughput and latency per path, with their ratios to the
/// path's baseline.
fn report(paths: &[Path], slices: &[Vec<Slice>]) {
    // Throughput over all slices; percentiles: the median slice's.
    let rate = |s: &[Slice]| {
        let requests: u64 = s.iter().map(|s| s.requests).sum();
        let seconds: f64 = s.iter().map(|s| s.elapsed.as_secs_f64()).sum();
        requests as f64 / seconds.max(1e-9)
    };
    let median = |s: &[Slice], f: fn(&Slice) -> Duration| {
        let mut v: Vec<Duration> = s.iter().map(f).collect();
        v.sort_unstable();
        v.get(v.len() / 2).copied().unwrap_or_default()
    };
    let at = |path: Path| paths.iter().position(|&p| p == path);
    let rows: Vec<Vec<String>> = paths
        .iter()
        .enumerate()
        .map(|(i, &path)| {
            let (rps, p50, p99) = (
                rate(&slices[i]),
                median(&slices[i], |s| s.p50),
                median(&slices[i], |s| s.p99),
            );
            let (vs_rps, vs_p50) = match at(path.baseline()) {
                Some(b) if b != i => (
                    format!("{:.2}×", rps / rate(&slices[b]).max(1e-9)),
                    format!(
                        "{:.2}×",
                        p50.as_secs_f64() / median(&slices[b], |s| s.p50).as_secs_f64().max(1e-12)
                    ),
                ),
                Some(_) => ("1.00× (baseline)".into(), "1.00× (baseline)".into()),
                None => ("n/a".into(), "n/a".into()),
            };
            vec![
                path.label().to_string(),
                format!("{rps:.0}/s"),
                human(p50),
                human(p99),
                vs_rps,
                vs_p50,
            ]
        })
        .collect();
    print_table(
        &[
            "GET path (8 connections)",
            "throughput",
            "p50",
            "p99",
            "throughput vs direct",
            "p50 vs direct",
        ],
        &rows,
    );
    println!(
        "(\"direct\": the row's baseline — `redis-benchmark` for `wrk` and `h2load`, the bench's redis-crate client for the bench's own clients. Throughput over every slice; p50 and p99: the median slice's.)\n"
    );
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

/// Whether `program` runs (`flag` makes it print its version).
fn installed(program: &str, flag: &str) -> bool {
    Command::new(program)
        .arg(flag)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}
