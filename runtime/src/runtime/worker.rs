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

use crate::config::LayerChange;
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
            // What was taken is handled: a push waiting for it goes on.
            queue.handled_taken();
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
            let mut requests = Vec::new();
            for queued in batch {
                match queued {
                    Queued::Reload(request) => requests.push(request),
                    Queued::Rejected { trigger, error } => {
                        reloader.record_rejected(trigger, &error)
                    }
                }
            }
            let due = retry.as_ref().is_some_and(|r| r.at <= Instant::now());
            if requests.is_empty() && !due {
                continue;
            }
            // The outcome is recorded in the history and logged.
            retry = run_round(retry.take(), requests, |r| reloader.reload(r)).await;
            *shown.lock().unwrap_or_else(|p| p.into_inner()) = retry.as_ref().map(shown_retry);
        }
    });
}

/// One round of the worker: the retry (when its time came, or beside new
/// input) and the new input, `new`. Returns the retry to keep.
///
/// New input is tried together with the retry. When that rolls back, the
/// new input is tried alone, so a part that keeps rolling back (a backend
/// not up yet) does not hold back later changes; the retry then stays on
/// its own backoff. The backoff starts over only when the new input
/// replaces the documents the retry carried (another file, other overlay
/// documents). A component forced again is new input (a forced reload
/// reads its store again: a corrected value must not wait for the
/// backoff), but its backoff goes on.
async fn run_round<F, Fut>(
    retry: Option<Retry>,
    new: Vec<ReloadRequest>,
    mut reload: F,
) -> Option<Retry>
where
    F: FnMut(ReloadRequest) -> Fut,
    Fut: Future<Output = Result<ReloadRecord, ReloadError>>,
{
    let rolled_back = |outcome: &Result<ReloadRecord, ReloadError>| {
        matches!(outcome, Err(ReloadError::RolledBack(_)))
    };
    let Some(retry) = retry else {
        if new.is_empty() {
            return None;
        }
        let (ran, outcome) = reload_narrowing(coalesce(new), &mut reload).await;
        return rolled_back(&outcome).then(|| next_retry(ran, 1));
    };
    if new.is_empty() {
        let (ran, outcome) = reload_narrowing(retry.request, &mut reload).await;
        return rolled_back(&outcome).then(|| next_retry(ran, retry.attempts + 1));
    }
    let (kept, new) = split(retry.request.clone(), coalesce(new));
    let Some(new) = new else {
        // Nothing new besides what the retry carries: it waits its turn.
        return Some(retry);
    };
    let Some(kept) = kept else {
        // The new input replaces everything the retry carried: its
        // documents (the backoff starts over), or only components it
        // forces again (the backoff goes on).
        let attempts = if retry.request.changes.is_empty() {
            retry.attempts + 1
        } else {
            1
        };
        let (ran, outcome) = reload_narrowing(new, &mut reload).await;
        return rolled_back(&outcome).then(|| next_retry(ran, attempts));
    };
    // The retried part runs again: linked to its attempt before.
    let mut together = coalesce(vec![kept.clone(), new.clone()]);
    together.cause.clone_from(&kept.cause);
    let whole = together.changes.len();
    let (ran, outcome) = reload_narrowing(together, &mut reload).await;
    if !rolled_back(&outcome) {
        return None;
    }
    if ran.changes.len() != whole {
        // Narrowed (a document was rejected) and still rolled back.
        return Some(next_retry(ran, retry.attempts + 1));
    }
    // The attempt the retried part just rolled back in.
    let retried_in = ran.take_ran_as();
    tracing::info!(trigger = %new.trigger, "Reload rolled back with a retried part; trying the new input alone.");
    let (ran, outcome) = reload_narrowing(new, &mut reload).await;
    let mut request = if rolled_back(&outcome) {
        coalesce(vec![kept, ran])
    } else {
        kept
    };
    // Linked to that attempt, not to a run whose `ran_as` it shares.
    request.ran_as = None;
    if retried_in.is_some() {
        request.cause = retried_in;
    }
    Some(next_retry(request, retry.attempts + 1))
}

