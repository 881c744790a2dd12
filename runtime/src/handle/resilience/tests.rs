use std::sync::atomic::{AtomicU32, Ordering};

use serde_json::json;
use tokio::time::Instant;

use super::*;

fn section(value: serde_json::Value) -> Resiliency {
    Resiliency::decode(&value).unwrap_or_else(|p| panic!("{p:?}"))
}

fn orders() -> ComponentKey {
    ComponentKey::new("state", "orders")
}

/// The policies `value` gives `orders`, its instance the one `previous`
/// guarded.
fn policies(value: serde_json::Value, previous: &Policies) -> Policies {
    let key = orders();
    Policies::build(&section(value), std::iter::once(&key), previous, |_| true)
}

fn target(outbound: serde_json::Value) -> serde_json::Value {
    json!({
        "policies": {
            "timeouts": {"short": "1s"},
            "retries": {"three": {"policy": "constant", "duration": "2s", "maxRetries": 3},
                        "grow": {"policy": "exponential", "duration": "1s", "maxInterval": "3s",
                                 "maxRetries": 4}},
            "circuitBreakers": {"cb": {"trip": "consecutiveFailures >= 2", "timeout": "30s"}}
        },
        "targets": {"components": {"orders": {"outbound": outbound}}}
    })
}

/// An attempt that fails with a backend error `failures` times, then
/// answers its attempt number.
fn flaky(
    failures: u32,
    calls: &AtomicU32,
) -> impl FnMut() -> std::future::Ready<Result<u32, StateError>> + '_ {
    move || {
        let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
        std::future::ready(if n <= failures {
            Err(StateError::Backend("connection refused".into()))
        } else {
            Ok(n)
        })
    }
}

fn applied(policies: &Policies) -> &Applied {
    policies
        .get(&orders())
        .unwrap_or_else(|| panic!("targeted"))
}

#[tokio::test(start_paused = true)]
async fn retries_recover_a_transient_failure_with_constant_waits() {
    let policies = policies(target(json!({"retry": "three"})), &Policies::default());
    let calls = AtomicU32::new(0);
    let started = Instant::now();
    let answer = applied(&policies)
        .run(Retries::Allowed, flaky(2, &calls))
        .await;
    assert!(matches!(answer, Ok(3)), "{answer:?}");
    assert_eq!(started.elapsed(), Duration::from_secs(4), "two waits of 2s");
}

#[tokio::test(start_paused = true)]
async fn exponential_waits_grow_as_dapr_s_up_to_the_max_interval_and_retries_stop_at_the_max() {
    let policies = policies(target(json!({"retry": "grow"})), &Policies::default());
    let attempts = std::sync::Mutex::new(Vec::new());
    let answer: Result<(), _> = applied(&policies)
        .run(Retries::Allowed, || {
            attempts
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(Instant::now());
            std::future::ready(Err(StateError::Backend("connection refused".into())))
        })
        .await;
    assert!(
        matches!(answer, Err(Guarded::Failed(StateError::Backend(_)))),
        "{answer:?}"
    );
    let attempts = attempts.into_inner().unwrap_or_else(|p| p.into_inner());
    assert_eq!(attempts.len(), 5, "the first attempt and 4 retries");
    // Dapr's: from 500 ms (its `duration` of 1 s unused), ×1.5 up to
    // `maxInterval` (3 s), each wait within ±50 % of its interval.
    let mut interval = Duration::from_millis(500);
    for pair in attempts.windows(2) {
        let wait = pair[1] - pair[0];
        assert!(
            wait >= interval.mul_f64(0.5) && wait <= interval.mul_f64(1.5),
            "{wait:?} not within ±50 % of {interval:?}"
        );
        interval = interval.mul_f64(1.5).min(Duration::from_secs(3));
    }
}

