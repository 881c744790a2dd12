//! A real single-member `etcd` on free loopback ports, in its own
//! temporary directory (data and log), killed on drop.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use rewire_etcd::pb::{request_op, PutRequest, RequestOp, TxnRequest};
use rewire_etcd::{Client, ConnectOptions, Error, TlsOptions};

use crate::certs::CertFiles;
use tokio::time::timeout;

use crate::child::ChildProcess;
pub use crate::free_port;

/// How long a server may take to answer its first request.
const START_LIMIT: Duration = Duration::from_secs(10);
/// Attempts at finding free ports.
const PORT_ATTEMPTS: usize = 5;
/// Limit on one request of a helper client.
const REQUEST_LIMIT: Duration = Duration::from_secs(2);

/// TLS for a test server: it serves `https://` only with `server` and
/// requires client certificates from `ca_path`; the helpers' own client
/// presents `client`.
#[derive(Debug, Clone)]
pub struct EtcdTls {
    /// The server's certificate and key.
    pub server: CertFiles,
    /// The CA file (signs the server's and the clients' certificates).
    pub ca_path: PathBuf,
    /// The CA, PEM.
    pub ca_pem: String,
    /// The certificate the helpers' own client presents.
    pub client: CertFiles,
}

/// A running `etcd`.
pub struct EtcdServer {
    process: ChildProcess,
    client_port: u16,
    tls: Option<EtcdTls>,
    /// `(user, password)` once authentication is on.
    root: Option<(String, String)>,
    _dir: tempfile::TempDir,
}

impl EtcdServer {
    /// A server on free ports.
    pub async fn start() -> Self {
        Self::start_with(None).await
    }

    /// A server speaking TLS only, requiring client certificates.
    pub async fn start_tls(tls: EtcdTls) -> Self {
        Self::start_with(Some(tls)).await
    }

