//! An Apollo server for tests: the config service's client protocol
//! (`/configs`, `/notifications/v2` long polling, access-key signatures)
//! and the Open API's item and release routes, on 127.0.0.1.
//!
//! It keeps real Apollo state: per `(appId, cluster, namespace)` a draft of
//! items (what the Open API edits), the current release (configurations +
//! release key) and the notification id of that release (a global message
//! id, as Apollo's `ReleaseMessage.id`). A release copies the draft, gives it
//! a new release key and notification id, and wakes every held long poll.
//! Deleting a namespace (as the portal does) drops its releases and
//! announces a new notification id, after which `/configs` answers 404.
//! Fault switches make config service routes answer 500, hang, send
//! malformed JSON or an oversized body; counters record requests per route.

mod config_service;
pub mod hmac;
mod open_api;
mod stall;

pub use stall::Stall;

use crate::certs::CertFiles;
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::ops::Deref;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio_rustls::TlsAcceptor;

use axum::routing::{get, post, put};
use axum::Router;
use tokio::net::TcpSocket;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The app the helpers work on.
pub const APP_ID: &str = "checkout";
/// The cluster the helpers work on.
pub const CLUSTER: &str = "default";
/// The only environment of the Open API.
pub const ENV: &str = "DEV";

/// A route, for counters and faults.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Route {
    /// `GET /configs/{appId}/{cluster}/{namespace}`.
    Configs,
    /// `GET /notifications/v2`.
    Notifications,
    /// `PUT`/`DELETE /openapi/v1/.../items/{key}`.
    OpenApiItems,
    /// `POST /openapi/v1/.../releases`.
    OpenApiReleases,
    /// `GET /services/config` (the meta server).
    MetaServices,
}

/// A failure the config service routes can be switched to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Answer 500.
    ServerError,
    /// Do not answer until the fault is cleared or the server stops.
    Hang,
    /// Answer 200 with a body that is not JSON.
    MalformedJson,
    /// Answer 200 with a body of this many bytes (spaces, with its
    /// `Content-Length`): an answer no client should hold.
    Oversized(usize),
}

/// An item of a namespace's draft.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DraftItem {
    /// The item's value.
    pub value: String,
    /// Who created it (`dataChangeCreatedBy`).
    pub created_by: String,
    /// Who last changed it (`dataChangeLastModifiedBy`).
    pub modified_by: String,
}

/// One release of a namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleaseRecord {
    /// The release title.
    pub title: String,
    /// Who released it.
    pub released_by: String,
    /// The release key clients send back.
    pub release_key: String,
    /// The notification id of this release.
    pub notification_id: i64,
    /// The released items.
    pub configurations: BTreeMap<String, String>,
}

#[derive(Debug, Default)]
struct Namespace {
    draft: BTreeMap<String, DraftItem>,
    releases: Vec<ReleaseRecord>,
}

type NamespaceId = (String, String, String);

#[derive(Debug, Default)]
struct Data {
    namespaces: BTreeMap<NamespaceId, Namespace>,
    last_message_id: i64,
    /// The latest release message id of each namespace (Apollo's
    /// `ReleaseMessage` table): what long polls announce. Kept when the
    /// namespace is deleted, which sends a message of its own.
    messages: BTreeMap<NamespaceId, i64>,
}

/// One `GET /configs` request, as the server received it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigRequest {
    /// The namespace asked for.
    pub namespace: String,
    /// The `releaseKey` parameter, if any.
    pub release_key: Option<String>,
    /// The `messages` parameter (JSON text), if any.
    pub messages: Option<String>,
}

/// The server's state, kept across a stop and restart.
#[derive(Debug)]
pub struct Shared {
    data: Mutex<Data>,
    /// Bumped by every release; held long polls wait on it.
    released: watch::Sender<u64>,
    faults: watch::Sender<HashMap<Route, Fault>>,
    hold: Mutex<Duration>,
    secret: Mutex<Option<String>>,
    open_api_token: Mutex<Option<String>>,
    counters: Mutex<HashMap<Route, u64>>,
    /// Every `/configs` request, oldest first.
    config_requests: Mutex<Vec<ConfigRequest>>,
    /// The config service instances the meta route announces.
    config_services: Mutex<Vec<String>>,
    outstanding_polls: AtomicUsize,
    held_polls_notified: AtomicU64,
    signatures_verified: AtomicU64,
    signatures_rejected: AtomicU64,
    /// Whether `/configs` answers from a release cache one release behind.
    stale_release_cache: std::sync::atomic::AtomicBool,
    /// The item key whose Open API edits (put, delete) answer 500.
    failing_item: Mutex<Option<String>>,
    /// The status releases answer once made (a gateway or portal failing
    /// after the release went through).
    release_answer: Mutex<Option<u16>>,
    /// The Open API requests made to wait (see [`Stall`]).
    stall: watch::Sender<Option<Stall>>,
    /// How many are waiting.
    stalled: watch::Sender<usize>,
}

