//! [`EtcdConfigStore`]: the component — connection at init, reads and
//! writes through the KV API, subscriptions fed by the watch task.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rewire_etcd::pb::{request_op, response_op, RangeRequest, RequestOp, TxnRequest};
use rewire_etcd::{prefix_range, Client, ConnectOptions};
use rewire_runtime::{
    Component, ComponentError, ConfigError, ConfigItem, ConfigQuery, ConfigStore,
    ConfigSubscription, InPlace, InPlaceUpdate, InitContext, Metadata, Readiness, SubscriptionHub,
};
use tracing::{info, warn};

use super::cache::{entry_of, item_at, read_prefix, KvCache, SharedCache};
use super::keys::{normalized, KeyError, KeyLayout};
use super::metadata::{EtcdMetadata, EtcdSettings};
use super::watch::{Follower, WatchTask};

/// How long a readiness probe may take (under the runtime's 1 s limit on
/// the answer, so that a silent cluster shows as degraded, not unanswered).
const READINESS_LIMIT: Duration = Duration::from_millis(800);
/// HTTP/2 ping interval on the connection (etcd accepts one every 5 s).
const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(10);
/// etcd's default limit on operations in one transaction (`--max-txn-ops`).
const MAX_TXN_OPS: usize = 128;

/// Config store on etcd v3: an item `(group, key, label)` is the etcd key
/// `{keyPrefix}[{group}/]{key}[@{label}]`, its version the key's
/// `mod_revision`; changes arrive through one prefix watch on `keyPrefix`
/// that resumes without loss after a dropped connection or a compaction.
///
/// See the [module docs](super) for the behaviour.
#[derive(rewire_runtime::Component, Debug)]
#[component(
    kind = "config_store",
    type = "etcd",
    example = r#"{"endpoints": "127.0.0.1:2379", "keyPrefix": "/config/checkout/", "dialTimeout": "5s"}"#
)]
pub struct EtcdConfigStore {
    #[metadata]
    metadata: EtcdMetadata,
    running: Option<Running>,
    watch: Mutex<Option<WatchTask>>,
}

/// What `init` set up.
struct Running {
    client: Client,
    settings: EtcdSettings,
    layout: KeyLayout,
    hub: Arc<SubscriptionHub>,
    /// The prefix as the watch last saw it: reads are answered from it
    /// while no member answers.
    cache: SharedCache,
}

impl fmt::Debug for Running {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Running")
            .field("settings", &self.settings)
            .field("layout", &self.layout)
            .field("subscribers", &self.hub.len())
            .finish_non_exhaustive()
    }
}

impl Running {
    /// A backend error naming the servers, never the password.
    fn backend(&self, err: &rewire_etcd::Error) -> ConfigError {
        ConfigError::Backend(self.settings.scrub(&format!(
            "etcd at {}: {err}",
            self.settings.endpoints_text()
        )))
    }

    /// `read`'s items; when no member answered it, the items of `query`
    /// in the watch's cache (the last values seen) instead.
    async fn or_cached(
        &self,
        query: &ConfigQuery,
        read: impl std::future::Future<Output = Result<Vec<ConfigItem>, rewire_etcd::Error>>,
    ) -> Result<Vec<ConfigItem>, ConfigError> {
        match read.await {
            Ok(items) => Ok(items),
            Err(err) if err.is_unreachable() => {
                let cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
                let items = self.cached(&cache, query);
                warn!(endpoints = %self.settings.endpoints_text(), error = %self.settings.scrub(&err.to_string()), items = items.len(), "etcd unreachable; answered from the last values seen.");
                Ok(items)
            }
            Err(err) => Err(self.backend(&err)),
        }
    }

    /// The items of `query` in `cache`.
    fn cached(&self, cache: &KvCache, query: &ConfigQuery) -> Vec<ConfigItem> {
        let item = |path: &str, entry: &super::cache::Entry| {
            item_at(&self.layout, path, entry.value.clone(), entry.mod_revision)
        };
        if query.keys.is_empty() {
            let Ok(prefix) = self.layout.list_prefix(query.group.as_deref()) else {
                return Vec::new();
            };
            return cache
                .under(&prefix)
                .filter_map(|(path, entry)| item(path, entry))
                .filter(|i| query.matches(i))
                .collect();
        }
        let paths = self.layout.paths(query).unwrap_or_default();
        paths
            .iter()
            .filter_map(|path| item(path, cache.get(path)?))
            .collect()
    }

    /// The item stored at `path`, read from a key-value.
    fn item(&self, kv: &rewire_etcd::pb::KeyValue) -> Option<ConfigItem> {
        let (path, entry) = entry_of(kv)?;
        item_at(&self.layout, &path, entry.value, entry.mod_revision)
    }

