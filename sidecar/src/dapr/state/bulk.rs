//! How a bulk state get reads its distinct keys: in chunks (16 keys, one
//! store bulk read each; with request metadata one key, one get each),
//! the first chunk alone, then several at once within the client's
//! `parallelism` and what the response budget leaves room for.
//!
//! A chunk in flight is counted as its keys times the largest single item
//! answered so far, at least [`KEY_ESTIMATE_FLOOR`] (64 KiB) a key: a
//! first chunk of missing keys or empty values says nothing of the values
//! to come. So at most `limit / 64 KiB` keys are in flight beyond the one
//! chunk that may always start alone (64 keys, 4 chunks or 64 gets, at the
//! default `max_response_bytes` of 4 MiB), and what a bulk refused for its
//! size reads past the limit is, at worst, those keys' values: bounded by
//! the limit while no value is larger than 64 KiB or than the largest
//! answered before it; larger values may overshoot by `limit / 64 KiB`
//! values, those then in flight.
//!
//! A chunk failing as a whole ends the read at once: the chunks in flight
//! are dropped (an erring store may then be blamed for those in flight
//! past the dropped-call grace, which is fair). A read over its budget
//! (the store answering, healthy) lets the chunks in flight finish, their
//! answers dropped as they come, the answers held freed first. A chunk a
//! half-open circuit breaker refuses (every trial place taken by its
//! siblings) while others are in flight waits for one of them to finish
//! and is started again; refused with none in flight, it fails the bulk
//! (with request metadata: that key's error).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};

use futures_util::stream::{FuturesUnordered, StreamExt};
use rewire_runtime::{BulkGetItem, GetRequest, StateError};

use super::{item_bytes, StateOpError, StateOps};
use crate::dapr::budget::ResponseBudget;
use crate::dapr::retry_rule;

/// Keys read from the store in one bulk read (one chunk) when the bulk
/// carries no request metadata: the answer is counted as each chunk comes
/// back, so a bulk of large values stops near the limit instead of being
/// read whole first.
const BULK_CHUNK: usize = 16;

/// Gets a bulk runs at once when the client gives no `parallelism` (or
/// zero or less): daprd's limiter default (`concurrency.DefaultLimit`,
/// 100; newer daprd reads zero or less as no limit at all). Without
/// request metadata, as many keys in chunks of 16: 7 chunks at once.
const DEFAULT_BULK_PARALLELISM: usize = 100;

/// Most gets a bulk runs at once, whatever `parallelism` the client asks
/// (16 chunks of 16 keys without request metadata).
const MAX_BULK_PARALLELISM: usize = 256;

/// Bytes a key in flight is counted as, at least, whatever the items
/// answered before were (missing keys and empty values tell nothing of
/// the values to come): at most `limit / 64 KiB` keys are in flight.
const KEY_ESTIMATE_FLOOR: usize = 64 * 1024;

/// How a bulk get is cut and how much of it runs at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Pace {
    /// Keys in one chunk (one store call).
    keys_per_chunk: usize,
    /// Most chunks in flight at once.
    most_in_flight: usize,
}

/// The pace of a bulk for Dapr's `parallelism`, which counts gets (zero
/// or less: [`DEFAULT_BULK_PARALLELISM`]; at most [`MAX_BULK_PARALLELISM`]):
/// with request metadata each key is its own get, `parallelism` of them at
/// once; without, keys go in chunks of [`BULK_CHUNK`] (one store bulk read
/// each), `ceil(parallelism / 16)` chunks at once.
pub(super) fn pace(parallelism: i64, with_metadata: bool) -> Pace {
    let gets = match usize::try_from(parallelism) {
        Ok(0) | Err(_) => DEFAULT_BULK_PARALLELISM,
        Ok(asked) => asked.min(MAX_BULK_PARALLELISM),
    };
    if with_metadata {
        Pace {
            keys_per_chunk: 1,
            most_in_flight: gets,
        }
    } else {
        Pace {
            keys_per_chunk: BULK_CHUNK,
            most_in_flight: gets.div_ceil(BULK_CHUNK),
        }
    }
}

/// What is in flight of a bulk read: chunks and their keys.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct InFlight {
    /// Chunks being read.
    chunks: usize,
    /// Their keys, all together.
    keys: usize,
}

