//! The `pubsub` benchmark: publish → delivery through the sidecar, beside
//! a direct Redis Streams baseline, all in the same run.
//!
//! Paths:
//!
//! 1. sidecar, memory broker: gRPC `PublishEvent` to the sidecar, delivered
//!    to a `SubscribeTopicEventsAlpha1` stream that answers SUCCESS;
//! 2. sidecar, redis broker: the same with the `redis` pub/sub;
//! 3. direct Redis Streams: `XADD` from the publishers, one reader doing
//!    `XREADGROUP` (COUNT 100, BLOCK) and an `XACK` per entry — what the
//!    redis broker does, without the sidecar and the CloudEvent.
//!
//! Throughput: each run sends `MESSAGES` events from `PUBLISHERS`
//! concurrent publishers (each waits for its publish to be acknowledged
//! before the next): events delivered per second, first publish to last
//! delivery. Latency: one publisher, one event in flight (publish, wait for
//! its delivery, next), a fifth as many events: publish call start to
//! delivery, p50 and p99.
//! It prints the median run of each path and the ratios to the direct
//! baseline. See docs/BENCHMARKS.md, section "Pub/sub".
//!
//! `cargo bench --bench pubsub` runs it in full (2 warm-up + 5 runs of
//! 5,000 events per path); `REWIRE_BENCH_QUICK=1` a tenth of that; without
//! `--bench` a smoke pass of 50 events. Without `redis-server` on the PATH
//! only the memory row runs. Nothing here asserts on time.
// Bench code: a failed setup step should panic where it happens.
#![allow(clippy::unwrap_used)]

use testkit::bench as support;
use testkit::redis as redis_server;

use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis_server::RedisServer;
use rewire::config::{parse, validate};
use rewire::sidecar::grpc::proto::dapr::proto::runtime::v1 as pb;
use rewire::sidecar::{ApiOptions, ApiServer};
use rewire::{Registry, Runtime, RuntimeOptions};
use support::timing::{human, Mode};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

use pb::dapr_client::DaprClient;
use pb::subscribe_topic_events_request_alpha1::SubscribeTopicEventsRequestType as Req;
use pb::subscribe_topic_events_response_alpha1::SubscribeTopicEventsResponseType as Resp;

/// Events per run in `Full` mode.
const MESSAGES: u64 = 5_000;
/// Concurrent publishers.
const PUBLISHERS: usize = 8;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    SidecarMemory,
    SidecarRedis,
    DirectRedis,
}

impl Path {
    fn label(self) -> &'static str {
        match self {
            Path::SidecarMemory => "sidecar, memory broker (gRPC stream)",
            Path::SidecarRedis => "sidecar, redis broker (gRPC stream)",
            Path::DirectRedis => "direct Redis Streams (XADD, XREADGROUP, XACK)",
        }
    }
}

/// How the events are sent.
#[derive(Debug, Clone, Copy)]
struct Load {
    /// Publishers sending at once.
    publishers: usize,
    /// Each publisher waits for the delivery of its event before the next.
    closed_loop: bool,
}

/// Throughput: [`PUBLISHERS`] publishers, each waiting only for its
/// publish to be acknowledged.
const THROUGHPUT: Load = Load {
    publishers: PUBLISHERS,
    closed_loop: false,
};
/// Latency: one publisher, one event in flight (publish, delivery, next).
const LATENCY: Load = Load {
    publishers: 1,
    closed_loop: true,
};

/// One run's numbers.
#[derive(Debug, Clone, Copy)]
struct RunResult {
    per_second: f64,
    p50: Duration,
    p99: Duration,
}

/// Send times by sequence number, and delivery latencies.
struct Clock {
    sent: Mutex<Vec<Option<Instant>>>,
    latencies: Mutex<Vec<Duration>>,
    count: tokio::sync::watch::Sender<usize>,
}

