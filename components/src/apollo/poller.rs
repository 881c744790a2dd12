//! The long-poll task: waits on the config service's notifications and
//! re-fetches the namespaces they name.
//!
//! Each round first re-fetches the namespaces still served from the backup
//! cache, then long-polls `notifications/v2` with the ids known so far (a
//! namespace whose re-fetch fails, other than for an instance down, fails
//! the round only after the poll, so it never stops the others from
//! following their releases). A
//! namespace's new id is kept only once its release is in, so a failed
//! fetch is retried by the next poll (which answers at once); a 404 for a
//! namespace with a release held is an answer (the release is kept, see
//! [`Refresher`]), so its id advances and the poll is held again. The
//! fetch carries the notification's `messages` (kept for the namespace's
//! later fetches too), so that a config service whose release cache lags
//! reloads it rather than answer 304 for the release just notified. Names
//! are matched without their `.properties` suffix, which Apollo strips; a
//! notification that matches no served namespace is a failure (the ids
//! cannot advance, so polling again at once would loop). Failures wait
//! with exponential backoff; the first failure of a streak is logged as a
//! warning, the recovery as info. The task ends when its token is
//! cancelled (the runtime's shutdown, or `close`).
//!
//! A poll answered with nothing new (304, or `200 []`) sooner than
//! `retryIntervalMs` after it was sent was not held: a proxy or a
//! misbehaving config service answering at once would otherwise be polled
//! again and again in a busy loop. The next poll then goes out
//! `retryIntervalMs` after that one was sent (at most one such poll per
//! interval, as the Java client's long-poll rate limit). A poll that
//! answers with notifications is followed by the next one at once: real
//! changes are never held back.
//!
//! Notification ids are Apollo's own (one database's message ids): a poll
//! is answered only past the id sent. When the meta server announces
//! instances none of which was known (another Apollo, maybe; the same
//! ones reordered, or one replaced, are not), every id is forgotten (-1)
//! before the next poll, which the service then answers at once with its
//! current ids; a release behind a poll that never answers is found by the
//! periodic refresh ([`periodic`](super::periodic)), which forgets the
//! namespace's id. The
//! id the next poll learns tells why: below the one forgotten, the
//! service's ids are below ours (warned about); at or above it, the poll
//! was only late (nothing to say).
//!
//! When new TLS material is swapped in (see [`ConfigServices::replace_tls`](super::services::ConfigServices::replace_tls)),
//! the round in progress is dropped (a poll held on the old client, or a
//! backoff wait) and a new one starts at once on the new clients, with the
//! same notification ids: no release is missed.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::error::ApolloError;
use super::refresh::Refresher;
use crate::backoff::Backoff;

/// A running long-poll task.
#[derive(Debug)]
pub(crate) struct PollerTask {
    stop: CancellationToken,
    task: JoinHandle<()>,
    /// The periodic refresh (see [`periodic`](super::periodic)).
    refreshing: JoinHandle<()>,
}

impl PollerTask {
    /// Starts polling for `refresher`; stops when `stop` is cancelled.
    /// `min_gap` is the least time between sending two polls when the
    /// first answered with nothing new (the retry interval); every
    /// `refresh_every`, each namespace is also fetched whether or not a
    /// poll announced a release (see [`periodic`](super::periodic)).
    pub(crate) fn start(
        refresher: Arc<Refresher>,
        backoff: Backoff,
        min_gap: Duration,
        refresh_every: Duration,
        stop: CancellationToken,
    ) -> Self {
        let refreshing = tokio::spawn(super::periodic::run(
            Arc::clone(&refresher),
            refresh_every,
            stop.clone(),
        ));
        let poller = Poller {
            refresher,
            backoff,
            min_gap,
            failing: None,
        };
        let task = tokio::spawn(poller.run(stop.clone()));
        Self {
            stop,
            task,
            refreshing,
        }
    }

    /// The token that stops the task (cancelled in `close`).
    pub(crate) fn stop_token(&self) -> &CancellationToken {
        &self.stop
    }

    /// Stops the task and waits for it to end.
    pub(crate) async fn stop(self) {
        self.stop.cancel();
        let _ = self.task.await;
        let _ = self.refreshing.await;
    }
}

struct Poller {
    refresher: Arc<Refresher>,
    backoff: Backoff,
    /// The least time between sending a poll answered with nothing new
    /// and sending the next one.
    min_gap: Duration,
    /// The error of the current failure streak, if one is going on.
    failing: Option<String>,
}

/// How a round that did not fail ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Polled {
    /// The poll named namespaces with new releases (fetched).
    Notified,
    /// The poll (sent at `sent`) answered nothing new: 304, `200 []`, or
    /// only ids already held.
    Nothing { sent: tokio::time::Instant },
}

