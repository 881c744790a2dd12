//! The bound of one call the runtime makes into a store in the background
//! (a subscribe or a read, by a watch, a subscription's forwarder, a
//! pub/sub subscription's first subscribe): one that does not answer in
//! time is abandoned and asked again, so a store that hangs once never
//! holds the runtime's work for good.

use std::time::Duration;

/// How long one background store call may take (the shortest, where a
/// caller grows its bound).
pub(crate) const STORE_CALL_BOUND: Duration = Duration::from_secs(5);
