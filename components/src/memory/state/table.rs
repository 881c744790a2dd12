//! The data of the memory state store: entries with etags and expiry, the
//! Dapr rules for conditional writes, and the bounds on what it holds (a
//! number of keys and a total of key and value bytes, kept as entries are
//! written, deleted and purged). Pure and synchronous; the caller passes
//! the current time.

use std::collections::{BTreeMap, HashMap};

use rewire_runtime::{Concurrency, StateEntry, StateError};
use tokio::time::Instant;

use super::ttl::{Expiry, TTL_EXPIRE_TIME_KEY};

/// One stored key.
#[derive(Debug, Clone)]
struct Entry {
    data: Vec<u8>,
    version: u64,
    expires_at: Option<Expiry>,
}

/// Default most keys a memory state store holds (`maxKeys`).
pub const DEFAULT_MAX_KEYS: u64 = 1_000_000;
/// Default most bytes of keys and values a memory state store holds
/// (`maxTotalSize`): 256 MiB.
pub const DEFAULT_MAX_TOTAL_SIZE: u64 = 256 << 20;

/// What a table may hold: a write that would take it past either bound
/// (and grows it) is refused; one that shrinks it or keeps it even passes,
/// so a lowered bound never blocks a delete or a smaller overwrite.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Bounds {
    /// Most keys (`maxKeys`).
    pub max_keys: u64,
    /// Most bytes of keys and values together (`maxTotalSize`).
    pub max_total_size: u64,
}

impl Default for Bounds {
    fn default() -> Self {
        Self {
            max_keys: DEFAULT_MAX_KEYS,
            max_total_size: DEFAULT_MAX_TOTAL_SIZE,
        }
    }
}

/// Keys, their versions, and an index of expiry times so expired entries
/// are dropped as soon as any operation sees they are due.
#[derive(Debug, Default)]
pub(crate) struct StateTable {
    entries: HashMap<String, Entry>,
    /// `(expires_at, version)` → key; versions are unique, so are the keys.
    expiries: BTreeMap<(Instant, u64), String>,
    /// The last version handed out; etags are these numbers as text.
    last_version: u64,
    /// Bytes of the keys and values held (see [`size_of`]).
    bytes: u64,
    /// The bounds writes are held to.
    bounds: Bounds,
}

/// The bytes an entry counts for: its key and its value.
pub(crate) fn size_of(key: &str, data: &[u8]) -> u64 {
    (key.len() as u64).saturating_add(data.len() as u64)
}

/// A conditional write: what the caller asserts about the stored key.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Condition<'a> {
    /// The etag the stored key must have (`None` or empty: no check).
    pub etag: Option<&'a str>,
    /// First-write: without an etag, only a missing key may be written.
    pub concurrency: Concurrency,
}

