//! The `redis` pub/sub: Redis Streams with the semantics of Dapr's
//! `pubsub.redis`. A topic is a stream; a publish is an `XADD` (field
//! `data`, plus `metadata`, the request's metadata as JSON, when it has
//! any, given back to subscribers with the message, as Dapr; trimmed with
//! `MAXLEN ~ maxLenApprox` when set) and is acknowledged once the server
//! took it. Each subscription reads through
//! the consumer group `consumerID` (default: the app id), created at the
//! start of the stream when missing, with `XREADGROUP`; a delivery settled
//! `SUCCESS` or `DROP` is `XACK`ed, one not settled stays pending and is
//! delivered again once it has been pending for `processingTimeout`
//! (looked for as the subscription starts, then every `redeliverInterval`;
//! either at `0`: never, as Dapr). Subscriptions of one consumer
//! ID share its entries (competing consumers), as in Dapr.
//!
//! A topic is the stream's key as it is, in the key space the state
//! stores, locks and sequencers on the server use too; a topic holding
//! `||`, which separates the parts of their keys, is refused on publish
//! and subscribe (`check_topic`), so no topic can make a stream at
//! another app's lock, counter or state key. The same check answers
//! [`PubSub::check_topic`], which the sidecar asks of a subscription's
//! dead-letter topic before it starts and of a publish's topic before its
//! guarded call.
//!
//! On a Redis Cluster (`redisType: cluster`) a topic's stream is one key,
//! so every command of a subscription goes to the master of its slot.
//!
//! With `failover` (Redis Sentinel) the master is followed as the state
//! store follows it: `XADD`, `XGROUP` and `XACK` go through its
//! [`RedisConnection`], which asks the sentinels again after an error that
//! suggests the master moved; each reader re-opens its own connection to
//! the master the sentinels name after such an error (with backoff), then
//! reclaims its pending entries there at once.
//!
//! With TLS files (`caCert`, `clientCert`, `clientKey` as paths) the
//! files are followed until the component closes
//! ([`Connected::follow_tls_files`]): new material reaches the publishing
//! connection, new subscriptions and the readers' reconnections.
//!
//! `processingTimeout`, `redeliverInterval`, `queueDepth`, `concurrency`
//! and `maxLenApprox` apply in place; a change of server, `redisType`,
//! credentials, database or consumer ID rebuilds the component, and the handle layer
//! moves subscriptions to the new instance without losing a message.

use std::sync::{Arc, Mutex, OnceLock, Weak};

use arc_swap::ArcSwap;
use rewire_runtime::{
    echoed, Component, ComponentError, InPlace, InPlaceUpdate, InitContext, Metadata,
    PendingInPlace, PubSub, PubSubError, PubSubSubscription, PublishRequest, Readiness,
    StagedInPlace, SubscribeRequest,
};
use tracing::{info, warn};

use super::connect::open;
use super::connection::RedisConnection;
use super::pubsub_connected::Connected;
use super::pubsub_metadata::{RedisPubSubMetadata, Tunables};
use super::pubsub_reader::{ensure_group, reading_settings, Permits, Reader};
use crate::key_prefix::KEY_SEPARATOR;
use crate::pubsub::PublishGate;

/// How long a close waits for the publishes under way (each bounded by
/// the connection's timeouts, unless `readTimeout` is -1).
const CLOSE_GATE_WITHIN: std::time::Duration = std::time::Duration::from_secs(15);

/// A pub/sub broker on Redis Streams, compatible with Dapr's
/// `pubsub.redis`.
#[derive(rewire_runtime::Component)]
#[component(
    kind = "pubsub",
    type = "redis",
    example = r#"{"redisHost": "127.0.0.1:6379", "consumerID": "", "processingTimeout": "60s", "redeliverInterval": "15s", "concurrency": 10, "maxLenApprox": 10000}"#
)]
pub struct RedisPubSub {
    #[metadata]
    metadata: RedisPubSubMetadata,
    connected: OnceLock<Connected>,
    tunables: Arc<ArcSwap<Tunables>>,
    gate: Arc<PublishGate>,
    /// The permits of each subscription, resized when `concurrency`
    /// changes in place.
    permits: Arc<Mutex<Vec<Weak<Permits>>>>,
}

impl std::fmt::Debug for RedisPubSub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisPubSub")
            .field("metadata", &self.metadata)
            .finish_non_exhaustive()
    }
}

impl RedisPubSub {
    fn connected(&self) -> Result<&Connected, PubSubError> {
        self.connected
            .get()
            .ok_or_else(|| PubSubError::Backend("redis pub/sub is not connected".into()))
    }
}

