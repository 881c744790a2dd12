//! One subscription of the `redis` pub/sub: reads its consumer group with
//! `XREADGROUP`, delivers, `XACK`s what is settled `SUCCESS` or `DROP`,
//! and delivers again entries pending longer than `processingTimeout`:
//! looked for as it starts and every `redeliverInterval`, each time through
//! the whole pending list (`XPENDING … IDLE` from a cursor, then `XCLAIM`
//! of those found, one page between reads of new entries, no larger than
//! the free permits). A read takes no more entries than the free permits
//! and one (at most `queueDepth`): while a slow app holds the permits, at
//! most one entry read waits in memory for one, not a whole `queueDepth`.
//!
//! Asked to drain (its broker was replaced), it hands on nothing more (the
//! rest of a batch waiting for permits stays pending, for the drain), closes
//! the broker's publish gate (waiting for `XADD`s under way, at most
//! `GATE_CLOSE_LIMIT`, then refusing publishes without them; a stop or a
//! shutdown meanwhile ends the reader: the runtime's drain grace starts
//! only at a delivery after that, a `RETRY` settled meanwhile is delivered
//! again only then too), delivers the consumer's
//! own pending entries (handed back `RETRY`, left by an earlier process,
//! or whose `XACK` failed; not those read and not yet settled here or at
//! another reader of this process on the same server, group and topic:
//! awaiting their outcome, or a permit to be handed on),
//! reads new entries: the backlog, up to the stream's last id as the gate
//! closed (taken once then: nothing of this broker is added after it; when
//! that look fails, until a read finds nothing new),
//! however long the app takes over it (within the runtime's drain cap,
//! `PubSubHandle::DRAIN_CAP`), then on until the stream has been quiet for
//! [`DRAIN_LINGER`] since the last batch was delivered and a last read
//! finds nothing (a publisher still on this server, within
//! [`DRAIN_READ_LIMIT`] of the backlog's end), waits for the outcomes of
//! what it delivered (delivering again what is settled `RETRY`), then
//! ends.
//!
//! With `failover` (Redis Sentinel), a read that fails in a way that
//! suggests the master moved (connection refused or dropped, a timeout,
//! `READONLY`, `MASTERDOWN`, `LOADING`, `UNBLOCKED`) makes the reader open
//! its connection again, to the master the sentinels name now, after the
//! backoff wait; once it has switched it reclaims its group's entries
//! pending past `processingTimeout` there at once (those the old master
//! handed out and the failover left unacknowledged), and a new master
//! without the group gets it again (`NOGROUP`, below).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::any_connection::AnyConnection;
use super::bounded::BoundedConnection;
use arc_swap::ArcSwap;
use redis::{RedisError, Value};
use rewire_runtime::{DeliveryOutcome, Message, PubSubHandle, SubscriptionFeed};
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tracing::{info, warn};

use super::connect::{open, suggests_failover};
use super::metadata::ConnectionSettings;
use super::pubsub_connected::Connected;
use super::pubsub_in_flight::{in_flight_at_peers, join_peers, InFlight, ReadBatch};
use super::pubsub_metadata::Tunables;
use super::pubsub_pending::{page_cut, pending_idle_times, refuses_xpending_idle, text_of};
use crate::backoff::Backoff;
use crate::pubsub::PublishGate;

/// How long one `XREADGROUP` blocks.
const BLOCK: Duration = Duration::from_millis(1000);
/// The settings of a reader's own connection: each reply may take `BLOCK`
/// longer than `readTimeout` + `writeTimeout`, so a blocking read is never
/// given up on by the client while the server may still answer it with
/// entries (they would wait `processingTimeout` in the pending list).
pub(super) fn reading_settings(settings: &ConnectionSettings) -> ConnectionSettings {
    let mut reading = settings.clone();
    reading.response = settings.response.map(|response| response + BLOCK);
    reading
}

/// How long one command on a reading connection made with `settings` may
/// take, at most: its dial and reply timeouts, [`BLOCK`] included, as
/// [`reading_settings`] gives them (without copying the settings, which
/// hold the password and TLS material).
fn reading_limit(settings: &ConnectionSettings) -> Option<Duration> {
    settings
        .response
        .map(|response| response + BLOCK + settings.dial)
}

/// How soon a reader tries again to open its connection with new settings
/// after that failed (the old connection keeps reading meanwhile).
const REOPEN_RETRY: Duration = Duration::from_secs(5);

/// Draining, new entries are read until the stream has been quiet this
/// long (a publisher still on this server a little longer loses nothing).
/// Shorter than the runtime's drain grace (5 s without a delivery), so the
/// reader ends on its own rather than being stopped.
const DRAIN_LINGER: Duration = Duration::from_secs(3);
/// Draining, entries past the backlog (added by a publisher still on this
/// server) are read for this long at most after the backlog's end was
/// read (the runtime's no-progress limit), however steadily they come.
const DRAIN_READ_LIMIT: Duration = Duration::from_secs(120);
/// Draining, entries are read for this long at most, the backlog
/// included: the runtime's drain cap, after which it stops the drain.
const DRAIN_CAP: Duration = PubSubHandle::DRAIN_CAP;
/// How soon a message settled `RETRY` during a drain is delivered again
/// (once the publish gate is closed: nothing is handed on between a drain
/// request and then).
const DRAIN_RETRY_AFTER: Duration = Duration::from_millis(200);
/// How long a drain waits at most for the publishes under way to end
/// (one whose server stopped answering, with no `readTimeout`, may never
/// end); then it refuses publishes without waiting, and drains. An `XADD`
/// is bounded by `dialTimeout` + `readTimeout` + `writeTimeout` (11 s by
/// default) when those are set; this bounds the rest. Half the runtime's
/// no-progress limit (120 s, counted from the replacement, as
/// [`DRAIN_READ_LIMIT`]): the backlog's first entry is delivered with
/// half of it left, never after the runtime stopped the drain.
const GATE_CLOSE_LIMIT: Duration = Duration::from_secs(60);

/// Creates consumer group `group` on `topic` at the start of the stream
/// (creating the stream too), unless it exists.
pub(super) async fn ensure_group(
    conn: &mut impl redis::aio::ConnectionLike,
    topic: &str,
    group: &str,
) -> Result<(), RedisError> {
    let created: Result<Value, RedisError> = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(topic)
        .arg(group)
        .arg("0")
        .arg("MKSTREAM")
        .query_async(conn)
        .await;
    match created {
        Err(err) if err.code() == Some("BUSYGROUP") => Ok(()),
        other => other.map(|_| ()),
    }
}

/// The deliveries a subscription may have awaiting their outcome
/// (`concurrency`), resizable in place.
pub(super) struct Permits {
    semaphore: Arc<Semaphore>,
    size: Mutex<usize>,
}

