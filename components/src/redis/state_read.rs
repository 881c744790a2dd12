//! Reads of the `redis` state store. A key is a hash (`data`, `version`)
//! as Dapr writes it, read with `HMGET`. A key holding a plain string
//! (`SET key value`, by an older app or by hand) is read as Dapr's
//! `directGet` reads it after `HGETALL` failed: its value, with no etag
//! (an empty one). The `GET` is sent only once `HMGET` answered
//! `WRONGTYPE`, so a hash costs what it did: one round trip for a get, one
//! `MULTI`/`EXEC` for a bulk get. A key of another type (list, set…) is an
//! error naming it.

use std::collections::HashMap;

use redis::{RedisError, RedisResult, Value};
use rewire_runtime::{StateEntry, StateError};

use super::any_connection::slot_of;
use super::bounded::BoundedConnection;

/// The `data` and `version` fields of a state hash.
pub(super) type Fields = (Option<Vec<u8>>, Option<String>);

/// What a key held when it was read.
#[derive(Debug, PartialEq)]
pub(super) enum Stored {
    /// A state hash's `data` and `version` (both `None`: no such key).
    Hash(Fields),
    /// A plain string's value (`None`: no such key).
    Plain(Option<Vec<u8>>),
}

/// How many times at most one snapshot is read: again only when a key
/// that answered as a hash answers `WRONGTYPE` (a plain `SET` came in
/// between), so a racing writer cannot keep a read going.
const MAX_READS: usize = 3;

/// Whether `err` is Redis refusing a command for the key's type.
pub(super) fn is_wrong_type(err: &RedisError) -> bool {
    err.code() == Some("WRONGTYPE")
}

/// The error for `key` that answered `WRONGTYPE` to both `HMGET` and `GET`
/// (`detail`: the connection's description of Redis's answer).
pub(super) fn neither_hash_nor_string(key: &str, detail: &str) -> StateError {
    StateError::Backend(format!(
        "key `{key}` holds neither a state hash nor a string (another Redis type, such as a \
         list or a set, or it changed type while read): {detail}"
    ))
}

/// The entry of what a key held: a hash without `data` is a missing key,
/// one with `data` and no `version` an error; a plain string has an empty
/// etag (none), as in Dapr.
pub(super) fn entry(key: &str, stored: Stored) -> Result<Option<StateEntry>, StateError> {
    let (data, etag) = match stored {
        Stored::Plain(data) => match data {
            Some(data) => (data, String::new()),
            None => return Ok(None),
        },
        Stored::Hash((data, version)) => {
            let Some(data) = data else {
                return Ok(None);
            };
            let etag = version.ok_or_else(|| {
                StateError::Backend(format!(
                    "key `{key}` has no `version` field (not written by a Dapr-compatible store)"
                ))
            })?;
            (data, etag)
        }
    };
    Ok(Some(StateEntry {
        data,
        etag,
        metadata: HashMap::new(),
    }))
}

/// What every key of `keys` (full Redis keys) holds, in order: one
/// `MULTI`/`EXEC` on one server; on a cluster one per hash slot (a
/// transaction cannot span slots), sent concurrently. On a cluster, a
/// slot's read that fails (its master unreachable, slow past the
/// timeouts) is the error of each of its keys, as Dapr's bulk get answers
/// per item: the other slots' keys are still answered.
pub(super) async fn read_snapshots(
    conn: BoundedConnection,
    keys: Vec<String>,
) -> RedisResult<Vec<RedisResult<Stored>>> {
    let groups: Vec<Vec<usize>> = if conn.is_cluster() {
        let mut by_slot: HashMap<_, Vec<usize>> = HashMap::new();
        for (index, key) in keys.iter().enumerate() {
            by_slot.entry(slot_of(key)).or_default().push(index);
        }
        by_slot.into_values().collect()
    } else {
        vec![(0..keys.len()).collect()]
    };
    if let [_] = groups.as_slice() {
        return read_snapshot(conn, keys).await;
    }
    let mut reads = tokio::task::JoinSet::new();
    let mut groups_of_reads = HashMap::new();
    for group in groups {
        let group_keys = group.iter().map(|&index| keys[index].clone()).collect();
        let conn = conn.clone();
        let read = reads.spawn(read_snapshot(conn, group_keys));
        groups_of_reads.insert(read.id(), group);
    }
    let mut replies: Vec<Option<RedisResult<Stored>>> = keys.iter().map(|_| None).collect();
    while let Some(joined) = reads.join_next_with_id().await {
        let (id, read) = match joined {
            Ok((id, read)) => (id, read),
            Err(err) => (
                err.id(),
                Err(RedisError::from(std::io::Error::other(format!(
                    "a bulk read ended: {err}"
                )))),
            ),
        };
        let group = groups_of_reads.remove(&id).unwrap_or_default();
        match read {
            Ok(read) => {
                for (index, reply) in group.into_iter().zip(read) {
                    replies[index] = Some(reply);
                }
            }
            Err(err) => {
                for index in group {
                    replies[index] = Some(Err(err.clone()));
                }
            }
        }
    }
    Ok(replies
        .into_iter()
        .map(|reply| reply.unwrap_or_else(|| Err(no_reply())))
        .collect())
}

