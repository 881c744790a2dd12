//! How many replicas a strong write waits for, and whether it may skip
//! the strict path (a connection of its own, `INFO`, `WAIT`) because the
//! master has had none.
//!
//! The Dapr Go SDK and Layotto's SDKs ask for strong consistency on every
//! write an app makes without options, so on a server without replicas
//! strong is the common case: it must cost what a plain write costs, not
//! two round trips one at a time on one connection.

use std::time::Duration;

use tokio::time::Instant;

use super::super::bounded::BoundedConnection;
use super::super::connection::{Reached, Session};
use super::connected_replicas;

/// How long a count of no replicas is trusted before a strong write
/// checks it again (`INFO replication`, on the shared connection).
pub(super) const NONE_TRUSTED_FOR: Duration = Duration::from_secs(1);

/// The longest a count's check may take, or a strong write wait for
/// another's check: past it the write takes the strict path, which is
/// right whatever the count.
const CHECK_LIMIT: Duration = Duration::from_secs(1);

/// The replicas a strong write waits for: the most the master has had
/// connected since the store began reaching it on its line of connections
/// (see [`Session::reached`]). One that drops out (killed, unreachable)
/// still counts, so a strong write fails while it is gone instead of
/// succeeding unreplicated (as Dapr, which counts the replicas once, at
/// init).
///
/// While the master has had none, a strong write goes as a plain one (see
/// [`Replicas::path`]) and the count is checked again when over
/// [`NONE_TRUSTED_FOR`] old: a replica attached later is counted within
/// about a second, and strong writes meanwhile are not waited for it.
/// Once one was seen, every strong write checks the count and waits.
///
/// A reload that keeps the connection (`ttlInSeconds`, `keyPrefix`, any
/// field but the connection's) and a TLS file rotation keep the count. It
/// starts again only when the store reaches another server or connects
/// anew: a change of `redisHost`, `redisDB`, sentinels, cluster seeds,
/// password, user, timeouts or TLS settings (a new connection, made and
/// verified for the new settings), or a failover to another master.
#[derive(Debug, Default)]
pub(super) struct Replicas {
    seen: std::sync::Mutex<Option<Seen>>,
    /// Held by the one strong write checking the count, so that the
    /// writes of a busy store do not all send `INFO` when it expires.
    checking: tokio::sync::Mutex<Checks>,
}

/// What the writes waiting for a check learn from it besides the count.
#[derive(Debug, Default)]
struct Checks {
    /// When a check last failed: the writes that waited for it take the
    /// strict path rather than each checking again or trusting an ever
    /// older count.
    failed: Option<Instant>,
}

/// The count for one line of connections.
#[derive(Debug)]
struct Seen {
    reached: Reached,
    most: usize,
    checked: Instant,
}

/// How a strong write goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum StrongPath {
    /// As any write, on the shared connection: the master has had no
    /// replica, as last checked within [`NONE_TRUSTED_FOR`].
    Plain,
    /// On the session's connection for strong writes, then `INFO` and
    /// `WAIT` there (see `RedisStateStore::replicated`).
    Strict,
}

/// What is known of the count for the line a session reaches.
enum Known {
    /// The master has had replicas.
    Some,
    /// None, checked within [`NONE_TRUSTED_FOR`].
    NoneLately,
    /// None, checked longer ago.
    NoneBefore,
    /// Never checked on this line.
    Unknown,
}

impl Replicas {
    /// How many replicas a strong write in `session` waits for, now that
    /// the master reports `connected` replicas.
    pub(super) fn wanted(&self, session: &Session, connected: usize) -> usize {
        let Some(reached) = session.reached() else {
            return connected;
        };
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let most = match &*seen {
            Some(before) if before.reached.same_as(&reached) => before.most.max(connected),
            _ => connected,
        };
        *seen = Some(Seen {
            reached,
            most,
            checked: Instant::now(),
        });
        most
    }

    fn known(&self, reached: &Reached) -> Known {
        let seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        match &*seen {
            Some(seen) if seen.reached.same_as(reached) => match seen.most {
                0 if seen.checked.elapsed() <= NONE_TRUSTED_FOR => Known::NoneLately,
                0 => Known::NoneBefore,
                _ => Known::Some,
            },
            _ => Known::Unknown,
        }
    }

    /// How a strong write in `session` goes: [`StrongPath::Plain`] while
    /// the master has had no replica, checked (on `conn`, the shared
    /// connection) when the last check is over [`NONE_TRUSTED_FOR`] old —
    /// by one write at a time, the others waiting for that check (at most
    /// [`CHECK_LIMIT`]) rather than going by a count no longer trusted.
    /// Strict on a Redis Cluster (a write `ASK`ed to an importing master
    /// counts that master's replicas, which only the strict path sees),
    /// past the wait, and whenever the check fails, for the write that ran
    /// it and those that waited for it.
    pub(super) async fn path(&self, session: &Session, conn: &BoundedConnection) -> StrongPath {
        if conn.is_cluster() {
            return StrongPath::Strict;
        }
        let Some(reached) = session.reached() else {
            return StrongPath::Strict;
        };
        let mut checking = match self.known(&reached) {
            Known::Some => return StrongPath::Strict,
            Known::NoneLately => return StrongPath::Plain,
            Known::NoneBefore | Known::Unknown => {
                let asked = Instant::now();
                match tokio::time::timeout(CHECK_LIMIT, self.checking.lock()).await {
                    Ok(checking) if checking.failed.is_some_and(|failed| failed >= asked) => {
                        return StrongPath::Strict;
                    }
                    Ok(checking) => checking,
                    Err(_) => return StrongPath::Strict,
                }
            }
        };
        // Another write may have checked while this one waited.
        match self.known(&reached) {
            Known::Some => return StrongPath::Strict,
            Known::NoneLately => return StrongPath::Plain,
            Known::NoneBefore | Known::Unknown => {}
        }
        let mut conn = conn.clone();
        let mut info = redis::cmd("INFO");
        info.arg("replication");
        let connected = match tokio::time::timeout(CHECK_LIMIT, info.query_async(&mut conn)).await {
            Ok(Ok(info)) => connected_replicas(info),
            _ => None,
        };
        let path = match connected.map(|connected| self.wanted(session, connected)) {
            Some(0) => StrongPath::Plain,
            Some(_) => StrongPath::Strict,
            None => {
                checking.failed = Some(Instant::now());
                StrongPath::Strict
            }
        };
        drop(checking);
        path
    }
}

#[cfg(test)]
impl Replicas {
    /// Records that the master `session` reaches had no replica, as
    /// checked at `checked`.
    pub(super) fn none_checked_at(&self, session: &Session, checked: Instant) {
        let reached = session.reached().expect("a session that reached a server");
        *self.seen.lock().unwrap_or_else(|p| p.into_inner()) = Some(Seen {
            reached,
            most: 0,
            checked,
        });
    }

    /// Holds the check, as a strong write checking the count does; `fail`
    /// on the guard ends it as a failed check.
    pub(super) async fn hold_check(&self) -> HeldCheck<'_> {
        HeldCheck(self.checking.lock().await)
    }
}

/// A check held by a test (see [`Replicas::hold_check`]).
#[cfg(test)]
pub(super) struct HeldCheck<'a>(tokio::sync::MutexGuard<'a, Checks>);

#[cfg(test)]
impl HeldCheck<'_> {
    /// Ends the check as one that failed.
    pub(super) fn fail(mut self) {
        self.0.failed = Some(Instant::now());
    }
}
