//! The book of open configuration subscriptions, shared by the gRPC
//! streams (`subscriptions`) and the HTTP subscriptions whose updates are
//! posted to the app (`app::config_updates`): each subscription has an id
//! no caller can predict, the store it is on, the connection that opened it
//! (when the protocol has one) and the token that ends it.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use tokio_util::sync::CancellationToken;

/// Why an unsubscribe did nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnsubscribeError {
    /// No open subscription of the caller has that id.
    #[error("subscription `{0}` does not exist")]
    Unknown(String),
    /// The subscription is on another store.
    #[error("subscription `{id}` is not on configuration store `{store}`")]
    OtherStore {
        /// The subscription.
        id: String,
        /// The store named by the caller.
        store: String,
    },
}

/// A subscription was not opened: this many are open, the most allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Full(pub(crate) usize);

/// The open subscriptions, by id.
pub(crate) struct OpenSubscriptions {
    next: AtomicU64,
    ids: std::collections::hash_map::RandomState,
    open: Mutex<HashMap<String, Open>>,
    shutdown: CancellationToken,
    max: usize,
}

struct Open {
    store: String,
    owner: Option<SocketAddr>,
    cancel: CancellationToken,
}

impl OpenSubscriptions {
    /// None open yet; at most `max` at once; all end when `shutdown` is
    /// cancelled.
    pub(crate) fn new(shutdown: CancellationToken, max: usize) -> Self {
        Self {
            next: AtomicU64::new(0),
            ids: std::collections::hash_map::RandomState::new(),
            open: Mutex::new(HashMap::new()),
            shutdown,
            max,
        }
    }

    /// Books a new subscription on `store` for `owner` (only that caller
    /// may close it): its id (`{store}-` and 128 unpredictable bits) and
    /// the token cancelled when it is closed or the server shuts down.
    pub(crate) fn add(
        &self,
        store: &str,
        owner: Option<SocketAddr>,
    ) -> Result<(String, CancellationToken), Full> {
        let id = format!("{store}-{}", self.unguessable());
        let cancel = self.shutdown.child_token();
        let mut open = self.lock();
        if open.len() >= self.max {
            return Err(Full(open.len()));
        }
        let entry = Open {
            store: store.to_string(),
            owner,
            cancel: cancel.clone(),
        };
        open.insert(id.clone(), entry);
        Ok((id, cancel))
    }

    /// Ends subscription `id` for `caller`; when `store` is not empty it
    /// must be the subscription's store. Another caller is told the id
    /// does not exist.
    pub(crate) fn close(
        &self,
        store: &str,
        id: &str,
        caller: Option<SocketAddr>,
    ) -> Result<(), UnsubscribeError> {
        let mut open = self.lock();
        match open.get(id) {
            None => return Err(UnsubscribeError::Unknown(id.to_string())),
            Some(o) if o.owner != caller => return Err(UnsubscribeError::Unknown(id.to_string())),
            Some(o) if !store.is_empty() && o.store != store => {
                return Err(UnsubscribeError::OtherStore {
                    id: id.to_string(),
                    store: store.to_string(),
                })
            }
            Some(_) => {}
        }
        if let Some(o) = open.remove(id) {
            o.cancel.cancel();
        }
        Ok(())
    }

    /// Forgets subscription `id` (it has ended).
    pub(crate) fn forget(&self, id: &str) {
        self.lock().remove(id);
    }

    /// How many are open.
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }

    /// 128 bits no caller can predict (SipHash keyed by the OS's random
    /// source, over a counter).
    fn unguessable(&self) -> String {
        let number = self.next.fetch_add(1, Ordering::Relaxed);
        let half = |salt: u64| {
            let mut hasher = self.ids.build_hasher();
            hasher.write_u64(number);
            hasher.write_u64(salt);
            hasher.finish()
        };
        format!("{:016x}{:016x}", half(1), half(2))
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Open>> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unpredictable_bounded_in_number_and_closed_only_by_their_owner() {
        let book = OpenSubscriptions::new(CancellationToken::new(), 2);
        let owner: SocketAddr = "127.0.0.1:4000".parse().expect("addr");
        let other: SocketAddr = "127.0.0.1:4001".parse().expect("addr");
        let (one, one_cancel) = book.add("config", Some(owner)).expect("first");
        let (two, _) = book.add("config", Some(owner)).expect("second");
        assert_ne!(one, two);
        assert!(one.len() >= "config-".len() + 32, "{one}");
        assert_eq!(book.add("config", None).err(), Some(Full(2)));
        assert_eq!(
            book.close("config", &one, Some(other)),
            Err(UnsubscribeError::Unknown(one.clone()))
        );
        assert_eq!(
            book.close("other", &one, Some(owner)),
            Err(UnsubscribeError::OtherStore {
                id: one.clone(),
                store: "other".into()
            })
        );
        assert!(!one_cancel.is_cancelled());
        assert_eq!(book.close("", &one, Some(owner)), Ok(()));
        assert!(one_cancel.is_cancelled());
        assert_eq!(book.len(), 1);
        book.forget(&two);
        assert_eq!(book.len(), 0);
    }

    #[test]
    fn shutdown_cancels_every_subscription() {
        let shutdown = CancellationToken::new();
        let book = OpenSubscriptions::new(shutdown.clone(), 8);
        let (_, cancel) = book.add("config", None).expect("add");
        shutdown.cancel();
        assert!(cancel.is_cancelled());
    }
}