impl Clock {
    fn new(n: usize) -> Arc<Self> {
        Arc::new(Self {
            sent: Mutex::new(vec![None; n]),
            latencies: Mutex::new(Vec::with_capacity(n)),
            count: tokio::sync::watch::channel(0).0,
        })
    }

    fn sent(&self, seq: usize) {
        self.sent.lock().unwrap()[seq] = Some(Instant::now());
    }

    /// Records the delivery of `seq`; the number delivered so far.
    fn delivered(&self, seq: usize) -> usize {
        let at = self.sent.lock().unwrap().get(seq).copied().flatten();
        let mut latencies = self.latencies.lock().unwrap();
        if let Some(at) = at {
            latencies.push(at.elapsed());
        }
        self.count.send_replace(latencies.len());
        latencies.len()
    }

    /// In closed loop: waits until `seq` was delivered.
    async fn wait_delivered(&self, seq: usize, closed_loop: bool) {
        if closed_loop {
            let _ = self.count.subscribe().wait_for(|c| *c > seq).await;
        }
    }

    fn result(&self, n: usize, elapsed: Duration) -> RunResult {
        let mut latencies = self.latencies.lock().unwrap().clone();
        latencies.sort_unstable();
        let at =
            |p: f64| latencies[((latencies.len() as f64 * p) as usize).min(latencies.len() - 1)];
        RunResult {
            per_second: n as f64 / elapsed.as_secs_f64(),
            p50: at(0.50),
            p99: at(0.99),
        }
    }
}

fn seq_of(data: &[u8]) -> usize {
    std::str::from_utf8(data)
        .ok()
        .and_then(|s| s.trim_matches('"').parse().ok())
        .unwrap_or(usize::MAX)
}

/// One run through the sidecar's pub/sub `pubsub`.
async fn sidecar_run(url: &str, pubsub: &str, topic: &str, n: usize, load: Load) -> RunResult {
    let clock = Clock::new(n);
    let channel = tonic::transport::Endpoint::from_shared(url.to_string())
        .unwrap()
        .connect()
        .await
        .expect("connect");
    let mut client = DaprClient::new(channel.clone());
    let (answers, requests) = mpsc::channel(1024);
    let initial = pb::SubscribeTopicEventsRequestAlpha1 {
        subscribe_topic_events_request_type: Some(Req::InitialRequest(
            pb::SubscribeTopicEventsRequestInitialAlpha1 {
                pubsub_name: pubsub.into(),
                topic: topic.into(),
                metadata: Default::default(),
                dead_letter_topic: None,
            },
        )),
    };
    answers.send(initial).await.unwrap();
    let mut stream = client
        .subscribe_topic_events_alpha1(ReceiverStream::new(requests))
        .await
        .expect("subscribe")
        .into_inner();
    let _initial = stream.message().await.expect("initial response");
    let done = CancellationToken::new();
    let reader = tokio::spawn({
        let (clock, done) = (clock.clone(), done.clone());
        async move {
            while let Ok(Some(message)) = stream.message().await {
                if let Some(Resp::EventMessage(event)) =
                    message.subscribe_topic_events_response_type
                {
                    let count = clock.delivered(seq_of(&event.data));
                    let processed = pb::SubscribeTopicEventsRequestAlpha1 {
                        subscribe_topic_events_request_type: Some(Req::EventProcessed(
                            pb::SubscribeTopicEventsRequestProcessedAlpha1 {
                                id: event.id,
                                status: Some(pb::TopicEventResponse { status: 0 }),
                            },
                        )),
                    };
                    let _ = answers.send(processed).await;
                    if count >= n {
                        done.cancel();
                        return;
                    }
                }
            }
        }
    });
    let started = Instant::now();
    let mut publishers = Vec::new();
    for p in 0..load.publishers {
        let (mut client, clock) = (DaprClient::new(channel.clone()), clock.clone());
        let (pubsub, topic) = (pubsub.to_string(), topic.to_string());
        publishers.push(tokio::spawn(async move {
            for seq in (p..n).step_by(load.publishers) {
                clock.sent(seq);
                let request = pb::PublishEventRequest {
                    pubsub_name: pubsub.clone(),
                    topic: topic.clone(),
                    data: seq.to_string().into_bytes(),
                    data_content_type: "application/json".into(),
                    metadata: Default::default(),
                };
                client.publish_event(request).await.expect("publish");
                clock.wait_delivered(seq, load.closed_loop).await;
            }
        }));
    }
    for publisher in publishers {
        publisher.await.unwrap();
    }
    done.cancelled().await;
    let elapsed = started.elapsed();
    reader.abort();
    clock.result(n, elapsed)
}