/// The wait before the next poll after one answered with nothing new
/// `elapsed` after it was sent: the rest of `min_gap`, if any. A poll the
/// service held (60 s in Apollo) needs none.
fn early_answer_wait(elapsed: Duration, min_gap: Duration) -> Option<Duration> {
    Some(min_gap.saturating_sub(elapsed)).filter(|wait| !wait.is_zero())
}

/// Warns when the id the service announced for `namespace` is below the
/// one `forgotten` after the periodic refresh found a release the poll had
/// not announced: the service's ids are below ours (a restored database,
/// another Apollo), which the poll alone would never have followed. At or
/// above it, the poll was merely late: nothing to say.
fn warn_if_ids_went_back(refresher: &Refresher, namespace: &str, forgotten: Option<i64>, id: i64) {
    let Some(held) = forgotten.filter(|held| id < *held) else {
        return;
    };
    warn!(
        component = %refresher.key,
        server = %refresher.client.server(),
        namespace,
        held,
        announced = id,
        "Apollo release found by the periodic refresh, never announced by the long poll: the config service's notification ids are below ours (a restored or another Apollo); following releases from its ids."
    );
}

/// Resolves when new TLS material is next swapped in.
async fn replacement(replaced: &mut tokio::sync::watch::Receiver<u64>) {
    if replaced.changed().await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// The notified namespace names that match none served: counted, and
/// the first few kept cut short for the error (an answer of up to 16 MiB
/// could name any number of any length; the error is held as the
/// readiness reason and shown in status).
#[derive(Debug, Default)]
struct Unmatched {
    count: usize,
    quoted: Vec<String>,
}

impl Unmatched {
    /// Names quoted in the error.
    const QUOTED: usize = 3;
    /// Characters kept of a quoted name.
    const NAME_CHARS: usize = 64;

    fn add(&mut self, name: &str) {
        self.count += 1;
        if self.quoted.len() < Self::QUOTED {
            let quoted = match name.char_indices().nth(Self::NAME_CHARS) {
                Some((cut, _)) => format!("`{}…`", &name[..cut]),
                None => format!("`{name}`"),
            };
            self.quoted.push(quoted);
        }
    }

    /// "namespace(s) `a`, `b`, `c` and 5 more".
    fn describe(&self) -> String {
        let more = match self.count.saturating_sub(self.quoted.len()) {
            0 => String::new(),
            more => format!(" and {more} more"),
        };
        format!(
            "{} namespace(s) {}{more}",
            self.count,
            self.quoted.join(", ")
        )
    }
}

impl Poller {
    async fn run(self, stop: CancellationToken) {
        let refresher = Arc::clone(&self.refresher);
        self.run_rounds(stop, move || {
            let refresher = Arc::clone(&refresher);
            async move { Self::round(&refresher).await }
        })
        .await;
    }

    /// The task's loop around `next_round` ([`round`](Self::round); a
    /// stand-in in tests): what follows each round, and when.
    async fn run_rounds<F, Fut>(mut self, stop: CancellationToken, mut next_round: F)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<Polled, ApolloError>>,
    {
        debug!(component = %self.refresher.key, "Apollo long polling started.");
        let mut replaced = self.refresher.client.replacements();
        loop {
            let round = tokio::select! {
                () = stop.cancelled() => break,
                round = next_round() => round,
                () = replacement(&mut replaced) => {
                    debug!(component = %self.refresher.key, "Apollo long poll moves to the client with the new TLS material.");
                    continue;
                }
            };
            let wait = match round {
                Ok(Polled::Notified) => {
                    self.succeeded();
                    continue;
                }
                Ok(Polled::Nothing { sent }) => {
                    self.succeeded();
                    match early_answer_wait(sent.elapsed(), self.min_gap) {
                        Some(wait) => {
                            debug!(
                                component = %self.refresher.key,
                                wait_ms = wait.as_millis() as u64,
                                "Apollo long poll answered at once with nothing new; waiting before the next."
                            );
                            wait
                        }
                        None => continue,
                    }
                }
                Err(err) => self.failed(&err),
            };
            tokio::select! {
                () = stop.cancelled() => break,
                () = tokio::time::sleep(wait) => {}
                () = replacement(&mut replaced) => {}
            }
        }
        debug!(component = %self.refresher.key, "Apollo long polling stopped.");
    }

    /// One round: catch up on unconfirmed namespaces, then one long poll
    /// and the fetches it calls for.
    ///
    /// A namespace that cannot be caught up on (its answer too large or
    /// malformed, say) does not hold back the others: the poll and its
    /// fetches still go out, and the round then fails with the first such
    /// error (so it backs off; the namespace's id stays -1, so the next
    /// poll answers at once and it is tried again). Only an instance down
    /// ends the round at once: the poll would go to the same instances.
    async fn round(refresher: &Refresher) -> Result<Polled, ApolloError> {
        // A backup left behind by a failed write is tried again each
        // round (never waited for here).
        refresher.retry_backups();
        let mut first_error = None;
        for namespace in refresher.live.unconfirmed() {
            match refresher.refresh(&namespace).await {
                Ok(_) => {}
                Err(err) if err.is_instance_down() => return Err(err),
                Err(err) => {
                    first_error.get_or_insert(err);
                }
            }
        }
        let polled = Self::poll_and_fetch(refresher).await;
        match first_error {
            Some(err) => Err(err),
            None => polled,
        }
    }

    /// One long poll and the fetches it calls for.
    async fn poll_and_fetch(refresher: &Refresher) -> Result<Polled, ApolloError> {
        // Asked here rather than by the poll, so that the poll carries the
        // ids for the instances it goes to: other instances may be another
        // Apollo, whose ids are below ours and would never answer it.
        refresher.client.discover_if_due().await?;
        if refresher.client.take_moved() {
            refresher.live.forget_notification_ids();
        }
        let known = refresher.live.notifications();
        let sent = tokio::time::Instant::now();
        let notifications = match refresher.client.poll(&known).await? {
            Some(notifications) if !notifications.is_empty() => notifications,
            _ => return Ok(Polled::Nothing { sent }),
        };
        // The ids held before this poll, by served namespace (`known` is in
        // the served order): an answer that advances none brings nothing
        // new, however it is dressed.
        let before: std::collections::HashMap<&str, i64> = refresher
            .live
            .order()
            .iter()
            .map(String::as_str)
            .zip(known.iter().map(|n| n.notification_id))
            .collect();
        let mut advanced = false;
        let mut first_error = None;
        let mut unmatched = Unmatched::default();
        for notification in notifications {
            let served = refresher.live.resolve(&notification.namespace_name);
            if served.is_empty() {
                unmatched.add(&notification.namespace_name);
                continue;
            }
            for namespace in served {
                // The notification's messages go with the fetch (and every
                // later one), so a config service answers from the release
                // they name rather than from a release cache that predates
                // it: a 304 then means the release is the one we hold, and
                // the id is kept. A 404 with a release held is an answer
                // too (the release is kept): the id advances, else every
                // poll would be answered at once with it.
                let messages = notification.messages.as_ref();
                match refresher.refresh_notified(namespace, messages).await {
                    Ok(_) => {
                        let id = notification.notification_id;
                        advanced |= before.get(namespace).is_none_or(|held| id > *held);
                        let forgotten = refresher.live.set_notification_id(namespace, id);
                        warn_if_ids_went_back(refresher, namespace, forgotten, id);
                    }
                    Err(err) => {
                        first_error.get_or_insert(err);
                    }
                }
            }
        }
        if let Some(err) = first_error {
            return Err(err);
        }
        if unmatched.count > 0 {
            // Our ids stay as they were, so the next poll would be answered
            // at once: a failure, so that it waits (backoff) and is seen.
            return Err(ApolloError::Config(format!(
                "{} notified {} that match none served ({}); the notification ids cannot advance",
                refresher.client.server(),
                unmatched.describe(),
                refresher.live.order().join(","),
            )));
        }
        Ok(match advanced {
            true => Polled::Notified,
            false => Polled::Nothing { sent },
        })
    }

    fn succeeded(&mut self) {
        self.backoff.reset();
        self.refresher.live.poll_recovered();
        if self.failing.take().is_some() {
            info!(
                component = %self.refresher.key,
                server = %self.refresher.client.server(),
                "Config service reachable again."
            );
        }
    }

    /// Logs `err` (once per streak at warning level) and returns the wait.
    fn failed(&mut self, err: &ApolloError) -> Duration {
        let wait = self.backoff.next_wait();
        let message = err.to_string();
        self.refresher.live.poll_failed(&message);
        if self.failing.is_none() {
            warn!(
                component = %self.refresher.key,
                error = %message,
                retry_in_ms = wait.as_millis() as u64,
                "Apollo long polling failed; keeping the last good configuration."
            );
        } else if self.failing.as_deref() != Some(message.as_str()) {
            warn!(
                component = %self.refresher.key,
                error = %message,
                retry_in_ms = wait.as_millis() as u64,
                "Apollo long polling still failing."
            );
        } else {
            debug!(
                component = %self.refresher.key,
                error = %message,
                retry_in_ms = wait.as_millis() as u64,
                "Apollo long polling still failing."
            );
        }
        self.failing = Some(message);
        wait
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apollo::namespaces::LiveNamespaces;
    use crate::apollo::services::{ConfigServices, InstanceSettings};
    use tokio::time::Instant;

    #[test]
    fn unmatched_names_are_counted_and_a_few_quoted_short() {
        let mut unmatched = Unmatched::default();
        unmatched.add("other");
        assert_eq!(unmatched.describe(), "1 namespace(s) `other`");
        let long = "n".repeat(1 << 20);
        for _ in 0..10_000 {
            unmatched.add(&long);
        }
        let text = unmatched.describe();
        assert!(text.len() < 400, "{} bytes", text.len());
        assert!(
            text.starts_with("10001 namespace(s) `other`, `nnn"),
            "{text}"
        );
        assert!(text.ends_with("…` and 9998 more"), "{text}");
    }

    /// What a scripted round answers.
    #[derive(Clone, Copy)]
    enum Outcome {
        Fails,
        Notified,
        NothingAtOnce,
    }

    fn ms(millis: u64) -> Duration {
        Duration::from_millis(millis)
    }

    /// A poller backing off from `min` to `max` and spacing early answers
    /// by `gap`, on a config service that is never asked (its rounds are
    /// scripted).
    async fn poller(min: Duration, max: Duration, gap: Duration) -> Poller {
        let settings = InstanceSettings {
            app_id: "app".into(),
            cluster: "default".into(),
            secret: None,
            ip: None,
            request_timeout: Duration::from_secs(10),
            long_poll_timeout: Duration::from_secs(10),
            tls: crate::tls::http_config(None).unwrap(),
            tls_configured: false,
        };
        let services = ConfigServices::new(
            "http://127.0.0.1:9",
            None,
            Duration::from_secs(60),
            settings,
        )
        .await
        .unwrap();
        let live = Arc::new(LiveNamespaces::new(vec!["application".into()]));
        let key = rewire_runtime::ComponentKey::new("configuration", "apollo");
        let refresher = Refresher::new(key, services, live, None, "app", "default");
        Poller {
            refresher: Arc::new(refresher),
            backoff: Backoff::new(min, max),
            min_gap: gap,
            failing: None,
        }
    }

    /// Runs `poller` through `script` (one round each; the round after
    /// the last stops it) and returns the time between the starts of
    /// consecutive rounds, on the paused clock.
    async fn gaps_between_rounds(poller: Poller, script: &[Outcome]) -> Vec<Duration> {
        let stop = CancellationToken::new();
        let starts = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut script = script.iter().copied();
        let rounds = {
            let (stop, starts) = (stop.clone(), Arc::clone(&starts));
            move || {
                starts.lock().unwrap().push(Instant::now());
                let next = script.next();
                if next.is_none() {
                    stop.cancel();
                }
                async move {
                    match next {
                        Some(Outcome::Fails) => Err(ApolloError::Config("scripted".into())),
                        Some(Outcome::Notified) => Ok(Polled::Notified),
                        Some(Outcome::NothingAtOnce) => Ok(Polled::Nothing {
                            sent: Instant::now(),
                        }),
                        None => std::future::pending().await,
                    }
                }
            }
        };
        let ran = poller.run_rounds(stop, rounds);
        tokio::time::timeout(Duration::from_secs(3600), ran)
            .await
            .expect("the scripted rounds end");
        let starts = starts.lock().unwrap();
        starts.windows(2).map(|w| w[1] - w[0]).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn failed_rounds_wait_doubling_to_the_maximum_and_a_success_starts_over() {
        use Outcome::*;
        let poller = poller(ms(50), ms(400), ms(1000)).await;
        let script = [
            Fails, Fails, Fails, Fails, Fails, Notified, Fails, Fails, Notified,
        ];
        let gaps = gaps_between_rounds(poller, &script).await;
        let expected = [50, 100, 200, 400, 400, 0, 50, 100, 0].map(ms);
        assert_eq!(gaps, expected);
    }

    #[tokio::test(start_paused = true)]
    async fn a_round_answered_at_once_with_nothing_new_is_followed_one_gap_later() {
        use Outcome::*;
        let poller = poller(ms(50), ms(400), ms(1000)).await;
        // Nothing new at once: the next poll a gap later (not the backoff,
        // and not at once); a notification: the next poll at once.
        let script = [
            NothingAtOnce,
            NothingAtOnce,
            Notified,
            Fails,
            NothingAtOnce,
            Fails,
        ];
        let gaps = gaps_between_rounds(poller, &script).await;
        let expected = [1000, 1000, 0, 50, 1000, 50].map(ms);
        assert_eq!(gaps, expected);
    }

    #[test]
    fn only_a_poll_answered_before_the_gap_waits_and_only_the_rest_of_it() {
        let gap = Duration::from_millis(1000);
        assert_eq!(
            early_answer_wait(Duration::ZERO, gap),
            Some(Duration::from_millis(1000))
        );
        assert_eq!(
            early_answer_wait(Duration::from_millis(300), gap),
            Some(Duration::from_millis(700))
        );
        assert_eq!(early_answer_wait(gap, gap), None);
        assert_eq!(early_answer_wait(Duration::from_secs(60), gap), None);
    }
}
