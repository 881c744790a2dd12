//! The reload queue: background triggers (file, overlay, watched refs)
//! enqueue changes; one worker applies them one transaction at a time,
//! coalescing whatever arrived meanwhile into the next.

use std::collections::BTreeSet;
use std::sync::Weak;

use tokio::sync::mpsc;

use crate::key::ComponentKey;
use crate::reload::{LayerChange, Trigger};
use crate::runtime::{Inner, Runtime};

/// One queued request for a reload.
#[derive(Debug)]
pub(crate) struct Queued {
    pub(crate) trigger: Trigger,
    pub(crate) change: Option<LayerChange>,
    pub(crate) forced: BTreeSet<ComponentKey>,
}

/// Where triggers send their changes.
pub(crate) type QueueSender = mpsc::UnboundedSender<Queued>;

/// Starts the worker; it ends at shutdown or when the runtime is dropped.
pub(crate) fn spawn_worker(inner: Weak<Inner>, mut receiver: mpsc::UnboundedReceiver<Queued>) {
    tokio::spawn(async move {
        loop {
            let stopped = match inner.upgrade() {
                Some(inner) => inner.stopped.clone(),
                None => return,
            };
            let first = tokio::select! {
                queued = receiver.recv() => match queued {
                    Some(queued) => queued,
                    None => return,
                },
                () = stopped.cancelled() => return,
            };
            let mut batch = vec![first];
            while let Ok(more) = receiver.try_recv() {
                batch.push(more);
            }
            let Some(inner) = inner.upgrade() else {
                return;
            };
            let (trigger, changes, forced) = coalesce(batch);
            let runtime = Runtime { inner };
            // The outcome is recorded in the history and logged.
            let _ = runtime.transact(trigger, changes, forced, None).await;
        }
    });
}

/// Merges a burst: the last change of each layer wins, forced components
/// add up, and the last trigger names the reload.
fn coalesce(batch: Vec<Queued>) -> (Trigger, Vec<LayerChange>, BTreeSet<ComponentKey>) {
    let mut trigger = Trigger::Watch;
    let mut file = None;
    let mut overlay = None;
    let mut pushes = Vec::new();
    let mut forced = BTreeSet::new();
    for queued in batch {
        trigger = queued.trigger;
        forced.extend(queued.forced);
        match queued.change {
            Some(change @ LayerChange::File(_)) => file = Some(change),
            Some(change @ LayerChange::Overlay(..)) => overlay = Some(change),
            Some(change @ LayerChange::Push(..)) => pushes.push(change),
            None => {}
        }
    }
    let changes = file.into_iter().chain(overlay).chain(pushes).collect();
    (trigger, changes, forced)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ConfigFile;

    #[test]
    fn a_burst_keeps_the_last_file_and_every_forced_component() {
        let file = |app: &str| {
            Some(LayerChange::File(ConfigFile {
                app_id: app.into(),
                ..ConfigFile::default()
            }))
        };
        let (trigger, changes, forced) = coalesce(vec![
            Queued {
                trigger: Trigger::File,
                change: file("one"),
                forced: BTreeSet::new(),
            },
            Queued {
                trigger: Trigger::Watch,
                change: None,
                forced: [ComponentKey::new("state", "a")].into(),
            },
            Queued {
                trigger: Trigger::File,
                change: file("two"),
                forced: BTreeSet::new(),
            },
        ]);
        assert_eq!(trigger, Trigger::File);
        assert_eq!(forced.len(), 1);
        assert!(matches!(changes.as_slice(), [LayerChange::File(f)] if f.app_id == "two"));
    }
}
