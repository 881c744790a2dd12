//! [`Notified`]: what the long poll told the store about one namespace —
//! the notification id to poll with, and the release messages to send
//! with every fetch of it.
//!
//! The messages (`{"details": {"app+cluster+ns": id}}`) tell a config
//! service which release message the client has seen: one whose release
//! cache (Apollo's `ConfigServiceWithCache`) predates it reloads the cache
//! instead of answering an older release (or a 304 for it). The Java
//! client keeps them per namespace, merged (`mergeFrom`: the highest id of
//! each key), and sends them with every fetch, the periodic one included;
//! so does the store.

use serde_json::Value;

/// The long poll's state of one namespace.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Notified {
    /// The notification id to poll with (-1: none yet, or forgotten).
    pub id: i64,
    /// The release messages seen, merged; sent with every fetch.
    pub messages: Option<Value>,
    /// The id held when a release the poll had not announced (yet) made
    /// the store forget it: the next id learnt is compared with it, to
    /// tell a service whose ids are below ours from a poll that was just
    /// late.
    pub forgotten_from: Option<i64>,
}

impl Default for Notified {
    fn default() -> Self {
        Self {
            id: -1,
            messages: None,
            forgotten_from: None,
        }
    }
}

impl Notified {
    /// Takes in `messages` of a notification: merged into those held.
    pub(crate) fn note(&mut self, messages: &Value) {
        self.messages = Some(match self.messages.take() {
            Some(held) => merged(held, messages),
            None => messages.clone(),
        });
    }

    /// Forgets the id (back to -1), remembering the id held, if any, for
    /// [`learn`](Self::learn). The messages are kept: a notification
    /// merged while the fetch that forgets was under way must still go
    /// with the next fetch, or a lagging instance may answer it an older
    /// release. Messages above another Apollo's ids only make it reload
    /// its release cache.
    pub(crate) fn forget(&mut self) {
        if self.id >= 0 {
            self.forgotten_from = Some(self.id);
        }
        self.id = -1;
    }

    /// Forgets everything, messages included: the store moved to other
    /// instances.
    pub(crate) fn reset(&mut self) {
        *self = Self::default();
    }

    /// Takes `id`, learnt from the long poll; returns the id held before
    /// [`forget`](Self::forget), if it was forgotten since the last one.
    pub(crate) fn learn(&mut self, id: i64) -> Option<i64> {
        self.id = id;
        self.forgotten_from.take()
    }
}

/// `held` and `new` merged as the Java client's
/// `ApolloNotificationMessages.mergeFrom`: each key of `details` keeps the
/// highest id. Anything else than that shape is taken as `new`.
fn merged(mut held: Value, new: &Value) -> Value {
    let (Some(held_details), Some(new_details)) = (
        held.get_mut("details").and_then(Value::as_object_mut),
        new.get("details").and_then(Value::as_object),
    ) else {
        return new.clone();
    };
    for (key, id) in new_details {
        let higher = match (held_details.get(key).and_then(Value::as_i64), id.as_i64()) {
            (Some(old), Some(new)) => new > old,
            _ => true,
        };
        if higher {
            held_details.insert(key.clone(), id.clone());
        }
    }
    held
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn messages_merge_keeping_the_highest_id_of_each_key() {
        let mut notified = Notified::default();
        notified.note(&json!({"details": {"a+default+ns": 5}}));
        notified.note(&json!({"details": {"a+default+ns": 3, "a+other+ns": 2}}));
        assert_eq!(
            notified.messages,
            Some(json!({"details": {"a+default+ns": 5, "a+other+ns": 2}}))
        );
        notified.note(&json!({"details": {"a+default+ns": 9}}));
        assert_eq!(
            notified.messages,
            Some(json!({"details": {"a+default+ns": 9, "a+other+ns": 2}}))
        );
        notified.note(&json!("not the usual shape"));
        assert_eq!(notified.messages, Some(json!("not the usual shape")));
    }

    #[test]
    fn a_forgotten_id_is_handed_to_the_next_one_learnt_once() {
        let mut notified = Notified::default();
        notified.forget();
        assert_eq!(notified.learn(4), None, "nothing was held");
        notified.note(&json!({"details": {"k": 4}}));
        notified.forget();
        notified.forget();
        assert_eq!(
            (notified.id, notified.messages.clone()),
            (-1, Some(json!({"details": {"k": 4}}))),
            "the messages outlive a forgotten id"
        );
        assert_eq!(notified.learn(2), Some(4));
        assert_eq!(notified.learn(3), None);
        notified.reset();
        assert_eq!(notified, Notified::default());
    }
}