    async fn get_keys(&self, query: &ConfigQuery) -> Result<Vec<ConfigItem>, ConfigError> {
        let paths = self.layout.paths(query).map_err(invalid)?;
        let read = async {
            let mut items = Vec::with_capacity(paths.len());
            for chunk in paths.chunks(MAX_TXN_OPS) {
                let success = chunk.iter().map(|path| get_op(path)).collect();
                let request = TxnRequest {
                    success,
                    ..TxnRequest::default()
                };
                let response = self.client.txn(request).await?;
                for op in response.responses {
                    if let Some(response_op::Response::ResponseRange(got)) = op.response {
                        items.extend(got.kvs.iter().filter_map(|kv| self.item(kv)));
                    }
                }
            }
            Ok::<_, rewire_etcd::Error>(items)
        };
        self.or_cached(query, read).await
    }

    async fn get_all(&self, query: &ConfigQuery) -> Result<Vec<ConfigItem>, ConfigError> {
        self.layout.paths(query).map_err(invalid)?;
        let prefix = self
            .layout
            .list_prefix(query.group.as_deref())
            .map_err(invalid)?;
        let read = async {
            let response = self.client.get_prefix(prefix).await?;
            Ok::<_, rewire_etcd::Error>(
                response
                    .kvs
                    .iter()
                    .filter_map(|kv| self.item(kv))
                    .filter(|item| query.matches(item))
                    .collect(),
            )
        };
        self.or_cached(query, read).await
    }
}

/// A transaction operation reading `path`.
fn get_op(path: &str) -> RequestOp {
    let range = RangeRequest {
        key: path.as_bytes().to_vec(),
        ..RangeRequest::default()
    };
    RequestOp {
        request: Some(request_op::Request::RequestRange(range)),
    }
}

fn invalid(err: KeyError) -> ConfigError {
    ConfigError::Invalid(err.to_string())
}

/// Why init failed; names the servers and the field to look at, never the
/// password.
fn init_error(settings: &EtcdSettings, err: &rewire_etcd::Error) -> ComponentError {
    let endpoints = settings.endpoints_text();
    let text = settings.scrub(&err.to_string());
    let lower = text.to_lowercase();
    let message = if lower.contains("authentication failed") || lower.contains("invalid auth") {
        format!(
            "etcd at {endpoints}: authentication failed, check `username` and `password`: {text}"
        )
    } else if lower.contains("user name is empty") {
        format!("etcd at {endpoints}: the server requires authentication, set `username` and `password`: {text}")
    } else if lower.contains("permission denied") {
        format!(
            "etcd at {endpoints}: user `{}` may not read `keyPrefix` `{}`: {text}",
            settings
                .credentials
                .as_ref()
                .map_or("", |c| c.username.as_str()),
            settings.key_prefix
        )
    } else {
        format!("etcd at {endpoints} (`endpoints`): {text}")
    };
    ComponentError::new(message)
}

impl EtcdConfigStore {
    /// A store for `metadata`, not initialised yet.
    pub fn new(metadata: EtcdMetadata) -> Self {
        Self {
            metadata,
            running: None,
            watch: Mutex::default(),
        }
    }

    fn running(&self) -> Result<&Running, ConfigError> {
        self.running
            .as_ref()
            .ok_or_else(|| ConfigError::Backend("the etcd config store is not initialised".into()))
    }