fn id(namespace: &str) -> NamespaceId {
    (
        APP_ID.to_string(),
        CLUSTER.to_string(),
        namespace.to_string(),
    )
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    fn new() -> Self {
        Self {
            data: Mutex::default(),
            released: watch::channel(0).0,
            faults: watch::channel(HashMap::new()).0,
            hold: Mutex::new(Duration::from_secs(2)),
            secret: Mutex::new(None),
            open_api_token: Mutex::new(None),
            counters: Mutex::default(),
            config_requests: Mutex::default(),
            config_services: Mutex::default(),
            outstanding_polls: AtomicUsize::new(0),
            held_polls_notified: AtomicU64::new(0),
            signatures_verified: AtomicU64::new(0),
            stale_release_cache: std::sync::atomic::AtomicBool::new(false),
            signatures_rejected: AtomicU64::new(0),
            failing_item: Mutex::new(None),
            release_answer: Mutex::new(None),
            stall: watch::channel(None).0,
            stalled: watch::channel(0).0,
        }
    }

    /// Creates `namespace` of the app with an empty draft and no release.
    pub fn create_namespace(&self, namespace: &str) {
        lock(&self.data)
            .namespaces
            .entry(id(namespace))
            .or_default();
    }

    /// Replaces the draft of `namespace` with `pairs` and releases it, as
    /// `admin`; returns the new release key.
    pub fn release(&self, namespace: &str, pairs: &[(&str, &str)]) -> String {
        {
            let mut data = lock(&self.data);
            let ns = data.namespaces.entry(id(namespace)).or_default();
            ns.draft = pairs
                .iter()
                .map(|(k, v)| {
                    let item = DraftItem {
                        value: v.to_string(),
                        created_by: "admin".into(),
                        modified_by: "admin".into(),
                    };
                    (k.to_string(), item)
                })
                .collect();
        }
        self.release_draft(&id(namespace), "test release", "admin")
            .map(|r| r.release_key)
            .unwrap_or_default()
    }

    /// Releases the draft of `ns`; `None` if there is no such namespace.
    fn release_draft(&self, ns: &NamespaceId, title: &str, by: &str) -> Option<ReleaseRecord> {
        let record = {
            let mut data = lock(&self.data);
            data.last_message_id += 1;
            let message_id = data.last_message_id;
            let namespace = data.namespaces.get_mut(ns)?;
            let record = ReleaseRecord {
                title: title.to_string(),
                released_by: by.to_string(),
                release_key: format!("20260101000000-{message_id:04}{:08x}", rand_part()),
                notification_id: message_id,
                configurations: namespace
                    .draft
                    .iter()
                    .map(|(k, i)| (k.clone(), i.value.clone()))
                    .collect(),
            };
            namespace.releases.push(record.clone());
            data.messages.insert(ns.clone(), message_id);
            record
        };
        self.released.send_modify(|n| *n += 1);
        Some(record)
    }

    /// Deletes `namespace` (draft and releases), as the portal does: a
    /// release message announces it to long polls, and `/configs` answers
    /// 404 for it until it is released again. Returns the message's
    /// notification id.
    pub fn delete_namespace(&self, namespace: &str) -> i64 {
        let message_id = {
            let mut data = lock(&self.data);
            data.namespaces.remove(&id(namespace));
            data.last_message_id += 1;
            let message_id = data.last_message_id;
            data.messages.insert(id(namespace), message_id);
            message_id
        };
        self.released.send_modify(|n| *n += 1);
        message_id
    }

    /// The notification id long polls announce for `ns`, if any message
    /// was sent for it.
    fn message_id_of(&self, ns: &NamespaceId) -> Option<i64> {
        lock(&self.data).messages.get(ns).copied()
    }

    /// The current release of `namespace`.
    pub fn current(&self, namespace: &str) -> Option<ReleaseRecord> {
        self.current_of(&id(namespace))
    }

    fn current_of(&self, ns: &NamespaceId) -> Option<ReleaseRecord> {
        lock(&self.data)
            .namespaces
            .get(ns)?
            .releases
            .last()
            .cloned()
    }

    /// Every release of `namespace`, oldest first.
    pub fn releases(&self, namespace: &str) -> Vec<ReleaseRecord> {
        lock(&self.data)
            .namespaces
            .get(&id(namespace))
            .map(|ns| ns.releases.clone())
            .unwrap_or_default()
    }

    /// The draft of `namespace`.
    pub fn draft(&self, namespace: &str) -> BTreeMap<String, DraftItem> {
        lock(&self.data)
            .namespaces
            .get(&id(namespace))
            .map(|ns| ns.draft.clone())
            .unwrap_or_default()
    }

    /// Switches `route` to `fault` (`None` heals it).
    pub fn set_fault(&self, route: Route, fault: Option<Fault>) {
        self.faults.send_modify(|faults| match fault {
            Some(fault) => {
                faults.insert(route, fault);
            }
            None => {
                faults.remove(&route);
            }
        });
    }

    /// Makes the Open API's edits of item `key` (put and delete, in any
    /// namespace) answer 500, leaving the draft as it is; `None` heals it.
    pub fn fail_item(&self, key: Option<&str>) {
        *lock(&self.failing_item) = key.map(str::to_string);
    }

    /// Makes the Open API's releases go through, then answer `status`
    /// (a proxy's 502 whose portal released); `None` heals it.
    pub fn answer_releases_with(&self, status: Option<u16>) {
        *lock(&self.release_answer) = status;
    }

    fn release_answer(&self) -> Option<u16> {
        *lock(&self.release_answer)
    }

    fn item_fails(&self, key: &str) -> bool {
        lock(&self.failing_item).as_deref() == Some(key)
    }

    fn fault(&self, route: Route) -> Option<Fault> {
        self.faults.borrow().get(&route).copied()
    }

    /// Plays a config service whose release cache (Apollo's
    /// `ConfigServiceWithCache`) has not caught up with the latest release
    /// yet: `/configs` answers the release before the latest one, unless
    /// the request's `messages` carry the latest release's notification id
    /// (then the cache is reloaded, as Apollo does).
    pub fn set_stale_release_cache(&self, stale: bool) {
        self.stale_release_cache.store(stale, Ordering::SeqCst);
    }

    /// The release `/configs` answers for `ns`: the latest, or the one
    /// before it while the release cache is stale and `messages` (the
    /// request's, if any) do not name the latest.
    fn served_of(&self, ns: &NamespaceId, messages: Option<&str>) -> Option<ReleaseRecord> {
        let data = lock(&self.data);
        let releases = &data.namespaces.get(ns)?.releases;
        let latest = releases.last()?.clone();
        if !self.stale_release_cache.load(Ordering::SeqCst) || releases.len() < 2 {
            return Some(latest);
        }
        let watch_key = format!("{}+{}+{}", ns.0, ns.1, ns.2);
        let known = messages
            .and_then(|text| serde_json::from_str::<serde_json::Value>(text).ok())
            .and_then(|m| m.get("details")?.get(&watch_key)?.as_i64());
        if known.is_some_and(|id| id >= latest.notification_id) {
            return Some(latest);
        }
        Some(releases[releases.len() - 2].clone())
    }

    /// How long a long poll is held before a 304.
    pub fn set_hold(&self, hold: Duration) {
        *lock(&self.hold) = hold;
    }

    /// Requires access-key signatures made with `secret`.
    pub fn require_secret(&self, secret: &str) {
        *lock(&self.secret) = Some(secret.to_string());
    }

    /// Requires no signature any more (the app's access key removed).
    pub fn require_no_secret(&self) {
        *lock(&self.secret) = None;
    }

    /// Accepts Open API calls carrying `token`.
    pub fn accept_open_api_token(&self, token: &str) {
        *lock(&self.open_api_token) = Some(token.to_string());
    }

    /// Has the meta route (`/services/config`) announce `urls` as the
    /// config service instances.
    pub fn announce_config_services(&self, urls: &[String]) {
        *lock(&self.config_services) = urls.to_vec();
    }

    /// The announced config service instances.
    fn config_services(&self) -> Vec<String> {
        lock(&self.config_services).clone()
    }

    /// Requests received on `route`.
    pub fn requests(&self, route: Route) -> u64 {
        lock(&self.counters).get(&route).copied().unwrap_or(0)
    }

    fn count(&self, route: Route) {
        *lock(&self.counters).entry(route).or_insert(0) += 1;
    }

    /// Every `/configs` request received for `namespace`, oldest first.
    pub fn config_requests(&self, namespace: &str) -> Vec<ConfigRequest> {
        lock(&self.config_requests)
            .iter()
            .filter(|r| r.namespace == namespace)
            .cloned()
            .collect()
    }

    fn record_config_request(&self, request: ConfigRequest) {
        lock(&self.config_requests).push(request);
    }

    /// Long polls being held right now.
    pub fn outstanding_polls(&self) -> usize {
        self.outstanding_polls.load(Ordering::SeqCst)
    }

    /// Long polls that were held and then answered 200 by a release.
    pub fn held_polls_notified(&self) -> u64 {
        self.held_polls_notified.load(Ordering::SeqCst)
    }

    /// Signatures checked and accepted.
    pub fn signatures_verified(&self) -> u64 {
        self.signatures_verified.load(Ordering::SeqCst)
    }

    /// Requests refused for a missing or wrong signature.
    pub fn signatures_rejected(&self) -> u64 {
        self.signatures_rejected.load(Ordering::SeqCst)
    }

    /// Waits (up to `patience`) until a long poll is held.
    pub async fn wait_for_held_poll(&self, patience: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + patience;
        while self.outstanding_polls() == 0 {
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        true
    }
}

/// Some bits that differ between runs, for release keys.
fn rand_part() -> u32 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    nanos ^ std::process::id()
}

