//! The `redis` state store, with the data layout and semantics of Dapr's
//! `state.redis`: each key is a hash with fields `data` and `version`,
//! written by a Lua script that checks the etag (the version, as text),
//! honours first-write, bumps the version and sets the TTL atomically.

use std::collections::HashMap;
use std::time::Duration;

use redis::RedisResult;
use rewire_runtime::{
    BulkGetItem, Component, ComponentError, Concurrency, DeleteRequest, GetRequest, InPlace,
    InPlaceUpdate, InitContext, Metadata, Readiness, SetRequest, StateEntry, StateError,
    StateFeature, StateStore, TransactionRequest,
};
use tracing::debug;

use super::any_connection::slot_of;
use super::bounded::BoundedConnection;
use super::connection::{RedisConnection, Session};
use super::metadata::RedisMetadata;
use super::scripts;
use crate::time_limits::{check_ttl, check_ttl_seconds};

/// The request metadata key Dapr uses for a per-write TTL.
const TTL_METADATA_KEY: &str = "ttlInSeconds";

/// The bytes of a read's `HMGET … data version` besides the key.
const HMGET_FIXED_BYTES: usize = "HMGET".len() + "data".len() + "version".len();

/// A state store on Redis (standalone, its master found through Sentinel,
/// or a Redis Cluster), compatible with data written by Dapr's
/// `state.redis`.
///
/// Every metadata change applies in place: a change of server, password,
/// database or timeouts connects anew and swaps the connection once it
/// answers, so no request fails and a bad new server leaves the old one
/// serving.
#[derive(rewire_runtime::Component, Debug)]
#[component(
    kind = "state",
    type = "redis",
    example = r#"{"redisHost": "127.0.0.1:6379", "redisPassword": "", "redisDB": 0, "dialTimeout": "5s", "keyPrefix": ""}"#
)]
pub struct RedisStateStore {
    #[metadata]
    connection: RedisConnection,
}

impl RedisStateStore {
    /// A store for `metadata`, not connected until `init`.
    pub fn new(metadata: RedisMetadata) -> Self {
        Self {
            connection: RedisConnection::new(metadata),
        }
    }

    /// The metadata in force.
    pub fn metadata(&self) -> RedisMetadata {
        self.connection.session().metadata().clone()
    }

    /// The session in force and a connection of it.
    pub(super) fn session(
        &self,
    ) -> Result<(std::sync::Arc<Session>, BoundedConnection), StateError> {
        let session = self.connection.session();
        let conn = session
            .connection()
            .map_err(|err| StateError::Backend(err.to_string()))?;
        Ok((session, conn))
    }

    /// The component key, for errors.
    pub(super) fn label(&self) -> &str {
        self.connection.label()
    }

    /// A Redis failure of `session`, described without secrets.
    pub(super) fn backend_error(
        &self,
        session: &std::sync::Arc<Session>,
        err: &redis::RedisError,
    ) -> StateError {
        StateError::Backend(self.connection.describe(session, err))
    }
}

#[rewire_runtime::prelude::async_trait]
impl Component for RedisStateStore {
    async fn init(&mut self, cx: &InitContext) -> Result<(), ComponentError> {
        super::sequencer::refuse_sequencer_fields(self.connection.session().metadata())?;
        self.connection.init(&cx.key).await
    }

    async fn readiness(&self) -> Readiness {
        self.connection.readiness().await
    }

    async fn close(&self) -> Result<(), ComponentError> {
        self.connection.close();
        Ok(())
    }

    fn as_in_place(&self) -> Option<&dyn InPlaceUpdate> {
        Some(self)
    }
}

/// Applied at once, not deferred: the new connection is built, checked and
/// swapped in by one awaited step (the connection's `apply`); a rollback
/// re-applies the previous metadata, which swaps back.
#[rewire_runtime::prelude::async_trait]
impl InPlaceUpdate for RedisStateStore {
    async fn update_in_place(&self, metadata: &Metadata) -> Result<InPlace, ComponentError> {
        let new = metadata
            .decode::<RedisMetadata>()
            .map_err(|err| ComponentError::new(format!("new metadata rejected: {err}")))?;
        super::sequencer::refuse_sequencer_fields(&new)?;
        self.connection.apply(new).await
    }
}

#[rewire_runtime::prelude::async_trait]
impl StateStore for RedisStateStore {
    async fn get(&self, req: GetRequest) -> Result<Option<StateEntry>, StateError> {
        let (session, mut conn) = self.session()?;
        // Sized once: the command's buffers are not grown per argument.
        let key = session.key_arg(&req.key);
        let fields: Fields = redis::Cmd::with_capacity(4, HMGET_FIXED_BYTES + key.byte_len())
            .arg("HMGET")
            .arg(key)
            .arg("data")
            .arg("version")
            .query_async(&mut conn)
            .await
            .map_err(|err| StateError::Backend(self.connection.describe(&session, &err)))?;
        entry(&req.key, fields)
    }

