//! How a bulk state get reads its distinct keys: in chunks (16 keys, one
//! store bulk read each; with request metadata one key, one get each),
//! the first chunk alone, then several at once within the client's
//! `parallelism` and what the response budget leaves room for.

use std::collections::HashMap;

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

/// Whether a bulk read may start one more chunk, `in_flight` being read
/// now, `held` bytes of answers kept, the largest chunk answered so far
/// `largest` bytes (`None` before the first answer).
///
/// * With none in flight, always (the read goes on one chunk at a time).
/// * Before the first answer, no other: the first chunk is read alone.
///   Its outcome alone judges a half-open circuit breaker's trial (with
///   Dapr's default `maxRequests: 1`, a sibling would be refused at once
///   and fail the bulk, the trial dropped unjudged), and its size is the
///   estimate the others are admitted by.
/// * Else only within `most_in_flight`, and while `held` plus every chunk
///   in flight, this one too, each counted as large as the largest so
///   far, stays within `limit`; large values are read one chunk at a
///   time.
///
/// So what a bulk refused for its size has read past the limit is, while
/// no chunk answers more than the largest before it, at most the one
/// chunk read alone. Values larger than any before may overshoot by more:
/// the chunks then in flight (at most `most_in_flight`), each admitted as
/// if no larger than the largest before it.
fn may_start(
    pace: Pace,
    limit: usize,
    held: usize,
    in_flight: usize,
    largest: Option<usize>,
) -> bool {
    if in_flight == 0 {
        return true;
    }
    let Some(largest) = largest else {
        return false;
    };
    in_flight < pace.most_in_flight
        && (in_flight + 1)
            .checked_mul(largest)
            .and_then(|estimate| estimate.checked_add(held))
            .is_some_and(|total| total <= limit)
}

impl StateOps<'_> {
    /// Reads every key of `distinct` (no repeats), each item at its key's
    /// index, `slot_of` (`None`: the store answered nothing for it), paced by
    /// `parallelism` ([`pace`]) and `limit` ([`may_start`]); the answers
    /// are counted as each chunk comes back, and the first chunk failing
    /// as a whole or over `limit` ends the read.
    ///
    /// Once the read has ended early, no chunk is started, and the chunks
    /// still in flight are let finish, their answers dropped as they come:
    /// dropped unfinished, a call that had been in flight for its blame
    /// bound (`DROPPED_CALL_GRACE`, 5 s, or the timeout policy's) would
    /// count as the store's failure, so a client's oversize bulk on a
    /// slow but healthy store would open its circuit breaker
    /// (`Call::guarded` has no way to end a call without a verdict: a
    /// dropped attempt is judged by its time in flight). What is waited
    /// for is bounded by [`may_start`] in bytes and by the request's own
    /// deadline in time (which drops the whole read).
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
        let mut largest: Option<usize> = None;
        let mut chunks = distinct.chunks(pace.keys_per_chunk);
        let mut in_flight = FuturesUnordered::new();
        let mut ended: Option<StateOpError> = None;
        loop {
            while ended.is_none() && may_start(pace, limit, held, in_flight.len(), largest) {
                let Some(chunk) = chunks.next() else {
                    break;
                };
                let keys: Vec<String> = chunk.iter().map(|key| (*key).to_owned()).collect();
                in_flight.push(self.read_chunk(keys, metadata));
            }
            let Some(answer) = in_flight.next().await else {
                break;
            };
            if ended.is_some() {
                continue; // Let finish, dropped.
            }
            let mut chunk_bytes = 0usize;
            let counted = answer.and_then(|items| {
                for item in items {
                    let Some(&slot) = slot_of.get(item.key.as_str()) else {
                        continue; // A key not asked for.
                    };
                    let bytes = item_bytes(&item);
                    self.within(&mut budget, bytes)?;
                    chunk_bytes = chunk_bytes.saturating_add(bytes);
                    read[slot] = Some(item);
                }
                Ok(())
            });
            match counted {
                Ok(()) => {
                    held = held.saturating_add(chunk_bytes);
                    largest = largest.max(Some(chunk_bytes));
                }
                Err(error) => ended = Some(error),
            }
        }
        match ended {
            Some(error) => Err(error),
            None => Ok(read),
        }
    }

    /// One chunk of a bulk get: the store's bulk read of `keys`, or with
    /// request `metadata` a get of each (one key a chunk) carrying it,
    /// whose failure is that key's error (as in a bulk answer).
    async fn read_chunk(
        &self,
        keys: Vec<String>,
        metadata: &HashMap<String, String>,
    ) -> Result<Vec<BulkGetItem>, StateOpError> {
        if !metadata.is_empty() {
            let mut items = Vec::with_capacity(keys.len());
            for key in keys {
                items.push(self.get_with(key, metadata).await);
            }
            return Ok(items);
        }
        let store = &self.store;
        self.call
            .guarded(
                self.target(),
                retry_rule::IDEMPOTENT,
                keys,
                |keys| store.bulk_get(keys),
                StateError::Backend,
            )
            .await
            .map_err(|e| StateOpError::BulkGet {
                store: self.name.to_owned(),
                source: self.scrubbed(e),
            })
    }

    /// `key` read by a get carrying `metadata`, as a bulk item: a failed
    /// get is the item's error.
    async fn get_with(&self, key: String, metadata: &HashMap<String, String>) -> BulkGetItem {
        let store = &self.store;
        let request = GetRequest {
            key: key.clone(),
            metadata: metadata.clone(),
        };
        let read = self
            .call
            .guarded(
                self.target(),
                retry_rule::IDEMPOTENT,
                request,
                |r| store.get(r),
                StateError::Backend,
            )
            .await;
        match read {
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
        }
    }
}

#[cfg(test)]
mod tests;
