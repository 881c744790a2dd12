//! The bound on uploads running at once (`ApiOptions::max_uploads`): the
//! HTTP file `PUT` and Layotto's `PutFile` together. An upload holds what
//! its store writes with (a `local` store's put, two open files) for as
//! long as its client keeps sending, so trickling clients could otherwise
//! take every file descriptor of the process.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use rewire_runtime::echoed;

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
}
