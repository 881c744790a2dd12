//! The `local.file` secret store: secrets read from a JSON file, as in
//! Dapr's local file secret store — and kept current: the file is watched
//! (rename-writes and Kubernetes secret-volume `..data` swaps included), so a
//! rotated secret is served without a restart, and `watch: true` secretRefs
//! re-apply their components. A file that turns invalid keeps the last good
//! secrets.
//!
//! Nested objects are flattened with `nestedSeparator` (default `:`). By
//! default every leaf is its own secret (`get_secret("db:password")` →
//! `{"db:password": …}`); with `multiValued` every top-level key is a secret
//! holding the flattened keys below it. Errors name the file, and for bad
//! JSON the line and column, never a value. The file is read bounded (see
//! [`crate::component_file`]: regular files only, at most 16 MiB, 5 s,
//! and every read through the store's one [`ComponentFile`], so a hung
//! mount pins one read thread, not one per re-read), and flattened to at most 64 MiB of names and values (every leaf is named
//! by its whole path, so deep nesting with long keys multiplies them).

mod flatten;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use rewire_runtime::{FileWatch, OnChange};

use rewire_runtime::{
    echoed, Component, ComponentError, InitContext, SecretError, SecretMap, SecretStore,
};
use serde::Deserialize;
use serde_json::Value;
use tracing::{info, warn};

#[cfg(doc)]
use crate::component_file::MAX_COMPONENT_FILE_BYTES;
use crate::component_file::{ComponentFile, ComponentFileError};
use flatten::Secrets;

/// Metadata of the `local.file` secret store.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LocalFileSecretMetadata {
    /// The JSON file holding the secrets (`path` is accepted too).
    #[serde(alias = "path")]
    pub secrets_file: PathBuf,
    /// Joins the keys of nested objects into one name.
    #[serde(default = "default_separator")]
    pub nested_separator: String,
    /// Whether each top-level key is one secret with several keys.
    #[serde(default)]
    pub multi_valued: bool,
}

fn default_separator() -> String {
    ":".to_string()
}

impl LocalFileSecretMetadata {
    /// Metadata reading `secrets_file`, single-valued, separator `:`.
    pub fn new(secrets_file: impl Into<PathBuf>) -> Self {
        Self {
            secrets_file: secrets_file.into(),
            nested_separator: default_separator(),
            multi_valued: false,
        }
    }
}

/// Why the secrets file could not be loaded. Never carries file content.
#[derive(Debug, thiserror::Error)]
pub enum SecretsFileError {
    /// The file could not be read: missing, not a regular file (a FIFO, a
    /// device), larger than [`MAX_COMPONENT_FILE_BYTES`], or too slow.
    #[error("cannot read the secrets file: {0}")]
    Read(#[from] ComponentFileError),
    /// The file is not valid JSON.
    #[error("secrets file `{}` is not valid JSON ({problem} at line {line}, column {column})", .path.display())]
    Parse {
        /// The configured path.
        path: PathBuf,
        /// The kind of problem (syntax error, unexpected end of file).
        problem: &'static str,
        /// 1-based line of the problem.
        line: usize,
        /// 1-based column of the problem.
        column: usize,
    },
    /// The file is JSON but not an object.
    #[error("secrets file `{}` must hold a JSON object", .path.display())]
    NotAnObject {
        /// The configured path.
        path: PathBuf,
    },
    /// The file flattens to more names and values than a store holds.
    #[error(
        "secrets file `{}` flattens to more than {limit} bytes of secret names and values \
         (every leaf is named by its whole path: deep nesting with long keys multiplies them)",
        .path.display()
    )]
    TooLargeFlattened {
        /// The configured path.
        path: PathBuf,
        /// The bound, in bytes.
        limit: usize,
    },
    /// Two paths of the file flatten to one secret name (a key holding the
    /// separator beside the nested keys it spells): refused, as Dapr does,
    /// rather than keep whichever comes last.
    #[error(
        "secrets file `{}`: two entries flatten to the secret name `{name}` \
         (a key holding the nested separator beside nested keys that spell it)",
        .path.display()
    )]
    DuplicateName {
        /// The configured path.
        path: PathBuf,
        /// The name (never a value), escaped and cut for the message.
        name: String,
    },
}

