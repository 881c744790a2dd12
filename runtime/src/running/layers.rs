//! The layers the running configuration was laid from, kept without a
//! second copy of the file while nothing is laid over it, and the
//! runtime's memory of the overlay components skipped.

use std::sync::Arc;

use crate::config::{Config, ConfigPatch, LayerChange, Layers, Problem, SkippedOverlay};

/// The running configuration's layers. While only the file is there, the
/// file is the effective configuration itself, so it is not kept twice
/// (a reload of a large file then copies nothing).
///
/// Either way they hold the runtime's one [`SkippedOverlay`], handed to
/// every layers made from them: a skip warned about while laying a
/// candidate over the file alone (rejected or rolled back, the file alone
/// still running) is not warned about again when the candidate is tried
/// again.
#[derive(Debug, Clone)]
pub(crate) enum RunningLayers {
    /// Only the file: it is the running configuration.
    FileOnly(SkippedOverlay),
    /// The file with an overlay or pushes laid over it.
    Laid(Arc<Layers>),
}

impl RunningLayers {
    /// The layers of a runtime that starts: the file alone, nothing
    /// skipped yet.
    pub(crate) fn started() -> Self {
        Self::FileOnly(SkippedOverlay::default())
    }

    /// The effective configuration of `layers`, and what to keep of them
    /// beside it: the file is moved, not copied, when nothing is laid
    /// over it.
    pub(crate) fn lay(layers: Layers) -> (Config, Self) {
        let bare =
            layers.overlay.is_none() && layers.overlay_app.is_none() && layers.pushes.is_empty();
        if bare {
            let skipped = layers.skipped.clone();
            return (layers.file, Self::FileOnly(skipped));
        }
        (layers.effective_config(), Self::Laid(Arc::new(layers)))
    }

    /// The layers whole; `effective` is the configuration they were laid
    /// into.
    pub(crate) fn whole(&self, effective: &Config) -> Layers {
        match self {
            Self::FileOnly(skipped) => Layers::sharing_skips(effective.clone(), skipped),
            Self::Laid(layers) => Layers::clone(layers),
        }
    }

    /// A copy with `change` laid over it; `effective` as for
    /// [`Self::whole`]. A new file replaces the old one uncopied.
    pub(crate) fn changed(
        &self,
        effective: &Config,
        change: LayerChange,
    ) -> Result<Layers, Problem> {
        match (self, change) {
            (Self::FileOnly(skipped), LayerChange::File(file)) => {
                Ok(Layers::sharing_skips(file, skipped))
            }
            (Self::FileOnly(skipped), change) => {
                let mut layers = Layers::sharing_skips(effective.clone(), skipped);
                layers.apply(change)?;
                Ok(layers)
            }
            (Self::Laid(layers), change) => layers.changed(change),
        }
    }

    /// The overlay's common and app-specific documents in force.
    pub(crate) fn overlays(&self) -> (Option<ConfigPatch>, Option<ConfigPatch>) {
        match self {
            Self::FileOnly(_) => (None, None),
            Self::Laid(layers) => (layers.overlay.clone(), layers.overlay_app.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::component::ComponentKey;
    use crate::config::{parse, parse_patch, Push};

    fn file(text: &str) -> Config {
        parse(text.as_bytes()).unwrap_or_else(|p| panic!("{p}"))
    }

    #[test]
    fn a_bare_file_is_kept_once_and_given_back_whole() {
        let config = file(r#"{"components": {"state": {"a": {"type": "memory"}}}}"#);
        let (effective, kept) = RunningLayers::lay(Layers::new(config.clone()));
        assert!(matches!(kept, RunningLayers::FileOnly(_)));
        assert_eq!(effective, config);
        assert_eq!(kept.whole(&effective), Layers::new(config.clone()));
        let next = file(r#"{"components": {"state": {"b": {"type": "memory"}}}}"#);
        let changed = kept
            .changed(&effective, LayerChange::File(next.clone()))
            .unwrap_or_else(|p| panic!("{p}"));
        assert_eq!(changed, Layers::new(next));
    }

    /// An overlay amending `state/orders`, which the file does not
    /// declare: the candidate laid over the file alone skips it, and is
    /// rejected (the file alone still runs); tried again, from the same
    /// running layers or after a commit of the file alone, the same skip
    /// is not warned about again.
    #[test]
    fn a_skip_warned_about_over_the_file_alone_is_not_warned_about_again() {
        let config = file(
            r#"{"components": {"state": {"a": {"type": "memory"}}},
                "overlay": {"store": "cfg", "key": "rewire.components"}}"#,
        );
        let overlay = || {
            let text =
                br#"{"components": {"state": {"orders": {"metadata": {"redisHost": "dr:6379"}}}}}"#;
            let patch = parse_patch(text).unwrap_or_else(|p| panic!("{p}"));
            LayerChange::Overlay {
                common: Some(patch),
                read: None,
            }
        };
        let (effective, running) = RunningLayers::lay(RunningLayers::started().whole(&config));
        assert!(matches!(running, RunningLayers::FileOnly(_)));
        let warned = |candidate: Layers| candidate.skips_warned();
        let first = running.changed(&effective, overlay()).unwrap();
        assert_eq!(warned(first), vec![ComponentKey::new("state", "orders")]);
        let again = running.changed(&effective, overlay()).unwrap();
        assert_eq!(warned(again), Vec::new(), "tried again: warned again");
        let mut whole = running.whole(&effective);
        whole.apply(overlay()).unwrap();
        assert_eq!(warned(whole), Vec::new(), "laid over the whole layers");

        // The file alone committed again (a file reload): still the
        // runtime's memory.
        let reloaded = running
            .changed(&effective, LayerChange::File(config.clone()))
            .unwrap();
        let (effective, running) = RunningLayers::lay(reloaded);
        assert!(matches!(running, RunningLayers::FileOnly(_)));
        let after = running.changed(&effective, overlay()).unwrap();
        assert_eq!(warned(after), Vec::new(), "warned again after a commit");
    }

    #[test]
    fn pushes_keep_the_layers_and_lay_over_the_file() {
        let config = file(
            r#"{"components": {"state": {"a": {"type": "memory"}, "b": {"type": "memory"}}}}"#,
        );
        let (effective, kept) = RunningLayers::lay(Layers::new(config));
        let removed = ComponentKey::new("state", "b");
        let pushed = kept
            .changed(&effective, LayerChange::Push(removed.clone(), Push::Remove))
            .unwrap_or_else(|p| panic!("{p}"));
        let (laid, kept) = RunningLayers::lay(pushed.clone());
        assert!(matches!(kept, RunningLayers::Laid(_)));
        assert!(!laid.components.contains_key(&removed));
        assert_eq!(kept.whole(&laid), pushed, "the file under the push is kept");
    }
}
