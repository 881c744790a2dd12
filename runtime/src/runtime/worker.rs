//! The runtime's worker: drains the triggers' queue, one reload at a time,
//! coalescing whatever arrived meanwhile into the next.

use std::sync::Weak;

use tokio_util::sync::CancellationToken;

use crate::reload::queue::{coalesce, QueueReceiver, Queued};
use crate::reload::Reloader;

/// Starts the worker; it ends at shutdown, when the queue closes, or when
/// the runtime is dropped.
pub(super) fn spawn_worker(
    reloader: Weak<Reloader>,
    mut queue: QueueReceiver,
    stopped: CancellationToken,
) {
    tokio::spawn(async move {
        loop {
            let first = tokio::select! {
                queued = queue.recv() => match queued {
                    Some(queued) => queued,
                    None => return,
                },
                () = stopped.cancelled() => return,
            };
            let mut batch = vec![first];
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
            if !requests.is_empty() {
                // The outcome is recorded in the history and logged.
                let _ = reloader.reload(coalesce(requests)).await;
            }
        }
    });
}
