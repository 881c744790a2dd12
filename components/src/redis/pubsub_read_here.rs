//! Which pending entries of a consumer group this process read itself.
//!
//! Every replica of an app shares one consumer name (the group's, as
//! Dapr), so the group's pending list for that name mixes the entries this
//! process read (handed back `RETRY`, whose `XACK` failed, or read by a
//! reader that stopped before handing them on) with those other live
//! replicas are still working on. A drain delivers at once only the
//! former; the latter only once idle past `processingTimeout`, as any
//! reclaim (Dapr takes another process's entries only then).
//!
//! Kept per server, consumer group, topic and database, for the whole
//! process (a reader that stopped leaves its entries to a later drain),
//! at most [`MAX_REMEMBERED`] ids each: past that the oldest are
//! forgotten, and a drain takes them as another process's (delivered once
//! idle past `processingTimeout`).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, OnceLock};

/// How many ids are remembered per server, group, topic and database.
pub(super) const MAX_REMEMBERED: usize = 100_000;

/// Server, consumer group, topic and database.
pub(super) type ReadHereKey = (String, String, String, u32);

/// The ids read here and not yet acknowledged, oldest first, at most
/// `limit` of them.
#[derive(Debug)]
pub(super) struct ReadHere {
    limit: usize,
    ids: Mutex<Remembered>,
}

#[derive(Debug, Default)]
struct Remembered {
    /// The ids, as remembered.
    set: HashSet<String>,
    /// The order they were read in (may hold ids forgotten since, and an
    /// id twice; compacted when it grows past twice the limit).
    order: VecDeque<String>,
}

impl ReadHere {
    /// Remembers at most `limit` ids.
    pub(super) fn with_limit(limit: usize) -> Self {
        Self {
            limit: limit.max(1),
            ids: Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Remembered> {
        self.ids
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// `ids` were read (or taken over) here.
    pub(super) fn read<'a>(&self, ids: impl IntoIterator<Item = &'a str>) {
        let mut remembered = self.lock();
        for id in ids {
            if remembered.set.insert(id.to_string()) {
                remembered.order.push_back(id.to_string());
            }
        }
        while remembered.set.len() > self.limit {
            let Some(oldest) = remembered.order.pop_front() else {
                break;
            };
            remembered.set.remove(&oldest);
        }
        if remembered.order.len() > self.limit * 2 {
            let Remembered { set, order } = &mut *remembered;
            order.retain(|id| set.contains(id));
        }
    }

    /// `id` was acknowledged: nothing of it is pending any more.
    pub(super) fn acked(&self, id: &str) {
        self.lock().set.remove(id);
    }

    /// Whether `id` was read here and not acknowledged since.
    pub(super) fn contains(&self, id: &str) -> bool {
        self.lock().set.contains(id)
    }
}

type Registry = Mutex<HashMap<ReadHereKey, Arc<ReadHere>>>;

fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(Registry::default)
}

/// The ids this process read from `key` (server, group, topic, database)
/// and has not acknowledged.
pub(super) fn read_here(key: ReadHereKey) -> Arc<ReadHere> {
    registry()
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .entry(key)
        .or_insert_with(|| Arc::new(ReadHere::with_limit(MAX_REMEMBERED)))
        .clone()
}

/// The `XPENDING` start that follows stream id `id` (`<ms>-<seq>`): the
/// next id there can be, as an inclusive start (the exclusive `(id` needs
/// Redis 6.2). `None` when `id` is not a stream id or is the last there
/// can be.
pub(super) fn id_after(id: &str) -> Option<String> {
    let (ms, seq) = id.split_once('-')?;
    let (ms, seq): (u64, u64) = (ms.parse().ok()?, seq.parse().ok()?);
    match seq.checked_add(1) {
        Some(seq) => Some(format!("{ms}-{seq}")),
        None => Some(format!("{}-0", ms.checked_add(1)?)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acked_ids_are_forgotten_and_the_oldest_go_past_the_limit() {
        let read_here = ReadHere::with_limit(3);
        read_here.read(["1-0", "2-0"]);
        read_here.acked("1-0");
        assert!(!read_here.contains("1-0"));
        read_here.read(["3-0", "4-0", "5-0"]);
        assert!(!read_here.contains("2-0"), "past the limit: the oldest go");
        for id in ["3-0", "4-0", "5-0"] {
            assert!(read_here.contains(id), "{id}");
        }
        // Read and acknowledged over and over: the order kept stays small.
        for i in 0..100 {
            let id = format!("9-{i}");
            read_here.read([id.as_str()]);
            read_here.acked(&id);
        }
        assert!(read_here.lock().order.len() <= 6);
        assert!(read_here.contains("5-0"));
    }

    #[test]
    fn the_registry_is_per_server_group_topic_and_database() {
        let key = |server: &str| {
            (
                server.to_string(),
                "g".to_string(),
                "read-here-test".to_string(),
                0,
            )
        };
        read_here(key("a:1")).read(["1-0"]);
        assert!(read_here(key("a:1")).contains("1-0"));
        assert!(!read_here(key("b:1")).contains("1-0"));
    }

    #[test]
    fn the_id_after_is_an_inclusive_start() {
        assert_eq!(id_after("5-3").as_deref(), Some("5-4"));
        assert_eq!(id_after(&format!("5-{}", u64::MAX)).as_deref(), Some("6-0"));
        assert_eq!(id_after(&format!("{}-{}", u64::MAX, u64::MAX)), None);
        assert_eq!(id_after("nope"), None);
    }
}
