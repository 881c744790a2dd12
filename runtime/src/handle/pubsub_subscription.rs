//! Pub/sub subscriptions through a [`PubSubHandle`] that follow the broker
//! across reloads without losing a message.
//!
//! A forwarder task owns the subscriptions it made on broker instances
//! (its *sources*) and hands their deliveries on unchanged, so each
//! acknowledgement goes back to the instance that made the delivery. When
//! a reload rebuilds the broker:
//!
//! 1. before the publish ([`warm`](super::warm)) the forwarder subscribes
//!    to the new instance, while the old one still takes every publish;
//! 2. at the publish, the old source is asked to drain: it delivers what it
//!    holds (read but unsettled, and what was published to it, including
//!    publishes still under way) and ends;
//! 3. a source still draining after [`DRAIN_GRACE`] is stopped; it is let
//!    go once its broker closes its side, or [`STOP_GRACE`] later.

use std::future::poll_fn;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::warm::WarmRequest;
use super::{Instance, PubSubHandle};
use crate::kinds::{Delivery, PubSub, PubSubError, PubSubSubscription, SubscribeRequest};

/// Deliveries a handle subscription buffers for its subscriber.
pub const HANDLE_SUBSCRIPTION_BUFFER: usize = 64;
/// How long a replaced broker may take to deliver what it holds.
pub const DRAIN_GRACE: Duration = Duration::from_secs(5);
/// How long a stopped broker may take to close its side.
pub const STOP_GRACE: Duration = Duration::from_secs(2);

fn same_broker(a: &Arc<dyn PubSub>, b: &Arc<dyn PubSub>) -> bool {
    std::ptr::addr_eq(Arc::as_ptr(a), Arc::as_ptr(b))
}

impl PubSubHandle {
    /// Subscribes through the handle: the subscription keeps delivering
    /// across reloads that update or rebuild the broker (see the module
    /// docs). It ends when the broker is removed, the runtime stops, or
    /// the subscription is dropped.
    pub async fn subscribe(
        &self,
        req: SubscribeRequest,
    ) -> Result<PubSubSubscription, PubSubError> {
        let live = self
            .0
            .live()
            .cloned()
            .ok_or_else(|| PubSubError::Backend("handle not injected".into()))?;
        // Taken before the broker is loaded: a generation published or
        // warmed from here on is seen by the forwarder.
        let published = live.changes();
        let warm = live.warmer();
        let broker = self
            .load()
            .map_err(|e| PubSubError::Backend(e.to_string()))?;
        let subscription = broker.subscribe(req.clone()).await?;
        let (outer, feed) = PubSubSubscription::channel(HANDLE_SUBSCRIPTION_BUFFER);
        let forwarder = Forwarder {
            handle: self.clone(),
            req,
            current: Source::new(broker, subscription),
            warmed: None,
            draining: Vec::new(),
            feed,
        };
        tokio::spawn(forwarder.run(published, warm));
        Ok(outer)
    }
}

/// A subscription on one broker instance.
struct Source {
    broker: Arc<dyn PubSub>,
    subscription: PubSubSubscription,
    /// When draining: when it is stopped, then when it is let go.
    stop_at: Option<Instant>,
    stopped: bool,
}

impl Source {
    fn new(broker: Arc<dyn PubSub>, subscription: PubSubSubscription) -> Self {
        Self {
            broker,
            subscription,
            stop_at: None,
            stopped: false,
        }
    }
}

struct Forwarder {
    handle: PubSubHandle,
    req: SubscribeRequest,
    current: Source,
    warmed: Option<Source>,
    draining: Vec<Source>,
    feed: crate::kinds::SubscriptionFeed,
}

/// What woke the forwarder.
enum Event {
    Delivery(Delivery),
    /// Source `index` (0: current, 1: warmed, 2..: draining) ended.
    Ended(usize),
    Published,
    Warm(WarmRequest),
    Deadline,
    Leave,
}

