//! The Lua scripts that make conditional writes atomic. Each key of the
//! state store is a hash with fields `data` and `version`; a lock is a
//! string key holding its owner.
//!
//! Scripts are sent with `EVALSHA`, and with `EVAL` of their source on a
//! `NOSCRIPT` reply (see [`super::lua_script`]), so a fresh server (after a
//! failover, or a swapped connection) just works.

use std::sync::LazyLock;

use super::lua_script::LuaScript;

/// Reply of [`SET`] and [`DELETE_IF_VERSION`] when the condition fails.
pub const MISMATCH: i64 = -1;

/// Lua shared by [`SET`] and [`TRANSACTION`]: whether a stored `version`
/// is one they can increment (`HINCRBY` takes digits without a leading
/// zero; the transaction counts it exactly in a Lua number, so below
/// 2^53 - 1), and the error refusing a write of a key whose version is
/// not, sent before anything is written (Redis does not roll back a
/// script's writes done before a command fails). The error names the key,
/// not the stored value.
macro_rules! version_check_lua {
    () => {
        r#"
local function countable(version)
  return (version == "0" or string.match(version, "^[1-9]%d*$") ~= nil)
    and #version <= 16 and tonumber(version) < 9007199254740991
end
local function invalid_version(key)
  return redis.error_reply("ERR the stored `version` of state key " .. key ..
    " is not a whole number this store can increment; nothing was written")
end
"#
    };
}

/// Writes a state key if its condition holds; replies with the new version,
/// or [`MISMATCH`].
///
/// `KEYS[1]`: the key. `ARGV[1]`: the expected version (`""`: none).
/// `ARGV[2]`: `"1"` for first-write (without a version, only a missing key
/// may be written). `ARGV[3]`: the data. `ARGV[4]`: TTL in milliseconds
/// (`> 0`: expire after it, `< 0`: never expire (clears an older TTL),
/// `0`: leave the key's TTL as it is).
///
/// A key that is not a hash (an old plain value) has no version: it is
/// replaced by an unconditional write and fails a conditional one. A
/// stored version that is not a whole number it can increment (`abc`,
/// `1.5`) fails the write with an error, nothing written.
pub static SET: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::new(concat!(
        version_check_lua!(),
        r#"
local version = redis.pcall("HGET", KEYS[1], "version")
if type(version) ~= "string" then version = false end
local exists = redis.call("EXISTS", KEYS[1]) == 1
if ARGV[1] ~= "" then
  if version ~= ARGV[1] then return -1 end
elseif ARGV[2] == "1" and exists then
  return -1
end
if version and not countable(version) then return invalid_version(KEYS[1]) end
if exists and not version then redis.call("DEL", KEYS[1]) end
redis.call("HSET", KEYS[1], "data", ARGV[3])
local new = redis.call("HINCRBY", KEYS[1], "version", 1)
local ttl = tonumber(ARGV[4])
if ttl > 0 then
  redis.call("PEXPIRE", KEYS[1], ttl)
elseif ttl < 0 then
  redis.call("PERSIST", KEYS[1])
end
return new
"#,
    ))
});

/// Deletes a state key if its version is `ARGV[1]`; replies `1`, `0` when
/// there is no such key (deleted already: success, as Dapr's
/// `delDefaultQuery`, so a retried delete whose first reply was lost is
/// not a conflict), or [`MISMATCH`] (another version, or a key without
/// one).
pub static DELETE_IF_VERSION: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::new(
        r#"
local version = redis.pcall("HGET", KEYS[1], "version")
if type(version) ~= "string" then
  if redis.call("EXISTS", KEYS[1]) == 0 then return 0 end
  return -1
end
if version ~= ARGV[1] then return -1 end
redis.call("DEL", KEYS[1])
return 1
"#,
    )
});

/// Reply of [`UNLOCK`]: released.
pub const UNLOCKED: i64 = 1;
/// Reply of [`UNLOCK`]: no such lock.
pub const NO_LOCK: i64 = 0;
/// Reply of [`UNLOCK`]: held by another owner, left as is.
pub const OTHER_OWNER: i64 = -1;

