//! A real three-member (or larger) `etcd` cluster on free loopback ports,
//! each member in its own temporary directory, killed on drop: for
//! failover tests (kill the leader, kill every member, start them again).

use std::process::Command;
use std::time::Duration;

use rewire_etcd::{Client, ConnectOptions};
use tokio::time::{sleep, timeout, Instant};

use crate::child::ChildProcess;
use crate::free_port;

/// How long the cluster may take to elect its first leader.
const START_LIMIT: Duration = Duration::from_secs(20);
/// Limit on one request of a helper client.
const REQUEST_LIMIT: Duration = Duration::from_secs(2);
/// Pause between two probes.
const PROBE_EVERY: Duration = Duration::from_millis(50);

/// One member: its process and ports.
struct Member {
    name: String,
    process: ChildProcess,
    client_port: u16,
}

/// A running cluster.
pub struct EtcdCluster {
    members: Vec<Member>,
    _dir: tempfile::TempDir,
}

impl EtcdCluster {
    /// A cluster of `size` members; returns once it has a leader and
    /// accepts writes.
    pub async fn start(size: usize) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let ports: Vec<(u16, u16)> = (0..size).map(|_| (free_port(), free_port())).collect();
        let initial = ports
            .iter()
            .enumerate()
            .map(|(i, (_, peer))| format!("m{i}=http://127.0.0.1:{peer}"))
            .collect::<Vec<_>>()
            .join(",");
        let members = ports
            .iter()
            .enumerate()
            .map(|(i, &(client_port, peer_port))| {
                let name = format!("m{i}");
                let data = dir.path().join(&name);
                let log = dir.path().join(format!("{name}.log"));
                let initial = initial.clone();
                let member = name.clone();
                let command = move || {
                    let client_url = format!("http://127.0.0.1:{client_port}");
                    let peer_url = format!("http://127.0.0.1:{peer_port}");
                    let mut command = Command::new("etcd");
                    command
                        .args(["--name", &member])
                        // Fast elections: a new leader ~0.1-0.3 s after the old one dies.
                        .args(["--heartbeat-interval", "20", "--election-timeout", "200"])
                        .arg("--data-dir")
                        .arg(&data)
                        .args(["--listen-client-urls", &client_url])
                        .args(["--advertise-client-urls", &client_url])
                        .args(["--listen-peer-urls", &peer_url])
                        .args(["--initial-advertise-peer-urls", &peer_url])
                        .args(["--initial-cluster", &initial])
                        .args(["--initial-cluster-token", "rewire-test"])
                        .args(["--initial-cluster-state", "new"]);
                    command
                };
                Member {
                    name,
                    process: ChildProcess::new("etcd", log, command),
                    client_port,
                }
            })
            .collect();
        let mut cluster = Self { members, _dir: dir };
        // A member serves clients only once it has joined the cluster: spawn
        // them all, then wait.
        for member in &mut cluster.members {
            if let Err(err) = member.process.start(START_LIMIT, || async { true }).await {
                panic!("etcd member {}: {err}", member.name);
            }
        }
        cluster.wait_for_leader().await;
        cluster
    }

    /// `127.0.0.1:port` of every member, comma-separated, as `endpoints`
    /// wants them, the member at `first` listed first.
    pub fn endpoints_from(&self, first: usize) -> String {
        let n = self.members.len();
        (0..n)
            .map(|i| self.endpoint((first + i) % n))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// `127.0.0.1:port` of member `index`.
    pub fn endpoint(&self, index: usize) -> String {
        format!("127.0.0.1:{}", self.members[index].client_port)
    }

    /// The index of the current leader, asked of the running members.
    pub async fn leader(&self) -> usize {
        let deadline = Instant::now() + START_LIMIT;
        loop {
            if let Some(leader) = self.try_leader().await {
                return leader;
            }
            assert!(
                Instant::now() < deadline,
                "no etcd leader within {START_LIMIT:?}"
            );
            sleep(PROBE_EVERY).await;
        }
    }

    async fn try_leader(&self) -> Option<usize> {
        for (index, member) in self.members.iter().enumerate() {
            if !member.process.is_running() {
                continue;
            }
            let Ok(client) = connect(&[self.url(index)]).await else {
                continue;
            };
            let Ok(status) = client.status().await else {
                continue;
            };
            let own = status.header.as_ref().map_or(0, |h| h.member_id);
            if status.leader != 0 && status.leader == own {
                return Some(index);
            }
        }
        None
    }

    /// Kills member `index` (its data stays).
    pub fn kill(&mut self, index: usize) {
        self.members[index].process.stop();
    }

    /// Freezes member `index` (`SIGSTOP`): its connections stay open but
    /// nothing answers, as with a hung process or a network partition.
    pub fn pause(&self, index: usize) {
        self.signal(index, "-STOP");
    }

    /// Lets a paused member `index` run again (`SIGCONT`).
    pub fn resume(&self, index: usize) {
        self.signal(index, "-CONT");
    }

    fn signal(&self, index: usize, signal: &str) {
        let pid = self.members[index]
            .process
            .pid()
            .expect("member not running");
        let status = Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .expect("kill");
        assert!(status.success(), "kill {signal} {pid}: {status}");
    }

    /// Compacts the history at the current revision, through any running
    /// member; returns that revision.
    pub async fn compact(&self) -> i64 {
        let revision = self.put("/testkit/probe", "1").await;
        self.client()
            .await
            .compact(revision, true)
            .await
            .unwrap_or_else(|e| panic!("compact at {revision}: {e}"));
        revision
    }

    /// Starts member `index` again on its ports and data (a no-op if it
    /// runs); returns once it answers.
    pub async fn start_again(&mut self, index: usize) {
        if !self.members[index].process.is_running() {
            self.spawn(index).await;
        }
    }

    /// Starts every member that is not running (after an outage of the
    /// whole cluster: none can serve before a quorum is back); returns once
    /// the cluster has a leader and accepts writes.
    pub async fn start_all_again(&mut self) {
        for member in &mut self.members {
            if !member.process.is_running() {
                if let Err(err) = member.process.restart(START_LIMIT, || async { true }).await {
                    panic!("etcd member {}: {err}", member.name);
                }
            }
        }
        self.wait_for_leader().await;
    }

    /// Waits until the cluster has a leader and a write through any
    /// running member succeeds.
    pub async fn wait_for_leader(&self) {
        let deadline = Instant::now() + START_LIMIT;
        loop {
            if self.client().await.put("/testkit/probe", "1").await.is_ok() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "etcd cluster not writable within {START_LIMIT:?}: {}",
                self.log_tails()
            );
            sleep(PROBE_EVERY).await;
        }
    }

    /// A client of every member (failing over between them).
    pub async fn client(&self) -> Client {
        let urls: Vec<String> = (0..self.members.len()).map(|i| self.url(i)).collect();
        connect(&urls).await.expect("client of the etcd cluster")
    }

    /// Puts `key` = `value` through any running member; returns the
    /// revision of the write.
    pub async fn put(&self, key: &str, value: &str) -> i64 {
        let deadline = Instant::now() + START_LIMIT;
        loop {
            match self.client().await.put(key, value).await {
                Ok(response) => return response.header.map_or(0, |h| h.revision),
                Err(err) => assert!(Instant::now() < deadline, "put {key}: {err}"),
            }
            sleep(PROBE_EVERY).await;
        }
    }

    /// The end of each member's log, for failure messages.
    pub fn log_tails(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("{}: {}", m.name, m.process.log_tail()))
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn url(&self, index: usize) -> String {
        format!("http://{}", self.endpoint(index))
    }

    /// Spawns member `index` and waits until it answers a status request
    /// (which needs no leader), retrying while its port is still held.
    async fn spawn(&mut self, index: usize) {
        let url = self.url(index);
        let answers = move || {
            let url = url.clone();
            async move {
                let probe = async { connect(&[url]).await.ok()?.status().await.ok() };
                matches!(timeout(REQUEST_LIMIT, probe).await, Ok(Some(_)))
            }
        };
        if let Err(err) = self.members[index]
            .process
            .restart(START_LIMIT, answers)
            .await
        {
            panic!("etcd member {index}: {err}");
        }
    }
}

async fn connect(urls: &[String]) -> Result<Client, rewire_etcd::Error> {
    let options = ConnectOptions {
        connect_timeout: REQUEST_LIMIT,
        timeout: REQUEST_LIMIT,
        ..ConnectOptions::default()
    };
    Client::connect(urls, options).await
}