    async fn set(&self, req: SetRequest) -> Result<(), StateError> {
        if req.key.is_empty() {
            return Err(StateError::Invalid("the key is empty".into()));
        }
        let (session, mut conn) = self.session()?;
        let etag = etag_arg(&req.key, req.etag.as_deref())?;
        let ttl_ms = ttl_arg(
            &req.key,
            req.ttl,
            &req.metadata,
            session.metadata().ttl_in_seconds,
        )?;
        let first_write = match (req.concurrency, etag.is_empty()) {
            (Concurrency::FirstWrite, true) => "1",
            _ => "0",
        };
        let version: i64 = scripts::SET
            .key(session.key(&req.key))
            .arg(&etag)
            .arg(first_write)
            .arg(&req.value)
            .arg(ttl_ms)
            .invoke_async(&mut conn)
            .await
            .map_err(|err| StateError::Backend(self.connection.describe(&session, &err)))?;
        if version == scripts::MISMATCH {
            return Err(StateError::EtagMismatch(req.key));
        }
        debug!(key = %req.key, etag = version, ttl_ms, "State written.");
        Ok(())
    }

    async fn delete(&self, req: DeleteRequest) -> Result<(), StateError> {
        let (session, mut conn) = self.session()?;
        let etag = etag_arg(&req.key, req.etag.as_deref())?;
        let key = session.key(&req.key);
        let outcome: RedisResult<i64> = if etag.is_empty() {
            redis::cmd("DEL").arg(&key).query_async(&mut conn).await
        } else {
            scripts::DELETE_IF_VERSION
                .key(&key)
                .arg(&etag)
                .invoke_async(&mut conn)
                .await
        };
        match outcome {
            Ok(scripts::MISMATCH) => Err(StateError::EtagMismatch(req.key)),
            Ok(_) => Ok(()),
            Err(err) => Err(StateError::Backend(
                self.connection.describe(&session, &err),
            )),
        }
    }

    /// An `HMGET` per key in one `MULTI`/`EXEC`, so the answer is one
    /// snapshot (never half of a transaction). On a Redis Cluster, one
    /// `MULTI`/`EXEC` per hash slot (sent concurrently): each slot is a
    /// snapshot, and a transaction, being in one slot, is seen whole or not
    /// at all.
    async fn bulk_get(&self, keys: Vec<String>) -> Result<Vec<BulkGetItem>, StateError> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let (session, conn) = self.session()?;
        let full_keys = keys.iter().map(|key| session.key(key)).collect();
        let replies = read_snapshots(conn, full_keys)
            .await
            .map_err(|err| StateError::Backend(self.connection.describe(&session, &err)))?;
        if replies.len() != keys.len() {
            return Err(StateError::Backend(format!(
                "redis answered {} replies for {} keys",
                replies.len(),
                keys.len()
            )));
        }
        Ok(keys
            .into_iter()
            .zip(replies)
            .map(|(key, reply)| {
                let found = reply
                    .map_err(|err| StateError::Backend(self.connection.describe(&session, &err)))
                    .and_then(|fields| entry(&key, fields));
                match found {
                    Ok(entry) => BulkGetItem {
                        key,
                        entry,
                        error: None,
                    },
                    Err(err) => BulkGetItem {
                        key,
                        entry: None,
                        error: Some(err.to_string()),
                    },
                }
            })
            .collect())
    }

    fn features(&self) -> Vec<StateFeature> {
        vec![
            StateFeature::Etag,
            StateFeature::Transactional,
            StateFeature::Ttl,
        ]
    }

    /// One Lua script: every etag checked, then every write, atomically.
    async fn transact(&self, req: TransactionRequest) -> Result<(), StateError> {
        super::state_transaction::execute(self, req).await
    }
}

/// The `data` and `version` fields of a state key.
type Fields = (Option<Vec<u8>>, Option<String>);

/// The fields of every key of `keys` (full Redis keys), in order: one
/// `MULTI`/`EXEC` of `HMGET`s on one server; on a cluster one per hash
/// slot (a transaction cannot span slots), sent concurrently.
async fn read_snapshots(
    conn: BoundedConnection,
    keys: Vec<String>,
) -> RedisResult<Vec<RedisResult<Fields>>> {
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
    for group in groups {
        let group_keys = group.iter().map(|&index| keys[index].clone()).collect();
        let conn = conn.clone();
        reads.spawn(async move { (group, read_snapshot(conn, group_keys).await) });
    }
    let mut replies: Vec<Option<RedisResult<Fields>>> = keys.iter().map(|_| None).collect();
    while let Some(joined) = reads.join_next().await {
        let (group, read) = joined.map_err(|err| {
            redis::RedisError::from(std::io::Error::other(format!("a bulk read ended: {err}")))
        })?;
        for (index, reply) in group.into_iter().zip(read?) {
            replies[index] = Some(reply);
        }
    }
    Ok(replies
        .into_iter()
        .map(|reply| {
            reply.unwrap_or_else(|| {
                Err(redis::RedisError::from(std::io::Error::other(
                    "no reply for this key",
                )))
            })
        })
        .collect())
}