#[rewire_runtime::prelude::async_trait]
impl Component for RedisPubSub {
    async fn init(&mut self, cx: &InitContext) -> Result<(), ComponentError> {
        let key = &cx.key;
        let tunables = self
            .metadata
            .tunables()
            .map_err(|e| ComponentError::new(format!("{key}: {e}")))?;
        self.tunables.store(Arc::new(tunables));
        self.metadata.config_dir.clone_from(&cx.config_dir);
        let settings = self
            .metadata
            .connection()
            .read_connection_settings()
            .await?;
        let connection =
            RedisConnection::open_following_failover(&key.to_string(), self.metadata.connection())
                .await?;
        let server = connection.session().server().to_string();
        let group = match self.metadata.consumer_id.trim() {
            "" => cx.app_id.clone(),
            id => id.to_string(),
        };
        info!(component = %key, host = %settings.host(), server = %server, group = %group, "Redis pub/sub connected.");
        let connected = Connected {
            connection: Arc::new(connection),
            settings: Arc::new(tokio::sync::watch::Sender::new(Arc::new(settings))),
            group,
            shutdown: cx.shutdown.clone(),
            label: key.to_string(),
        };
        connected.follow_tls_files(self.metadata.connection());
        let _ = self.connected.set(connected);
        Ok(())
    }

    async fn readiness(&self) -> Readiness {
        let Ok(connected) = self.connected() else {
            return Readiness::NotReady("not connected".into());
        };
        connected.connection.readiness().await
    }

    /// Waits for the publishes under way (within [`CLOSE_GATE_WITHIN`],
    /// then later ones are refused without them), then ends the
    /// connection's tasks, which also end if the runtime gives up on the
    /// close before (its future dropped).
    async fn close(&self) -> Result<(), ComponentError> {
        let _ends = self
            .connected
            .get()
            .map(|connected| connected.shutdown.clone().drop_guard());
        if tokio::time::timeout(CLOSE_GATE_WITHIN, self.gate.close())
            .await
            .is_err()
        {
            self.gate.refuse_publishes();
            if let Some(connected) = self.connected.get() {
                warn!(component = %connected.label, limit = ?CLOSE_GATE_WITHIN, "Publishes under way did not end before the close; later ones are refused, and the broker closes without them.");
            }
        }
        if let Some(connected) = self.connected.get() {
            info!(component = %connected.label, server = %connected.server(), "Redis pub/sub closed.");
        }
        Ok(())
    }

    fn as_in_place(&self) -> Option<&dyn InPlaceUpdate> {
        Some(self)
    }
}

/// Deferred: the new tunables are put in force at commit (another broker
/// needs a rebuild).
#[rewire_runtime::prelude::async_trait]
impl InPlaceUpdate for RedisPubSub {
    async fn update_in_place(&self, metadata: &Metadata) -> Result<InPlace, ComponentError> {
        let StagedInPlace::Deferred(pending) = self.stage_in_place(metadata).await? else {
            return Ok(InPlace::NeedsRebuild);
        };
        pending.apply();
        Ok(InPlace::Applied)
    }

    async fn stage_in_place(&self, metadata: &Metadata) -> Result<StagedInPlace, ComponentError> {
        let mut new = metadata
            .decode::<RedisPubSubMetadata>()
            .map_err(|err| ComponentError::new(format!("new metadata rejected: {err}")))?;
        new.config_dir.clone_from(&self.metadata.config_dir);
        if !new.same_broker(&self.metadata) {
            return Ok(StagedInPlace::NeedsRebuild);
        }
        let tunables = new
            .tunables()
            .map_err(|err| ComponentError::new(format!("new metadata rejected: {err}")))?;
        let current = self.tunables.clone();
        let permits = self.permits.clone();
        Ok(StagedInPlace::Deferred(PendingInPlace::new(move || {
            current.store(Arc::new(tunables));
            let mut permits = permits
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            permits.retain(|subscription| match subscription.upgrade() {
                Some(subscription) => {
                    subscription.resize(tunables.concurrency);
                    true
                }
                None => false,
            });
        })))
    }
}

/// A topic is its stream's key, in the key space the state stores, locks
/// and sequencers of the server share, whose keys' parts `||` separates
/// (`{appId}||{key}`, `lock||{appId}||{resourceId}`,
/// `sequencer|||{appId}||{key}`): a topic holding it could make a stream
/// at another app's key and break that key for good (a lock never granted
/// again, a counter that fails). So it is refused, as a state key, a lock's
/// resource id or a sequencer's key holding it is; the error names
/// `component` and the topic (as [`echoed`]). An empty topic is refused
/// too.
fn check_topic(component: &str, topic: &str) -> Result<(), PubSubError> {
    if topic.is_empty() {
        return Err(PubSubError::Invalid(format!(
            "pub/sub `{component}`: the topic is empty"
        )));
    }
    if topic.contains(KEY_SEPARATOR) {
        return Err(PubSubError::Invalid(format!(
            "pub/sub `{component}`: topic `{}` can't contain `{KEY_SEPARATOR}`: a topic is a \
             Redis stream key, and `{KEY_SEPARATOR}` separates the parts of the state, lock \
             and sequencer keys on the server",
            echoed(topic)
        )));
    }
    Ok(())
}

/// Adds `new` to the permits of the subscriptions, dropping those of
/// subscriptions that ended.
fn register(all: &Mutex<Vec<Weak<Permits>>>, new: &Arc<Permits>) {
    let mut all = all
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    all.retain(|subscription| subscription.strong_count() > 0);
    all.push(Arc::downgrade(new));
}