#[tokio::test(start_paused = true)]
async fn a_zero_constant_wait_is_floored_not_a_busy_loop() {
    let section = json!({
        "policies": {"retries": {"r": {"policy": "constant", "duration": "0s"}}},
        "targets": {"components": {"orders": {"outbound": {"retry": "r"}}}}
    });
    let policies = policies(section, &Policies::default());
    let retry = applied(&policies)
        .retry_policy()
        .unwrap_or_else(|| panic!("a retry policy"));
    assert!(Applied::backoff(retry).next_wait() >= Duration::from_millis(1));
    // Unlimited retries against a refusing backend: each one waits.
    let calls = AtomicU32::new(0);
    let started = Instant::now();
    let answer = applied(&policies)
        .run(Retries::Allowed, flaky(100, &calls))
        .await;
    assert!(matches!(answer, Ok(101)), "{answer:?}");
    assert!(
        started.elapsed() >= Duration::from_millis(100),
        "100 retries in {:?}",
        started.elapsed()
    );
}

#[tokio::test(start_paused = true)]
async fn unsafe_operations_and_answers_about_the_request_are_not_retried() {
    let policies = policies(target(json!({"retry": "three"})), &Policies::default());
    let calls = AtomicU32::new(0);
    let answer = applied(&policies)
        .run(Retries::Never, flaky(1, &calls))
        .await;
    assert!(matches!(answer, Err(Guarded::Failed(_))), "{answer:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    let calls = AtomicU32::new(0);
    let answer: Result<(), _> = applied(&policies)
        .run(Retries::Allowed, || {
            calls.fetch_add(1, Ordering::SeqCst);
            std::future::ready(Err(StateError::EtagMismatch("stale".into())))
        })
        .await;
    assert!(matches!(
        answer,
        Err(Guarded::Failed(StateError::EtagMismatch(_)))
    ));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn each_attempt_is_cut_at_the_timeout_and_a_timeout_is_retried() {
    let policies = policies(
        target(json!({"timeout": "short", "retry": "three"})),
        &Policies::default(),
    );
    let calls = AtomicU32::new(0);
    let answer = applied(&policies)
        .run(Retries::Allowed, || {
            let n = calls.fetch_add(1, Ordering::SeqCst);
            async move {
                if n == 0 {
                    tokio::time::sleep(Duration::from_secs(60)).await;
                }
                Ok::<_, StateError>(n)
            }
        })
        .await;
    assert!(matches!(answer, Ok(1)), "{answer:?}");

    let answer: Result<(), _> = applied(&policies)
        .run(Retries::Never, || async {
            tokio::time::sleep(Duration::from_secs(60)).await;
            Ok::<_, StateError>(())
        })
        .await;
    match answer {
        Err(Guarded::Refused(refusal @ Refusal::TimedOut { .. })) => {
            let text = refusal.to_string();
            assert!(
                text.contains("state/orders") && text.contains("`short`"),
                "{text}"
            );
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn an_open_breaker_refuses_without_calling_and_half_opens_after_its_timeout() {
    let policies = policies(
        target(json!({"circuitBreaker": "cb"})),
        &Policies::default(),
    );
    let calls = AtomicU32::new(0);
    for _ in 0..2 {
        let answer = applied(&policies)
            .run(Retries::Allowed, flaky(2, &calls))
            .await;
        assert!(matches!(answer, Err(Guarded::Failed(_))), "{answer:?}");
    }
    let answer = applied(&policies)
        .run(Retries::Allowed, flaky(2, &calls))
        .await;
    match answer {
        Err(Guarded::Refused(refusal @ Refusal::BreakerOpen { .. })) => {
            let text = refusal.to_string();
            assert!(
                text.contains("state/orders") && text.contains("circuit breaker open"),
                "{text}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(calls.load(Ordering::SeqCst), 2, "refused without a call");
    let status = applied(&policies).breaker_status();
    assert_eq!(
        status.map(|s| (s.state, s.trips)),
        Some((BreakerState::Open, 1))
    );
    tokio::time::advance(Duration::from_secs(30)).await;
    let status = applied(&policies).breaker_status();
    assert_eq!(status.map(|s| s.state), Some(BreakerState::HalfOpen));
    let answer = applied(&policies)
        .run(Retries::Allowed, flaky(2, &calls))
        .await;
    assert!(matches!(answer, Ok(3)), "{answer:?}");
    let status = applied(&policies).breaker_status();
    assert_eq!(status.map(|s| s.state), Some(BreakerState::Closed));
}

#[tokio::test(start_paused = true)]
async fn a_breaker_survives_a_rebuild_of_the_policies_while_its_settings_are_unchanged() {
    let first = policies(
        target(json!({"circuitBreaker": "cb"})),
        &Policies::default(),
    );
    let calls = AtomicU32::new(0);
    for _ in 0..2 {
        let _ = applied(&first).run(Retries::Never, flaky(5, &calls)).await;
    }
    let open = |p: &Policies| applied(p).breaker_status().map(|s| s.state);
    assert_eq!(open(&first), Some(BreakerState::Open));
    let same = policies(
        target(json!({"circuitBreaker": "cb", "retry": "three"})),
        &first,
    );
    assert_eq!(open(&same), Some(BreakerState::Open), "kept: same settings");
    let mut changed = target(json!({"circuitBreaker": "cb"}));
    changed["policies"]["circuitBreakers"]["cb"]["timeout"] = json!("10s");
    let changed = policies(changed, &same);
    assert_eq!(
        open(&changed),
        Some(BreakerState::Closed),
        "new settings: a new breaker"
    );
    let untargeted = Policies::build(
        &Resiliency::default(),
        std::iter::once(&orders()),
        &changed,
        |_| true,
    );
    assert!(untargeted.get(&orders()).is_none());
    assert_eq!(untargeted.breakers().count(), 0);
}

/// The bound of a call its client may abandon, without a timeout policy.
const GRACE: Duration = Duration::from_secs(60);

/// A call its component is not holding up: the component waits for the
/// call's client.
fn client_awaited() -> Option<Duration> {
    None
}

/// A call that never ends, cut (dropped) by its caller after `after`.
async fn abandoned<F: Future<Output = ()>>(after: Duration, call: F) {
    assert!(
        tokio::time::timeout(after, call).await.is_err(),
        "the call never ends"
    );
}

#[tokio::test(start_paused = true)]
async fn a_call_its_client_abandons_counts_neither_way_and_hands_back_its_trial_place() {
    let policies = policies(
        target(json!({"circuitBreaker": "cb", "timeout": "short"})),
        &Policies::default(),
    );
    let never = || std::future::pending::<Result<u32, StateError>>();
    let state = |p: &Policies| {
        applied(p)
            .breaker_status()
            .map(|s| (s.state, s.consecutive_failures))
    };
    // Three abandoned calls, past the trip at 2 and the 1 s timeout: the
    // breaker stays closed, nothing counted, nothing cut by the timeout.
    for _ in 0..3 {
        abandoned(Duration::from_secs(5), async {
            let _ = applied(&policies)
                .run_admitted_unless_dropped(never(), client_awaited, GRACE)
                .await;
        })
        .await;
    }
    assert_eq!(state(&policies), Some((BreakerState::Closed, 0)));
    // Abandoned under `run_admitted` within its 1 s timeout, a call counts
    // neither way too.
    abandoned(Duration::from_millis(500), async {
        let _ = applied(&policies).run_admitted(never()).await;
    })
    .await;
    assert_eq!(state(&policies), Some((BreakerState::Closed, 0)));
    // Failures it ends with still count: the breaker opens.
    let calls = AtomicU32::new(0);
    for _ in 0..2 {
        let failed = applied(&policies)
            .run_admitted_unless_dropped(flaky(2, &calls)(), client_awaited, GRACE)
            .await;
        assert!(matches!(failed, Err(Guarded::Failed(_))), "{failed:?}");
    }
    assert_eq!(state(&policies).map(|s| s.0), Some(BreakerState::Open));
    // Half-open, one trial place: the abandoned trial hands it back, so
    // the next call is admitted (and closes the breaker).
    tokio::time::advance(Duration::from_secs(30)).await;
    abandoned(Duration::from_secs(5), async {
        let _ = applied(&policies)
            .run_admitted_unless_dropped(never(), client_awaited, GRACE)
            .await;
    })
    .await;
    assert_eq!(state(&policies).map(|s| s.0), Some(BreakerState::HalfOpen));
    let answer = applied(&policies)
        .run_admitted_unless_dropped(flaky(0, &calls)(), client_awaited, GRACE)
        .await;
    assert!(answer.is_ok(), "{answer:?}");
    assert_eq!(state(&policies).map(|s| s.0), Some(BreakerState::Closed));
}

/// An error the call's own client caused: it says nothing of the
/// component.
#[derive(Debug)]
struct CutByClient;

impl Failure for CutByClient {
    fn is_failure(&self) -> bool {
        false
    }

    fn tells_of_component(&self) -> bool {
        false
    }
}

#[tokio::test(start_paused = true)]
async fn an_error_that_tells_nothing_of_the_component_counts_neither_way() {
    let policies = policies(
        target(json!({"circuitBreaker": "cb"})),
        &Policies::default(),
    );
    let state = |p: &Policies| {
        applied(p)
            .breaker_status()
            .map(|s| (s.state, s.consecutive_failures))
    };
    let fail = || async { Err::<u32, _>(StateError::Backend("connection refused".into())) };
    let cut = || async { Err::<u32, _>(CutByClient) };
    let _ = applied(&policies)
        .run_admitted_unless_dropped(fail(), client_awaited, GRACE)
        .await;
    // Not a success: the consecutive failure stays counted.
    let answer = applied(&policies)
        .run_admitted_unless_dropped(cut(), client_awaited, GRACE)
        .await;
    assert!(matches!(answer, Err(Guarded::Failed(CutByClient))));
    assert_eq!(state(&policies), Some((BreakerState::Closed, 1)));
    let _ = applied(&policies)
        .run_admitted_unless_dropped(fail(), client_awaited, GRACE)
        .await;
    assert_eq!(state(&policies).map(|s| s.0), Some(BreakerState::Open));
    // Half-open, one trial place: a trial the client cut short neither
    // closes the breaker nor keeps the place.
    tokio::time::advance(Duration::from_secs(30)).await;
    let _ = applied(&policies)
        .run_admitted_unless_dropped(cut(), client_awaited, GRACE)
        .await;
    assert_eq!(state(&policies).map(|s| s.0), Some(BreakerState::HalfOpen));
    let answer = applied(&policies)
        .run_admitted_unless_dropped(async { Ok::<u32, StateError>(7) }, client_awaited, GRACE)
        .await;
    assert!(matches!(answer, Ok(7)), "{answer:?}");
    assert_eq!(state(&policies).map(|s| s.0), Some(BreakerState::Closed));
}

/// Policies for `orders`: a 1 s timeout, and a breaker that opens at the
/// first failure, one trial call while half-open.
fn tripping_at_once() -> Policies {
    let section = json!({
        "policies": {
            "timeouts": {"short": "1s"},
            "circuitBreakers": {"cb": {"trip": "consecutiveFailures >= 1", "timeout": "30s",
                                       "maxRequests": 1}}
        },
        "targets": {"components": {"orders": {"outbound": {
            "circuitBreaker": "cb", "timeout": "short"
        }}}}
    });
    policies(section, &Policies::default())
}

/// Trips a breaker that trips at once (`tripping_at_once`) and waits until
/// it is half-open.
async fn half_open(applied: &Applied) {
    let fail = async { Err::<u32, _>(StateError::Backend("connection refused".into())) };
    let _ = applied.run_once(fail).await;
    assert_eq!(
        applied.breaker_status().map(|s| s.state),
        Some(BreakerState::Open)
    );
    tokio::time::advance(Duration::from_secs(30)).await;
}

/// What `others` answers while `upload`, which never ends, runs.
async fn beside_an_endless_upload<T, U>(
    upload: impl std::future::Future<Output = U>,
    others: impl std::future::Future<Output = T>,
) -> T {
    tokio::select! {
        _ = upload => panic!("the upload never ends"),
        answer = others => answer,
    }
}

#[tokio::test(start_paused = true)]
async fn a_trial_upload_that_runs_on_hands_back_its_trial_place_after_the_timeout() {
    let policies = tripping_at_once();
    let applied = applied(&policies);
    half_open(applied).await;
    // The trial call: an upload that keeps its client's pace forever.
    let trickling = applied.run_admitted_unless_dropped(
        std::future::pending::<Result<u32, StateError>>(),
        client_awaited,
        GRACE,
    );
    let others = async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let early = applied.run_once(async { Ok::<u32, StateError>(1) }).await;
        assert!(
            matches!(early, Err(Guarded::Refused(Refusal::BreakerOpen { .. }))),
            "the trial holds its place within the timeout: {early:?}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
        applied.run_once(async { Ok::<u32, StateError>(1) }).await
    };
    let answer = beside_an_endless_upload(trickling, others).await;
    assert!(
        matches!(answer, Ok(1)),
        "admitted past the timeout: {answer:?}"
    );
    assert_eq!(
        applied.breaker_status().map(|s| s.state),
        Some(BreakerState::Closed)
    );
}

#[tokio::test(start_paused = true)]
async fn a_call_dropped_while_its_component_held_it_up_past_the_timeout_is_a_failure() {
    let policies = policies(
        target(json!({"circuitBreaker": "cb", "timeout": "short"})),
        &Policies::default(),
    );
    let applied = applied(&policies);
    // A store that never takes the first chunk: it has held the call up
    // since it started.
    for _ in 0..2 {
        let started = Instant::now();
        abandoned(Duration::from_secs(5), async {
            let _ = applied
                .run_admitted_unless_dropped(
                    std::future::pending::<Result<u32, StateError>>(),
                    || Some(started.elapsed()),
                    GRACE,
                )
                .await;
        })
        .await;
    }
    let status = applied.breaker_status().map(|s| (s.state, s.trips));
    assert_eq!(
        status,
        Some((BreakerState::Open, 1)),
        "two failures trip it"
    );
    // Held up for less than the timeout when its client gave up: neither.
    let policies = self::policies(
        target(json!({"circuitBreaker": "cb", "timeout": "short"})),
        &Policies::default(),
    );
    let applied = self::applied(&policies);
    for _ in 0..3 {
        abandoned(Duration::from_secs(5), async {
            let _ = applied
                .run_admitted_unless_dropped(
                    std::future::pending::<Result<u32, StateError>>(),
                    || Some(Duration::from_millis(900)),
                    GRACE,
                )
                .await;
        })
        .await;
    }
    let status = applied
        .breaker_status()
        .map(|s| (s.state, s.consecutive_failures));
    assert_eq!(status, Some((BreakerState::Closed, 0)));
}

/// Past its timeout, a trial call the component holds up (a hung store
/// that never takes the upload's body) keeps its trial place: a half-open
/// breaker admits no pile of uploads into it; once the call waits for its
/// client, the place is handed back.
#[tokio::test(start_paused = true)]
async fn a_trial_upload_the_component_holds_up_keeps_its_place_until_it_waits_for_its_client() {
    let policies = tripping_at_once();
    let applied = applied(&policies);
    half_open(applied).await;
    let started = Instant::now();
    let waiting_for_client = std::sync::atomic::AtomicBool::new(false);
    let held_up = || {
        (!waiting_for_client.load(std::sync::atomic::Ordering::SeqCst)).then(|| started.elapsed())
    };
    let trial = applied.run_admitted_unless_dropped(
        std::future::pending::<Result<u32, StateError>>(),
        held_up,
        GRACE,
    );
    let others = async {
        tokio::time::sleep(Duration::from_secs(5)).await;
        let held = applied.run_once(async { Ok::<u32, StateError>(1) }).await;
        assert!(
            matches!(held, Err(Guarded::Refused(Refusal::BreakerOpen { .. }))),
            "a held-up trial gave its place away: {held:?}"
        );
        waiting_for_client.store(true, std::sync::atomic::Ordering::SeqCst);
        tokio::time::sleep(Duration::from_secs(2)).await;
        applied.run_once(async { Ok::<u32, StateError>(1) }).await
    };
    let answer = beside_an_endless_upload(trial, others).await;
    assert!(
        matches!(answer, Ok(1)),
        "handed back once it waited: {answer:?}"
    );
}

/// A trial upload to a store that is busy but taking its chunks (held up
/// a few milliseconds at a time) hands its place back past the timeout:
/// only a stalled one keeps it.
#[tokio::test(start_paused = true)]
async fn a_trial_upload_to_a_busy_store_hands_its_place_back_past_the_timeout() {
    let policies = tripping_at_once();
    let applied = applied(&policies);
    half_open(applied).await;
    let trial = applied.run_admitted_unless_dropped(
        std::future::pending::<Result<u32, StateError>>(),
        || Some(Duration::from_millis(5)),
        GRACE,
    );
    let others = async {
        tokio::time::sleep(Duration::from_secs(5)).await;
        applied.run_once(async { Ok::<u32, StateError>(1) }).await
    };
    let answer = beside_an_endless_upload(trial, others).await;
    assert!(
        matches!(answer, Ok(1)),
        "a busy store's trial kept its place: {answer:?}"
    );
}

/// A healthy component's call: it answers after 10 ms.
async fn answering_later() -> Result<(), StateError> {
    tokio::time::sleep(Duration::from_millis(10)).await;
    Ok(())
}

/// A call its client gives up on (a 1 ms gRPC deadline, a reset stream)
/// before the component, which would answer later, does: dropped
/// unfinished.
async fn given_up_by_its_client(applied: &Applied) {
    let call = applied.run(Retries::Never, answering_later);
    let given_up = tokio::time::timeout(Duration::from_millis(1), call).await;
    assert!(given_up.is_err(), "the call was answered before 10 ms");
}

#[tokio::test(start_paused = true)]
async fn calls_their_clients_give_up_on_do_not_open_the_breaker() {
    let status = |applied: &Applied| {
        applied
            .breaker_status()
            .map(|s| (s.state, s.consecutive_failures, s.trips))
    };
    // Without a timeout policy...
    let policies = breaker_alone("consecutiveFailures >= 1");
    let applied = self::applied(&policies);
    for _ in 0..6 {
        given_up_by_its_client(applied).await;
    }
    assert_eq!(status(applied), Some((BreakerState::Closed, 0, 0)));
    // ...and with one.
    let policies = tripping_at_once();
    let applied = self::applied(&policies);
    for _ in 0..6 {
        given_up_by_its_client(applied).await;
    }
    assert_eq!(status(applied), Some((BreakerState::Closed, 0, 0)));
    // The policy's own timeout still counts: it opens at once.
    let timed_out = applied
        .run(
            Retries::Never,
            std::future::pending::<Result<(), StateError>>,
        )
        .await;
    assert!(
        matches!(timed_out, Err(Guarded::Refused(Refusal::TimedOut { .. }))),
        "{timed_out:?}"
    );
    assert_eq!(
        applied.breaker_status().map(|s| s.state),
        Some(BreakerState::Open)
    );
}

#[tokio::test(start_paused = true)]
async fn a_trial_call_its_client_gives_up_on_gives_its_place_back() {
    let policies = tripping_at_once();
    let applied = applied(&policies);
    half_open(applied).await;
    given_up_by_its_client(applied).await;
    assert_eq!(
        applied.breaker_status().map(|s| s.state),
        Some(BreakerState::HalfOpen),
        "no verdict"
    );
    let answer = applied
        .run(Retries::Never, || async { Ok::<u32, StateError>(1) })
        .await;
    assert!(
        matches!(answer, Ok(1)),
        "the trial place was kept: {answer:?}"
    );
    assert_eq!(
        applied.breaker_status().map(|s| s.state),
        Some(BreakerState::Closed)
    );
}

/// Policies for `orders`: a breaker that opens when `trip` holds, one
/// trial call while half-open, and no timeout policy.
fn breaker_alone(trip: &str) -> Policies {
    let section = json!({
        "policies": {
            "circuitBreakers": {"cb": {"trip": trip, "timeout": "30s", "maxRequests": 1}}
        },
        "targets": {"components": {"orders": {"outbound": {"circuitBreaker": "cb"}}}}
    });
    policies(section, &Policies::default())
}

/// The API's `request_timeout` by default: the sidecar drops a call its
/// component has not answered by then.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// A call to a hung component (a store that blackholes its connection),
/// dropped by its request's deadline after `deadline`.
async fn dropped_hung(applied: &Applied, deadline: Duration) {
    abandoned(deadline, async {
        let _ = applied
            .run(
                Retries::Never,
                std::future::pending::<Result<(), StateError>>,
            )
            .await;
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_hung_component_without_a_timeout_policy_opens_its_breaker_as_its_calls_are_dropped() {
    let policies = breaker_alone("consecutiveFailures > 5");
    let applied = applied(&policies);
    let status = || {
        applied
            .breaker_status()
            .map(|s| (s.state, s.consecutive_failures))
    };
    // Clients giving up quickly tell nothing of it.
    for _ in 0..6 {
        dropped_hung(applied, Duration::from_millis(1)).await;
    }
    assert_eq!(status(), Some((BreakerState::Closed, 0)));
    dropped_hung(applied, DROPPED_CALL_GRACE - Duration::from_millis(1)).await;
    assert_eq!(
        status(),
        Some((BreakerState::Closed, 0)),
        "within the bound"
    );
    // Held past the bound until the request's deadline: each a failure.
    for failures in 1..=5 {
        dropped_hung(applied, REQUEST_TIMEOUT).await;
        assert_eq!(status(), Some((BreakerState::Closed, failures)));
    }
    dropped_hung(applied, REQUEST_TIMEOUT).await;
    assert_eq!(status().map(|s| s.0), Some(BreakerState::Open));
    // Refused at once instead of waiting the whole deadline.
    let started = Instant::now();
    let refused = applied
        .run(
            Retries::Never,
            std::future::pending::<Result<(), StateError>>,
        )
        .await;
    assert!(
        matches!(refused, Err(Guarded::Refused(Refusal::BreakerOpen { .. }))),
        "{refused:?}"
    );
    assert_eq!(started.elapsed(), Duration::ZERO);
    // Exactly at the bound counts as well.
    let policies = breaker_alone("consecutiveFailures >= 1");
    let applied = self::applied(&policies);
    dropped_hung(applied, DROPPED_CALL_GRACE).await;
    assert_eq!(
        applied.breaker_status().map(|s| s.state),
        Some(BreakerState::Open)
    );
}

#[tokio::test(start_paused = true)]
async fn a_half_open_trial_on_a_hung_component_reopens_once_dropped_past_the_bound() {
    let policies = breaker_alone("consecutiveFailures >= 1");
    let applied = applied(&policies);
    half_open(applied).await;
    // A trial its client gives up on quickly hands its place back...
    dropped_hung(applied, Duration::from_millis(1)).await;
    assert_eq!(
        applied.breaker_status().map(|s| s.state),
        Some(BreakerState::HalfOpen)
    );
    // ...one held by the hung component until its deadline reopens it.
    dropped_hung(applied, REQUEST_TIMEOUT).await;
    let status = applied.breaker_status().map(|s| (s.state, s.trips));
    assert_eq!(status, Some((BreakerState::Open, 2)));
}

#[tokio::test(start_paused = true)]
async fn a_call_under_its_callers_own_timeout_dropped_past_it_is_a_failure() {
    let policies = tripping_at_once();
    let applied = applied(&policies);
    let never = || std::future::pending::<Result<u32, StateError>>();
    abandoned(Duration::from_millis(999), async {
        let _ = applied.run_admitted(never()).await;
    })
    .await;
    assert_eq!(
        applied.breaker_status().map(|s| s.state),
        Some(BreakerState::Closed),
        "within the 1 s timeout"
    );
    abandoned(Duration::from_secs(1), async {
        let _ = applied.run_admitted(never()).await;
    })
    .await;
    assert_eq!(
        applied.breaker_status().map(|s| s.state),
        Some(BreakerState::Open)
    );
}

#[tokio::test(start_paused = true)]
async fn a_rebuilt_instance_starts_with_a_closed_breaker() {
    let value = target(json!({"circuitBreaker": "cb"}));
    let first = policies(value.clone(), &Policies::default());
    let calls = AtomicU32::new(0);
    for _ in 0..2 {
        let _ = applied(&first).run(Retries::Never, flaky(5, &calls)).await;
    }
    let state = |p: &Policies| applied(p).breaker_status().map(|s| s.state);
    assert_eq!(state(&first), Some(BreakerState::Open));
    let kept = policies(value.clone(), &first);
    assert_eq!(
        state(&kept),
        Some(BreakerState::Open),
        "same instance: kept"
    );
    let key = orders();
    let rebuilt = Policies::build(&section(value), std::iter::once(&key), &kept, |_| false);
    assert_eq!(
        state(&rebuilt),
        Some(BreakerState::Closed),
        "a new instance"
    );
}

/// A component with nothing to do: an instance to publish.
#[derive(Debug)]
struct Plain;

impl crate::component::Component for Plain {}

#[tokio::test(start_paused = true)]
async fn publishing_a_new_instance_closes_its_breaker_and_republishing_keeps_it() {
    let key = ComponentKey::new("custom", "orders");
    let sections = Arc::new(crate::sections::Sections {
        resiliency: section(target(json!({"circuitBreaker": "cb"}))),
        ..Default::default()
    });
    let live = crate::handle::Live::new();
    let generation = |number: u64, instance: &crate::handle::Instance| {
        let instances = BTreeMap::from([(key.clone(), instance.clone())]);
        crate::handle::Generation::new(number, instances).with_sections(sections.clone())
    };
    let broken = crate::handle::Instance::Custom(Arc::new(Plain));
    live.publish(generation(1, &broken));
    let state = || {
        let current = live.load_full();
        let applied = current.policies().get(&key).map(|a| a.breaker_status());
        applied.flatten().map(|s| s.state)
    };
    let calls = AtomicU32::new(0);
    for _ in 0..2 {
        let current = live.load_full();
        let applied = current
            .policies()
            .get(&key)
            .unwrap_or_else(|| panic!("targeted"));
        let _ = applied.run(Retries::Never, flaky(5, &calls)).await;
    }
    assert_eq!(state(), Some(BreakerState::Open));
    live.publish(generation(2, &broken));
    assert_eq!(state(), Some(BreakerState::Open), "the same instance: kept");
    let fixed = crate::handle::Instance::Custom(Arc::new(Plain));
    live.publish(generation(3, &fixed));
    assert_eq!(state(), Some(BreakerState::Closed), "a new instance");
}

/// A call that panics is the component's failure (a component panicking
/// on every call opens its breaker), the panic going on to its caller;
/// the calls a panic drops beside it (the other keys of a bulk get) are
/// not. Failed before: a panic gave no verdict (the breaker never
/// opened); with a first fix judging every call dropped while a thread
/// panicked, one bulk request opened it.
#[tokio::test(start_paused = true)]
async fn a_call_that_panics_is_a_failure_and_the_calls_dropped_beside_it_are_not() {
    let policies = breaker_alone("consecutiveFailures >= 3");
    let applied = self::applied(&policies);
    let status = || {
        applied
            .breaker_status()
            .map(|s| (s.state, s.consecutive_failures))
    };
    let bulk = async {
        let panicking = applied.run(Retries::Never, || async {
            panic!("the component panics");
            #[allow(unreachable_code)]
            Ok::<u32, StateError>(0)
        });
        let waiting = || {
            applied.run(
                Retries::Never,
                std::future::pending::<Result<u32, StateError>>,
            )
        };
        tokio::join!(panicking, waiting(), waiting())
    };
    let unwound = caught(bulk).await;
    assert!(unwound.is_err(), "the panic goes on to the caller");
    assert_eq!(status(), Some((BreakerState::Closed, 1)));
    for _ in 0..2 {
        let call = applied.run(Retries::Never, || async {
            panic!("the component panics");
            #[allow(unreachable_code)]
            Ok::<u32, StateError>(0)
        });
        assert!(caught(call).await.is_err());
    }
    assert_eq!(status().map(|s| s.0), Some(BreakerState::Open));
}

/// An upload whose store panics is the component's failure, as any call
/// that panics, the panic going on to its caller. Failed before: the
/// unwinding dropped it unjudged (released), so a store panicking on
/// every upload never opened its breaker.
#[tokio::test(start_paused = true)]
async fn an_upload_that_panics_is_a_failure() {
    let policies = breaker_alone("consecutiveFailures >= 2");
    let applied = self::applied(&policies);
    for _ in 0..2 {
        let upload = applied.run_admitted_unless_dropped(
            async {
                panic!("the store panics");
                #[allow(unreachable_code)]
                Ok::<u32, StateError>(0)
            },
            || None,
            GRACE,
        );
        assert!(caught(upload).await.is_err(), "the panic goes on");
    }
    assert_eq!(
        applied.breaker_status().map(|s| s.state),
        Some(BreakerState::Open)
    );
}
