//! A push is answered with the truth before its caller gives up: the
//! reload runs in its own task (so it is applied, or not, whatever the
//! caller does), and the call waits for it until shortly before its
//! deadline — the caller's `grpc-timeout` or the Lifecycle timeout,
//! whichever is sooner. A push still waiting then (queued behind other
//! reloads, or its own init still running) is answered `queued`, saying
//! behind how many pushes it waits and that it is not applied yet — never
//! `CANCELLED` for something applied later. The deadline counts from when
//! the request's head arrived, as tonic's and the server's bound do, not
//! from when the handler runs (after the upload, decoding and parsing): a
//! push with nothing left of it is answered `queued` at once.
//!
//! The Lifecycle timeout is at least the runtime's init timeout plus
//! [`INIT_MARGIN`], so a push whose own component hangs in `init` gets its
//! rolled-back NACK in time when nothing else is queued.
//!
//! A push answered `queued` frees its call, but its task keeps its patch
//! until its turn: the backlog is bounded ([`MAX_PENDING_PUSHES`],
//! [`MAX_PENDING_BYTES`]) and a push beyond it is refused with
//! `RESOURCE_EXHAUSTED`, so a client looping short-deadline pushes can
//! neither grow memory without end nor starve every later reload.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;
use tonic::metadata::MetadataMap;
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use rewire_runtime::{ReloadError, ReloadRecord};

/// How much longer than the runtime's init timeout the Lifecycle timeout is
/// at least.
pub(super) const INIT_MARGIN: Duration = Duration::from_secs(15);

/// The least time kept between the answer and the deadline.
const MIN_MARGIN: Duration = Duration::from_millis(50);

/// Most pushes of this API not finished at once. Reloads are serialised,
/// so a backlog this deep is already minutes of work at a slow init; a
/// control plane pushing every component of a sidecar at once fits (as
/// many as a subscriber's queue holds, 64 messages).
pub(super) const MAX_PENDING_PUSHES: usize = 64;

/// Most bytes the unfinished pushes hold together (each patch is kept
/// until its turn, charged as parsed, not as sent: a JSON array of `0`s
/// takes 16–32 times its text): as much as all subscriber queues together.
pub(super) const MAX_PENDING_BYTES: usize = 64 * 1024 * 1024;

/// What became of a push when its answer was due.
pub(super) enum Waited {
    /// The reload finished: ACK or NACK.
    Done(Result<ReloadRecord, ReloadError>),
    /// Still waiting, behind this many other pushes.
    Queued {
        /// Pushes of this API ahead of it when it arrived.
        ahead: usize,
        /// How long the call waited.
        waited: Duration,
    },
}

/// The pushes of this API that have not finished.
#[derive(Clone)]
pub(super) struct PushQueue {
    backlog: Arc<Mutex<Backlog>>,
    timeout: Duration,
}

/// How many pushes are unfinished, and the bytes of their requests.
#[derive(Default)]
struct Backlog {
    pushes: usize,
    bytes: usize,
}

/// Counts a push (and its bytes) as pending until its reload ends (or its
/// task is dropped).
struct Pending {
    backlog: Arc<Mutex<Backlog>>,
    bytes: usize,
}

impl Drop for Pending {
    fn drop(&mut self) {
        let mut backlog = self.backlog.lock().unwrap_or_else(PoisonError::into_inner);
        backlog.pushes -= 1;
        backlog.bytes -= self.bytes;
    }
}

impl PushQueue {
    /// Pushes answered within `timeout` at most.
    pub(super) fn new(timeout: Duration) -> Self {
        Self {
            backlog: Arc::default(),
            timeout,
        }
    }

    /// Runs the `admitted` push's `reload` to its end in its own task;
    /// waits for it until the answer is due for the caller `clock` tells
    /// of (at once when the time spent since its request arrived used it
    /// up).
    pub(super) async fn run<F>(
        &self,
        clock: &CallerClock,
        admitted: Admitted,
        reload: F,
    ) -> Result<Waited, Status>
    where
        F: Future<Output = Result<ReloadRecord, ReloadError>> + Send + 'static,
    {
        let Admitted { ahead, pending } = admitted;
        let task = tokio::spawn(async move {
            let _pending = pending;
            reload.await
        });
        let due = answer_due(clock.deadline, self.timeout);
        // What the upload, decoding and parsing took since the request's
        // head arrived is already spent.
        let left = clock
            .arrived
            .map_or(due, |arrived| due.saturating_sub(arrived.elapsed()));
        match tokio::time::timeout(left, task).await {
            Ok(Ok(result)) => Ok(Waited::Done(result)),
            Ok(Err(failed)) => Err(Status::internal(format!(
                "the reload task failed: {failed}"
            ))),
            Err(_) => Ok(Waited::Queued { ahead, waited: due }),
        }
    }

