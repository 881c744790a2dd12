//! One component's circuit breaker: closed (calls pass, consecutive
//! failures counted), open (calls refused until its timeout), half-open
//! (`maxRequests` trial calls; that many successes close it, one failure
//! opens it again). As Dapr's (sony/gobreaker): results of calls admitted
//! before the last state change are ignored.

use std::sync::Mutex;
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

use crate::sections::resiliency::BreakerPolicy;

/// Where a breaker is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum BreakerState {
    /// Calls pass.
    Closed,
    /// Trial calls pass.
    HalfOpen,
    /// Calls are refused.
    Open,
}

impl BreakerState {
    /// As a number for a gauge: 0 closed, 1 half-open, 2 open.
    pub fn as_number(self) -> i64 {
        match self {
            Self::Closed => 0,
            Self::HalfOpen => 1,
            Self::Open => 2,
        }
    }

    /// `closed`, `half-open` or `open`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Closed => "closed",
            Self::HalfOpen => "half-open",
            Self::Open => "open",
        }
    }
}

/// A circuit breaker and its settings.
#[derive(Debug)]
pub(crate) struct Breaker {
    policy: BreakerPolicy,
    counts: Mutex<Counts>,
}

/// The breaker's state; one lock, held for a few instructions.
#[derive(Debug)]
struct Counts {
    state: BreakerState,
    /// Bumped at each state change (and each closed-state interval):
    /// results of calls admitted in an earlier epoch are ignored.
    epoch: u64,
    /// Calls admitted in this epoch.
    requests: u32,
    consecutive_failures: u32,
    consecutive_successes: u32,
    /// When the current epoch ends (open: half-open from then; closed with
    /// an interval: counts start over). `None`: never.
    expiry: Option<Instant>,
    /// Times the breaker opened.
    trips: u64,
}

/// A call the breaker let through, to report back with [`Breaker::record`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Admitted {
    epoch: u64,
}

/// An admitted call in flight: reports its end to the breaker. A call
/// dropped before it ended (its client cancelled it, or its request's
/// deadline passed) is judged by how long it was in flight: within its
/// blame bound it tells nothing of the component (a client that gave up
/// quickly) and is counted neither way, its admission handed back, so
/// clients that give up cannot open the breaker for everyone and a
/// half-open breaker never waits for a trial call that is gone (another
/// is admitted in its place); in flight for the bound or longer, the
/// component kept it waiting that long (a hung backend) and it is the
/// component's failure, as a call cut by the policy's timeout would be.
/// A call that may run long (an upload) can hand its trial place back
/// early ([`InFlight::hand_back_trial_place`]) and still report how it
/// ends.
#[derive(Debug)]
pub(crate) struct InFlight<'a> {
    breaker: &'a Breaker,
    admitted: Option<Admitted>,
    /// Whether it still holds its place among the breaker's admitted
    /// calls (a half-open breaker's trial places).
    holds_place: bool,
    /// When the breaker let it through.
    admitted_at: Instant,
    /// In flight this long, a call dropped unfinished is the component's
    /// failure.
    blame_after: Duration,
}

impl InFlight<'_> {
    /// Reports how the call ended.
    pub(crate) fn finish(mut self, success: bool) {
        if let Some(admitted) = self.admitted.take() {
            self.breaker.record(admitted, success);
        }
    }

    /// Reports nothing of the call, its admission handed back (a
    /// half-open breaker admits another trial call): it ended without
    /// telling anything of the component.
    pub(crate) fn release(mut self) {
        self.hand_back_trial_place();
        self.admitted = None;
    }

    /// Hands back its trial place (a half-open breaker admits another
    /// trial call) while the call runs on, still to report how it ends:
    /// a call that may outlast its breaker's patience without being the
    /// component's fault (an upload that keeps sending).
    pub(crate) fn hand_back_trial_place(&mut self) {
        if let (Some(admitted), true) = (self.admitted, self.holds_place) {
            self.holds_place = false;
            self.breaker.release(admitted);
        }
    }
}

