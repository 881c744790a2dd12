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
//! A reply that would pass either budget is refused, unless nothing is
//! held there yet: one reply larger than a budget is still served to a
//! client that reads it.
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

    /// Takes `bytes`, unless that would pass the limit while something is
    /// held already.
    fn charge(&self, bytes: usize) -> bool {
        let before = self.held.fetch_add(bytes, Ordering::AcqRel);
        if before == 0 || before.saturating_add(bytes) <= self.limit {
            return true;
        }
        self.held.fetch_sub(bytes, Ordering::AcqRel);
        false
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
    /// Takes `bytes` from both budgets, or from neither.
    pub fn charge(&self, bytes: usize) -> Result<(), ReplyRefused> {
        if !self.own.charge(bytes) {
            return Err(ReplyRefused::Connection(self.own.limit));
        }
        if !self.listener.charge(bytes) {
            self.own.release(bytes);
            return Err(ReplyRefused::Listener(self.listener.limit));
        }
        Ok(())
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

    #[test]
    fn replies_past_either_budget_are_refused_unless_alone() {
        let limits = ReplyLimits::new(100, 150);
        let (first, second) = (limits.for_connection(), limits.for_connection());
        // Alone, a reply larger than the budget passes.
        first.charge(120).expect("alone");
        assert_eq!(first.charge(1), Err(ReplyRefused::Connection(100)));
        second.charge(30).expect("within both");
        assert_eq!(second.charge(10), Err(ReplyRefused::Listener(150)));
        assert_eq!(second.held(), 30, "the refused reply let go");
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
}
