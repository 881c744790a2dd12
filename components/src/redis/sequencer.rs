//! The `redis` sequencer, as Layotto's: `INCRBY` on the counter's key as
//! Layotto's `GetModifiedSeqKey` makes it (`sequencer|||{appId}||{key}`
//! by default; `keyPrefix` picks the strategy, see
//! [`layotto_key`]), so ids from one server are unique and
//! increasing for every client of it, Layotto's sidecars included.
//!
//! Counters of rewire's earlier layout (`{keyPrefix}sequencer|||{key}`,
//! `keyPrefix` literal) go on: the first request for a key on a server
//! (per process and connection) also reads the old key and lifts the
//! counter to at least its value — in the same script when both keys are
//! on one server; on a Redis Cluster, where they may be in different
//! slots, by a `GET` of the old key whose value joins the floor. Only
//! while the counter does not exist yet: other clients may write the old
//! key (a pub/sub topic `sequencer|||orders` is a stream there), so a
//! counter in use never follows it; a value there that is no counter is
//! taken as absent, with a warning.
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

use std::collections::HashSet;
use std::sync::{Arc, LazyLock, Weak};

use rewire_runtime::{
    Component, ComponentError, IdRange, InPlace, InPlaceUpdate, InitContext, Metadata,
    NextIdRequest, Readiness, SegmentRequest, Sequencer, SequencerError,
};
use tracing::{debug, warn};

use super::connection::{RedisConnection, Session};
use super::lua_script::LuaScript;
use super::metadata::{RedisMetadata, RedisType};
use crate::high_water::{
    check_key_prefix, check_request, layotto_key, old_rewire_key, retry_floor, HighWater, Verdict,
    MAX_KEYS,
};

/// How often a request is asked again before it fails (each retry follows
/// a server switch, or a reply that arrived after a later one).
const MAX_ATTEMPTS: usize = 16;

/// `KEYS[1]`: the counter. `KEYS[2]` (optional): the counter's key in
/// rewire's earlier layout, whose value (if any) joins the floor — read
/// only while the counter does not exist yet: other clients may write
/// that key (a pub/sub topic `sequencer|||orders` is a stream there), so
/// once the counter stands its ids never depend on it. An old key that is
/// no string (`WRONGTYPE`) or no number is taken as absent and named in
/// the reply (the sequencer warns). `ARGV[1]`: how many ids. `ARGV[2]`:
/// the floor. Lifts the counter to the floor if it is below, adds the
/// size, and replies `{"ok", counter}` with the counter as Redis keeps it
/// (a string): the last id of the range, above the floor; `{"exhausted",
/// ""}` when `INCRBY` would pass `i64::MAX`; a third element, when
/// present, says why the old key was ignored. Lua numbers are doubles,
/// exact only up to 2^53, so the script never computes with the counter:
/// it compares the decimal strings (by length, then digits) and lets
/// `INCRBY` add.
///
/// A counter holding a double (`1e+17`: an early script wrote lifts past
/// about 1e14 that way, and `INCRBY` refuses it for ever) is first set to
/// the integer [`lifted_double`] says, in either key, and one with
/// leading zeros (`007`, a hand edit `INCRBY` refuses) to its plain
/// digits; digits past `i64`
/// are no integer (`INCRBY` refuses them: an old key holding them is
/// ignored, as on a Redis Cluster); a counter (`KEYS[1]`)
/// that is no number at all is refused, saying what to do — by
/// `redis.error_reply` from the main chunk: before Redis 7.0 an `error()`
/// raised with a table in a function failed in the error handler, losing
/// the message.
static NEXT_RANGE: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::new(
        r#"
local function below(value, floor)
  if not value then
    return true
  end
  value = string.gsub(value, "^0+(%d)", "%1")
  if string.sub(value, 1, 1) == "-" then
    return true
  elseif #value ~= #floor then
    return #value < #floor
  end
  return value < floor
end
-- A double written by an older script (Lua's `%.14g`: 14 significant
-- digits, so the counter it stood for may be up to half a unit of the
-- 14th digit larger): its ceiling plus one such unit, as an integer
-- string; nil when not a finite number below 2^63.
local function lifted(text)
  local number = tonumber(text)
  if not number or number ~= number or number == math.huge or number == -math.huge then
    return nil
  end
  if number <= 0 then
    return "0"
  end
  -- The decimal exponent as printed (log10 may fall just short of it).
  local exponent = tonumber(string.match(string.format("%.13e", number), "e([-+]%d+)$"))
  local unit = 10 ^ (exponent - 13)
  local value = math.ceil(math.ceil(number) + unit)
  if value >= 9223372036854775807 then
    return nil
  end
  return string.format("%.0f", value)
end
-- Whether `digits` (a sign apart) fit a 64-bit integer, as INCRBY needs.
local function fits(digits, negative)
  digits = string.gsub(digits, "^0+(%d)", "%1")
  return not below(negative and "9223372036854775808" or "9223372036854775807", digits)
end
-- The counter as an integer string INCRBY takes (no leading zeros, no
-- `-0`: a hand edit such as `007` passes tonumber, not INCRBY), or nil and
-- why not.
local function integer(key, value)
  if not value then
    return value
  end
  local sign, digits = string.match(value, "^(%-?)(%d+)$")
  if digits and fits(digits, sign == "-") then
    digits = string.gsub(digits, "^0+(%d)", "%1")
    if digits == "0" then
      sign = ""
    end
    return sign .. digits
  end
  local lift = lifted(value)
  if not lift then
    return nil, "counter " .. key .. " holds " .. value .. ", not an integer below 2^63: "
      .. "SET it to an integer above every id handed out from it, or delete it and set biggerThan"
  end
  return lift
end
local floor = ARGV[2]
-- Why the old key was ignored (nil: it was not).
local ignored = nil
if KEYS[2] and redis.call("EXISTS", KEYS[1]) == 0 then
  local read = redis.pcall("GET", KEYS[2])
  if type(read) == "table" then
    ignored = "it is no string (" .. tostring(read.err) .. ")"
  elseif type(read) == "string" then
    local old, wrong = integer(KEYS[2], read)
    if wrong then
      ignored = "it holds " .. string.format("%q", string.sub(read, 1, 64))
        .. (#read > 64 and ("... (" .. #read .. " bytes)") or "") .. ", not a number"
    elseif old and not below(old, floor) then
      floor = (string.gsub(old, "^0+(%d)", "%1"))
    end
  end
end
local counter = redis.call("GET", KEYS[1])
local value, wrong = integer(KEYS[1], counter)
if wrong then
  return redis.error_reply(wrong)
end
if value ~= counter then
  -- Never left for Layotto's INCRBY, which refuses it.
  redis.call("SET", KEYS[1], value)
end
if below(value, floor) then
  redis.call("SET", KEYS[1], floor)
end
local added = redis.pcall("INCRBY", KEYS[1], ARGV[1])
if type(added) == "table" then
  if string.find(tostring(added.err), "overflow", 1, true) then
    return {"exhausted", "", ignored}
  end
  return redis.error_reply(tostring(added.err))
end
return {"ok", redis.call("GET", KEYS[1]), ignored}
"#,
    )
});

