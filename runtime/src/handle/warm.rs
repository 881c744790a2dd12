//! Warming: just before a reload publishes its generation, each pub/sub
//! subscription made through a handle is offered the instances the
//! generation brings, so it subscribes to a rebuilt broker while the old
//! one still takes every publish. Waiting is bounded: a subscription that
//! does not answer in time follows at the publish instead.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::{Instance, Live};
use crate::component::ComponentKey;

/// How long a publish waits for subscriptions to warm.
const WARM_DEADLINE: Duration = Duration::from_secs(5);
/// Pending warm requests one subscription may have.
const WARM_QUEUE: usize = 4;

/// The instances of the generation about to be published.
pub(crate) struct WarmRequest {
    /// Every instance of the next generation.
    pub(crate) next: Arc<BTreeMap<ComponentKey, Instance>>,
    /// Dropped (or sent) once the subscription is ready for the publish.
    pub(crate) _done: oneshot::Sender<()>,
}

impl Live {
    /// A receiver of warm requests, for as long as it is kept.
    pub(crate) fn warmer(&self) -> mpsc::Receiver<WarmRequest> {
        let (sender, receiver) = mpsc::channel(WARM_QUEUE);
        let mut warmers = self
            .warmers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        warmers.retain(|w| !w.is_closed());
        warmers.push(sender);
        receiver
    }

    /// Offers `next` (made only when some subscription is there to be
    /// offered it) to every subscription and waits (bounded) until each
    /// has subscribed to what it needs from it.
    pub(crate) async fn warm(&self, next: impl FnOnce() -> BTreeMap<ComponentKey, Instance>) {
        let senders: Vec<_> = {
            let mut warmers = self
                .warmers
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            warmers.retain(|w| !w.is_closed());
            warmers.clone()
        };
        if senders.is_empty() {
            return;
        }
        let next = Arc::new(next());
        let mut waits = Vec::with_capacity(senders.len());
        for sender in senders {
            let (done, wait) = oneshot::channel();
            let request = WarmRequest {
                next: next.clone(),
                _done: done,
            };
            if sender.try_send(request).is_ok() {
                waits.push(wait);
            }
        }
        let all = async {
            for wait in waits {
                let _ = wait.await;
            }
        };
        if tokio::time::timeout(WARM_DEADLINE, all).await.is_err() {
            tracing::warn!(
                deadline = ?WARM_DEADLINE,
                "A pub/sub subscription did not warm in time; it follows at the publish."
            );
        }
    }
}