/// Whether a bulk read may start a chunk of `next_keys` keys, `in_flight`
/// being read now, `held` bytes of answers kept, the largest single item
/// answered so far `largest_item` bytes (`None` before the first answer).
///
/// * With none in flight, always (the read goes on one chunk at a time).
/// * Before the first answer, no other: the first chunk is read alone.
///   Its outcome alone judges a half-open circuit breaker's trial (with
///   Dapr's default `maxRequests: 1`, a sibling would be refused), and
///   it gives the first item sizes.
/// * Else only within `most_in_flight`, and while `held` plus every key
///   in flight, this chunk's too, each counted as the largest item so far
///   but at least [`KEY_ESTIMATE_FLOOR`], stays within `limit`.
fn may_start(
    pace: Pace,
    limit: usize,
    held: usize,
    in_flight: InFlight,
    next_keys: usize,
    largest_item: Option<usize>,
) -> bool {
    if in_flight.chunks == 0 {
        return true;
    }
    let Some(largest_item) = largest_item else {
        return false;
    };
    let per_key = largest_item.max(KEY_ESTIMATE_FLOOR);
    in_flight.chunks < pace.most_in_flight
        && (in_flight.keys.saturating_add(next_keys))
            .checked_mul(per_key)
            .and_then(|estimate| estimate.checked_add(held))
            .is_some_and(|total| total <= limit)
}

/// How one chunk's read ended.
struct ChunkRead {
    /// Its items (with request metadata, a failed get is its key's error),
    /// or the chunk's failure as a whole.
    answer: Result<Vec<BulkGetItem>, StateOpError>,
    /// Whether the circuit breaker refused it before the store was asked
    /// (with request metadata, its one get).
    refused: bool,
}