/// One run straight on Redis Streams.
async fn direct_run(server: &RedisServer, topic: &str, n: usize, load: Load) -> RunResult {
    let clock = Clock::new(n);
    let client = server.client();
    let mut setup = client.get_multiplexed_async_connection().await.unwrap();
    let _: Result<redis::Value, _> = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(topic)
        .arg("g")
        .arg("$")
        .arg("MKSTREAM")
        .query_async(&mut setup)
        .await;
    let mut reading = client.get_multiplexed_async_connection().await.unwrap();
    let reader = tokio::spawn({
        let (clock, topic, mut acking) = (clock.clone(), topic.to_string(), setup.clone());
        async move {
            loop {
                let reply: redis::Value = redis::cmd("XREADGROUP")
                    .arg("GROUP")
                    .arg("g")
                    .arg("c")
                    .arg("COUNT")
                    .arg(100)
                    .arg("BLOCK")
                    .arg(1000)
                    .arg("STREAMS")
                    .arg(&topic)
                    .arg(">")
                    .query_async(&mut reading)
                    .await
                    .expect("XREADGROUP");
                for (id, data) in entries(reply) {
                    let count = clock.delivered(seq_of(&data));
                    let _: i64 = redis::cmd("XACK")
                        .arg(&topic)
                        .arg("g")
                        .arg(&id)
                        .query_async(&mut acking)
                        .await
                        .expect("XACK");
                    if count >= n {
                        return;
                    }
                }
            }
        }
    });
    let started = Instant::now();
    let mut publishers = Vec::new();
    for p in 0..load.publishers {
        let (mut conn, clock, topic) = (setup.clone(), clock.clone(), topic.to_string());
        publishers.push(tokio::spawn(async move {
            for seq in (p..n).step_by(load.publishers) {
                clock.sent(seq);
                let _: String = redis::cmd("XADD")
                    .arg(&topic)
                    .arg("*")
                    .arg("data")
                    .arg(seq.to_string())
                    .query_async(&mut conn)
                    .await
                    .expect("XADD");
                clock.wait_delivered(seq, load.closed_loop).await;
            }
        }));
    }
    for publisher in publishers {
        publisher.await.unwrap();
    }
    reader.await.unwrap();
    clock.result(n, started.elapsed())
}

/// `(id, data)` of an `XREADGROUP` reply.
fn entries(reply: redis::Value) -> Vec<(String, Vec<u8>)> {
    use redis::Value::{Array, BulkString};
    let mut out = Vec::new();
    let Array(streams) = reply else { return out };
    for stream in streams {
        let Array(mut parts) = stream else { continue };
        let Some(Array(items)) = parts.pop() else {
            continue;
        };
        for item in items {
            let Array(mut fields) = item else { continue };
            let (Some(Array(values)), Some(BulkString(id))) = (fields.pop(), fields.pop()) else {
                continue;
            };
            if let Some(BulkString(data)) = values.get(1) {
                out.push((String::from_utf8_lossy(&id).to_string(), data.clone()));
            }
        }
    }
    out
}

