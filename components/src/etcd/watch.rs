//! The watch task: one prefix watch on `keyPrefix` per shared entry (see
//! [`sharing`](super::sharing)), resumed where it left off whenever the
//! stream drops; each batch goes to the subscribers of every store sharing
//! it.
//!
//! The task starts from the revision after the initial read of the prefix
//! and keeps `last_seen`, the newest revision it has applied. Each watch
//! response's events newer than `last_seen` update the cache and are
//! published to the subscribers (a delete with an empty value), all events
//! of one response in one batch; older ones (already seen) are skipped, so
//! nothing is published twice. Progress notifications advance `last_seen`
//! too.
//!
//! * **Dropped stream, connection error:** wait (exponential backoff from
//!   `watchRetryMs`, at most 30 s, reset once a resumed watch delivered a
//!   response: a watch created and failing at once keeps backing off),
//!   then watch again after `last_seen` — nothing missed — once the
//!   server's history is shown to be the one the watch followed: the
//!   prefix read at revision `last_seen` must equal the cache (every key,
//!   value and `mod_revision`). A server wiped, re-created or restored
//!   from a snapshot while the stream was down may be past `last_seen`
//!   already (writes under any prefix count) with another history; its
//!   changes at or below `last_seen` would never be delivered. A
//!   difference, or a `last_seen` compacted away or not reached, means a
//!   re-read (below). The check costs one read of the prefix per
//!   reconnection, as a re-read would, but unlike a re-read it keeps
//!   every change made meanwhile (a re-read publishes only the latest
//!   value of each key).
//! * **Compaction** (the revision to resume from is gone: the response
//!   carries a `compact_revision`, or the watch is canceled for it), or a
//!   server whose history differs or lacks `last_seen` (restored or
//!   re-created, see above and below): re-read the whole prefix, publish
//!   what differs from the cache (changed values, removed keys with an
//!   empty value), and watch again from that read's revision + 1.
//! * **A response over `maxResponseBytes`** (a catch-up on many revisions
//!   of large values after a disconnect; etcd sends up to 1000 revisions
//!   in one response): re-read the prefix, as for a compaction — sized by
//!   the current values, not by every revision meanwhile — and watch from
//!   that read's revision + 1; resuming from `last_seen + 1` would get
//!   the same response for ever. The watch asks for `fragment`, so etcd
//!   splits a large response; the fragments are joined (up to
//!   `maxResponseBytes` in all, else the re-read) before they are applied
//!   (see [`fragments`]).
//! * **A member behind the last revision seen** (the `created` answer of
//!   the resumed watch carries a lower revision): after a failover, the
//!   next member may not have applied every write the old one had — a
//!   normal lag, not a lost history. etcd serves the watch from
//!   `last_seen + 1` anyway (it waits for those revisions), so it resumes
//!   once the history is checked as after a failed stream (that read is
//!   linearizable: the member catches up first); only a revision missing
//!   from its history (compacted, or never reached) or keys that differ
//!   mean a re-read. A re-read here would publish only the latest value of
//!   keys changed several times meanwhile.
//! * **A silent member** (its stream open, its keep-alive pings answered,
//!   its apply loop stuck — a disk stall): after [`PROGRESS_CHECK_AFTER`]
//!   without a response the task asks the member for its progress (a
//!   progress request on the stream); with no response within
//!   `dialTimeout` + [`ANSWER_MARGIN`] the watch counts as failed
//!   (reported to readiness) and resumes on the next member, as after a
//!   dropped stream. etcd's own progress notifications (asked for with
//!   `progress_notify`) come every 10 minutes only, by default. The watch
//!   starts at `last_seen` itself, not `last_seen + 1`, so that etcd
//!   3.6.2+ answers on a quiet cluster (see `follow`); etcd's gRPC proxy
//!   and etcd before 3.4 ignore the request, so behind them a quiet watch
//!   is left at each check (Known limits). The answer's revision is not taken as progress (see
//!   [`WatchStream::request_progress`](rewire_etcd::WatchStream::request_progress)).
//!   A member that still answers but has stopped applying is not found
//!   out this way.
//! * **New TLS material** (the client's channels replaced, see
//!   [`shared`](super::shared)): the stream on the old channels is
//!   dropped and the prefix watched again at once, on the new ones, after
//!   `last_seen` — nothing missed — once the history is checked as
//!   after a failed stream (one read of the prefix per rotation); a
//!   backoff wait in progress ends. The new channels may reach another
//!   server than the old stream did: re-issued certificates often come
//!   with a re-created cluster (a pod re-created, cert-manager), and a
//!   stream to the old one may hang silently (no reset, no keep-alive
//!   answer yet) rather than fail.
//!
//! The task ends when its token is cancelled: the last store sharing it
//! closed, or the shutdown of the runtimes of all of them.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::backoff::Backoff;
use rewire_etcd::pb::{EventType, RangeRequest, WatchCreateRequest, WatchResponse};
use rewire_etcd::{prefix_range, Client, WatchStream};
use rewire_runtime::{ComponentKey, ConfigItem};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::cache::{entry_of, item_at, read_prefix, Difference, Entry, SharedCache};
use super::fanout::Fanout;
use super::keys::KeyLayout;
use super::metadata::{EtcdSettings, MAX_WATCH_RETRY};
use fragments::Fragments;

