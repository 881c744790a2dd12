//! The data of the memory state store: entries with etags and expiry, and
//! the Dapr rules for conditional writes. Pure and synchronous; the caller
//! passes the current time.

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

/// Keys, their versions, and an index of expiry times so expired entries
/// are dropped as soon as any operation sees they are due.
#[derive(Debug, Default)]
pub(crate) struct StateTable {
    entries: HashMap<String, Entry>,
    /// `(expires_at, version)` → key; versions are unique, so are the keys.
    expiries: BTreeMap<(Instant, u64), String>,
    /// The last version handed out; etags are these numbers as text.
    last_version: u64,
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
                self.entries.remove(&key);
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

    /// Writes `key` if `condition` holds; returns the new etag.
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
        self.last_version += 1;
        let version = self.last_version;
        if let Some(old) = self.entries.insert(
            key.to_string(),
            Entry {
                data,
                version,
                expires_at,
            },
        ) {
            if let Some(old_expiry) = old.expires_at {
                self.expiries.remove(&(old_expiry.at, old.version));
            }
        }
        if let Some(expiry) = expires_at {
            self.expiries.insert((expiry.at, version), key.to_string());
        }
        Ok(version.to_string())
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
        if let Some(old) = self.entries.remove(key) {
            if let Some(expiry) = old.expires_at {
                self.expiries.remove(&(expiry.at, old.version));
            }
        }
        Ok(())
    }

    /// Number of live entries (after the last purge).
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
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
