//! [`EtcdConfigStore`]: the component — joins the shared connection and
//! watch for its settings at init ([`sharing`](super::sharing)), reads
//! through the shared read queue, writes through the KV API, its own
//! subscriptions fed by the shared watch.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rewire_etcd::pb::{RangeRequest, RangeResponse};
use rewire_etcd::{prefix_range, Client};
use rewire_runtime::{
    Component, ComponentError, ConfigError, ConfigItem, ConfigQuery, ConfigStore,
    ConfigSubscription, InPlace, InPlaceUpdate, InitContext, Metadata, Readiness,
};
use tracing::{info, warn};

use super::cache::{entry_of, item_at, KvCache, SharedCache};
use super::keys::{normalized, KeyError, KeyLayout};
use super::metadata::{EtcdMetadata, EtcdSettings};
use super::reads::{read_ranges, ReadResult, Reads};
use super::sharing::{join, stores_sharing, Membership};
use super::subscribers::Subscribers;
use super::writes::{delete_all, put_all, WriteSize};

/// How long a readiness probe may take: under the 1 s that its callers
/// (`/v1.0/healthz`, the status) wait for the answer, so that a silent
/// cluster shows as degraded (healthy: the last values are served), not as
/// unanswered (not ready, and a liveness probe restarting the sidecar).
const READINESS_LIMIT: Duration = Duration::from_millis(800);

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
    membership: Mutex<Option<Membership>>,
}

/// What `init` set up.
struct Running {
    client: Client,
    settings: EtcdSettings,
    layout: KeyLayout,
    hub: Arc<Subscribers>,
    /// The prefix as the shared watch last saw it: reads are answered
    /// from it while no member answers.
    cache: SharedCache,
    /// The shared read queue.
    reads: Reads,
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

    /// `read`'s items; when no member answered it, or the member refused
    /// the token and no login finished in time (logins are slow: bcrypt
    /// queued behind others), the items of `query` in the watch's cache
    /// (the last values seen) instead. A refused password or permission
    /// is the store's error, not a reason to serve old values.
    async fn or_cached(
        &self,
        query: &ConfigQuery,
        read: impl std::future::Future<Output = Result<Vec<ConfigItem>, Arc<rewire_etcd::Error>>>,
    ) -> Result<Vec<ConfigItem>, ConfigError> {
        match read.await {
            Ok(items) => Ok(items),
            Err(err) if serves_from_cache(&err) => {
                let cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
                let items = self.cached(&cache, query);
                warn!(endpoints = %self.settings.endpoints_text(), error = %self.settings.scrub(&err.to_string()), items = items.len(), "etcd did not answer the read; answered from the last values seen.");
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

    /// Reads `ranges` in the shared read queue's next round (directly,
    /// once the shared entry has ended).
    async fn read(&self, ranges: Vec<RangeRequest>) -> ReadResult {
        match self.reads.read(ranges.clone()).await {
            Some(result) => result,
            None => read_ranges(&self.client, &ranges).await,
        }
    }

    async fn get_keys(&self, query: &ConfigQuery) -> Result<Vec<ConfigItem>, ConfigError> {
        let paths = self.layout.paths(query).map_err(invalid)?;
        if paths.is_empty() {
            // Only empty keys, which name no item.
            return Ok(Vec::new());
        }
        let ranges = paths.iter().map(|path| get_range(path)).collect();
        let read = async {
            let responses = self.read(ranges).await?;
            Ok(self.items_of(&responses).collect())
        };
        self.or_cached(query, read).await
    }

    async fn get_all(&self, query: &ConfigQuery) -> Result<Vec<ConfigItem>, ConfigError> {
        self.layout.paths(query).map_err(invalid)?;
        let prefix = self
            .layout
            .list_prefix(query.group.as_deref())
            .map_err(invalid)?;
        let (key, range_end) = prefix_range(prefix.into_bytes());
        let range = RangeRequest {
            key,
            range_end,
            ..RangeRequest::default()
        };
        let read = async {
            let responses = self.read(vec![range]).await?;
            Ok(self
                .items_of(&responses)
                .filter(|item| query.matches(item))
                .collect())
        };
        self.or_cached(query, read).await
    }

    /// Makes `transaction`, if any (all its writes or none). One etcd
    /// refuses for its size is an invalid request saying so (see
    /// [`WriteSize::refusal`]).
    async fn write(
        &self,
        transaction: Result<Option<rewire_etcd::pb::TxnRequest>, String>,
    ) -> Result<(), ConfigError> {
        let Some(transaction) = transaction.map_err(ConfigError::Invalid)? else {
            return Ok(());
        };
        let size = WriteSize::of(&transaction);
        let written = self.client.txn(transaction).await;
        written.map(drop).map_err(|err| match size.refusal(&err) {
            Some(refusal) => ConfigError::Invalid(self.settings.scrub(&refusal)),
            None => self.backend(&err),
        })
    }

    /// The items in `responses`.
    fn items_of<'a>(
        &'a self,
        responses: &'a [RangeResponse],
    ) -> impl Iterator<Item = ConfigItem> + 'a {
        responses
            .iter()
            .flat_map(|response| &response.kvs)
            .filter_map(|kv| self.item(kv))
    }
}

/// Whether a read failing with `err` is answered from the watch's cache:
/// no member answered, or none let the client log in in time — passing
/// conditions, as readiness reports them (`Degraded`, serving the last
/// values).
fn serves_from_cache(err: &rewire_etcd::Error) -> bool {
    err.is_unreachable() || matches!(err, rewire_etcd::Error::LoginTimeout(_))
}

/// Readiness after a probe that failed with `err` (`said` adds where and
/// scrubs): degraded while reads are answered from the watch's copy (no
/// member answers, logins run out); not ready when etcd refuses the
/// store itself (a refused password, a permission: reads fail until the
/// settings or the grants change); degraded, without claiming old values
/// are served, for any other failure (`too many requests`, a reset
/// stream), which passes: health must neither say old values are served
/// while every read errs nor flap on a moment's load.
fn failed_probe(err: &rewire_etcd::Error, said: impl Fn(&str) -> String) -> Readiness {
    if serves_from_cache(err) {
        return Readiness::Degraded(said(&format!(
            "{err}; serving the last values seen; the watch resumes when a member answers"
        )));
    }
    match err.is_refusal() {
        true => Readiness::NotReady(said(&format!("{err}; reads fail until it is fixed"))),
        false => Readiness::Degraded(said(&format!("{err}; reads fail while it lasts"))),
    }
}

/// The range reading `path`.
fn get_range(path: &str) -> RangeRequest {
    RangeRequest {
        key: path.as_bytes().to_vec(),
        ..RangeRequest::default()
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
    } else if matches!(err, rewire_etcd::Error::Timeout(_)) {
        // The client's limit on connecting and on each request.
        format!("etcd at {endpoints} (`endpoints`): {text} (`dialTimeout`)")
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
            membership: Mutex::default(),
        }
    }

