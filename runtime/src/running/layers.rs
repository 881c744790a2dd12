//! The layers the running configuration was laid from, kept without a
//! second copy of the file while nothing is laid over it.

use std::sync::Arc;

use crate::config::{Config, ConfigPatch, LayerChange, Layers, Problem};

/// The running configuration's layers. While only the file is there, the
/// file is the effective configuration itself, so it is not kept twice
/// (a reload of a large file then copies nothing).
#[derive(Debug, Clone)]
pub(crate) enum RunningLayers {
    /// Only the file: it is the running configuration.
    FileOnly,
    /// The file with an overlay or pushes laid over it.
    Laid(Arc<Layers>),
}

impl RunningLayers {
    /// The effective configuration of `layers`, and what to keep of them
    /// beside it: the file is moved, not copied, when nothing is laid
    /// over it.
    pub(crate) fn lay(layers: Layers) -> (Config, Self) {
        let bare =
            layers.overlay.is_none() && layers.overlay_app.is_none() && layers.pushes.is_empty();
        if bare {
            return (layers.file, Self::FileOnly);
        }
        (layers.effective_config(), Self::Laid(Arc::new(layers)))
    }

    /// The layers whole; `effective` is the configuration they were laid
    /// into.
    pub(crate) fn whole(&self, effective: &Config) -> Layers {
        match self {
            Self::FileOnly => Layers::new(effective.clone()),
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
            (Self::FileOnly, LayerChange::File(file)) => Ok(Layers::new(file)),
            (Self::FileOnly, change) => {
                let mut layers = Layers::new(effective.clone());
                layers.apply(change)?;
                Ok(layers)
            }
            (Self::Laid(layers), change) => layers.changed(change),
        }
    }

    /// The overlay's common and app-specific documents in force.
    pub(crate) fn overlays(&self) -> (Option<ConfigPatch>, Option<ConfigPatch>) {
        match self {
            Self::FileOnly => (None, None),
            Self::Laid(layers) => (layers.overlay.clone(), layers.overlay_app.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::component::ComponentKey;
    use crate::config::{parse, Push};

    fn file(text: &str) -> Config {
        parse(text.as_bytes()).unwrap_or_else(|p| panic!("{p}"))
    }

    #[test]
    fn a_bare_file_is_kept_once_and_given_back_whole() {
        let config = file(r#"{"components": {"state": {"a": {"type": "memory"}}}}"#);
        let (effective, kept) = RunningLayers::lay(Layers::new(config.clone()));
        assert!(matches!(kept, RunningLayers::FileOnly));
        assert_eq!(effective, config);
        assert_eq!(kept.whole(&effective), Layers::new(config.clone()));
        let next = file(r#"{"components": {"state": {"b": {"type": "memory"}}}}"#);
        let changed = kept
            .changed(&effective, LayerChange::File(next.clone()))
            .unwrap_or_else(|p| panic!("{p}"));
        assert_eq!(changed, Layers::new(next));
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
