//! A real single-member `etcd` on free loopback ports, in its own
//! temporary directory (data and log), killed on drop.
//!
//! Include with `#[path = "support/etcd_server.rs"] mod etcd_server;`.
//! Also holds bounded helpers for reading config subscriptions.

#![allow(dead_code)]

use std::fs;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use etcd_client::{Client, CompactionOptions, ConnectOptions};
use rewire_runtime::{ConfigItem, ConfigSubscription};
use tokio::time::{sleep, timeout, Instant};

/// How long a server may take to answer its first request.
const START_LIMIT: Duration = Duration::from_secs(10);
/// Attempts at finding free ports.
const PORT_ATTEMPTS: usize = 5;
/// Limit on one request of a helper client.
const REQUEST_LIMIT: Duration = Duration::from_secs(2);

/// A running `etcd`.
pub struct EtcdServer {
    child: Option<Child>,
    client_port: u16,
    peer_port: u16,
    /// `(user, password)` once authentication is on.
    root: Option<(String, String)>,
    dir: tempfile::TempDir,
}

impl EtcdServer {
    /// A server on free ports.
    pub async fn start() -> Self {
        let mut last_error = String::new();
        for _ in 0..PORT_ATTEMPTS {
            let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("temp dir: {e}"));
            let mut server = Self {
                child: None,
                client_port: free_port(),
                peer_port: free_port(),
                root: None,
                dir,
            };
            match server.launch().await {
                Ok(()) => return server,
                Err(err) => last_error = err,
            }
        }
        panic!("etcd did not start: {last_error}")
    }

    /// `127.0.0.1:port`, as `endpoints` wants it.
    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }

    /// The client port.
    pub fn client_port(&self) -> u16 {
        self.client_port
    }

    /// A plain client of this server (as root once authentication is on).
    pub async fn client(&self) -> Client {
        self.try_client()
            .await
            .unwrap_or_else(|e| panic!("client of {}: {e}", self.endpoint()))
    }

    async fn try_client(&self) -> Result<Client, etcd_client::Error> {
        let mut options = ConnectOptions::new()
            .with_connect_timeout(REQUEST_LIMIT)
            .with_timeout(REQUEST_LIMIT);
        if let Some((user, password)) = &self.root {
            options = options.with_user(user, password);
        }
        Client::connect([format!("http://{}", self.endpoint())], Some(options)).await
    }

    /// Puts `key` = `value`; returns the revision of the write.
    pub async fn put(&self, key: &str, value: &str) -> i64 {
        let response = self
            .client()
            .await
            .put(key, value, None)
            .await
            .unwrap_or_else(|e| panic!("put {key}: {e}"));
        response.header().map_or(0, |h| h.revision())
    }

    /// Deletes `key`; returns the revision of the delete.
    pub async fn delete(&self, key: &str) -> i64 {
        let response = self
            .client()
            .await
            .delete(key, None)
            .await
            .unwrap_or_else(|e| panic!("delete {key}: {e}"));
        response.header().map_or(0, |h| h.revision())
    }

    /// The value of `key`, if any.
    pub async fn value(&self, key: &str) -> Option<String> {
        let response = self
            .client()
            .await
            .get(key, None)
            .await
            .unwrap_or_else(|e| panic!("get {key}: {e}"));
        response
            .kvs()
            .first()
            .map(|kv| String::from_utf8_lossy(kv.value()).into_owned())
    }

    /// The store's current revision.
    pub async fn revision(&self) -> i64 {
        let response = self
            .client()
            .await
            .get("\0", None)
            .await
            .unwrap_or_else(|e| panic!("revision: {e}"));
        response.header().map_or(0, |h| h.revision())
    }

    /// Compacts (physically) at the current revision, with a separate
    /// client; returns that revision.
    pub async fn compact(&self) -> i64 {
        let revision = self.revision().await;
        self.client()
            .await
            .compact(revision, Some(CompactionOptions::new().with_physical()))
            .await
            .unwrap_or_else(|e| panic!("compact at {revision}: {e}"));
        revision
    }

    /// Turns authentication on with user `root` (role `root`) and
    /// `password`; the helpers log in as root afterwards.
    pub async fn enable_auth(&mut self, password: &str) {
        let mut client = self.client().await;
        client
            .user_add("root", password, None)
            .await
            .unwrap_or_else(|e| panic!("user add root: {e}"));
        client
            .user_grant_role("root", "root")
            .await
            .unwrap_or_else(|e| panic!("grant root: {e}"));
        client
            .auth_enable()
            .await
            .unwrap_or_else(|e| panic!("auth enable: {e}"));
        self.root = Some(("root".into(), password.into()));
    }

    /// Kills the server (its ports become free, its data stays).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same ports and data directory
    /// (retrying while a port is still held); a no-op if it runs.
    pub async fn start_again(&mut self) {
        if self.child.is_some() {
            return;
        }
        let deadline = Instant::now() + START_LIMIT;
        loop {
            match self.launch().await {
                Ok(()) => return,
                Err(err) if Instant::now() > deadline => panic!("etcd restart failed: {err}"),
                Err(_) => sleep(Duration::from_millis(100)).await,
            }
        }
    }

    /// Kills the server and starts it again on the same ports and data.
    pub async fn restart(&mut self) {
        self.stop();
        self.start_again().await;
    }

    async fn launch(&mut self) -> Result<(), String> {
        let client_url = format!("http://127.0.0.1:{}", self.client_port);
        let peer_url = format!("http://127.0.0.1:{}", self.peer_port);
        let log = self.log_path();
        let log_file = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(|e| format!("log: {e}"))?;
        let err_file = log_file.try_clone().map_err(|e| format!("log: {e}"))?;
        let child = Command::new("etcd")
            .args(["--name", "t"])
            // Fast election, so a (re)start takes ~0.1 s rather than ~1.5 s.
            .args(["--heartbeat-interval", "10", "--election-timeout", "100"])
            .arg("--data-dir")
            .arg(self.dir.path().join("data"))
            .args(["--listen-client-urls", &client_url])
            .args(["--advertise-client-urls", &client_url])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("t={peer_url}")])
            .stdin(Stdio::null())
            .stdout(Stdio::from(log_file))
            .stderr(Stdio::from(err_file))
            .spawn()
            .map_err(|e| format!("cannot run etcd: {e}"))?;
        self.child = Some(child);
        let deadline = Instant::now() + START_LIMIT;
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    self.child = None;
                    return Err(format!("exited with {status}: {}", tail(&log)));
                }
            }
            if self.answers().await {
                return Ok(());
            }
            if Instant::now() > deadline {
                self.stop();
                return Err(format!("no answer within {START_LIMIT:?}: {}", tail(&log)));
            }
            sleep(Duration::from_millis(100)).await;
        }
    }

    async fn answers(&self) -> bool {
        let probe = async {
            let mut client = self.try_client().await.ok()?;
            client.status().await.ok()
        };
        matches!(timeout(REQUEST_LIMIT, probe).await, Ok(Some(_)))
    }

    /// The server's log file.
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("etcd.log")
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A port nobody listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("no free port: {e}"))
}

