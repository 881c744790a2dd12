//! [`Shared`]: the connection, prefix watch, cache and read queue that
//! every store with the same settings uses, feeding the stores of its
//! [`Fanout`]. See [`sharing`](super::sharing) for how stores find it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rewire_etcd::{Client, ConnectOptions};
use rewire_runtime::ComponentKey;
use tokio::sync::OnceCell;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::info;

use super::cache::{read_prefix, KvCache, SharedCache};
use super::fanout::Fanout;
use super::keys::KeyLayout;
use super::metadata::{EtcdSettings, MAX_RESPONSE_BYTES_FIELD};
use super::reads::Reads;
use super::subscribers::Subscribers;
use super::watch::Follower;

/// HTTP/2 ping interval on the connection while a call or the watch is
/// open (etcd accepts one every 5 s then; none while idle, and the client
/// sends none then).
const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(10);

/// What the first store with these settings set up: the connection, the
/// watch's cache and the read queue. Cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct Connection {
    /// The connection (clones share it).
    pub(crate) client: Client,
    /// The prefix as the watch last saw it.
    pub(crate) cache: SharedCache,
    /// The queue of coalesced reads.
    pub(crate) reads: Reads,
    /// The revision of the initial read of the prefix.
    pub(crate) revision: i64,
    /// Keys under the prefix at that read.
    pub(crate) keys: usize,
}

/// How the registry files entry `id`, found under the first settings, under
/// the second (its TLS material changed).
pub(crate) type Refile = fn(&EtcdSettings, &EtcdSettings, u64);