impl StateOps<'_> {
    /// Reads every key of `distinct` (no repeats), each item at its key's
    /// index, `slot_of` (`None`: the store answered nothing for it), paced by
    /// `parallelism` ([`pace`]) and `limit` ([`may_start`]); the answers
    /// are counted as each chunk comes back.
    ///
    /// * A chunk failing as a whole ends the read at once, the chunks in
    ///   flight dropped: the store erred, and an answer now is worth more
    ///   than sparing it the blame for calls in flight past the dropped-call
    ///   grace.
    /// * A chunk over `limit` ends it too, the answers held freed, no chunk
    ///   started; those in flight are let finish, their answers dropped as
    ///   they come: dropped unfinished, a call in flight for its blame bound
    ///   (`DROPPED_CALL_GRACE`, 5 s, or the timeout policy's) would count as
    ///   the store's failure, so a client's oversize bulk on a slow but
    ///   healthy store would open its circuit breaker. What is waited for is
    ///   bounded by [`may_start`] in bytes and by the request's own deadline
    ///   in time (which drops the whole read).
    /// * A chunk the circuit breaker refuses (half-open, every trial place
    ///   taken) while others are in flight is put back and started again
    ///   once one in flight has finished (no chunk starts before), once at
    ///   most; refused again, or with none in flight, it is the chunk's
    ///   failure (with request metadata, its key's error). With the breaker
    ///   open and a chunk hanging in flight, a refused chunk waits for it
    ///   (at worst until the request's deadline).
    pub(super) async fn read_distinct(
        &self,
        distinct: &[&str],
        slot_of: &HashMap<&str, usize>,
        metadata: &HashMap<String, String>,
        parallelism: i64,
        limit: usize,
    ) -> Result<Vec<Option<BulkGetItem>>, StateOpError> {
        let pace = pace(parallelism, !metadata.is_empty());
        let mut read: Vec<Option<BulkGetItem>> = vec![None; distinct.len()];
        // What is held, checked against `limit` (the error), and in bytes
        // (the pace).
        let mut budget = ResponseBudget::new(limit);
        let mut held = 0usize;
        let mut largest_item: Option<usize> = None;
        let mut chunks = distinct.chunks(pace.keys_per_chunk).peekable();
        // Chunks the breaker refused, started again (first) once a chunk in
        // flight has finished (`refused_waiting` until then).
        let mut put_back: VecDeque<&[&str]> = VecDeque::new();
        // Each chunk is put back once at most (by where its keys start):
        // refused again, it is its failure. With the breaker open every
        // call is refused at once, and putting chunks back each time made
        // rounds that settled one key each without ever awaiting.
        let mut put_back_once: HashSet<usize> = HashSet::new();
        let mut refused_waiting = false;
        let mut in_flight = FuturesUnordered::new();
        let mut counted = InFlight::default();
        let mut over_budget: Option<StateOpError> = None;
        loop {
            while over_budget.is_none() && !refused_waiting {
                let Some(next) = put_back.front().or(chunks.peek()).copied() else {
                    break;
                };
                if !may_start(pace, limit, held, counted, next.len(), largest_item) {
                    break;
                }
                // Taken from where it was seen: put back chunks first.
                if put_back.pop_front().is_none() {
                    chunks.next();
                }
                counted.chunks += 1;
                counted.keys += next.len();
                #[cfg(test)]
                CHUNKS_STARTED.with(|started| started.set(started.get() + 1));
                in_flight.push(self.read_chunk(next, metadata));
            }
            let Some((chunk, outcome)) = in_flight.next().await else {
                break;
            };
            counted.chunks -= 1;
            counted.keys -= chunk.len();
            if over_budget.is_some() {
                continue; // Let finish, dropped.
            }
            if outcome.refused
                && !in_flight.is_empty()
                && put_back_once.insert(chunk.as_ptr() as usize)
            {
                put_back.push_back(chunk);
                refused_waiting = true;
                continue;
            }
            refused_waiting = false;
            // A chunk failing as a whole: answered now, those in flight
            // dropped with this future.
            let items = outcome.answer?;
            let mut chunk_bytes = 0usize;
            let mut chunk_largest = 0usize;
            let mut within = Ok(());
            for item in items {
                let Some(&slot) = slot_of.get(item.key.as_str()) else {
                    continue; // A key not asked for.
                };
                let bytes = item_bytes(&item);
                within = self.within(&mut budget, bytes);
                if within.is_err() {
                    break;
                }
                chunk_bytes = chunk_bytes.saturating_add(bytes);
                chunk_largest = chunk_largest.max(bytes);
                read[slot] = Some(item);
            }
            match within {
                Ok(()) => {
                    held = held.saturating_add(chunk_bytes);
                    largest_item = Some(largest_item.unwrap_or(0).max(chunk_largest));
                }
                Err(error) => {
                    // Nothing of it is answered: the answers held are freed
                    // before the chunks in flight are waited for.
                    read = Vec::new();
                    held = 0;
                    over_budget = Some(error);
                }
            }
        }
        match over_budget {
            Some(error) => Err(error),
            None => Ok(read),
        }
    }

    /// One chunk of a bulk get, handed back with how its read ended: the
    /// store's bulk read of `chunk`, or with request `metadata` a get of
    /// each (one key a chunk) carrying it, whose failure is that key's
    /// error (as in a bulk answer).
    async fn read_chunk<'k>(
        &self,
        chunk: &'k [&'k str],
        metadata: &HashMap<String, String>,
    ) -> (&'k [&'k str], ChunkRead) {
        if !metadata.is_empty() {
            let mut items = Vec::with_capacity(chunk.len());
            let mut refused = false;
            for key in chunk {
                let (item, was_refused) = self.get_with((*key).to_owned(), metadata).await;
                refused |= was_refused;
                items.push(item);
            }
            let answer = Ok(items);
            return (chunk, ChunkRead { answer, refused });
        }
        let keys: Vec<String> = chunk.iter().map(|key| (*key).to_owned()).collect();
        let store = &self.store;
        // The store is asked only once the breaker has admitted the call: a
        // failure without it is the breaker's refusal.
        let asked = AtomicBool::new(false);
        let answer = self
            .call
            .guarded(
                self.target(),
                retry_rule::IDEMPOTENT,
                keys,
                |keys| {
                    asked.store(true, Ordering::Relaxed);
                    store.bulk_get(keys)
                },
                StateError::Backend,
            )
            .await;
        let refused = answer.is_err() && !asked.load(Ordering::Relaxed);
        let answer = answer.map_err(|e| StateOpError::BulkGet {
            store: self.name.to_owned(),
            source: self.scrubbed(e),
        });
        (chunk, ChunkRead { answer, refused })
    }

    /// `key` read by a get carrying `metadata`, as a bulk item (a failed
    /// get is the item's error), and whether the circuit breaker refused
    /// the get before the store was asked.
    async fn get_with(
        &self,
        key: String,
        metadata: &HashMap<String, String>,
    ) -> (BulkGetItem, bool) {
        let store = &self.store;
        let request = GetRequest {
            key: key.clone(),
            metadata: metadata.clone(),
        };
        let asked = AtomicBool::new(false);
        let read = self
            .call
            .guarded(
                self.target(),
                retry_rule::IDEMPOTENT,
                request,
                |r| {
                    asked.store(true, Ordering::Relaxed);
                    store.get(r)
                },
                StateError::Backend,
            )
            .await;
        let refused = read.is_err() && !asked.load(Ordering::Relaxed);
        let item = match read {
            Ok(entry) => BulkGetItem {
                key,
                entry,
                error: None,
            },
            Err(error) => BulkGetItem {
                key,
                entry: None,
                error: Some(error.to_string()),
            },
        };
        (item, refused)
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
thread_local! {
    /// Chunks (or gets) started on this thread: what a test counts.
    pub(super) static CHUNKS_STARTED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}