impl Permits {
    pub(super) fn new(size: usize) -> Arc<Self> {
        Arc::new(Self {
            semaphore: Arc::new(Semaphore::new(size)),
            size: Mutex::new(size),
        })
    }

    /// Makes it `size` permits: more at once; fewer as the deliveries
    /// awaiting their outcome settle.
    pub(super) fn resize(&self, size: usize) {
        let mut current = self
            .size
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if size > *current {
            self.semaphore.add_permits(size - *current);
        } else if size < *current {
            let owed = (*current - size) - self.semaphore.forget_permits(*current - size);
            let runtime = tokio::runtime::Handle::try_current();
            if let (true, Ok(runtime)) = (owed > 0, runtime) {
                let semaphore = self.semaphore.clone();
                let owed = u32::try_from(owed).unwrap_or(u32::MAX);
                runtime.spawn(async move {
                    if let Ok(permits) = semaphore.acquire_many_owned(owed).await {
                        permits.forget();
                    }
                });
            }
        }
        *current = size;
    }
}

pub(super) struct Reader {
    pub(super) connected: Connected,
    pub(super) reading: AnyConnection,
    /// The server `reading` reached (with failover: the master the
    /// sentinels named when it was opened).
    pub(super) reading_server: String,
    /// The settings `reading` was opened with: when the settings in force
    /// are others (new TLS material), it is opened again with them, so a
    /// reconnection never presents a certificate the files replaced.
    pub(super) reading_settings: Arc<ConnectionSettings>,
    /// When opening `reading` again last failed (tried again after
    /// [`REOPEN_RETRY`]).
    pub(super) reopen_failed_at: Option<Instant>,
    pub(super) topic: String,
    pub(super) tunables: Arc<ArcSwap<Tunables>>,
    pub(super) gate: Arc<PublishGate>,
    pub(super) feed: SubscriptionFeed,
    /// How many deliveries may await their outcome.
    pub(super) permits: Arc<Permits>,
    /// The ids read and not yet settled (see [`InFlight`]).
    pub(super) in_flight_ids: Arc<InFlight>,
    /// Whether the server refused `XPENDING … IDLE` (before Redis 6.2):
    /// reclaims compare idle times here instead.
    pub(super) without_xpending_idle: bool,
}

/// Where a drain is.
struct Drain {
    /// Reading this consumer's own pending entries: the id to read after;
    /// `None` once they were all read.
    pending_after: Option<String>,
    /// When the last batch was delivered (or the pending entries were all
    /// delivered, or the drain began).
    quiet_since: Instant,
    /// The stream's last id as the publish gate closed: new entries up to
    /// it are the backlog, read within [`DRAIN_CAP`] (by the clock when
    /// the look failed, [`BacklogEnd::ByTheClock`]; [`PAST_EVERY_ID`] when
    /// unknown: the backlog ends at the first read of new entries that
    /// finds none). `None` once an entry at or past it was read, or a
    /// read of new entries found none (what is left went to other
    /// consumers of the group), or when the stream was empty.
    backlog_end: Option<(u64, u64)>,
    /// Whether `backlog_end` was taken by the clock and no new entry has
    /// been read yet: a first one already past it says the server's ids
    /// run ahead of this clock, and the end is not trusted.
    end_untried_clock: bool,
    /// When the drain began plus [`DRAIN_CAP`].
    cap_at: Instant,
    /// When reading stops, however steadily entries come: the cap while
    /// the backlog is read, [`DRAIN_READ_LIMIT`] after its end was read.
    read_until: Instant,
}

/// How far the server's clock may run ahead of this process's for an end
/// of the backlog by the clock ([`BacklogEnd::by_the_clock`]): 5 s.
const CLOCK_SKEW_MS: u64 = 5_000;

/// The wall clock, in milliseconds since the epoch (0 before it).
fn wall_clock_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| {
            u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
        })
}

/// An end of the backlog no entry reaches: only a read of new entries that
/// finds none ends it.
const PAST_EVERY_ID: (u64, u64) = (u64::MAX, u64::MAX);

/// The end of a drain's backlog, as looked up once the publish gate closed.
#[derive(Debug, Clone, PartialEq, Eq)]
enum BacklogEnd {
    /// The stream's last id then.
    At(String),
    /// The stream was empty: there is no backlog.
    Empty,
    /// The look failed (an ACL without `XREVRANGE`, a renamed command, a
    /// failover): the end by the clock, in the server's milliseconds
    /// ([`by_the_clock`](Self::by_the_clock)).
    ByTheClock(u64),
    /// Not known (the reader stopping): the backlog is read, within the
    /// cap, until a read of new entries finds none, not cut at
    /// [`DRAIN_READ_LIMIT`].
    Unknown,
}

impl BacklogEnd {
    /// The end a look-up of the stream's last id (`stream_last_id`) gives.
    fn looked(looked: &Result<Option<String>, RedisError>) -> Self {
        match looked {
            Ok(Some(id)) => Self::At(id.clone()),
            Ok(None) => Self::Empty,
            Err(_) => Self::by_the_clock(wall_clock_ms()),
        }
    }

    /// The end by the clock when the stream's last id cannot be looked up:
    /// an entry's id is the server's milliseconds when it was added, so
    /// one made more than [`CLOCK_SKEW_MS`] after `now_ms` (the gate's
    /// close) is past the backlog, and steady new traffic ends the drain
    /// as a looked-up end would. When the first new entry read is already
    /// past it (the server's clock ahead or stepped back, an explicit id
    /// in the future), the clock is not trusted: the backlog is read until
    /// a read finds none, within the cap, so none of it is cut.
    fn by_the_clock(now_ms: u64) -> Self {
        Self::ByTheClock(now_ms.saturating_add(CLOCK_SKEW_MS))
    }
}

impl Drain {
    /// A drain beginning `now`, its backlog ending at `backlog_end`.
    fn new(now: Instant, backlog_end: BacklogEnd) -> Self {
        let end_untried_clock = matches!(backlog_end, BacklogEnd::ByTheClock(_));
        let backlog_end = match backlog_end {
            // An id that does not parse names no end: read as unknown.
            BacklogEnd::At(id) => Some(stream_id(&id).unwrap_or(PAST_EVERY_ID)),
            BacklogEnd::ByTheClock(ms) => Some((ms, 0)),
            BacklogEnd::Empty => None,
            BacklogEnd::Unknown => Some(PAST_EVERY_ID),
        };
        let cap_at = now + DRAIN_CAP;
        let mut drain = Self {
            pending_after: Some("0-0".into()),
            quiet_since: now,
            backlog_end,
            end_untried_clock,
            cap_at,
            read_until: cap_at,
        };
        if drain.backlog_end.is_none() {
            drain.backlog_read(now);
        }
        drain
    }

