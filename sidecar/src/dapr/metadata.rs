//! The sidecar's metadata, as Dapr's `GetMetadata` has it: the app id, the
//! runtime version and the components of the call's generation, each with a
//! Dapr-style type (`state.memory`, `secretstores.local.file`,
//! `configuration.apollo`, `lock.redis`; custom kinds as `kind.type`), the
//! app's pub/sub subscriptions and how the app is reached, plus what Dapr
//! always sends: `daprRuntimeVersion` among the extended metadata and the
//! actor runtime (rewire hosts no actors: Dapr's answer without a placement
//! service).
//!
//! Components and declared subscriptions come from the one generation
//! snapshot the call loaded (it carries the app id and each component's
//! type), so the answer never pairs one generation's components with
//! another's configuration. The other subscriptions are read from their
//! owners: the app's own from the app channel (as the app service took
//! them), the streams' from the sidecar's [`StreamingSubscriptions`].
//! Subscription metadata is plain strings as the configuration, the app or
//! the stream's client wrote them (a `secretKeyRef` cannot be declared
//! there), so no secret is resolved into the answer.

use std::any::Any;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use rewire_runtime::config::SubscriptionRoutes;
use rewire_runtime::{Instance, Kind};

use super::budget::json_string_bytes;
use super::call::Call;
use crate::ApiState;

/// rewire's version: the runtime version the metadata gives, also as the
/// extended entry `daprRuntimeVersion` (Dapr gives its own version in both).
pub const RUNTIME_VERSION: &str = env!("CARGO_PKG_VERSION");

/// Most entries a client may set in the extended metadata.
pub const MAX_EXTENDED_METADATA_ENTRIES: usize = 64;

/// Longest key of an extended metadata entry, in bytes.
pub const MAX_EXTENDED_METADATA_KEY_BYTES: usize = 1024;

/// Longest value of an extended metadata entry, in bytes.
pub const MAX_EXTENDED_METADATA_VALUE_BYTES: usize = 4096;

/// Why an extended metadata entry was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExtendedMetadataError {
    /// The key is too long.
    #[error("the metadata key takes {0} bytes, more than the sidecar's limit of {MAX_EXTENDED_METADATA_KEY_BYTES}")]
    KeyTooLong(usize),
    /// The value is too long.
    #[error("the value of metadata key `{key}` takes {bytes} bytes, more than the sidecar's limit of {MAX_EXTENDED_METADATA_VALUE_BYTES}")]
    ValueTooLong {
        /// The key (short enough to be named).
        key: String,
        /// The value's size.
        bytes: usize,
    },
    /// A new key, with the metadata full.
    #[error("the extended metadata already holds {MAX_EXTENDED_METADATA_ENTRIES} entries, the sidecar's limit; metadata key `{0}` was not added (an existing key can still be changed)")]
    Full(String),
}

/// The sidecar's extended metadata, as Dapr's `SetMetadata` (gRPC) and
/// `PUT /v1.0/metadata/{key}` (HTTP) set it and `GetMetadata` shows it:
/// one table per sidecar, shared by both APIs, bounded in entries and in
/// the length of each key and value.
#[derive(Debug, Default)]
pub struct ExtendedMetadata {
    entries: Mutex<BTreeMap<String, String>>,
}

/// The `T` of the sidecar that `owner` (one `Arc` per sidecar, shared by
/// its HTTP and gRPC APIs) belongs to; made on first use and dropped soon
/// after `owner` is.
fn of_sidecar<T, O>(owner: &Arc<O>) -> Arc<T>
where
    T: Any + Default + Send + Sync,
    O: Any + Send + Sync,
{
    /// The tables, each with a weak handle on its owner.
    type Tables = Vec<(Weak<dyn Any + Send + Sync>, Arc<dyn Any + Send + Sync>)>;
    static TABLES: Mutex<Tables> = Mutex::new(Vec::new());
    let mut tables = TABLES.lock().unwrap_or_else(PoisonError::into_inner);
    tables.retain(|(owner, _)| owner.strong_count() > 0);
    let address = Arc::as_ptr(owner).cast::<()>();
    let found = tables
        .iter()
        .filter(|(owner, _)| owner.as_ptr().cast::<()>() == address)
        .find_map(|(_, table)| Arc::clone(table).downcast::<T>().ok());
    if let Some(table) = found {
        return table;
    }
    let any: Arc<dyn Any + Send + Sync> = owner.clone();
    let table = Arc::new(T::default());
    tables.push((Arc::downgrade(&any), table.clone()));
    table
}

