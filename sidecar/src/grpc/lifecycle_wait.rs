//! A push is answered with the truth before its caller gives up: the
//! reload runs in its own task (so it is applied, or not, whatever the
//! caller does), and the call waits for it until shortly before its
//! deadline — the caller's `grpc-timeout` or the Lifecycle timeout,
//! whichever is sooner. A push still waiting then (queued behind other
//! reloads, or its own init still running) is answered `queued`, saying
//! behind how many pushes it waits and that it is not applied yet — never
//! `CANCELLED` for something applied later.
//!
//! The Lifecycle timeout is at least the runtime's init timeout plus
//! [`INIT_MARGIN`], so a push whose own component hangs in `init` gets its
//! rolled-back NACK in time when nothing else is queued.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tonic::metadata::MetadataMap;
use tonic::Status;

use rewire_runtime::{ReloadError, ReloadRecord};

/// How much longer than the runtime's init timeout the Lifecycle timeout is
/// at least.
pub(super) const INIT_MARGIN: Duration = Duration::from_secs(15);

/// The least time kept between the answer and the deadline.
const MIN_MARGIN: Duration = Duration::from_millis(50);

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
    pending: Arc<AtomicUsize>,
    timeout: Duration,
}

/// Counts a push as pending until its reload ends (or its task is dropped).
struct Pending(Arc<AtomicUsize>);

impl Drop for Pending {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl PushQueue {
    /// Pushes answered within `timeout` at most.
    pub(super) fn new(timeout: Duration) -> Self {
        Self {
            pending: Arc::new(AtomicUsize::new(0)),
            timeout,
        }
    }

    /// Runs `reload` to its end in its own task; waits for it until the
    /// answer is due for a caller whose request carried `metadata`.
    pub(super) async fn run<F>(&self, metadata: &MetadataMap, reload: F) -> Result<Waited, Status>
    where
        F: Future<Output = Result<ReloadRecord, ReloadError>> + Send + 'static,
    {
        let ahead = self.pending.fetch_add(1, Ordering::AcqRel);
        let pending = Pending(Arc::clone(&self.pending));
        let task = tokio::spawn(async move {
            let _pending = pending;
            reload.await
        });
        let due = answer_due(caller_deadline(metadata), self.timeout);
        match tokio::time::timeout(due, task).await {
            Ok(Ok(result)) => Ok(Waited::Done(result)),
            Ok(Err(failed)) => Err(Status::internal(format!(
                "the reload task failed: {failed}"
            ))),
            Err(_) => Ok(Waited::Queued { ahead, waited: due }),
        }
    }
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
            .run(&MetadataMap::new(), async move {
                tokio::time::sleep(Duration::from_millis(300)).await;
                let _ = done.send(());
                Err(ReloadError::Stopped)
            })
            .await
            .expect("answered");
        assert!(matches!(waited, Waited::Queued { ahead: 0, .. }));
        finished.await.expect("the reload ran to its end");
    }
}