    /// New entries were read `now`, the last of them `last` (`None`: none
    /// were): once the backlog's end is reached, the read limit counts
    /// from then.
    fn read_new(&mut self, last: Option<&str>, now: Instant) {
        let Some(end) = self.backlog_end else {
            return;
        };
        // An id that does not parse is taken as past the end.
        let reached = last.is_none_or(|id| stream_id(id).is_none_or(|id| id >= end));
        let first_by_the_clock = std::mem::take(&mut self.end_untried_clock);
        if reached && first_by_the_clock && last.is_some() {
            // The server's ids run ahead of this clock: no end by it.
            self.backlog_end = Some(PAST_EVERY_ID);
            return;
        }
        if reached {
            self.backlog_end = None;
            self.backlog_read(now);
        }
    }

    /// The backlog was read (or there is none): entries are read on for
    /// [`DRAIN_READ_LIMIT`] at most, within the cap.
    fn backlog_read(&mut self, now: Instant) {
        self.read_until = (now + DRAIN_READ_LIMIT).min(self.cap_at);
    }
}

/// A stream entry id (`<ms>-<seq>`) as a pair that orders as the stream
/// does; `None` when it is not one.
fn stream_id(id: &str) -> Option<(u64, u64)> {
    let (ms, seq) = id.split_once('-')?;
    Some((ms.parse().ok()?, seq.parse().ok()?))
}

/// The id of the last entry of stream `topic` (`XREVRANGE + - COUNT 1`);
/// `None` when it has none.
async fn stream_last_id(
    conn: &mut impl redis::aio::ConnectionLike,
    topic: &str,
) -> Result<Option<String>, RedisError> {
    let reply: Value = redis::cmd("XREVRANGE")
        .arg(topic)
        .arg("+")
        .arg("-")
        .arg("COUNT")
        .arg(1)
        .query_async(conn)
        .await?;
    Ok(entries_of(reply).into_iter().next().map(|(id, _)| id))
}

impl Reader {
    pub(super) async fn run(mut self) {
        self.in_flight_ids.set_server(&self.reading_server);
        join_peers(self.peer_key(), &self.in_flight_ids);
        let in_flight = self.permits.semaphore.clone();
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
        let mut drain: Option<Drain> = None;
        let mut last_reclaim = Instant::now();
        // Reclaim as the reader starts (as Dapr does at subscribe: entries
        // a crashed process left need not wait `redeliverInterval`), and
        // at once when it moved to a new master.
        let mut reclaim_now = true;
        // A reclaim round under way: the `XPENDING` start it goes on
        // from. A round follows the cursor until the whole pending list was
        // looked through, one page per turn of the loop between reads (so
        // new entries are not held up behind a long backlog).
        let mut reclaim_cursor: Option<String> = None;
        loop {
            if self.feed.is_stopped() || self.connected.shutdown.is_cancelled() {
                return;
            }
            if self.feed.is_draining() && drain.is_none() {
                // Looked at again once the drain is seen: a subscription
                // stopped (dropped) is drained too, and stopped first, and
                // the gate is the whole broker's (closed, every later
                // publish to it is refused as retired).
                if self.feed.is_stopped() || !self.close_publishing().await {
                    return;
                }
                let backlog_end = self.backlog_end().await;
                drain = Some(Drain::new(Instant::now(), backlog_end));
            }
            // New TLS material in force: the reading connection is opened
            // again with it (the old one would reconnect with the old).
            let settings_changed = !Arc::ptr_eq(&self.reading_settings, &self.connected.settings());
            let may_retry = self
                .reopen_failed_at
                .is_none_or(|at| at.elapsed() >= REOPEN_RETRY);
            if settings_changed && may_retry && self.reopen().await {
                reclaim_now = true;
            }
            let tunables = **self.tunables.load();
            match (tunables.redelivery(), &drain) {
                (Some((every, idle)), None) => {
                    if reclaim_now || (reclaim_cursor.is_none() && last_reclaim.elapsed() >= every)
                    {
                        last_reclaim = Instant::now();
                        reclaim_now = false;
                        reclaim_cursor = Some("-".into());
                    }
                    if let Some(cursor) = reclaim_cursor.take() {
                        match self
                            .reclaim(&in_flight, idle, tunables.queue_depth, &cursor)
                            .await
                        {
                            Ok(next) => reclaim_cursor = next,
                            Err(err) => {
                                if self.group_recreated(&err).await {
                                    continue;
                                }
                                warn!(component = %self.connected.label, topic = %self.topic, error = %self.describe(&err), "Reclaiming pending entries failed.");
                            }
                        }
                    }
                    // A drain asked for while the page waited for a permit:
                    // seen to first (no read of new entries before the
                    // publish gate closes).
                    if self.feed.is_draining() {
                        continue;
                    }
                }
                _ => reclaim_cursor = None,
            }
            // Draining: this consumer's own pending entries first (handed
            // back `RETRY`, left by an earlier process, or whose `XACK`
            // failed): nobody reads this server once the drain ends. Then
            // new entries, until the stream was quiet for `DRAIN_LINGER`
            // (a publisher still on this server a little longer).
            let (after, block) = match &drain {
                // A reclaim round under way: a look at new entries that
                // does not wait, then its next page.
                None => (">".to_string(), reclaim_cursor.is_none().then_some(BLOCK)),
                Some(Drain {
                    pending_after: Some(after),
                    ..
                }) => (after.clone(), None),
                Some(drain) => {
                    if Instant::now() >= drain.read_until {
                        break;
                    }
                    let left = DRAIN_LINGER.saturating_sub(drain.quiet_since.elapsed());
                    // Quiet for `DRAIN_LINGER`: one last read that does not
                    // wait; the drain ends only when it comes back empty.
                    // (`BLOCK 0` would wait forever.)
                    let block =
                        (!left.is_zero()).then(|| left.min(BLOCK).max(Duration::from_millis(1)));
                    (">".to_string(), block)
                }
            };
            let last_look = drain.is_some() && after == ">" && block.is_none();
            // Taken before the read: an entry in flight then may be
            // acknowledged (and forgotten) before its reply is looked at.
            let in_flight_before = (after != ">").then(|| self.in_flight_now());
            // Not cut short by a drain: a read cut after the server
            // answered would leave its entries pending, undelivered.
            let mut reading = self.reading();
            // No more than the free permits and one: the rest stays on the
            // server until the app answers.
            let count = (in_flight.available_permits() + 1)
                .min(tunables.queue_depth)
                .max(1);
            let read = tokio::select! {
                read = read_group(&mut reading, &self.connected.group, &self.topic, count, block, &after) => read,
                () = self.feed.stopped() => return,
                () = self.connected.shutdown.cancelled() => return,
            };
            let entries = match read {
                Ok(entries) => {
                    backoff.reset();
                    entries
                }
                Err(err) if self.group_recreated(&err).await => continue,
                Err(err) => {
                    let wait = backoff.next_wait();
                    warn!(component = %self.connected.label, topic = %self.topic, error = %self.describe(&err), ?wait, "Reading the stream failed; retrying.");
                    tokio::time::sleep(wait).await;
                    if self.connected.follows_failover()
                        && master_may_have_moved(&err)
                        && self.reopen().await
                    {
                        reclaim_now = true;
                    }
                    continue;
                }
            };
            if last_look && entries.is_empty() {
                break;
            }
            let own_pending = after != ">";
            let got_any = !entries.is_empty();
            if let Some(drain) = drain.as_mut() {
                let last = entries.last().map(|(id, _)| id.as_str());
                if own_pending {
                    drain.pending_after = last.map(str::to_string);
                } else {
                    drain.read_new(last, Instant::now());
                }
            }
            // Taken again after the read too: a peer whose `XREADGROUP`
            // reply was on its way during the read records its entries
            // only once it has it.
            let held_by_peers = in_flight_before.map(|mut ids| {
                ids.extend(self.in_flight_now());
                ids
            });
            let entries = entries.into_iter().filter(|(id, fields)| {
                fields.is_none() || !held_by_peers.as_ref().is_some_and(|ids| ids.contains(id))
            });
            if !self
                .hand_on(&in_flight, entries.collect(), drain.is_none())
                .await
            {
                return;
            }
            // The quiet is counted from when the pending entries were all
            // delivered, and from the last batch delivered: delivering
            // (`concurrency` at a time) may take longer than the linger.
            if let Some(drain) = drain.as_mut() {
                if got_any || (own_pending && drain.pending_after.is_none()) {
                    drain.quiet_since = Instant::now();
                }
            }
        }
        // Drained: wait for the outcomes of what was delivered.
        tokio::select! {
            () = self.in_flight_ids.all_settled() => {}
            () = self.feed.stopped() => {}
        }
    }

