//! The reload queue: triggers (file, overlay, watched refs) send what they
//! saw; the runtime's worker applies it one transaction at a time,
//! coalescing whatever arrived meanwhile into the next.

use std::collections::BTreeSet;

use tokio::sync::mpsc;

use super::history::Trigger;
use super::request::ReloadRequest;
use crate::config::LayerChange;

/// One message from a trigger.
#[derive(Debug)]
pub(crate) enum Queued {
    /// A reload to perform.
    Reload(ReloadRequest),
    /// A change that could not even be parsed: recorded as rejected.
    Rejected {
        /// Who saw it.
        trigger: Trigger,
        /// Every problem.
        error: String,
    },
}

/// Where triggers send their messages.
pub(crate) type QueueSender = mpsc::UnboundedSender<Queued>;

/// Where the runtime's worker receives them.
pub(crate) type QueueReceiver = mpsc::UnboundedReceiver<Queued>;

/// A new queue.
pub(crate) fn queue() -> (QueueSender, QueueReceiver) {
    mpsc::unbounded_channel()
}

/// Merges a burst into one request: the last change of the file and of
/// the overlay wins, pushes and forced components add up, and the last
/// trigger names the reload.
pub(crate) fn coalesce(batch: Vec<ReloadRequest>) -> ReloadRequest {
    let mut trigger = Trigger::WatchedRef;
    let mut file = None;
    let mut overlay = None;
    let mut pushes = Vec::new();
    let mut forced = BTreeSet::new();
    for request in batch {
        trigger = request.trigger;
        forced.extend(request.forced);
        for change in request.changes {
            match change {
                LayerChange::File(_) => file = Some(change),
                LayerChange::Overlay(..) => overlay = Some(change),
                LayerChange::Push(..) | LayerChange::Release(_) => pushes.push(change),
            }
        }
    }
    let changes = file.into_iter().chain(overlay).chain(pushes).collect();
    ReloadRequest {
        forced,
        ..ReloadRequest::of_changes(trigger, changes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::component::ComponentKey;
    use crate::config::Config;

    #[test]
    fn a_burst_keeps_the_last_file_and_every_forced_component() {
        let file = |app: &str| {
            ReloadRequest::new(
                Config {
                    app_id: app.into(),
                    ..Config::default()
                },
                Trigger::File,
            )
        };
        let watched = ReloadRequest {
            forced: [ComponentKey::new("state", "a")].into(),
            ..ReloadRequest::of_changes(Trigger::WatchedRef, Vec::new())
        };
        let request = coalesce(vec![file("one"), watched, file("two")]);
        assert_eq!(request.trigger, Trigger::File);
        assert_eq!(request.forced.len(), 1);
        assert!(matches!(request.changes.as_slice(), [LayerChange::File(f)] if f.app_id == "two"));
    }
}