/// Releases lock `KEYS[1]` if `ARGV[1]` owns it; replies [`UNLOCKED`],
/// [`NO_LOCK`] or [`OTHER_OWNER`].
pub static UNLOCK: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::new(
        r#"
local owner = redis.call("GET", KEYS[1])
if not owner then return 0 end
if owner ~= ARGV[1] then return -1 end
redis.call("DEL", KEYS[1])
return 1
"#,
    )
});

/// Renews lock `KEYS[1]` to `ARGV[2]` milliseconds if `ARGV[1]` owns it;
/// replies as [`UNLOCK`] does ([`UNLOCKED`] meaning renewed).
pub static KEEP_ALIVE: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::new(
        r#"
local owner = redis.call("GET", KEYS[1])
if not owner then return 0 end
if owner ~= ARGV[1] then return -1 end
redis.call("PEXPIRE", KEYS[1], ARGV[2])
return 1
"#,
    )
});

/// Takes lock `KEYS[1]` for `ARGV[1]` for `ARGV[2]` milliseconds when
/// nobody holds it, or renews it when `ARGV[1]` does; replies [`UNLOCKED`]
/// (taken or renewed) or [`OTHER_OWNER`]. A keep-alive moving a lock to a
/// new namespace: a concurrent keep-alive of the same owner may have put
/// it there first.
pub static TAKE_OR_RENEW: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::new(
        r#"
local owner = redis.call("GET", KEYS[1])
if owner and owner ~= ARGV[1] then return -1 end
redis.call("SET", KEYS[1], ARGV[1], "PX", ARGV[2])
return 1
"#,
    )
});

/// A state transaction, all or none: every condition is checked first
/// against the versions the keys would have at that operation's turn (an
/// earlier operation of the same transaction may have written or deleted
/// the key), and only when all hold are the writes and deletes applied.
/// Replies `0`, or the (1-based) number of the first operation whose
/// condition fails; then nothing is changed. A delete with an etag of a
/// key that is missing at its turn holds (as [`DELETE_IF_VERSION`]).
///
/// A write of a key whose stored version (at its turn) is not a whole
/// number the script can increment fails the transaction with an error,
/// nothing written, as [`SET`] does.
///
/// `KEYS[i]`: the key of operation `i` (a key may repeat). Per operation,
/// five values of `ARGV`: `"s"` (write) or `"d"` (delete),
/// the expected version (`""`: none), `"1"` for first-write, the data, the
/// TTL in milliseconds (as for [`SET`]).
pub static TRANSACTION: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::new(concat!(
        version_check_lua!(),
        r#"
local versions, exists = {}, {}
for i = 1, #KEYS do
  local key, base = KEYS[i], (i - 1) * 5
  if versions[key] == nil then
    local v = redis.pcall("HGET", key, "version")
    if type(v) ~= "string" then v = false end
    versions[key] = v
    exists[key] = redis.call("EXISTS", key) == 1
  end
  local version, etag = versions[key], ARGV[base + 2]
  if etag ~= "" then
    local gone = ARGV[base + 1] == "d" and not exists[key]
    if version ~= etag and not gone then return i end
  elseif ARGV[base + 1] == "s" and ARGV[base + 3] == "1" and exists[key] then
    return i
  end
  if ARGV[base + 1] == "s" then
    if version and not countable(version) then return invalid_version(key) end
    versions[key] = string.format("%d", (version and tonumber(version) or 0) + 1)
    exists[key] = true
  else
    versions[key], exists[key] = false, false
  end
end
for i = 1, #KEYS do
  local key, base = KEYS[i], (i - 1) * 5
  if ARGV[base + 1] == "s" then
    local version = redis.pcall("HGET", key, "version")
    if redis.call("EXISTS", key) == 1 and type(version) ~= "string" then
      redis.call("DEL", key)
    end
    redis.call("HSET", key, "data", ARGV[base + 4])
    redis.call("HINCRBY", key, "version", 1)
    local ttl = tonumber(ARGV[base + 5])
    if ttl > 0 then
      redis.call("PEXPIRE", key, ttl)
    elseif ttl < 0 then
      redis.call("PERSIST", key)
    end
  else
    redis.call("DEL", key)
  end
end
return 0
"#,
    ))
});
