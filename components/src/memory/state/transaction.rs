//! Transactions of the memory state store: every operation is checked
//! against the versions the keys would have at its turn (a dry run), and
//! only when all pass are they applied, all under the table's one lock, so
//! no reader ever sees part of a transaction and a failed etag changes
//! nothing.

use std::collections::HashMap;

use rewire_runtime::{Concurrency, StateError, TransactionOperation};
use tokio::time::Instant;

use super::table::{check, size_of, Condition, StateTable};
use super::ttl::{self, Expiry};

/// An operation with its expiry worked out (before the lock is taken).
#[derive(Debug)]
pub(super) enum Prepared {
    /// Write `key`.
    Upsert {
        key: String,
        data: Vec<u8>,
        etag: Option<String>,
        concurrency: Concurrency,
        expires_at: Option<Expiry>,
    },
    /// Delete `key`.
    Delete {
        key: String,
        etag: Option<String>,
        concurrency: Concurrency,
    },
}

impl Prepared {
    fn key(&self) -> &str {
        match self {
            Self::Upsert { key, .. } | Self::Delete { key, .. } => key,
        }
    }

    fn condition(&self) -> Condition<'_> {
        match self {
            Self::Upsert {
                etag, concurrency, ..
            } => Condition {
                etag: etag.as_deref(),
                concurrency: *concurrency,
            },
            Self::Delete {
                etag, concurrency, ..
            } => Condition {
                etag: etag.as_deref(),
                concurrency: *concurrency,
            },
        }
    }
}

/// Checks keys and works out each write's expiry (`default_ttl` as the
/// store's `defaultTtlInSeconds`).
pub(super) fn prepare(
    operations: Vec<TransactionOperation>,
    default_ttl: i64,
    now: Instant,
) -> Result<Vec<Prepared>, StateError> {
    operations
        .into_iter()
        .map(|operation| {
            if operation.key().is_empty() {
                return Err(StateError::Invalid("the key is empty".into()));
            }
            Ok(match operation {
                TransactionOperation::Upsert(set) => {
                    let ttl = ttl::write_ttl(&set.key, set.ttl, &set.metadata, default_ttl)?;
                    let expires_at = ttl
                        .map(|ttl| Expiry::after(now, ttl))
                        .transpose()
                        .map_err(|m| StateError::Invalid(format!("key `{}`: {m}", set.key)))?;
                    Prepared::Upsert {
                        key: set.key,
                        data: set.value,
                        etag: set.etag,
                        concurrency: set.concurrency,
                        expires_at,
                    }
                }
                TransactionOperation::Delete(delete) => Prepared::Delete {
                    key: delete.key,
                    etag: delete.etag,
                    concurrency: delete.concurrency,
                },
            })
        })
        .collect()
}

/// Applies `operations` to `table` all or none (the caller holds the lock).
pub(super) fn apply(
    table: &mut StateTable,
    operations: Vec<Prepared>,
    now: Instant,
) -> Result<(), StateError> {
    table.purge_expired(now);
    dry_run(table, &operations)?;
    for operation in operations {
        match operation {
            Prepared::Upsert {
                key,
                data,
                expires_at,
                ..
            } => {
                table.put(&key, data, expires_at);
            }
            Prepared::Delete { key, .. } => table.remove(&key),
        }
    }
    Ok(())
}