impl Forwarder {
    async fn run(
        mut self,
        mut published: watch::Receiver<u64>,
        mut warm: mpsc::Receiver<WarmRequest>,
    ) {
        let mut pending: Option<Delivery> = None;
        loop {
            let deadline = self.next_deadline();
            let event = tokio::select! {
                biased;
                () = self.feed.stopped() => Event::Leave,
                changed = published.changed() => match changed {
                    Ok(()) => Event::Published,
                    Err(_) => Event::Leave,
                },
                Some(request) = warm.recv() => Event::Warm(request),
                () = sleep_until(deadline) => Event::Deadline,
                permit = self.feed.sender().reserve(), if pending.is_some() => match (permit, pending.take()) {
                    (Ok(permit), Some(delivery)) => { permit.send(delivery); continue; }
                    _ => Event::Leave,
                },
                event = next_delivery(&mut self.current, &mut self.warmed, &mut self.draining), if pending.is_none() => event,
            };
            match event {
                Event::Delivery(delivery) => pending = Some(delivery),
                Event::Ended(index) => {
                    if !self.ended(index).await {
                        return;
                    }
                }
                Event::Published => {
                    if !self.follow().await {
                        return;
                    }
                }
                Event::Warm(request) => self.warm(&request).await,
                Event::Deadline => self.expire(),
                Event::Leave => return,
            }
        }
    }
    /// A source ended. A draining one is let go; the current one ending
    /// means the broker was replaced (follow it) or gave up (end too).
    async fn ended(&mut self, index: usize) -> bool {
        match index {
            0 => {
                let replaced = self
                    .handle
                    .load()
                    .is_ok_and(|now| !same_broker(&now, &self.current.broker));
                if !replaced {
                    tracing::warn!(topic = %self.req.topic, "Pub/sub subscription ended by its broker.");
                    return false;
                }
                self.follow().await
            }
            1 => {
                self.warmed = None;
                true
            }
            i => {
                self.draining.remove(i - 2);
                true
            }
        }
    }

    /// Subscribes to the instance about to be published, if it is a new
    /// one; the current source keeps serving until the publish.
    async fn warm(&mut self, request: &WarmRequest) {
        let Some(key) = self.handle.key() else { return };
        let Some(Instance::PubSub(next)) = request.next.get(key) else {
            return;
        };
        let known = same_broker(next, &self.current.broker)
            || self
                .warmed
                .as_ref()
                .is_some_and(|w| same_broker(next, &w.broker));
        if known {
            return;
        }
        match next.subscribe(self.req.clone()).await {
            Ok(subscription) => self.warmed = Some(Source::new(next.clone(), subscription)),
            Err(err) => {
                tracing::warn!(topic = %self.req.topic, error = %err, "Subscribing to a rebuilt broker before its publish failed; retried at the publish.");
            }
        }
    }

    /// After a publish: moves to the broker now serving and drains the
    /// one it replaced. False when the subscription should end.
    async fn follow(&mut self) -> bool {
        let Ok(now) = self.handle.load() else {
            return false;
        };
        if same_broker(&now, &self.current.broker) {
            return true;
        }
        let next = match self.warmed.take() {
            Some(warmed) if same_broker(&warmed.broker, &now) => warmed,
            stale => {
                if let Some(stale) = stale {
                    self.retire(stale);
                }
                match now.subscribe(self.req.clone()).await {
                    Ok(subscription) => Source::new(now, subscription),
                    Err(err) => {
                        tracing::warn!(topic = %self.req.topic, error = %err, "Subscribing to a rebuilt broker failed; subscription ended.");
                        return false;
                    }
                }
            }
        };
        let old = std::mem::replace(&mut self.current, next);
        self.retire(old);
        tracing::info!(topic = %self.req.topic, "Pub/sub subscription moved to the rebuilt broker; the old one drains.");
        true
    }

    fn retire(&mut self, source: Source) {
        source.subscription.drain();
        self.draining.push(Source {
            stop_at: Some(Instant::now() + DRAIN_GRACE),
            ..source
        });
    }

    fn next_deadline(&self) -> Option<Instant> {
        self.draining.iter().filter_map(|s| s.stop_at).min()
    }

    /// Stops sources past their drain grace; lets go of stopped ones past
    /// their stop grace.
    fn expire(&mut self) {
        let now = Instant::now();
        self.draining.retain_mut(|source| match source.stop_at {
            Some(at) if at <= now && source.stopped => {
                tracing::warn!("A replaced broker did not close its subscription in time; let go.");
                false
            }
            Some(at) if at <= now => {
                tracing::warn!(grace = ?DRAIN_GRACE, "A replaced broker was still draining after the grace; stopped.");
                source.subscription.stop();
                source.stopped = true;
                source.stop_at = Some(now + STOP_GRACE);
                true
            }
            _ => true,
        });
    }
}

/// The next delivery of any source, or which source ended.
async fn next_delivery(
    current: &mut Source,
    warmed: &mut Option<Source>,
    draining: &mut [Source],
) -> Event {
    let has_warmed = usize::from(warmed.is_some());
    poll_fn(|cx| {
        let sources = std::iter::once(&mut *current)
            .chain(warmed.iter_mut())
            .chain(draining.iter_mut());
        for (i, source) in sources.enumerate() {
            let index = match i {
                0 => 0,
                i if i <= has_warmed => 1,
                i => i + 1 - has_warmed,
            };
            match source.subscription.deliveries.poll_recv(cx) {
                Poll::Ready(Some(delivery)) => return Poll::Ready(Event::Delivery(delivery)),
                Poll::Ready(None) => return Poll::Ready(Event::Ended(index)),
                Poll::Pending => {}
            }
        }
        Poll::Pending
    })
    .await
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