/// Splits the retried request and the new input: what of the retry the new
/// input does not replace (`None`: nothing), and what of the new input the
/// retry does not carry already (`None`: nothing). A file or overlay change
/// replaces the retry's own unless it is the same; a component forced by
/// both goes with the new input (its store is read again: it may hold a
/// new value).
fn split(
    retried: ReloadRequest,
    mut new: ReloadRequest,
) -> (Option<ReloadRequest>, Option<ReloadRequest>) {
    let is_file = |c: &LayerChange| matches!(c, LayerChange::File(_));
    let is_overlay = |c: &LayerChange| matches!(c, LayerChange::Overlay { .. });
    let mut kept = ReloadRequest {
        changes: Vec::new(),
        ..retried.clone()
    };
    for change in retried.changes {
        let same_kind = |c: &LayerChange| {
            is_file(c) && is_file(&change) || is_overlay(c) && is_overlay(&change)
        };
        match new.changes.iter().position(same_kind) {
            // The same document again: nothing new.
            Some(i) if new.changes[i] == change => {
                new.changes.remove(i);
                kept.changes.push(change);
            }
            // Replaced by the new input.
            Some(_) => {}
            None => kept.changes.push(change),
        }
    }
    kept.forced.retain(|key| !new.forced.contains(key));
    let carries = |r: &ReloadRequest| !r.changes.is_empty() || !r.forced.is_empty();
    (carries(&kept).then_some(kept), carries(&new).then_some(new))
}