/// The state a request handler sees.
#[derive(Clone)]
struct AppState {
    shared: Arc<Shared>,
    /// Cancelled when this run of the server stops.
    stop: CancellationToken,
}

fn router(state: AppState) -> Router {
    let namespace =
        "/openapi/v1/envs/{env}/apps/{app_id}/clusters/{cluster}/namespaces/{namespace}";
    Router::new()
        .route(
            "/configs/{app_id}/{cluster}/{namespace}",
            get(config_service::configs),
        )
        .route("/notifications/v2", get(config_service::notifications))
        .route("/services/config", get(meta_services))
        .route(
            &format!("{namespace}/items/{{key}}"),
            put(open_api::put_item).delete(open_api::delete_item),
        )
        .route(&format!("{namespace}/releases"), post(open_api::release))
        .with_state(state)
}

/// `GET /services/config?appId=..`: the meta server's list of config
/// service instances, as Apollo's meta service answers it.
async fn meta_services(
    axum::extract::State(app): axum::extract::State<AppState>,
) -> axum::Json<serde_json::Value> {
    app.shared.count(Route::MetaServices);
    let instances: Vec<serde_json::Value> = app
        .shared
        .config_services()
        .iter()
        .map(|url| {
            serde_json::json!({
                "appName": "APOLLO-CONFIGSERVICE",
                "instanceId": url,
                "homepageUrl": format!("{url}/"),
            })
        })
        .collect();
    axum::Json(serde_json::Value::Array(instances))
}

