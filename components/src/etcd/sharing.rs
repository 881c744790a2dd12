//! One connection and one prefix watch per process for each distinct set
//! of settings and async runtime: the process-wide registry of [`Shared`]
//! entries, keyed by [`SharingKey`], and a store's [`Membership`] of one.
//!
//! A store joins the entry for its settings at init — connecting it, when
//! it is the first — and leaves it in `close`, when it is dropped, or when
//! its runtime's shutdown token is cancelled. When the last store leaves,
//! the entry's watch and read tasks stop and the entry is gone: a store
//! that starts later connects anew. A rebuilt store (a reload) joins
//! before the old instance closes, so the entry carries on.
//!
//! The registry holds `Weak` references: the stores' memberships keep an
//! entry alive.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, Weak};

use rewire_runtime::ComponentKey;
use tokio_util::sync::CancellationToken;

use super::metadata::EtcdSettings;
use super::shared::{Connection, Shared};
use super::subscribers::Subscribers;

/// Every live entry, by the settings of its stores.
static REGISTRY: LazyLock<Mutex<HashMap<SharingKey, Weak<Shared>>>> = LazyLock::new(Mutex::default);
/// Serial numbers of entries and memberships.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// What makes two stores' connections differ: all their settings —
/// endpoints, `keyPrefix`, credentials, TLS material, `dialTimeout`,
/// `watchRetryMs` — and the tokio runtime the store runs on: an entry's
/// tasks run on the runtime of the store that connected it and end with
/// it, so a store on another runtime (an embedding application may run
/// several, and drop one) must not depend on them. Compared in full;
/// hashed and shown without the password or the TLS material.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct SharingKey(EtcdSettings, tokio::runtime::Id);

impl SharingKey {
    /// The key for `settings` on the runtime the caller runs on.
    fn here(settings: &EtcdSettings) -> Self {
        Self(settings.clone(), tokio::runtime::Handle::current().id())
    }
}

impl Hash for SharingKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.1.hash(state);
        self.0.endpoints.hash(state);
        self.0.key_prefix.hash(state);
        self.0
            .credentials
            .as_ref()
            .map(|c| c.username.as_str())
            .hash(state);
    }
}

impl std::fmt::Debug for SharingKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharingKey")
            .field("endpoints", &self.0.endpoints)
            .field("key_prefix", &self.0.key_prefix)
            .field(
                "username",
                &self.0.credentials.as_ref().map(|c| c.username.as_str()),
            )
            .field("tls", &self.0.tls.is_some())
            .field("runtime", &self.1)
            .finish_non_exhaustive()
    }
}

/// A store's place in a shared entry; leaving (or dropping it) takes the
/// store's subscribers off the watch.
pub(crate) struct Membership {
    shared: Arc<Shared>,
    connection: Connection,
    id: u64,
    /// Cancelled when the membership ends, to end its shutdown watcher.
    left: CancellationToken,
}

impl std::fmt::Debug for Membership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Membership")
            .field("shared", &self.shared.id)
            .field("member", &self.id)
            .field("stores", &self.shared.fanout.len())
            .finish()
    }
}

impl Membership {
    /// The shared connection.
    pub(crate) fn connection(&self) -> &Connection {
        &self.connection
    }

    /// The entry's serial number.
    pub(crate) fn shared_id(&self) -> u64 {
        self.shared.id
    }

    /// How long, and why, the entry's watch has been failing, if it is.
    pub(crate) fn watch_failure(&self) -> Option<(std::time::Duration, String)> {
        self.shared.fanout.watch_failure()
    }

    /// Leaves the entry; the last store to leave stops its tasks and
    /// waits for them to end.
    pub(crate) async fn leave(self) {
        self.left.cancel();
        if self.shared.fanout.remove(self.id) {
            self.shared.stop().await;
        }
    }
}

impl Drop for Membership {
    fn drop(&mut self) {
        self.left.cancel();
        if self.shared.fanout.remove(self.id) {
            self.shared.stop_token().cancel();
        }
    }
}

/// Joins (or starts) the entry for `settings` with `hub`'s subscribers;
/// the membership also ends when `shutdown` is cancelled. Returns it and
/// whether this call connected the entry (and so has just read etcd).
pub(crate) async fn join(
    settings: &EtcdSettings,
    component: &ComponentKey,
    hub: &Arc<Subscribers>,
    shutdown: &CancellationToken,
) -> Result<(Membership, bool), rewire_etcd::Error> {
    let key = SharingKey::here(settings);
    loop {
        let shared = entry_for(&key);
        let (connection, made) = shared.connect(settings, component).await?;
        let connection = connection.clone();
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        if !shared.admit(id, Arc::clone(hub)) {
            // The last store left while this one connected: start anew.
            continue;
        }
        let left = CancellationToken::new();
        watch_shutdown(&shared, id, shutdown.clone(), left.clone());
        let membership = Membership {
            shared,
            connection,
            id,
            left,
        };
        return Ok((membership, made));
    }
}