impl StateTable {
    /// Drops every entry whose expiry is `now` or earlier.
    pub(crate) fn purge_expired(&mut self, now: Instant) {
        while let Some(entry) = self.expiries.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let ((_, version), key) = entry.remove_entry();
            if self.entries.get(&key).is_some_and(|e| e.version == version) {
                if let Some(old) = self.entries.remove(&key) {
                    self.bytes -= size_of(&key, &old.data);
                }
            }
        }
    }

    /// The live entry of `key`; one with an expiry carries it as Dapr's
    /// in-memory store does: `ttlExpireTime`, RFC 3339 UTC.
    pub(crate) fn get(&mut self, key: &str, now: Instant) -> Option<StateEntry> {
        self.purge_expired(now);
        let entry = self.entries.get(key)?;
        let metadata = entry
            .expires_at
            .map(|expiry| HashMap::from([(TTL_EXPIRE_TIME_KEY.to_string(), expiry.rfc3339())]))
            .unwrap_or_default();
        Some(StateEntry {
            data: entry.data.clone(),
            etag: entry.version.to_string(),
            metadata,
        })
    }

    /// Sets the bounds later writes are held to (what is held stays).
    pub(crate) fn set_bounds(&mut self, bounds: Bounds) {
        self.bounds = bounds;
    }

    /// Writes `key` if `condition` holds and the table stays within its
    /// bounds; returns the new etag. Past a bound: a backend error naming
    /// it, nothing written.
    pub(crate) fn set(
        &mut self,
        key: &str,
        data: Vec<u8>,
        condition: Condition<'_>,
        expires_at: Option<Expiry>,
        now: Instant,
    ) -> Result<String, StateError> {
        self.purge_expired(now);
        self.check(key, condition)?;
        let old = self.entries.get(key).map(|e| size_of(key, &e.data));
        let keys = self.entries.len() as u64 + u64::from(old.is_none());
        let bytes = self.bytes - old.unwrap_or(0) + size_of(key, &data);
        self.check_bounds(keys, bytes, || {
            format!("key `{}` was not written", shown(key))
        })?;
        Ok(self.put(key, data, expires_at).to_string())
    }

    /// Writes `key`, unchecked (a transaction checked it); its version.
    pub(crate) fn put(&mut self, key: &str, data: Vec<u8>, expires_at: Option<Expiry>) -> u64 {
        self.last_version += 1;
        let version = self.last_version;
        self.bytes += size_of(key, &data);
        if let Some(old) = self.entries.insert(
            key.to_string(),
            Entry {
                data,
                version,
                expires_at,
            },
        ) {
            self.bytes -= size_of(key, &old.data);
            if let Some(old_expiry) = old.expires_at {
                self.expiries.remove(&(old_expiry.at, old.version));
            }
        }
        if let Some(expiry) = expires_at {
            self.expiries.insert((expiry.at, version), key.to_string());
        }
        version
    }

    /// Deletes `key` if `condition` holds (as Dapr's: first-write without
    /// an etag only "deletes" a missing key); a missing key without an etag
    /// is fine.
    pub(crate) fn delete(
        &mut self,
        key: &str,
        condition: Condition<'_>,
        now: Instant,
    ) -> Result<(), StateError> {
        self.purge_expired(now);
        self.check(key, condition)?;
        self.remove(key);
        Ok(())
    }

    /// Deletes `key`, unchecked (a transaction checked it).
    pub(crate) fn remove(&mut self, key: &str) {
        if let Some(old) = self.entries.remove(key) {
            self.bytes -= size_of(key, &old.data);
            if let Some(expiry) = old.expires_at {
                self.expiries.remove(&(expiry.at, old.version));
            }
        }
    }

    /// Refuses a change that would leave `keys` keys and `bytes` bytes
    /// when that grows the table past a bound; `what` tells what was not
    /// done.
    pub(crate) fn check_bounds(
        &self,
        keys: u64,
        bytes: u64,
        what: impl FnOnce() -> String,
    ) -> Result<(), StateError> {
        let Bounds {
            max_keys,
            max_total_size,
        } = self.bounds;
        let held = self.entries.len() as u64;
        if keys > max_keys && keys > held {
            return Err(StateError::Backend(format!(
                "holds {held} keys, its limit `maxKeys` is {max_keys}: {} \
                 (delete keys, let them expire, or raise `maxKeys`)",
                what()
            )));
        }
        if bytes > max_total_size && bytes > self.bytes {
            return Err(StateError::Backend(format!(
                "holds {} bytes of keys and values and would hold {bytes}, past its limit \
                 `maxTotalSize` of {max_total_size}: {} (delete keys, let them expire, or \
                 raise `maxTotalSize`)",
                self.bytes,
                what()
            )));
        }
        Ok(())
    }

    /// Number of live entries (after the last purge).
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Bytes of the keys and values held (after the last purge).
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The version and size of `key`, if it is held.
    pub(crate) fn held(&self, key: &str) -> Option<(u64, u64)> {
        self.entries
            .get(key)
            .map(|e| (e.version, size_of(key, &e.data)))
    }

    /// Number of pending expiries (for the leak test).
    #[cfg(test)]
    fn pending_expiries(&self) -> usize {
        self.expiries.len()
    }

    fn check(&self, key: &str, condition: Condition<'_>) -> Result<(), StateError> {
        check(key, self.version(key), condition)
    }

    /// The version of `key`, if it is held (expired entries count until
    /// the next purge).
    pub(crate) fn version(&self, key: &str) -> Option<u64> {
        self.entries.get(key).map(|e| e.version)
    }

    /// The last version handed out: the next write gets the one after it.
    pub(crate) fn last_version(&self) -> u64 {
        self.last_version
    }
}

/// `key` as an error shows it: at most 128 bytes of it.
pub(crate) fn shown(key: &str) -> String {
    const SHOWN: usize = 128;
    if key.len() <= SHOWN {
        return key.to_string();
    }
    let mut end = SHOWN;
    while !key.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes)", &key[..end], key.len())
}