/// The value of a counter in the earlier layout, as the script reads it:
/// an integer (negative: 0), or a finite double an older script wrote,
/// [`lifted_double`]. `None`: not a number, or past `i64`.
fn old_counter_value(text: &str) -> Option<i64> {
    if let Ok(value) = text.parse::<i64>() {
        return Some(value.max(0));
    }
    lifted_double(text.parse::<f64>().ok()?)
}

/// A double an older script wrote as a counter (Lua's `%.14g`: 14
/// significant digits, so the counter it stood for may be up to half a
/// unit of the 14th digit larger): its ceiling plus one such unit, so no
/// id it counted is handed out again. Negative: 0. `None`: not finite,
/// or past `i64`.
fn lifted_double(number: f64) -> Option<i64> {
    if !number.is_finite() {
        return None;
    }
    if number <= 0.0 {
        return Some(0);
    }
    // The decimal exponent as printed (`log10` may fall just short of it).
    let printed = format!("{number:e}");
    let exponent: i32 = printed.rsplit('e').next()?.parse().ok()?;
    let unit = 10f64.powi(exponent - 13);
    let value = (number.ceil() + unit).ceil();
    // `i64::MAX as f64` rounds up to 2^63, itself out of range.
    (value < i64::MAX as f64).then_some(value as i64)
}

/// The value of counter `old` of the earlier layout, read on its own (a
/// Redis Cluster): `None` when absent, and when another client left
/// something there that is no counter (a stream of a pub/sub topic, text),
/// with a warning: only a counter lifts the floor, and nothing there fails
/// a request.
async fn read_old_counter(
    conn: &mut impl redis::aio::ConnectionLike,
    old: &str,
) -> Result<Option<i64>, redis::RedisError> {
    let read: redis::RedisResult<Option<Vec<u8>>> =
        redis::cmd("GET").arg(old).query_async(conn).await;
    let value = match read {
        Ok(None) => return Ok(None),
        Ok(Some(value)) => value,
        Err(err) if err.code() == Some("WRONGTYPE") => {
            warn_old_counter_ignored(old, "it is no string (WRONGTYPE)");
            return Ok(None);
        }
        Err(err) => return Err(err),
    };
    let text = String::from_utf8_lossy(&value);
    let parsed = old_counter_value(&text);
    if parsed.is_none() {
        let shown: String = text.chars().take(64).collect();
        let cut = if shown.len() < text.len() {
            format!("... ({} bytes)", value.len())
        } else {
            String::new()
        };
        warn_old_counter_ignored(old, &format!("it holds {shown:?}{cut}, not a number"));
    }
    Ok(parsed)
}

/// Warns that counter `old` of the earlier layout was taken as absent, and
/// `why`.
fn warn_old_counter_ignored(old: &str, why: &str) {
    warn!(
        key = old,
        why, "A key of the sequencer's earlier counter layout holds no counter (another client wrote it); it is taken as absent."
    );
}

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
    /// The app id and the component's name (for the `appid` and `name`
    /// key prefix strategies), set at `init`.
    names: (String, String),
    /// The keys whose counter in rewire's earlier layout was read on the
    /// session held (weakly): a new session (another server, or new
    /// metadata) reads them again.
    migrated: std::sync::Mutex<Migrated>,
}

