//! The reply bytes the sidecar holds for clients that have not taken them,
//! bounded per connection and per listener
//! ([`ApiOptions::max_response_bytes_in_flight_per_connection`],
//! [`ApiOptions::max_response_bytes_in_flight`]). Without a bound, a
//! client that grants no HTTP/2 window (or never reads) and asks for large
//! values on every stream held 256 × 4 MiB per connection until the idle
//! timeout ended it. The counts only: a connection keeps its own with its
//! requests in flight ([`crate::in_flight`]); replies are charged and let
//! go of by [`crate::connection`]'s reply bodies.
//!
//! A reply that may be refused (the answer of a read a client can repeat)
//! is refused when it would pass its connection's budget, unless the
//! connection holds nothing, or the listener's, unless the connection
//! holds nothing: a client that reads its answers always gets the next
//! one, even one larger than a budget, however much other connections
//! hold. The listener's bound is thus its budget plus one answer per
//! connection (at most `max_connections` of them). Any other reply (a
//! call that changed state: a lock taken, an id spent) is charged
//! without a check and always sent, so it counts against later reads.
//! A configuration subscription's stream is charged as it is produced: its
//! id always sent, each change after it refused as a read's answer is
//! (which drops the subscriber, with the reason).
//! A refused charge never shows in either count, even for a moment.
//!
//! [`ApiOptions::max_response_bytes_in_flight_per_connection`]: crate::ApiOptions::max_response_bytes_in_flight_per_connection
//! [`ApiOptions::max_response_bytes_in_flight`]: crate::ApiOptions::max_response_bytes_in_flight

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Reply bytes held against a limit: one listener's, or one connection's.
#[derive(Debug)]
pub struct ReplyBudget {
    held: AtomicUsize,
    limit: usize,
}

impl ReplyBudget {
    fn with_limit(limit: usize) -> Self {
        Self {
            held: AtomicUsize::new(0),
            limit,
        }
    }

    /// Takes `bytes` when `admits` the count held before (compare and
    /// swap: a refused charge is never added): the count it took them
    /// from, or `None`.
    fn charge_if(&self, bytes: usize, admits: impl Fn(usize) -> bool) -> Option<usize> {
        let mut held = self.held.load(Ordering::Acquire);
        loop {
            if !admits(held) {
                return None;
            }
            match self.held.compare_exchange_weak(
                held,
                held.saturating_add(bytes),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(before) => return Some(before),
                Err(now) => held = now,
            }
        }
    }

    /// Whether `bytes` more fit on top of `held`.
    fn fits(&self, held: usize, bytes: usize) -> bool {
        held.saturating_add(bytes) <= self.limit
    }

    fn release(&self, bytes: usize) {
        self.held.fetch_sub(bytes, Ordering::AcqRel);
    }

    /// Bytes held now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Acquire)
    }
}

/// The reply budgets of one listener's connections: the listener's,
/// shared, and the size of each connection's own.
#[derive(Debug, Clone)]
pub struct ReplyLimits {
    listener: Arc<ReplyBudget>,
    per_connection: usize,
}

impl ReplyLimits {
    /// `per_connection` bytes held for each connection, `per_listener`
    /// for all of them together.
    pub fn new(per_connection: usize, per_listener: usize) -> Self {
        Self {
            listener: Arc::new(ReplyBudget::with_limit(per_listener)),
            per_connection,
        }
    }

    /// No bound (a connection made outside a server: tests).
    pub fn unbounded() -> Self {
        Self::new(usize::MAX, usize::MAX)
    }

    /// The budgets of a new connection.
    pub fn for_connection(&self) -> ConnectionReplies {
        ConnectionReplies {
            own: ReplyBudget::with_limit(self.per_connection),
            listener: Arc::clone(&self.listener),
        }
    }

    /// The listener's budget.
    pub fn listener(&self) -> &ReplyBudget {
        &self.listener
    }
}

/// One connection's budget and its listener's.
#[derive(Debug)]
pub struct ConnectionReplies {
    own: ReplyBudget,
    listener: Arc<ReplyBudget>,
}

impl ConnectionReplies {
    /// Takes `bytes` from both budgets, or from neither: refused past the
    /// connection's limit unless it holds nothing, past the listener's
    /// unless the connection holds nothing. The listener's count never
    /// sees a refused charge (other clients are never refused for it);
    /// the connection's, only between its own check and the listener's
    /// refusal, while it holds answers already.
    pub fn charge(&self, bytes: usize) -> Result<(), ReplyRefused> {
        let own = &self.own;
        let Some(before) = own.charge_if(bytes, |held| held == 0 || own.fits(held, bytes)) else {
            return Err(ReplyRefused::Connection(own.limit));
        };
        let listener = &self.listener;
        if before == 0 {
            listener.held.fetch_add(bytes, Ordering::AcqRel);
            return Ok(());
        }
        if listener
            .charge_if(bytes, |held| listener.fits(held, bytes))
            .is_none()
        {
            own.release(bytes);
            return Err(ReplyRefused::Listener(listener.limit));
        }
        Ok(())
    }

