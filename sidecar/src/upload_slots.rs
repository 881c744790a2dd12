//! The bound on uploads running at once (`ApiOptions::max_uploads`): the
//! HTTP file `PUT` and Layotto's `PutFile` together. An upload holds what
//! its store writes with (a `local` store's put, two open files) for as
//! long as its client keeps sending, so trickling clients could otherwise
//! take every file descriptor of the process. The place is kept until the
//! upload's store has ended all its work, not just the upload's handler: a
//! `local` store's blocking write or sync runs on after its client gave up
//! (a hung disk), holding its open files, so the store keeps the place
//! ([`UploadSlot::held_through`]) until that write returns.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use rewire_runtime::{echoed, PutFileRequest};

/// An upload refused: `max` run already.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UploadsFull {
    /// The store, as quoted.
    pub store: String,
    /// The file, as quoted.
    pub name: String,
    /// The bound.
    pub max: usize,
}

/// The uploads running now, counted against a bound.
#[derive(Debug, Default)]
pub struct UploadSlots {
    running: Arc<AtomicUsize>,
}

/// One upload's place among the [`UploadSlots`]: given back when dropped
/// (the upload ended, or its call was dropped).
#[derive(Debug)]
pub struct UploadSlot {
    running: Arc<AtomicUsize>,
}

impl UploadSlots {
    /// A place for the upload of `name` to file store `store`, if fewer
    /// than `max` run; else [`UploadsFull`].
    pub fn take(&self, max: usize, store: &str, name: &str) -> Result<UploadSlot, UploadsFull> {
        self.running
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |running| {
                (running < max).then_some(running + 1)
            })
            .map_err(|_| UploadsFull {
                store: echoed(store).into_owned(),
                name: echoed(name).into_owned(),
                max,
            })?;
        Ok(UploadSlot {
            running: Arc::clone(&self.running),
        })
    }

    /// How many run now.
    pub fn running(&self) -> usize {
        self.running.load(Ordering::Acquire)
    }
}

impl UploadSlot {
    /// Runs `put` (the upload's store write) holding this place, given
    /// back once `put` has ended or been dropped and the store's work it
    /// left running (a `local` store's blocking write) has ended too
    /// ([`PutFileRequest::holding`]).
    pub async fn held_through<F: Future>(self, put: F) -> F::Output {
        PutFileRequest::holding(Arc::new(self), put).await
    }
}

impl Drop for UploadSlot {
    fn drop(&mut self) {
        self.running.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uploads_past_the_bound_are_refused_naming_it_until_one_ends() {
        let slots = UploadSlots::default();
        let first = slots.take(2, "files", "a.bin").expect("room");
        let _second = slots.take(2, "files", "b.bin").expect("room");
        let refused = slots.take(2, "files", "c.bin").expect_err("full");
        let text = crate::dapr::UploadError::from(refused).to_string();
        assert!(
            text.contains("max_uploads: 2")
                && text.contains("file `c.bin`")
                && text.contains("file store `files`"),
            "{text}"
        );
        assert_eq!(slots.running(), 2);
        drop(first);
        assert_eq!(slots.running(), 1);
        let _third = slots
            .take(2, "files", "c.bin")
            .expect("a place was given back");
        assert_eq!(slots.running(), 2);
    }

    #[tokio::test]
    async fn a_place_held_through_a_put_is_kept_by_the_work_its_store_left_running() {
        let slots = UploadSlots::default();
        let place = slots.take(1, "files", "a.bin").expect("room");
        // A store's blocking write that outlives the put keeps the hold.
        let left_running = place
            .held_through(async { PutFileRequest::upload_hold() })
            .await
            .expect("the put sees its upload's hold");
        assert_eq!(slots.running(), 1);
        slots.take(1, "files", "b.bin").expect_err("still taken");
        drop(left_running);
        assert_eq!(slots.running(), 0);
        assert_eq!(PutFileRequest::upload_hold().map(|_| ()), None, "outside");
    }
}
