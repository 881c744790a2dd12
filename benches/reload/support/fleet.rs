//! Measurement 5, the fleet: N runtimes in this process, each with an
//! `etcd` config store and a memory state store whose `configurationRef`
//! watches one etcd key (`watch: true`). The bench writes the key and
//! times, for every runtime, the write → the applied reload (its
//! `reload_events`), and the CPU the whole process spent on the change,
//! per runtime. N = 10, 100 and 1,000.
//!
//! CPU is read from `/proc/self/task/*/schedstat` (nanoseconds each
//! thread ran; `getrusage` needs `unsafe`, which the workspace forbids),
//! summed over the process's threads before the write and after the last
//! runtime applied; the etcd server's own CPU (`/proc/<pid>/stat`, 10 ms
//! ticks) is printed beside it.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rewire::{Outcome, Registry, Runtime, RuntimeOptions, Trigger};
use testkit::etcd::EtcdServer;
use tokio::sync::mpsc;

use super::timing::{human, Mode};
use super::{print_table, valid};

/// The etcd key every runtime watches (under [`PREFIX`]).
const KEY: &str = "ttl";
/// The store's `keyPrefix`.
const PREFIX: &str = "/fleet/";
/// Runtimes started at once (each connects to etcd and reads the prefix).
const START_BATCH: usize = 50;
/// The longest wait for every runtime to apply one change.
const CONVERGE_LIMIT: Duration = Duration::from_secs(60);

/// The configuration of runtime `i`.
fn config(i: usize, endpoint: &str) -> String {
    serde_json::json!({
        "appId": format!("fleet-{i}"),
        "components": {
            "config_store": {"etcd": {"type": "etcd",
                "metadata": {"endpoints": endpoint, "keyPrefix": PREFIX}}},
            "state": {"cache": {"type": "memory",
                "configurationRef": [{"store": "etcd", "key": KEY,
                    "injectAs": "defaultTtlInSeconds", "watch": true}]}}
        }
    })
    .to_string()
}

/// Measures and prints the fleet table.
pub fn run(rt: &tokio::runtime::Runtime, mode: Mode) {
    println!("## 5. Fleet: N runtimes watching one etcd key (write → applied in every runtime)\n");
    if !etcd_installed() {
        println!("etcd is not installed (not on the PATH): skipped.\n");
        return;
    }
    let (sizes, changes): (&[usize], usize) = match mode {
        Mode::Smoke => (&[10], 2),
        Mode::Quick => (&[10, 100, 1000], 3),
        Mode::Full => (&[10, 100, 1000], 10),
    };
    let etcd = rt.block_on(EtcdServer::start());
    let etcd_pid = etcd_pid(etcd.client_port());
    rt.block_on(etcd.put(&format!("{PREFIX}{KEY}"), "1"));
    let mut rows = Vec::new();
    let mut value = 1;
    for &n in sizes {
        let mut fleet = rt.block_on(Fleet::start(n, &etcd.endpoint()));
        // One change unmeasured: every watch is in place after it.
        value += 1;
        rt.block_on(fleet.change(&etcd, value));
        let mut latencies = Vec::with_capacity(n * changes);
        let mut cpu = Duration::ZERO;
        let mut etcd_cpu = Duration::ZERO;
        let mut slowest = Duration::ZERO;
        for _ in 0..changes {
            value += 1;
            let (cpu_before, etcd_before) = (process_cpu(), etcd_pid.map(pid_cpu));
            let times = rt.block_on(fleet.change(&etcd, value));
            cpu += process_cpu().saturating_sub(cpu_before);
            if let (Some(before), Some(pid)) = (etcd_before, etcd_pid) {
                etcd_cpu += pid_cpu(pid).saturating_sub(before);
            }
            slowest = slowest.max(times.iter().copied().max().unwrap_or_default());
            latencies.extend(times);
        }
        let per_change = (n * changes) as u32;
        rows.push(vec![
            n.to_string(),
            changes.to_string(),
            human(percentile(&mut latencies, 50.0)),
            human(percentile(&mut latencies, 99.0)),
            human(slowest),
            human(cpu / per_change),
            human(cpu / changes as u32),
            match etcd_pid {
                Some(_) => human(etcd_cpu / changes as u32),
                None => "n/a".into(),
            },
        ]);
        rt.block_on(fleet.stop());
    }
    print_table(
        &[
            "runtimes (N)",
            "changes",
            "write → applied p50",
            "p99",
            "max",
            "CPU per runtime per change",
            "CPU per change (process)",
            "etcd CPU per change",
        ],
        &rows,
    );
    println!(
        "(Each change: one etcd put of `{PREFIX}{KEY}`; latency from before the put to each runtime's applied `watch` reload; percentiles over every runtime of every change.)\n"
    );
}

