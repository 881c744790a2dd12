//! What a file trigger (the configuration file, the configuration's
//! sources) saw last and what came of it, shared by its watches and
//! serialised: one read, parse and send at a time, so two watches of the
//! same sources cannot queue older content after newer.
//!
//! Content sent as a reload is remembered with the generation it was sent
//! against: refused (or rolled back and given up) only because of what
//! else ran — the overlay, a push — it is sent again once the generation
//! moves on. Content that is in force, or refused for its own sake (it
//! does not parse), is not sent again until it changes.
//!
//! Content in force is still sent when other content was sent last: that
//! other content may be queued, in flight or kept as a retry, and would go
//! in force after it (a file reverted while its new content rolls back).
//! Sent, the content in force replaces it (the reload changes nothing).
//!
//! A read, whoever asks for it (an event, a periodic re-read, a new
//! generation, a control-plane change), waits until no watched file of the
//! sources is being written, and is discarded if one was modified while it
//! read: the watch reads again once the writer closes it (see
//! [`crate::fs_watch`]).

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use tokio::sync::{Mutex, MutexGuard};
use tokio_util::sync::CancellationToken;

use super::TriggerContext;
use crate::fs_watch::{still_being_written, OnChange, Writers};

/// A digest of content (or of a problem's text).
pub(super) fn digest(value: &impl Hash) -> u64 {
    let mut hasher = DefaultHasher::new();
    value.hash(&mut hasher);
    hasher.finish()
}

/// What came of the content last seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// In force, or refused for its own sake: nothing to send until it
    /// changes.
    Settled,
    /// Sent as a reload against this generation.
    SentAt(u64),
}

/// The content last seen (by digest) and what came of it — `None` until
/// the first read, which therefore always compares the content with the
/// configuration in force — and the content last sent as a reload.
#[derive(Debug, Default)]
pub(super) struct Seen(Option<(u64, Outcome)>, Option<u64>);

impl Seen {
    /// Whether `hash` needs no work against `generation`: already settled,
    /// or already sent against it.
    pub(super) fn is_done(&self, hash: u64, generation: u64) -> bool {
        match self.0 {
            Some((seen, Outcome::Settled)) => seen == hash,
            Some((seen, Outcome::SentAt(at))) => seen == hash && at == generation,
            None => false,
        }
    }

    /// Notes `hash` as settled.
    pub(super) fn settled(&mut self, hash: u64) {
        self.0 = Some((hash, Outcome::Settled));
    }

    /// Notes `hash` as sent against `generation`.
    pub(super) fn sent(&mut self, hash: u64, generation: u64) {
        self.0 = Some((hash, Outcome::SentAt(generation)));
        self.1 = Some(hash);
    }

    /// Whether content other than `hash` was sent last: it may still be
    /// queued, in flight or retried after a rollback, and go in force
    /// after `hash` unless `hash` is sent too. (What was seen since — a
    /// half-written file refused, say — does not matter.)
    pub(super) fn other_sent(&self, hash: u64) -> bool {
        self.1.is_some_and(|sent| sent != hash)
    }

    /// Whether content was sent against another generation than
    /// `generation` (and may be in force by now, or worth another try).
    pub(super) fn sent_before(&self, generation: u64) -> bool {
        matches!(self.0, Some((_, Outcome::SentAt(at))) if at != generation)
    }
}

/// The state shared by a trigger's watches (the lock is held across a
/// whole read, parse and send).
pub(super) type SharedSeen = Arc<Mutex<Seen>>;

/// Takes `seen` for a read once no watched file of the sources is being
/// written, with the count of modifications seen then (compare it with
/// [`written_since`] after the read). `None`: a file has been written for
/// too long (reported, and its writer forgotten); this read is skipped,
/// the next takes the file as it is.
pub(super) async fn lock_once_written<'a>(
    seen: &'a SharedSeen,
    writers: &Writers,
) -> Option<(MutexGuard<'a, Seen>, u64)> {
    loop {
        let count = match writers.until_closed().await {
            Ok(count) => count,
            Err(newly) => {
                still_being_written(&newly);
                return None;
            }
        };
        let seen = seen.lock().await;
        // Written again while waiting for the lock: wait for that writer.
        if writers.modifications() == count {
            return Some((seen, count));
        }
    }
}

/// Whether a watched file was modified since `count` was taken (by
/// [`lock_once_written`]): what was read may be half-written, and is
/// discarded (logged).
pub(super) fn written_since(writers: &Writers, count: u64) -> bool {
    let moved = writers.modifications() != count;
    if moved {
        tracing::debug!("A watched file was written during the read; discarded (read again once its writer closes it).");
    }
    moved
}

/// Calls `on_change` after each commit that moves the generation on while
/// content sent earlier is not known to be in force, so content refused
/// because of another layer is tried again; ends when `stop` is cancelled.
pub(super) fn follow_generations(
    cx: &TriggerContext,
    seen: SharedSeen,
    on_change: OnChange,
    stop: CancellationToken,
) {
    let mut plan = cx.plan.clone();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                changed = plan.changed() => if changed.is_err() { return },
            }
            let generation = plan.borrow_and_update().generation;
            if seen.lock().await.sent_before(generation) {
                on_change().await;
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sent_content_is_tried_again_against_a_new_generation() {
        let mut seen = Seen::default();
        assert!(!seen.is_done(1, 1), "the first read always compares");
        seen.sent(1, 1);
        assert!(seen.is_done(1, 1));
        assert!(!seen.is_done(2, 1), "new content");
        assert!(!seen.sent_before(1));
        assert!(seen.sent_before(2));
        assert!(!seen.is_done(1, 2), "a new generation");
        seen.settled(1);
        assert!(seen.is_done(1, 2) && seen.is_done(1, 3));
        assert!(!seen.sent_before(3));
    }

    #[test]
    fn content_in_force_is_news_while_other_content_was_sent_last() {
        let mut seen = Seen::default();
        assert!(!seen.other_sent(1), "nothing sent yet");
        seen.settled(1);
        assert!(!seen.other_sent(1) && !seen.other_sent(2));
        seen.sent(2, 1);
        assert!(seen.other_sent(1), "reverted while 2 may be retried");
        assert!(!seen.other_sent(2));
        seen.settled(3);
        assert!(
            seen.other_sent(1),
            "a refused read in between changes nothing"
        );
        seen.sent(1, 1);
        assert!(!seen.other_sent(1));
    }
}