    /// Counts a push holding `bytes` as pending, checked and counted under
    /// one lock (no race past the limits), before it is parsed (so pushes
    /// being parsed together cannot pass the budget either): the pushes
    /// ahead of it, or `RESOURCE_EXHAUSTED` naming the limit and the
    /// backlog. A push is always taken when nothing is pending.
    pub(super) fn admit(&self, bytes: usize) -> Result<Admitted, Status> {
        let mut backlog = self.backlog.lock().unwrap_or_else(PoisonError::into_inner);
        let ahead = backlog.pushes;
        if ahead >= MAX_PENDING_PUSHES {
            return Err(backlog_full(format!(
                "{ahead} pushes are already queued, the most this API keeps pending \
                 ({MAX_PENDING_PUSHES}): push again once they are applied (see GetStatus)"
            )));
        }
        if ahead > 0 && backlog.bytes.saturating_add(bytes) > MAX_PENDING_BYTES {
            return Err(backlog_full(format!(
                "the {ahead} pushes already queued hold {} bytes; this one would hold {bytes} \
                 (parsed), past the {MAX_PENDING_BYTES} bytes this API keeps pending: push \
                 again once they are applied (see GetStatus)",
                backlog.bytes
            )));
        }
        backlog.pushes += 1;
        backlog.bytes += bytes;
        let pending = Pending {
            backlog: Arc::clone(&self.backlog),
            bytes,
        };
        Ok(Admitted { ahead, pending })
    }
}

/// A push counted in the backlog, to [`run`](PushQueue::run); dropped
/// unrun (a push refused once parsed), it leaves the backlog.
pub(super) struct Admitted {
    /// Pushes of this API ahead of it when it arrived.
    ahead: usize,
    pending: Pending,
}

impl Admitted {
    /// Gives back `bytes` of the push's charge (at most all of it): what it
    /// held only while it was parsed.
    pub(super) fn give_back(&mut self, bytes: usize) {
        let bytes = bytes.min(self.pending.bytes);
        let mut backlog = self
            .pending
            .backlog
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        backlog.bytes -= bytes;
        self.pending.bytes -= bytes;
    }
}

/// `ErrorInfo.reason` of a push refused for a full backlog, with domain
/// [`REFUSAL_DOMAIN`]: the one `RESOURCE_EXHAUSTED` of the Lifecycle API a
/// client may retry as is (`rewire apply` exits busy only for it; a request
/// over `max_request_bytes` is `RESOURCE_EXHAUSTED` too, and never passes).
pub(super) const PUSH_BACKLOG_FULL: &str = "PUSH_BACKLOG_FULL";

/// `ErrorInfo.domain` of [`PUSH_BACKLOG_FULL`].
pub(super) const REFUSAL_DOMAIN: &str = "rewire";

/// `RESOURCE_EXHAUSTED` saying `message`, marked [`PUSH_BACKLOG_FULL`].
fn backlog_full(message: String) -> Status {
    let details = ErrorDetails::with_error_info(PUSH_BACKLOG_FULL, REFUSAL_DOMAIN, HashMap::new());
    Status::with_error_details(Code::ResourceExhausted, message, details)
}

/// `ErrorInfo.reason` of a push whose reload the sidecar's shutdown cut
/// short (nothing of it in force), with domain [`REFUSAL_DOMAIN`]: the one
/// `UNAVAILABLE` of the Lifecycle API that says what became of the push
/// (`rewire apply` takes any other `UNAVAILABLE`, a proxy's or a
/// connection's, for an outcome unknown).
pub(super) const RELOAD_CUT_SHORT: &str = "RELOAD_CUT_SHORT";

/// `UNAVAILABLE` saying `message`, marked [`RELOAD_CUT_SHORT`].
pub(super) fn cut_short(message: String) -> Status {
    let details = ErrorDetails::with_error_info(RELOAD_CUT_SHORT, REFUSAL_DOMAIN, HashMap::new());
    Status::with_error_details(Code::Unavailable, message, details)
}

/// How long a Lifecycle call may take: `push_timeout`, and at least the
/// runtime's init timeout plus [`INIT_MARGIN`].
pub(super) fn lifecycle_timeout(state: &crate::ApiState) -> Duration {
    let init = state.runtime.options().timeouts.init;
    state
        .options
        .push_timeout
        .max(init.saturating_add(INIT_MARGIN))
}

/// When to answer: a tenth (at least [`MIN_MARGIN`]) before the sooner of
/// the caller's deadline and `timeout`, and never later than half of it.
pub(super) fn answer_due(caller: Option<Duration>, timeout: Duration) -> Duration {
    let deadline = caller.map_or(timeout, |c| c.min(timeout));
    let margin = (deadline / 10).max(MIN_MARGIN);
    deadline.saturating_sub(margin).max(deadline / 2)
}