impl ExtendedMetadata {
    /// The table of the sidecar that `owner` (one `Arc` per sidecar,
    /// shared by its HTTP and gRPC APIs) belongs to; made on first use and
    /// dropped soon after `owner` is.
    pub fn of<T: Any + Send + Sync>(owner: &Arc<T>) -> Arc<Self> {
        of_sidecar(owner)
    }

    /// Sets `key` to `value`, as Dapr: an empty key changes nothing.
    pub fn set(&self, key: String, value: String) -> Result<(), ExtendedMetadataError> {
        if key.is_empty() {
            return Ok(());
        }
        if key.len() > MAX_EXTENDED_METADATA_KEY_BYTES {
            return Err(ExtendedMetadataError::KeyTooLong(key.len()));
        }
        if value.len() > MAX_EXTENDED_METADATA_VALUE_BYTES {
            return Err(ExtendedMetadataError::ValueTooLong {
                key,
                bytes: value.len(),
            });
        }
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        if entries.len() >= MAX_EXTENDED_METADATA_ENTRIES && !entries.contains_key(&key) {
            return Err(ExtendedMetadataError::Full(key));
        }
        entries.insert(key, value);
        Ok(())
    }

    /// Every entry set, with `generation` as `rewire.generation` and
    /// [`RUNTIME_VERSION`] as `daprRuntimeVersion`, as Dapr always adds it
    /// (the sidecar's own entries win over ones a client set).
    pub fn entries(&self, generation: u64) -> BTreeMap<String, String> {
        let mut entries = self
            .entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        entries.insert("rewire.generation".to_string(), generation.to_string());
        entries.insert(
            "daprRuntimeVersion".to_string(),
            RUNTIME_VERSION.to_string(),
        );
        entries
    }
}

/// The topic streams open on one sidecar (`SubscribeTopicEventsAlpha1`,
/// Layotto's `SubscribeTopicEvents`), for its metadata: a stream books
/// itself while it delivers and is struck off when its [`StreamListing`]
/// is dropped.
#[derive(Debug, Default)]
pub struct StreamingSubscriptions {
    next: AtomicU64,
    open: Mutex<BTreeMap<u64, ListedSubscription>>,
}

/// A stream's entry among the [`StreamingSubscriptions`]: struck off when
/// dropped.
#[derive(Debug)]
pub struct StreamListing {
    book: Weak<StreamingSubscriptions>,
    id: u64,
}

impl StreamingSubscriptions {
    /// The streams of the sidecar `owner` belongs to (as
    /// [`ExtendedMetadata::of`]).
    pub fn of<T: Any + Send + Sync>(owner: &Arc<T>) -> Arc<Self> {
        of_sidecar(owner)
    }

    /// Books a stream on `topic` of `pubsub_name` until the listing drops.
    pub fn open(
        self: &Arc<Self>,
        pubsub_name: &str,
        topic: &str,
        metadata: BTreeMap<String, String>,
        dead_letter_topic: Option<String>,
    ) -> StreamListing {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let listed = ListedSubscription {
            pubsub_name: pubsub_name.to_string(),
            topic: topic.to_string(),
            metadata,
            rules: Vec::new(),
            dead_letter_topic,
            origin: SubscriptionOrigin::Streaming,
        };
        self.lock().insert(id, listed);
        StreamListing {
            book: Arc::downgrade(self),
            id,
        }
    }

