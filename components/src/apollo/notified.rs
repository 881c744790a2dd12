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
//! so does the store, keeping them bounded (see [`ReleaseMessages`]).

use super::release_messages::ReleaseMessages;

/// The long poll's state of one namespace.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Notified {
    /// The notification id to poll with (-1: none yet, or forgotten).
    pub id: i64,
    /// The release messages seen, merged (bounded); sent with every
    /// fetch.
    pub messages: ReleaseMessages,
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
            messages: ReleaseMessages::default(),
            forgotten_from: None,
        }
    }
}

impl Notified {
    /// Takes in `messages` of a notification: merged into those held
    /// (the highest id of each key; at most [`ReleaseMessages`]' bounds).
    pub(crate) fn note(&mut self, messages: &ReleaseMessages) {
        self.messages.merge(messages);
    }

    /// Drops the messages held: a config service refused a fetch carrying
    /// them.
    pub(crate) fn drop_messages(&mut self) {
        self.messages = ReleaseMessages::default();
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn messages(value: serde_json::Value) -> ReleaseMessages {
        serde_json::from_value(value).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn messages_merge_keeping_the_highest_id_of_each_key() {
        let mut notified = Notified::default();
        notified.note(&messages(json!({"details": {"a+default+ns": 5}})));
        notified.note(&messages(
            json!({"details": {"a+default+ns": 3, "a+other+ns": 2}}),
        ));
        assert_eq!(
            notified.messages,
            messages(json!({"details": {"a+default+ns": 5, "a+other+ns": 2}}))
        );
        notified.note(&messages(json!({"details": {"a+default+ns": 9}})));
        assert_eq!(
            notified.messages,
            messages(json!({"details": {"a+default+ns": 9, "a+other+ns": 2}}))
        );
        notified.note(&messages(json!("not the usual shape")));
        assert_eq!(
            notified.messages,
            messages(json!({"details": {"a+default+ns": 9, "a+other+ns": 2}})),
            "another shape is ignored"
        );
        notified.drop_messages();
        assert!(notified.messages.is_empty());
    }

    /// Notifications keep bringing new keys (a misbehaving or hostile
    /// service): what is held, and sent with every fetch, stays bounded.
    #[test]
    fn fresh_keys_without_end_stay_under_the_bounds() {
        use super::super::release_messages::{MAX_ENCODED_BYTES, MAX_ENTRIES};
        let mut notified = Notified::default();
        for round in 0..100 {
            let details: serde_json::Map<String, serde_json::Value> = (0..1_000)
                .map(|n| {
                    (
                        format!("app+default+ns-{round}-{n}"),
                        json!(round * 1_000 + n),
                    )
                })
                .collect();
            notified.note(&messages(json!({ "details": details })));
        }
        assert!(notified.messages.len() <= MAX_ENTRIES);
        let sent = notified.messages.query_text();
        let encoded: String = url_encoded(&sent);
        assert!(encoded.len() <= MAX_ENCODED_BYTES, "{}", encoded.len());
        assert_eq!(
            notified.messages.id("app+default+ns-99-999"),
            Some(99_999),
            "the latest release messages are the ones kept"
        );
    }

    /// `text` as a query value (`reqwest::Url` builds the fetch's query).
    fn url_encoded(text: &str) -> String {
        let mut url = reqwest::Url::parse("http://h/").unwrap_or_else(|e| panic!("{e}"));
        url.query_pairs_mut().append_pair("m", text);
        url.query()
            .unwrap_or_default()
            .trim_start_matches("m=")
            .to_string()
    }

    #[test]
    fn a_forgotten_id_is_handed_to_the_next_one_learnt_once() {
        let mut notified = Notified::default();
        notified.forget();
        assert_eq!(notified.learn(4), None, "nothing was held");
        let held = messages(json!({"details": {"a+default+k": 4}}));
        notified.note(&held);
        notified.forget();
        notified.forget();
        assert_eq!(
            (notified.id, notified.messages.clone()),
            (-1, held),
            "the messages outlive a forgotten id"
        );
        assert_eq!(notified.learn(2), Some(4));
        assert_eq!(notified.learn(3), None);
        notified.reset();
        assert_eq!(notified, Notified::default());
    }
}
