//! Deadlines from durations a user may set to "no limit"
//! (`Duration::MAX`), which an `Instant` cannot be moved by.

use std::time::Duration;

use tokio::time::Instant;

/// About 30 years, as tokio reckons its own "far future": a deadline
/// never reached in practice.
const FAR_FUTURE: Duration = Duration::from_secs(86_400 * 365 * 30);

/// The instant `within` from now or, when that is beyond what the clock
/// can hold (`Duration::MAX` for "no limit", say), about 30 years from
/// now: a limit never reached, where `Instant::now() + within` would
/// panic with "overflow when adding duration to instant".
pub(crate) fn deadline_after(within: Duration) -> Instant {
    deadline_from(Instant::now(), within)
}

/// The instant `within` after `from` or, when the clock cannot hold it,
/// about 30 years after `from` (see [`deadline_after`]).
pub fn deadline_from(from: Instant, within: Duration) -> Instant {
    from.checked_add(within).unwrap_or(from + FAR_FUTURE)
}

#[cfg(test)]
mod tests {
    //! The deadline, and every wait a user's "no limit" (`Duration::MAX`)
    //! reaches: init, readiness, the close after a failed init, the drain
    //! of a removed component and a call into a component (see
    //! [`guarded`](crate::guarded::guarded)).

    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;
    use crate::component::ComponentError;
    use crate::config::{parse, validate};
    use crate::guarded::{guarded, Answer};
    use crate::{FailedStep, Registry, Runtime, RuntimeOptions, StartError, StartTimeouts};

    #[test]
    fn no_limit_is_a_far_deadline_not_a_panic() {
        let now = Instant::now();
        let deadline = deadline_after(Duration::MAX);
        assert!(deadline >= now + FAR_FUTURE);
    }

    #[test]
    fn a_duration_the_clock_can_hold_is_taken_as_it_is() {
        let before = Instant::now();
        let deadline = deadline_after(Duration::from_secs(5));
        assert!(deadline >= before + Duration::from_secs(5));
        assert!(deadline <= Instant::now() + Duration::from_secs(5));
    }

    /// Set when an [`Unbounded`] is closed.
    static UNBOUNDED_CLOSED: AtomicBool = AtomicBool::new(false);

    /// Starts, is ready at once, records its close.
    #[derive(crate::Component)]
    #[component(kind = "probe", type = "test.deadline.unbounded")]
    struct Unbounded {}

    #[async_trait::async_trait]
    impl crate::Component for Unbounded {
        async fn close(&self) -> Result<(), ComponentError> {
            UNBOUNDED_CLOSED.store(true, Ordering::SeqCst);
            Ok(())
        }
    }

    /// Its `init` fails (closed after it, within the init timeout).
    #[derive(crate::Component)]
    #[component(kind = "probe", type = "test.deadline.fails-init")]
    struct FailsInit {}

    #[async_trait::async_trait]
    impl crate::Component for FailsInit {
        async fn init(&mut self, _: &crate::InitContext) -> Result<(), ComponentError> {
            Err(ComponentError::new("refused on purpose"))
        }
    }

    /// Every start timeout and the drain grace set to "no limit".
    fn no_limits() -> RuntimeOptions {
        RuntimeOptions {
            timeouts: StartTimeouts {
                init: Duration::MAX,
                ready: Duration::MAX,
                ..StartTimeouts::default()
            },
            drain_grace: Duration::MAX,
            ..RuntimeOptions::default()
        }
    }

    fn config(text: &str) -> crate::config::Config {
        parse(text.as_bytes()).unwrap_or_else(|p| panic!("{p}"))
    }

    /// Started with no limits (readiness awaited by a far deadline), a
    /// component removed by a reload is drained and closed, by a far
    /// deadline too. Before, the start panicked ("overflow when adding
    /// duration to instant"), and so did the drain, dropping the removed
    /// component without its close.
    #[tokio::test]
    async fn no_limit_on_readiness_or_drain_starts_and_closes() {
        let registry = Registry::collected();
        let first = config(
            r#"{"components": {"probe": {"unbounded": {"type": "test.deadline.unbounded"}}}}"#,
        );
        let valid = validate(first, &registry).unwrap_or_else(|p| panic!("{p}"));
        let runtime = Runtime::start(valid, registry, no_limits())
            .await
            .unwrap_or_else(|e| panic!("the start failed: {e}"));
        runtime
            .apply(config(r#"{"components": {}}"#))
            .await
            .unwrap_or_else(|e| panic!("the reload failed: {e}"));
        runtime.shutdown().await;
        assert!(
            UNBOUNDED_CLOSED.load(Ordering::SeqCst),
            "the removed component was not closed"
        );
    }

    /// A failed `init` with no init limit fails the start at `Init`, its
    /// component closed by a far deadline: no panic.
    #[tokio::test]
    async fn no_limit_on_init_fails_a_refused_init_as_such() {
        let registry = Registry::collected();
        let text =
            r#"{"components": {"probe": {"refused": {"type": "test.deadline.fails-init"}}}}"#;
        let valid = validate(config(text), &registry).unwrap_or_else(|p| panic!("{p}"));
        let failures = match Runtime::start(valid, registry, no_limits()).await {
            Err(StartError::Failed(failures)) => failures,
            Err(other) => panic!("not a component failure: {other}"),
            Ok(_) => panic!("a refused init started"),
        };
        assert_eq!(failures.len(), 1, "{failures:?}");
        assert_eq!(
            failures[0].step,
            FailedStep::Init,
            "{}",
            failures[0].message
        );
    }

    /// A call into a component with no limit is awaited, not a panic.
    #[tokio::test]
    async fn a_guarded_call_with_no_limit_answers() {
        let answer = guarded(async { Ok(7) }, Duration::MAX).await;
        assert!(matches!(answer, Answer::Answered(Ok(7))));
    }
}