mod fragments;

/// How long the stream may stay silent before the member is asked for its
/// progress: well under etcd's own progress notifications (every 10
/// minutes by default), and one small request per watch and period.
pub(crate) const PROGRESS_CHECK_AFTER: Duration = Duration::from_secs(30);
/// Added to `dialTimeout` for the answer to a progress request: etcd
/// answers it from memory, but behind any responses queued before it.
pub(crate) const ANSWER_MARGIN: Duration = Duration::from_secs(5);
/// The `watch_id` of etcd's answer to a progress request (it concerns
/// every watch of the stream).
const PROGRESS_WATCH_ID: i64 = -1;

/// When a silent stream is asked for progress, and given up.
#[derive(Debug, Clone, Copy)]
struct Watchdog {
    /// Silence after which the member is asked for its progress.
    quiet: Duration,
    /// How long the member then has to send anything.
    answer_within: Duration,
}

impl Watchdog {
    /// The bounds for a client whose requests may take `dial`.
    fn for_dial_timeout(dial: Duration) -> Self {
        Self {
            quiet: PROGRESS_CHECK_AFTER,
            answer_within: dial.saturating_add(ANSWER_MARGIN),
        }
    }
}

/// What woke the follower up.
enum Wake {
    /// A response, the end of the stream or its error.
    Message(Result<Option<WatchResponse>, rewire_etcd::Error>),
    /// The client's channels were replaced.
    Replaced,
    /// The watchdog's deadline passed.
    Due,
}

/// What the task needs: the client, the layout, the stores to feed, and
/// where the initial read left off.
pub(crate) struct Follower {
    key: ComponentKey,
    client: Client,
    settings: EtcdSettings,
    layout: KeyLayout,
    fanout: Arc<Fanout>,
    cache: SharedCache,
    last_seen: i64,
    backoff: Backoff,
    /// The error of the current failure streak, if one is going on.
    failing: Option<String>,
    /// Changes when the client's channels are replaced (new TLS material).
    replaced: tokio::sync::watch::Receiver<u64>,
    /// Set when a stream failed or the channels were replaced: the server
    /// may have lost or replaced its history meanwhile (or be another
    /// one), so `last_seen` is trusted only once the history at it
    /// matches the cache (see [`Self::history_matches`]).
    unverified: bool,
    /// Finds out a stream that stays silent.
    watchdog: Watchdog,
}

/// Why following the watch stream stopped.
#[derive(Debug)]
enum Interrupt {
    /// The revision to resume from is compacted away, or the server's
    /// history differs from the one followed: re-read the prefix.
    Resync(String),
    /// The stream or the connection failed: wait, then resume.
    Failed(String),
    /// The client's channels were replaced: resume on the new ones now.
    Replaced,
}

/// Resolves when the client's channels are next replaced.
async fn replacement(replaced: &mut tokio::sync::watch::Receiver<u64>) {
    if replaced.changed().await.is_err() {
        std::future::pending::<()>().await;
    }
}