    /// The streams open, oldest first, as many as fit in `budget` bytes
    /// of answer, each counted as JSON writes it, escapes included
    /// (protobuf takes less). Every stream that fits bare (no metadata)
    /// is listed; what the budget has left then gives the oldest their
    /// metadata, each whole or not at all. A client controls what its
    /// streams carry (up to 16 KiB of metadata each), so the answer stays
    /// bounded however many it opens.
    pub fn listed_within(&self, budget: usize) -> Vec<ListedSubscription> {
        let open = self.lock();
        let mut left = budget;
        let mut fitting = Vec::new();
        for stream in open.values() {
            let Some(rest) = left.checked_sub(stream.answer_bytes_without_metadata()) else {
                break;
            };
            left = rest;
            fitting.push(stream);
        }
        fitting
            .into_iter()
            .map(|stream| {
                let metadata = match left.checked_sub(metadata_answer_bytes(&stream.metadata)) {
                    Some(rest) => {
                        left = rest;
                        stream.metadata.clone()
                    }
                    None => BTreeMap::new(),
                };
                ListedSubscription {
                    pubsub_name: stream.pubsub_name.clone(),
                    topic: stream.topic.clone(),
                    metadata,
                    rules: stream.rules.clone(),
                    dead_letter_topic: stream.dead_letter_topic.clone(),
                    origin: stream.origin,
                }
            })
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, ListedSubscription>> {
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for StreamListing {
    fn drop(&mut self) {
        if let Some(book) = self.book.upgrade() {
            book.lock().remove(&self.id);
        }
    }
}

/// The sidecar's metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SidecarMetadata {
    /// The app id served.
    pub app_id: String,
    /// rewire's version.
    pub runtime_version: &'static str,
    /// The number of the generation described.
    pub generation: u64,
    /// Its components, in key order.
    pub components: Vec<RegisteredComponent>,
    /// The app's pub/sub subscriptions: declared (in name order), the
    /// app's own, then the open streams.
    pub subscriptions: Vec<ListedSubscription>,
    /// How the app is reached; none without an app channel (the APIs then
    /// answer [`AppConnection::without_app`]).
    pub app_connection: Option<AppConnection>,
    /// The actor runtime: always [`ActorRuntime::DISABLED`].
    pub actor_runtime: ActorRuntime,
}

/// The actor runtime, as Dapr's `ActorRuntime` (no active actors).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ActorRuntime {
    /// Dapr's `ActorRuntimeStatus` name.
    pub status: &'static str,
    /// Whether actors can be hosted.
    pub host_ready: bool,
    /// The placement provider's message.
    pub placement: &'static str,
}

impl ActorRuntime {
    /// What Dapr answers when started without a placement service; rewire
    /// hosts no actors.
    pub const DISABLED: ActorRuntime = ActorRuntime {
        status: "DISABLED",
        host_ready: false,
        placement: "placement: disconnected",
    };
}

/// Where a subscription comes from, as Dapr's `PubsubSubscriptionType`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubscriptionOrigin {
    /// The configuration's `subscriptions` section.
    Declarative,
    /// The app's list (`/dapr/subscribe`, `ListTopicSubscriptions`), or
    /// given in code.
    Programmatic,
    /// A topic stream.
    Streaming,
}

impl SubscriptionOrigin {
    /// Dapr's name: `DECLARATIVE`, `PROGRAMMATIC`, `STREAMING`.
    pub fn dapr_name(self) -> &'static str {
        match self {
            SubscriptionOrigin::Declarative => "DECLARATIVE",
            SubscriptionOrigin::Programmatic => "PROGRAMMATIC",
            SubscriptionOrigin::Streaming => "STREAMING",
        }
    }
}

/// One subscription of the app, as Dapr's `PubsubSubscription`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedSubscription {
    /// The pub/sub component.
    pub pubsub_name: String,
    /// The topic.
    pub topic: String,
    /// Its metadata, passed to the broker.
    pub metadata: BTreeMap<String, String>,
    /// Its routes as Dapr lists them: `(match, path)` in order, the
    /// default route last with an empty match.
    pub rules: Vec<(String, String)>,
    /// Where events that fail for good go.
    pub dead_letter_topic: Option<String>,
    /// Where it comes from.
    pub origin: SubscriptionOrigin,
}

impl ListedSubscription {
    /// A subscription as the metadata lists it, its routes as Dapr's
    /// rules.
    pub fn new(
        pubsub_name: &str,
        topic: &str,
        metadata: &BTreeMap<String, String>,
        routes: &SubscriptionRoutes,
        dead_letter_topic: Option<&str>,
        origin: SubscriptionOrigin,
    ) -> Self {
        Self {
            pubsub_name: pubsub_name.to_string(),
            topic: topic.to_string(),
            metadata: metadata.clone(),
            rules: dapr_rules(routes),
            dead_letter_topic: dead_letter_topic.map(str::to_string),
            origin,
        }
    }
}

impl ListedSubscription {
    /// What the subscription takes in a JSON answer without its metadata
    /// (field names and punctuation counted generously).
    fn answer_bytes_without_metadata(&self) -> usize {
        let rules: usize = self
            .rules
            .iter()
            .map(|(matcher, path)| json_string_bytes(matcher) + json_string_bytes(path) + 24)
            .sum();
        json_string_bytes(&self.pubsub_name)
            + json_string_bytes(&self.topic)
            + self
                .dead_letter_topic
                .as_deref()
                .map_or(2, json_string_bytes)
            + rules
            + 96
    }
}

/// What `metadata` takes in a JSON answer.
fn metadata_answer_bytes(metadata: &BTreeMap<String, String>) -> usize {
    metadata
        .iter()
        .map(|(key, value)| json_string_bytes(key) + json_string_bytes(value) + 2)
        .sum::<usize>()
        + 16
}

