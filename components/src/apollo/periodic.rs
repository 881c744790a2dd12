//! The periodic refresh: every `refreshIntervalMs` (default 5 min) each
//! namespace is fetched with the release key and the release messages
//! held, whether or not a long poll announced a release — as the Java
//! client's `schedulePeriodicRefresh`. Usually a 304. The messages make a
//! config service whose release cache lags reload it rather than answer
//! the release before the one served (which would be served until the
//! next poll).
//!
//! Why: Apollo answers a long poll only when its latest notification id is
//! above the one the client sends (`NotificationControllerV2`). After its
//! database is restored, or when the store moves to another Apollo (a DR
//! site listed in `config_server`), the id held is above the service's:
//! every poll is a 304 and no release would ever be learnt. A release
//! found here is served, and its namespace's id forgotten (see
//! [`Refresher::revisit`]), so the next poll learns the service's current
//! id and follows releases again (and the poller warns only if that id is
//! below ours: a release found just before the poll announces it is
//! not a sign of it).
//!
//! What is left: an instance whose database (not its cache) is behind —
//! a replica lagging, or a restored one — answers an older release under
//! another release key; neither the key nor the messages tell it from a
//! newer one, and it is served until an instance that has the latest
//! answers (the next notification or refresh there).
//!
//! A pass that fails is retried at the next interval; the failure is
//! logged (a warning once per streak) and reported as `Degraded` until a
//! pass succeeds.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::error::ApolloError;
use super::refresh::Refresher;

/// Refreshes every namespace of `refresher` every `every`, until `stop`.
pub(crate) async fn run(refresher: Arc<Refresher>, every: Duration, stop: CancellationToken) {
    let mut failing: Option<String> = None;
    loop {
        let passed = tokio::select! {
            () = stop.cancelled() => return,
            passed = async {
                tokio::time::sleep(every).await;
                pass(&refresher).await
            } => passed,
        };
        match passed {
            Ok(changed) => {
                refresher.live.refresh_failed(None);
                if failing.take().is_some() {
                    info!(component = %refresher.key, "Apollo periodic refresh succeeded again.");
                }
                debug!(component = %refresher.key, changed, "Apollo periodic refresh done.");
            }
            Err(err) => {
                let message = err.to_string();
                refresher.live.refresh_failed(Some(&message));
                if failing.as_deref() != Some(message.as_str()) {
                    warn!(
                        component = %refresher.key,
                        error = %message,
                        retry_in_ms = every.as_millis() as u64,
                        "Apollo periodic refresh failed; keeping the last good configuration."
                    );
                }
                failing = Some(message);
            }
        }
    }
}

/// One pass over every namespace; the first error, after trying them all.
/// Returns how many keys changed.
async fn pass(refresher: &Refresher) -> Result<usize, ApolloError> {
    let mut changed = 0;
    let mut first_error = None;
    for namespace in refresher.live.order() {
        match refresher.revisit(namespace).await {
            Ok(count) => changed += count,
            Err(err) => {
                first_error.get_or_insert(err);
            }
        }
    }
    match first_error {
        Some(err) => Err(err),
        None => Ok(changed),
    }
}