/// What `keys` hold, read in one `MULTI`/`EXEC`: an `HMGET` each, and
/// when some answered `WRONGTYPE`, the whole snapshot again with a `GET`
/// before their `HMGET` (so the answer stays one snapshot).
pub(super) async fn read_snapshot(
    conn: BoundedConnection,
    keys: Vec<String>,
) -> RedisResult<Vec<RedisResult<Stored>>> {
    let plain = vec![false; keys.len()];
    read_atomically(conn, &keys, plain).await
}

/// What `key` holds once its `HMGET` answered `WRONGTYPE`: a `GET` and an
/// `HMGET` in one `MULTI`/`EXEC` (a write may have made it a hash since).
pub(super) async fn read_not_hash(conn: BoundedConnection, key: String) -> RedisResult<Stored> {
    let keys = [key];
    let mut replies = read_atomically(conn, &keys, vec![true]).await?;
    replies.pop().unwrap_or_else(|| Err(no_reply()))
}

fn no_reply() -> RedisError {
    RedisError::from(std::io::Error::other("no reply for this key"))
}

/// One `MULTI`/`EXEC` over `keys`: an `HMGET` each, preceded by a `GET`
/// for those marked `plain`. Read again (at most [`MAX_READS`] times in
/// all) while a key not marked answers `WRONGTYPE`, marked then.
async fn read_atomically(
    mut conn: BoundedConnection,
    keys: &[String],
    mut plain: Vec<bool>,
) -> RedisResult<Vec<RedisResult<Stored>>> {
    let mut reads = 0;
    loop {
        reads += 1;
        let mut pipe = redis::pipe();
        pipe.atomic().ignore_errors();
        for (key, &plain) in keys.iter().zip(&plain) {
            if plain {
                pipe.cmd("GET").arg(key);
            }
            pipe.cmd("HMGET").arg(key).arg("data").arg("version");
        }
        let replies: Vec<RedisResult<Value>> = pipe.query_async(&mut conn).await?;
        let mut replies = replies.into_iter();
        let mut next = || replies.next().unwrap_or_else(|| Err(no_reply()));
        let mut stored = Vec::with_capacity(keys.len());
        let mut turned_plain = false;
        for plain in plain.iter_mut() {
            let get = if *plain { Some(next()) } else { None };
            let read = match (get, next()) {
                (Some(Ok(value)), _) => decode(value).map(Stored::Plain),
                (Some(Err(err)), fields) if is_wrong_type(&err) => fields.and_then(decode_hash),
                (Some(Err(err)), _) => Err(err),
                (None, Err(err)) if is_wrong_type(&err) => {
                    *plain = true;
                    turned_plain = true;
                    Err(err)
                }
                (None, fields) => fields.and_then(decode_hash),
            };
            stored.push(read);
        }
        if !turned_plain || reads >= MAX_READS {
            return Ok(stored);
        }
    }
}

fn decode<T: redis::FromRedisValue>(value: Value) -> RedisResult<T> {
    Ok(redis::from_redis_value(value)?)
}

fn decode_hash(value: Value) -> RedisResult<Stored> {
    decode(value).map(Stored::Hash)
}