    fn running(&self) -> Result<&Running, ConfigError> {
        self.running
            .as_ref()
            .ok_or_else(|| ConfigError::Backend("the etcd config store is not initialised".into()))
    }

    /// How long, and why, the shared watch has been failing, if it is.
    fn watch_failure(&self) -> Option<(Duration, String)> {
        self.membership
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()?
            .watch_failure()
    }

    fn take_membership(&self) -> Option<Membership> {
        self.membership
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }

    /// The serial number of the shared connection and watch this store
    /// uses (`None` before init and after close): stores with equal
    /// numbers share one. For tests.
    #[doc(hidden)]
    pub fn shared_watch_id(&self) -> Option<u64> {
        self.membership
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(Membership::shared_id)
    }

    /// How many stores share the live connection and watch for
    /// `metadata`'s settings (0: none is live). For tests.
    #[doc(hidden)]
    pub fn stores_sharing(metadata: &EtcdMetadata) -> usize {
        metadata
            .settings()
            .map_or(0, |settings| stores_sharing(&settings))
    }

    /// Joins the shared entry for `settings`; a store joining an entry
    /// that is already connected checks that etcd answers, as connecting
    /// would have.
    async fn join(
        settings: &EtcdSettings,
        cx: &InitContext,
        hub: &Arc<Subscribers>,
    ) -> Result<Membership, Arc<rewire_etcd::Error>> {
        let (membership, made) = join(settings, &cx.key, hub, &cx.shutdown)
            .await
            .map_err(Arc::new)?;
        if !made {
            let (key, range_end) = prefix_range(settings.key_prefix.as_bytes().to_vec());
            let probe = RangeRequest {
                key,
                range_end,
                limit: 1,
                keys_only: true,
                ..RangeRequest::default()
            };
            if let Some(Err(err)) = membership.connection().reads.read(vec![probe]).await {
                return Err(err);
            }
        }
        Ok(membership)
    }
}