    /// Closes the broker's publish gate for a drain, waiting for the
    /// publishes under way, within [`GATE_CLOSE_LIMIT`] (then publishes
    /// are refused without waiting for them, and the drain goes on). False
    /// when the subscription is stopped (publishes refused) or the sidecar
    /// shuts down first: the reader ends.
    async fn close_publishing(&self) -> bool {
        tokio::select! {
            () = self.gate.close() => true,
            () = self.feed.stopped() => {
                self.gate.refuse_publishes();
                false
            }
            () = self.connected.shutdown.cancelled() => false,
            () = tokio::time::sleep(GATE_CLOSE_LIMIT) => {
                warn!(component = %self.connected.label, topic = %self.topic, limit = ?GATE_CLOSE_LIMIT, "Publishes under way did not end in time for the drain; later ones are refused, and the drain goes on without waiting for them.");
                self.gate.refuse_publishes();
                true
            }
        }
    }

    /// The stream's last id, looked at once the publish gate closed: the
    /// end of the drain's backlog. When the look fails, the end is taken
    /// by the clock ([`BacklogEnd::ByTheClock`]), not for an empty stream.
    async fn backlog_end(&self) -> BacklogEnd {
        let mut reading = self.reading();
        let looked = tokio::select! {
            looked = stream_last_id(&mut reading, &self.topic) => looked,
            // The reader ends at its next turn: what is returned is moot.
            () = self.feed.stopped() => return BacklogEnd::Unknown,
            () = self.connected.shutdown.cancelled() => return BacklogEnd::Unknown,
        };
        if let Err(err) = &looked {
            warn!(component = %self.connected.label, topic = %self.topic, error = %self.describe(err), cap = ?DRAIN_CAP, "Looking up the stream's last entry for the drain failed; its backlog ends by the clock (entries added 5 s after the publish gate closed), or, if the server's ids run ahead of this clock, when a read finds nothing new; within the cap.");
        }
        BacklogEnd::looked(&looked)
    }

    /// `err`, met by a read, as a backend error: with the server read,
    /// without the password.
    fn describe(&self, err: &dyn std::fmt::Display) -> String {
        self.connected.describe(&self.reading_server, err)
    }

    /// Opens the reading connection again, with the settings in force
    /// (with failover: to the master the sentinels name now; with TLS
    /// files: with the material last read from them). True when it moved
    /// to another server.
    async fn reopen(&mut self) -> bool {
        let settings = self.connected.settings();
        match open(&reading_settings(&settings)).await {
            Ok(opened) => {
                let moved = opened.server != self.reading_server;
                if moved {
                    info!(component = %self.connected.label, topic = %self.topic, old = %self.reading_server, new = %opened.server, "Redis master moved; the subscription reads from the new one.");
                }
                self.reading = opened.connection;
                self.reading_server = opened.server;
                self.reading_settings = settings;
                self.reopen_failed_at = None;
                self.in_flight_ids.set_server(&self.reading_server);
                moved
            }
            Err(err) => {
                self.reopen_failed_at = Some(Instant::now());
                warn!(component = %self.connected.label, topic = %self.topic, error = %err, "Opening the subscription's connection again failed; retrying.");
                false
            }
        }
    }

    /// The reading connection for one command (a clone: it is shared),
    /// cut at `dialTimeout` + its `readTimeout` + `writeTimeout` (which
    /// include [`BLOCK`]; no limit when those have none) and, on a Redis
    /// Cluster, following `ASK` (see [`super::bounded`]): while the
    /// topic's slot migrates and its stream is already on the importing
    /// master, the reads, reclaims and group creation go there, as the
    /// publishes do. A blocking read sent there goes on a connection to
    /// that node of this reader's own (the reading connection's; opened
    /// with its settings, so with its longer reply timeout), never on one
    /// that other commands share.
    fn reading(&self) -> BoundedConnection {
        BoundedConnection::new(self.reading.clone(), reading_limit(&self.reading_settings))
    }

    /// The ids delivered and awaiting their outcome now.
    /// (At every reader of this process on its server, group and topic.)
    fn in_flight_now(&self) -> HashSet<String> {
        let mut ids = in_flight_at_peers(&self.peer_key(), &self.reading_server);
        ids.extend(self.in_flight_ids.ids());
        ids
    }

    fn peer_key(&self) -> (String, String, u32) {
        (
            self.connected.group.clone(),
            self.topic.clone(),
            self.connected.settings().db,
        )
    }

    /// When `err` says the consumer group is gone (`NOGROUP`: the server
    /// restarted without its data, or a replica without the group took
    /// over, while publishes re-create the stream), creates it again at the
    /// start of the stream, as Dapr does. True when it was re-created.
    async fn group_recreated(&mut self, err: &RedisError) -> bool {
        if err.code() != Some("NOGROUP") {
            return false;
        }
        match ensure_group(&mut self.reading(), &self.topic, &self.connected.group).await {
            Ok(()) => {
                warn!(component = %self.connected.label, topic = %self.topic, group = %self.connected.group, "The consumer group was gone (server restarted without its data, or failed over); created it again.");
                true
            }
            Err(err) => {
                warn!(component = %self.connected.label, topic = %self.topic, error = %self.describe(&err), "Creating the lost consumer group again failed.");
                false
            }
        }
    }

