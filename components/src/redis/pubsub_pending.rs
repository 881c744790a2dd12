//! Paging through a consumer group's pending list for a reclaim of the
//! `redis` pub/sub: pages going on from the next id (an inclusive start,
//! so servers before Redis 6.2 take it), and, on a server that refuses
//! `XPENDING … IDLE` (before 6.2), idle times compared here.

use redis::{RedisError, Value};

/// From a page of pending ids `all` (in order, asked for `page` of them):
/// those `keep` takes, at most `room`, and the `XPENDING` start to go on
/// from: after the last taken when cut at `room`, after the page when it
/// was full, `None` when it was not (the list was looked through). The
/// start is inclusive (the next id there can be: the exclusive `(id`
/// needs Redis 6.2).
pub(super) fn page_cut(
    all: &[String],
    keep: impl Fn(&str) -> bool,
    room: usize,
    page: usize,
) -> (Vec<String>, Option<String>) {
    let mut taken: Vec<String> = all.iter().filter(|id| keep(id)).cloned().collect();
    let next = if taken.len() > room {
        taken.truncate(room);
        taken.last().and_then(|id| id_after(id))
    } else if all.len() >= page {
        all.last().and_then(|id| id_after(id))
    } else {
        None
    };
    (taken, next)
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

/// Whether `err`, the answer to `XPENDING … IDLE`, says the server knows
/// no `IDLE` option (before Redis 6.2: a syntax error, or `IDLE` taken
/// for a stream id).
pub(super) fn refuses_xpending_idle(err: &RedisError) -> bool {
    let detail = err.detail().unwrap_or_default().to_ascii_lowercase();
    err.code() == Some("ERR")
        && [
            "syntax",
            "invalid stream id",
            "unknown option",
            "wrong number",
        ]
        .iter()
        .any(|said| detail.contains(said))
}

/// The ids and idle times (ms) of an `XPENDING` extended reply
/// (`[[id, consumer, idle, deliveries], ...]`).
pub(super) fn pending_idle_times(reply: Value) -> Vec<(String, u64)> {
    let Value::Array(pending) = reply else {
        return Vec::new();
    };
    pending
        .into_iter()
        .filter_map(|entry| match entry {
            Value::Array(fields) => {
                let mut fields = fields.into_iter();
                let id = fields.next().and_then(text_of)?;
                let idle = match fields.nth(1)? {
                    Value::Int(ms) => u64::try_from(ms).unwrap_or(0),
                    other => text_of(other)?.parse().ok()?,
                };
                Some((id, idle))
            }
            _ => None,
        })
        .collect()
}

/// The text of a Redis bulk or simple string reply.
pub(super) fn text_of(value: Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => String::from_utf8(bytes).ok(),
        Value::SimpleString(text) => Some(text),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_go_on_from_the_next_id_and_take_only_what_is_idle_enough() {
        let reply = Value::Array(
            [("1-0", 5_000), ("1-1", 10), ("2-0", 9_000), ("3-7", 20_000)]
                .map(|(id, idle)| {
                    Value::Array(vec![
                        Value::BulkString(id.as_bytes().to_vec()),
                        Value::BulkString(b"app".to_vec()),
                        Value::Int(idle),
                        Value::Int(1),
                    ])
                })
                .to_vec(),
        );
        let pending = pending_idle_times(reply);
        assert_eq!(pending[1], ("1-1".to_string(), 10));
        let all: Vec<String> = pending.iter().map(|(id, _)| id.clone()).collect();
        let idle_enough = |id: &str| pending.iter().any(|(p, ms)| p == id && *ms >= 1_000);
        // A full page: on after its last id, whatever was taken.
        let (taken, next) = page_cut(&all, idle_enough, 10, 4);
        assert_eq!(taken, ["1-0", "2-0", "3-7"]);
        assert_eq!(next.as_deref(), Some("3-8"));
        // Cut at `room`: on after the last taken.
        let (taken, next) = page_cut(&all, idle_enough, 1, 4);
        assert_eq!(taken, ["1-0"]);
        assert_eq!(next.as_deref(), Some("1-1"));
        // Not full: the list was looked through.
        let (taken, next) = page_cut(&all, idle_enough, 10, 5);
        assert_eq!(taken.len(), 3);
        assert_eq!(next, None);
        // None idle enough on a full page: on to the next.
        let (taken, next) = page_cut(&all[1..2], idle_enough, 10, 1);
        assert!(taken.is_empty());
        assert_eq!(next.as_deref(), Some("1-2"));
    }

    #[test]
    fn the_id_after_is_an_inclusive_start() {
        assert_eq!(id_after("5-3").as_deref(), Some("5-4"));
        assert_eq!(id_after(&format!("5-{}", u64::MAX)).as_deref(), Some("6-0"));
        assert_eq!(id_after(&format!("{}-{}", u64::MAX, u64::MAX)), None);
        assert_eq!(id_after("nope"), None);
    }
}