#[rewire_runtime::prelude::async_trait]
impl PubSub for RedisPubSub {
    async fn publish(&self, req: PublishRequest) -> Result<(), PubSubError> {
        let connected = self.connected()?;
        check_topic(&connected.label, &req.topic)?;
        let _pass = self.gate.enter().await?;
        let mut cmd = redis::cmd("XADD");
        cmd.arg(&req.topic);
        if let Some(max_len) = self.tunables.load().max_len_approx {
            cmd.arg("MAXLEN").arg("~").arg(max_len);
        }
        cmd.arg("*").arg("data").arg(&req.data);
        // As Dapr: the request's metadata as a JSON object in field
        // `metadata`, given back to subscribers with the message.
        if !req.metadata.is_empty() {
            let metadata: std::collections::BTreeMap<_, _> = req.metadata.iter().collect();
            let json = serde_json::to_vec(&metadata)
                .map_err(|err| PubSubError::Invalid(format!("metadata: {err}")))?;
            cmd.arg("metadata").arg(json);
        }
        let (session, mut conn) = connected.commands().map_err(PubSubError::Backend)?;
        let _id: String = cmd
            .query_async(&mut conn)
            .await
            .map_err(|err| PubSubError::Backend(connected.failed(&session, &err)))?;
        Ok(())
    }

    async fn subscribe(&self, req: SubscribeRequest) -> Result<PubSubSubscription, PubSubError> {
        let connected = self.connected()?.clone();
        check_topic(&connected.label, &req.topic)?;
        let (session, mut conn) = connected.commands().map_err(PubSubError::Backend)?;
        ensure_group(&mut conn, &req.topic, &connected.group)
            .await
            .map_err(|err| PubSubError::Backend(connected.failed(&session, &err)))?;
        // Blocking reads get a connection of their own.
        let settings = connected.settings();
        let reading = open(&reading_settings(&settings))
            .await
            .map_err(|err| PubSubError::Backend(err.to_string()))?;
        let tunables = **self.tunables.load();
        let (subscription, feed) = PubSubSubscription::channel(tunables.concurrency);
        let permits = Permits::new(tunables.concurrency);
        register(&self.permits, &permits);
        let reader = Reader {
            connected,
            reading: reading.connection,
            reading_server: reading.server,
            reading_settings: settings,
            reopen_failed_at: None,
            topic: req.topic,
            tunables: self.tunables.clone(),
            gate: self.gate.clone(),
            feed,
            permits,
            in_flight_ids: Arc::default(),
            without_xpending_idle: false,
        };
        tokio::spawn(reader.run());
        Ok(subscription)
    }

    /// [`check_topic`], the one publish and subscribe apply, naming the
    /// component (`redis` before it is connected).
    fn check_topic(&self, topic: &str) -> Result<(), PubSubError> {
        let label = self.connected.get().map_or("redis", |c| c.label.as_str());
        check_topic(label, topic)
    }
}

#[cfg(test)]
mod tests {
    use super::{check_topic, register, Permits};
    use rewire_runtime::{PubSubError, ECHO_LIMIT};
    use std::sync::Mutex;

    #[test]
    fn a_topic_holding_the_key_separator_is_refused_naming_component_and_topic() {
        for topic in [
            "lock||appA||order-1",
            "sequencer|||appA||k",
            "appA||k",
            "||",
        ] {
            let Err(PubSubError::Invalid(message)) = check_topic("pubsub/orders", topic) else {
                panic!("{topic} must be refused");
            };
            assert!(message.contains("pub/sub `pubsub/orders`"), "{message}");
            assert!(message.contains(&format!("topic `{topic}`")), "{message}");
            assert!(message.contains("can't contain `||`"), "{message}");
        }
        for topic in ["orders", "a|b", "|", "orders|", "sequencer|orders"] {
            assert_eq!(check_topic("pubsub/orders", topic), Ok(()), "{topic}");
        }
        assert!(matches!(
            check_topic("pubsub/orders", ""),
            Err(PubSubError::Invalid(message)) if message.contains("empty")
        ));
    }

    #[test]
    fn a_long_refused_topic_is_quoted_cut() {
        let topic = format!("a||{}", "x".repeat(10 * ECHO_LIMIT));
        let Err(PubSubError::Invalid(message)) = check_topic("pubsub/orders", &topic) else {
            panic!("must be refused");
        };
        assert!(message.len() < 2 * ECHO_LIMIT + 300, "{message}");
        assert!(message.contains('…'), "{message}");
    }

    #[test]
    fn the_permits_of_ended_subscriptions_are_dropped_as_others_subscribe() {
        let all = Mutex::new(Vec::new());
        let kept = Permits::new(1);
        register(&all, &kept);
        for _ in 0..100 {
            let ended = Permits::new(1);
            register(&all, &ended);
        }
        let len = all.lock().expect("lock").len();
        assert_eq!(len, 2, "the kept one and the last one");
    }
}
