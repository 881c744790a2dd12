//! The `redis` sequencer, as Layotto's: `INCRBY` on the key
//! `{keyPrefix}sequencer|||{key}`, so ids from one server are unique and
//! increasing for every client of it.
//!
//! Switching servers (a new `redisHost`, in place or by a rebuild; a
//! failover) must not repeat ids: the new server's counter may be behind.
//! So each `INCRBY` runs in a script that first lifts the counter above a
//! floor, the largest id this sequencer handed out (see
//! [`crate::high_water`]); a reply from a connection that was swapped out
//! meanwhile, or below the floor, is dropped and the request asked again.
//! The floor belongs to the component, not the instance: a rebuilt
//! sequencer (on another server, or replacing another type) starts above
//! every id its predecessor handed out. With `highWaterFile`, the floor
//! also outlives the process.
//!
//! Ids are exact up to `i64::MAX`: the script compares and adds the
//! counter as Redis's own integer strings, never as Lua numbers.

use std::sync::{Arc, LazyLock};

use redis::Script;
use rewire_runtime::{
    Component, ComponentError, IdRange, InPlace, InPlaceUpdate, InitContext, Metadata,
    NextIdRequest, Readiness, SegmentRequest, Sequencer, SequencerError,
};
use tracing::debug;

use super::connection::RedisConnection;
use super::metadata::RedisMetadata;
use crate::high_water::{check_request, retry_floor, HighWater, Verdict, KEY_SEPARATOR};

/// How often a request is asked again before it fails (each retry follows
/// a server switch, or a reply that arrived after a later one).
const MAX_ATTEMPTS: usize = 16;

/// `KEYS[1]`: the counter. `ARGV[1]`: how many ids. `ARGV[2]`: the floor.
/// Lifts the counter to the floor if it is below, adds the size, and
/// replies with the counter as Redis keeps it (a string): the last id of
/// the range, above the floor. Lua numbers are doubles, exact only up to
/// 2^53, so the script never computes with the counter: it compares the
/// decimal strings (by length, then digits) and lets `INCRBY` add.
static NEXT_RANGE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local floor = ARGV[2]
local current = redis.call("GET", KEYS[1])
local below
if not current then
  below = true
else
  current = string.gsub(current, "^0+(%d)", "%1")
  if string.sub(current, 1, 1) == "-" then
    below = true
  elseif #current ~= #floor then
    below = #current < #floor
  else
    below = current < floor
  end
end
if below then
  redis.call("SET", KEYS[1], floor)
end
redis.call("INCRBY", KEYS[1], ARGV[1])
return redis.call("GET", KEYS[1])
"#,
    )
});

/// Refuses the sequencer's own fields on the state store and the lock.
pub(crate) fn refuse_sequencer_fields(metadata: &RedisMetadata) -> Result<(), ComponentError> {
    match metadata.sequencer_field_set() {
        Some(field) => Err(ComponentError::new(format!(
            "metadata field `{field}` belongs to the redis sequencer"
        ))),
        None => Ok(()),
    }
}

/// A sequencer on Redis.
#[derive(rewire_runtime::Component, Debug)]
#[component(
    kind = "sequencer",
    type = "redis",
    example = r#"{"redisHost": "127.0.0.1:6379", "redisPassword": "", "highWaterFile": "sequencer-marks.json"}"#
)]
pub struct RedisSequencer {
    #[metadata]
    connection: RedisConnection,
    marks: Option<Arc<HighWater>>,
}

impl RedisSequencer {
    /// A sequencer for `metadata`, not connected until `init`.
    pub fn new(metadata: RedisMetadata) -> Self {
        Self {
            connection: RedisConnection::new(metadata),
            marks: None,
        }
    }

    /// The metadata in force.
    pub fn metadata(&self) -> RedisMetadata {
        self.connection.session().metadata().clone()
    }