/// The fields of `keys`, one `HMGET` each in one `MULTI`/`EXEC`.
async fn read_snapshot(
    mut conn: BoundedConnection,
    keys: Vec<String>,
) -> RedisResult<Vec<RedisResult<Fields>>> {
    let mut pipe = redis::pipe();
    pipe.atomic().ignore_errors();
    for key in &keys {
        pipe.cmd("HMGET").arg(key).arg("data").arg("version");
    }
    pipe.query_async(&mut conn).await
}

/// The entry of a hash's `data` and `version`; a hash without `data` is a
/// missing key.
fn entry(key: &str, (data, version): Fields) -> Result<Option<StateEntry>, StateError> {
    let Some(data) = data else {
        return Ok(None);
    };
    let etag = version.ok_or_else(|| {
        StateError::Backend(format!(
            "key `{key}` has no `version` field (not written by a Dapr-compatible store)"
        ))
    })?;
    Ok(Some(StateEntry {
        data,
        etag,
        metadata: HashMap::new(),
    }))
}

/// The etag as the script compares it: the version number in canonical
/// text, or `""` for none.
pub(super) fn etag_arg(key: &str, etag: Option<&str>) -> Result<String, StateError> {
    match etag.map(str::trim).filter(|e| !e.is_empty()) {
        None => Ok(String::new()),
        Some(etag) => etag
            .parse::<u64>()
            .map(|v| v.to_string())
            .map_err(|_| StateError::EtagInvalid(key.to_string())),
    }
}

/// The TTL argument of the set script, in milliseconds: `> 0` expire,
/// `< 0` never expire (clear an older TTL), `0` leave the TTL alone.
///
/// The first of these that is set decides: the request's `ttl` (zero:
/// never expire), its `ttlInSeconds` metadata, the store's `ttlInSeconds`
/// (for both, zero or negative, like Dapr's `-1`: never expire). Each is
/// at most [`MAX_TTL_SECONDS`](crate::time_limits::MAX_TTL_SECONDS).
pub(super) fn ttl_arg(
    key: &str,
    ttl: Option<Duration>,
    metadata: &HashMap<String, String>,
    default_ttl_in_seconds: Option<i64>,
) -> Result<i64, StateError> {
    let invalid = |message: String| StateError::Invalid(format!("key `{key}`: {message}"));
    if let Some(ttl) = ttl {
        let ttl = check_ttl("ttl", ttl).map_err(invalid)?;
        // At most MAX_TTL: the milliseconds fit in an i64.
        return Ok(match ttl.as_millis() {
            0 => -1,
            ms => i64::try_from(ms).unwrap_or(i64::MAX),
        });
    }
    let requested = metadata
        .get(TTL_METADATA_KEY)
        .map(|t| t.trim())
        .filter(|t| !t.is_empty());
    let seconds = match requested {
        Some(text) => Some(text.parse::<i64>().map_err(|_| {
            StateError::Invalid(format!(
                "metadata `{TTL_METADATA_KEY}` of key `{key}` is not a whole number of seconds: `{text}`"
            ))
        })?),
        None => default_ttl_in_seconds,
    };
    let seconds = seconds
        .map(|s| check_ttl_seconds(TTL_METADATA_KEY, s).map_err(invalid))
        .transpose()?;
    Ok(match seconds {
        None => 0,
        Some(s) if s <= 0 => -1,
        Some(s) => s.saturating_mul(1000),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(ttl: &str) -> HashMap<String, String> {
        HashMap::from([(TTL_METADATA_KEY.to_string(), ttl.to_string())])
    }

    #[test]
    fn ttl_argument() {
        let none = HashMap::new();
        assert_eq!(
            ttl_arg("k", Some(Duration::from_millis(1500)), &meta("9"), Some(7)),
            Ok(1500)
        );
        assert_eq!(ttl_arg("k", Some(Duration::ZERO), &none, None), Ok(-1));
        assert_eq!(ttl_arg("k", None, &meta("9"), Some(7)), Ok(9000));
        assert_eq!(ttl_arg("k", None, &meta("-1"), Some(7)), Ok(-1));
        assert_eq!(ttl_arg("k", None, &none, Some(7)), Ok(7000));
        assert_eq!(ttl_arg("k", None, &none, Some(-1)), Ok(-1));
        assert_eq!(ttl_arg("k", None, &none, None), Ok(0));
        assert!(matches!(
            ttl_arg("k", None, &meta("soon"), None),
            Err(StateError::Invalid(m)) if m.contains("ttlInSeconds")
        ));
        for (ttl, meta) in [
            (Some(Duration::MAX), none.clone()),
            (None, meta(&i64::MAX.to_string())),
        ] {
            let err = ttl_arg("k", ttl, &meta, None);
            assert!(
                matches!(&err, Err(StateError::Invalid(m)) if m.contains("2147483647")),
                "{err:?}"
            );
        }
    }

    #[test]
    fn etags_are_canonical_versions() {
        assert_eq!(etag_arg("k", None), Ok(String::new()));
        assert_eq!(etag_arg("k", Some(" ")), Ok(String::new()));
        assert_eq!(etag_arg("k", Some("007")), Ok("7".into()));
        assert_eq!(
            etag_arg("k", Some("x1")),
            Err(StateError::EtagInvalid("k".into()))
        );
    }
}
