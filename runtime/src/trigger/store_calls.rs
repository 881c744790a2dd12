//! How long a watch (of watched refs, of the overlay) waits for one call
//! into a config or secret store.

use std::time::Duration;

/// The shortest time a watch waits for one call into a store (subscribe,
/// read) before abandoning it and trying again: a store that hangs once
/// does not stop the watch.
pub(crate) const MIN_STORE_CALL: Duration = crate::store_call::STORE_CALL_BOUND;

/// How long a watch waits for one store call: a poll period (when polled),
/// at least [`MIN_STORE_CALL`].
pub(super) fn store_call_bound(period: Option<Duration>) -> Duration {
    period.unwrap_or_default().max(MIN_STORE_CALL)
}