/// A running server.
pub struct ApolloServer {
    addr: SocketAddr,
    tls: Option<TlsAcceptor>,
    shared: Arc<Shared>,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

/// A stopped server: its state and port, ready to restart.
pub struct StoppedServer {
    addr: SocketAddr,
    tls: Option<TlsAcceptor>,
    shared: Arc<Shared>,
}

impl ApolloServer {
    /// A server on a free port holding long polls 2 s.
    pub async fn start() -> Self {
        Self::serve(
            Arc::new(Shared::new()),
            "127.0.0.1:0".parse().unwrap(),
            None,
        )
        .await
    }

    /// A server on a free port speaking https only, with `certificate`.
    pub async fn start_tls(certificate: &CertFiles) -> Self {
        let acceptor = tls_acceptor(certificate);
        Self::serve(
            Arc::new(Shared::new()),
            "127.0.0.1:0".parse().unwrap(),
            Some(acceptor),
        )
        .await
    }

    /// A server on a free port speaking https only, with `certificate`,
    /// requiring client certificates signed by `client_ca_pem`.
    pub async fn start_mtls(certificate: &CertFiles, client_ca_pem: &str) -> Self {
        let acceptor = tls_acceptor_requiring(certificate, client_ca_pem);
        Self::serve(
            Arc::new(Shared::new()),
            "127.0.0.1:0".parse().unwrap(),
            Some(acceptor),
        )
        .await
    }

    async fn serve(shared: Arc<Shared>, addr: SocketAddr, tls: Option<TlsAcceptor>) -> Self {
        let listener = bind(addr).await;
        let addr = listener.local_addr().expect("local addr");
        let stop = CancellationToken::new();
        let app = router(AppState {
            shared: Arc::clone(&shared),
            stop: stop.clone(),
        });
        let signal = stop.clone();
        let acceptor = tls.clone();
        let task = tokio::spawn(async move {
            let shutdown = async move { signal.cancelled().await };
            let served = match acceptor {
                None => {
                    axum::serve(listener, app)
                        .with_graceful_shutdown(shutdown)
                        .await
                }
                Some(acceptor) => {
                    let listener = TlsListener { listener, acceptor };
                    axum::serve(listener, app)
                        .with_graceful_shutdown(shutdown)
                        .await
                }
            };
            if let Err(err) = served {
                eprintln!("apollo test server: {err}");
            }
        });
        Self {
            addr,
            tls,
            shared,
            stop,
            task,
        }
    }

