//! One open stream per pub/sub and topic, as Dapr's streamer and Layotto
//! keep (`already subscribed to pubsub "<pubsub>" topic "<topic>"`): a
//! second stream would hold a second broker subscription, and with a
//! broker that fans out (the memory broker, Redis pub/sub) the app would
//! get each event twice.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use tonic::Status;

/// The pub/sub and topic pairs an open stream holds, Dapr's
/// `SubscribeTopicEventsAlpha1` and Layotto's `SubscribeTopicEvents`
/// together.
#[derive(Clone, Default)]
pub(super) struct TopicClaims {
    held: Arc<Mutex<HashSet<(String, String)>>>,
}

/// A stream's hold on its pub/sub and topic: let go of when dropped.
pub(super) struct TopicClaim {
    held: Arc<Mutex<HashSet<(String, String)>>>,
    key: (String, String),
}

impl TopicClaims {
    /// The hold on `topic` of `pubsub`; `ALREADY_EXISTS` with Dapr's
    /// message while another stream holds it.
    pub(super) fn claim(&self, pubsub: &str, topic: &str) -> Result<TopicClaim, Status> {
        let key = (pubsub.to_owned(), topic.to_owned());
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        if held.contains(&key) {
            // Dapr's error is a plain Go one (`UNKNOWN` to the client):
            // `ALREADY_EXISTS` says what it is, and is no code an SDK
            // retries at once.
            return Err(Status::already_exists(format!(
                "already subscribed to pubsub {pubsub:?} topic {topic:?}: one stream per \
                 pub/sub and topic may be open (SubscribeTopicEventsAlpha1 and Layotto's \
                 SubscribeTopicEvents together); close the open one first"
            )));
        }
        held.insert(key.clone());
        Ok(TopicClaim {
            held: Arc::clone(&self.held),
            key,
        })
    }
}

impl Drop for TopicClaim {
    fn drop(&mut self) {
        self.held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_topic_is_refused_with_daprs_message_until_let_go_of() {
        let claims = TopicClaims::default();
        let held = claims.claim("bus", "orders").expect("the first");
        let refused = claims.claim("bus", "orders").err().expect("a second");
        assert_eq!(refused.code(), tonic::Code::AlreadyExists);
        assert!(
            refused
                .message()
                .starts_with(r#"already subscribed to pubsub "bus" topic "orders""#),
            "{}",
            refused.message()
        );
        let _other_topic = claims.claim("bus", "payments").expect("another topic");
        let _other_pubsub = claims.claim("queue", "orders").expect("another pub/sub");
        drop(held);
        assert!(claims.claim("bus", "orders").is_ok(), "let go of");
    }
}