/// Runs `request` with `reload`; when it is rejected as a whole, runs the
/// variants [`narrowed`] gives in turn until one is not rejected. What
/// ran last, and how it ended. Each run is given a fresh slot for its
/// root span (the one it returns keeps it: a retry links to that span).
async fn reload_narrowing<F, Fut>(
    request: ReloadRequest,
    mut reload: F,
) -> (ReloadRequest, Result<ReloadRecord, ReloadError>)
where
    F: FnMut(ReloadRequest) -> Fut,
    Fut: Future<Output = Result<ReloadRecord, ReloadError>>,
{
    let request = request.leaving_its_span();
    let outcome = reload(request.clone()).await;
    if !matches!(outcome, Err(ReloadError::Invalid(_))) {
        return (request, outcome);
    }
    let mut last = (request, outcome);
    for variant in narrowed(&last.0) {
        let variant = variant.leaving_its_span();
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

/// The retry of `request`, which rolled back `attempts` times: run next as
/// attempt number `attempts` (what its record and span show), its trace
/// linked to the attempt that just rolled back (the root span its run left
/// in `ran_as`), which links to the one before it, back to the first
/// attempt and what caused it. Only the last attempt's span is held (open,
/// not yet exported) while the retry waits: a retry that goes on for
/// hours does not hold back the export of every attempt.
fn next_retry(mut request: ReloadRequest, attempts: u32) -> Retry {
    request.attempt = attempts;
    if let Some(rolled_back) = request.take_ran_as() {
        request.cause = Some(rolled_back);
    }
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
    use std::sync::Mutex;

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

    fn file(app: &str) -> ReloadRequest {
        let config = Config {
            app_id: app.into(),
            ..Config::default()
        };
        ReloadRequest::new(config, Trigger::File)
    }

    fn forced(name: &str) -> ReloadRequest {
        ReloadRequest {
            forced: [crate::component::ComponentKey::new("state", name)].into(),
            ..ReloadRequest::of_changes(Trigger::WatchedRef, Vec::new())
        }
    }

    fn overlay(ttl: u32) -> ReloadRequest {
        let text =
            format!(r#"{{"components": {{"state": {{"s": {{"metadata": {{"ttl": {ttl}}}}}}}}}}}"#);
        let patch = crate::config::parse_patch(text.as_bytes()).ok();
        ReloadRequest::of_changes(
            Trigger::Overlay,
            vec![LayerChange::Overlay {
                common: patch,
                read: None,
            }],
        )
    }

    /// What a request carries, shown: the file's app id, `overlay`, and
    /// the forced components' names.
    fn shown(request: &ReloadRequest) -> Vec<String> {
        let mut parts: Vec<String> = request
            .changes
            .iter()
            .map(|c| match c {
                LayerChange::File(f) => f.app_id.clone(),
                LayerChange::Overlay { .. } => "overlay".into(),
                _ => "other".into(),
            })
            .collect();
        parts.extend(request.forced.iter().map(|k| k.name.to_string()));
        parts
    }

    /// A reload that rolls back whenever it carries `failing` (its file's
    /// app id, or `overlay`), and ends otherwise; every run is noted.
    fn rolling_back_on<'a>(
        failing: &'static str,
        ran: &'a Mutex<Vec<Vec<String>>>,
    ) -> impl FnMut(ReloadRequest) -> std::future::Ready<Result<ReloadRecord, ReloadError>> + 'a
    {
        move |request| {
            let parts = shown(&request);
            let fails = parts.iter().any(|p| p == failing);
            ran.lock().unwrap().push(parts);
            std::future::ready(if fails {
                Err(ReloadError::RolledBack(Vec::new()))
            } else {
                Err(ReloadError::Stopped)
            })
        }
    }

    #[tokio::test]
    async fn a_retry_that_keeps_rolling_back_does_not_hold_back_new_input() {
        let ran = Mutex::new(Vec::new());
        // The file F2 rolled back twice (its backend is not up yet).
        let retry = Some(next_retry(file("f2"), 2));
        // A watched secret of `y` rotates.
        let kept = run_round(retry, vec![forced("y")], rolling_back_on("f2", &ran))
            .await
            .expect("F2 is still to retry");
        assert_eq!(
            *ran.lock().unwrap(),
            [vec!["f2", "y"], vec!["y"]],
            "together, then the new input alone"
        );
        assert_eq!(shown(&kept.request), ["f2"], "y is not dragged along");
        assert_eq!(kept.attempts, 3, "F2's own backoff goes on");

        // A new file replaces F2: the backoff starts over.
        let ran = Mutex::new(Vec::new());
        let kept = run_round(Some(kept), vec![file("f3")], rolling_back_on("f3", &ran))
            .await
            .expect("F3 to retry");
        assert_eq!(*ran.lock().unwrap(), [vec!["f3"]]);
        assert_eq!(kept.attempts, 1);

        // The same file again is nothing new: the retry waits its turn.
        let ran = Mutex::new(Vec::new());
        let same = run_round(Some(kept), vec![file("f3")], rolling_back_on("f3", &ran))
            .await
            .expect("F3 still to retry");
        assert!(ran.lock().unwrap().is_empty());
        assert_eq!(same.attempts, 1);
    }

    #[tokio::test]
    async fn a_retry_runs_with_its_attempt_number_and_new_input_with_zero() {
        let ran = Mutex::new(Vec::new());
        let mut reload = |request: ReloadRequest| {
            ran.lock().unwrap().push((shown(&request), request.attempt));
            std::future::ready(Err::<ReloadRecord, _>(ReloadError::RolledBack(Vec::new())))
        };
        // Fresh input rolls back, then is retried twice.
        let retry = run_round(None, vec![file("f1")], &mut reload).await;
        let retry = run_round(retry, Vec::new(), &mut reload).await;
        let retry = run_round(retry, Vec::new(), &mut reload).await;
        // New input beside the retry: together (fresh input in it), then
        // the new input alone; the retry keeps its count.
        let retry = run_round(retry, vec![forced("y")], &mut reload).await;
        let retry = retry.expect("still to retry");
        assert_eq!(retry.attempts, 4);
        assert_eq!(retry.request.attempt, 4, "the next retry is the 4th");
        let ran = ran.into_inner().unwrap();
        let attempts: Vec<u32> = ran.iter().map(|(_, attempt)| *attempt).collect();
        assert_eq!(attempts, [0, 1, 2, 0, 0], "{ran:?}");
    }

    #[tokio::test]
    async fn new_input_that_rolls_back_alone_stays_with_the_retry() {
        let ran = Mutex::new(Vec::new());
        let retry = Some(next_retry(file("f2"), 1));
        let kept = run_round(retry, vec![forced("y")], |request| {
            let parts = shown(&request);
            ran.lock().unwrap().push(parts);
            std::future::ready(Err::<ReloadRecord, _>(ReloadError::RolledBack(Vec::new())))
        })
        .await
        .expect("to retry");
        assert_eq!(ran.lock().unwrap().len(), 2);
        assert_eq!(shown(&kept.request), ["f2", "y"]);
        assert_eq!(kept.attempts, 2);
    }

    #[tokio::test]
    async fn a_component_forced_again_runs_at_once_beside_its_retry() {
        // `x`'s bad value rolled back five times; its store now holds a
        // good one (a forced reload reads the store again).
        let ran = Mutex::new(Vec::new());
        let retry = Some(next_retry(forced("x"), 5));
        let after = run_round(retry, vec![forced("x")], rolling_back_on("never", &ran)).await;
        assert!(after.is_none(), "applied: nothing left to retry");
        assert_eq!(*ran.lock().unwrap(), [vec!["x"]], "at once");

        // Still bad: its backoff goes on rather than starting over.
        let ran = Mutex::new(Vec::new());
        let retry = Some(next_retry(forced("x"), 5));
        let kept = run_round(retry, vec![forced("x")], rolling_back_on("x", &ran))
            .await
            .expect("x to retry");
        assert_eq!(*ran.lock().unwrap(), [vec!["x"]]);
        assert_eq!(kept.attempts, 6);

        // Beside a file that keeps rolling back: `x` is tried alone and
        // leaves the retry.
        let ran = Mutex::new(Vec::new());
        let mut retry = next_retry(file("f2"), 2);
        retry.request.forced.extend(forced("x").forced);
        let kept = run_round(Some(retry), vec![forced("x")], rolling_back_on("f2", &ran))
            .await
            .expect("F2 to retry");
        assert_eq!(*ran.lock().unwrap(), [vec!["f2", "x"], vec!["x"]]);
        assert_eq!(shown(&kept.request), ["f2"]);
        assert_eq!(kept.attempts, 3);
    }

    #[tokio::test]
    async fn reverted_overlay_documents_replace_their_retry() {
        let ran = Mutex::new(Vec::new());
        // Overlay D2 rolls back and is retried; D1 (in force) is sent back.
        let retry = Some(next_retry(overlay(2), 1));
        let after = run_round(retry, vec![overlay(1)], rolling_back_on("never", &ran)).await;
        assert!(after.is_none(), "the retry of D2 is cleared");
        assert_eq!(*ran.lock().unwrap(), [vec!["overlay"]], "D1 alone");
    }

    /// Gives every span an id (1, 2, …), wanting every span; records
    /// nothing.
    #[derive(Default)]
    struct Ids(std::sync::atomic::AtomicU64);

    impl tracing::Subscriber for Ids {
        // Asked on every span: other tests running at once have their own
        // subscriber.
        fn register_callsite(
            &self,
            _: &'static tracing::Metadata<'static>,
        ) -> tracing::subscriber::Interest {
            tracing::subscriber::Interest::sometimes()
        }
        fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
            let id = self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tracing::span::Id::from_u64(id + 1)
        }
        fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
        fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
        fn event(&self, _: &tracing::Event<'_>) {}
        fn enter(&self, _: &tracing::span::Id) {}
        fn exit(&self, _: &tracing::span::Id) {}
    }

    #[tokio::test]
    async fn a_retry_is_caused_by_the_attempt_that_rolled_back_before_it() {
        let _default = tracing::subscriber::set_default(Ids::default());
        let id = |span: &tracing::Span| span.id().map(|id| id.into_u64());
        // Each run: what it carried, its root span's id and its cause's;
        // it leaves its root span as a reload's run does, and rolls back
        // while it carries F1.
        let ran = Mutex::new(Vec::new());
        let mut reload = |request: ReloadRequest| {
            let root = tracing::info_span!("rewire.reload");
            if let Some(slot) = &request.ran_as {
                slot.put(root.clone());
            }
            let cause = request.cause.as_ref().and_then(id);
            ran.lock()
                .unwrap()
                .push((shown(&request), id(&root), cause));
            std::future::ready(if shown(&request).contains(&"f1".to_string()) {
                Err(ReloadError::RolledBack(Vec::new()))
            } else {
                Err(ReloadError::Stopped)
            })
        };
        let retry = run_round(None, vec![file("f1")], &mut reload).await;
        let retry = run_round(retry, Vec::new(), &mut reload).await;
        // New input beside the retry: together, then alone.
        let retry = run_round(retry, vec![forced("y")], &mut reload).await;
        let retry = run_round(retry, Vec::new(), &mut reload).await;
        assert!(retry.is_some(), "F1 still to retry");
        let ran = ran.into_inner().unwrap();
        let ids: Vec<Option<u64>> = ran.iter().map(|(_, root, _)| *root).collect();
        let causes: Vec<Option<u64>> = ran.iter().map(|(_, _, cause)| *cause).collect();
        assert_eq!(
            causes,
            [None, ids[0], ids[1], None, ids[2]],
            "each attempt of F1 linked to the one before it: {ran:?}"
        );
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