    /// Takes `bytes` from both budgets, refused only past the connection's
    /// own limit (unless it holds nothing): a configuration subscription's
    /// change, which other clients filling the listener must not drop
    /// (its loss is not retried as a read is), while its own connection
    /// is still held to what it may keep unread.
    pub fn charge_within_own(&self, bytes: usize) -> Result<(), ReplyRefused> {
        let own = &self.own;
        if own
            .charge_if(bytes, |held| held == 0 || own.fits(held, bytes))
            .is_none()
        {
            return Err(ReplyRefused::Connection(own.limit));
        }
        self.listener.held.fetch_add(bytes, Ordering::AcqRel);
        Ok(())
    }

    /// Takes `bytes` from both budgets whatever they hold: an answer that
    /// must be sent (its call changed state) still counts against the
    /// answers after it.
    pub fn charge_anyway(&self, bytes: usize) {
        self.own.held.fetch_add(bytes, Ordering::AcqRel);
        self.listener.held.fetch_add(bytes, Ordering::AcqRel);
    }

    /// Gives `bytes` back to both budgets.
    pub fn release(&self, bytes: usize) {
        self.own.release(bytes);
        self.listener.release(bytes);
    }

    /// Bytes this connection holds now.
    pub fn held(&self) -> usize {
        self.own.held()
    }
}

/// Why a reply was not held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyRefused {
    /// Its connection holds as much as it may (the limit, in bytes).
    Connection(usize),
    /// Its listener does.
    Listener(usize),
}

impl std::fmt::Display for ReplyRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (whose, option, limit) = match self {
            Self::Connection(limit) => (
                "this connection",
                "max_response_bytes_in_flight_per_connection",
                limit,
            ),
            Self::Listener(limit) => (
                "this listener's connections",
                "max_response_bytes_in_flight",
                limit,
            ),
        };
        write!(
            f,
            "the sidecar holds as many answer bytes not yet taken by the client as it may \
             for {whose} ({limit} bytes, {option}): read the answers already asked for, \
             or try again shortly"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    #[test]
    fn replies_past_either_budget_are_refused_unless_the_connection_holds_nothing() {
        let limits = ReplyLimits::new(100, 150);
        let (first, second) = (limits.for_connection(), limits.for_connection());
        // Alone, a reply larger than the budget passes.
        first.charge(120).expect("alone");
        assert_eq!(first.charge(1), Err(ReplyRefused::Connection(100)));
        assert_eq!(first.held(), 120, "the refused reply was never counted");
        second.charge(30).expect("within both");
        assert_eq!(second.charge(10), Err(ReplyRefused::Listener(150)));
        assert_eq!(second.held(), 30, "the refused reply let go");
        assert_eq!(limits.listener().held(), 150);
        // A connection holding nothing is served past the listener's
        // budget: a client that reads is not refused for the others'.
        let reading = limits.for_connection();
        reading.charge(50).expect("holds nothing");
        assert_eq!(limits.listener().held(), 200);
        assert_eq!(reading.charge(1), Err(ReplyRefused::Listener(150)));
        reading.release(50);
        // An answer that must be sent is counted past both budgets.
        second.charge_anyway(500);
        assert_eq!((second.held(), limits.listener().held()), (530, 650));
        second.release(500);
        first.release(120);
        assert_eq!((first.held(), limits.listener().held()), (0, 30));
        second.charge(70).expect("within both again");
        second.release(100);
        assert_eq!(limits.listener().held(), 0);
        let message = ReplyRefused::Listener(150).to_string();
        assert!(
            message.contains("(150 bytes, max_response_bytes_in_flight)"),
            "{message}"
        );
    }

    /// Charges the listener refuses never show in its count, even for a
    /// moment: a client is never refused for another's refused answer.
    #[test]
    fn a_refused_charge_never_shows_in_the_listeners_count() {
        let limits = ReplyLimits::new(usize::MAX, 100);
        let (holding, refused) = (limits.for_connection(), limits.for_connection());
        refused.charge(1).expect("holds nothing");
        holding.charge(99).expect("within the listener's budget");
        let done = AtomicBool::new(false);
        let most = std::thread::scope(|scope| {
            scope.spawn(|| {
                for _ in 0..200_000 {
                    assert!(refused.charge(50).is_err());
                }
                done.store(true, Ordering::Release);
            });
            let mut most = 0;
            while !done.load(Ordering::Acquire) {
                most = most.max(limits.listener().held());
            }
            most
        });
        assert_eq!(most, 100);
    }
}
