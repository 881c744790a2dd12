//! [`ConfigServices`]: the config service instances a store talks to — the
//! list in `config_server`, or the one the meta server (`meta_server`)
//! announces — and failing over between them.
//!
//! Every fetch and long poll goes to one instance (the first to begin
//! with). When that instance is down — no connection, no answer within
//! the limit, or an HTTP 5xx — the request is made at once on the next
//! one, each instance at most once per request and at most
//! [`MAX_INSTANCES_PER_REQUEST`] per request (so a request waits for at
//! most that many timeouts); later requests stay on the instance that
//! answered, or go on from the next one untried. When the instances tried
//! all failed, the error goes back to the caller, whose retries back off
//! (`retryIntervalMs` doubling up to `maxRetryIntervalMs`) while the store
//! serves the last good configuration or the backup cache.
//!
//! With `meta_server`, `GET {meta_server}/services/config?appId=..` lists
//! the instances (`[{"homepageUrl": "http://host:8080/"}, ..]`). It is
//! asked at start, again every `metaRefreshIntervalMs`, and whenever the
//! instances a request tried all failed. An answer that cannot be used
//! (meta server down, malformed, empty list) keeps the instances known so
//! far. Of a longer list, the first [`MAX_INSTANCES`] distinct addresses
//! (each at most [`MAX_ADDRESS_BYTES`] long) are taken, warned about once;
//! logs name at most [`LOGGED_ADDRESSES`] of them.
//! The same instances in another order change nothing. When none of the
//! instances it announces is known, the long poll forgets its
//! notification ids ([`take_moved`](ConfigServices::take_moved)): they may
//! be another Apollo's, whose ids are below ours. One instance replaced
//! (a pod restarted with a new address) keeps them, and the release
//! messages that guard against a lagging instance.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::{StatusCode, Url};
use serde::Deserialize;
use tokio::time::Instant;
use tracing::{info, warn};

use super::client::{
    base_url, http_client, join, read_body, shown_url, BodyError, ClientSettings,
    ConfigServiceClient, Fetched, Notification, MAX_ANSWER_BYTES,
};
use super::error::{excerpt, ApolloError};
use super::release_messages::ReleaseMessages;
use crate::redacted::shown_addresses;

/// The most config service instances taken from the meta server's answer
/// (its first distinct ones): a real Apollo runs a handful, and each one
/// costs an HTTP client (its own connection pool).
pub(crate) const MAX_INSTANCES: usize = 64;

/// The longest instance address taken from the meta server's answer;
/// longer ones are skipped.
pub(crate) const MAX_ADDRESS_BYTES: usize = 2048;

/// The most instances one request tries before its error goes back to
/// the caller (who backs off): a request waits for at most this many
/// timeouts, however many instances are down.
pub(crate) const MAX_INSTANCES_PER_REQUEST: usize = 3;

/// The most addresses a log line names (then how many more there are).
const LOGGED_ADDRESSES: usize = 8;

/// The most characters of one address a log line shows.
const LOGGED_ADDRESS_CHARS: usize = 200;

/// What every instance's client is built with.
#[derive(Clone)]
pub(crate) struct InstanceSettings {
    pub app_id: String,
    pub cluster: String,
    pub secret: Option<String>,
    pub ip: Option<String>,
    pub request_timeout: Duration,
    pub long_poll_timeout: Duration,
    pub tls: rustls::ClientConfig,
    /// Whether TLS is configured (client material, or an `https://`
    /// server): an `http://` instance announced then is warned about.
    pub tls_configured: bool,
}

impl InstanceSettings {
    fn client(&self, server: &str, field: &str) -> Result<ConfigServiceClient, ApolloError> {
        ConfigServiceClient::new(ClientSettings {
            server,
            field,
            app_id: &self.app_id,
            cluster: &self.cluster,
            secret: self.secret.as_deref(),
            ip: self.ip.as_deref(),
            request_timeout: self.request_timeout,
            long_poll_timeout: self.long_poll_timeout,
            tls: &self.tls,
        })
    }
}

