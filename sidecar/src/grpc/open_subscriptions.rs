//! The book of open configuration subscriptions, shared by the gRPC
//! streams (`subscriptions`) and the HTTP subscriptions whose updates are
//! posted to the app (`app::config_updates`): each subscription has an id
//! no caller can predict, the store it is on, the connection that opened it
//! (when the protocol has one) and the token that ends it.
//!
//! Any caller holding the id may close the subscription, as Dapr lets it:
//! the id's 128 unpredictable bits are what guards it, not the connection.
//! A client's channel may spread its calls over several HTTP/2
//! connections (a pooled channel, a proxy), so the unsubscribe often comes
//! on another connection than the subscribe did.
//!
//! A place is booked before the subscription is started ([`Booking`]) and
//! held by one owner from then on: the booking, given back when dropped
//! unstarted, then the started subscription's [`Place`], given back when
//! its task ends.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use rewire_runtime::echoed;
use tokio_util::sync::CancellationToken;

/// Why an unsubscribe did nothing (the caller's id and store quoted as
/// [`echoed`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnsubscribeError {
    /// No open subscription has that id.
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
    open: Arc<Mutex<HashMap<String, Open>>>,
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
            open: Arc::new(Mutex::new(HashMap::new())),
            shutdown,
            max,
        }
    }

    /// Books a new subscription on `store` opened by `owner` (any caller
    /// holding the id may close it, see [`close`](Self::close)): its id
    /// (`{store}-` and 128 unpredictable bits) and the token cancelled when
    /// it is closed or the server shuts down. The place is given back when
    /// the booking is dropped unstarted.
    pub(crate) fn add(&self, store: &str, owner: Option<SocketAddr>) -> Result<Booking, Full> {
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
        Ok(Booking {
            place: Place {
                open: Arc::clone(&self.open),
                id,
            },
            store: store.to_string(),
            cancel,
        })
    }

    /// Ends subscription `id`, asked by the connection `caller`; when
    /// `store` is not empty it must be the subscription's store. Any
    /// caller may close it (the id is the secret, as in Dapr): a client's
    /// calls may come over several connections. Its place is free at once
    /// (the give-back of its [`Place`] then finds nothing left).
    pub(crate) fn close(
        &self,
        store: &str,
        id: &str,
        caller: Option<SocketAddr>,
    ) -> Result<(), UnsubscribeError> {
        let mut open = self.lock();
        let Some(found) = open.get(id) else {
            return Err(UnsubscribeError::Unknown(echoed(id).into_owned()));
        };
        if !store.is_empty() && found.store != store {
            return Err(UnsubscribeError::OtherStore {
                id: echoed(id).into_owned(),
                store: echoed(store).into_owned(),
            });
        }
        if found.owner != caller {
            // The id is one of ours (found above), so safe to log whole.
            tracing::debug!(id, owner = ?found.owner, ?caller, "Configuration subscription closed from another connection than the one that opened it.");
        }
        if let Some(o) = open.remove(id) {
            o.cancel.cancel();
        }
        Ok(())
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
        lock(&self.open)
    }
}

/// The open subscriptions, even if a holder of the lock panicked.
fn lock(open: &Mutex<HashMap<String, Open>>) -> MutexGuard<'_, HashMap<String, Open>> {
    open.lock().unwrap_or_else(|p| p.into_inner())
}

/// A place booked for a subscription not started yet: given back when
/// dropped, unless [`started`](Self::started) (its [`Place`] then goes
/// with the subscription).
#[must_use = "a booking dropped gives its place back"]
pub(crate) struct Booking {
    place: Place,
    store: String,
    cancel: CancellationToken,
}

impl Booking {
    /// Starts the subscription in this place: its id, store and token, and
    /// the place, which its task holds until it ends.
    pub(crate) fn started(self) -> Started {
        Started {
            id: self.place.id.clone(),
            store: self.store,
            cancel: self.cancel,
            place: self.place,
        }
    }
}

/// A subscription started in a booked place.
pub(crate) struct Started {
    /// Its id.
    pub(crate) id: String,
    /// The store it is on.
    pub(crate) store: String,
    /// Cancelled when it is closed or the server shuts down.
    pub(crate) cancel: CancellationToken,
    /// Its place, given back when dropped: hold it until it ends.
    pub(crate) place: Place,
}