/// N runtimes and, per runtime, a task forwarding its applied `watch`
/// reloads.
struct Fleet {
    runtimes: Vec<Runtime>,
    applied: mpsc::UnboundedReceiver<(usize, Instant)>,
    listeners: Vec<tokio::task::JoinHandle<()>>,
}

impl Fleet {
    async fn start(n: usize, endpoint: &str) -> Self {
        let registry = Registry::collected();
        let mut runtimes = Vec::with_capacity(n);
        for batch in (0..n).collect::<Vec<_>>().chunks(START_BATCH) {
            let mut starting = tokio::task::JoinSet::new();
            for &i in batch {
                let (config, registry) = (valid(&config(i, endpoint), &registry), registry.clone());
                starting.spawn(async move {
                    let runtime = Runtime::start(config, registry, RuntimeOptions::default())
                        .await
                        .unwrap_or_else(|e| panic!("fleet runtime {i} did not start: {e}"));
                    (i, runtime)
                });
            }
            let mut started: Vec<(usize, Runtime)> = starting.join_all().await;
            started.sort_by_key(|(i, _)| *i);
            runtimes.extend(started.into_iter().map(|(_, runtime)| runtime));
        }
        let (sender, applied) = mpsc::unbounded_channel();
        let listeners = runtimes
            .iter()
            .enumerate()
            .map(|(i, runtime)| {
                let mut events = runtime.reload_events();
                let sender = sender.clone();
                tokio::spawn(async move {
                    while let Ok(record) = events.recv().await {
                        if record.trigger == Trigger::WatchedRef
                            && record.outcome == Outcome::Applied
                        {
                            let _ = sender.send((i, Instant::now()));
                        }
                    }
                })
            })
            .collect();
        Self {
            runtimes,
            applied,
            listeners,
        }
    }

    /// Writes `value` and waits until every runtime applied it; returns
    /// each runtime's time from before the write.
    async fn change(&mut self, etcd: &EtcdServer, value: u64) -> Vec<Duration> {
        let n = self.runtimes.len();
        let client = etcd.client().await;
        let mut done = vec![None; n];
        let mut missing = n;
        let written = Instant::now();
        client
            .put(format!("{PREFIX}{KEY}"), value.to_string())
            .await
            .expect("etcd put");
        let deadline = tokio::time::Instant::now() + CONVERGE_LIMIT;
        while missing > 0 {
            let next = tokio::time::timeout_at(deadline, self.applied.recv()).await;
            let Ok(Some((i, at))) = next else {
                panic!(
                    "{missing} of {n} runtimes did not apply the change within {CONVERGE_LIMIT:?}"
                );
            };
            if done[i].is_none() {
                done[i] = Some(at.saturating_duration_since(written));
                missing -= 1;
            }
        }
        done.into_iter().flatten().collect()
    }

    async fn stop(self) {
        for listener in &self.listeners {
            listener.abort();
        }
        let runtimes = Arc::new(self.runtimes);
        let mut stopping = tokio::task::JoinSet::new();
        for i in 0..runtimes.len() {
            let runtimes = Arc::clone(&runtimes);
            stopping.spawn(async move { runtimes[i].shutdown().await });
        }
        stopping.join_all().await;
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

/// CPU time of every thread of this process so far (the first field of
/// each `/proc/self/task/<tid>/schedstat`, in nanoseconds).
fn process_cpu() -> Duration {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Duration::ZERO;
    };
    let nanos: u64 = tasks
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("schedstat")).ok())
        .filter_map(|text| text.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    Duration::from_nanos(nanos)
}

/// User + system CPU of process `pid` (`/proc/<pid>/stat`, in clock ticks
/// of 10 ms).
fn pid_cpu(pid: u32) -> Duration {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces) start at the
    // state (field 3); utime and stime are fields 14 and 15.
    let after = text.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    Duration::from_millis((ticks(11) + ticks(12)) * 10)
}

/// The pid of the `etcd` serving `port` (a child of this process).
fn etcd_pid(port: u16) -> Option<u32> {
    let me = std::process::id().to_string();
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            let cmdline = String::from_utf8_lossy(&cmdline);
            let program = cmdline.split('\0').next()?;
            let stat =
                std::fs::read_to_string(Path::new("/proc").join(pid.to_string()).join("stat"))
                    .ok()?;
            let parent = stat
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .nth(1)?
                .to_string();
            (program.ends_with("etcd") && cmdline.contains(&format!(":{port}")) && parent == me)
                .then_some(pid)
        })
}

/// Whether `etcd` can be run.
fn etcd_installed() -> bool {
    Command::new("etcd")
        .arg("--version")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}
