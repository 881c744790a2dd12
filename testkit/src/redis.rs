//! A real `redis-server` (or sentinel) on a free loopback port, in its own
//! temporary directory, killed on drop.

use std::fs;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use crate::certs::{CertFiles, TestCa};
use crate::child::ChildProcess;
pub use crate::free_port;

/// How long a server may take to answer its first `PING`.
const START_LIMIT: Duration = Duration::from_secs(10);
/// Attempts at finding a free port.
const PORT_ATTEMPTS: usize = 5;

/// Builds the command of one start.
type CommandFn = Box<dyn Fn() -> Command + Send + Sync>;

/// A running `redis-server`.
pub struct RedisServer {
    process: ChildProcess,
    port: u16,
    password: Option<String>,
    tls: Option<RedisTls>,
    _dir: tempfile::TempDir,
}

/// TLS for a test server: it serves TLS only, and requires a client
/// certificate from `ca_pem`; the helpers' own client presents `client`.
#[derive(Debug, Clone)]
pub struct RedisTls {
    /// The server's certificate and key.
    pub server: CertFiles,
    /// The CA file: signs the server's certificate, and the clients' ones
    /// the server accepts.
    pub ca_path: PathBuf,
    /// The CA, PEM.
    pub ca_pem: String,
    /// The certificate the helpers' own client presents.
    pub client: CertFiles,
}

