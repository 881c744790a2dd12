//! [`LiveFile`]: the last good content of the configuration file, kept up
//! to date by re-reading it, and the subscribers to its changes.
//!
//! Every read goes through the one [`ComponentFile`] of the store: on a
//! hung mount one read is stuck, and the polls meanwhile keep the last good
//! content without starting another.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{Mutex, MutexGuard};

use rewire_runtime::{ConfigItem, ConfigQuery, ConfigSubscription, SubscriptionHub};
use tracing::{info, warn};

use crate::component_file::ComponentFile;

use super::snapshot::{diff, parse, FileConfigError};

/// The file's values as last read successfully, shared by the store and its
/// watcher task.
#[derive(Debug)]
pub(crate) struct LiveFile {
    file: ComponentFile,
    state: Mutex<State>,
    hub: SubscriptionHub,
}

#[derive(Debug, Default)]
struct State {
    /// The raw text last accepted, to skip re-parsing identical content.
    text: String,
    /// Key → (value, revision that last changed it).
    values: BTreeMap<String, (String, u64)>,
    /// Increases with every accepted change of the content.
    revision: u64,
    /// The last problem reported, so a lasting problem is logged once.
    problem: Option<String>,
}

impl LiveFile {
    /// Reads `file` for the first time; fails if it is missing or invalid.
    pub(crate) async fn open(file: ComponentFile) -> Result<Self, FileConfigError> {
        let text = file.read().await?;
        let values = parse(file.path(), &text)?;
        let state = State {
            values: values.into_iter().map(|(k, v)| (k, (v, 1))).collect(),
            text,
            revision: 1,
            problem: None,
        };
        Ok(Self {
            file,
            state: Mutex::new(state),
            hub: SubscriptionHub::default(),
        })
    }

    /// The path being served.
    pub(crate) fn path(&self) -> &Path {
        self.file.path()
    }

    /// Re-reads the file. New content is taken and its changes published; a
    /// missing, half-written or invalid file keeps the last good content
    /// (with one warning per distinct problem; a read not started while
    /// one given up is stuck continues the problem that one reported).
    /// Returns how many keys changed.
    pub(crate) async fn reload(&self) -> usize {
        let path = self.path();
        let parsed = match self.file.read().await {
            Err(err) if err.is_still_reading() && self.state().problem.is_some() => return 0,
            Ok(text) if text == self.state().text => Ok(None),
            Ok(text) => parse(path, &text).map(|values| Some((text, values))),
            Err(err) => Err(FileConfigError::from(err)),
        };
        let mut state = self.state();
        let (text, values) = match parsed {
            Ok(Some(new)) => new,
            Ok(None) => {
                if state.problem.take().is_some() {
                    info!(path = %path.display(), "Config file is readable again; its content did not change.");
                }
                return 0;
            }
            Err(err) => {
                let problem = err.to_string();
                if state.problem.as_ref() != Some(&problem) {
                    warn!(path = %path.display(), error = %problem, "Config file not reloaded; keeping the last good content.");
                    state.problem = Some(problem);
                }
                return 0;
            }
        };
        state.problem = None;
        let old: BTreeMap<String, String> = state
            .values
            .iter()
            .map(|(k, (v, _))| (k.clone(), v.clone()))
            .collect();
        let changes = diff(&old, &values);
        state.text = text;
        if changes.is_empty() {
            return 0;
        }
        state.revision += 1;
        let revision = state.revision;
        let mut published = Vec::with_capacity(changes.len());
        let mut removed = 0;
        for (key, value) in changes {
            match &value {
                Some(value) => {
                    state.values.insert(key.clone(), (value.clone(), revision));
                }
                None => {
                    state.values.remove(&key);
                    removed += 1;
                }
            }
            published.push(item(key, value.unwrap_or_default(), revision));
        }
        info!(
            path = %path.display(),
            revision,
            changed = published.len() - removed,
            removed,
            "Config file reloaded."
        );
        self.hub.publish(&published);
        published.len()
    }

    /// The values matching `query` (group and label already checked).
    pub(crate) fn get(&self, query: &ConfigQuery) -> Vec<ConfigItem> {
        let state = self.state();
        if query.keys.is_empty() {
            return state
                .values
                .iter()
                .map(|(key, (value, revision))| item(key.clone(), value.clone(), *revision))
                .collect();
        }
        query
            .keys
            .iter()
            .filter_map(|key| {
                let (value, revision) = state.values.get(key)?;
                Some(item(key.clone(), value.clone(), *revision))
            })
            .collect()
    }

    /// Subscribes to changes of the keys of `query`.
    pub(crate) fn subscribe(&self, query: ConfigQuery) -> ConfigSubscription {
        self.hub.subscribe(query)
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

fn item(key: String, value: String, revision: u64) -> ConfigItem {
    ConfigItem {
        key,
        value,
        version: revision.to_string(),
        group: None,
        label: None,
        metadata: HashMap::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn reload_publishes_changes_and_keeps_the_last_good_content() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let path = dir.path().join("c.json");
        std::fs::write(&path, r#"{"a": "1", "b": "1"}"#).unwrap_or_else(|e| panic!("{e}"));
        let live = LiveFile::open(ComponentFile::new("path", &path))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let mut sub = live.subscribe(ConfigQuery::default());
        assert_eq!(live.reload().await, 0);

        std::fs::write(&path, r#"{"a": "2""#).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(live.reload().await, 0);
        std::fs::remove_file(&path).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(live.reload().await, 0);
        assert_eq!(live.get(&ConfigQuery::keys(["a"]))[0].value, "1");

        std::fs::write(&path, r#"{"a": "2"}"#).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(live.reload().await, 2);
        let change = testkit::soon("a change", sub.changes.recv())
            .await
            .map(|c| c.items)
            .unwrap_or_default();
        let pairs: Vec<_> = change
            .iter()
            .map(|i| (i.key.as_str(), i.value.as_str(), i.version.as_str()))
            .collect();
        assert_eq!(pairs, vec![("a", "2", "2"), ("b", "", "2")]);
        assert!(live.get(&ConfigQuery::keys(["b"])).is_empty());
    }

    #[tokio::test]
    async fn open_fails_on_a_missing_file_naming_it() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let path = dir.path().join("absent.json");
        let err = LiveFile::open(ComponentFile::new("path", &path))
            .await
            .map(|_| ())
            .expect_err("expected an error");
        assert!(err.to_string().contains("absent.json"), "{err}");
    }

    #[tokio::test]
    async fn polls_while_a_read_hangs_start_no_other_and_keep_the_last_good_content() {
        use std::sync::atomic::Ordering::SeqCst;
        let (file, calls, release) = crate::component_file::hanging_after_first_read(
            "path",
            "/hung/c.json",
            br#"{"a": "1"}"#,
        );
        let live = LiveFile::open(file).await.unwrap_or_else(|e| panic!("{e}"));
        let mut problems = Vec::new();
        for _ in 0..3 {
            assert_eq!(live.reload().await, 0);
            problems.push(live.state().problem.clone().unwrap_or_default());
        }
        assert_eq!(calls.load(SeqCst), 2, "reads: the first and one hung");
        // One problem reported (the time-out): the polls after it add none.
        assert!(problems[0].contains("given up"), "{problems:?}");
        assert!(problems.iter().all(|p| p == &problems[0]), "{problems:?}");
        assert_eq!(live.get(&ConfigQuery::keys(["a"]))[0].value, "1");
        let _ = release.send(());
    }
}
