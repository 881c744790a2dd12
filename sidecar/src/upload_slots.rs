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
use std::sync::Arc;

use rewire_runtime::PutFileRequest;

use crate::slots::{Full, Slot, Slots};

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

impl Full for UploadsFull {
    fn at_bound(store: String, name: String, max: usize) -> Self {
        Self { store, name, max }
    }
}

/// The uploads running now, counted against a bound: a place for the
/// upload of `name` to file store `store` is [`Slots::take`]n, or refused
/// with [`UploadsFull`].
pub type UploadSlots = Slots<UploadsFull>;

/// One upload's place among the [`UploadSlots`]: given back when dropped
/// (the upload ended, or its call was dropped).
pub type UploadSlot = Slot<UploadsFull>;

impl UploadSlot {
    /// Runs `put` (the upload's store write) holding this place, given
    /// back once `put` has ended or been dropped and the store's work it
    /// left running (a `local` store's blocking write) has ended too
    /// ([`PutFileRequest::holding`]).
    pub async fn held_through<F: Future>(self, put: F) -> F::Output {
        PutFileRequest::holding(Arc::new(self), put).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_upload_names_the_bound_the_file_and_the_store() {
        let slots = UploadSlots::default();
        let _first = slots.take(1, "files", "a.bin").expect("room");
        let refused = slots.take(1, "files", "b.bin").expect_err("full");
        let text = crate::dapr::UploadError::from(refused).to_string();
        assert!(
            text.contains("max_uploads: 1")
                && text.contains("file `b.bin`")
                && text.contains("file store `files`"),
            "{text}"
        );
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
