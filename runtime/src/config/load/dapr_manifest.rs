//! Dapr resource files (`--resources-path DIR`): the `kind: Component`
//! manifests of a folder's `*.yaml` / `*.yml` files (several documents per
//! file allowed), turned into rewire components, the `kind: Subscription`
//! ones, turned into entries of the `subscriptions` section, and `kind:
//! Resiliency` resources (the configuration's `resiliency` section), and
//! the secret scopes of a `kind: Configuration` (its `secrets` section; the
//! rest of a Configuration is skipped with a note). Other resource kinds
//! are skipped with a note; every problem names its file and line.

mod component;
mod configuration;
mod resiliency;
mod spec_metadata;
mod subscription;
mod types;
mod yaml;

use std::collections::BTreeMap;
use std::path::Path;

use crate::component::ComponentKey;
use crate::config::model::ComponentSpec;
use crate::fs_read::{note_progress, read_bounded, FileReadError};
use crate::problem::{Problem, Problems};
use crate::registry::Registry;
use crate::sections::{SecretScopes, Subscription};
use component::map_component;
pub(crate) use component::DEFAULT_SECRET_STORE;
use configuration::map_configuration;
use resiliency::map_resiliency;
pub(crate) use resiliency::ResiliencyResource;
use yaml::{documents, NodeValue};

/// Largest manifest file accepted, in bytes.
pub const MAX_MANIFEST_BYTES: usize = 1024 * 1024;
/// Most manifest files read from one folder.
pub const MAX_MANIFEST_FILES: usize = 1000;

/// The manifest files of a folder as read: name as shown, content.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub(crate) struct ManifestTexts(pub Vec<(String, Vec<u8>)>);

/// Where a manifest's component was declared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Origin {
    /// `file:line` of its document.
    pub location: String,
    /// The line of each `spec.metadata` entry, by name.
    pub fields: BTreeMap<String, usize>,
    /// The line of a secretKeyRef read from Dapr's default store (no
    /// `auth.secretStore`), if any.
    pub defaulted_store: Option<usize>,
}

/// The components the manifests declare, and where.
#[derive(Debug, Clone, Default)]
pub(crate) struct Manifests {
    pub components: BTreeMap<ComponentKey, ComponentSpec>,
    pub origins: BTreeMap<ComponentKey, Origin>,
    /// Declared subscriptions by name, with the `file:line` of each.
    pub subscriptions: BTreeMap<String, (String, Subscription)>,
    /// The `Resiliency` resources the app loads.
    pub resiliency: Vec<ResiliencyResource>,
    /// The secret scopes of the Configuration giving some, with the
    /// `file:line` of its document.
    pub secrets: Option<(String, SecretScopes)>,
}

/// Problems (which refuse the folder) and notes (what was skipped or
/// ignored, logged) found while reading manifests.
#[derive(Debug, Clone, Default)]
pub(crate) struct Found {
    pub problems: Problems,
    pub notes: Vec<String>,
}

impl Found {
    fn problem_at(
        &mut self,
        location: String,
        key: Option<&ComponentKey>,
        message: impl Into<String>,
    ) {
        let problem = match key {
            Some(key) => Problem::component(key, message),
            None => Problem::file(message),
        };
        self.problems.push(problem.at(location));
    }

    fn note(&mut self, note: String) {
        self.notes.push(note);
    }
}

/// Reads the `*.yaml` / `*.yml` files of `dir` (not its subfolders nor
/// hidden entries such as Kubernetes' `..data`), in name order, each
/// bounded by [`MAX_MANIFEST_BYTES`]. Each entry looked at and each file
/// read is noted as progress ([`note_progress`]).
pub(crate) fn read_manifest_texts(dir: &Path) -> Result<ManifestTexts, Problems> {
    let refuse = |message: String| Problems(vec![Problem::file(message)]);
    let entries = std::fs::read_dir(dir).map_err(|err| {
        refuse(format!(
            "cannot read resources folder {}: {err}",
            dir.display()
        ))
    })?;
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|err| {
            refuse(format!(
                "cannot read resources folder {}: {err}",
                dir.display()
            ))
        })?;
        // The lossy name is for matching and order only: the file is read
        // by its real name (a name that is not UTF-8 would not be found).
        let name = entry.file_name().to_string_lossy().into_owned();
        let yaml = name.ends_with(".yaml") || name.ends_with(".yml");
        // Symlinks followed: a ConfigMap's entries are links into `..data`.
        if yaml
            && !name.starts_with('.')
            && !std::fs::metadata(entry.path()).is_ok_and(|m| m.is_dir())
        {
            names.push((name, entry.path()));
        }
        // Each entry may cost a `stat` (a slow mount): a read bounded
        // per step sees the listing move on.
        note_progress();
    }
    names.sort();
    if names.len() > MAX_MANIFEST_FILES {
        return Err(refuse(format!(
            "resources folder {} has {} YAML files, more than the {MAX_MANIFEST_FILES} accepted",
            dir.display(),
            names.len()
        )));
    }
    let mut texts = Vec::new();
    let mut problems = Problems::default();
    for (_, path) in names {
        let shown = path.display().to_string();
        match read_bounded(&path, MAX_MANIFEST_BYTES) {
            Ok(bytes) => texts.push((shown, bytes)),
            // Removed between the listing and the read: it is gone.
            Err(FileReadError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound => {}
            Err(err) => problems.push(Problem::file(err.to_string())),
        }
    }
    problems.into_result(ManifestTexts(texts))
}