impl Drop for InFlight<'_> {
    /// Dropped unfinished: the component's failure once in flight for its
    /// blame bound (it kept the call waiting until its client gave up);
    /// before that, as [`InFlight::release`] (no verdict, its trial place
    /// handed back). A call that panics is judged where the panic is
    /// caught ([`super::Applied`]'s attempt), not here: calls dropped by
    /// another's panic (siblings of a bulk request) are no failures.
    fn drop(&mut self) {
        let Some(admitted) = self.admitted else {
            return;
        };
        if self.admitted_at.elapsed() >= self.blame_after {
            self.breaker.record(admitted, false);
        } else {
            self.hand_back_trial_place();
        }
        self.admitted = None;
    }
}

impl Breaker {
    pub(crate) fn new(policy: BreakerPolicy) -> Self {
        let now = Instant::now();
        let mut counts = Counts {
            state: BreakerState::Closed,
            epoch: 0,
            requests: 0,
            consecutive_failures: 0,
            consecutive_successes: 0,
            expiry: None,
            trips: 0,
        };
        counts.enter(BreakerState::Closed, &policy, now);
        Self {
            policy,
            counts: Mutex::new(counts),
        }
    }

    /// The settings it runs with.
    pub(crate) fn policy(&self) -> &BreakerPolicy {
        &self.policy
    }

    fn counts(&self) -> std::sync::MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Lets a call through, or `None` while open (or half-open with every
    /// trial call taken).
    fn admit(&self) -> Option<Admitted> {
        let mut counts = self.counts();
        counts.refresh(&self.policy, Instant::now());
        match counts.state {
            BreakerState::Open => None,
            BreakerState::HalfOpen if counts.requests >= self.policy.max_requests => None,
            _ => {
                counts.requests = counts.requests.saturating_add(1);
                Some(Admitted {
                    epoch: counts.epoch,
                })
            }
        }
    }

    /// Lets a call through as [`Breaker::admit`], reporting its end when
    /// finished or dropped: dropped unfinished after `blame_after` in
    /// flight, it is the component's failure; sooner, neither way.
    pub(crate) fn enter(&self, blame_after: Duration) -> Option<InFlight<'_>> {
        self.admit().map(|admitted| InFlight {
            breaker: self,
            admitted: Some(admitted),
            holds_place: true,
            admitted_at: Instant::now(),
            blame_after,
        })
    }

    /// Hands back the admission of a call that ended without a verdict:
    /// counted neither way; its trial place, while half-open in the same
    /// epoch, is free again.
    fn release(&self, admitted: Admitted) {
        let mut counts = self.counts();
        counts.refresh(&self.policy, Instant::now());
        if counts.epoch == admitted.epoch && counts.state == BreakerState::HalfOpen {
            counts.requests = counts.requests.saturating_sub(1);
        }
    }

    /// Reports how an admitted call ended.
    fn record(&self, admitted: Admitted, success: bool) {
        let now = Instant::now();
        let mut counts = self.counts();
        counts.refresh(&self.policy, now);
        if counts.epoch != admitted.epoch {
            return;
        }
        match (success, counts.state) {
            (true, BreakerState::Closed) => counts.consecutive_failures = 0,
            (true, BreakerState::HalfOpen) => {
                counts.consecutive_successes = counts.consecutive_successes.saturating_add(1);
                if counts.consecutive_successes >= self.policy.max_requests {
                    counts.enter(BreakerState::Closed, &self.policy, now);
                }
            }
            (false, BreakerState::Closed) => {
                counts.consecutive_successes = 0;
                counts.consecutive_failures = counts.consecutive_failures.saturating_add(1);
                if counts.consecutive_failures >= self.policy.trip_after {
                    counts.enter(BreakerState::Open, &self.policy, now);
                }
            }
            (false, BreakerState::HalfOpen) => counts.enter(BreakerState::Open, &self.policy, now),
            (_, BreakerState::Open) => {}
        }
    }

    /// Its state now, consecutive failures and trips so far.
    pub(crate) fn snapshot(&self) -> (BreakerState, u32, u64) {
        let mut counts = self.counts();
        counts.refresh(&self.policy, Instant::now());
        (counts.state, counts.consecutive_failures, counts.trips)
    }
}