/// A subscription's place among the open ones: given back (the id
/// forgotten) when dropped. Closing the subscription removes it too; the
/// give-back then finds nothing left.
#[must_use = "a place dropped is given back"]
pub(crate) struct Place {
    open: Arc<Mutex<HashMap<String, Open>>>,
    id: String,
}

impl Drop for Place {
    fn drop(&mut self) {
        lock(&self.open).remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unpredictable_bounded_in_number_and_checked_against_their_store() {
        let book = OpenSubscriptions::new(CancellationToken::new(), 2);
        let owner: SocketAddr = "127.0.0.1:4000".parse().expect("addr");
        let Started {
            id: one,
            cancel: one_cancel,
            place: _one,
            ..
        } = book.add("config", Some(owner)).expect("first").started();
        let two = book.add("config", Some(owner)).expect("second").started();
        assert_ne!(one, two.id);
        assert!(one.len() >= "config-".len() + 32, "{one}");
        assert_eq!(book.add("config", None).err(), Some(Full(2)));
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
        assert_eq!(
            book.close("", &one, Some(owner)),
            Err(UnsubscribeError::Unknown(one.clone()))
        );
        drop(two);
        assert_eq!(book.len(), 0);
    }

    /// A client whose calls spread over several connections (a pooled
    /// channel, a proxy) subscribes on one and unsubscribes on another:
    /// the subscription ends and its place is free, as in Dapr (failed
    /// before the fix: told the id does not exist, and it kept
    /// delivering).
    #[test]
    fn any_connection_holding_the_id_closes_the_subscription() {
        let book = OpenSubscriptions::new(CancellationToken::new(), 1);
        let subscriber: SocketAddr = "127.0.0.1:4000".parse().expect("addr");
        let other: SocketAddr = "127.0.0.1:4001".parse().expect("addr");
        let started = book
            .add("config", Some(subscriber))
            .expect("room")
            .started();
        assert_eq!(book.close("config", &started.id, Some(other)), Ok(()));
        assert!(started.cancel.is_cancelled(), "the subscription ends");
        assert_eq!(book.len(), 0, "its place is free at once");
        let again = book.add("config", None).expect("room again").started();
        assert_eq!(book.close("config", &again.id, None), Ok(()));
        drop(started.place);
        assert_eq!(book.len(), 0, "the late give-back finds nothing");
    }

    /// An unknown id or store is quoted cut (a path or request may carry
    /// megabytes, and the message is logged and answered).
    #[test]
    fn an_unknown_id_or_store_is_quoted_cut() {
        let book = OpenSubscriptions::new(CancellationToken::new(), 1);
        let long = format!("x\n{}", "y".repeat(10_000));
        let Err(UnsubscribeError::Unknown(quoted)) = book.close("", &long, None) else {
            panic!("an unknown id");
        };
        assert_eq!(quoted, echoed(&long));
        assert!(quoted.len() < 1_000, "{} bytes", quoted.len());
        let started = book.add("config", None).expect("room").started();
        let Err(UnsubscribeError::OtherStore { store, .. }) = book.close(&long, &started.id, None)
        else {
            panic!("another store");
        };
        assert!(store.len() < 1_000, "{} bytes", store.len());
    }

    #[test]
    fn shutdown_cancels_every_subscription() {
        let shutdown = CancellationToken::new();
        let book = OpenSubscriptions::new(shutdown.clone(), 8);
        let booking = book.add("config", None).expect("add");
        shutdown.cancel();
        assert!(booking.started().cancel.is_cancelled());
    }

    /// A booking dropped unstarted gives its place back (a subscribe the
    /// store refused); a started one keeps it until its place is dropped
    /// (the subscription's task ended).
    #[test]
    fn a_booking_dropped_unstarted_gives_its_place_back_and_a_started_one_keeps_it() {
        let book = OpenSubscriptions::new(CancellationToken::new(), 1);
        let booking = book.add("config", None).expect("room");
        assert_eq!(book.add("config", None).err(), Some(Full(1)));
        drop(booking);
        assert_eq!(book.len(), 0, "given back");
        let started = book.add("config", None).expect("room again").started();
        assert_eq!(book.add("config", None).err(), Some(Full(1)), "kept");
        assert_eq!(book.len(), 1);
        drop(started.place);
        assert_eq!(book.len(), 0, "given back once ended");
    }
}