#[rewire_runtime::prelude::async_trait]
impl Component for EtcdConfigStore {
    async fn init(&mut self, cx: &InitContext) -> Result<(), ComponentError> {
        let settings = self
            .metadata
            .read_settings_in(cx.config_dir.as_deref())
            .await?;
        if let Some(tls) = &settings.tls {
            tls.preload_system_roots().await.map_err(|err| {
                ComponentError::new(format!(
                    "etcd at {} (`endpoints`): {err}",
                    settings.endpoints_text()
                ))
            })?;
        }
        let layout = KeyLayout::new(settings.key_prefix.clone());
        let hub = Arc::new(Subscribers::default());
        let limit = settings.connect_limit();
        let joined = tokio::time::timeout(limit, Self::join(&settings, cx, &hub)).await;
        let membership = match joined {
            Ok(Ok(joined)) => joined,
            Ok(Err(err)) => return Err(init_error(&settings, &err)),
            Err(_) => {
                return Err(ComponentError::new(format!(
                    "etcd at {} (`endpoints`): {}",
                    settings.endpoints_text(),
                    settings.connect_timed_out()
                )))
            }
        };
        let connection = membership.connection().clone();
        info!(
            component = %cx.key,
            endpoints = %settings.endpoints_text(),
            key_prefix = %settings.key_prefix,
            shared = membership.shared_id(),
            keys = connection.keys,
            revision = connection.revision,
            authenticated = settings.credentials.is_some(),
            tls = settings.tls.is_some(),
            "etcd config store started."
        );
        let previous = self
            .membership
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .replace(membership);
        if let Some(previous) = previous {
            previous.leave().await;
        }
        self.running = Some(Running {
            client: connection.client,
            settings,
            layout,
            hub,
            cache: connection.cache,
            reads: connection.reads,
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
        // no member answers: degraded, not down (see `failed_probe`).
        let endpoints = running.settings.endpoints_text();
        match tokio::time::timeout(READINESS_LIMIT, probe).await {
            Ok(Ok(_)) => match self.watch_failure() {
                // Reads work, but changes are not followed.
                Some((failing_for, reason)) => Readiness::Degraded(format!(
                    "etcd watch failing for {}s: {reason}; reads are served, changes are not followed until it resumes",
                    failing_for.as_secs()
                )),
                None => Readiness::Ready,
            },
            Ok(Err(err)) => failed_probe(&err, |text| {
                running.settings.scrub(&format!("etcd at {endpoints}: {text}"))
            }),
            Err(_) => Readiness::Degraded(format!(
                "etcd at {endpoints}: no answer within {READINESS_LIMIT:?}; serving the last values seen; the watch resumes when a member answers"
            )),
        }
    }

    async fn close(&self) -> Result<(), ComponentError> {
        if let Some(membership) = self.take_membership() {
            membership.leave().await;
        }
        Ok(())
    }

    fn as_in_place(&self) -> Option<&dyn InPlaceUpdate> {
        Some(self)
    }
}

/// Applied at once: nothing changes in place (the same metadata is kept,
/// any other is a rebuild), so nothing to stage.
#[rewire_runtime::prelude::async_trait]
impl InPlaceUpdate for EtcdConfigStore {
    /// Any change rebuilds the store: the new instance joins the shared
    /// connection and watch for its settings (connecting, reading the
    /// prefix and watching from there, if none is live); the runtime moves
    /// the subscriptions made through handles to it.
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
        running.write(put_all(writes)).await
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
        running.write(delete_all(paths)).await
    }

    async fn subscribe(&self, query: ConfigQuery) -> Result<ConfigSubscription, ConfigError> {
        let running = self.running()?;
        let query = normalized(query);
        running.layout.paths(&query).map_err(invalid)?;
        Ok(running.hub.subscribe(query))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use rewire_etcd::Error;

    use super::{failed_probe, serves_from_cache};
    use rewire_runtime::Readiness;

    #[test]
    fn reads_fall_back_to_the_cache_when_no_member_answers_or_logins_run_out() {
        let limit = Duration::from_secs(5);
        assert!(serves_from_cache(&Error::Timeout(limit)));
        assert!(serves_from_cache(&Error::LoginTimeout(limit)));
        // A settings error is the store's error, not old values.
        assert!(!serves_from_cache(&Error::NoEndpoint));
    }

    /// etcd's answer to a login with a wrong password.
    fn tonic_like_refusal() -> tonic::Status {
        tonic::Status::invalid_argument(
            "etcdserver: authentication failed, invalid user ID or password",
        )
    }

    #[test]
    fn a_probe_failing_as_reads_do_is_not_ready_and_says_so() {
        let said = |text: &str| format!("etcd at e: {text}");
        let unreachable = failed_probe(&Error::Timeout(Duration::from_secs(1)), said);
        assert!(
            matches!(&unreachable, Readiness::Degraded(why) if why.contains("serving the last values seen")),
            "{unreachable:?}"
        );
        // Refused: not ready, and no claim of values served.
        let refusal = Error::Status(tonic_like_refusal());
        let refused = failed_probe(&refusal, said);
        assert!(
            matches!(&refused, Readiness::NotReady(why) if why.contains("reads fail") && !why.contains("serving")),
            "{refused:?}"
        );
        // Another failure passes: degraded, no claim either.
        let other = failed_probe(&Error::NoEndpoint, said);
        assert!(
            matches!(&other, Readiness::Degraded(why) if why.contains("reads fail while it lasts") && !why.contains("serving")),
            "{other:?}"
        );
    }
}