/// The app's own subscriptions as the app service took them (its list, and
/// those given in code), booked on the app channel for the metadata: one
/// book shared by the channel's clones. Empty until the app has been
/// asked, and again once the service has stopped.
#[derive(Debug, Clone, Default)]
pub struct ProgrammaticSubscriptions(Arc<Mutex<Arc<[ListedSubscription]>>>);

impl ProgrammaticSubscriptions {
    /// The subscriptions booked.
    pub fn get(&self) -> Arc<[ListedSubscription]> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Books `listed` in place of what was booked.
    pub fn set(&self, listed: Arc<[ListedSubscription]>) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = listed;
    }
}

/// What `maxConcurrency` says of calls to the app: rewire never bounds
/// them, which Dapr reports as its `--app-max-concurrency` default, -1 (no
/// limit).
pub const APP_MAX_CONCURRENCY: i32 = -1;

/// How the app is reached, as Dapr's `AppConnectionProperties` (rewire
/// has no app health checks, nor a concurrency bound: see
/// [`APP_MAX_CONCURRENCY`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppConnection {
    /// The app's port.
    pub port: u16,
    /// `http` or `grpc`.
    pub protocol: &'static str,
    /// The app's host.
    pub channel_address: String,
}

impl AppConnection {
    /// What Dapr answers without an app port: its flags' defaults
    /// (`--app-protocol http`, `--app-channel-address 127.0.0.1`), port 0.
    pub fn without_app() -> Self {
        Self {
            port: 0,
            protocol: "http",
            channel_address: "127.0.0.1".to_string(),
        }
    }
}

/// Routes as Dapr lists them: each rule's match and path, then the
/// default route with an empty match.
fn dapr_rules(routes: &SubscriptionRoutes) -> Vec<(String, String)> {
    routes
        .rules
        .iter()
        .map(|rule| {
            let matcher = rule.matcher.as_ref().map(|m| m.source().to_string());
            (matcher.unwrap_or_default(), rule.path.clone())
        })
        .chain(
            routes
                .default
                .iter()
                .map(|path| (String::new(), path.clone())),
        )
        .collect()
}

/// One component, as Dapr's `RegisteredComponents`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegisteredComponent {
    /// The component's name.
    pub name: String,
    /// Its Dapr-style type (see [`dapr_component_type`]).
    pub type_name: String,
    /// What it can do, in Dapr's names (a state store's features:
    /// `ETAG`, `TRANSACTIONAL`, `TTL`).
    pub capabilities: Vec<String>,
}

/// The metadata of the call's generation, with the app's subscriptions and
/// connection as the sidecar `state` serves them: declared subscriptions
/// (listed with an app channel only: without one they deliver nothing),
/// the app's own as the app service booked them on the channel, then the
/// open topic streams.
pub fn metadata(call: &Call, state: &ApiState) -> SidecarMetadata {
    let generation = call.generation();
    let channel = state.options.app_channel.as_ref();
    let mut subscriptions = Vec::new();
    if let Some(channel) = channel {
        let app_id = generation.app_id();
        let declared = generation.sections().subscriptions.0.values();
        subscriptions.extend(declared.filter(|declared| declared.applies_to(app_id)).map(
            |declared| {
                ListedSubscription::new(
                    &declared.pubsub_name,
                    &declared.topic,
                    &declared.metadata,
                    &declared.routes,
                    declared.dead_letter_topic.as_deref(),
                    SubscriptionOrigin::Declarative,
                )
            },
        ));
        subscriptions.extend(channel.listed().get().iter().cloned());
    }
    let streams_budget = state.options.max_response_bytes / 2;
    subscriptions.extend(StreamingSubscriptions::of(&state.metrics).listed_within(streams_budget));
    let components = generation
        .iter()
        .map(|(key, instance)| RegisteredComponent {
            name: key.name.to_string(),
            type_name: dapr_component_type(
                &key.kind,
                generation.type_name(key).unwrap_or("unknown"),
            ),
            capabilities: capabilities(instance),
        })
        .collect();
    SidecarMetadata {
        app_id: generation.app_id().to_string(),
        runtime_version: RUNTIME_VERSION,
        generation: generation.number,
        components,
        subscriptions,
        app_connection: channel.map(|channel| channel.connection()),
        actor_runtime: ActorRuntime::DISABLED,
    }
}