    /// One page of a reclaim round: finds (`XPENDING … IDLE`) the
    /// entries of the group pending longer than `idle` from `cursor` (an
    /// `XPENDING` start) on, takes them over (`XCLAIM`) and delivers them
    /// again. The cursor to go on from; `None` once the pending list was
    /// looked through (or the subscription ended).
    ///
    /// A page takes no more entries than there are deliveries free to
    /// await their outcome (at most `count`): an entry taken over has its
    /// idle time reset, so one held here waiting for a permit would look
    /// busy to the next round, and a backlog of many thousands is never
    /// held in memory. Found first, taken over then: `XPENDING … IDLE`
    /// looks through as many pending entries as it takes to find them,
    /// where `XAUTOCLAIM` looks through at most ten per entry it may take,
    /// so a pending list of entries other consumers are working on would
    /// take a call per ten of them with one free permit. A page that finds
    /// fewer than it asked for ends the round.
    ///
    /// While it waits for a free permit, a drain asked for or new TLS
    /// material to open the connection with ends the page at once (the
    /// cursor unchanged): the loop sees to them first.
    async fn reclaim(
        &mut self,
        in_flight: &Arc<Semaphore>,
        idle: Duration,
        count: usize,
        cursor: &str,
    ) -> Result<Option<String>, RedisError> {
        let permit = tokio::select! {
            permit = in_flight.clone().acquire_owned() => permit,
            () = self.feed.stopped() => return Ok(None),
            () = self.connected.shutdown.cancelled() => return Ok(None),
            () = self.feed.draining() => return Ok(Some(cursor.to_string())),
            () = self.reopen_due() => return Ok(Some(cursor.to_string())),
        };
        let Ok(permit) = permit else {
            return Ok(None);
        };
        let room = (in_flight.available_permits() + 1).min(count).max(1);
        drop(permit);
        let idle = u64::try_from(idle.as_millis()).unwrap_or(u64::MAX);
        let (found, next) = self.idle_pending(idle, cursor, room, count).await?;
        if found.is_empty() {
            return Ok(next);
        }
        // Taken over only while still pending that long: not those another
        // consumer took over or acknowledged since.
        let claimed: Value = redis::cmd("XCLAIM")
            .arg(&self.topic)
            .arg(&self.connected.group)
            .arg(&self.connected.group)
            .arg(idle)
            .arg(&found)
            .query_async(&mut self.reading())
            .await?;
        let (entries, missing) = claimed_and_missing(&found, claimed);
        // In flight before the look-ups of those not given back: pending
        // for the consumer name every reader of the group shares, they
        // would otherwise be free meanwhile for a drain at a peer to
        // deliver too.
        let batch = self.record_read(&entries);
        self.ack_gone(missing).await;
        if !self.hand_on_recorded(in_flight, entries, batch, true).await {
            return Ok(None);
        }
        Ok(next)
    }

    /// The ids of up to `room` entries of the group pending longer than
    /// `idle` ms from `cursor` (an `XPENDING` start) on, and the start to
    /// go on from (`None`: the pending list was looked through):
    /// `XPENDING … IDLE` (Redis 6.2), or, on a server that refuses it, a
    /// page of `page` pending entries, their idle times compared here.
    async fn idle_pending(
        &mut self,
        idle: u64,
        cursor: &str,
        room: usize,
        page: usize,
    ) -> Result<(Vec<String>, Option<String>), RedisError> {
        if !self.without_xpending_idle {
            let reply: Result<Value, RedisError> = redis::cmd("XPENDING")
                .arg(&self.topic)
                .arg(&self.connected.group)
                .arg("IDLE")
                .arg(idle)
                .arg(cursor)
                .arg("+")
                .arg(room)
                .query_async(&mut self.reading())
                .await;
            match reply {
                // [[id, consumer, idle, deliveries], ...]
                Ok(reply) => {
                    let found = pending_ids(reply);
                    return Ok(page_cut(&found, |_| true, room, room));
                }
                Err(err) if refuses_xpending_idle(&err) => {
                    self.without_xpending_idle = true;
                    warn!(component = %self.connected.label, topic = %self.topic, error = %self.describe(&err), "The server refuses `XPENDING … IDLE` (Redis before 6.2; 6.2 or later is needed for pub/sub redelivery as Dapr's): pending entries are looked through without it, their idle times compared here.");
                }
                Err(err) => return Err(err),
            }
        }
        let reply: Value = redis::cmd("XPENDING")
            .arg(&self.topic)
            .arg(&self.connected.group)
            .arg(cursor)
            .arg("+")
            .arg(page)
            .query_async(&mut self.reading())
            .await?;
        let pending = pending_idle_times(reply);
        let all: Vec<String> = pending.iter().map(|(id, _)| id.clone()).collect();
        let idle_enough: HashSet<&str> = pending
            .iter()
            .filter(|(_, idle_ms)| *idle_ms >= idle)
            .map(|(id, _)| id.as_str())
            .collect();
        Ok(page_cut(&all, |id| idle_enough.contains(id), room, page))
    }

    /// Acknowledges those of `ids` (asked of `XCLAIM`, not given back)
    /// whose entry is gone from the stream (`XRANGE id id` finds nothing:
    /// trimmed while pending), as Dapr's
    /// `removeMessagesThatNoLongerExistFromPending`: Redis 6.2 answers
    /// `XCLAIM` for them with nil and keeps them pending, so every round
    /// would take them again (7.0 drops them from the pending list
    /// itself). The others were taken over or acknowledged by another
    /// consumer meanwhile: left alone.
    async fn ack_gone(&self, ids: Vec<String>) {
        for id in ids {
            let found: Result<Value, RedisError> = redis::cmd("XRANGE")
                .arg(&self.topic)
                .arg(&id)
                .arg(&id)
                .arg("COUNT")
                .arg(1)
                .query_async(&mut self.reading())
                .await;
            match found {
                Ok(Value::Array(entries)) if entries.is_empty() => {
                    ack(&self.connected, &self.topic, &id).await;
                }
                Ok(_) => {}
                Err(err) => {
                    warn!(component = %self.connected.label, topic = %self.topic, id = %id, error = %self.describe(&err), "Looking up whether a pending entry was trimmed from the stream failed; looked at again by the next round.");
                }
            }
        }
    }

    /// Resolves when the loop would open the reading connection again:
    /// the settings in force are not those it was opened with, and the
    /// last attempt to open it with them (if any) is [`REOPEN_RETRY`] old.
    async fn reopen_due(&self) {
        self.connected
            .settings_other_than(&self.reading_settings)
            .await;
        if let Some(at) = self.reopen_failed_at {
            tokio::time::sleep_until(at + REOPEN_RETRY).await;
        }
    }