/// One process-wide entry: connected once, then joined by every store with
/// the same settings. Its tasks stop when the last store leaves, or when
/// the entry is dropped.
#[derive(Debug)]
pub(crate) struct Shared {
    /// A serial number, for tests and logs.
    pub(crate) id: u64,
    /// The registry's refiling, told when new TLS material is in force.
    refile: Refile,
    pub(crate) fanout: Arc<Fanout>,
    stop: CancellationToken,
    connection: OnceCell<Connection>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl Shared {
    /// An entry not connected yet, refiled by `refile` when its TLS
    /// material changes.
    pub(crate) fn new(id: u64, refile: Refile) -> Self {
        Self {
            id,
            refile,
            fanout: Arc::default(),
            stop: CancellationToken::new(),
            connection: OnceCell::new(),
            tasks: Mutex::default(),
        }
    }

    /// Whether a store may still join: its last store has not left and
    /// its tasks run (they end with the async runtime that started them).
    pub(crate) fn is_open(&self) -> bool {
        if self.fanout.is_closed() || self.stop.is_cancelled() {
            return false;
        }
        let tasks = self.tasks.lock().unwrap_or_else(|p| p.into_inner());
        !tasks.iter().any(JoinHandle::is_finished)
    }

    /// The connection, made by the first caller (the others wait for it;
    /// if it fails, the next caller tries again). Returns it and whether
    /// this call made it.
    pub(crate) async fn connect(
        &self,
        settings: &EtcdSettings,
        component: &ComponentKey,
    ) -> Result<(&Connection, bool), rewire_etcd::Error> {
        let mut made = false;
        let connection = self
            .connection
            .get_or_try_init(|| async {
                made = true;
                self.open(settings, component).await
            })
            .await?;
        Ok((connection, made))
    }

    /// Connects, reads the prefix and starts the watch and read tasks.
    async fn open(
        &self,
        settings: &EtcdSettings,
        component: &ComponentKey,
    ) -> Result<Connection, rewire_etcd::Error> {
        let layout = KeyLayout::new(settings.key_prefix.clone());
        let client = Client::connect(&settings.urls(), options(settings)).await?;
        let snapshot = read_prefix(&client, &layout).await?;
        let revision = snapshot.revision;
        let keys = snapshot.entries.len();
        let cache: SharedCache = Arc::new(Mutex::new(KvCache::new(snapshot)));
        let follower = Follower::new(
            component.clone(),
            client.clone(),
            settings.clone(),
            layout,
            Arc::clone(&self.fanout),
            Arc::clone(&cache),
            revision,
        );
        let watch = tokio::spawn(follower.run(self.stop.clone()));
        let (reads, reading) = Reads::start(client.clone(), self.stop.clone());
        self.follow_tls_files(settings, component, &client);
        self.tasks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend([watch, reading]);
        info!(
            component = %component,
            shared = self.id,
            endpoints = %settings.endpoints_text(),
            key_prefix = %settings.key_prefix,
            keys,
            revision,
            "etcd connection and prefix watch started (shared by every store with these settings)."
        );
        Ok(Connection {
            client,
            cache,
            reads,
            revision,
            keys,
        })
    }

    /// Follows the TLS files of `settings` (if it names any) for as long
    /// as the entry lives: new material is tried on a new connection
    /// (`Status` must answer) and swapped into `client`, which every
    /// store, the read queue and the watch share; the watch then resumes
    /// on it from the revision after the last one seen. The registry
    /// then files the entry under the new material, so a store starting
    /// with it joins this entry.
    fn follow_tls_files(&self, settings: &EtcdSettings, component: &ComponentKey, client: &Client) {
        let (Some(fields), Some(material)) = (&settings.tls_fields, &settings.tls) else {
            return;
        };
        let client = client.clone();
        let (id, refile) = (self.id, self.refile);
        // The settings the registry files the entry under.
        let filed = Arc::new(Mutex::new(settings.clone()));
        crate::tls::follow_files(
            component.to_string(),
            "etcd",
            fields.clone(),
            material.clone(),
            self.stop.clone(),
            move |material| {
                let (client, filed) = (client.clone(), Arc::clone(&filed));
                async move {
                    let mut next = filed.lock().unwrap_or_else(|p| p.into_inner()).clone();
                    next.tls = Some(material);
                    if let Err(err) = client.replace_tls(tls_options(&next)).await {
                        let endpoints = next.endpoints_text();
                        return Err(next.scrub(&format!("etcd at {endpoints}: {err}")));
                    }
                    let previous = std::mem::replace(
                        &mut *filed.lock().unwrap_or_else(|p| p.into_inner()),
                        next.clone(),
                    );
                    refile(&previous, &next, id);
                    Ok(())
                }
            },
        );
    }

    /// Admits `hub` as member `id`; false if the last store left meanwhile.
    pub(crate) fn admit(&self, id: u64, hub: Arc<Subscribers>) -> bool {
        self.fanout.add(id, hub)
    }

    /// The token that stops the entry's tasks.
    pub(crate) fn stop_token(&self) -> &CancellationToken {
        &self.stop
    }

    /// Stops the tasks and waits for them to end.
    pub(crate) async fn stop(&self) {
        self.stop.cancel();
        let tasks: Vec<JoinHandle<()>> =
            std::mem::take(&mut *self.tasks.lock().unwrap_or_else(|p| p.into_inner()));
        for task in tasks {
            let _ = task.await;
        }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// The client's options for `settings`. Simple tokens expire (5 min idle
/// by default): the client logs in again rather than fail the request or
/// the re-watch. Answers are taken up to `maxResponseBytes`, and a larger
/// one fails naming that field.
fn options(settings: &EtcdSettings) -> ConnectOptions {
    ConnectOptions {
        connect_timeout: settings.dial,
        timeout: settings.dial,
        keep_alive: Some((KEEP_ALIVE_INTERVAL, settings.dial)),
        user: settings
            .credentials
            .as_ref()
            .map(|c| (c.username.clone(), c.password.clone())),
        tls: tls_options(settings),
        max_response_size: settings.max_response_bytes,
        max_response_size_setting: Some(MAX_RESPONSE_BYTES_FIELD),
    }
}

/// The client's TLS options for the material of `settings`.
pub(crate) fn tls_options(settings: &EtcdSettings) -> Option<rewire_etcd::TlsOptions> {
    settings.tls.as_ref().map(|tls| rewire_etcd::TlsOptions {
        ca_pem: tls.roots_pem(),
        identity: tls.identity.clone(),
        domain: None,
    })
}

#[cfg(test)]
mod tests {
    use super::{options, Shared};
    use crate::etcd::metadata::EtcdMetadata;
    use rewire_runtime::ComponentKey;
    use testkit::etcd::EtcdServer;

    /// A prefix whose read is over `maxResponseBytes` fails the connection
    /// with an error naming the limit and the field, before any of the
    /// answer is taken.
    #[tokio::test]
    async fn a_prefix_over_max_response_bytes_fails_naming_the_field() {
        let server = EtcdServer::start().await;
        server.put("/big/k", &"v".repeat(8 * 1024)).await;
        let mut metadata = EtcdMetadata::new(server.endpoint());
        metadata.key_prefix = "/big/".into();
        metadata.max_response_bytes = Some(4096);
        let settings = metadata.settings().unwrap_or_else(|e| panic!("{e}"));
        let shared = Shared::new(1, |_, _, _| {});
        let key = ComponentKey::new("config_store", "etcd");
        let refused = shared.connect(&settings, &key).await.map(drop);
        let Err(err) = refused else {
            panic!("a prefix over the limit was read");
        };
        let text = err.to_string();
        assert!(err.is_too_large(), "{text}");
        assert!(text.contains("4096 bytes"), "{text}");
        assert!(text.contains("`maxResponseBytes`"), "{text}");
    }

    #[test]
    fn the_client_takes_answers_up_to_max_response_bytes_and_names_the_field() {
        let settings = EtcdMetadata::new("h:1")
            .settings()
            .unwrap_or_else(|e| panic!("{e}"));
        let by_default = options(&settings);
        assert_eq!(by_default.max_response_size, 64 * 1024 * 1024);
        assert_eq!(
            by_default.max_response_size_setting,
            Some("maxResponseBytes")
        );
        let mut metadata = EtcdMetadata::new("h:1");
        metadata.max_response_bytes = Some(1 << 30);
        let settings = metadata.settings().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(options(&settings).max_response_size, 1 << 30);
    }
}