/// The meta server and when it was last asked.
struct Discovery {
    url: Url,
    /// Replaced when the TLS material changes.
    http: Mutex<reqwest::Client>,
    every: Duration,
    asked: Mutex<Option<Instant>>,
}

/// One entry of the meta server's answer.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ServiceInstance {
    homepage_url: String,
}

/// The config service instances and the one in use.
pub(crate) struct ConfigServices {
    instances: Mutex<Arc<Vec<Arc<ConfigServiceClient>>>>,
    current: AtomicUsize,
    settings: InstanceSettings,
    /// The TLS configuration in force (`settings.tls` until replaced).
    tls: Mutex<rustls::ClientConfig>,
    discovery: Option<Discovery>,
    /// Counts the replacements of the TLS configuration.
    replaced: tokio::sync::watch::Sender<u64>,
    /// The `http://` instances announced while TLS is configured, each
    /// warned about once.
    warned_plaintext: Mutex<Vec<String>>,
    /// Set once an answer of the meta server was cut down to
    /// [`MAX_INSTANCES`] (warned about once; cleared by an answer that was
    /// not).
    warned_trimmed: AtomicBool,
    /// Set when the meta server announced instances none of which was
    /// known (taken by [`take_moved`](Self::take_moved)).
    moved: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for ConfigServices {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConfigServices")
            .field("servers", &self.servers())
            .field(
                "meta_server",
                &self.discovery.as_ref().map(|d| shown_url(&d.url)),
            )
            .finish()
    }
}