impl Follower {
    /// A follower continuing from `last_seen`, the revision of the
    /// initial read that filled `cache`; `key` names the store that
    /// started it, in logs.
    pub(crate) fn new(
        key: ComponentKey,
        client: Client,
        settings: EtcdSettings,
        layout: KeyLayout,
        fanout: Arc<Fanout>,
        cache: SharedCache,
        last_seen: i64,
    ) -> Self {
        let backoff = Backoff::new(settings.watch_retry, MAX_WATCH_RETRY);
        let watchdog = Watchdog::for_dial_timeout(settings.dial);
        let replaced = client.replacements();
        Self {
            replaced,
            key,
            client,
            settings,
            layout,
            fanout,
            cache,
            last_seen,
            backoff,
            failing: None,
            unverified: false,
            watchdog,
        }
    }

    /// Follows the watch until `stop` is cancelled.
    pub(crate) async fn run(mut self, stop: CancellationToken) {
        debug!(component = %self.key, after_revision = self.last_seen, "etcd watch started.");
        let mut resync = false;
        loop {
            if resync {
                let read = tokio::select! {
                    () = stop.cancelled() => break,
                    read = self.resync() => read,
                };
                if let Err(err) = read {
                    if !self.wait_after(&stop, &err).await {
                        break;
                    }
                    continue;
                }
                resync = false;
            }
            let interrupt = tokio::select! {
                () = stop.cancelled() => break,
                interrupt = self.follow() => interrupt,
            };
            match interrupt {
                Interrupt::Resync(reason) => {
                    info!(component = %self.key, last_seen = self.last_seen, reason = %reason, "etcd watch cannot resume; re-reading the prefix.");
                    resync = true;
                }
                Interrupt::Failed(err) => {
                    self.unverified = true;
                    if !self.wait_after(&stop, &err).await {
                        break;
                    }
                }
                Interrupt::Replaced => {
                    self.unverified = true;
                    info!(component = %self.key, after_revision = self.last_seen, "etcd watch moves to the connection with the new TLS material.");
                }
            }
        }
        debug!(component = %self.key, last_seen = self.last_seen, "etcd watch stopped.");
    }