/// `name` as an error quotes it: at most [`rewire_runtime::ECHO_LIMIT`]
/// characters, control characters escaped.
fn printable(name: &str) -> String {
    echoed(name).chars().flat_map(char::escape_debug).collect()
}

/// Reads `file`, the secrets file of `settings`, and flattens it.
async fn load(
    settings: &LocalFileSecretMetadata,
    file: &ComponentFile,
) -> Result<Secrets, SecretsFileError> {
    let path: &Path = &settings.secrets_file;
    let text = file.read().await?;
    // The serde_json message may quote the input, so only its category,
    // line and column are kept.
    let value: Value = serde_json::from_str(&text).map_err(|err| SecretsFileError::Parse {
        path: path.to_path_buf(),
        problem: match err.classify() {
            serde_json::error::Category::Eof => "unexpected end of file",
            _ => "syntax error",
        },
        line: err.line(),
        column: err.column(),
    })?;
    match value {
        Value::Object(root) => {
            flatten::secrets(&root, &settings.nested_separator, settings.multi_valued).map_err(
                |refused| match refused {
                    flatten::Unflattenable::TooLarge => SecretsFileError::TooLargeFlattened {
                        path: path.to_path_buf(),
                        limit: flatten::MAX_FLATTENED_BYTES,
                    },
                    flatten::Unflattenable::Duplicate(name) => SecretsFileError::DuplicateName {
                        path: path.to_path_buf(),
                        name: printable(&name),
                    },
                },
            )
        }
        _ => Err(SecretsFileError::NotAnObject {
            path: path.to_path_buf(),
        }),
    }
}

/// How often the secrets file is re-read even without a change event.
const RESYNC: Duration = Duration::from_secs(30);

/// Secrets from a local JSON file, as Dapr's `secretstores.local.file`,
/// re-read whenever the file changes.
#[derive(rewire_runtime::Component, Debug)]
#[component(
    kind = "secret_store",
    type = "local.file",
    example = r#"{"secretsFile": "secrets.json", "nestedSeparator": ":", "multiValued": false}"#
)]
pub struct LocalFileSecretStore {
    #[metadata]
    settings: LocalFileSecretMetadata,
    secrets: Arc<ArcSwap<Secrets>>,
    watch: Mutex<Option<FileWatch>>,
}

impl LocalFileSecretStore {
    /// A store for `settings`, not initialised (holding no secret) yet.
    pub fn new(settings: LocalFileSecretMetadata) -> Self {
        Self {
            settings,
            secrets: Arc::default(),
            watch: Mutex::default(),
        }
    }

    /// Names of the secrets loaded.
    pub fn names(&self) -> Vec<String> {
        self.secrets.load().keys().cloned().collect()
    }

    /// Re-reads the file when it changes; a bad file keeps the last good
    /// secrets (the warning names the file and the position, never a value).
    fn watch_file(&self, cx: &InitContext, file: Arc<ComponentFile>) -> FileWatch {
        let (settings, secrets, key) = (
            self.settings.clone(),
            Arc::clone(&self.secrets),
            cx.key.clone(),
        );
        let problem: Arc<Mutex<Option<String>>> = Arc::default();
        let on_change: OnChange = Arc::new(move || {
            let (settings, file, secrets, key, problem) = (
                settings.clone(),
                Arc::clone(&file),
                Arc::clone(&secrets),
                key.clone(),
                Arc::clone(&problem),
            );
            Box::pin(async move {
                reread(&settings, &file, &secrets, &key, &problem).await;
            })
        });
        FileWatch::start(
            self.settings.secrets_file.clone(),
            on_change,
            Some(RESYNC),
            cx.shutdown.child_token(),
        )
    }
}

#[rewire_runtime::prelude::async_trait]
impl Component for LocalFileSecretStore {
    async fn init(&mut self, cx: &InitContext) -> Result<(), ComponentError> {
        // A relative `secretsFile` is the configuration file's neighbour.
        self.settings.secrets_file = cx.resolve_path(&self.settings.secrets_file);
        // One reader for the store's every read (see `ComponentFile`).
        let file = Arc::new(ComponentFile::new(
            "secretsFile",
            &self.settings.secrets_file,
        ));
        let secrets = load(&self.settings, &file).await?;
        info!(
            component = %cx.key,
            path = %self.settings.secrets_file.display(),
            secrets = secrets.len(),
            "Secrets file loaded."
        );
        self.secrets.store(Arc::new(secrets));
        let watch = self.watch_file(cx, file);
        *self.watch.get_mut().unwrap_or_else(|p| p.into_inner()) = Some(watch);
        Ok(())
    }