    /// The base URL (`http://127.0.0.1:port`, `https://` with TLS).
    pub fn url(&self) -> String {
        url(self.addr, self.tls.is_some())
    }

    /// Another instance serving the same state (one database behind
    /// several config services) on its own free port.
    pub async fn replica(&self) -> ApolloServer {
        Self::serve(
            Arc::clone(&self.shared),
            "127.0.0.1:0".parse().unwrap(),
            self.tls.clone(),
        )
        .await
    }

    /// Stops serving (connections closed, port freed), keeping the state.
    pub async fn stop(self) -> StoppedServer {
        self.stop.cancel();
        if tokio::time::timeout(Duration::from_secs(5), self.task)
            .await
            .is_err()
        {
            panic!("the apollo test server did not stop within 5 s");
        }
        StoppedServer {
            addr: self.addr,
            tls: self.tls,
            shared: self.shared,
        }
    }
}

impl Deref for ApolloServer {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.shared
    }
}

impl StoppedServer {
    /// The base URL the server had.
    pub fn url(&self) -> String {
        url(self.addr, self.tls.is_some())
    }

    /// Serves the same state on the same port again, over https with
    /// `certificate`, requiring client certificates signed by
    /// `client_ca_pem` (a CA rollover).
    pub async fn restart_mtls(self, certificate: &CertFiles, client_ca_pem: &str) -> ApolloServer {
        let acceptor = tls_acceptor_requiring(certificate, client_ca_pem);
        ApolloServer::serve(self.shared, self.addr, Some(acceptor)).await
    }

    /// Serves the same state on the same port again.
    pub async fn restart(self) -> ApolloServer {
        ApolloServer::serve(self.shared, self.addr, self.tls).await
    }
}

impl Deref for StoppedServer {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.shared
    }
}

fn url(addr: SocketAddr, tls: bool) -> String {
    format!("{}://{addr}", if tls { "https" } else { "http" })
}

/// A TLS acceptor (rustls, ring) serving `certificate`.
fn tls_acceptor(certificate: &CertFiles) -> TlsAcceptor {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let chain = CertificateDer::pem_slice_iter(certificate.cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .expect("certificate PEM");
    let key = PrivateKeyDer::from_pem_slice(certificate.key_pem.as_bytes()).expect("key PEM");
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("protocol versions")
    .with_no_client_auth()
    .with_single_cert(chain, key)
    .expect("server config");
    TlsAcceptor::from(Arc::new(config))
}

/// A TLS acceptor (rustls, ring) serving `certificate` and requiring a
/// client certificate signed by `client_ca_pem`.
fn tls_acceptor_requiring(certificate: &CertFiles, client_ca_pem: &str) -> TlsAcceptor {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for ca in CertificateDer::pem_slice_iter(client_ca_pem.as_bytes()) {
        roots.add(ca.expect("CA PEM")).expect("CA");
    }
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()
    .expect("client verifier");
    let chain = CertificateDer::pem_slice_iter(certificate.cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .expect("certificate PEM");
    let key = PrivateKeyDer::from_pem_slice(certificate.key_pem.as_bytes()).expect("key PEM");
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .expect("server config");
    TlsAcceptor::from(Arc::new(config))
}

/// Accepts TCP connections and completes their TLS handshakes (one at a
/// time, within 5 s; a failed handshake is skipped).
struct TlsListener {
    listener: tokio::net::TcpListener,
    acceptor: TlsAcceptor,
}

impl axum::serve::Listener for TlsListener {
    type Io = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let Ok((stream, peer)) = self.listener.accept().await else {
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            };
            let handshake = self.acceptor.accept(stream);
            if let Ok(Ok(stream)) = tokio::time::timeout(Duration::from_secs(5), handshake).await {
                return (stream, peer);
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.listener.local_addr()
    }
}

/// Binds `addr` (retrying a little: a restart rebinds a port just freed).
async fn bind(addr: SocketAddr) -> tokio::net::TcpListener {
    let mut last = None;
    for _ in 0..50 {
        let attempt = TcpSocket::new_v4().and_then(|socket| {
            socket.set_reuseaddr(true)?;
            socket.bind(addr)?;
            socket.listen(1024)
        });
        match attempt {
            Ok(listener) => return listener,
            Err(err) => last = Some(err),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("cannot bind {addr}: {last:?}");
}
