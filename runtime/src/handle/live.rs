//! Where generations are published, with a notification on every publish.

use std::sync::{Arc, Mutex};

use arc_swap::{ArcSwap, Guard};
use tokio::sync::watch;

use super::warm::WarmRequest;
use super::Generation;

/// The published generation of a runtime, and a signal of each new one.
#[derive(Debug)]
pub struct Live {
    current: ArcSwap<Generation>,
    published: watch::Sender<u64>,
    /// Handle subscriptions to warm before each publish (`warm`).
    pub(super) warmers: Mutex<Vec<tokio::sync::mpsc::Sender<WarmRequest>>>,
}

/// Shared pointer to a runtime's [`Live`] generation.
pub type LiveGeneration = Arc<Live>;

impl Live {
    /// An empty generation 0, as before start-up.
    pub(crate) fn new() -> LiveGeneration {
        Arc::new(Self {
            current: ArcSwap::from_pointee(Generation::default()),
            published: watch::channel(0).0,
            warmers: Mutex::new(Vec::new()),
        })
    }

    /// The current generation, cheaply (no reference count taken).
    pub fn current(&self) -> Guard<Arc<Generation>> {
        self.current.load()
    }

    /// The current generation, owned.
    pub fn load_full(&self) -> Arc<Generation> {
        self.current.load_full()
    }

    /// Publishes `generation`: every handle resolves in it from now on.
    pub(crate) fn publish(&self, generation: Generation) {
        let number = generation.number;
        self.current.store(Arc::new(generation));
        self.published.send_replace(number);
    }

    /// A receiver told about each publish.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.published.subscribe()
    }
}