/// The components of `texts` that `app_id` loads (a manifest with `scopes`
/// is loaded only by the apps it lists, as in Dapr), with every problem
/// and note. A file holding no resource (empty, comments only) is a
/// problem, not a file declaring nothing: it is most likely being written.
pub(crate) fn parse_manifests(
    texts: &ManifestTexts,
    app_id: &str,
    registry: &Registry,
) -> (Manifests, Found) {
    let mut found = Found::default();
    let mut manifests = Manifests::default();
    for (file, bytes) in &texts.0 {
        let Ok(text) = std::str::from_utf8(bytes) else {
            found.problem_at(file.clone(), None, "not valid UTF-8");
            continue;
        };
        let docs = match documents(text) {
            Ok(docs) => docs,
            Err(err) => {
                found.problem_at(format!("{file}:{}", err.line), None, err.message);
                continue;
            }
        };
        if docs.is_empty() {
            // Most likely caught mid-write (`sops -d x > file` truncates,
            // then waits on its KMS): read as declaring nothing, a reload
            // would remove the file's components and lose their data.
            found.problem_at(
                file.clone(),
                None,
                "holds no resource; delete it to remove its components",
            );
            continue;
        }
        for doc in docs {
            let NodeValue::Map(entries) = &doc.value else {
                found.problem_at(
                    format!("{file}:{}", doc.line),
                    None,
                    format!(
                        "expected a Dapr resource (a mapping), found {}",
                        doc.shape()
                    ),
                );
                continue;
            };
            let kind = entries
                .iter()
                .find(|e| e.key == "kind")
                .and_then(|e| e.value.as_text());
            match kind.as_deref() {
                Some("Component") => {}
                Some("Subscription") => {
                    let location = format!("{file}:{}", doc.line);
                    let Some((name, mapped)) =
                        subscription::map_subscription(entries, file, doc.line, &mut found)
                    else {
                        continue;
                    };
                    if let Some((first, _)) = manifests.subscriptions.get(&name) {
                        let message =
                            format!("subscriptions.{name}: declared twice (also at {first})");
                        found.problem_at(location, None, message);
                    } else {
                        manifests.subscriptions.insert(name, (location, mapped));
                    }
                    continue;
                }
                Some("Resiliency") => {
                    let location = format!("{file}:{}", doc.line);
                    match map_resiliency(entries, location, app_id) {
                        Ok(resource) => manifests.resiliency.push(resource),
                        Err(note) => found.note(note),
                    }
                    continue;
                }
                Some("Configuration") => {
                    let location = format!("{file}:{}", doc.line);
                    map_configuration(entries, location, &mut manifests, &mut found);
                    continue;
                }
                Some(other) => {
                    found.note(format!(
                        "{file}:{}: skipped a `{other}` (rewire loads `Component`s, `Subscription`s, `Resiliency` and a `Configuration`'s secret scopes)",
                        doc.line
                    ));
                    continue;
                }
                None => {
                    found.problem_at(
                        format!("{file}:{}", doc.line),
                        None,
                        "not a Dapr resource: no `kind`",
                    );
                    continue;
                }
            }
            let Some(mapped) = map_component(entries, file, doc.line, registry, &mut found) else {
                continue;
            };
            let key = mapped.spec.key.clone();
            if let Some(scopes) = &mapped.app_scopes {
                if app_id.is_empty() {
                    found.problem_at(mapped.origin.location.clone(), Some(&key), format!("`scopes` lists app ids ({}) but no app id is set (give --app-id, or `appId` in --config)", scopes.join(", ")));
                    continue;
                }
                if !scopes.iter().any(|s| s == app_id) {
                    found.note(format!(
                        "{}: {key}: not loaded: its scopes ({}) do not include app id `{app_id}`",
                        mapped.origin.location,
                        scopes.join(", ")
                    ));
                    continue;
                }
            }
            if let Some(first) = manifests.origins.get(&key) {
                let message = format!("declared twice (also at {})", first.location);
                found.problem_at(mapped.origin.location.clone(), Some(&key), message);
                continue;
            }
            manifests.origins.insert(key.clone(), mapped.origin);
            manifests.components.insert(key, mapped.spec);
        }
    }
    (manifests, found)
}

impl Manifests {
    /// Gives `problem` the location of its component's manifest (the line
    /// of the metadata field it quotes, else of the document), if it came
    /// from one and has none yet.
    pub(crate) fn locate(&self, mut problem: Problem) -> Problem {
        let origin = problem
            .component
            .as_ref()
            .and_then(|key| self.origins.get(key));
        if let (Some(origin), None) = (origin, &problem.location) {
            let quoted = problem.message.split('`').skip(1).step_by(2);
            let field_line = quoted.into_iter().find_map(|q| origin.fields.get(q));
            let location = match (field_line, origin.location.rsplit_once(':')) {
                (Some(line), Some((file, _))) => format!("{file}:{line}"),
                _ => origin.location.clone(),
            };
            problem.location = Some(location);
        }
        problem
    }
}

#[cfg(test)]
mod tests;
