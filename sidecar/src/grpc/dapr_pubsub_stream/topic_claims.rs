//! One open stream per pub/sub and topic, as Dapr's streamer and Layotto
//! keep (`already subscribed to pubsub "<pubsub>" topic "<topic>"`): a
//! second stream would hold a second broker subscription, and with a
//! broker that fans out (the memory broker, Redis pub/sub) the app would
//! get each event twice.
//!
//! A stream holds its topic until it *ends* (its [`StreamEnd`] is closed:
//! the client left, or the server ended it), not until everything it
//! started is let go of: events still being settled on its broker
//! subscription may overlap briefly with the next stream's. So a client
//! that closes its stream and subscribes again (the Dapr SDKs do, the Go
//! one right after `UNAVAILABLE`) is not refused `ALREADY_EXISTS`, which
//! the SDKs take as fatal.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;
use tonic::Status;

use super::super::endable_stream::StreamEnd;

/// How long a new stream waits for the open stream holding its topic to
/// end before it is refused. A client's close and its next subscribe can
/// reach the sidecar together, the new stream read before the old one's
/// end is: the old one is then given this long to be seen closed. A
/// second stream while the first stays open is refused after it.
pub(super) const HOLDER_GRACE: Duration = Duration::from_secs(2);

/// The stream holding a pub/sub and topic.
struct Holder {
    /// Which claim it is (a late release must not free a later holder).
    id: u64,
    /// Closed once the stream ended: its topic is then free.
    end: StreamEnd,
}

type Held = Mutex<HashMap<(String, String), Holder>>;

/// The pub/sub and topic pairs an open stream holds, Dapr's
/// `SubscribeTopicEventsAlpha1` and Layotto's `SubscribeTopicEvents`
/// together.
#[derive(Clone, Default)]
pub(super) struct TopicClaims {
    held: Arc<Held>,
    next_id: Arc<AtomicU64>,
}

/// A stream's hold on its pub/sub and topic: let go of when dropped, and
/// no longer in anyone's way once its stream ended
/// ([`TopicClaim::release_when_ended`] drops it then).
pub(super) struct TopicClaim {
    held: Arc<Held>,
    key: (String, String),
    id: u64,
    end: StreamEnd,
}

impl TopicClaims {
    /// The hold on `topic` of `pubsub` for the stream ending with `end`.
    /// A holder whose stream ended is taken over at once; an open one is
    /// waited for up to [`HOLDER_GRACE`] (woken as soon as it ends), then
    /// `ALREADY_EXISTS` with Dapr's message.
    pub(super) async fn claim(
        &self,
        pubsub: &str,
        topic: &str,
        end: &StreamEnd,
    ) -> Result<TopicClaim, Status> {
        let key = (pubsub.to_owned(), topic.to_owned());
        let deadline = Instant::now() + HOLDER_GRACE;
        loop {
            let holder_end = {
                let mut held = lock(&self.held);
                match held.get(&key) {
                    Some(holder) if !holder.end.is_closed() => holder.end.clone(),
                    // Free, or its stream ended (its release may come
                    // later: it then leaves this claim alone).
                    _ => {
                        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
                        let end = end.clone();
                        let holder = Holder {
                            id,
                            end: end.clone(),
                        };
                        held.insert(key.clone(), holder);
                        return Ok(TopicClaim {
                            held: Arc::clone(&self.held),
                            key,
                            id,
                            end,
                        });
                    }
                }
            };
            if Instant::now() >= deadline {
                // Dapr's error is a plain Go one (`UNKNOWN` to the
                // client): `ALREADY_EXISTS` says what it is, and is no
                // code an SDK retries at once.
                return Err(Status::already_exists(format!(
                    "already subscribed to pubsub {pubsub:?} topic {topic:?}: one stream per \
                     pub/sub and topic may be open (SubscribeTopicEventsAlpha1 and Layotto's \
                     SubscribeTopicEvents together); close the open one first"
                )));
            }
            let _ = tokio::time::timeout_at(deadline, holder_end.closed()).await;
        }
    }
}

impl TopicClaim {
    /// Holds the topic until the stream ends, then lets go of it.
    pub(super) async fn release_when_ended(self) {
        self.end.closed().await;
    }
}

impl Drop for TopicClaim {
    fn drop(&mut self) {
        let mut held = lock(&self.held);
        if held
            .get(&self.key)
            .is_some_and(|holder| holder.id == self.id)
        {
            held.remove(&self.key);
        }
    }
}

fn lock(held: &Held) -> MutexGuard<'_, HashMap<(String, String), Holder>> {
    held.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `claims`' hold on topic `orders` of `bus` for a stream of its own
    /// (its end returned with it).
    async fn claim_orders(claims: &TopicClaims) -> Result<(TopicClaim, StreamEnd), Status> {
        let end = StreamEnd::default();
        let claim = claims.claim("bus", "orders", &end).await?;
        Ok((claim, end))
    }

    #[tokio::test(start_paused = true)]
    async fn a_held_topic_is_refused_with_daprs_message_until_let_go_of() {
        let claims = TopicClaims::default();
        let held = claim_orders(&claims).await.expect("the first");
        let asked = Instant::now();
        let refused = claim_orders(&claims).await.err().expect("a second");
        assert_eq!(asked.elapsed(), HOLDER_GRACE, "refused after the grace");
        assert_eq!(refused.code(), tonic::Code::AlreadyExists);
        assert!(
            refused
                .message()
                .starts_with(r#"already subscribed to pubsub "bus" topic "orders""#),
            "{}",
            refused.message()
        );
        let other = StreamEnd::default();
        let _other_topic = (claims.claim("bus", "payments", &other).await).expect("another topic");
        let _other_pubsub =
            (claims.claim("queue", "orders", &other).await).expect("another pub/sub");
        drop(held);
        assert!(claim_orders(&claims).await.is_ok(), "let go of");
    }

    #[tokio::test(start_paused = true)]
    async fn a_topic_whose_stream_ended_is_taken_at_once_and_its_late_release_frees_nothing() {
        let claims = TopicClaims::default();
        let (first, first_end) = claim_orders(&claims).await.expect("the first");
        first_end.close();
        let asked = Instant::now();
        let (_second, _second_end) = claim_orders(&claims)
            .await
            .expect("the first stream ended: its topic is free");
        assert_eq!(asked.elapsed(), Duration::ZERO, "not waited for");
        // The first stream's release comes late (its events still settled).
        first.release_when_ended().await;
        let refused = claim_orders(&claims)
            .await
            .err()
            .expect("the second holds it");
        assert_eq!(refused.code(), tonic::Code::AlreadyExists);
    }

    #[tokio::test(start_paused = true)]
    async fn a_claimant_waits_for_an_open_holder_that_ends_within_the_grace() {
        let claims = TopicClaims::default();
        let (first, first_end) = claim_orders(&claims).await.expect("the first");
        let released = tokio::spawn(first.release_when_ended());
        let ending = tokio::spawn(async move {
            tokio::time::sleep(HOLDER_GRACE / 4).await;
            first_end.close();
        });
        let asked = Instant::now();
        claim_orders(&claims)
            .await
            .expect("the first ended within the grace");
        assert_eq!(asked.elapsed(), HOLDER_GRACE / 4, "taken as it ended");
        ending.await.expect("ended");
        released.await.expect("released");
    }
}