/// Ends membership `id` when `shutdown` is cancelled (unless it ended
/// before: `left`).
fn watch_shutdown(shared: &Shared, id: u64, shutdown: CancellationToken, left: CancellationToken) {
    let fanout = Arc::clone(&shared.fanout);
    let stop = shared.stop_token().clone();
    tokio::spawn(async move {
        tokio::select! {
            () = shutdown.cancelled() => {
                if fanout.remove(id) {
                    stop.cancel();
                }
            }
            () = left.cancelled() => {}
        }
    });
}

/// The open entry for `key`, or a new one (registered).
fn entry_for(key: &SharingKey) -> Arc<Shared> {
    let mut registry = REGISTRY.lock().unwrap_or_else(|p| p.into_inner());
    registry.retain(|_, entry| entry.strong_count() > 0);
    if let Some(shared) = registry
        .get(key)
        .and_then(Weak::upgrade)
        .filter(|s| s.is_open())
    {
        return shared;
    }
    let shared = Arc::new(Shared::new(NEXT_ID.fetch_add(1, Ordering::Relaxed), rekey));
    registry.insert(key.clone(), Arc::downgrade(&shared));
    shared
}

/// Files entry `id`, found under `previous` (on its runtime), under `next`
/// instead (its connection now uses `next`'s TLS material): a store
/// starting with the new material joins it. A no-op if the entry is gone,
/// or if another open entry already has `next`.
pub(crate) fn rekey(previous: &EtcdSettings, next: &EtcdSettings, id: u64) {
    let mut registry = REGISTRY.lock().unwrap_or_else(|p| p.into_inner());
    let found = registry.iter().find(|(key, entry)| {
        key.0 == *previous && entry.upgrade().is_some_and(|shared| shared.id == id)
    });
    let Some((previous, entry)) = found.map(|(key, entry)| (key.clone(), entry.clone())) else {
        return;
    };
    let next = SharingKey(next.clone(), previous.1);
    if registry
        .get(&next)
        .and_then(Weak::upgrade)
        .is_some_and(|s| s.is_open())
    {
        return;
    }
    registry.remove(&previous);
    registry.insert(next, entry);
}

/// How many stores share the open entry for `settings` on the caller's
/// runtime (0: there is none). For tests.
pub(crate) fn stores_sharing(settings: &EtcdSettings) -> usize {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return 0;
    };
    let registry = REGISTRY.lock().unwrap_or_else(|p| p.into_inner());
    registry
        .get(&SharingKey(settings.clone(), runtime.id()))
        .and_then(Weak::upgrade)
        .filter(|s| s.is_open())
        .map_or(0, |s| s.fanout.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::etcd::metadata::Credentials;
    use crate::etcd::EtcdMetadata;
    use std::collections::hash_map::DefaultHasher;

    /// The runtime the keys of these tests are made on.
    static RUNTIME: LazyLock<tokio::runtime::Runtime> = LazyLock::new(runtime);

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap_or_else(|e| panic!("{e}"))
    }

    fn key(edit: impl FnOnce(&mut EtcdSettings)) -> SharingKey {
        let mut settings = EtcdMetadata::new("127.0.0.1:2379")
            .settings()
            .unwrap_or_else(|e| panic!("{e}"));
        settings.credentials = Some(Credentials {
            username: "app".into(),
            password: "pw-one".into(),
        });
        edit(&mut settings);
        RUNTIME.block_on(async { SharingKey::here(&settings) })
    }

    fn hash(key: &SharingKey) -> u64 {
        let mut hasher = DefaultHasher::new();
        key.hash(&mut hasher);
        hasher.finish()
    }

    #[test]
    fn every_setting_tells_keys_apart_and_equal_keys_hash_alike() {
        let base = key(|_| {});
        assert_eq!(base, key(|_| {}));
        assert_eq!(hash(&base), hash(&key(|_| {})));
        let password = key(|s| {
            if let Some(c) = &mut s.credentials {
                c.password = "pw-two".into();
            }
        });
        assert_ne!(base, password);
        assert_ne!(base, key(|s| s.key_prefix = "/other/".into()));
        assert_ne!(base, key(|s| s.endpoints.push("h:2379".into())));
        assert_ne!(base, key(|s| s.dial = std::time::Duration::from_secs(1)));
        assert_ne!(base, key(|s| s.credentials = None));
        let other_runtime = runtime();
        assert_ne!(
            base,
            SharingKey(base.0.clone(), other_runtime.handle().id())
        );
        let shown = format!("{password:?}");
        assert!(shown.contains("app") && !shown.contains("pw-"), "{shown}");
    }
}