    async fn next_range(&self, key: &str, size: u32) -> Result<IdRange, SequencerError> {
        check_request(key, size)?;
        let marks = self
            .marks
            .as_ref()
            .ok_or_else(|| SequencerError::Backend("the sequencer is not initialised".into()))?;
        let mut floor = marks.floor(key).await?;
        for attempt in 0..MAX_ATTEMPTS {
            let session = self.connection.session();
            let mut conn = session
                .connection()
                .map_err(|err| SequencerError::Backend(err.to_string()))?;
            let counter = session.key(&format!("sequencer{KEY_SEPARATOR}{key}"));
            let reply: String = NEXT_RANGE
                .key(&counter)
                .arg(size)
                .arg(floor)
                .invoke_async(&mut conn)
                .await
                .map_err(|err| SequencerError::Backend(self.connection.describe(&session, &err)))?;
            let last: i64 = reply.parse().map_err(|_| {
                SequencerError::Backend(format!("counter `{counter}` replied {reply:?}"))
            })?;
            // The script lifts the counter above the floor (>= 0), so the
            // range starts above zero; anything else is not our counter.
            let from = last
                .checked_sub(i64::from(size) - 1)
                .filter(|from| *from > 0)
                .ok_or_else(|| {
                    SequencerError::Backend(format!("counter `{counter}` replied {last}"))
                })?;
            let range = IdRange { from, to: last };
            let current = || Arc::ptr_eq(&session, &self.connection.session());
            match marks.accept(key, range, &session, current).await? {
                Verdict::Accept => return Ok(range),
                Verdict::Retry { floor: above } => {
                    debug!(
                        key,
                        from = range.from,
                        floor = above,
                        "Sequencer reply dropped; asking again."
                    );
                    floor = retry_floor(above, attempt as u32 + 1);
                }
            }
        }
        Err(SequencerError::Backend(format!(
            "no id for `{key}` after {MAX_ATTEMPTS} attempts (the server kept changing)"
        )))
    }
}

#[rewire_runtime::prelude::async_trait]
impl Component for RedisSequencer {
    async fn init(&mut self, cx: &InitContext) -> Result<(), ComponentError> {
        let metadata = self.metadata();
        check_sequencer_metadata(&metadata)?;
        let file = metadata
            .high_water_file
            .as_ref()
            .map(|path| cx.resolve_path(path));
        let marks = HighWater::adopt(cx, file, &metadata.bigger_than)
            .await
            .map_err(|err| ComponentError::new(err.to_string()))?;
        self.marks = Some(Arc::new(marks));
        self.connection
            .init(&cx.key, cx.config_dir.as_deref())
            .await
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

fn check_sequencer_metadata(metadata: &RedisMetadata) -> Result<(), ComponentError> {
    match metadata.ttl_in_seconds {
        Some(_) => Err(ComponentError::new(
            "metadata field `ttlInSeconds` belongs to the redis state store; \
             sequencer counters never expire",
        )),
        None => Ok(()),
    }
}

/// Applied at once, not deferred: the new connection is built, checked and
/// swapped in by one awaited step, and `biggerThan` raises the marks in
/// Redis itself (ids only go up: seeing it early is harmless, and it is
/// never undone).
#[rewire_runtime::prelude::async_trait]
impl InPlaceUpdate for RedisSequencer {
    async fn update_in_place(&self, metadata: &Metadata) -> Result<InPlace, ComponentError> {
        let new = metadata
            .decode::<RedisMetadata>()
            .map_err(|err| ComponentError::new(format!("new metadata rejected: {err}")))?;
        check_sequencer_metadata(&new)?;
        let current = self.metadata();
        if new.high_water_file != current.high_water_file {
            // Another file: a fresh instance reads it.
            return Ok(InPlace::NeedsRebuild);
        }
        let applied = self.connection.apply(new.clone()).await?;
        if let Some(marks) = &self.marks {
            marks.raise(&new.bigger_than).await;
        }
        Ok(applied)
    }
}

#[rewire_runtime::prelude::async_trait]
impl Sequencer for RedisSequencer {
    async fn get_next_id(&self, req: NextIdRequest) -> Result<i64, SequencerError> {
        Ok(self.next_range(&req.key, 1).await?.from)
    }

    async fn get_segment(&self, req: SegmentRequest) -> Result<Option<IdRange>, SequencerError> {
        self.next_range(&req.key, req.size).await.map(Some)
    }
}