/// Splits a `config_server` list: comma-separated (a comma inside a URL's
/// credentials does not split it), blanks dropped.
pub(crate) fn server_list(text: &str) -> Vec<String> {
    crate::redacted::address_parts(text)
        .into_iter()
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

impl ConfigServices {
    /// The instances of `config_server` (comma-separated), or, with
    /// `meta_server`, the ones it announces (asked now; `config_server`,
    /// if also given, is used while it cannot be asked).
    pub(crate) async fn new(
        config_server: &str,
        meta_server: Option<&str>,
        meta_refresh: Duration,
        settings: InstanceSettings,
    ) -> Result<Self, ApolloError> {
        let mut instances = Vec::new();
        for server in server_list(config_server) {
            instances.push(Arc::new(settings.client(&server, "config_server")?));
        }
        let discovery = match meta_server.map(str::trim).filter(|m| !m.is_empty()) {
            None => None,
            Some(meta) => Some(Discovery {
                url: base_url(meta, "meta_server")?,
                http: Mutex::new(http_client(&settings.tls, settings.request_timeout)?),
                every: meta_refresh,
                asked: Mutex::new(None),
            }),
        };
        if instances.is_empty() && discovery.is_none() {
            return Err(ApolloError::Config(
                "metadata field `config_server` (or `meta_server`) is required".into(),
            ));
        }
        let services = Self {
            instances: Mutex::new(Arc::new(instances)),
            current: AtomicUsize::new(0),
            tls: Mutex::new(settings.tls.clone()),
            settings,
            discovery,
            replaced: tokio::sync::watch::Sender::new(0),
            warned_plaintext: Mutex::new(Vec::new()),
            warned_trimmed: AtomicBool::new(false),
            moved: std::sync::atomic::AtomicBool::new(false),
        };
        // Not answering: the first request asks again (and the store may
        // start from its backup cache meanwhile).
        if let Err(err) = services.discover().await {
            warn!(error = %err, servers = %services.servers(), "Apollo meta server not answering.");
        }
        // Nothing was learnt from the instances `config_server` named.
        services.moved.store(false, Ordering::Release);
        Ok(services)
    }

    /// The instance in use (its address, without credentials), for logs.
    pub(crate) fn server(&self) -> String {
        self.in_use()
            .map_or_else(String::new, |c| c.server().to_string())
    }

    /// The instance in use (its address as configured): never shown.
    fn address(&self) -> String {
        self.in_use()
            .map_or_else(String::new, |c| c.address().to_string())
    }

    fn in_use(&self) -> Option<Arc<ConfigServiceClient>> {
        let list = self.list();
        let index = self.current.load(Ordering::Acquire);
        list.get(index % list.len().max(1)).cloned()
    }

    /// Every known instance, comma-separated.
    pub(crate) fn servers(&self) -> String {
        self.list()
            .iter()
            .map(|c| c.server())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Fetches `namespace` (see [`ConfigServiceClient::fetch`]).
    pub(crate) async fn fetch(
        &self,
        namespace: &str,
        release_key: Option<&str>,
        messages: Option<&ReleaseMessages>,
    ) -> Result<Fetched, ApolloError> {
        self.failover(|client| async move { client.fetch(namespace, release_key, messages).await })
            .await
    }

    /// Long-polls (see [`ConfigServiceClient::poll`]).
    pub(crate) async fn poll(
        &self,
        known: &[Notification],
    ) -> Result<Option<Vec<Notification>>, ApolloError> {
        self.failover(|client| async move { client.poll(known).await })
            .await
    }

    /// Builds a client of every known instance with `tls` (new TLS
    /// material), checks that one answers a fetch of `probe` (from the
    /// instance in use on), then makes every later request use them.
    /// Requests in flight finish on the old clients;
    /// [`replacements`](Self::replacements) tells the long poll to poll
    /// again. On an error nothing changes.
    pub(crate) async fn replace_tls(
        &self,
        tls: rustls::ClientConfig,
        probe: &str,
    ) -> Result<(), ApolloError> {
        let known = self.list();
        let fresh = known
            .iter()
            .map(|client| client.with_tls(&tls).map(Arc::new))
            .collect::<Result<Vec<_>, _>>()?;
        let discovery_http = match &self.discovery {
            Some(_) => Some(http_client(&tls, self.settings.request_timeout)?),
            None => None,
        };
        let start = self.current.load(Ordering::Acquire);
        let mut last = None;
        for offset in 0..fresh.len() {
            let client = &fresh[(start + offset) % fresh.len()];
            match client.fetch(probe, None, None).await {
                Ok(_) => {
                    last = None;
                    break;
                }
                Err(err) => last = Some(err),
            }
        }
        if let Some(err) = last {
            return Err(err);
        }
        {
            // The material, the clients and the count of replacements
            // change together under the instances' lock (which
            // `discover` takes to swap its list in).
            let mut instances = self.instances.lock().unwrap_or_else(|p| p.into_inner());
            let fresh = if Arc::ptr_eq(&instances, &known) {
                fresh
            } else {
                // The meta server announced other instances meanwhile,
                // their clients built with the old material: built again
                // with the new (else a CA rollover would leave them
                // failing while the new material is taken as in force).
                instances
                    .iter()
                    .map(|client| client.with_tls(&tls).map(Arc::new))
                    .collect::<Result<Vec<_>, _>>()?
            };
            *instances = Arc::new(fresh);
            *self.tls.lock().unwrap_or_else(|p| p.into_inner()) = tls;
            if let (Some(discovery), Some(http)) = (&self.discovery, discovery_http) {
                *discovery.http.lock().unwrap_or_else(|p| p.into_inner()) = http;
            }
            self.replaced.send_modify(|n| *n += 1);
        }
        Ok(())
    }

    /// Changes each time [`replace_tls`](Self::replace_tls) swaps new
    /// clients in.
    pub(crate) fn replacements(&self) -> tokio::sync::watch::Receiver<u64> {
        self.replaced.subscribe()
    }

    fn list(&self) -> Arc<Vec<Arc<ConfigServiceClient>>> {
        Arc::clone(&self.instances.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Whether the meta server announced instances none of which was known
    /// since last asked (once): another Apollo, maybe, whose notification
    /// ids are not ours.
    pub(crate) fn take_moved(&self) -> bool {
        self.moved.swap(false, Ordering::AcqRel)
    }

    /// Asks the meta server for the instances if it is time to (see the
    /// module docs); `Err` when no instance is known.
    pub(crate) async fn discover_if_due(&self) -> Result<(), ApolloError> {
        if self.discovery_due() || self.list().is_empty() {
            if let Err(err) = self.discover().await {
                if self.list().is_empty() {
                    return Err(err);
                }
                warn!(error = %err, servers = %self.servers(), "Apollo meta server not answering; keeping the known config services.");
            }
        }
        Ok(())
    }

    /// Runs `request` on the instance in use, then on each next one while
    /// the instance is down, trying at most
    /// [`MAX_INSTANCES_PER_REQUEST`] instances.
    async fn failover<R, F, Fut>(&self, request: F) -> Result<R, ApolloError>
    where
        F: Fn(Arc<ConfigServiceClient>) -> Fut,
        Fut: std::future::Future<Output = Result<R, ApolloError>>,
    {
        self.discover_if_due().await?;
        let list = self.list();
        let mut last = None;
        for _ in 0..list.len().min(MAX_INSTANCES_PER_REQUEST) {
            let index = self.current.load(Ordering::Acquire) % list.len();
            match request(Arc::clone(&list[index])).await {
                Err(err) if err.is_instance_down() => {
                    let next = (index + 1) % list.len();
                    if list.len() > 1 {
                        warn!(error = %err, next = %list[next].server(), "Apollo config service down; trying the next one.");
                    }
                    let _ = self.current.compare_exchange(
                        index,
                        next,
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    );
                    last = Some(err);
                }
                other => return other,
            }
        }
        // Every instance tried failed: the meta server may know others by now
        // (asked at most once per `retryIntervalMs` through the caller's
        // backoff).
        if let Some(discovery) = &self.discovery {
            *discovery.asked.lock().unwrap_or_else(|p| p.into_inner()) = None;
        }
        Err(last.unwrap_or_else(|| {
            ApolloError::Config("no config service known (`config_server`, `meta_server`)".into())
        }))
    }

    fn discovery_due(&self) -> bool {
        let Some(discovery) = &self.discovery else {
            return false;
        };
        let asked = *discovery.asked.lock().unwrap_or_else(|p| p.into_inner());
        asked.is_none_or(|at| at.elapsed() >= discovery.every)
    }

    /// Asks the meta server for the instances and takes its list (a no-op
    /// without `meta_server`).
    async fn discover(&self) -> Result<(), ApolloError> {
        let Some(discovery) = &self.discovery else {
            return Ok(());
        };
        *discovery.asked.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
        let mut url = join(&discovery.url, &["services", "config"]);
        url.query_pairs_mut()
            .append_pair("appId", &self.settings.app_id);
        if let Some(ip) = &self.settings.ip {
            url.query_pairs_mut().append_pair("ip", ip);
        }
        let label = format!("meta server `{}` (meta_server)", shown_url(&discovery.url));
        let path = url.path().to_string();
        let timeout = self.settings.request_timeout;
        let transport = |err: reqwest::Error| ApolloError::transport(&label, &path, &err, timeout);
        let http = discovery
            .http
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let response = http
            .get(url.clone())
            .timeout(timeout)
            .send()
            .await
            .map_err(transport)?;
        let status = response.status();
        let body = read_body(response, MAX_ANSWER_BYTES)
            .await
            .map_err(|err| match err {
                BodyError::Transport(err) => transport(err),
                BodyError::TooLarge => ApolloError::TooLarge {
                    server: label.clone(),
                    path: path.clone(),
                    limit: MAX_ANSWER_BYTES,
                },
            })?;
        if status != StatusCode::OK {
            return Err(ApolloError::Status {
                server: label,
                path,
                status: status.as_u16(),
                body: excerpt(&body),
            });
        }
        let announced: Vec<ServiceInstance> =
            serde_json::from_str(&body).map_err(|err| ApolloError::Malformed {
                server: label.clone(),
                path: path.clone(),
                message: err.to_string(),
            })?;
        let (urls, trimmed) = distinct_addresses(announced.iter().map(|i| i.homepage_url.as_str()));
        drop(announced);
        if !trimmed {
            self.warned_trimmed.store(false, Ordering::Release);
        } else if !self.warned_trimmed.swap(true, Ordering::AcqRel) {
            warn!(
                meta_server = %shown_url(&discovery.url),
                taken = urls.len(),
                servers = %listed(&urls),
                "Apollo meta server announced more config services than are used: only the first {MAX_INSTANCES} distinct addresses (each at most {MAX_ADDRESS_BYTES} bytes) are taken."
            );
        }
        if urls.is_empty() {
            return Err(ApolloError::Malformed {
                server: label,
                path,
                message: "no config service announced".into(),
            });
        }
        if self.settings.tls_configured || discovery.url.scheme() == "https" {
            let mut warned = self
                .warned_plaintext
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            let plaintext = newly_plaintext(&mut warned, &urls);
            if !plaintext.is_empty() {
                warn!(
                    meta_server = %shown_url(&discovery.url),
                    servers = %listed(&plaintext),
                    "Apollo meta server announced plain-text (http://) config services while TLS is configured: requests to them are not encrypted."
                );
            }
        }
        let known = self.list();
        let moved = match compare_announced(known.iter().map(|c| c.address()), &urls) {
            Announced::Same => return Ok(()),
            Announced::Changed { moved } => moved,
        };
        let current = self.address();
        let (settings, generation) = {
            let _instances = self.instances.lock().unwrap_or_else(|p| p.into_inner());
            let settings = InstanceSettings {
                tls: self.tls.lock().unwrap_or_else(|p| p.into_inner()).clone(),
                ..self.settings.clone()
            };
            (settings, *self.replaced.borrow())
        };
        let mut clients = Vec::with_capacity(urls.len());
        for url in &urls {
            let reused = known.iter().find(|c| c.address() == url).cloned();
            match reused.map_or_else(|| settings.client(url, "meta_server").map(Arc::new), Ok) {
                Ok(client) => clients.push(client),
                Err(err) => {
                    warn!(error = %err, "Apollo meta server announced an unusable config service; skipped.")
                }
            }
        }
        if clients.is_empty() {
            return Err(ApolloError::Malformed {
                server: label,
                path,
                message: format!("no usable config service announced: {}", listed(&urls)),
            });
        }
        let keep = clients
            .iter()
            .position(|c| c.address() == current)
            .unwrap_or(0);
        {
            let mut instances = self.instances.lock().unwrap_or_else(|p| p.into_inner());
            if *self.replaced.borrow() != generation {
                // New TLS material came in meanwhile: the clients are
                // built again with it.
                let tls = self.tls.lock().unwrap_or_else(|p| p.into_inner()).clone();
                clients = clients
                    .iter()
                    .map(|client| client.with_tls(&tls).map(Arc::new))
                    .collect::<Result<Vec<_>, _>>()?;
            }
            *instances = Arc::new(clients);
        }
        self.current.store(keep, Ordering::Release);
        if moved {
            self.moved.store(true, Ordering::Release);
        }
        info!(meta_server = %shown_url(&discovery.url), count = urls.len(), servers = %listed(&urls), "Apollo config services discovered.");
        Ok(())
    }
}

/// How the instances the meta server announced compare with those known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Announced {
    /// The same instances, in whatever order: nothing to change.
    Same,
    /// Other instances. `moved`: none of the known ones is among them (a
    /// move to another Apollo, whose notification ids may be below ours);
    /// one instance replaced or added (a pod restarted with a new address)
    /// is not a move.
    Changed { moved: bool },
}

/// Compares the `known` instances' addresses with the `announced` ones
/// (distinct), as sets: Eureka may list the same instances in another
/// order at each discovery.
fn compare_announced<'a>(known: impl Iterator<Item = &'a str>, announced: &[String]) -> Announced {
    let known: HashSet<&str> = known.collect();
    let announced: HashSet<&str> = announced.iter().map(String::as_str).collect();
    if known == announced {
        return Announced::Same;
    }
    Announced::Changed {
        moved: known.is_disjoint(&announced),
    }
}

/// The distinct addresses among `announced` (trimmed, without trailing
/// `/`; empty ones and ones longer than [`MAX_ADDRESS_BYTES`] skipped), in
/// their order, at most [`MAX_INSTANCES`]; and whether any was left out
/// for the bounds. Stops once [`MAX_INSTANCES`] are taken: the rest of a
/// huge answer is not looked at.
fn distinct_addresses<'a>(announced: impl Iterator<Item = &'a str>) -> (Vec<String>, bool) {
    let mut seen: HashSet<&str> = HashSet::new();
    let mut urls = Vec::new();
    let mut trimmed = false;
    for url in announced {
        let url = url.trim().trim_end_matches('/');
        if url.is_empty() || seen.contains(url) {
            continue;
        }
        if urls.len() == MAX_INSTANCES {
            return (urls, true);
        }
        if url.len() > MAX_ADDRESS_BYTES {
            trimmed = true;
            continue;
        }
        seen.insert(url);
        urls.push(url.to_string());
    }
    (urls, trimmed)
}

/// `urls` for a log line, without credentials: the first
/// [`LOGGED_ADDRESSES`], each cut to [`LOGGED_ADDRESS_CHARS`], then how
/// many more there are.
fn listed(urls: &[String]) -> String {
    let mut shown: Vec<String> = urls
        .iter()
        .take(LOGGED_ADDRESSES)
        .map(|url| {
            let text = shown_addresses(url);
            match text.char_indices().nth(LOGGED_ADDRESS_CHARS) {
                Some((cut, _)) => format!("{}…", &text[..cut]),
                None => text,
            }
        })
        .collect();
    if urls.len() > LOGGED_ADDRESSES {
        shown.push(format!("… ({} more)", urls.len() - LOGGED_ADDRESSES));
    }
    shown.join(",")
}

/// The `http://` URLs among `urls` not in `warned` yet (added to it);
/// the ones in `warned` no longer announced are forgotten.
fn newly_plaintext(warned: &mut Vec<String>, urls: &[String]) -> Vec<String> {
    // Only what is announced now is remembered: instances that come and go
    // (a pod's new address at each restart) do not pile up.
    warned.retain(|url| urls.contains(url));
    let mut new = Vec::new();
    for url in urls {
        let plain = url
            .get(..7)
            .is_some_and(|scheme| scheme.eq_ignore_ascii_case("http://"));
        if plain && !warned.contains(url) {
            warned.push(url.clone());
            new.push(url.clone());
        }
    }
    new
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn each_plaintext_instance_is_warned_about_once() {
        let mut warned = Vec::new();
        let urls = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let first = urls(&["http://a:8080", "https://b:8443", "HTTP://c:8080"]);
        assert_eq!(
            newly_plaintext(&mut warned, &first),
            urls(&["http://a:8080", "HTTP://c:8080"])
        );
        assert!(newly_plaintext(&mut warned, &first).is_empty());
        let second = urls(&["http://a:8080", "http://d:8080"]);
        assert_eq!(
            newly_plaintext(&mut warned, &second),
            urls(&["http://d:8080"])
        );
        // Forgotten once no longer announced: what is remembered stays
        // what is announced.
        assert_eq!(warned, urls(&["http://a:8080", "http://d:8080"]));
    }

    fn settings() -> InstanceSettings {
        InstanceSettings {
            app_id: "app".into(),
            cluster: "default".into(),
            secret: None,
            ip: None,
            request_timeout: Duration::from_secs(10),
            long_poll_timeout: Duration::from_secs(10),
            tls: crate::tls::http_config(None).unwrap(),
            tls_configured: false,
        }
    }

    #[tokio::test]
    async fn instances_announced_while_new_tls_is_probed_get_clients_with_it() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = format!("http://{}", listener.local_addr().unwrap());
        let (arrived, probed) = tokio::sync::oneshot::channel();
        let (release, released) = tokio::sync::oneshot::channel::<()>();
        // The config service: answers the probe once told to.
        tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut request = [0; 4096];
            let _ = stream.read(&mut request).await.unwrap();
            let _ = arrived.send(());
            let _ = released.await;
            let body = r#"{"appId":"app","cluster":"default","namespaceName":"application","configurations":{},"releaseKey":"1"}"#;
            let answer = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            stream.write_all(answer.as_bytes()).await.unwrap();
        });
        let services = Arc::new(
            ConfigServices::new(&address, None, Duration::from_secs(60), settings())
                .await
                .unwrap(),
        );
        let replacing = {
            let services = Arc::clone(&services);
            tokio::spawn(async move {
                let tls = crate::tls::http_config(None).unwrap();
                services.replace_tls(tls, "application").await
            })
        };
        probed.await.unwrap();
        // Meanwhile the meta server announces another list (its client
        // built with the old material, as `discover` does).
        let announced = Arc::new(settings().client(&address, "meta_server").unwrap());
        *services.instances.lock().unwrap() = Arc::new(vec![Arc::clone(&announced)]);
        release.send(()).unwrap();
        replacing.await.unwrap().unwrap();
        let list = services.list();
        assert_eq!(list.len(), 1);
        assert_eq!(list[0].address(), announced.address());
        assert!(
            !Arc::ptr_eq(&list[0], &announced),
            "the announced instance's client was built again with the new material"
        );
        assert_eq!(*services.replacements().borrow(), 1);
    }

    /// Serves every connection `answer` (a whole HTTP response), counting
    /// the requests; the base URL.
    async fn answering(answer: Arc<Vec<u8>>, requests: Arc<AtomicUsize>) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let answer = Arc::clone(&answer);
                let requests = Arc::clone(&requests);
                tokio::spawn(async move {
                    let mut request = [0; 4096];
                    if stream.read(&mut request).await.unwrap_or(0) > 0 {
                        requests.fetch_add(1, Ordering::SeqCst);
                        let _ = stream.write_all(&answer).await;
                    }
                });
            }
        });
        address
    }

    fn http_answer(status: &str, body: &str) -> Arc<Vec<u8>> {
        Arc::new(
            format!(
                "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            )
            .into_bytes(),
        )
    }

    /// A meta server announcing 300,000 distinct instances (12 MiB): the
    /// first [`MAX_INSTANCES`] are taken at once. Deduplicating the whole
    /// list pairwise and building a client per entry held the thread for
    /// minutes.
    #[test]
    fn a_huge_announcement_is_cut_to_the_first_instances() {
        let body = format!(
            "[{}]",
            (0..300_000)
                .map(|n| format!(r#"{{"homepageUrl":"http://10.255.255.1/{n}"}}"#))
                .collect::<Vec<_>>()
                .join(",")
        );
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let outcome = runtime.block_on(async {
                let meta = answering(http_answer("200 OK", &body), Arc::default()).await;
                let services =
                    ConfigServices::new("", Some(&meta), Duration::from_secs(60), settings())
                        .await?;
                Ok::<_, ApolloError>((services.list().len(), services.servers()))
            });
            let _ = done.send(outcome);
        });
        let (taken, servers) = finished
            .recv_timeout(Duration::from_secs(20))
            .expect("ConfigServices::new did not finish within 20 s")
            .unwrap();
        assert_eq!(taken, MAX_INSTANCES);
        assert_eq!(servers.split(',').count(), MAX_INSTANCES);
        assert!(
            servers.starts_with("http://10.255.255.1/0,http://10.255.255.1/1,"),
            "the first ones, in order: {servers}"
        );
    }

    #[test]
    fn announced_addresses_are_distinct_bounded_and_listed_briefly() {
        let long = format!("http://h/{}", "x".repeat(MAX_ADDRESS_BYTES));
        let announced = ["http://a/", " http://a", "", &long, "http://b"];
        let (urls, trimmed) = distinct_addresses(announced.into_iter());
        assert_eq!(urls, vec!["http://a".to_string(), "http://b".to_string()]);
        assert!(trimmed, "the long address was left out");
        let many: Vec<String> = (0..100)
            .map(|n| format!("http://u:pw@h{n}/{}", "p".repeat(500)))
            .collect();
        let shown = listed(&many);
        assert!(
            shown.len() < LOGGED_ADDRESSES * (LOGGED_ADDRESS_CHARS + 8) + 40,
            "{}",
            shown.len()
        );
        assert!(shown.ends_with("… (92 more)"), "{shown}");
        assert!(!shown.contains("pw"), "{shown}");
    }

    /// Five instances all down (HTTP 503): a request tries
    /// [`MAX_INSTANCES_PER_REQUEST`] of them, the next one goes on from
    /// the next one untried.
    #[tokio::test]
    async fn a_request_tries_a_bounded_number_of_instances() {
        let counts: Vec<Arc<AtomicUsize>> = (0..5).map(|_| Arc::default()).collect();
        let mut addresses = Vec::new();
        for count in &counts {
            addresses.push(
                answering(
                    http_answer("503 Service Unavailable", ""),
                    Arc::clone(count),
                )
                .await,
            );
        }
        let services = ConfigServices::new(
            &addresses.join(","),
            None,
            Duration::from_secs(60),
            settings(),
        )
        .await
        .unwrap();
        let tried = || {
            counts
                .iter()
                .map(|c| c.load(Ordering::SeqCst))
                .collect::<Vec<_>>()
        };
        let err = services
            .fetch("application", None, None)
            .await
            .expect_err("all down");
        assert!(err.is_instance_down(), "{err}");
        assert_eq!(tried(), vec![1, 1, 1, 0, 0]);
        services
            .fetch("application", None, None)
            .await
            .expect_err("all down");
        assert_eq!(tried(), vec![2, 1, 1, 1, 1]);
    }

    /// A meta server announcing, at each request, the instances
    /// `announced` holds then; its base URL.
    async fn meta_server(announced: Arc<Mutex<Vec<&'static str>>>) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let mut request = [0; 4096];
                if stream.read(&mut request).await.unwrap_or(0) > 0 {
                    let body = serde_json::Value::Array(
                        announced
                            .lock()
                            .unwrap()
                            .iter()
                            .map(|url| serde_json::json!({ "homepageUrl": url }))
                            .collect(),
                    );
                    let answer = http_answer("200 OK", &body.to_string());
                    let _ = stream.write_all(&answer).await;
                }
            }
        });
        address
    }

    /// Eureka lists the same instances in another order, or one pod comes
    /// back with a new address: the notification ids are kept (each such
    /// discovery made the long poll forget them all, so every namespace
    /// was fetched again and the release messages dropped). Only
    /// instances none of which was known are a move.
    #[tokio::test]
    async fn only_instances_none_of_which_was_known_are_a_move() {
        let (a, b, c, d) = (
            "http://a:8080",
            "http://b:8080",
            "http://c:8080",
            "http://d:8080",
        );
        let announced = Arc::new(Mutex::new(vec![a, b]));
        let meta = meta_server(Arc::clone(&announced)).await;
        let services = ConfigServices::new("", Some(&meta), Duration::from_secs(60), settings())
            .await
            .unwrap();
        assert_eq!(services.list().len(), 2);
        for order in [[b, a], [a, b], [b, a], [a, b]] {
            *announced.lock().unwrap() = order.to_vec();
            services.discover().await.unwrap();
            assert!(!services.take_moved(), "{order:?} taken for a move");
        }
        *announced.lock().unwrap() = vec![a, c];
        services.discover().await.unwrap();
        let addresses = |services: &ConfigServices| {
            services
                .list()
                .iter()
                .map(|c| c.address().to_string())
                .collect::<Vec<_>>()
        };
        assert_eq!(addresses(&services), vec![a, c], "the new instance taken");
        assert!(
            !services.take_moved(),
            "one instance replaced taken for a move"
        );
        *announced.lock().unwrap() = vec![d];
        services.discover().await.unwrap();
        assert_eq!(addresses(&services), vec![d]);
        assert!(
            services.take_moved(),
            "another Apollo's instances are a move"
        );
        assert!(!services.take_moved(), "taken once");
    }

    #[test]
    fn server_lists_split_on_commas() {
        assert_eq!(
            server_list(" http://a:1, http://b:2/ ,,"),
            vec!["http://a:1".to_string(), "http://b:2/".to_string()]
        );
        assert!(server_list(" , ").is_empty());
    }

    #[test]
    fn a_comma_in_credentials_does_not_split_a_server() {
        assert_eq!(
            server_list("http://u:pa,ss@h:8080, http://b:2"),
            vec![
                "http://u:pa,ss@h:8080".to_string(),
                "http://b:2".to_string()
            ]
        );
    }
}