    /// The message of entry `id`: its `data`, and the metadata its
    /// publisher gave (field `metadata`, a JSON object of strings, as
    /// Dapr writes it). Metadata that is not such an object is left out
    /// with a warning, as Dapr does; the message is delivered.
    fn message(&self, id: String, fields: Fields) -> Message {
        let metadata = match fields.metadata {
            None => HashMap::new(),
            Some(json) => serde_json::from_slice(&json).unwrap_or_else(|err| {
                warn!(component = %self.connected.label, topic = %self.topic, id = %id, error = %err, "The entry's metadata is not a JSON object of strings; delivered without it.");
                HashMap::new()
            }),
        };
        Message {
            id,
            topic: self.topic.clone(),
            data: fields.data,
            metadata,
            ..Message::default()
        }
    }

    /// Hands on the entries of a read, in order, each as a permit is
    /// free; their ids are in flight from the start (see [`ReadBatch`]).
    /// Entries trimmed from the stream while pending are acknowledged:
    /// nothing to deliver any more. False when the subscription is gone
    /// or stopped: what was not handed on stays pending in the group, no
    /// longer in flight here, for a later drain or reclaim to deliver.
    /// With `drain_first` (not draining yet), a drain asked for ends it
    /// too (true): the loop closes the publish gate before anything more
    /// is handed on, and the drain delivers the rest (pending here).
    async fn hand_on(
        &self,
        in_flight: &Arc<Semaphore>,
        entries: Vec<Entry>,
        drain_first: bool,
    ) -> bool {
        let batch = self.record_read(&entries);
        self.hand_on_recorded(in_flight, entries, batch, drain_first)
            .await
    }

    /// Records the ids of `entries` (those with fields: the others are
    /// gone from the stream) in flight, as [`ReadBatch`].
    fn record_read(&self, entries: &[Entry]) -> ReadBatch {
        let ids = entries
            .iter()
            .filter(|(_, fields)| fields.is_some())
            .map(|(id, _)| id.clone())
            .collect();
        ReadBatch::record(&self.in_flight_ids, ids)
    }

    /// [`hand_on`](Self::hand_on) of `entries` already recorded in flight
    /// as `batch`.
    async fn hand_on_recorded(
        &self,
        in_flight: &Arc<Semaphore>,
        entries: Vec<Entry>,
        mut batch: ReadBatch,
        drain_first: bool,
    ) -> bool {
        for (id, fields) in entries {
            let Some(fields) = fields else {
                ack(&self.connected, &self.topic, &id).await;
                continue;
            };
            let message = self.message(id, fields);
            let id = message.id.clone();
            match self.deliver(in_flight, message, drain_first).await {
                Handing::HandedOn => batch.handed_on(&id),
                Handing::DrainFirst => return true,
                Handing::Gone => return false,
            }
        }
        true
    }

    /// Hands `message` (its id recorded in flight, see [`ReadBatch`]) on
    /// once a permit is free, and settles it in the background. Not handed
    /// on when the subscription is gone or stopped (or the sidecar shuts
    /// down) first, nor, with `drain_first`, when a drain is asked for
    /// first.
    async fn deliver(
        &self,
        in_flight: &Arc<Semaphore>,
        message: Message,
        drain_first: bool,
    ) -> Handing {
        let permit = tokio::select! {
            biased;
            () = self.feed.stopped() => return Handing::Gone,
            () = self.connected.shutdown.cancelled() => return Handing::Gone,
            () = self.feed.draining(), if drain_first => return Handing::DrainFirst,
            permit = in_flight.clone().acquire_owned() => permit,
        };
        let Ok(permit) = permit else {
            return Handing::Gone;
        };
        let feed = self.feed.clone();
        let connected = self.connected.clone();
        let gate = self.gate.clone();
        let topic = self.topic.clone();
        let in_flight_ids = self.in_flight_ids.clone();
        let forget = move |id: &str| in_flight_ids.settled(id);
        // A send waiting for room is given up for a drain asked meanwhile
        // (nothing sent).
        let delivered = tokio::select! {
            biased;
            () = self.feed.draining(), if drain_first => return Handing::DrainFirst,
            delivered = feed.deliver(message.clone()) => delivered,
        };
        let Some(mut outcome) = delivered else {
            return Handing::Gone;
        };
        tokio::spawn(async move {
            loop {
                match outcome.await.unwrap_or(DeliveryOutcome::Retry) {
                    DeliveryOutcome::Success | DeliveryOutcome::Drop => {
                        ack(&connected, &topic, &message.id).await;
                        break;
                    }
                    // Left pending: redelivered after `processingTimeout`,
                    // or now when draining (nobody will read this server
                    // again), once the publish gate is closed: the
                    // runtime's drain grace starts at a delivery after
                    // that, and the publishes under way are read after it.
                    DeliveryOutcome::Retry if feed.is_draining() && !feed.is_stopped() => {
                        tokio::select! {
                            () = gate.closed() => {}
                            () = feed.stopped() => break,
                            () = connected.shutdown.cancelled() => break,
                        }
                        tokio::time::sleep(DRAIN_RETRY_AFTER).await;
                        match feed.deliver(message.clone()).await {
                            Some(next) => outcome = next,
                            None => break,
                        }
                    }
                    DeliveryOutcome::Retry => break,
                }
            }
            forget(&message.id);
            drop(permit);
        });
        Handing::HandedOn
    }
}

/// What became of an entry [`Reader::deliver`] was to hand on.
enum Handing {
    HandedOn,
    /// A drain was asked for first: not handed on.
    DrainFirst,
    /// The subscription is gone or stopped, or the sidecar shuts down:
    /// not handed on.
    Gone,
}

/// Up to `count` entries for `group` on `topic` (`XREADGROUP`): new ones
/// when `after` is `>`, otherwise this consumer's pending ones after that
/// id; `block`: wait that long for one.
async fn read_group(
    conn: &mut BoundedConnection,
    group: &str,
    topic: &str,
    count: usize,
    block: Option<Duration>,
    after: &str,
) -> Result<Vec<Entry>, RedisError> {
    let mut cmd = redis::cmd("XREADGROUP");
    cmd.arg("GROUP")
        .arg(group)
        .arg(group)
        .arg("COUNT")
        .arg(count);
    if let Some(block) = block {
        cmd.arg("BLOCK")
            .arg(u64::try_from(block.as_millis()).unwrap_or(1000));
    }
    cmd.arg("STREAMS").arg(topic).arg(after);
    let reply: Value = cmd.query_async(conn).await?;
    // [[stream, [[id, [field, value, ...]], ...]], ...] or nil.
    let Value::Array(streams) = reply else {
        return Ok(Vec::new());
    };
    Ok(streams
        .into_iter()
        .filter_map(|stream| match stream {
            Value::Array(mut parts) if parts.len() == 2 => Some(entries_of(parts.swap_remove(1))),
            _ => None,
        })
        .flatten()
        .collect())
}