fn have_redis() -> bool {
    Command::new("redis-server")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The `rewire` binary's allocator, so what is measured is what ships.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: rewire::MiMalloc = rewire::MiMalloc;

fn main() {
    let mode = Mode::from_env();
    let plan = mode.plan();
    let n = usize::try_from(mode.ops(MESSAGES)).unwrap_or(50).max(50);
    let server_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let redis = have_redis().then(|| server_rt.block_on(RedisServer::start()));
    if redis.is_none() {
        println!("redis-server not found: only the memory broker is measured");
    }
    let mut components = serde_json::json!({"memory": {"type": "memory"}});
    if let Some(server) = &redis {
        components["redis"] =
            serde_json::json!({"type": "redis", "metadata": {"redisHost": server.addr()}});
    }
    let config = serde_json::json!({"appId": "bench", "components": {"pubsub": components}});
    let shutdown = CancellationToken::new();
    let (runtime, server) = server_rt.block_on(async {
        let config = parse(config.to_string().as_bytes()).expect("config");
        let valid = validate(config, &Registry::collected()).expect("valid");
        let runtime = Runtime::start(valid, Registry::collected(), RuntimeOptions::default())
            .await
            .expect("start");
        let any = "127.0.0.1:0".parse().unwrap();
        let server = ApiServer::bind(
            runtime.clone(),
            ApiOptions::default(),
            any,
            any,
            shutdown.clone(),
        )
        .await
        .expect("bind");
        (runtime, server)
    });
    let url = format!("http://{}", server.grpc_addr);
    let callers = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut paths = vec![Path::SidecarMemory];
    if redis.is_some() {
        paths.extend([Path::SidecarRedis, Path::DirectRedis]);
    }
    println!(
        "pubsub: {n} events per run, {PUBLISHERS} publishers, {} warm-up + {} runs",
        plan.warmup, plan.runs
    );
    let mut medians = Vec::new();
    for path in &paths {
        // Throughput from open-loop runs, latency from closed-loop runs.
        let mut measured = Vec::new();
        for (load, events) in [(THROUGHPUT, n), (LATENCY, (n / 5).max(20))] {
            let mut runs = Vec::new();
            for round in 0..(plan.warmup + plan.runs) {
                let topic = format!("bench-{}-{round}-{}", load.publishers, runs.len());
                let result = callers.block_on(async {
                    match path {
                        Path::SidecarMemory => {
                            sidecar_run(&url, "memory", &topic, events, load).await
                        }
                        Path::SidecarRedis => {
                            sidecar_run(&url, "redis", &topic, events, load).await
                        }
                        Path::DirectRedis => {
                            direct_run(redis.as_ref().expect("redis"), &topic, events, load).await
                        }
                    }
                });
                if round >= plan.warmup {
                    runs.push(result);
                }
            }
            runs.sort_by(|a, b| a.per_second.total_cmp(&b.per_second));
            measured.push(runs[runs.len() / 2]);
        }
        let (throughput, latency) = (measured[0], measured[1]);
        medians.push((*path, throughput.per_second, latency));
    }
    let direct = medians
        .iter()
        .find(|(p, _, _)| *p == Path::DirectRedis)
        .map(|(_, t, l)| (*t, *l));
    println!(
        "{:<48} {:>12} {:>10} {:>10}",
        "path", "events/s", "p50", "p99"
    );
    for (path, per_second, latency) in &medians {
        let vs = direct
            .filter(|_| *path != Path::DirectRedis)
            .map(|(t, l)| {
                format!(
                    "  (vs direct: throughput {:.2}x, p50 {:.2}x, p99 {:.2}x)",
                    per_second / t,
                    latency.p50.as_secs_f64() / l.p50.as_secs_f64(),
                    latency.p99.as_secs_f64() / l.p99.as_secs_f64()
                )
            })
            .unwrap_or_default();
        println!(
            "{:<48} {:>12.0} {:>10} {:>10}{vs}",
            path.label(),
            per_second,
            human(latency.p50),
            human(latency.p99)
        );
    }
    shutdown.cancel();
    server_rt.block_on(async {
        let _ = server.stopped().await;
        runtime.shutdown().await;
    });
}