impl Counts {
    /// Moves on from an epoch that has ended: open → half-open after the
    /// timeout; closed counts start over every interval.
    fn refresh(&mut self, policy: &BreakerPolicy, now: Instant) {
        let Some(expiry) = self.expiry else { return };
        if now < expiry {
            return;
        }
        match self.state {
            BreakerState::Closed => self.enter(BreakerState::Closed, policy, now),
            BreakerState::Open => self.enter(BreakerState::HalfOpen, policy, now),
            BreakerState::HalfOpen => {}
        }
    }

    /// Starts a new epoch in `state`.
    fn enter(&mut self, state: BreakerState, policy: &BreakerPolicy, now: Instant) {
        if state == BreakerState::Open && self.state != BreakerState::Open {
            self.trips = self.trips.saturating_add(1);
        }
        self.state = state;
        self.epoch = self.epoch.wrapping_add(1);
        self.requests = 0;
        self.consecutive_failures = 0;
        self.consecutive_successes = 0;
        self.expiry = match state {
            BreakerState::Closed if !policy.interval.is_zero() => now.checked_add(policy.interval),
            BreakerState::Open => now.checked_add(policy.timeout),
            _ => None,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The blame bound the tests' calls are entered with.
    const BLAME_AFTER: Duration = Duration::from_secs(5);

    fn policy(trip_after: u32, max_requests: u32, interval: u64) -> BreakerPolicy {
        BreakerPolicy {
            max_requests,
            interval: Duration::from_secs(interval),
            timeout: Duration::from_secs(30),
            trip_after,
        }
    }

    fn fail(breaker: &Breaker) {
        let admitted = breaker.admit().unwrap_or_else(|| panic!("refused"));
        breaker.record(admitted, false);
    }

    fn succeed(breaker: &Breaker) {
        let admitted = breaker.admit().unwrap_or_else(|| panic!("refused"));
        breaker.record(admitted, true);
    }

    fn state(breaker: &Breaker) -> BreakerState {
        breaker.snapshot().0
    }

    #[tokio::test(start_paused = true)]
    async fn opens_after_consecutive_failures_and_half_opens_after_its_timeout() {
        let breaker = Breaker::new(policy(3, 2, 0));
        fail(&breaker);
        fail(&breaker);
        succeed(&breaker);
        fail(&breaker);
        fail(&breaker);
        assert_eq!(
            state(&breaker),
            BreakerState::Closed,
            "a success resets the run"
        );
        fail(&breaker);
        assert_eq!(state(&breaker), BreakerState::Open);
        assert!(breaker.admit().is_none());
        tokio::time::advance(Duration::from_secs(29)).await;
        assert!(breaker.admit().is_none(), "still open before its timeout");
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(state(&breaker), BreakerState::HalfOpen);
        let first = breaker.admit().unwrap_or_else(|| panic!("trial 1"));
        let second = breaker.admit().unwrap_or_else(|| panic!("trial 2"));
        assert!(breaker.admit().is_none(), "only maxRequests trial calls");
        breaker.record(first, true);
        assert_eq!(state(&breaker), BreakerState::HalfOpen);
        breaker.record(second, true);
        assert_eq!(state(&breaker), BreakerState::Closed);
        assert_eq!(breaker.snapshot().2, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_dropped_unfinished_counts_neither_way() {
        let breaker = Breaker::new(policy(1, 1, 0));
        for _ in 0..3 {
            drop(
                breaker
                    .enter(BLAME_AFTER)
                    .unwrap_or_else(|| panic!("closed")),
            );
        }
        assert_eq!(breaker.snapshot(), (BreakerState::Closed, 0, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_dropped_after_its_blame_bound_is_a_failure() {
        let breaker = Breaker::new(policy(2, 1, 0));
        let quick = breaker
            .enter(BLAME_AFTER)
            .unwrap_or_else(|| panic!("closed"));
        tokio::time::advance(BLAME_AFTER - Duration::from_millis(1)).await;
        drop(quick);
        assert_eq!(breaker.snapshot(), (BreakerState::Closed, 0, 0), "within");
        for _ in 0..2 {
            let hung = breaker
                .enter(BLAME_AFTER)
                .unwrap_or_else(|| panic!("closed"));
            tokio::time::advance(BLAME_AFTER).await;
            drop(hung);
        }
        assert_eq!(breaker.snapshot(), (BreakerState::Open, 0, 1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_trial_call_dropped_after_its_blame_bound_opens_it_again() {
        let breaker = Breaker::new(policy(1, 1, 0));
        fail(&breaker);
        tokio::time::advance(Duration::from_secs(30)).await;
        let trial = breaker
            .enter(BLAME_AFTER)
            .unwrap_or_else(|| panic!("half-open"));
        tokio::time::advance(BLAME_AFTER).await;
        drop(trial);
        assert_eq!(breaker.snapshot(), (BreakerState::Open, 0, 2));
    }

    #[tokio::test(start_paused = true)]
    async fn a_trial_call_dropped_unfinished_gives_its_trial_place_back() {
        let breaker = Breaker::new(policy(1, 1, 0));
        fail(&breaker);
        tokio::time::advance(Duration::from_secs(30)).await;
        let trial = breaker
            .enter(BLAME_AFTER)
            .unwrap_or_else(|| panic!("half-open"));
        assert!(
            breaker.enter(BLAME_AFTER).is_none(),
            "one trial call at a time"
        );
        drop(trial);
        assert_eq!(state(&breaker), BreakerState::HalfOpen, "no verdict");
        breaker
            .enter(BLAME_AFTER)
            .unwrap_or_else(|| panic!("the place was given back, not kept forever"))
            .finish(true);
        assert_eq!(state(&breaker), BreakerState::Closed);
    }

    #[tokio::test(start_paused = true)]
    async fn a_trial_place_handed_back_is_given_back_once() {
        let breaker = Breaker::new(policy(1, 1, 0));
        fail(&breaker);
        tokio::time::advance(Duration::from_secs(30)).await;
        let mut long = breaker
            .enter(BLAME_AFTER)
            .unwrap_or_else(|| panic!("half-open"));
        assert!(
            breaker.enter(BLAME_AFTER).is_none(),
            "one trial call at a time"
        );
        long.hand_back_trial_place();
        long.hand_back_trial_place();
        let next = breaker
            .enter(BLAME_AFTER)
            .unwrap_or_else(|| panic!("its place was handed back"));
        long.release();
        assert!(
            breaker.enter(BLAME_AFTER).is_none(),
            "`next` holds the only place"
        );
        next.finish(true);
        assert_eq!(state(&breaker), BreakerState::Closed);
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_that_handed_back_its_place_still_reports_its_end() {
        let breaker = Breaker::new(policy(1, 1, 0));
        fail(&breaker);
        tokio::time::advance(Duration::from_secs(30)).await;
        let mut long = breaker
            .enter(BLAME_AFTER)
            .unwrap_or_else(|| panic!("half-open"));
        long.hand_back_trial_place();
        long.finish(false);
        assert_eq!(state(&breaker), BreakerState::Open);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_trial_opens_it_again() {
        let breaker = Breaker::new(policy(1, 1, 0));
        fail(&breaker);
        tokio::time::advance(Duration::from_secs(30)).await;
        fail(&breaker);
        assert_eq!(state(&breaker), BreakerState::Open);
        assert_eq!(breaker.snapshot().2, 2);
    }

    #[tokio::test(start_paused = true)]
    async fn the_interval_clears_counts_while_closed_and_stale_results_are_ignored() {
        let breaker = Breaker::new(policy(2, 1, 10));
        fail(&breaker);
        let late = breaker.admit().unwrap_or_else(|| panic!("admitted"));
        tokio::time::advance(Duration::from_secs(10)).await;
        breaker.record(late, false);
        fail(&breaker);
        assert_eq!(state(&breaker), BreakerState::Closed, "counts started over");
        fail(&breaker);
        assert_eq!(state(&breaker), BreakerState::Open);
    }
}