    async fn close(&self) -> Result<(), ComponentError> {
        let watch = self.watch.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(watch) = watch {
            watch.stop().await;
        }
        Ok(())
    }
}

#[rewire_runtime::prelude::async_trait]
impl SecretStore for LocalFileSecretStore {
    async fn get_secret(
        &self,
        name: &str,
        _metadata: &HashMap<String, String>,
    ) -> Result<SecretMap, SecretError> {
        self.secrets
            .load()
            .get(name)
            .cloned()
            .ok_or_else(|| SecretError::NotFound(echoed(name).into_owned()))
    }

    async fn bulk_get_secret(
        &self,
        _metadata: &HashMap<String, String>,
    ) -> Result<BTreeMap<String, SecretMap>, SecretError> {
        Ok(self.secrets.load().as_ref().clone())
    }
}

impl From<SecretsFileError> for rewire_runtime::ComponentError {
    fn from(err: SecretsFileError) -> Self {
        Self::new(err.to_string())
    }
}

/// What a re-read of the secrets file logged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reread {
    /// New secrets taken (info).
    Changed,
    /// Same secrets, nothing to say.
    Unchanged,
    /// The file is readable again, its secrets unchanged (info).
    Recovered,
    /// A new problem (warning).
    Warned,
    /// The same problem as the last re-read, or a read not started while
    /// the one that reported it hangs: not logged again.
    StillFailing,
}

