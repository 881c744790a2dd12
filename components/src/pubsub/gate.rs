//! [`PublishGate`]: how a replaced broker stops taking publishes without
//! losing one. A publish holds the gate open while it runs; a draining
//! subscription closes it (waiting for publishes under way, while it keeps
//! reading: one may be waiting for room), then reads what is left. A publish that comes later is refused as
//! [`PubSubError::Retired`], so the sidecar sends it to the new broker.
//! A close that waits too long (a publish that never ends) may be given
//! up on ([`PublishGate::refuse_publishes`]): later publishes are refused
//! all the same.

use std::sync::atomic::{AtomicBool, Ordering};

use rewire_runtime::PubSubError;
use tokio::sync::{RwLock, RwLockReadGuard};
use tokio_util::sync::CancellationToken;

/// Open while the broker takes publishes.
#[derive(Debug)]
pub struct PublishGate {
    open: RwLock<bool>,
    /// Set as a close begins: later publishes are refused at once, not
    /// queued behind the close (a dead letter so queued outlived its
    /// bound, and was lost, while the drain waited for publishes under
    /// way).
    closing: AtomicBool,
    /// Set when a close was given up on: publishes are refused, though
    /// one under way may still be running.
    refusing: AtomicBool,
    /// Cancelled once the gate is closed, or refuses publishes.
    shut: CancellationToken,
}

impl Default for PublishGate {
    fn default() -> Self {
        Self {
            open: RwLock::new(true),
            closing: AtomicBool::new(false),
            refusing: AtomicBool::new(false),
            shut: CancellationToken::new(),
        }
    }
}

/// Held by a publish for its duration.
pub type PublishPass<'a> = RwLockReadGuard<'a, bool>;

impl PublishGate {
    /// Enters for one publish; `Retired` once the gate is closed.
    pub async fn enter(&self) -> Result<PublishPass<'_>, PubSubError> {
        if self.closing.load(Ordering::SeqCst) {
            return Err(PubSubError::Retired);
        }
        let pass = self.open.read().await;
        if *pass && !self.refusing.load(Ordering::SeqCst) {
            Ok(pass)
        } else {
            Err(PubSubError::Retired)
        }
    }

    /// Closes the gate once the publishes under way are done.
    pub async fn close(&self) {
        self.closing.store(true, Ordering::SeqCst);
        *self.open.write().await = false;
        self.shut.cancel();
    }

    /// Refuses publishes from now on, without waiting for those under way
    /// (a close given up on: they may still write).
    pub fn refuse_publishes(&self) {
        self.refusing.store(true, Ordering::SeqCst);
        self.shut.cancel();
    }

    /// Resolves once the gate is closed (the publishes under way done),
    /// or refuses publishes.
    pub async fn closed(&self) {
        self.shut.cancelled().await;
    }

    /// Whether the gate is still open.
    pub async fn is_open(&self) -> bool {
        *self.open.read().await && !self.refusing.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn closing_waits_for_publishes_under_way_then_refuses_new_ones() {
        let gate = std::sync::Arc::new(PublishGate::default());
        let pass = gate.enter().await.expect("open");
        let closing = tokio::spawn({
            let gate = gate.clone();
            async move { gate.close().await }
        });
        tokio::task::yield_now().await;
        assert!(!closing.is_finished());
        drop(pass);
        testkit::soon("the close", closing).await.expect("closed");
        assert_eq!(gate.enter().await.err(), Some(PubSubError::Retired));
    }

    #[tokio::test]
    async fn closed_resolves_once_the_publishes_under_way_are_done() {
        let gate = std::sync::Arc::new(PublishGate::default());
        let pass = gate.enter().await.expect("open");
        let closing = tokio::spawn({
            let gate = gate.clone();
            async move { gate.close().await }
        });
        let waiting = tokio::spawn({
            let gate = gate.clone();
            async move { gate.closed().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        drop(pass);
        testkit::soon("the close", closing).await.expect("closed");
        testkit::soon("the wait", waiting).await.expect("joined");
    }

    #[tokio::test]
    async fn a_close_given_up_on_refuses_publishes_and_ends_the_wait() {
        let gate = std::sync::Arc::new(PublishGate::default());
        let _pass = gate.enter().await.expect("open");
        gate.refuse_publishes();
        testkit::soon("the wait", gate.closed()).await;
        assert_eq!(gate.enter().await.err(), Some(PubSubError::Retired));
        assert!(!gate.is_open().await);
    }

    /// A publish that comes while a close waits for those under way is
    /// refused at once (it goes to the broker serving now), not queued
    /// behind the close.
    #[tokio::test]
    async fn a_publish_while_a_close_waits_is_refused_at_once() {
        let gate = std::sync::Arc::new(PublishGate::default());
        let pass = gate.enter().await.expect("open");
        let closing = tokio::spawn({
            let gate = gate.clone();
            async move { gate.close().await }
        });
        tokio::task::yield_now().await;
        let entered = tokio::time::timeout(std::time::Duration::from_millis(100), gate.enter())
            .await
            .map(|entered| entered.map(|_| ()));
        assert!(
            matches!(entered, Ok(Err(PubSubError::Retired))),
            "queued behind the close: {entered:?}"
        );
        drop(pass);
        closing.await.expect("closed");
    }
}