/// Dapr's rule for a conditional write of `key`, whose stored version is
/// `stored`: the etag must be that version; first-write without an etag
/// only writes a missing key.
pub(crate) fn check(
    key: &str,
    stored: Option<u64>,
    condition: Condition<'_>,
) -> Result<(), StateError> {
    match condition.etag.filter(|etag| !etag.is_empty()) {
        Some(etag) => {
            let wanted: u64 = etag
                .trim()
                .parse()
                .map_err(|_| StateError::EtagInvalid(key.to_string()))?;
            if stored == Some(wanted) {
                Ok(())
            } else {
                Err(StateError::EtagMismatch(key.to_string()))
            }
        }
        None if condition.concurrency == Concurrency::FirstWrite && stored.is_some() => {
            Err(StateError::EtagMismatch(key.to_string()))
        }
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, SystemTime};

    fn expiry(at: Instant) -> Option<Expiry> {
        Some(Expiry {
            at,
            wall: SystemTime::UNIX_EPOCH + Duration::from_secs(86_400),
        })
    }

    fn last_write(etag: Option<&str>) -> Condition<'_> {
        Condition {
            etag,
            concurrency: Concurrency::LastWrite,
        }
    }

    fn first_write(etag: Option<&str>) -> Condition<'_> {
        Condition {
            etag,
            concurrency: Concurrency::FirstWrite,
        }
    }

    fn ok<T>(result: Result<T, StateError>) -> T {
        result.unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn etags_increase_and_guard_writes() {
        let now = Instant::now();
        let mut table = StateTable::default();
        let first = ok(table.set("k", b"1".to_vec(), last_write(None), None, now));
        let second = ok(table.set("k", b"2".to_vec(), last_write(Some(&first)), None, now));
        assert!(second.parse::<u64>().ok() > first.parse::<u64>().ok());
        assert_eq!(
            table.set("k", b"3".to_vec(), last_write(Some(&first)), None, now),
            Err(StateError::EtagMismatch("k".into()))
        );
        assert_eq!(
            table.set("k", b"3".to_vec(), last_write(Some("abc")), None, now),
            Err(StateError::EtagInvalid("k".into()))
        );
        assert_eq!(table.get("k", now).map(|e| e.data), Some(b"2".to_vec()));
    }

    #[test]
    fn etag_on_a_missing_key_is_a_mismatch() {
        let now = Instant::now();
        let mut table = StateTable::default();
        assert_eq!(
            table.set("k", vec![], last_write(Some("1")), None, now),
            Err(StateError::EtagMismatch("k".into()))
        );
        assert_eq!(
            table.delete("k", last_write(Some("1")), now),
            Err(StateError::EtagMismatch("k".into()))
        );
        assert_eq!(table.delete("k", last_write(None), now), Ok(()));
        assert_eq!(table.delete("k", last_write(Some("")), now), Ok(()));
    }

    #[test]
    fn first_write_without_etag_only_creates() {
        let now = Instant::now();
        let mut table = StateTable::default();
        let etag = ok(table.set("k", b"a".to_vec(), first_write(None), None, now));
        assert_eq!(
            table.set("k", b"b".to_vec(), first_write(None), None, now),
            Err(StateError::EtagMismatch("k".into()))
        );
        ok(table.set("k", b"c".to_vec(), first_write(Some(&etag)), None, now));
        assert_eq!(table.get("k", now).map(|e| e.data), Some(b"c".to_vec()));
    }

    #[test]
    fn first_write_delete_without_etag_only_on_a_missing_key() {
        let now = Instant::now();
        let mut table = StateTable::default();
        assert_eq!(table.delete("k", first_write(None), now), Ok(()));
        let etag = ok(table.set("k", b"a".to_vec(), last_write(None), None, now));
        assert_eq!(
            table.delete("k", first_write(None), now),
            Err(StateError::EtagMismatch("k".into()))
        );
        assert_eq!(table.get("k", now).map(|e| e.data), Some(b"a".to_vec()));
        ok(table.delete("k", first_write(Some(&etag)), now));
        assert_eq!(table.len(), 0);
    }

    #[test]
    fn a_recreated_key_gets_a_new_etag() {
        let now = Instant::now();
        let mut table = StateTable::default();
        let old = ok(table.set("k", vec![], last_write(None), None, now));
        ok(table.delete("k", last_write(Some(&old)), now));
        let new = ok(table.set("k", vec![], last_write(None), None, now));
        assert_ne!(old, new);
        assert_eq!(
            table.delete("k", last_write(Some(&old)), now),
            Err(StateError::EtagMismatch("k".into()))
        );
    }

    #[test]
    fn expired_entries_disappear_and_are_purged() {
        let now = Instant::now();
        let later = now + Duration::from_secs(10);
        let mut table = StateTable::default();
        for i in 0..100 {
            ok(table.set(
                &format!("k{i}"),
                vec![],
                last_write(None),
                expiry(now + Duration::from_secs(1)),
                now,
            ));
        }
        ok(table.set("keep", vec![], last_write(None), None, now));
        assert!(table.get("k1", now).is_some());
        assert!(table.get("k1", later).is_none());
        assert_eq!(table.len(), 1);
        assert_eq!(table.pending_expiries(), 0);
    }

    #[test]
    fn an_entry_with_an_expiry_reports_it_as_ttl_expire_time() {
        let now = Instant::now();
        let mut table = StateTable::default();
        ok(table.set(
            "k",
            vec![],
            last_write(None),
            expiry(now + Duration::from_secs(1)),
            now,
        ));
        ok(table.set("forever", vec![], last_write(None), None, now));
        let metadata = table.get("k", now).map(|e| e.metadata);
        let expected = HashMap::from([(
            "ttlExpireTime".to_string(),
            "1970-01-02T00:00:00Z".to_string(),
        )]);
        assert_eq!(metadata, Some(expected));
        let metadata = table.get("forever", now).map(|e| e.metadata);
        assert_eq!(metadata, Some(HashMap::new()));
    }

    #[test]
    fn the_byte_total_follows_writes_deletes_and_expiry() {
        let now = Instant::now();
        let mut table = StateTable::default();
        ok(table.set("a", vec![0; 10], last_write(None), None, now));
        ok(table.set(
            "bb",
            vec![0; 20],
            last_write(None),
            expiry(now + Duration::from_secs(1)),
            now,
        ));
        assert_eq!(table.bytes(), 11 + 22);
        ok(table.set("a", vec![0; 4], last_write(None), None, now));
        assert_eq!(table.bytes(), 5 + 22);
        ok(table.delete("a", last_write(None), now));
        assert_eq!(table.bytes(), 22);
        table.purge_expired(now + Duration::from_secs(2));
        assert_eq!((table.len(), table.bytes()), (0, 0));
    }

    #[test]
    fn a_write_past_a_bound_is_refused_and_changes_nothing() {
        let now = Instant::now();
        let mut table = StateTable::default();
        table.set_bounds(Bounds {
            max_keys: 2,
            max_total_size: 100,
        });
        ok(table.set("a", vec![1; 10], last_write(None), None, now));
        ok(table.set(
            "b",
            vec![2; 10],
            last_write(None),
            expiry(now + Duration::from_secs(1)),
            now,
        ));
        let refused = table.set("c", vec![], last_write(None), None, now);
        assert!(
            matches!(&refused, Err(StateError::Backend(m)) if m.contains("`maxKeys` is 2") && m.contains("`c`")),
            "{refused:?}"
        );
        // An overwrite does not add a key; a delete makes room.
        ok(table.set("a", vec![3; 10], last_write(None), None, now));
        let refused = table.set("a", vec![0; 99], last_write(None), None, now);
        assert!(
            matches!(&refused, Err(StateError::Backend(m)) if m.contains("`maxTotalSize` of 100")),
            "{refused:?}"
        );
        assert_eq!(table.get("a", now).map(|e| e.data), Some(vec![3; 10]));
        assert_eq!((table.len(), table.bytes()), (2, 22));
        // An expired entry frees its place before the bound is checked.
        let later = now + Duration::from_secs(2);
        ok(table.set("c", vec![], last_write(None), None, later));
        // A lowered bound keeps what is held; shrinking still passes.
        table.set_bounds(Bounds {
            max_keys: 1,
            max_total_size: 5,
        });
        assert_eq!(table.len(), 2);
        ok(table.set("a", vec![], last_write(None), None, later));
        assert!(table
            .set("d", vec![], last_write(None), None, later)
            .is_err());
        ok(table.delete("c", last_write(None), later));
        assert!(table
            .set("d", vec![], last_write(None), None, later)
            .is_err());
        ok(table.delete("a", last_write(None), later));
        ok(table.set("d", vec![], last_write(None), None, later));
    }

    #[test]
    fn long_keys_are_shown_cut() {
        assert_eq!(shown("k"), "k");
        let long = "é".repeat(100);
        let cut = shown(&long);
        assert!(cut.len() < 150 && cut.ends_with("(200 bytes)"), "{cut}");
    }

    #[test]
    fn overwriting_drops_the_old_expiry() {
        let now = Instant::now();
        let mut table = StateTable::default();
        ok(table.set(
            "k",
            vec![],
            last_write(None),
            expiry(now + Duration::from_secs(1)),
            now,
        ));
        ok(table.set("k", b"x".to_vec(), last_write(None), None, now));
        assert_eq!(table.pending_expiries(), 0);
        let later = now + Duration::from_secs(5);
        assert_eq!(table.get("k", later).map(|e| e.data), Some(b"x".to_vec()));
    }
}
