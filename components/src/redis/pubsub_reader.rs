//! One subscription of the `redis` pub/sub: reads its consumer group with
//! `XREADGROUP`, delivers, `XACK`s what is settled `SUCCESS` or `DROP`,
//! and delivers again entries pending longer than `processingTimeout`.
//!
//! Asked to drain (its broker was replaced), it closes the broker's
//! publish gate (waiting for `XADD`s under way), reads until the stream
//! has nothing new for the group, waits for the outcomes of what it
//! delivered (delivering again what is settled `RETRY`), then ends.

use std::sync::Arc;
use std::time::Duration;

use super::any_connection::AnyConnection;
use arc_swap::ArcSwap;
use redis::{RedisError, Value};
use rewire_runtime::{DeliveryOutcome, Message, SubscriptionFeed};
use tokio::sync::Semaphore;
use tracing::warn;

use super::metadata::ConnectionSettings;
use super::pubsub_connected::Connected;
use super::pubsub_metadata::Tunables;
use crate::backoff::Backoff;
use crate::pubsub::PublishGate;

/// How long one `XREADGROUP` blocks.
const BLOCK: Duration = Duration::from_millis(1000);
/// The settings of a reader's own connection: each reply may take `BLOCK`
/// longer than `readTimeout` + `writeTimeout`, so a blocking read is never
/// given up on by the client while the server may still answer it with
/// entries (they would wait `processingTimeout` in the pending list).
pub(super) fn reading_settings(settings: &ConnectionSettings) -> ConnectionSettings {
    let mut reading = settings.clone();
    reading.response = settings.response.map(|response| response + BLOCK);
    reading
}

/// How soon a message settled `RETRY` during a drain is delivered again.
const DRAIN_RETRY_AFTER: Duration = Duration::from_millis(200);

/// Creates consumer group `group` on `topic` at the start of the stream
/// (creating the stream too), unless it exists.
pub(super) async fn ensure_group(
    conn: &mut AnyConnection,
    topic: &str,
    group: &str,
) -> Result<(), RedisError> {
    let created: Result<Value, RedisError> = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(topic)
        .arg(group)
        .arg("0")
        .arg("MKSTREAM")
        .query_async(conn)
        .await;
    match created {
        Err(err) if err.code() == Some("BUSYGROUP") => Ok(()),
        other => other.map(|_| ()),
    }
}

pub(super) struct Reader {
    pub(super) connected: Connected,
    pub(super) reading: AnyConnection,
    pub(super) topic: String,
    pub(super) tunables: Arc<ArcSwap<Tunables>>,
    pub(super) gate: Arc<PublishGate>,
    pub(super) feed: SubscriptionFeed,
}

impl Reader {
    pub(super) async fn run(mut self) {
        let concurrency = self.tunables.load().concurrency;
        let in_flight = Arc::new(Semaphore::new(concurrency));
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
        let mut gate_closed = false;
        let mut last_reclaim = tokio::time::Instant::now();
        loop {
            if self.feed.is_stopped() || self.connected.shutdown.is_cancelled() {
                return;
            }
            if self.feed.is_draining() && !gate_closed {
                self.gate.close().await;
                gate_closed = true;
            }
            let tunables = **self.tunables.load();
            if let Some(every) = tunables.redeliver_interval {
                if last_reclaim.elapsed() >= every && !gate_closed {
                    last_reclaim = tokio::time::Instant::now();
                    if let Err(err) = self.reclaim(&in_flight, &tunables).await {
                        if self.group_recreated(&err).await {
                            continue;
                        }
                        warn!(component = %self.connected.label, topic = %self.topic, error = %self.connected.describe(&err), "Reclaiming pending entries failed.");
                    }
                }
            }
            let block = (!gate_closed).then_some(BLOCK);
            // Not cut short by a drain: a read cut after the server
            // answered would leave its entries pending, undelivered.
            let read = tokio::select! {
                read = read_group(&mut self.reading, &self.connected.group, &self.topic, tunables.queue_depth, block) => read,
                () = self.feed.stopped() => return,
                () = self.connected.shutdown.cancelled() => return,
            };
            let entries = match read {
                Ok(entries) => {
                    backoff.reset();
                    entries
                }
                Err(err) if self.group_recreated(&err).await => continue,
                Err(err) => {
                    let wait = backoff.next_wait();
                    warn!(component = %self.connected.label, topic = %self.topic, error = %self.connected.describe(&err), ?wait, "Reading the stream failed; retrying.");
                    tokio::time::sleep(wait).await;
                    continue;
                }
            };
            if entries.is_empty() && gate_closed {
                break;
            }
            for (id, data) in entries {
                let message = self.message(id, data);
                if !self.deliver(&in_flight, message).await {
                    return;
                }
            }
        }
        // Drained: wait for the outcomes of what was delivered.
        let all = u32::try_from(concurrency).unwrap_or(u32::MAX);
        tokio::select! {
            _ = in_flight.acquire_many(all) => {}
            () = self.feed.stopped() => {}
        }
    }

    /// When `err` says the consumer group is gone (`NOGROUP`: the server
    /// restarted without its data, or a replica without the group took
    /// over, while publishes re-create the stream), creates it again at the
    /// start of the stream, as Dapr does. True when it was re-created.
    async fn group_recreated(&mut self, err: &RedisError) -> bool {
        if err.code() != Some("NOGROUP") {
            return false;
        }
        match ensure_group(&mut self.reading, &self.topic, &self.connected.group).await {
            Ok(()) => {
                warn!(component = %self.connected.label, topic = %self.topic, group = %self.connected.group, "The consumer group was gone (server restarted without its data, or failed over); created it again.");
                true
            }
            Err(err) => {
                warn!(component = %self.connected.label, topic = %self.topic, error = %self.connected.describe(&err), "Creating the lost consumer group again failed.");
                false
            }
        }
    }

