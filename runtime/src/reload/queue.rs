//! The reload queue: triggers (file, overlay, watched refs) send what they
//! saw; the runtime's worker applies it one transaction at a time,
//! coalescing whatever arrived meanwhile into the next.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, watch};

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

/// Where triggers send their messages. It counts them, so that a caller
/// can wait for what was sent before it to be handled
/// ([`handled_within`](Self::handled_within)).
#[derive(Clone)]
pub(crate) struct QueueSender {
    sender: mpsc::UnboundedSender<Queued>,
    progress: Arc<Progress>,
}

/// Where the runtime's worker receives them.
pub(crate) struct QueueReceiver {
    receiver: mpsc::UnboundedReceiver<Queued>,
    progress: Arc<Progress>,
    /// How many messages were taken.
    taken: u64,
}

/// How far the queue got: messages sent, and handled by the worker.
struct Progress {
    /// Held across each send: the count orders messages as the queue does.
    sent: Mutex<u64>,
    /// How many of the first messages were handled (`u64::MAX` once the
    /// worker is gone: nothing is waited for).
    handled: watch::Sender<u64>,
}

/// A new queue.
pub(crate) fn queue() -> (QueueSender, QueueReceiver) {
    let (sender, receiver) = mpsc::unbounded_channel();
    let progress = Arc::new(Progress {
        sent: Mutex::new(0),
        handled: watch::Sender::new(0),
    });
    let sender = QueueSender {
        sender,
        progress: Arc::clone(&progress),
    };
    let receiver = QueueReceiver {
        receiver,
        progress,
        taken: 0,
    };
    (sender, receiver)
}

impl QueueSender {
    /// Queues `queued`; an error when the worker is gone.
    pub(crate) fn send(&self, queued: Queued) -> Result<(), Queued> {
        let mut sent = self.progress.sent.lock().unwrap_or_else(|p| p.into_inner());
        self.sender.send(queued).map_err(|err| err.0)?;
        *sent += 1;
        Ok(())
    }

    /// Waits until every message sent before this call was handled by the
    /// worker (the reload it went into ended), for at most `deadline`;
    /// `false` when that took longer.
    pub(crate) async fn handled_within(&self, deadline: Duration) -> bool {
        let target = *self.progress.sent.lock().unwrap_or_else(|p| p.into_inner());
        let mut handled = self.progress.handled.subscribe();
        let reached = handled.wait_for(|handled| *handled >= target);
        let reached = tokio::time::timeout(deadline, reached).await;
        matches!(reached, Ok(Ok(_)))
    }
}

impl QueueReceiver {
    /// The next message; `None` once every sender is gone.
    pub(crate) async fn recv(&mut self) -> Option<Queued> {
        let queued = self.receiver.recv().await?;
        self.taken += 1;
        Some(queued)
    }

    /// The next message if one is waiting.
    pub(crate) fn try_recv(&mut self) -> Result<Queued, mpsc::error::TryRecvError> {
        let queued = self.receiver.try_recv()?;
        self.taken += 1;
        Ok(queued)
    }

    /// Says every message taken so far was handled.
    pub(crate) fn handled_taken(&self) {
        self.progress.handled.send_replace(self.taken);
    }
}

impl Drop for QueueReceiver {
    fn drop(&mut self) {
        // Nobody handles what is sent any more: nothing to wait for.
        self.progress.handled.send_replace(u64::MAX);
    }
}

/// Merges a burst into one request: the last change of the file and of
/// the overlay wins, pushes and forced components add up, and the last
/// trigger names the reload. A merge is fresh input (attempt 0), even
/// when a retried request is part of it.
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
                LayerChange::Overlay { .. } => overlay = Some(change),
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

/// What a batch rejected as a whole may still apply: the request without
/// its file change, without its overlay change, then without both (pushes
/// and forced components kept), in that order, leaving out variants with
/// nothing left to do. One invalid document must not take the others'
/// changes with it: a watched value, or overlay documents, that their
/// watch will not send again.
pub(crate) fn narrowed(request: &ReloadRequest) -> Vec<ReloadRequest> {
    let is_file = |c: &LayerChange| matches!(c, LayerChange::File(_));
    let is_overlay = |c: &LayerChange| matches!(c, LayerChange::Overlay { .. });
    let has_file = request.changes.iter().any(is_file);
    let has_overlay = request.changes.iter().any(is_overlay);
    let without = |drop_file: bool, drop_overlay: bool| {
        let changes: Vec<LayerChange> = request
            .changes
            .iter()
            .filter(|c| !(drop_file && is_file(c) || drop_overlay && is_overlay(c)))
            .cloned()
            .collect();
        (!changes.is_empty() || !request.forced.is_empty()).then(|| ReloadRequest {
            changes,
            forced: request.forced.clone(),
            attempt: request.attempt,
            ..ReloadRequest::of_changes(request.trigger.clone(), Vec::new())
        })
    };
    let mut variants = Vec::new();
    if has_file {
        variants.extend(without(true, false));
    }
    if has_overlay {
        variants.extend(without(false, true));
    }
    if has_file && has_overlay {
        variants.extend(without(true, true));
    }
    variants
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

    #[test]
    fn a_rejected_batch_narrows_to_what_it_carried_besides_each_document() {
        let forced: BTreeSet<_> = [ComponentKey::new("state", "a")].into();
        let both = ReloadRequest {
            forced: forced.clone(),
            ..ReloadRequest::of_changes(
                Trigger::File,
                vec![
                    LayerChange::File(Config::default()),
                    LayerChange::Overlay {
                        common: None,
                        read: None,
                    },
                ],
            )
        };
        let kinds = |r: &ReloadRequest| {
            r.changes
                .iter()
                .map(|c| match c {
                    LayerChange::File(_) => "file",
                    LayerChange::Overlay { .. } => "overlay",
                    _ => "other",
                })
                .collect::<Vec<_>>()
        };
        let variants = narrowed(&both);
        assert_eq!(
            variants.iter().map(kinds).collect::<Vec<_>>(),
            [vec!["overlay"], vec!["file"], vec![]]
        );
        assert!(variants.iter().all(|v| v.forced == forced));

        // A file alone narrows to nothing; a file with forced components
        // to the forced components.
        let file = ReloadRequest::new(Config::default(), Trigger::File);
        assert!(narrowed(&file).is_empty());
        let with_forced = ReloadRequest {
            forced: forced.clone(),
            ..file
        };
        let variants = narrowed(&with_forced);
        assert_eq!(variants.len(), 1);
        assert!(variants[0].changes.is_empty() && variants[0].forced == forced);
    }
}
