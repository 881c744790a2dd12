//! What the readers of the `redis` pub/sub hold and have not settled:
//! per reader, the ids it read (awaiting their outcome, or a permit to be
//! handed on), and the readers of this process by consumer group, topic
//! and database, so a drain leaves alone what a peer on its server holds.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock, Weak};

/// The ids read and not yet settled (delivered and awaiting their outcome,
/// or read and waiting for a permit to be handed on), each with how many
/// of its deliveries await it (a reclaim may deliver again an id still
/// awaited), and the server they were read from.
pub(super) struct InFlight(
    tokio::sync::watch::Sender<HashMap<String, usize>>,
    Mutex<String>,
);

impl Default for InFlight {
    fn default() -> Self {
        Self(
            tokio::sync::watch::Sender::new(HashMap::new()),
            Mutex::default(),
        )
    }
}

/// The readers of this process by consumer group, topic and database: a
/// drain skips the entries any of them on its server awaits (they share
/// the consumer name; a new reader after a rebuild on the same server is
/// one of them).
type Peers = Mutex<HashMap<(String, String, u32), Vec<Weak<InFlight>>>>;

fn peers() -> &'static Peers {
    static PEERS: OnceLock<Peers> = OnceLock::new();
    PEERS.get_or_init(Peers::default)
}

/// Adds `reader` to the readers of `key`, dropping those that ended.
pub(super) fn join_peers(key: (String, String, u32), reader: &Arc<InFlight>) {
    let mut peers = peers()
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    peers.retain(|_, readers| {
        readers.retain(|reader| reader.strong_count() > 0);
        !readers.is_empty()
    });
    peers.entry(key).or_default().push(Arc::downgrade(reader));
}

/// The ids not yet settled at the readers of `key` on `server`.
pub(super) fn in_flight_at_peers(key: &(String, String, u32), server: &str) -> HashSet<String> {
    let readers: Vec<Arc<InFlight>> = peers()
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .get(key)
        .map(|readers| readers.iter().filter_map(Weak::upgrade).collect())
        .unwrap_or_default();
    readers
        .iter()
        .filter(|reader| reader.server() == server)
        .flat_map(|reader| reader.ids())
        .collect()
}

impl InFlight {
    pub(super) fn server(&self) -> String {
        self.1
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    pub(super) fn set_server(&self, server: &str) {
        server.clone_into(
            &mut self
                .1
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
    }

    pub(super) fn add(&self, id: &str) {
        self.0
            .send_modify(|ids| *ids.entry(id.to_string()).or_default() += 1);
    }

    /// One delivery of `id` settled.
    pub(super) fn settled(&self, id: &str) {
        self.0.send_modify(|ids| {
            if let Some(count) = ids.get_mut(id) {
                *count -= 1;
                if *count == 0 {
                    ids.remove(id);
                }
            }
        });
    }

    pub(super) fn ids(&self) -> HashSet<String> {
        self.0.borrow().keys().cloned().collect()
    }

    /// Until every delivery settled (whatever the permits are resized to
    /// meanwhile).
    pub(super) async fn all_settled(&self) {
        let mut changes = self.0.subscribe();
        let _ = changes.wait_for(HashMap::is_empty).await;
    }
}

/// The ids of a batch just read (`XREADGROUP`, or taken over by `XCLAIM`),
/// recorded as in flight at once: they wait for permits to be handed on,
/// pending for the consumer name every reader of the group shares, and a
/// drain at a peer must not deliver them too. Those never handed on (the
/// reader stopped first) are settled when the batch is dropped, so a
/// later drain or reclaim takes them.
pub(super) struct ReadBatch {
    in_flight: Arc<InFlight>,
    not_handed_on: Vec<String>,
}

impl ReadBatch {
    pub(super) fn record(in_flight: &Arc<InFlight>, ids: Vec<String>) -> Self {
        for id in &ids {
            in_flight.add(id);
        }
        Self {
            in_flight: in_flight.clone(),
            not_handed_on: ids,
        }
    }

    /// `id` was handed on: its delivery settles it.
    pub(super) fn handed_on(&mut self, id: &str) {
        if let Some(at) = self.not_handed_on.iter().position(|held| held == id) {
            self.not_handed_on.swap_remove(at);
        }
    }
}

impl Drop for ReadBatch {
    fn drop(&mut self) {
        for id in &self.not_handed_on {
            self.in_flight.settled(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{InFlight, ReadBatch};
    use std::time::Duration;

    #[tokio::test]
    async fn an_id_delivered_twice_is_in_flight_until_both_settle() {
        let in_flight = std::sync::Arc::new(InFlight::default());
        in_flight.add("1-0");
        in_flight.add("1-0");
        in_flight.add("2-0");
        in_flight.settled("1-0");
        assert!(in_flight.ids().contains("1-0"));
        in_flight.settled("2-0");
        let waiting = tokio::spawn({
            let in_flight = in_flight.clone();
            async move { in_flight.all_settled().await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "one delivery of 1-0 still awaits");
        in_flight.settled("1-0");
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("settled")
            .expect("joined");
        assert!(in_flight.ids().is_empty());
    }

    #[test]
    fn a_batch_dropped_settles_the_ids_it_never_handed_on() {
        let in_flight = std::sync::Arc::new(InFlight::default());
        in_flight.add("1-0");
        let mut batch =
            ReadBatch::record(&in_flight, vec!["1-0".into(), "2-0".into(), "3-0".into()]);
        batch.handed_on("2-0");
        assert_eq!(in_flight.ids().len(), 3, "all read are in flight at once");
        drop(batch);
        // 2-0 awaits its outcome; 1-0 another delivery of it; 3-0 is free.
        let mut left: Vec<String> = in_flight.ids().into_iter().collect();
        left.sort();
        assert_eq!(left, ["1-0", "2-0"]);
    }
}