    /// Watches from `last_seen` (nothing after it missed) and applies
    /// responses until the stream stops.
    async fn follow(&mut self) -> Interrupt {
        let (key, range_end) = prefix_range(self.layout.prefix().as_bytes().to_vec());
        let create = WatchCreateRequest {
            key,
            range_end,
            // From `last_seen` itself (its events are skipped by `apply`),
            // not `last_seen + 1`: etcd 3.6.2+ (and 3.4/3.5 backports of
            // etcd-io/etcd#20229) leaves a progress request unanswered while
            // its revision is below the watch's start, so on a quiet cluster
            // the watchdog would take a healthy member for a stuck one.
            // The cost: a start at or below etcd's current revision puts
            // the watch in etcd's "unsynced" group, caught up by a loop
            // every 100 ms, so writes made while the watch is created
            // reach the subscribers up to ~100 ms later, once per watch.
            // `max(1)`: a start of 0 would mean "from now" to etcd.
            start_revision: self.last_seen.max(1),
            progress_notify: true,
            fragment: true,
            ..WatchCreateRequest::default()
        };
        let mut stream = match self.client.watch(create).await {
            Ok(stream) => stream,
            Err(err) => return Interrupt::Failed(self.describe(&err)),
        };
        let member = self.client.member();
        let mut heard = Instant::now();
        let mut asked: Option<Instant> = None;
        let mut fragments = Fragments::new(self.settings.max_response_bytes);
        // Whether a response was applied on this stream: the backoff is
        // reset only then, not on `created` alone.
        let mut delivered = false;
        loop {
            let due = match asked {
                Some(at) => at + self.watchdog.answer_within,
                None => heard + self.watchdog.quiet,
            };
            let wake = tokio::select! {
                message = stream.message() => Wake::Message(message),
                () = replacement(&mut self.replaced) => Wake::Replaced,
                () = tokio::time::sleep_until(due) => Wake::Due,
            };
            let message = match wake {
                Wake::Message(message) => message,
                Wake::Replaced => return Interrupt::Replaced,
                Wake::Due if asked.is_none() => {
                    debug!(component = %self.key, member = %member, "etcd watch silent; asking the member for its progress.");
                    stream.request_progress();
                    asked = Some(Instant::now());
                    continue;
                }
                Wake::Due => return self.silent(stream, &member, heard),
            };
            heard = Instant::now();
            asked = None;
            let response = match message {
                Ok(Some(response)) => response,
                Ok(None) => return Interrupt::Failed("the watch stream ended".into()),
                Err(err) if err.is_too_large() => {
                    return Interrupt::Resync(self.describe(&err));
                }
                Err(err) => return Interrupt::Failed(self.describe(&err)),
            };
            let response = match fragments.join(response) {
                Ok(Some(response)) => response,
                Ok(None) => continue,
                Err(over) => {
                    return Interrupt::Resync(format!(
                        "the fragments of a watch response hold {} bytes, more than the {} of `maxResponseBytes`",
                        over.bytes, over.limit
                    ))
                }
            };
            if response.compact_revision > 0 {
                return Interrupt::Resync(format!(
                    "revision {} is compacted (compacted up to {})",
                    self.last_seen, response.compact_revision
                ));
            }
            if response.canceled {
                let reason = &response.cancel_reason;
                if reason.contains("compact") {
                    return Interrupt::Resync(reason.to_string());
                }
                return Interrupt::Failed(format!("the server canceled the watch: {reason}"));
            }
            if response.created {
                let revision = response.header.as_ref().map_or(0, |h| h.revision);
                if revision < self.last_seen {
                    // Lagging (after a failover), or restored or
                    // re-created: the history check tells.
                    debug!(component = %self.key, member = %member, revision, last_seen = self.last_seen, "etcd member behind the last revision seen; checking its history.");
                    self.unverified = true;
                }
                if self.unverified {
                    match self.history_matches().await {
                        Ok(true) => self.unverified = false,
                        Ok(false) => {
                            return Interrupt::Resync(format!(
                                "the server's keys at revision {} differ from those the watch saw (re-created or restored?)",
                                self.last_seen
                            ))
                        }
                        Err(err) if err.is_revision_unavailable() => {
                            return Interrupt::Resync(format!(
                                "revision {} is not in the server's history: {err}",
                                self.last_seen
                            ))
                        }
                        Err(err) => return Interrupt::Failed(self.describe(&err)),
                    }
                }
                self.recovered();
                continue;
            }
            let before = self.last_seen;
            self.apply(&response);
            // Only a response that moved the watch on, or the member's
            // answer to a progress request, resets the backoff: a resumed
            // watch first gets the events at `last_seen` again.
            let answered = response.watch_id == PROGRESS_WATCH_ID && response.events.is_empty();
            if !delivered && (self.last_seen > before || answered) {
                delivered = true;
                self.backoff.reset();
            }
        }
    }

    /// Gives up `stream`, silent since `heard` even after a progress
    /// request: the client moves on from its member.
    fn silent(&self, stream: WatchStream, member: &str, heard: Instant) -> Interrupt {
        stream.abandon();
        let silent_ms = heard.elapsed().as_millis();
        Interrupt::Failed(self.settings.scrub(&format!(
            "etcd member {member} sent nothing on the watch for {silent_ms} ms, nor answered a progress request within {:?}; watching on the next member",
            self.watchdog.answer_within
        )))
    }

