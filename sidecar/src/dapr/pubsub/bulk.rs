//! A bulk publish's entries published side by side, as Dapr's default
//! bulk publisher does (an errgroup): at most [`BULK_CONCURRENCY`] at
//! once, each entry's own result kept.
//!
//! A bulk publish given its call's `request_timeout` answers a little
//! before it ([`answer_by`]): a broker that is full (the memory broker
//! waits 5 s per publish), down (a dead Redis, ~1.5 s per failure) or slow
//! no longer has the transport cut the whole call (`DEADLINE_EXCEEDED`,
//! 504) with no word of the entries already taken. Every entry not
//! settled by then is answered failed: one still under way
//! ([`NOT_CONFIRMED`]: its publish is dropped, and the broker may have
//! taken it already), one never tried ([`NOT_TRIED`]).

use std::collections::HashMap;
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::time::Instant;

use super::{entry_error, PubSubOpError, PubSubOps, PublishEvent};

/// Entries of one bulk publish under way at once. Each holds its own copy
/// of the request's metadata merged under the entry's while under way, so
/// no more than this many copies are alive, whatever the request's count
/// of entries times its metadata.
pub(super) const BULK_CONCURRENCY: usize = 16;

/// What a bulk publish keeps of its call's `request_timeout` to write its
/// answer (at most half of it).
const ANSWER_MARGIN: Duration = Duration::from_secs(1);

/// The error of an entry not tried by [`answer_by`].
pub(super) const NOT_TRIED: &str = "not published within request_timeout";

/// The error of an entry still under way at [`answer_by`]: its publish is
/// dropped, and the broker may have taken it before (a Redis `XADD` sent,
/// its reply not read yet).
pub(super) const NOT_CONFIRMED: &str =
    "not confirmed within request_timeout (it may have been published)";

/// When a bulk publish that started at `started`, in a call bounded by
/// `request_timeout`, stops waiting for its entries and answers:
/// [`ANSWER_MARGIN`] before the call's end, and no sooner than half of
/// `request_timeout`. `None` (no bound) past the clock's range.
pub(super) fn answer_by(started: Instant, request_timeout: Duration) -> Option<Instant> {
    let kept = request_timeout
        .saturating_sub(ANSWER_MARGIN)
        .max(request_timeout / 2);
    started.checked_add(kept)
}

/// Where one entry of a bulk publish stands.
enum Settled {
    /// Its publish is under way.
    Pending,
    /// The broker took it.
    Published,
    /// It failed, with the entry's error.
    Failed(String),
}

impl PubSubOps {
    /// Publishes `entries` (checked already) to `topic`, at most
    /// [`BULK_CONCURRENCY`] at once, each merged with `request_metadata`
    /// and enveloped only when its publish starts; the failed ones' ids
    /// with their errors, in the entries' order. By `answer_by`, if given,
    /// the entries not settled are answered failed ([`NOT_CONFIRMED`],
    /// [`NOT_TRIED`]) and their publishes dropped.
    pub(super) async fn publish_entries(
        &self,
        topic: &str,
        request_metadata: &HashMap<String, String>,
        entries: Vec<(String, PublishEvent)>,
        answer_by: Option<Instant>,
    ) -> Vec<(String, String)> {
        let mut untried = entries.into_iter();
        let mut started: Vec<(String, Settled)> = Vec::new();
        let mut running = FuturesUnordered::new();
        let cutoff = async move {
            match answer_by {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(cutoff);
        let due = || answer_by.is_some_and(|at| Instant::now() >= at);
        loop {
            // None started once the answer is due.
            while running.len() < BULK_CONCURRENCY && !due() {
                let Some((entry_id, event)) = untried.next() else {
                    break;
                };
                let index = started.len();
                started.push((entry_id, Settled::Pending));
                running.push(async move {
                    let published = self.publish_entry(topic, request_metadata, event).await;
                    (index, published)
                });
            }
            // An entry settled is kept even when the cutoff is due too.
            let next = tokio::select! {
                biased;
                next = running.next() => next,
                () = &mut cutoff => None,
            };
            let Some((index, published)) = next else {
                break;
            };
            started[index].1 = match published {
                Ok(()) => Settled::Published,
                Err(err) => Settled::Failed(entry_error(&err)),
            };
        }
        // Dropped: the publishes still under way end here.
        let unconfirmed = running.len();
        drop(running);
        let mut failed = Vec::new();
        for (entry_id, settled) in started {
            match settled {
                Settled::Published => {}
                Settled::Failed(error) => failed.push((entry_id, error)),
                Settled::Pending => failed.push((entry_id, NOT_CONFIRMED.to_string())),
            }
        }
        let before_untried = failed.len();
        failed.extend(untried.map(|(entry_id, _)| (entry_id, NOT_TRIED.to_string())));
        let not_tried = failed.len() - before_untried;
        if unconfirmed + not_tried > 0 {
            tracing::warn!(
                pubsub = %self.name,
                unconfirmed,
                not_tried,
                "A bulk publish reached its answer deadline (a little before request_timeout); \
                 its unsettled entries are answered failed."
            );
        }
        failed
    }

    /// Publishes one bulk entry: `request_metadata` under its own,
    /// enveloped unless `rawPayload`.
    async fn publish_entry(
        &self,
        topic: &str,
        request_metadata: &HashMap<String, String>,
        mut event: PublishEvent,
    ) -> Result<(), PubSubOpError> {
        if !request_metadata.is_empty() {
            let own = std::mem::replace(&mut event.metadata, request_metadata.clone());
            event.metadata.extend(own);
        }
        let request = self.prepare(topic, event)?;
        self.publish_following(request).await
    }
}