/// Which keys were lifted above their counter in the earlier layout.
#[derive(Debug, Default)]
struct Migrated {
    session: Weak<Session>,
    keys: HashSet<String>,
}

impl Migrated {
    fn done(&self, session: &Arc<Session>, key: &str) -> bool {
        std::ptr::eq(self.session.as_ptr(), Arc::as_ptr(session)) && self.keys.contains(key)
    }

    fn record(&mut self, session: &Arc<Session>, key: &str) {
        if !std::ptr::eq(self.session.as_ptr(), Arc::as_ptr(session)) {
            self.session = Arc::downgrade(session);
            self.keys.clear();
        }
        if self.keys.len() >= MAX_KEYS {
            // Reading again is harmless (it only lifts): forget, not grow.
            self.keys.clear();
        }
        self.keys.insert(key.to_string());
    }
}

impl RedisSequencer {
    /// A sequencer for `metadata`, not connected until `init`.
    pub fn new(metadata: RedisMetadata) -> Self {
        Self {
            connection: RedisConnection::new(metadata),
            marks: None,
            names: Default::default(),
            migrated: Default::default(),
        }
    }

    /// The metadata in force.
    pub fn metadata(&self) -> RedisMetadata {
        self.connection.session().metadata().clone()
    }

    fn lock_migrated(&self) -> std::sync::MutexGuard<'_, Migrated> {
        self.migrated
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    async fn next_range(&self, key: &str, size: u32) -> Result<IdRange, SequencerError> {
        check_request(key, size)?;
        let marks = self
            .marks
            .as_ref()
            .ok_or_else(|| SequencerError::Backend("the sequencer is not initialised".into()))?;
        // Before INCRBY: a key refused afterwards would leave a counter.
        marks.has_room(key).await?;
        let mut floor = marks.floor(key).await?;
        for attempt in 0..MAX_ATTEMPTS {
            let session = self.connection.session();
            let mut conn = session
                .connection()
                .map_err(|err| SequencerError::Backend(err.to_string()))?;
            let metadata = session.metadata();
            let (app_id, component) = &self.names;
            let counter = layotto_key(&metadata.key_prefix, app_id, component, key);
            let old = old_rewire_key(&metadata.key_prefix, key);
            let migrate = old != counter && !self.lock_migrated().done(&session, key);
            let failed = |err: redis::RedisError| {
                SequencerError::Backend(self.connection.describe(&session, &err))
            };
            let mut invocation = NEXT_RANGE.key(&counter);
            if migrate && metadata.redis_type == RedisType::Cluster {
                // Maybe another slot than the counter's: read on its own,
                // and only while the counter does not exist (as the script).
                let exists: bool = redis::cmd("EXISTS")
                    .arg(&counter)
                    .query_async(&mut conn)
                    .await
                    .map_err(failed)?;
                if !exists {
                    if let Some(old_value) =
                        read_old_counter(&mut conn, &old).await.map_err(failed)?
                    {
                        floor = floor.max(old_value);
                    }
                }
            } else if migrate {
                invocation.key(&old);
            }
            // Bytes: the note on an old key quotes its start, maybe cut
            // inside a character, or not text at all.
            let reply: Vec<Vec<u8>> = invocation
                .arg(size)
                .arg(floor)
                .invoke_async(&mut conn)
                .await
                .map_err(failed)?;
            if migrate {
                self.lock_migrated().record(&session, key);
            }
            let (status, reply) = match reply.as_slice() {
                [status, value, ignored @ ..] => {
                    if let Some(why) = ignored.first() {
                        warn_old_counter_ignored(&old, &String::from_utf8_lossy(why));
                    }
                    (status.as_slice(), String::from_utf8_lossy(value))
                }
                _ => (&b""[..], Default::default()),
            };
            if status == b"exhausted" {
                return Err(SequencerError::Exhausted(key.to_string()));
            }
            let last: i64 = reply
                .parse()
                .ok()
                .filter(|_| status == b"ok")
                .ok_or_else(|| {
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
        self.names = (cx.app_id.clone(), cx.key.name.to_string());
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
    check_key_prefix(&metadata.key_prefix).map_err(ComponentError::new)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// `1e+17` may stand for any counter up to 1e17 + 5,000 (14 significant
    /// digits): lifted a whole unit (10,000) of the 14th digit past it.
    #[test]
    fn a_double_counter_is_lifted_past_what_it_may_stand_for() {
        assert_eq!(old_counter_value("1e+17"), Some(100_000_000_000_010_000));
        assert_eq!(
            old_counter_value("1.2345678901234e+15"),
            Some(1_234_567_890_123_500)
        );
        assert_eq!(old_counter_value("12"), Some(12));
        assert_eq!(old_counter_value("-3.5"), Some(0));
        assert_eq!(old_counter_value("1e+19"), None);
        assert_eq!(old_counter_value("inf"), None);
        assert_eq!(old_counter_value("abc"), None);
    }
}
