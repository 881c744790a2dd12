//! The runtime's worker: drains the triggers' queue, one reload at a time,
//! coalescing whatever arrived meanwhile into the next. A triggered reload
//! that rolled back (a backend down, say) is tried again with backoff until
//! it applies or newer input replaces it: nobody else would ask again.

use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use std::future::Future;

use crate::reload::queue::{coalesce, narrowed, QueueReceiver, Queued};
use crate::reload::{ReloadError, ReloadRecord, ReloadRequest, Reloader, Trigger};

/// The first retry waits this long; each next one twice as long.
const FIRST_RETRY: Duration = Duration::from_secs(1);
/// The longest wait between two retries.
const MAX_RETRY: Duration = Duration::from_secs(30);

/// A triggered reload that rolled back, waiting to be tried again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PendingRetry {
    /// What asked for it.
    pub trigger: Trigger,
    /// How many times it rolled back.
    pub attempts: u32,
    /// When it is tried next, in milliseconds since the Unix epoch.
    pub next_at_unix_ms: u64,
}

/// The retry the worker holds, shared with the status.
pub(super) type RetrySlot = Arc<Mutex<Option<PendingRetry>>>;

struct Retry {
    request: ReloadRequest,
    attempts: u32,
    at: Instant,
}

/// Starts the worker; it ends at shutdown, when the queue closes, or when
/// the runtime is dropped.
pub(super) fn spawn_worker(
    reloader: Weak<Reloader>,
    mut queue: QueueReceiver,
    stopped: CancellationToken,
    shown: RetrySlot,
) {
    tokio::spawn(async move {
        let mut retry: Option<Retry> = None;
        loop {
            let retry_at = retry.as_ref().map(|r| r.at);
            let first = tokio::select! {
                queued = queue.recv() => match queued {
                    Some(queued) => Some(queued),
                    None => return,
                },
                () = sleep_until(retry_at) => None,
                () = stopped.cancelled() => return,
            };
            let mut batch: Vec<Queued> = first.into_iter().collect();
            while let Ok(more) = queue.try_recv() {
                batch.push(more);
            }
            let Some(reloader) = reloader.upgrade() else {
                return;
            };
            let (mut requests, mut attempts) = match retry.take() {
                Some(retry) => (vec![retry.request], retry.attempts),
                None => (Vec::new(), 0),
            };
            for queued in batch {
                match queued {
                    Queued::Reload(request) => {
                        // New input: the backoff starts over.
                        attempts = 0;
                        requests.push(request);
                    }
                    Queued::Rejected { trigger, error } => {
                        reloader.record_rejected(trigger, &error)
                    }
                }
            }
            if requests.is_empty() {
                continue;
            }
            let request = coalesce(requests);
            // The outcome is recorded in the history and logged.
            let (request, outcome) = reload_narrowing(request, |r| reloader.reload(r)).await;
            retry = match outcome {
                Err(ReloadError::RolledBack(_)) => Some(next_retry(request, attempts + 1)),
                _ => None,
            };
            *shown.lock().unwrap_or_else(|p| p.into_inner()) = retry.as_ref().map(shown_retry);
        }
    });
}

/// Runs `request` with `reload`; when it is rejected as a whole, runs the
/// variants [`narrowed`] gives in turn until one is not rejected. What
/// ran last, and how it ended.
async fn reload_narrowing<F, Fut>(
    request: ReloadRequest,
    mut reload: F,
) -> (ReloadRequest, Result<ReloadRecord, ReloadError>)
where
    F: FnMut(ReloadRequest) -> Fut,
    Fut: Future<Output = Result<ReloadRecord, ReloadError>>,
{
    let outcome = reload(request.clone()).await;
    if !matches!(outcome, Err(ReloadError::Invalid(_))) {
        return (request, outcome);
    }
    let mut last = (request, outcome);
    for variant in narrowed(&last.0) {
        tracing::info!(trigger = %variant.trigger, "Reload rejected as a whole; trying what it carried besides the rejected document.");
        let outcome = reload(variant.clone()).await;
        let rejected = matches!(outcome, Err(ReloadError::Invalid(_)));
        last = (variant, outcome);
        if !rejected {
            break;
        }
    }
    last
}

fn next_retry(request: ReloadRequest, attempts: u32) -> Retry {
    let wait = FIRST_RETRY
        .saturating_mul(2u32.saturating_pow(attempts.saturating_sub(1)))
        .min(MAX_RETRY);
    tracing::info!(trigger = %request.trigger, attempts, ?wait, "Reload rolled back; trying again later.");
    Retry {
        request,
        attempts,
        at: Instant::now() + wait,
    }
}

fn shown_retry(retry: &Retry) -> PendingRetry {
    let wait = retry.at.saturating_duration_since(Instant::now());
    let next = SystemTime::now() + wait;
    PendingRetry {
        trigger: retry.request.trigger.clone(),
        attempts: retry.attempts,
        next_at_unix_ms: next
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .unwrap_or_default(),
    }
}

/// Sleeps until `at`; forever when there is nothing to wait for.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[tokio::test]
    async fn a_rejected_batch_still_applies_what_was_valid_in_it() {
        use crate::component::ComponentKey;
        use crate::config::{LayerChange, Problems};
        let forced: std::collections::BTreeSet<_> = [ComponentKey::new("state", "a")].into();
        let batch = ReloadRequest {
            forced: forced.clone(),
            ..ReloadRequest::new(Config::default(), Trigger::File)
        };
        // The file is invalid; anything without it applies.
        let mut ran = Vec::new();
        let (last, outcome) = reload_narrowing(batch, |request| {
            let has_file = request
                .changes
                .iter()
                .any(|c| matches!(c, LayerChange::File(_)));
            ran.push(has_file);
            async move {
                if has_file {
                    Err(ReloadError::Invalid(Problems::default()))
                } else {
                    Err(ReloadError::Stopped)
                }
            }
        })
        .await;
        assert_eq!(
            ran,
            [true, false],
            "the batch, then the forced components alone"
        );
        assert_eq!(last.forced, forced);
        assert!(matches!(outcome, Err(ReloadError::Stopped)));
    }

    #[test]
    fn retries_back_off_to_a_ceiling() {
        let request = || ReloadRequest::new(Config::default(), Trigger::File);
        let waits: Vec<Duration> = [1, 2, 3, 6, 40]
            .into_iter()
            .map(|attempts| next_retry(request(), attempts).at - Instant::now())
            .collect();
        assert!(
            waits[0] <= FIRST_RETRY && waits[0] > FIRST_RETRY / 2,
            "{waits:?}"
        );
        assert!(waits[1] > FIRST_RETRY && waits[2] > waits[1], "{waits:?}");
        assert!(
            waits[3] <= MAX_RETRY && waits[4] <= MAX_RETRY && waits[4] > MAX_RETRY / 2,
            "{waits:?}"
        );
    }
}