    /// Applies the events of `response` that are newer than `last_seen`.
    fn apply(&mut self, response: &WatchResponse) {
        let seen = self.last_seen;
        let mut newest = seen;
        let mut items: Vec<ConfigItem> = Vec::new();
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        for event in &response.events {
            let Some(kv) = &event.kv else { continue };
            let revision = kv.mod_revision;
            if revision <= seen {
                continue;
            }
            newest = newest.max(revision);
            let Some((path, entry)) = entry_of(kv) else {
                continue;
            };
            let value = match event.r#type() {
                EventType::Put => {
                    let value = entry.value.clone();
                    cache.put(path.clone(), entry);
                    value
                }
                EventType::Delete => {
                    cache.remove(&path);
                    String::new()
                }
            };
            items.extend(item_at(&self.layout, &path, value, revision));
        }
        drop(cache);
        if response.events.is_empty() && response.watch_id != PROGRESS_WATCH_ID {
            // A progress notification: no event at or below this revision
            // is still to come. Not so the answer to a progress request
            // (see `WatchStream::request_progress`), proof of life only.
            newest = newest.max(response.header.as_ref().map_or(0, |h| h.revision));
        }
        self.last_seen = newest;
        if !items.is_empty() {
            debug!(component = %self.key, revision = newest, items = items.len(), "etcd changes published.");
            self.fanout.publish(&items);
        }
    }

    /// Whether the server's prefix at revision `last_seen` is what the
    /// cache holds: then its history is the one the watch followed, and
    /// watching after `last_seen` misses nothing.
    async fn history_matches(&self) -> Result<bool, rewire_etcd::Error> {
        let (key, range_end) = prefix_range(self.layout.prefix().as_bytes().to_vec());
        let request = RangeRequest {
            key,
            range_end,
            revision: self.last_seen,
            ..RangeRequest::default()
        };
        let response = self.client.range(request).await?;
        let entries: BTreeMap<String, Entry> = response.kvs.iter().filter_map(entry_of).collect();
        let cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        Ok(cache.holds(&entries))
    }

    /// Re-reads the prefix, publishes what differs from the cache and
    /// continues from the read's revision.
    async fn resync(&mut self) -> Result<(), String> {
        let snapshot = read_prefix(&self.client, &self.layout)
            .await
            .map_err(|err| self.describe(&err))?;
        let revision = snapshot.revision;
        let (differences, keys) = {
            let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
            (cache.replace(snapshot.entries), cache.len())
        };
        let mut removed = 0;
        let items: Vec<ConfigItem> = differences
            .into_iter()
            .filter_map(|difference| match difference {
                Difference::Changed(path, entry) => {
                    item_at(&self.layout, &path, entry.value, entry.mod_revision)
                }
                Difference::Removed(path) => {
                    removed += 1;
                    item_at(&self.layout, &path, String::new(), revision)
                }
            })
            .collect();
        self.last_seen = revision;
        self.unverified = false;
        info!(
            component = %self.key,
            revision,
            keys,
            published = items.len(),
            removed,
            "etcd prefix re-read; watching again."
        );
        if !items.is_empty() {
            self.fanout.publish(&items);
        }
        Ok(())
    }

    /// Logs `err` (a warning once per failure streak) and waits the next
    /// backoff. Returns false if `stop` was cancelled meanwhile.
    async fn wait_after(&mut self, stop: &CancellationToken, err: &str) -> bool {
        let wait = self.backoff.next_wait();
        let retry_in_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
        if self.failing.is_none() {
            warn!(component = %self.key, error = %err, last_seen = self.last_seen, retry_in_ms, "etcd watch interrupted; will resume without missing a change.");
        } else {
            debug!(component = %self.key, error = %err, retry_in_ms, "etcd watch still interrupted.");
        }
        self.failing = Some(err.to_string());
        self.fanout.watch_failed(err);
        tokio::select! {
            () = stop.cancelled() => false,
            () = tokio::time::sleep(wait) => true,
            () = replacement(&mut self.replaced) => true,
        }
    }

    /// Records a watch created again (the backoff is reset once it
    /// delivers a response, see [`Self::follow`]).
    fn recovered(&mut self) {
        self.fanout.watch_recovered();
        if self.failing.take().is_some() {
            info!(component = %self.key, member = %self.client.member(), after_revision = self.last_seen, "etcd watch resumed.");
        }
    }

    fn describe(&self, err: &rewire_etcd::Error) -> String {
        self.settings.scrub(&format!(
            "etcd at {}: {err}",
            self.settings.endpoints_text()
        ))
    }
}

#[cfg(test)]
mod tests;
