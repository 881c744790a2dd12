//! Where the base configuration comes from: a rewire JSON file
//! (`--config`), a folder of Dapr component manifests
//! (`--resources-path`), or both — their components together, a component
//! declared in both being an error — and the app id (`--app-id`, else the
//! file's `appId`).

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;

use super::load::dapr_manifest::{
    parse_manifests, read_manifest_texts, ManifestTexts, Manifests, ResiliencyResource,
    DEFAULT_SECRET_STORE,
};
use super::load::{folder_of, parse_patch_collecting, read_config_bytes};
use super::model::Config;
use super::validate::{validate_declared, ValidConfig};
use crate::component::{ComponentKey, Kind};
use crate::problem::{Problem, Problems};
use crate::registry::Registry;
use crate::sections::Resiliency;

/// The sources of the base configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConfigSources {
    /// A rewire JSON configuration file.
    pub file: Option<PathBuf>,
    /// A folder of Dapr resource files (`*.yaml`, `*.yml`).
    pub resources: Option<PathBuf>,
    /// The app id; must agree with the file's `appId` if both are given.
    /// Manifests with `scopes` are loaded only by the apps they list.
    pub app_id: Option<String>,
}

/// What the sources held when read: compared to tell whether anything
/// changed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub(crate) struct SourceTexts {
    file: Option<Vec<u8>>,
    manifests: ManifestTexts,
}

/// A configuration put together from the sources, before validation.
struct Assembled {
    config: Config,
    manifests: Manifests,
    problems: Problems,
}

impl ConfigSources {
    /// Reads, parses and validates every source, reporting every problem
    /// in one pass; a problem in a manifest names its file and line.
    pub fn load(&self, registry: &Registry) -> Result<ValidConfig, Problems> {
        let Assembled {
            config,
            manifests,
            mut problems,
        } = self.assemble(&self.read()?, registry)?;
        let broken: BTreeSet<ComponentKey> = problems
            .iter()
            .filter_map(|p| p.component.clone())
            .collect();
        match validate_declared(config, registry, &broken) {
            Ok(valid) if problems.is_empty() => Ok(valid),
            Ok(_) => Err(problems),
            Err(more) => {
                problems
                    .0
                    .extend(more.0.into_iter().map(|p| manifests.locate(p)));
                Err(problems)
            }
        }
    }

    /// Reads every source, bounded (see [`MAX_CONFIG_BYTES`](super::MAX_CONFIG_BYTES)
    /// and [`MAX_MANIFEST_BYTES`](super::MAX_MANIFEST_BYTES)).
    pub(crate) fn read(&self) -> Result<SourceTexts, Problems> {
        let file = self.file.as_deref().map(read_config_bytes).transpose()?;
        let manifests = match &self.resources {
            Some(dir) => read_manifest_texts(dir)?,
            None => ManifestTexts::default(),
        };
        Ok(SourceTexts { file, manifests })
    }

    /// The configuration `texts` declare (to be validated by the reload).
    pub(crate) fn parse(
        &self,
        texts: &SourceTexts,
        registry: &Registry,
    ) -> Result<Config, Problems> {
        let assembled = self.assemble(texts, registry)?;
        assembled.problems.into_result(assembled.config)
    }

    fn assemble(&self, texts: &SourceTexts, registry: &Registry) -> Result<Assembled, Problems> {
        let (patch, mut problems) = match &texts.file {
            Some(bytes) => parse_patch_collecting(bytes)?,
            None => Default::default(),
        };
        if self.file.is_some() && self.resources.is_none() && !patch.has_components {
            problems.push(Problem::file(
                "missing `components` (an object of kind -> name -> component)",
            ));
        }
        let app_id = match (&self.app_id, &patch.app_id) {
            (Some(given), Some(in_file)) if given != in_file => {
                problems.push(Problem::file(format!(
                    "--app-id ({given}) and the file's `appId` ({in_file}) disagree"
                )));
                given.clone()
            }
            (Some(id), _) | (None, Some(id)) => id.clone(),
            (None, None) => String::new(),
        };
        let mut config = patch.into_config();
        config.app_id = app_id;
        config.base_dir = self.file.as_deref().and_then(folder_of);
        let (manifests, found) = parse_manifests(&texts.manifests, &config.app_id, registry);
        for note in &found.notes {
            tracing::info!(note = %note, "Dapr resource file note.");
        }
        problems.0.extend(found.problems.0);
        for (key, spec) in &manifests.components {
            if config.components.contains_key(key) {
                let shown = self
                    .file
                    .as_deref()
                    .map(|f| f.display().to_string())
                    .unwrap_or_default();
                problems.push(manifests.locate(Problem::component(
                    key,
                    format!(
                        "declared both in {shown} and in a Dapr resource file (declare it once)"
                    ),
                )));
            } else {
                config
                    .components
                    .insert(key.clone(), Arc::new(spec.clone()));
            }
        }
        for (name, (location, subscription)) in &manifests.subscriptions {
            if config.sections.subscriptions.0.contains_key(name) {
                problems.push(Problem::file(format!(
                    "subscriptions.{name}: declared both in the configuration file and in a Dapr resource file (declare it once)"
                )).at(location.clone()));
            } else {
                config
                    .sections
                    .subscriptions
                    .0
                    .insert(name.clone(), subscription.clone());
            }
        }
        for resource in &manifests.resiliency {
            resiliency_resource(&mut config, resource, &mut problems);
        }
        if let Some((location, scopes)) = &manifests.secrets {
            // One scope per store, whichever source gives it. A scope of a
            // store this app does not load stays (a store added later by a
            // push or an overlay is held to it) and is no problem.
            let twice = config.sections.secrets.merge(scopes.clone(), location);
            problems.0.extend(twice);
        }
        let default_store = ComponentKey::new(Kind::SecretStore, DEFAULT_SECRET_STORE);
        if !config.components.contains_key(&default_store) {
            for (key, origin) in &manifests.origins {
                let Some(line) = origin.defaulted_store else {
                    continue;
                };
                let file = origin
                    .location
                    .rsplit_once(':')
                    .map_or(origin.location.as_str(), |(f, _)| f);
                problems.push(Problem::component(key, format!(
                    "a secretKeyRef without `auth.secretStore` reads Dapr's default secret store `{DEFAULT_SECRET_STORE}`, which is not declared (add `auth: {{secretStore: NAME}}`)"
                )).at(format!("{file}:{line}")));
            }
        }
        Ok(Assembled {
            config,
            manifests,
            problems,
        })
    }
}

/// Takes a `Resiliency` resource's spec as the configuration's `resiliency`
/// section: one section in all (the file's or one resource).
fn resiliency_resource(
    config: &mut Config,
    resource: &ResiliencyResource,
    problems: &mut Problems,
) {
    if !config.sections.resiliency.is_empty() {
        problems.push(
            Problem::file(
                "resiliency: declared twice (in the configuration file and a Resiliency resource, \
                 or in two resources): declare it once",
            )
            .at(resource.location.clone()),
        );
        return;
    }
    match Resiliency::decode(&resource.spec) {
        Ok(section) => config.sections.resiliency = section,
        Err(found) => problems
            .0
            .extend(found.into_iter().map(|p| p.at(resource.location.clone()))),
    }
}