/// The entries of an `XCLAIM` reply to the ids `asked`, and those of
/// `asked` it did not give back (Redis 6.2 answers nil for an entry
/// trimmed from the stream while pending; any version leaves out one no
/// longer pending that long): to look up, and acknowledge if gone.
fn claimed_and_missing(asked: &[String], reply: Value) -> (Vec<Entry>, Vec<String>) {
    let entries = entries_of(reply);
    let given: HashSet<&str> = entries.iter().map(|(id, _)| id.as_str()).collect();
    let missing = asked
        .iter()
        .filter(|id| !given.contains(id.as_str()))
        .cloned()
        .collect();
    (entries, missing)
}

/// The ids of an `XPENDING` extended reply (`[[id, consumer, idle,
/// deliveries], ...]`).
fn pending_ids(reply: Value) -> Vec<String> {
    let Value::Array(pending) = reply else {
        return Vec::new();
    };
    pending
        .into_iter()
        .filter_map(|entry| match entry {
            Value::Array(fields) => fields.into_iter().next().and_then(text_of),
            _ => None,
        })
        .collect()
}

/// A stream entry: its id and its `data` field (`None`: the entry is still
/// pending but was trimmed from the stream).
type Entry = (String, Option<Fields>);

/// The fields of a stream entry the pub/sub reads.
struct Fields {
    /// `data`: the payload.
    data: Vec<u8>,
    /// `metadata`: the publish request's metadata as JSON, when it had any.
    metadata: Option<Vec<u8>>,
}

/// The entries of `[[id, [field, value, ...]], ...]` (deleted ones are
/// `[id, nil]`).
fn entries_of(entries: Value) -> Vec<Entry> {
    let Value::Array(entries) = entries else {
        return Vec::new();
    };
    entries
        .into_iter()
        .filter_map(|entry| {
            let Value::Array(mut parts) = entry else {
                return None;
            };
            if parts.len() != 2 {
                return None;
            }
            let fields = parts.pop()?;
            let id = text_of(parts.pop()?)?;
            let Value::Array(fields) = fields else {
                return Some((id, None));
            };
            let mut data = Vec::new();
            let mut metadata = None;
            for pair in fields.chunks(2) {
                if let [name, value] = pair {
                    match text_of(name.clone()).as_deref() {
                        Some("data") => data = bytes_of(value.clone()),
                        Some("metadata") => metadata = Some(bytes_of(value.clone())),
                        _ => {}
                    }
                }
            }
            Some((id, Some(Fields { data, metadata })))
        })
        .collect()
}

fn bytes_of(value: Value) -> Vec<u8> {
    match value {
        Value::BulkString(bytes) => bytes,
        Value::SimpleString(text) => text.into_bytes(),
        _ => Vec::new(),
    }
}

async fn ack(connected: &Connected, topic: &str, id: &str) {
    let (session, mut conn) = match connected.commands() {
        Ok(commands) => commands,
        Err(err) => {
            warn!(component = %connected.label, topic, id, error = %err, "XACK failed; the entry will be delivered again.");
            return;
        }
    };
    let acked: Result<i64, RedisError> = redis::cmd("XACK")
        .arg(topic)
        .arg(&connected.group)
        .arg(id)
        .query_async(&mut conn)
        .await;
    if let Err(err) = acked {
        warn!(component = %connected.label, topic, id, error = %connected.failed(&session, &err), "XACK failed; the entry will be delivered again.");
    }
}

/// Whether a read's `err` suggests the master moved (see
/// [`suggests_failover`]), or the server unblocked the read because it
/// turned replica (`UNBLOCKED`).
fn master_may_have_moved(err: &RedisError) -> bool {
    suggests_failover(err) || err.code() == Some("UNBLOCKED")
}

#[cfg(test)]
mod tests {
    //! The drain's read limits (paused clock), and the backlog's end as a
    //! real `redis-server` gives it.

    use super::*;
    use testkit::redis::RedisServer;

    #[test]
    fn stream_ids_order_as_the_stream_does() {
        assert!(stream_id("99-10") < stream_id("100-0"));
        assert!(stream_id("100-1") > stream_id("100-0"));
        assert_eq!(stream_id("nope"), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_drain_reads_its_backlog_past_the_read_limit_then_entries_after_it_within_it() {
        let began = Instant::now();
        let mut drain = Drain::new(began, BacklogEnd::At("1000-0".into()));
        // 2,000 entries, one every 100 ms (`concurrency` 1): 200 s.
        for i in 0..2_000u64 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            drain.read_new(Some(&format!("{}-{}", i / 2, i % 2)), Instant::now());
            assert!(
                Instant::now() < drain.read_until,
                "cut at entry {i} after {:?}",
                began.elapsed()
            );
        }
        assert!(began.elapsed() > DRAIN_READ_LIMIT);
        assert_eq!(
            drain.read_until,
            began + DRAIN_CAP,
            "the backlog ended early"
        );
        drain.read_new(Some("1000-0"), Instant::now());
        assert_eq!(drain.read_until, Instant::now() + DRAIN_READ_LIMIT);
    }

    #[tokio::test(start_paused = true)]
    async fn a_drain_whose_backlog_is_gone_or_empty_reads_within_the_read_limit() {
        let began = Instant::now();
        // Other consumers of the group took the rest: a read finds none.
        let mut taken = Drain::new(began, BacklogEnd::At("1000-0".into()));
        tokio::time::sleep(Duration::from_secs(1)).await;
        taken.read_new(None, Instant::now());
        assert_eq!(taken.read_until, Instant::now() + DRAIN_READ_LIMIT);
        // An empty stream: no backlog.
        let empty = Drain::new(began, BacklogEnd::Empty);
        assert_eq!(empty.read_until, began + DRAIN_READ_LIMIT);
        // The limit after the backlog stays within the cap.
        let mut late = Drain::new(began, BacklogEnd::At("1-0".into()));
        tokio::time::sleep(DRAIN_CAP - Duration::from_secs(1)).await;
        late.read_new(Some("1-0"), Instant::now());
        assert_eq!(late.read_until, began + DRAIN_CAP);
    }

    #[tokio::test(start_paused = true)]
    async fn a_drain_whose_backlog_end_is_unknown_reads_it_past_the_read_limit_until_a_read_finds_none(
    ) {
        let began = Instant::now();
        let mut drain = Drain::new(began, BacklogEnd::Unknown);
        // 2,000 entries, one every 100 ms (`concurrency` 1): 200 s.
        for i in 0..2_000u64 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            drain.read_new(Some(&format!("{}-{}", u64::MAX - 1, i)), Instant::now());
            assert!(
                Instant::now() < drain.read_until,
                "cut at entry {i} after {:?}",
                began.elapsed()
            );
        }
        assert!(began.elapsed() > DRAIN_READ_LIMIT);
        assert_eq!(drain.read_until, began + DRAIN_CAP, "cut before the cap");
        // A read finds nothing new: the backlog was read.
        drain.read_new(None, Instant::now());
        assert_eq!(drain.read_until, Instant::now() + DRAIN_READ_LIMIT);
    }