/// A caller's deadline, and when its request arrived.
pub(super) struct CallerClock {
    /// Its `grpc-timeout`, if it sent one.
    deadline: Option<Duration>,
    /// When its request's head arrived (stamped by the call bound; absent
    /// for a call made without it, which counts from the handler).
    arrived: Option<Instant>,
}

impl CallerClock {
    /// The clock of `request`: its `grpc-timeout`, and its arrival.
    pub(super) fn of<T>(request: &tonic::Request<T>) -> Self {
        Self {
            deadline: caller_deadline(request.metadata()),
            arrived: request
                .extensions()
                .get::<super::call_bound::Arrived>()
                .map(|arrived| arrived.0),
        }
    }
}

/// The caller's deadline from `grpc-timeout` (`<digits><unit>`, units
/// `H M S m u n`), if it sent one.
fn caller_deadline(metadata: &MetadataMap) -> Option<Duration> {
    let text = metadata.get("grpc-timeout")?.to_str().ok()?;
    let (digits, unit) = text.split_at(text.len().checked_sub(1)?);
    let value: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(value.saturating_mul(3600)),
        "M" => Duration::from_secs(value.saturating_mul(60)),
        "S" => Duration::from_secs(value),
        "m" => Duration::from_millis(value),
        "u" => Duration::from_micros(value),
        "n" => Duration::from_nanos(value),
        _ => return None,
    })
}

