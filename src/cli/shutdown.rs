//! The bounded shutdown every path of `rewire run` ends with.

use std::time::Duration;

use rewire::Runtime;

/// Shuts `runtime` down by `within` from now: a deep graph of closes that
/// hang, or a reload that does not let go, must still let the process exit
/// with its stores closed (dropping the shutdown at a bound instead would
/// skip the stores, closed last). Every shutdown of `rewire run` goes
/// through here. Returns how many closes were abandoned.
pub(super) async fn shut_down_within(runtime: &Runtime, within: Duration) -> usize {
    let abandoned = runtime
        .shutdown_by(tokio::time::Instant::now() + within)
        .await;
    if abandoned > 0 {
        tracing::warn!(abandoned, bound = ?within, "Component close(s) abandoned at shutdown.");
    }
    abandoned
}
