//! Places for file operations, counted against a bound: the one count
//! behind the bound on uploads ([`crate::upload_slots`]) and the one on
//! downloads ([`crate::connection::DownloadSlots`]). A place is taken only
//! while fewer than the bound are held, and given back when its [`Slot`]
//! is dropped, however the operation ended.
//!
//! Each bound is its own instantiation, `Slots<F>` with `F` the refusal it
//! answers with ([`Full`]): the two never share a count, and each kind's
//! slot carries its own ways of being held (an upload's
//! `held_through`, a download's `holding`).

use std::fmt;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use rewire_runtime::echoed;

/// A refusal of a place: the bound was reached.
pub trait Full {
    /// The refusal of the operation on file `name` of file store `store`
    /// (both quoted as echoed back to clients) while `max` run already.
    fn at_bound(store: String, name: String, max: usize) -> Self;
}

/// The places held now, counted against a bound; a place refused is an
/// `F`.
pub struct Slots<F> {
    running: Arc<AtomicUsize>,
    refusal: PhantomData<fn() -> F>,
}

/// One operation's place among its [`Slots`]: given back when dropped
/// (the operation ended, or its call was dropped).
pub struct Slot<F> {
    running: Arc<AtomicUsize>,
    refusal: PhantomData<fn() -> F>,
}

impl<F: Full> Slots<F> {
    /// A place for the operation on file `name` of file store `store`, if
    /// fewer than `max` run; else the refusal naming them and `max`.
    pub fn take(&self, max: usize, store: &str, name: &str) -> Result<Slot<F>, F> {
        self.running
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |running| {
                (running < max).then_some(running + 1)
            })
            .map_err(|_| F::at_bound(echoed(store).into_owned(), echoed(name).into_owned(), max))?;
        Ok(Slot {
            running: Arc::clone(&self.running),
            refusal: PhantomData,
        })
    }
}

impl<F> Slots<F> {
    /// How many run now.
    pub fn running(&self) -> usize {
        self.running.load(Ordering::Acquire)
    }
}

impl<F> Default for Slots<F> {
    fn default() -> Self {
        Self {
            running: Arc::default(),
            refusal: PhantomData,
        }
    }
}

impl<F> fmt::Debug for Slots<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Slots")
            .field("running", &self.running())
            .finish()
    }
}

impl<F> Drop for Slot<F> {
    fn drop(&mut self) {
        self.running.fetch_sub(1, Ordering::AcqRel);
    }
}

impl<F> fmt::Debug for Slot<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Slot").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A refusal that keeps what it was told.
    #[derive(Debug, PartialEq, Eq)]
    struct Refused(String, String, usize);

    impl Full for Refused {
        fn at_bound(store: String, name: String, max: usize) -> Self {
            Self(store, name, max)
        }
    }

    #[test]
    fn places_past_the_bound_are_refused_until_one_is_given_back() {
        let slots = Slots::<Refused>::default();
        let first = slots.take(2, "files", "a.bin").expect("room");
        let _second = slots.take(2, "files", "b.bin").expect("room");
        let refused = slots.take(2, "files", "c.bin").expect_err("full");
        assert_eq!(refused, Refused("files".into(), "c.bin".into(), 2));
        assert_eq!(slots.running(), 2, "a refusal takes no place");
        drop(first);
        assert_eq!(slots.running(), 1);
        let _third = slots
            .take(2, "files", "c.bin")
            .expect("a place was given back");
        assert_eq!(slots.running(), 2);
    }

    #[test]
    fn a_refusal_quotes_the_store_and_file_as_echoed() {
        let slots = Slots::<Refused>::default();
        let long = "n".repeat(10_000);
        let Refused(store, name, max) = slots.take(0, &long, &long).expect_err("a bound of 0");
        assert_eq!(store, echoed(&long));
        assert_eq!(name, echoed(&long));
        assert!(name.len() < long.len(), "cut: {}", name.len());
        assert_eq!(max, 0);
        assert_eq!(slots.running(), 0);
    }
}
