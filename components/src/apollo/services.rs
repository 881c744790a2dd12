//! [`ConfigServices`]: the config service instances a store talks to — the
//! list in `config_server`, or the one the meta server (`meta_server`)
//! announces — and failing over between them.
//!
//! Every fetch and long poll goes to one instance (the first to begin
//! with). When that instance is down — no connection, no answer within
//! the limit, or an HTTP 5xx — the request is made at once on the next
//! one, each instance at most once per request; later requests stay on the
//! instance that answered. When every instance failed, the error goes back
//! to the caller, whose retries back off (`retryIntervalMs` doubling up to
//! `maxRetryIntervalMs`) while the store serves the last good
//! configuration or the backup cache.
//!
//! With `meta_server`, `GET {meta_server}/services/config?appId=..` lists
//! the instances (`[{"homepageUrl": "http://host:8080/"}, ..]`). It is
//! asked at start, again every `metaRefreshIntervalMs`, and whenever every
//! known instance failed a request. An answer that cannot be used (meta
//! server down, malformed, empty list) keeps the instances known so far.
//! When it announces other instances, the long poll forgets its
//! notification ids ([`take_moved`](ConfigServices::take_moved)): they may
//! be another Apollo's, whose ids are below ours.

use std::sync::atomic::{AtomicUsize, Ordering};
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
use crate::redacted::shown_addresses;

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
    /// Set when the meta server announced other instances than the ones
    /// in use (taken by [`take_moved`](Self::take_moved)).
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
        messages: Option<&serde_json::Value>,
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

    /// Whether the meta server announced other instances since last asked
    /// (once): another Apollo, maybe, whose notification ids are not ours.
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
    /// the instance is down.
    async fn failover<R, F, Fut>(&self, request: F) -> Result<R, ApolloError>
    where
        F: Fn(Arc<ConfigServiceClient>) -> Fut,
        Fut: std::future::Future<Output = Result<R, ApolloError>>,
    {
        self.discover_if_due().await?;
        let list = self.list();
        let mut last = None;
        for _ in 0..list.len() {
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
        // Every instance failed: the meta server may know others by now
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
        let mut urls: Vec<String> = Vec::new();
        for instance in announced {
            let url = instance
                .homepage_url
                .trim()
                .trim_end_matches('/')
                .to_string();
            if !url.is_empty() && !urls.contains(&url) {
                urls.push(url);
            }
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
            for url in newly_plaintext(&mut warned, &urls) {
                warn!(
                    meta_server = %shown_url(&discovery.url),
                    server = %shown_addresses(&url),
                    "Apollo meta server announced a plain-text (http://) config service while TLS is configured: requests to it are not encrypted."
                );
            }
        }
        let known = self.list();
        if known
            .iter()
            .map(|c| c.address())
            .eq(urls.iter().map(String::as_str))
        {
            return Ok(());
        }
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
                message: format!(
                    "no usable config service announced: {}",
                    shown_addresses(&urls.join(","))
                ),
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
        self.moved.store(true, Ordering::Release);
        info!(meta_server = %shown_url(&discovery.url), servers = %shown_addresses(&urls.join(",")), "Apollo config services discovered.");
        Ok(())
    }
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