/// Re-reads the secrets file into `secrets`. `problem` is the last one
/// reported: a lasting problem is logged once (the file is re-read every
/// 30 s, and on every change), a different one again, and the recovery
/// once, as the file config store does. A read not started because one
/// given up is stuck continues that one's problem.
async fn reread(
    settings: &LocalFileSecretMetadata,
    file: &ComponentFile,
    secrets: &ArcSwap<Secrets>,
    key: &rewire_runtime::ComponentKey,
    problem: &Mutex<Option<String>>,
) -> Reread {
    let loaded = load(settings, file).await;
    let mut problem = problem.lock().unwrap_or_else(|p| p.into_inner());
    match loaded {
        Ok(fresh) => {
            let recovered = problem.take().is_some();
            if **secrets.load() != fresh {
                info!(component = %key, secrets = fresh.len(), "Secrets file changed.");
                secrets.store(Arc::new(fresh));
                Reread::Changed
            } else if recovered {
                info!(component = %key, "Secrets file is readable again; its secrets did not change.");
                Reread::Recovered
            } else {
                Reread::Unchanged
            }
        }
        Err(SecretsFileError::Read(err)) if err.is_still_reading() && problem.is_some() => {
            Reread::StillFailing
        }
        Err(err) => {
            let text = err.to_string();
            if problem.as_ref() == Some(&text) {
                return Reread::StillFailing;
            }
            warn!(component = %key, error = %text, "Secrets file unreadable; keeping the last good secrets.");
            *problem = Some(text);
            Reread::Warned
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rewire_runtime::Metadata;
    use serde_json::json;

    async fn load_once(settings: &LocalFileSecretMetadata) -> Result<Secrets, SecretsFileError> {
        load(
            settings,
            &ComponentFile::new("secretsFile", &settings.secrets_file),
        )
        .await
    }

    #[test]
    fn path_is_an_alias_of_secrets_file() {
        let metadata = Metadata::from(
            json!({"path": "s.json"})
                .as_object()
                .cloned()
                .unwrap_or_default(),
        );
        let decoded: LocalFileSecretMetadata = metadata.decode().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(decoded, LocalFileSecretMetadata::new("s.json"));
    }

    #[tokio::test]
    async fn parse_errors_name_the_place_but_not_the_content() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let path = dir.path().join("secrets.json");
        std::fs::write(&path, "{\"db\": \"hunter2\" \"x\": 1}").unwrap_or_else(|e| panic!("{e}"));
        let err = load_once(&LocalFileSecretMetadata::new(&path))
            .await
            .map(|_| ())
            .expect_err("expected an error");
        let text = err.to_string();
        assert!(
            text.contains("secrets.json") && text.contains("line 1, column"),
            "{text}"
        );
        assert!(!text.contains("hunter2"), "{text}");
    }

    #[tokio::test]
    async fn a_lasting_problem_is_reported_once_and_the_recovery_too() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let path = dir.path().join("secrets.json");
        let write = |text: &str| std::fs::write(&path, text).unwrap_or_else(|e| panic!("{e}"));
        write(r#"{"a": "1"}"#);
        let settings = LocalFileSecretMetadata::new(&path);
        let file = ComponentFile::new("secretsFile", &path);
        let secrets = ArcSwap::from_pointee(
            load(&settings, &file)
                .await
                .unwrap_or_else(|e| panic!("{e}")),
        );
        let key = rewire_runtime::ComponentKey::new("secret_store", "files");
        let problem = Mutex::new(None);
        let mut log = Vec::new();
        for text in [
            "{bad",
            "{bad",
            "{bad",
            "\n\n{bad",
            "\n\n{bad",
            r#"{"a": "1"}"#,
            r#"{"a": "1"}"#,
            "{bad",
            r#"{"a": "2"}"#,
        ] {
            write(text);
            log.push(reread(&settings, &file, &secrets, &key, &problem).await);
        }
        use Reread::*;
        assert_eq!(
            log,
            vec![
                Warned,
                StillFailing,
                StillFailing,
                Warned,
                StillFailing,
                Recovered,
                Unchanged,
                Warned,
                Changed
            ]
        );
        assert!(problem.lock().unwrap_or_else(|p| p.into_inner()).is_none());
    }

    #[tokio::test]
    async fn a_missing_file_names_the_path() {
        let err = load_once(&LocalFileSecretMetadata::new("/nonexistent/s.json"))
            .await
            .map(|_| ())
            .expect_err("expected an error");
        assert!(err.to_string().contains("/nonexistent/s.json"), "{err}");
    }

    #[tokio::test]
    async fn a_file_that_flattens_past_the_bound_is_refused_naming_it() {
        // 1,100 leaves under 4 levels of 64 KiB keys: 300 KiB of file,
        // 280 MiB of names once every leaf is named by its path.
        let key = |c: char| c.to_string().repeat(64 << 10);
        let leaves: serde_json::Map<String, Value> = (0..1100)
            .map(|i| (format!("{i}"), Value::from("v")))
            .collect();
        let file =
            serde_json::json!({ key('a'): { key('b'): { key('c'): { key('d'): leaves } } } });
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("deep.json");
        std::fs::write(&path, file.to_string()).unwrap();
        let err = load_once(&LocalFileSecretMetadata::new(path.to_str().unwrap()))
            .await
            .map(|_| ())
            .expect_err("refused");
        let message = err.to_string();
        assert!(
            message.contains("deep.json")
                && message.contains("flattens to more than 67108864 bytes"),
            "{message}"
        );
    }

    #[tokio::test]
    async fn re_reads_while_a_read_hangs_start_no_other_and_warn_once() {
        use std::sync::atomic::Ordering::SeqCst;
        let (file, calls, release) = crate::component_file::hanging_after_first_read(
            "secretsFile",
            "/hung/secrets.json",
            br#"{"a": "1"}"#,
        );
        let settings = LocalFileSecretMetadata::new("/hung/secrets.json");
        let secrets = ArcSwap::from_pointee(
            load(&settings, &file)
                .await
                .unwrap_or_else(|e| panic!("{e}")),
        );
        let key = rewire_runtime::ComponentKey::new("secret_store", "files");
        let problem = Mutex::new(None);
        let mut log = Vec::new();
        for _ in 0..3 {
            log.push(reread(&settings, &file, &secrets, &key, &problem).await);
        }
        assert_eq!(
            log,
            vec![Reread::Warned, Reread::StillFailing, Reread::StillFailing]
        );
        assert_eq!(calls.load(SeqCst), 2, "reads: the first and one hung");
        assert!(secrets.load().contains_key("a"), "the last good secrets");
        let _ = release.send(());
    }
}
