//! How often the stores that cannot notify are read: watched secretRefs,
//! configurationRefs and overlays whose store cannot subscribe.

use std::time::Duration;

/// The shortest period watched secretRefs are polled at: a shorter
/// [`RuntimeOptions::secret_poll_interval`](crate::RuntimeOptions) (zero
/// included) is raised to it.
pub(crate) const MIN_SECRET_POLL: Duration = Duration::from_millis(10);

/// The period secrets are polled at for the interval asked.
pub(super) fn secret_poll_period(asked: Duration) -> Duration {
    asked.max(MIN_SECRET_POLL)
}
