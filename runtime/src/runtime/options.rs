//! How the runtime starts, reloads and retires components.

use std::time::Duration;

use crate::assemble::StartTimeouts;

/// How the runtime starts, reloads and retires components.
#[derive(Debug, Clone)]
pub struct RuntimeOptions {
    /// Init and readiness timeouts, per component.
    pub timeouts: StartTimeouts,
    /// How long a replaced instance may keep in-flight users before it is
    /// closed anyway.
    pub drain_grace: Duration,
    /// How many reload records are kept.
    pub history_capacity: usize,
    /// How often watched secretRefs are polled (secret stores cannot
    /// notify), and watched configurationRefs whose store refuses to
    /// subscribe; at least every 10 ms (a shorter interval, zero
    /// included, is raised to it).
    pub secret_poll_interval: Duration,
}

impl Default for RuntimeOptions {
    fn default() -> Self {
        Self {
            timeouts: StartTimeouts::default(),
            drain_grace: Duration::from_secs(10),
            history_capacity: 100,
            secret_poll_interval: Duration::from_secs(10),
        }
    }
}