fn tail(log: &Path) -> String {
    let text = fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(5)..].join(" | ")
}

/// Reads the items of `sub` until `done` holds for all items read so far;
/// panics after `limit`, naming `what` and the items read.
pub async fn items_until(
    sub: &mut ConfigSubscription,
    what: &str,
    limit: Duration,
    done: impl Fn(&[ConfigItem]) -> bool,
) -> Vec<ConfigItem> {
    let mut items = Vec::new();
    let deadline = Instant::now() + limit;
    while !done(&items) {
        let left = deadline.saturating_duration_since(Instant::now());
        match timeout(left, sub.changes.recv()).await {
            Ok(Some(change)) => items.extend(change.items),
            Ok(None) => panic!(
                "subscription closed waiting for {what}; got {}",
                show(&items)
            ),
            Err(_) => panic!("no {what} within {limit:?}; got {}", show(&items)),
        }
    }
    items
}

/// The items `sub` receives within `quiet` (to show nothing more comes).
pub async fn items_within(sub: &mut ConfigSubscription, quiet: Duration) -> Vec<ConfigItem> {
    let mut items = Vec::new();
    let deadline = Instant::now() + quiet;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match timeout(left, sub.changes.recv()).await {
            Ok(Some(change)) => items.extend(change.items),
            Ok(None) | Err(_) => return items,
        }
    }
}

/// `[key=value@version, ...]`, with group and label, for messages.
pub fn show(items: &[ConfigItem]) -> String {
    let shown: Vec<String> = items
        .iter()
        .map(|i| {
            let group = i
                .group
                .as_deref()
                .map(|g| format!("{g}/"))
                .unwrap_or_default();
            let label = i
                .label
                .as_deref()
                .map(|l| format!("@{l}"))
                .unwrap_or_default();
            format!("{group}{}{label}={:?}#{}", i.key, i.value, i.version)
        })
        .collect();
    format!("[{}]", shown.join(", "))
}

/// The values `key` took in `items`, in order.
pub fn values_of(items: &[ConfigItem], key: &str) -> Vec<String> {
    items
        .iter()
        .filter(|i| i.key == key)
        .map(|i| i.value.clone())
        .collect()
}
