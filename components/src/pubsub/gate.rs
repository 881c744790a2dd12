//! [`PublishGate`]: how a replaced broker stops taking publishes without
//! losing one. A publish holds the gate open while it runs; a draining
//! subscription closes it (waiting for publishes under way, while it keeps
//! reading: one may be waiting for room), then reads what is left. A publish that comes later is refused as
//! [`PubSubError::Retired`], so the sidecar sends it to the new broker.

use rewire_runtime::PubSubError;
use tokio::sync::{RwLock, RwLockReadGuard};

/// Open while the broker takes publishes.
#[derive(Debug)]
pub struct PublishGate {
    open: RwLock<bool>,
}

impl Default for PublishGate {
    fn default() -> Self {
        Self {
            open: RwLock::new(true),
        }
    }
}

/// Held by a publish for its duration.
pub type PublishPass<'a> = RwLockReadGuard<'a, bool>;

impl PublishGate {
    /// Enters for one publish; `Retired` once the gate is closed.
    pub async fn enter(&self) -> Result<PublishPass<'_>, PubSubError> {
        let pass = self.open.read().await;
        if *pass {
            Ok(pass)
        } else {
            Err(PubSubError::Retired)
        }
    }

    /// Closes the gate once the publishes under way are done.
    pub async fn close(&self) {
        *self.open.write().await = false;
    }

    /// Whether the gate is still open.
    pub async fn is_open(&self) -> bool {
        *self.open.read().await
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
}
