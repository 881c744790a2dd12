//! A real `redis-server` (or sentinel) on a free loopback port, in its own
//! temporary directory, killed on drop.
//!
//! Include with `#[path = "support/redis_server.rs"] mod redis_server;`.

#![allow(dead_code)]

use std::fs;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::time::{sleep, Instant};

/// How long a server may take to answer its first `PING`.
const START_LIMIT: Duration = Duration::from_secs(10);
/// Attempts at finding a free port.
const PORT_ATTEMPTS: usize = 5;

/// A running `redis-server`.
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    password: Option<String>,
    sentinel_of: Option<(String, u16)>,
    replica_of: Option<u16>,
    dir: tempfile::TempDir,
}

impl RedisServer {
    /// A server without password.
    pub async fn start() -> Self {
        Self::start_with(None).await
    }

    /// A server that requires `password`.
    pub async fn start_with_password(password: &str) -> Self {
        Self::start_with(Some(password.to_string())).await
    }

    async fn start_with(password: Option<String>) -> Self {
        Self::start_any_port(password, None, None).await
    }

    /// A replica of the server at `master_port` (no password).
    pub async fn start_replica_of(master_port: u16) -> Self {
        Self::start_any_port(None, None, Some(master_port)).await
    }

    /// A sentinel monitoring the master at `master_port` under `name`
    /// (quorum 1, down after 1 s).
    pub async fn start_sentinel(name: &str, master_port: u16) -> Self {
        Self::start_any_port(None, Some((name.to_string(), master_port)), None).await
    }

    async fn start_any_port(
        password: Option<String>,
        sentinel_of: Option<(String, u16)>,
        replica_of: Option<u16>,
    ) -> Self {
        let mut last_error = String::new();
        for _ in 0..PORT_ATTEMPTS {
            let port = free_port();
            let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("temp dir: {e}"));
            let mut server = Self {
                child: None,
                port,
                password: password.clone(),
                sentinel_of: sentinel_of.clone(),
                replica_of,
                dir,
            };
            match server.launch().await {
                Ok(()) => return server,
                Err(err) => last_error = err,
            }
        }
        panic!("redis-server did not start: {last_error}")
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:port`, as `redisHost` wants it.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// A plain client of this server (with its password).
    pub fn client(&self) -> redis::Client {
        let url = match &self.password {
            Some(pw) => format!("redis://:{pw}@127.0.0.1:{}/", self.port),
            None => format!("redis://127.0.0.1:{}/", self.port),
        };
        redis::Client::open(url).unwrap_or_else(|e| panic!("client: {e}"))
    }

    /// A plain client of this server authenticating with `password` (after
    /// the server's password was changed with `CONFIG SET requirepass`).
    pub fn client_with_password(&self, password: &str) -> redis::Client {
        let url = format!("redis://:{password}@127.0.0.1:{}/", self.port);
        redis::Client::open(url).unwrap_or_else(|e| panic!("client: {e}"))
    }

    /// A connection of a plain client.
    pub async fn connection(&self) -> redis::aio::MultiplexedConnection {
        self.client()
            .get_multiplexed_async_connection()
            .await
            .unwrap_or_else(|e| panic!("connect to {}: {e}", self.addr()))
    }

    /// Kills the server (the port becomes free).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port (retrying while the port
    /// is still held).
    pub async fn restart(&mut self) {
        self.stop();
        let deadline = Instant::now() + START_LIMIT;
        loop {
            match self.launch().await {
                Ok(()) => return,
                Err(err) if Instant::now() > deadline => panic!("restart failed: {err}"),
                Err(_) => sleep(Duration::from_millis(100)).await,
            }
        }
    }

    async fn launch(&mut self) -> Result<(), String> {
        let log = self.dir.path().join("redis.log");
        let mut command = Command::new("redis-server");
        if let Some((name, master_port)) = &self.sentinel_of {
            let conf = self.dir.path().join("sentinel.conf");
            let text = format!(
                "port {port}\nbind 127.0.0.1\ndir {dir}\n\
                 sentinel monitor {name} 127.0.0.1 {master_port} 1\n\
                 sentinel down-after-milliseconds {name} 1000\n\
                 sentinel failover-timeout {name} 5000\n",
                port = self.port,
                dir = self.dir.path().display(),
            );
            fs::write(&conf, text).map_err(|e| format!("sentinel.conf: {e}"))?;
            command.arg(&conf).arg("--sentinel");
        } else {
            command
                .args(["--port", &self.port.to_string()])
                .args(["--bind", "127.0.0.1"])
                .args(["--save", ""])
                .args(["--appendonly", "no"])
                .arg("--dir")
                .arg(self.dir.path());
            if let Some(pw) = &self.password {
                command.args(["--requirepass", pw]);
            }
            if let Some(master_port) = self.replica_of {
                command.args(["--replicaof", "127.0.0.1", &master_port.to_string()]);
            }
        }
        let log_file = fs::File::create(&log).map_err(|e| format!("log: {e}"))?;
        let err_file = log_file.try_clone().map_err(|e| format!("log: {e}"))?;
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::from(log_file))
            .stderr(Stdio::from(err_file))
            .spawn()
            .map_err(|e| format!("cannot run redis-server: {e}"))?;
        self.child = Some(child);
        let deadline = Instant::now() + START_LIMIT;
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    self.child = None;
                    return Err(format!("exited with {status}: {}", tail(&log)));
                }
            }
            if self.answers_ping().await {
                return Ok(());
            }
            if Instant::now() > deadline {
                self.stop();
                return Err(format!("no PONG within {START_LIMIT:?}: {}", tail(&log)));
            }
            sleep(Duration::from_millis(50)).await;
        }
    }

    async fn answers_ping(&self) -> bool {
        let Ok(mut conn) = self.client().get_multiplexed_async_connection().await else {
            return false;
        };
        redis::cmd("PING")
            .query_async::<String>(&mut conn)
            .await
            .is_ok()
    }

    /// Runs `args` with a plain client and returns the reply as text
    /// lines (arrays flattened).
    pub async fn query(&self, args: &[&str]) -> redis::RedisResult<Vec<String>> {
        let mut conn = self.client().get_multiplexed_async_connection().await?;
        let mut cmd = redis::cmd(args[0]);
        for arg in &args[1..] {
            cmd.arg(*arg);
        }
        let value: redis::Value = cmd.query_async(&mut conn).await?;
        Ok(flatten(value))
    }

    /// The server's log file.
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("redis.log")
    }
}

impl Drop for RedisServer {
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

fn tail(log: &PathBuf) -> String {
    let text = fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(5)..].join(" | ")
}

fn flatten(value: redis::Value) -> Vec<String> {
    match value {
        redis::Value::Array(items) | redis::Value::Set(items) => {
            items.into_iter().flat_map(flatten).collect()
        }
        redis::Value::BulkString(bytes) => vec![String::from_utf8_lossy(&bytes).into_owned()],
        redis::Value::SimpleString(s) => vec![s],
        redis::Value::Okay => vec!["OK".into()],
        redis::Value::Int(n) => vec![n.to_string()],
        redis::Value::Nil => Vec::new(),
        other => vec![format!("{other:?}")],
    }
}