    async fn start_with(tls: Option<EtcdTls>) -> Self {
        let mut last_error = String::new();
        for _ in 0..PORT_ATTEMPTS {
            let dir = tempfile::tempdir().expect("temp dir");
            let (client_port, peer_port) = (free_port(), free_port());
            let command = etcd_command(dir.path(), client_port, peer_port, tls.clone());
            let process = ChildProcess::new("etcd", dir.path().join("etcd.log"), command);
            let mut server = Self {
                process,
                client_port,
                tls: tls.clone(),
                root: None,
                _dir: dir,
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

    async fn try_client(&self) -> Result<Client, Error> {
        connect(&self.endpoint(), self.root.as_ref(), self.tls.as_ref()).await
    }

    /// The endpoint as a URL (`https://` with TLS).
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.endpoint())
    }

    /// Puts `key` = `value`; returns the revision of the write.
    pub async fn put(&self, key: &str, value: &str) -> i64 {
        let response = self
            .client()
            .await
            .put(key, value)
            .await
            .unwrap_or_else(|e| panic!("put {key}: {e}"));
        response.header.map_or(0, |h| h.revision)
    }

    /// Puts every `(key, value)` of `pairs` in one transaction (one
    /// revision); returns that revision.
    pub async fn put_all(&self, pairs: &[(&str, &str)]) -> i64 {
        let success = pairs
            .iter()
            .map(|(key, value)| RequestOp {
                request: Some(request_op::Request::RequestPut(PutRequest {
                    key: key.as_bytes().to_vec(),
                    value: value.as_bytes().to_vec(),
                    ..PutRequest::default()
                })),
            })
            .collect();
        let request = TxnRequest {
            success,
            ..TxnRequest::default()
        };
        let response = self
            .client()
            .await
            .txn(request)
            .await
            .unwrap_or_else(|e| panic!("txn: {e}"));
        response.header.map_or(0, |h| h.revision)
    }

    /// Deletes `key`; returns the revision of the delete.
    pub async fn delete(&self, key: &str) -> i64 {
        let response = self
            .client()
            .await
            .delete(key)
            .await
            .unwrap_or_else(|e| panic!("delete {key}: {e}"));
        response.header.map_or(0, |h| h.revision)
    }

    /// The value of `key`, if any.
    pub async fn value(&self, key: &str) -> Option<String> {
        let response = self
            .client()
            .await
            .get(key)
            .await
            .unwrap_or_else(|e| panic!("get {key}: {e}"));
        response
            .kvs
            .first()
            .map(|kv| String::from_utf8_lossy(&kv.value).into_owned())
    }

    /// The store's current revision.
    pub async fn revision(&self) -> i64 {
        let response = self.client().await.get("\0").await.expect("revision");
        response.header.map_or(0, |h| h.revision)
    }

    /// Compacts (physically) at the current revision, with a separate
    /// client; returns that revision.
    pub async fn compact(&self) -> i64 {
        let revision = self.revision().await;
        self.client()
            .await
            .compact(revision, true)
            .await
            .unwrap_or_else(|e| panic!("compact at {revision}: {e}"));
        revision
    }

    /// Turns authentication on with user `root` (role `root`) and
    /// `password`; the helpers log in as root afterwards.
    pub async fn enable_auth(&mut self, password: &str) {
        let client = self.client().await;
        client
            .user_add("root", password)
            .await
            .expect("user add root");
        client
            .user_grant_role("root", "root")
            .await
            .expect("grant root");
        client.auth_enable().await.expect("auth enable");
        self.root = Some(("root".into(), password.into()));
    }

    /// Kills the server (its ports become free, its data stays).
    pub fn stop(&mut self) {
        self.process.stop();
    }

    /// Starts the server again on the same ports and data directory
    /// (retrying while a port is still held); a no-op if it runs.
    pub async fn start_again(&mut self) {
        if self.process.is_running() {
            return;
        }
        self.restart().await;
    }

    /// Kills the server and starts it again on the same ports and data.
    pub async fn restart(&mut self) {
        let (endpoint, root, tls) = (self.endpoint(), self.root.clone(), self.tls.clone());
        let answers = move || answers(endpoint.clone(), root.clone(), tls.clone());
        if let Err(err) = self.process.restart(START_LIMIT, answers).await {
            panic!("{err}");
        }
    }

    /// Kills a TLS server and starts it again (same ports and data) with
    /// `server`'s certificate and key, trusting client certificates from
    /// `ca_pem` only (written over the files it was started with); the
    /// helpers' own client then trusts `ca_pem` and presents `client`. A
    /// CA rollover that the server's clients must follow.
    pub async fn restart_with_tls(&mut self, server: &CertFiles, ca_pem: &str, client: CertFiles) {
        let tls = self
            .tls
            .as_mut()
            .expect("restart_with_tls: not a TLS server");
        server.install_at(&tls.server.cert_path, &tls.server.key_path);
        crate::certs::replace_file(&tls.ca_path, ca_pem);
        tls.server.cert_pem.clone_from(&server.cert_pem);
        tls.server.key_pem.clone_from(&server.key_pem);
        tls.ca_pem = ca_pem.to_string();
        tls.client = client;
        self.restart().await;
    }

    /// Stops the server with SIGTERM and starts it again on the same ports
    /// and data. Unlike [`restart`](Self::restart) (a kill), the server
    /// commits its data before it exits, so the new process replays none
    /// of the raft log: the auth tokens it issued (`simple` tokens live in
    /// memory, re-created only by that replay) are gone, as after a
    /// restart of a long-running server.
    pub async fn restart_gracefully(&mut self) {
        if let Err(err) = self.process.terminate() {
            panic!("etcd did not stop: {err}");
        }
        self.restart().await;
    }

    /// Kills the server and starts it again on the same ports with an
    /// EMPTY data directory: a cluster re-created (or restored from an
    /// old backup) whose revisions start over. Authentication is off again.
    pub async fn restart_empty(&mut self) {
        self.process.stop();
        let data = self._dir.path().join("data");
        if let Err(err) = std::fs::remove_dir_all(&data) {
            panic!("remove {}: {err}", data.display());
        }
        self.root = None;
        self.restart().await;
    }

    async fn launch(&mut self) -> Result<(), String> {
        let (endpoint, root, tls) = (self.endpoint(), self.root.clone(), self.tls.clone());
        let answers = move || answers(endpoint.clone(), root.clone(), tls.clone());
        self.process.start(START_LIMIT, answers).await
    }

    /// The server's log file.
    pub fn log_path(&self) -> PathBuf {
        self.process.log_path().to_path_buf()
    }
}

async fn connect(
    endpoint: &str,
    root: Option<&(String, String)>,
    tls: Option<&EtcdTls>,
) -> Result<Client, Error> {
    let options = ConnectOptions {
        connect_timeout: REQUEST_LIMIT,
        timeout: REQUEST_LIMIT,
        user: root.cloned(),
        tls: tls.map(|tls| TlsOptions {
            ca_pem: Some(tls.ca_pem.clone().into_bytes()),
            identity: Some((
                tls.client.cert_pem.clone().into_bytes(),
                tls.client.key_pem.clone().into_bytes(),
            )),
            domain: None,
        }),
        ..ConnectOptions::default()
    };
    let scheme = if tls.is_some() { "https" } else { "http" };
    Client::connect(&[format!("{scheme}://{endpoint}")], options).await
}

async fn answers(endpoint: String, root: Option<(String, String)>, tls: Option<EtcdTls>) -> bool {
    let probe = async {
        let client = connect(&endpoint, root.as_ref(), tls.as_ref()).await.ok()?;
        client.status().await.ok()
    };
    matches!(timeout(REQUEST_LIMIT, probe).await, Ok(Some(_)))
}

fn etcd_command(
    dir: &Path,
    client_port: u16,
    peer_port: u16,
    tls: Option<EtcdTls>,
) -> impl Fn() -> Command + Send + Sync + 'static {
    let data = dir.join("data");
    move || {
        let scheme = if tls.is_some() { "https" } else { "http" };
        let client_url = format!("{scheme}://127.0.0.1:{client_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let mut command = Command::new("etcd");
        command
            .args(["--name", "t"])
            // Fast election, so a (re)start takes ~0.1 s rather than ~1.5 s.
            .args(["--heartbeat-interval", "10", "--election-timeout", "100"])
            .arg("--data-dir")
            .arg(&data)
            .args(["--listen-client-urls", &client_url])
            .args(["--advertise-client-urls", &client_url])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("t={peer_url}")]);
        if let Some(tls) = &tls {
            command
                .arg("--cert-file")
                .arg(&tls.server.cert_path)
                .arg("--key-file")
                .arg(&tls.server.key_path)
                .arg("--trusted-ca-file")
                .arg(&tls.ca_path)
                .arg("--client-cert-auth");
        }
        command
    }
}
