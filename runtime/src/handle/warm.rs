//! Warming: just before a reload publishes its generation, each pub/sub
//! subscription made through a handle is offered the instances the
//! generation brings, so it subscribes to a rebuilt broker while the old
//! one still takes every publish. Waiting is bounded: a subscription that
//! does not answer in time follows at the publish instead. A subscription
//! made while a reload warms (too late to be offered) is told which
//! generation is being replaced, and waits for the publish.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::{Instance, Live};
use crate::component::ComponentKey;

/// How long a publish waits for subscriptions to warm.
pub(super) const WARM_DEADLINE: Duration = Duration::from_secs(5);
/// Pending warm requests one subscription may have.
const WARM_QUEUE: usize = 4;

/// The subscriptions to warm, and the reload warming them.
#[derive(Debug, Default)]
pub(crate) struct Warmers {
    senders: Vec<mpsc::Sender<WarmRequest>>,
    /// While a reload warms: the number of the generation it replaces.
    replacing: Option<u64>,
}

/// The instances of the generation about to be published.
pub(crate) struct WarmRequest {
    /// Every instance of the next generation.
    pub(crate) next: Arc<BTreeMap<ComponentKey, Instance>>,
    /// The number of the generation it replaces: once a later one is
    /// published, the request is stale.
    pub(crate) replaces: u64,
    /// Dropped (or sent) once the subscription is ready for the publish.
    pub(crate) _done: oneshot::Sender<()>,
}

impl Live {
    /// A receiver of warm requests, for as long as it is kept; and, when a
    /// reload warms now without having offered it, the number of the
    /// generation it replaces.
    pub(crate) fn warmer(&self) -> (mpsc::Receiver<WarmRequest>, Option<u64>) {
        let (sender, receiver) = mpsc::channel(WARM_QUEUE);
        let mut warmers = self
            .warmers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        warmers.senders.retain(|w| !w.is_closed());
        warmers.senders.push(sender);
        let published = self.current().number;
        let missed = warmers.replacing.filter(|replaced| *replaced == published);
        (receiver, missed)
    }

    /// Offers `next` (made only when some subscription is there to be
    /// offered it) to every subscription and waits (bounded) until each
    /// has subscribed to what it needs from it. The caller publishes
    /// `next` right after.
    pub(crate) async fn warm(&self, next: impl FnOnce() -> BTreeMap<ComponentKey, Instance>) {
        let replaces = self.current().number;
        let senders: Vec<_> = {
            let mut warmers = self
                .warmers
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            warmers.senders.retain(|w| !w.is_closed());
            warmers.replacing = Some(replaces);
            warmers.senders.clone()
        };
        if senders.is_empty() {
            return;
        }
        let next = Arc::new(next());
        let all = async {
            let mut waits = Vec::with_capacity(senders.len());
            let mut full = Vec::new();
            for sender in &senders {
                let (done, wait) = oneshot::channel();
                let request = WarmRequest {
                    next: next.clone(),
                    replaces,
                    _done: done,
                };
                match sender.try_send(request) {
                    Ok(()) => waits.push(wait),
                    Err(mpsc::error::TrySendError::Full(request)) => {
                        full.push((sender, request, wait))
                    }
                    Err(mpsc::error::TrySendError::Closed(_)) => {}
                }
            }
            // A subscription with requests still queued gets this one too.
            for (sender, request, wait) in full {
                if sender.send(request).await.is_ok() {
                    waits.push(wait);
                }
            }
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
