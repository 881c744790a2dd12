//! Triggers: producers that watch the world — the configuration file (and
//! folder of Dapr manifests),
//! `watch: true` refs, the overlay key — and send what they see to the
//! reload queue. They never hold the runtime: each gets a
//! [`TriggerContext`].

mod config_file;
mod config_sources;
mod file_seen;
mod overlay;
mod poll_period;
mod resubscribe;
mod source_reads;
mod store_calls;
mod watched_refs;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::handle::LiveGeneration;
use crate::reload::queue::{QueueSender, Queued};
use crate::reload::{ReloadRequest, Trigger};
use crate::running::WatchPlan;

pub(crate) use config_file::watch_config_file;
pub(crate) use config_sources::watch_config_sources;
pub(crate) use overlay::{read_overlay, OverlayTried};
pub(crate) use source_reads::SourceReads;
pub(crate) use watched_refs::spawn_watched_refs;

/// What a trigger is given.
#[derive(Clone)]
pub(crate) struct TriggerContext {
    /// Where to send reload requests and rejections.
    pub(crate) queue: QueueSender,
    /// What to watch, republished after every commit.
    pub(crate) plan: watch::Receiver<Arc<WatchPlan>>,
    /// Cancelled at shutdown.
    pub(crate) stopped: CancellationToken,
    /// The published generation, to reach the stores being watched.
    pub(crate) live: LiveGeneration,
    /// How often watched secretRefs are polled (and configurationRefs
    /// whose store refuses to subscribe).
    pub(crate) secret_poll_interval: Duration,
    /// The overlay documents last sent (one per runtime).
    pub(crate) overlay_tried: Arc<OverlayTried>,
    /// Whether a configuration is the base (file) layer in force.
    pub(crate) file_in_force: FileInForce,
    /// Where the configuration sources' watches leave their reads, for a
    /// control-plane change to run first (one per runtime).
    pub(crate) source_reads: Arc<SourceReads>,
}

/// Tells whether a configuration read from the file is the base layer the
/// runtime runs with (false once the runtime is gone).
pub(crate) type FileInForce = Arc<dyn Fn(&Config) -> bool + Send + Sync>;

impl TriggerContext {
    /// Sends a reload request.
    pub(crate) fn request(&self, request: ReloadRequest) {
        self.send(Queued::Reload(request));
    }

    /// Sends a change that could not be parsed, to be recorded as rejected.
    pub(crate) fn reject(&self, trigger: Trigger, error: String) {
        self.send(Queued::Rejected { trigger, error });
    }

    fn send(&self, queued: Queued) {
        if self.queue.send(queued).is_err() {
            tracing::debug!("Reload queue closed; change dropped at shutdown.");
        }
    }
}

#[cfg(test)]
impl TriggerContext {
    /// A context for a trigger's tests: generation 1 of `app_id` (no
    /// overlay, no refs; the plan never changes) on `live`, and the queue
    /// it sends to.
    pub(crate) fn for_tests(
        live: LiveGeneration,
        app_id: &str,
    ) -> (Self, crate::reload::queue::QueueReceiver) {
        let (queue, queued) = crate::reload::queue::queue();
        let plan = WatchPlan {
            generation: 1,
            app_id: app_id.into(),
            overlay: None,
            overlay_in_force: (None, None),
            refs: Vec::new(),
        };
        // The sender is dropped: the plan stays as it is.
        let (_, plan) = watch::channel(Arc::new(plan));
        let cx = Self {
            queue,
            plan,
            stopped: CancellationToken::new(),
            live,
            secret_poll_interval: Duration::from_secs(60),
            overlay_tried: Arc::default(),
            file_in_force: Arc::new(|_| false),
            source_reads: Arc::default(),
        };
        (cx, queued)
    }
}