/// Checks every operation against the version its key would have at its
/// turn: the stored one, or the one an earlier operation of the
/// transaction gave it; then the table's bounds against what it would
/// hold once all are applied (a transaction is seen whole, so one that
/// deletes as much as it adds passes at the limit).
fn dry_run(table: &StateTable, operations: &[Prepared]) -> Result<(), StateError> {
    // Per key touched: its `(version, size)` at this point, if held.
    let mut held: HashMap<&str, Option<(u64, u64)>> = HashMap::new();
    let mut next = table.last_version();
    let mut keys = table.len() as u64;
    let mut bytes = table.bytes();
    for operation in operations {
        let key = operation.key();
        let before = *held.entry(key).or_insert_with(|| table.held(key));
        check(
            key,
            before.map(|(version, _)| version),
            operation.condition(),
        )?;
        let after = match operation {
            Prepared::Upsert { data, .. } => {
                next += 1;
                Some((next, size_of(key, data)))
            }
            Prepared::Delete { .. } => None,
        };
        keys = keys + u64::from(after.is_some()) - u64::from(before.is_some());
        bytes = bytes + after.map_or(0, |(_, size)| size) - before.map_or(0, |(_, size)| size);
        held.insert(key, after);
    }
    table.check_bounds(keys, bytes, || "the transaction was not applied".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upsert(key: &str, value: &str, etag: Option<&str>) -> Prepared {
        Prepared::Upsert {
            key: key.into(),
            data: value.as_bytes().to_vec(),
            etag: etag.map(String::from),
            concurrency: Concurrency::LastWrite,
            expires_at: None,
        }
    }

    fn delete(key: &str, etag: Option<&str>, concurrency: Concurrency) -> Prepared {
        Prepared::Delete {
            key: key.into(),
            etag: etag.map(String::from),
            concurrency,
        }
    }

    fn value(table: &mut StateTable, key: &str) -> Option<Vec<u8>> {
        table.get(key, Instant::now()).map(|e| e.data)
    }

    #[test]
    fn a_stale_etag_fails_the_whole_transaction() {
        let now = Instant::now();
        let mut table = StateTable::default();
        apply(
            &mut table,
            vec![upsert("a", "1", None), upsert("b", "1", None)],
            now,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let a = table.get("a", now).map(|e| e.etag).unwrap_or_default();
        let refused = apply(
            &mut table,
            vec![upsert("a", "2", Some(&a)), upsert("b", "2", Some("999"))],
            now,
        );
        assert_eq!(refused, Err(StateError::EtagMismatch("b".into())));
        assert_eq!(value(&mut table, "a"), Some(b"1".to_vec()));
        assert_eq!(value(&mut table, "b"), Some(b"1".to_vec()));
    }

    #[test]
    fn later_operations_see_earlier_ones() {
        let now = Instant::now();
        let mut table = StateTable::default();
        // The write gives `k` the next version; the delete names it.
        let next = (table.last_version() + 1).to_string();
        let ops = vec![
            upsert("k", "1", None),
            delete("k", Some(&next), Concurrency::LastWrite),
            upsert("k", "again", None),
        ];
        apply(&mut table, ops, now).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(value(&mut table, "k"), Some(b"again".to_vec()));
        let stale = vec![
            delete("k", None, Concurrency::LastWrite),
            upsert("other", "x", None),
            delete("k", Some("1"), Concurrency::LastWrite),
        ];
        assert_eq!(
            apply(&mut table, stale, now),
            Err(StateError::EtagMismatch("k".into()))
        );
        assert_eq!(value(&mut table, "k"), Some(b"again".to_vec()));
        assert_eq!(value(&mut table, "other"), None);
    }

    #[test]
    fn a_first_write_delete_without_an_etag_fails_on_an_existing_key() {
        let now = Instant::now();
        let mut table = StateTable::default();
        apply(&mut table, vec![upsert("k", "1", None)], now).unwrap_or_else(|e| panic!("{e}"));
        let refused = apply(
            &mut table,
            vec![
                upsert("other", "x", None),
                delete("k", None, Concurrency::FirstWrite),
            ],
            now,
        );
        assert_eq!(refused, Err(StateError::EtagMismatch("k".into())));
        assert_eq!(value(&mut table, "k"), Some(b"1".to_vec()));
        assert_eq!(value(&mut table, "other"), None);
        // With the etag, or on a key the transaction deleted first, it passes.
        let etag = table.get("k", now).map(|e| e.etag);
        apply(
            &mut table,
            vec![
                delete("k", etag.as_deref(), Concurrency::FirstWrite),
                delete("k", None, Concurrency::FirstWrite),
            ],
            now,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(value(&mut table, "k"), None);
    }

    #[test]
    fn a_transaction_is_bounded_by_what_the_table_holds_after_it() {
        use super::super::table::Bounds;
        let now = Instant::now();
        let mut table = StateTable::default();
        table.set_bounds(Bounds {
            max_keys: 2,
            max_total_size: 1_000,
        });
        apply(
            &mut table,
            vec![upsert("a", "1", None), upsert("b", "1", None)],
            now,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let refused = apply(
            &mut table,
            vec![upsert("a", "2", None), upsert("c", "1", None)],
            now,
        );
        assert!(
            matches!(&refused, Err(StateError::Backend(m)) if m.contains("maxKeys") && m.contains("transaction")),
            "{refused:?}"
        );
        assert_eq!(value(&mut table, "a"), Some(b"1".to_vec()));
        assert_eq!(value(&mut table, "c"), None);
        // As many keys deleted as added: within the bound as a whole.
        apply(
            &mut table,
            vec![
                upsert("c", "1", None),
                delete("a", None, Concurrency::LastWrite),
            ],
            now,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((table.len(), table.bytes()), (2, 4));
        let big = "x".repeat(1_000);
        let refused = apply(&mut table, vec![upsert("b", &big, None)], now);
        assert!(
            matches!(&refused, Err(StateError::Backend(m)) if m.contains("maxTotalSize")),
            "{refused:?}"
        );
        assert_eq!((table.len(), table.bytes()), (2, 4));
    }
}