    fn take_watch(&self) -> Option<WatchTask> {
        self.watch.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

#[rewire_runtime::prelude::async_trait]
impl Component for EtcdConfigStore {
    async fn init(&mut self, cx: &InitContext) -> Result<(), ComponentError> {
        let settings = self.metadata.settings_in(cx.config_dir.as_deref())?;
        let layout = KeyLayout::new(settings.key_prefix.clone());
        // Simple tokens expire (5 min idle by default): the client logs in
        // again rather than fail the request or the re-watch.
        let options = ConnectOptions {
            connect_timeout: settings.dial,
            timeout: settings.dial,
            keep_alive: Some((KEEP_ALIVE_INTERVAL, settings.dial)),
            user: settings
                .credentials
                .as_ref()
                .map(|c| (c.username.clone(), c.password.clone())),
            tls: settings.tls.as_ref().map(|tls| rewire_etcd::TlsOptions {
                ca_pem: tls.ca_pem.clone(),
                identity: tls.identity.clone(),
                domain: None,
            }),
        };
        let connect = async {
            let client = Client::connect(&settings.urls(), options).await?;
            let snapshot = read_prefix(&client, &layout).await?;
            Ok::<_, rewire_etcd::Error>((client, snapshot))
        };
        let (client, snapshot) = match tokio::time::timeout(settings.dial, connect).await {
            Ok(Ok(connected)) => connected,
            Ok(Err(err)) => return Err(init_error(&settings, &err)),
            Err(_) => {
                return Err(ComponentError::new(format!(
                    "etcd at {} (`endpoints`): no answer within {:?} (`dialTimeout`)",
                    settings.endpoints_text(),
                    settings.dial
                )))
            }
        };
        let hub = Arc::new(SubscriptionHub::default());
        let revision = snapshot.revision;
        info!(
            component = %cx.key,
            endpoints = %settings.endpoints_text(),
            key_prefix = %settings.key_prefix,
            keys = snapshot.entries.len(),
            revision,
            authenticated = settings.credentials.is_some(),
            tls = settings.tls.is_some(),
            "etcd config store started."
        );
        let cache: SharedCache = Arc::new(Mutex::new(KvCache::new(snapshot)));
        let follower = Follower::new(
            cx.key.clone(),
            client.clone(),
            settings.clone(),
            layout.clone(),
            Arc::clone(&hub),
            Arc::clone(&cache),
            revision,
        );
        let task = WatchTask::start(follower, cx.shutdown.child_token());
        let previous = self
            .watch
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .replace(task);
        if let Some(previous) = previous {
            previous.stop().await;
        }
        self.running = Some(Running {
            client,
            settings,
            layout,
            hub,
            cache,
        });
        Ok(())
    }

    async fn readiness(&self) -> Readiness {
        let Some(running) = &self.running else {
            return Readiness::NotReady("not initialised".into());
        };
        let (key, range_end) = prefix_range(running.layout.prefix().as_bytes().to_vec());
        let probe = running.client.range(RangeRequest {
            key,
            range_end,
            limit: 1,
            keys_only: true,
            ..RangeRequest::default()
        });
        // Initialised, the store serves the last values it saw (reads
        // fall back to the watch's cache, subscribers keep theirs) while
        // no member answers: degraded, not down.
        let endpoints = running.settings.endpoints_text();
        let serving = "serving the last values seen; the watch resumes when a member answers";
        match tokio::time::timeout(READINESS_LIMIT, probe).await {
            Ok(Ok(_)) => Readiness::Ready,
            Ok(Err(err)) => Readiness::Degraded(
                running
                    .settings
                    .scrub(&format!("etcd at {endpoints}: {err}; {serving}")),
            ),
            Err(_) => Readiness::Degraded(format!(
                "etcd at {endpoints}: no answer within {READINESS_LIMIT:?}; {serving}"
            )),
        }
    }

    async fn close(&self) -> Result<(), ComponentError> {
        if let Some(task) = self.take_watch() {
            task.stop().await;
        }
        Ok(())
    }

    fn as_in_place(&self) -> Option<&dyn InPlaceUpdate> {
        Some(self)
    }
}

#[rewire_runtime::prelude::async_trait]
impl InPlaceUpdate for EtcdConfigStore {
    /// Any change rebuilds the store: the new instance connects, reads the
    /// prefix and watches from there; the runtime moves the subscriptions
    /// made through handles to it.
    async fn update_in_place(&self, metadata: &Metadata) -> Result<InPlace, ComponentError> {
        let new: EtcdMetadata = metadata
            .decode()
            .map_err(|err| ComponentError::new(format!("new metadata rejected: {err}")))?;
        Ok(if new == self.metadata {
            InPlace::Applied
        } else {
            InPlace::NeedsRebuild
        })
    }
}

#[rewire_runtime::prelude::async_trait]
impl ConfigStore for EtcdConfigStore {
    async fn get(&self, query: &ConfigQuery) -> Result<Vec<ConfigItem>, ConfigError> {
        let running = self.running()?;
        let query = normalized(query.clone());
        if query.keys.is_empty() {
            running.get_all(&query).await
        } else {
            running.get_keys(&query).await
        }
    }

    async fn set(&self, items: Vec<ConfigItem>) -> Result<(), ConfigError> {
        let running = self.running()?;
        let writes = items
            .into_iter()
            .map(|item| {
                let path =
                    running
                        .layout
                        .path(item.group.as_deref(), &item.key, item.label.as_deref())?;
                Ok((path, item.value))
            })
            .collect::<Result<Vec<_>, KeyError>>()
            .map_err(invalid)?;
        for (path, value) in writes {
            running
                .client
                .put(path, value)
                .await
                .map_err(|err| running.backend(&err))?;
        }
        Ok(())
    }

    async fn delete(&self, query: &ConfigQuery) -> Result<(), ConfigError> {
        let running = self.running()?;
        let query = normalized(query.clone());
        if query.keys.is_empty() {
            return Err(ConfigError::Invalid(
                "delete needs keys: the etcd store does not delete a whole group or prefix".into(),
            ));
        }
        let paths = running.layout.paths(&query).map_err(invalid)?;
        for path in paths {
            running
                .client
                .delete(path)
                .await
                .map_err(|err| running.backend(&err))?;
        }
        Ok(())
    }

    async fn subscribe(&self, query: ConfigQuery) -> Result<ConfigSubscription, ConfigError> {
        let running = self.running()?;
        let query = normalized(query);
        running.layout.paths(&query).map_err(invalid)?;
        Ok(running.hub.subscribe(query))
    }
}
