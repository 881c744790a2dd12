//! Closing: a whole set in reverse start order, the components of one
//! level at once (a level's components never use each other: each uses
//! only earlier levels), optionally all by a deadline.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{Components, Running};
use crate::closing::{Closing, CLOSE_TIMEOUT};
use crate::component::ComponentKey;

/// Kept for each level still to close when the levels share a deadline:
/// a level that does not let go leaves at least this much (or an even
/// share of what is left, if less) to each level after it.
const LEVEL_RESERVE: Duration = Duration::from_secs(1);
/// The least a level is given, the deadline passed or not: its closes'
/// tasks must run to be asked at all (aborted unpolled, none would be).
const LEVEL_FLOOR: Duration = Duration::from_millis(100);

/// Closes the components of `levels` found in `components`, last level
/// first, each level's at once, each `close` bounded by `CLOSE_TIMEOUT`;
/// with a deadline `by`, also by each level's share of the time left (see
/// [`level_share`]), so the first level, the stores, is closed too.
/// Returns how many closes were abandoned (timed out or panicked).
pub(crate) async fn close_in_reverse(
    levels: &[Vec<ComponentKey>],
    components: &mut Components,
    by: Option<Instant>,
) -> usize {
    let mut abandoned = 0;
    let mut left = levels.len();
    for level in levels.iter().rev() {
        let within = by.map_or(CLOSE_TIMEOUT, |by| level_share(by, left));
        left -= 1;
        let closing: Vec<(ComponentKey, Arc<Running>)> = level
            .iter()
            .rev()
            .filter_map(|key| components.remove(key).map(|r| (key.clone(), r)))
            .collect();
        abandoned += close_level(closing, within).await;
    }
    abandoned
}

/// Closes `closing` at once, each `close` bounded by `within`; returns how
/// many were abandoned. Each close runs on a task of its own (a panic or a
/// hang abandons it, see [`Closing`]); they are awaited one after another
/// by one shared deadline.
async fn close_level(closing: Vec<(ComponentKey, Arc<Running>)>, within: Duration) -> usize {
    let deadline = Instant::now() + within;
    let started: Vec<(ComponentKey, Closing)> = closing
        .into_iter()
        .map(|(key, running)| {
            let assembled = &running.assembled;
            let close = Closing::start(&assembled.instance, &assembled.shutdown);
            (key, close)
        })
        .collect();
    let mut abandoned = 0;
    for (key, close) in started {
        abandoned += close.ended_by(&key, deadline).await.abandoned();
    }
    abandoned
}

/// How long the next of `left` levels (counting it) may take to close, so
/// that all are closed by `by`: up to `CLOSE_TIMEOUT`, leaving each later
/// level [`LEVEL_RESERVE`], or an even share of the time left if that is
/// less; never under [`LEVEL_FLOOR`], so a deadline near or past still
/// asks each close (each level may then run that much past `by`).
fn level_share(by: Instant, left: usize) -> Duration {
    let remaining = by.saturating_duration_since(Instant::now());
    let left = u32::try_from(left.max(1)).unwrap_or(u32::MAX);
    let reserve = LEVEL_RESERVE.min(remaining / left);
    remaining
        .saturating_sub(reserve * (left - 1))
        .clamp(LEVEL_FLOOR, CLOSE_TIMEOUT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn each_level_leaves_the_levels_after_it_their_share() {
        let by = Instant::now() + Duration::from_secs(8);
        assert_eq!(level_share(by, 1), CLOSE_TIMEOUT, "capped");
        assert_eq!(level_share(by, 3), Duration::from_secs(5), "2 s kept");
        assert_eq!(level_share(by, 5), Duration::from_secs(4), "4 s kept");
        assert_eq!(level_share(by, 16), Duration::from_millis(500), "even");
        tokio::time::sleep(Duration::from_secs(9)).await;
        assert_eq!(level_share(by, 2), LEVEL_FLOOR, "past the deadline");
    }
}