    #[test]
    fn the_wait_for_publishes_under_way_leaves_half_the_no_progress_limit_to_the_backlog() {
        // An `XADD` with the default timeouts: 5 s + 3 s + 3 s.
        use super::super::metadata::{DEFAULT_DIAL_TIMEOUT, DEFAULT_READ_TIMEOUT};
        assert!(GATE_CLOSE_LIMIT > DEFAULT_DIAL_TIMEOUT + DEFAULT_READ_TIMEOUT * 2);
        assert!(GATE_CLOSE_LIMIT <= DRAIN_READ_LIMIT / 2);
    }

    #[tokio::test]
    async fn a_server_refusing_the_last_id_look_up_ends_the_backlog_by_the_clock() {
        let server = RedisServer::start().await;
        // An ACL written for Dapr, which never sends `XREVRANGE`.
        server
            .query(&["ACL", "SETUSER", "default", "-xrevrange"])
            .await
            .expect("ACL SETUSER");
        let mut conn = server.connection().await;
        let looked = stream_last_id(&mut conn, "orders").await;
        let before = wall_clock_ms();
        let BacklogEnd::ByTheClock(end_ms) = BacklogEnd::looked(&looked) else {
            panic!("no end by the clock");
        };
        assert!(
            (before + CLOCK_SKEW_MS..=wall_clock_ms() + CLOCK_SKEW_MS).contains(&end_ms),
            "{end_ms}"
        );
        let err = looked.expect_err("XREVRANGE allowed");
        assert_eq!(err.code(), Some("NOPERM"), "{err}");
    }

    /// With the stream's last id unknown, steady new traffic (an entry
    /// every 100 ms, its id the clock's, for 10 min) ends the backlog once
    /// entries pass the clock's end: reading stops within twice the read
    /// limit, not at the 30 min cap (the old broker took new traffic, and
    /// with another `consumerID` delivered it twice, for 30 min).
    #[tokio::test(start_paused = true)]
    async fn steady_traffic_ends_a_backlog_whose_end_is_taken_by_the_clock() {
        let began = Instant::now();
        let gate_closed_ms = 1_700_000_000_000;
        let mut drain = Drain::new(began, BacklogEnd::by_the_clock(gate_closed_ms));
        for i in 0..6_000u64 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let id = format!("{}-0", gate_closed_ms + (i + 1) * 100);
            drain.read_new(Some(&id), Instant::now());
        }
        assert!(
            drain.read_until <= began + 2 * DRAIN_READ_LIMIT,
            "reads until {:?} after the drain began",
            drain.read_until - began
        );
    }

    /// An end by the clock while the server's ids run 10 s ahead of it:
    /// the first entry read is already past it, so the clock is not
    /// trusted and a 2,000-entry backlog (100 ms each, 200 s) is read
    /// whole, not cut 120 s after its first entry.
    #[tokio::test(start_paused = true)]
    async fn a_server_clock_ahead_does_not_cut_a_backlog_ended_by_the_clock() {
        let began = Instant::now();
        let gate_closed_ms = 1_700_000_000_000;
        let mut drain = Drain::new(began, BacklogEnd::by_the_clock(gate_closed_ms));
        for i in 0..2_000u64 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let id = format!("{}-{i}", gate_closed_ms + 10_000);
            drain.read_new(Some(&id), Instant::now());
            assert!(Instant::now() < drain.read_until, "cut at entry {i}");
        }
        drain.read_new(None, Instant::now());
        assert!(drain.read_until <= Instant::now() + DRAIN_READ_LIMIT);
    }

    #[tokio::test]
    async fn the_backlog_ends_at_the_streams_last_entry() {
        let server = RedisServer::start().await;
        let mut conn = server.connection().await;
        let empty = stream_last_id(&mut conn, "orders").await;
        assert_eq!(BacklogEnd::looked(&empty), BacklogEnd::Empty);
        let mut last = String::new();
        for data in ["a", "b", "c"] {
            last = redis::cmd("XADD")
                .arg("orders")
                .arg("*")
                .arg("data")
                .arg(data)
                .query_async(&mut conn)
                .await
                .expect("XADD");
        }
        let looked = stream_last_id(&mut conn, "orders").await;
        assert_eq!(BacklogEnd::looked(&looked), BacklogEnd::At(last));
    }

    #[test]
    fn ids_claim_did_not_give_back_are_looked_up() {
        let entry = |id: &str| {
            Value::Array(vec![
                Value::BulkString(id.as_bytes().to_vec()),
                Value::Array(vec![
                    Value::BulkString(b"data".to_vec()),
                    Value::BulkString(b"x".to_vec()),
                ]),
            ])
        };
        // Redis 6.2: nil for an entry trimmed while pending; any version
        // leaves out one no longer pending that long.
        let reply = Value::Array(vec![entry("1-0"), Value::Nil, entry("4-0")]);
        let asked: Vec<String> = ["1-0", "2-0", "3-0", "4-0"].map(String::from).to_vec();
        let (entries, missing) = claimed_and_missing(&asked, reply);
        let given: Vec<&str> = entries.iter().map(|(id, _)| id.as_str()).collect();
        assert_eq!(given, ["1-0", "4-0"]);
        assert_eq!(missing, ["2-0", "3-0"]);
        let (entries, missing) = claimed_and_missing(&asked[..1], Value::Array(vec![entry("1-0")]));
        assert_eq!(entries.len(), 1);
        assert!(missing.is_empty());
    }

    #[tokio::test]
    async fn a_server_without_xpending_idle_is_told_from_other_errors() {
        let server = RedisServer::start().await;
        let mut conn = server.connection().await;
        ensure_group(&mut conn, "orders", "app")
            .await
            .expect("group");
        // Redis before 6.2 answers `XPENDING … IDLE` with a syntax error,
        // as 7.0 answers a range without a count.
        let refused: Result<Value, RedisError> = redis::cmd("XPENDING")
            .arg(&["orders", "app", "-", "+"])
            .query_async(&mut conn)
            .await;
        let refused = refused.expect_err("refused");
        assert!(refuses_xpending_idle(&refused), "{refused:?}");
        let no_group: Result<Value, RedisError> = redis::cmd("XPENDING")
            .arg(&["orders", "nobody", "IDLE", "1", "-", "+", "10"])
            .query_async(&mut conn)
            .await;
        let no_group = no_group.expect_err("no such group");
        assert!(!refuses_xpending_idle(&no_group), "{no_group:?}");
        let answered: Result<Value, RedisError> = redis::cmd("XPENDING")
            .arg(&["orders", "app", "IDLE", "1", "-", "+", "10"])
            .query_async(&mut conn)
            .await;
        assert!(answered.is_ok(), "{answered:?}");
    }
}
