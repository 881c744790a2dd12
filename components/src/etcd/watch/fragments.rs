//! [`Fragments`]: joins the fragments of one watch response.
//!
//! The watch asks for `fragment`: etcd then splits a response larger than
//! its own limit on a request (`--max-request-bytes`, 1.5 MiB by default)
//! into several, each but the last flagged `fragment`, rather than send a
//! catch-up on many revisions as one answer of any size. The events of one
//! revision (a transaction) may span fragments, so the task applies them
//! only once the last one arrived; they are held up to `maxResponseBytes`
//! in all, what one unfragmented answer may take.

use rewire_etcd::pb::WatchResponse;

/// The fragments of the response being received, and the bound on them.
#[derive(Debug)]
pub(crate) struct Fragments {
    /// The fragments received so far, their events joined.
    joined: Option<WatchResponse>,
    /// The size of the events in `joined`, in bytes.
    bytes: usize,
    /// The most `bytes` may reach (`maxResponseBytes`).
    limit: usize,
}

/// The joined fragments would exceed the limit: their size so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OverLimit {
    /// The size of the events received, in bytes.
    pub(crate) bytes: usize,
    /// The limit they passed.
    pub(crate) limit: usize,
}

impl Fragments {
    /// Joins fragments of up to `limit` bytes of events in all.
    pub(crate) fn new(limit: usize) -> Self {
        Self {
            joined: None,
            bytes: 0,
            limit,
        }
    }

    /// Adds `response`: the whole response once its last fragment (or an
    /// unfragmented response) arrived, `None` while more are to come, an
    /// error (and nothing held) once the events exceed the limit.
    pub(crate) fn join(
        &mut self,
        response: WatchResponse,
    ) -> Result<Option<WatchResponse>, OverLimit> {
        if self.joined.is_none() && !response.fragment {
            return Ok(Some(response));
        }
        self.bytes = self.bytes.saturating_add(events_size(&response));
        if self.bytes > self.limit {
            let over = OverLimit {
                bytes: self.bytes,
                limit: self.limit,
            };
            self.joined = None;
            self.bytes = 0;
            return Err(over);
        }
        let last = !response.fragment;
        match &mut self.joined {
            Some(joined) => joined.events.extend(response.events),
            None => self.joined = Some(response),
        }
        if !last {
            return Ok(None);
        }
        self.bytes = 0;
        let mut whole = self.joined.take();
        if let Some(whole) = &mut whole {
            whole.fragment = false;
        }
        Ok(whole)
    }
}

/// The bytes of keys and values the events of `response` carry.
fn events_size(response: &WatchResponse) -> usize {
    response
        .events
        .iter()
        .flat_map(|event| [&event.kv, &event.prev_kv])
        .flatten()
        .map(|kv| kv.key.len() + kv.value.len())
        .sum()
}

#[cfg(test)]
mod tests {
    use rewire_etcd::pb::{Event, KeyValue, WatchResponse};

    use super::{Fragments, OverLimit};

    /// A response with one put of `value` at `revision`.
    fn response(revision: i64, value: &str, fragment: bool) -> WatchResponse {
        let kv = KeyValue {
            key: b"k".to_vec(),
            value: value.as_bytes().to_vec(),
            mod_revision: revision,
            ..KeyValue::default()
        };
        WatchResponse {
            events: vec![Event {
                kv: Some(kv),
                ..Event::default()
            }],
            fragment,
            ..WatchResponse::default()
        }
    }

    fn revisions(response: &WatchResponse) -> Vec<i64> {
        let kvs = response.events.iter().filter_map(|e| e.kv.as_ref());
        kvs.map(|kv| kv.mod_revision).collect()
    }

    #[test]
    fn an_unfragmented_response_passes_as_is() {
        let mut fragments = Fragments::new(4);
        let whole = fragments.join(response(5, "a large value", false));
        assert_eq!(revisions(&whole.unwrap().unwrap()), [5]);
    }

    #[test]
    fn fragments_are_joined_until_the_last_one() {
        let mut fragments = Fragments::new(100);
        assert_eq!(fragments.join(response(5, "a", true)), Ok(None));
        assert_eq!(fragments.join(response(6, "b", true)), Ok(None));
        let whole = fragments.join(response(7, "c", false)).unwrap().unwrap();
        assert_eq!(revisions(&whole), [5, 6, 7]);
        assert!(!whole.fragment);
        // The next response starts afresh.
        let next = fragments.join(response(8, "d", false)).unwrap().unwrap();
        assert_eq!(revisions(&next), [8]);
    }

    #[test]
    fn fragments_over_the_limit_in_all_are_refused_and_dropped() {
        let mut fragments = Fragments::new(5);
        assert_eq!(fragments.join(response(5, "abc", true)), Ok(None));
        let over = fragments.join(response(6, "abc", false));
        assert_eq!(over, Err(OverLimit { bytes: 8, limit: 5 }));
        let next = fragments.join(response(7, "abc", false)).unwrap().unwrap();
        assert_eq!(revisions(&next), [7]);
    }
}