impl RedisTls {
    /// Every certificate from `ca`: the server's (`redis`) and the
    /// helpers' client's (`helper`).
    pub fn from_ca(ca: &TestCa) -> Self {
        Self {
            server: ca.server("redis"),
            ca_path: ca.ca_path.clone(),
            ca_pem: ca.ca_pem.clone(),
            client: ca.client("helper"),
        }
    }
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
        Self::start_any_port(password, None, None, None).await
    }

    /// A server speaking TLS only (`--tls-port`, plain port off) that
    /// requires a client certificate, with `password` if given.
    pub async fn start_tls(tls: RedisTls, password: Option<&str>) -> Self {
        Self::start_any_port(password.map(str::to_string), None, None, Some(tls)).await
    }

    /// A replica of the server at `master_port` (no password).
    pub async fn start_replica_of(master_port: u16) -> Self {
        Self::start_any_port(None, None, Some(master_port), None).await
    }

    /// A sentinel monitoring the master at `master_port` under `name`
    /// (quorum 1, down after 1 s).
    pub async fn start_sentinel(name: &str, master_port: u16) -> Self {
        Self::start_any_port(None, Some((name.to_string(), master_port)), None, None).await
    }

    async fn start_any_port(
        password: Option<String>,
        sentinel_of: Option<(String, u16)>,
        replica_of: Option<u16>,
        tls: Option<RedisTls>,
    ) -> Self {
        let mut last_error = String::new();
        for _ in 0..PORT_ATTEMPTS {
            let port = free_port();
            let dir = tempfile::tempdir().expect("temp dir");
            let command = match &sentinel_of {
                Some((name, master_port)) => {
                    match sentinel_command(dir.path(), port, name, *master_port) {
                        Ok(command) => command,
                        Err(err) => {
                            last_error = err;
                            continue;
                        }
                    }
                }
                None => server_command(dir.path(), port, password.clone(), replica_of, tls.clone()),
            };
            let process = ChildProcess::new("redis-server", dir.path().join("redis.log"), command);
            let mut server = Self {
                process,
                port,
                password: password.clone(),
                tls: tls.clone(),
                _dir: dir,
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
        client(self.port, self.password.as_deref(), self.tls.as_ref())
    }

    /// A plain client of this server authenticating with `password` (after
    /// the server's password was changed with `CONFIG SET requirepass`).
    pub fn client_with_password(&self, password: &str) -> redis::Client {
        client(self.port, Some(password), self.tls.as_ref())
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
        self.process.stop();
    }

    /// Starts the server again on the same port (retrying while the port
    /// is still held).
    pub async fn restart(&mut self) {
        let (port, password, tls) = (self.port, self.password.clone(), self.tls.clone());
        let answers = move || answers_ping(client(port, password.as_deref(), tls.as_ref()));
        if let Err(err) = self.process.restart(START_LIMIT, answers).await {
            panic!("{err}");
        }
    }

    async fn launch(&mut self) -> Result<(), String> {
        let (port, password, tls) = (self.port, self.password.clone(), self.tls.clone());
        let answers = move || answers_ping(client(port, password.as_deref(), tls.as_ref()));
        self.process.start(START_LIMIT, answers).await
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
        self.process.log_path().to_path_buf()
    }

    /// How many TLS handshakes the server refused (it logs each; they
    /// never reach `total_connections_received`).
    pub fn handshakes_refused(&self) -> usize {
        fs::read_to_string(self.log_path())
            .unwrap_or_default()
            .matches("Error accepting a client connection")
            .count()
    }
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

fn client(port: u16, password: Option<&str>, tls: Option<&RedisTls>) -> redis::Client {
    let Some(tls) = tls else {
        let url = match password {
            Some(pw) => format!("redis://:{pw}@127.0.0.1:{port}/"),
            None => format!("redis://127.0.0.1:{port}/"),
        };
        return redis::Client::open(url).expect("redis client");
    };
    let mut settings = redis::RedisConnectionInfo::default();
    if let Some(pw) = password {
        settings = settings.set_password(pw);
    }
    let address = redis::ConnectionAddr::TcpTls {
        host: "127.0.0.1".into(),
        port,
        insecure: false,
        tls_params: None,
    };
    let info = redis::IntoConnectionInfo::into_connection_info(address)
        .expect("connection info")
        .set_redis_settings(settings);
    let certificates = redis::TlsCertificates {
        client_tls: Some(redis::ClientTlsConfig {
            client_cert: tls.client.cert_pem.clone().into_bytes(),
            client_key: tls.client.key_pem.clone().into_bytes(),
        }),
        root_cert: Some(tls.ca_pem.clone().into_bytes()),
    };
    redis::Client::build_with_tls(info, certificates).expect("redis TLS client")
}

async fn answers_ping(client: redis::Client) -> bool {
    let Ok(mut conn) = client.get_multiplexed_async_connection().await else {
        return false;
    };
    redis::cmd("PING")
        .query_async::<String>(&mut conn)
        .await
        .is_ok()
}

fn server_command(
    dir: &std::path::Path,
    port: u16,
    password: Option<String>,
    replica_of: Option<u16>,
    tls: Option<RedisTls>,
) -> CommandFn {
    let dir = dir.to_path_buf();
    Box::new(move || {
        let mut command = Command::new("redis-server");
        match &tls {
            None => command.args(["--port", &port.to_string()]),
            Some(tls) => command
                .args(["--port", "0", "--tls-port", &port.to_string()])
                .arg("--tls-cert-file")
                .arg(&tls.server.cert_path)
                .arg("--tls-key-file")
                .arg(&tls.server.key_path)
                .arg("--tls-ca-cert-file")
                .arg(&tls.ca_path)
                .args(["--tls-auth-clients", "yes"]),
        };
        command
            .args(["--bind", "127.0.0.1"])
            .args(["--save", ""])
            .args(["--appendonly", "no"])
            .arg("--dir")
            .arg(&dir);
        if let Some(pw) = &password {
            command.args(["--requirepass", pw]);
        }
        if let Some(master_port) = replica_of {
            command.args(["--replicaof", "127.0.0.1", &master_port.to_string()]);
        }
        command
    })
}

/// Writes the sentinel's configuration file (the sentinel rewrites it).
fn sentinel_command(
    dir: &std::path::Path,
    port: u16,
    name: &str,
    master_port: u16,
) -> Result<CommandFn, String> {
    let conf = dir.join("sentinel.conf");
    let text = format!(
        "port {port}\nbind 127.0.0.1\ndir {dir}\n\
         sentinel monitor {name} 127.0.0.1 {master_port} 1\n\
         sentinel down-after-milliseconds {name} 1000\n\
         sentinel failover-timeout {name} 5000\n",
        dir = dir.display(),
    );
    fs::write(&conf, text).map_err(|e| format!("sentinel.conf: {e}"))?;
    Ok(Box::new(move || {
        let mut command = Command::new("redis-server");
        command.arg(&conf).arg("--sentinel");
        command
    }))
}
