//! What a component author implements: the [`Component`] lifecycle, the
//! in-place update hook, and the identity of a declared component.

mod handover;
mod in_place;
mod key;
mod kind;

pub(crate) use handover::LeftMark;
pub use handover::{Handover, RuntimeId};
pub use in_place::{InPlace, InPlaceUpdate, PendingInPlace, StagedInPlace};
pub use key::ComponentKey;
pub(crate) use key::{KeyParts, KeyRef};
pub use kind::Kind;

use std::any::Any;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use crate::metadata::{Metadata, MetadataError};

/// Error a component reports from its lifecycle hooks or its operations.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct ComponentError {
    /// What went wrong, in the component's words (never a secret value).
    pub message: String,
}

impl ComponentError {
    /// An error with the given message.
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
        }
    }
}

impl From<MetadataError> for ComponentError {
    fn from(err: MetadataError) -> Self {
        ComponentError::new(err.to_string())
    }
}

/// Whether a component can serve requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readiness {
    /// Serving.
    Ready,
    /// Serving, but impaired (e.g. from a backup cache while its backend is
    /// unreachable): counts as ready for start-up and health, and the reason
    /// is shown in the status.
    Degraded(String),
    /// Not serving yet (or any more), with the reason.
    NotReady(String),
}

/// What a component receives when it is initialised. Its `Debug` shows no
/// secret (see [`Metadata`]).
///
/// Not built field by field outside this crate (fields may be added):
/// [`InitContext::new`], then set the fields that matter.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct InitContext {
    /// The component being initialised.
    pub key: ComponentKey,
    /// The application id from the configuration file.
    pub app_id: String,
    /// Resolved metadata: the declared metadata with secretRef and
    /// configurationRef values filled in.
    pub metadata: Metadata,
    /// Cancelled when the component is being closed or its start abandoned;
    /// background tasks the component spawns should stop on it.
    pub shutdown: CancellationToken,
    /// How long the runtime waits for the component to become ready.
    pub ready_timeout: Duration,
    /// The folder of the configuration file, where relative paths in
    /// metadata resolve (`None`: the working directory).
    pub config_dir: Option<PathBuf>,
    /// The runtime's handover area, the same across its reloads and its
    /// own: where an instance leaves a value for the instance a reload
    /// builds after it (see [`InitContext::leave_for_successor`]).
    pub handover: Handover,
}

impl InitContext {
    /// The context of component `key` of app `app_id` with `metadata`, as
    /// a runtime of its own would give it: a new shutdown token, the
    /// default readiness timeout (10 s), no configuration folder and a new
    /// [`Handover`] area. Set the other fields as needed (e.g. one
    /// `handover` for contexts that stand for one runtime).
    pub fn new(key: ComponentKey, app_id: impl Into<String>, metadata: Metadata) -> Self {
        Self {
            key,
            app_id: app_id.into(),
            metadata,
            shutdown: CancellationToken::new(),
            ready_timeout: Duration::from_secs(10),
            config_dir: None,
            handover: Handover::new(),
        }
    }

    /// Leaves `value` for the instances of this component (same
    /// `kind/name`) that this runtime builds later, while it lives (e.g.
    /// the connection a rebuilt successor should still consult); see
    /// [`Handover`].
    pub fn leave_for_successor<T: Any + Send + Sync>(&self, value: &Arc<T>) {
        self.handover.leave(&self.key, value);
    }

    /// What the live earlier instances of this component in this runtime
    /// left (of type `T`), newest first: empty at a first start, and never
    /// anything of another runtime, even of the same app and name.
    pub fn left_by_predecessors<T: Any + Send + Sync>(&self) -> Vec<Arc<T>> {
        self.handover.left_for(&self.key)
    }

    /// `path` from this component's metadata as the file it names: an
    /// absolute path as is; a relative one against the configuration
    /// file's folder (else the working directory), so that a configuration
    /// means the same files wherever the process was started, and errors
    /// name the full path.
    pub fn resolve_path(&self, path: impl AsRef<Path>) -> PathBuf {
        let path = path.as_ref();
        if path.is_absolute() {
            return path.to_path_buf();
        }
        match &self.config_dir {
            Some(dir) => dir.join(path),
            None => std::env::current_dir()
                .map(|cwd| cwd.join(path))
                .unwrap_or_else(|_| path.to_path_buf()),
        }
    }
}

/// The lifecycle of a component. Every hook has a default, so a component
/// with nothing to do at start writes `impl Component for MyThing {}`.
///
/// A component with background work starts it in `init`, stops it on the
/// shutdown token, and says whether it can serve:
///
/// ```
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use std::sync::Arc;
/// use std::time::Duration;
///
/// use rewire_runtime::prelude::*;
///
/// /// Counts seconds in the background.
/// #[derive(Default)]
/// struct Clock {
///     ticks: Arc<AtomicU64>,
/// }
///
/// #[async_trait]
/// impl Component for Clock {
///     async fn init(&mut self, cx: &InitContext) -> Result<(), ComponentError> {
///         let (ticks, shutdown) = (Arc::clone(&self.ticks), cx.shutdown.clone());
///         tokio::spawn(async move {
///             loop {
///                 tokio::select! {
///                     () = shutdown.cancelled() => return,
///                     () = tokio::time::sleep(Duration::from_secs(1)) => {
///                         ticks.fetch_add(1, Ordering::Relaxed);
///                     }
///                 }
///             }
///         });
///         Ok(())
///     }
///
///     async fn readiness(&self) -> Readiness {
///         Readiness::Ready
///     }
/// }
/// ```
///
/// Components are reached through handles (see [`ComponentHandle`](crate::ComponentHandle)), never
/// held directly, so the runtime can swap instances during a reload.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a component",
    label = "needs `impl Component for {Self}`",
    note = "add `#[async_trait] impl Component for {Self}` with an empty body: every lifecycle hook has a default"
)]
#[async_trait]
pub trait Component: Any + Send + Sync {
    /// Called once, after injection, before the component serves anything.
    async fn init(&mut self, cx: &InitContext) -> Result<(), ComponentError> {
        let _ = cx;
        Ok(())
    }

    /// Polled after `init` until it answers [`Readiness::Ready`] or the
    /// readiness timeout passes; asked again by `/v1.0/healthz` and the
    /// status, which wait 1 s for it (an answer later than that counts as
    /// not ready): bound a check of a backend below that (the built-in
    /// stores give theirs 800 ms) and answer [`Readiness::Degraded`] when
    /// it serves without the backend.
    async fn readiness(&self) -> Readiness {
        Readiness::Ready
    }

    /// Called once when the instance is retired (shutdown, removal, or
    /// replacement by a reload), after its last in-flight user let go; also
    /// after an `init` that failed or timed out, so that what it took is
    /// released.
    async fn close(&self) -> Result<(), ComponentError> {
        Ok(())
    }

    /// The in-place update hook, for components that implement
    /// [`InPlaceUpdate`]: return `Some(self)`.
    fn as_in_place(&self) -> Option<&dyn InPlaceUpdate> {
        None
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn init_context_debug_shows_no_secret() {
        let declared = json!({"redisPassword": "hunter2", "keyPrefix": "app||"});
        let mut metadata = Metadata::from(declared.as_object().cloned().unwrap_or_default());
        metadata.insert_secret("injectedAnyName", json!("from-the-vault"));
        let cx = InitContext::new(ComponentKey::new("state", "cache"), "app", metadata);
        let shown = format!("{cx:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(!shown.contains("from-the-vault"), "{shown}");
        assert!(shown.contains("app||"), "{shown}");
    }
}