/// A component's capabilities, in Dapr's names.
fn capabilities(instance: &Instance) -> Vec<String> {
    match instance {
        Instance::State(store) => store
            .features()
            .into_iter()
            .map(|feature| feature.dapr_name().to_string())
            .collect(),
        _ => Vec::new(),
    }
}

/// A component's type as Dapr spells it: `{category}.{type}`, e.g.
/// `state.redis`, `secretstores.local.file`, `configuration.apollo`; a
/// custom kind is its own category.
pub fn dapr_component_type(kind: &Kind, type_name: &str) -> String {
    let category = match kind {
        Kind::State => "state",
        Kind::SecretStore => "secretstores",
        Kind::ConfigStore => "configuration",
        Kind::Lock => "lock",
        Kind::Sequencer => "sequencer",
        Kind::File => "file",
        Kind::PubSub => "pubsub",
        Kind::Custom(custom) => custom.as_ref(),
    };
    format!("{category}.{type_name}")
}

#[cfg(test)]
mod tests {
    use rewire_runtime::config::{validate, Config};
    use rewire_runtime::{Registry, Runtime, RuntimeOptions};

    use super::*;
    use crate::dapr::StoreLabel;

    #[tokio::test]
    async fn metadata_comes_from_the_generation_snapshot() {
        let file = Config {
            app_id: "checkout".into(),
            ..Config::default()
        };
        let config = validate(file, &Registry::default()).unwrap_or_else(|p| panic!("{p}"));
        let runtime = Runtime::start(config, Registry::default(), RuntimeOptions::default())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let state = ApiState {
            runtime: runtime.clone(),
            options: Arc::new(crate::ApiOptions::default()),
            metrics: Arc::new(crate::ApiMetrics::new()),
            tls: crate::tls::ServingTls::default(),
        };
        let answer = metadata(&Call::new(&runtime, StoreLabel::default()), &state);
        assert_eq!(answer.app_id, "checkout");
        assert_eq!(answer.generation, 1);
        assert!(answer.components.is_empty());
        assert!(answer.subscriptions.is_empty());
        assert_eq!(answer.app_connection, None);
        runtime.shutdown().await;
    }

    #[test]
    fn extended_metadata_is_bounded_and_kept_per_owner() {
        let (one, other) = (Arc::new(1_u8), Arc::new(2_u8));
        let table = ExtendedMetadata::of(&one);
        assert!(Arc::ptr_eq(&table, &ExtendedMetadata::of(&one)));
        assert!(!Arc::ptr_eq(&table, &ExtendedMetadata::of(&other)));
        let streams = StreamingSubscriptions::of(&one);
        assert!(Arc::ptr_eq(&streams, &StreamingSubscriptions::of(&one)));
        assert!(Arc::ptr_eq(&table, &ExtendedMetadata::of(&one)));
        assert_eq!(table.set(String::new(), "ignored".into()), Ok(()));
        for i in 0..MAX_EXTENDED_METADATA_ENTRIES {
            assert_eq!(table.set(format!("k{i}"), "v".into()), Ok(()));
        }
        assert!(matches!(
            table.set("one-more".into(), "v".into()),
            Err(ExtendedMetadataError::Full(_))
        ));
        assert_eq!(table.set("k0".into(), "changed".into()), Ok(()));
        let long = "x".repeat(MAX_EXTENDED_METADATA_VALUE_BYTES + 1);
        assert!(table.set("k1".into(), long.clone()).is_err());
        assert!(table.set(long, "v".into()).is_err());
        let entries = table.entries(7);
        assert_eq!(entries.len(), MAX_EXTENDED_METADATA_ENTRIES + 2);
        assert_eq!(entries.get("k0").map(String::as_str), Some("changed"));
        assert_eq!(
            entries.get("rewire.generation").map(String::as_str),
            Some("7")
        );
        assert_eq!(
            entries.get("daprRuntimeVersion").map(String::as_str),
            Some(RUNTIME_VERSION)
        );
    }

    #[test]
    fn built_in_kinds_use_dapr_categories() {
        assert_eq!(dapr_component_type(&Kind::State, "redis"), "state.redis");
        assert_eq!(
            dapr_component_type(&Kind::SecretStore, "local.file"),
            "secretstores.local.file"
        );
        assert_eq!(
            dapr_component_type(&Kind::ConfigStore, "apollo"),
            "configuration.apollo"
        );
        assert_eq!(dapr_component_type(&Kind::Lock, "memory"), "lock.memory");
        assert_eq!(
            dapr_component_type(&Kind::parse("greeter"), "english"),
            "greeter.english"
        );
    }
}