/// The `queued` answer's reason.
pub(super) fn queued_reason(ahead: usize, waited: Duration) -> String {
    format!(
        "queued behind {ahead} other push(es) or a reload still running, not applied yet: \
         no outcome within {waited:?} (answered before the caller's deadline); it will still \
         be applied or rejected: see GetStatus"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    impl PushQueue {
        /// Admits a push holding `bytes`, then runs it.
        async fn push<F>(
            &self,
            metadata: &MetadataMap,
            bytes: usize,
            reload: F,
        ) -> Result<Waited, Status>
        where
            F: Future<Output = Result<ReloadRecord, ReloadError>> + Send + 'static,
        {
            let admitted = self.admit(bytes)?;
            let clock = CallerClock {
                deadline: caller_deadline(metadata),
                arrived: None,
            };
            self.run(&clock, admitted, reload).await
        }
    }

    /// The deadline counts from the request's arrival: a push whose
    /// upload and decoding took 120 ms of the 150 ms its 200 ms deadline
    /// leaves before the answer is due is answered 30 ms later, `queued`;
    /// one that took all of it, at once. Before: 150 ms after the handler
    /// ran, past the caller's deadline (tonic cut it `CANCELLED`).
    #[tokio::test(start_paused = true)]
    async fn the_answer_is_due_counting_from_the_requests_arrival() {
        let queue = PushQueue::new(Duration::from_secs(45));
        let (release, held) = tokio::sync::watch::channel(false);
        for (spent, answered_after) in [
            (Duration::from_millis(120), Duration::from_millis(30)),
            (Duration::from_millis(150), Duration::ZERO),
            (Duration::from_millis(400), Duration::ZERO),
        ] {
            let arrived = Instant::now();
            tokio::time::advance(spent).await;
            let clock = CallerClock {
                deadline: Some(Duration::from_millis(200)),
                arrived: Some(arrived),
            };
            let admitted = queue.admit(10).expect("room");
            let started = Instant::now();
            let waited = queue
                .run(&clock, admitted, pending_until(&held))
                .await
                .expect("answered");
            assert!(matches!(waited, Waited::Queued { .. }), "{spent:?}");
            assert_eq!(started.elapsed(), answered_after, "{spent:?} spent");
        }
        release.send(true).expect("the reloads listen");
    }

    fn with_timeout(value: &'static str) -> MetadataMap {
        let mut map = MetadataMap::new();
        map.insert("grpc-timeout", value.parse().expect("ascii"));
        map
    }

    #[test]
    fn the_answer_is_due_before_the_sooner_deadline() {
        let server = Duration::from_secs(45);
        assert_eq!(answer_due(None, server), Duration::from_millis(40_500));
        assert_eq!(
            answer_due(Some(Duration::from_secs(10)), server),
            Duration::from_secs(9)
        );
        assert_eq!(
            answer_due(Some(Duration::from_millis(60)), server),
            Duration::from_millis(30)
        );
    }

    #[test]
    fn grpc_timeout_is_read_in_every_unit() {
        assert_eq!(
            caller_deadline(&with_timeout("2S")),
            Some(Duration::from_secs(2))
        );
        assert_eq!(
            caller_deadline(&with_timeout("1500m")),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(
            caller_deadline(&with_timeout("1H")),
            Some(Duration::from_secs(3600))
        );
        assert_eq!(caller_deadline(&with_timeout("x")), None);
        assert_eq!(caller_deadline(&MetadataMap::new()), None);
    }

    #[tokio::test]
    async fn a_push_not_done_in_time_is_queued_and_still_runs() {
        let queue = PushQueue::new(Duration::from_millis(100));
        let (done, finished) = tokio::sync::oneshot::channel();
        let waited = queue
            .push(&MetadataMap::new(), 0, async move {
                tokio::time::sleep(Duration::from_millis(300)).await;
                let _ = done.send(());
                Err(ReloadError::Stopped)
            })
            .await
            .expect("answered");
        assert!(matches!(waited, Waited::Queued { ahead: 0, .. }));
        finished.await.expect("the reload ran to its end");
    }

    /// A reload that ends (stopped) only once `release` says so.
    fn pending_until(
        release: &tokio::sync::watch::Receiver<bool>,
    ) -> impl Future<Output = Result<ReloadRecord, ReloadError>> + Send + 'static {
        let mut release = release.clone();
        async move {
            let _ = release.wait_for(|go| *go).await;
            Err(ReloadError::Stopped)
        }
    }

    /// Waits (5 s at most) until nothing is pending.
    async fn drained(queue: &PushQueue) {
        tokio::time::timeout(Duration::from_secs(5), async {
            while queue.backlog.lock().expect("unpoisoned").pushes > 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("the pending pushes finished within 5 s");
    }

    #[tokio::test]
    async fn pushes_past_the_backlog_are_refused_until_it_drains() {
        let queue = PushQueue::new(Duration::from_secs(45));
        let (release, held) = tokio::sync::watch::channel(false);
        for n in 0..MAX_PENDING_PUSHES {
            let waited = queue
                .push(&with_timeout("1m"), 10, pending_until(&held))
                .await
                .expect("within the backlog");
            assert!(matches!(waited, Waited::Queued { ahead, .. } if ahead == n));
        }
        let refused = queue
            .push(&with_timeout("1m"), 10, pending_until(&held))
            .await
            .err()
            .expect("one past the backlog is refused");
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
        let info = refused.get_details_error_info().expect("marked retryable");
        assert_eq!(
            (info.reason.as_str(), info.domain.as_str()),
            (PUSH_BACKLOG_FULL, "rewire")
        );
        assert!(
            refused.message().contains("64 pushes are already queued")
                && refused.message().contains("(64)"),
            "names the backlog and the limit: {refused:?}"
        );
        release.send(true).expect("the reloads listen");
        drained(&queue).await;
        let taken = queue
            .push(&with_timeout("1S"), 10, async { Err(ReloadError::Stopped) })
            .await
            .expect("taken once the backlog drained");
        assert!(matches!(taken, Waited::Done(Err(ReloadError::Stopped))));
    }

    #[test]
    fn a_push_gives_back_what_it_held_only_while_parsed() {
        let queue = PushQueue::new(Duration::from_secs(45));
        let bytes = || queue.backlog.lock().expect("unpoisoned").bytes;
        let mut admitted = queue.admit(100).expect("alone");
        admitted.give_back(40);
        assert_eq!(bytes(), 60);
        admitted.give_back(1_000);
        assert_eq!(bytes(), 0, "never more than it was charged");
        drop(admitted);
        assert_eq!(bytes(), 0);
    }

    #[tokio::test]
    async fn pushes_past_the_backlogs_bytes_are_refused_but_one_alone_is_taken() {
        let queue = PushQueue::new(Duration::from_secs(45));
        let (release, held) = tokio::sync::watch::channel(false);
        let half = MAX_PENDING_BYTES / 2;
        for _ in 0..2 {
            queue
                .push(&with_timeout("1m"), half, pending_until(&held))
                .await
                .expect("within the bytes");
        }
        let refused = queue
            .push(&with_timeout("1m"), 1, pending_until(&held))
            .await
            .err()
            .expect("one byte past the backlog's bytes is refused");
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
        assert!(refused.message().contains("67108864 bytes"), "{refused:?}");
        let info = refused.get_details_error_info().expect("marked retryable");
        assert_eq!(info.reason, PUSH_BACKLOG_FULL);
        release.send(true).expect("the reloads listen");
        drained(&queue).await;
        assert_eq!(queue.backlog.lock().expect("unpoisoned").bytes, 0);
        let alone = queue
            .push(&with_timeout("1S"), MAX_PENDING_BYTES + 1, async {
                Err(ReloadError::Stopped)
            })
            .await;
        assert!(
            alone.is_ok(),
            "a push alone is always taken: {:?}",
            alone.err()
        );
    }
}