    /// Delivers again the entries pending longer than `processingTimeout`.
    async fn reclaim(
        &mut self,
        in_flight: &Arc<Semaphore>,
        tunables: &Tunables,
    ) -> Result<(), RedisError> {
        let idle = u64::try_from(tunables.processing_timeout.as_millis()).unwrap_or(u64::MAX);
        let reply: Value = redis::cmd("XAUTOCLAIM")
            .arg(&self.topic)
            .arg(&self.connected.group)
            .arg(&self.connected.group)
            .arg(idle)
            .arg("0-0")
            .arg("COUNT")
            .arg(tunables.queue_depth)
            .query_async(&mut self.reading)
            .await?;
        let claimed = match reply {
            Value::Array(mut parts) if parts.len() >= 2 => entries_of(parts.swap_remove(1)),
            _ => Vec::new(),
        };
        for (id, data) in claimed {
            let message = self.message(id, data);
            if !self.deliver(in_flight, message).await {
                break;
            }
        }
        Ok(())
    }

    fn message(&self, id: String, data: Vec<u8>) -> Message {
        Message {
            id,
            topic: self.topic.clone(),
            data,
            ..Message::default()
        }
    }

    /// Hands `message` on and settles it in the background. False when
    /// the subscription is gone.
    async fn deliver(&self, in_flight: &Arc<Semaphore>, message: Message) -> bool {
        let Ok(permit) = in_flight.clone().acquire_owned().await else {
            return false;
        };
        let feed = self.feed.clone();
        let connected = self.connected.clone();
        let topic = self.topic.clone();
        let Some(mut outcome) = feed.deliver(message.clone()).await else {
            return false;
        };
        tokio::spawn(async move {
            loop {
                match outcome.await.unwrap_or(DeliveryOutcome::Retry) {
                    DeliveryOutcome::Success | DeliveryOutcome::Drop => {
                        ack(&connected, &topic, &message.id).await;
                        break;
                    }
                    // Left pending: redelivered after `processingTimeout`,
                    // or now when draining (nobody will read this server
                    // again).
                    DeliveryOutcome::Retry if feed.is_draining() && !feed.is_stopped() => {
                        tokio::time::sleep(DRAIN_RETRY_AFTER).await;
                        match feed.deliver(message.clone()).await {
                            Some(next) => outcome = next,
                            None => break,
                        }
                    }
                    DeliveryOutcome::Retry => break,
                }
            }
            drop(permit);
        });
        true
    }
}

/// Up to `count` new entries for `group` on `topic` (`XREADGROUP`);
/// `block`: wait that long for one.
async fn read_group(
    conn: &mut AnyConnection,
    group: &str,
    topic: &str,
    count: usize,
    block: Option<Duration>,
) -> Result<Vec<(String, Vec<u8>)>, RedisError> {
    let mut cmd = redis::cmd("XREADGROUP");
    cmd.arg("GROUP")
        .arg(group)
        .arg(group)
        .arg("COUNT")
        .arg(count);
    if let Some(block) = block {
        cmd.arg("BLOCK")
            .arg(u64::try_from(block.as_millis()).unwrap_or(1000));
    }
    cmd.arg("STREAMS").arg(topic).arg(">");
    let reply: Value = cmd.query_async(conn).await?;
    // [[stream, [[id, [field, value, ...]], ...]], ...] or nil.
    let Value::Array(streams) = reply else {
        return Ok(Vec::new());
    };
    Ok(streams
        .into_iter()
        .filter_map(|stream| match stream {
            Value::Array(mut parts) if parts.len() == 2 => Some(entries_of(parts.swap_remove(1))),
            _ => None,
        })
        .flatten()
        .collect())
}

/// The `(id, data)` of stream entries `[[id, [field, value, ...]], ...]`
/// (deleted entries, `[id, nil]`, are skipped).
fn entries_of(entries: Value) -> Vec<(String, Vec<u8>)> {
    let Value::Array(entries) = entries else {
        return Vec::new();
    };
    entries
        .into_iter()
        .filter_map(|entry| {
            let Value::Array(mut parts) = entry else {
                return None;
            };
            if parts.len() != 2 {
                return None;
            }
            let Value::Array(fields) = parts.pop()? else {
                return None;
            };
            let id = text_of(parts.pop()?)?;
            let mut data = Vec::new();
            for pair in fields.chunks(2) {
                if let [name, value] = pair {
                    if text_of(name.clone()).as_deref() == Some("data") {
                        data = bytes_of(value.clone());
                    }
                }
            }
            Some((id, data))
        })
        .collect()
}

fn bytes_of(value: Value) -> Vec<u8> {
    match value {
        Value::BulkString(bytes) => bytes,
        Value::SimpleString(text) => text.into_bytes(),
        _ => Vec::new(),
    }
}

fn text_of(value: Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => String::from_utf8(bytes).ok(),
        Value::SimpleString(text) => Some(text),
        _ => None,
    }
}

async fn ack(connected: &Connected, topic: &str, id: &str) {
    let mut manager = connected.connection.clone();
    let acked: Result<i64, RedisError> = redis::cmd("XACK")
        .arg(topic)
        .arg(&connected.group)
        .arg(id)
        .query_async(&mut manager)
        .await;
    if let Err(err) = acked {
        warn!(component = %connected.label, topic, id, error = %connected.describe(&err), "XACK failed; the entry will be delivered again.");
    }
}
