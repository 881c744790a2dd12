//! Where an item lives in etcd: [`KeyLayout`] maps `(group, key, label)`
//! to a key path and back.
//!
//! ```text
//! {keyPrefix}[{group}/]{key}[@{label}]
//! ```
//!
//! Reading a path back (watch events, prefix listings), the part after
//! `keyPrefix` is split at its first `/`: before it is the group, after it
//! the key (which may hold further `/`); without `/` there is no group.
//! Then the last `@` of the key starts the label. Paths that do not fit
//! (empty key, group or label) are not configuration items and are left
//! out. To keep the mapping one-to-one, a key may not contain `@`, nor `/`
//! unless a group is given; a group may not contain `/`, a label neither
//! `/` nor `@`. An empty group or label counts as none.

use rewire_runtime::ConfigQuery;

/// A configuration item's name: its group, key and label.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct ItemName {
    /// The group (first path segment), if any.
    pub(crate) group: Option<String>,
    /// The key.
    pub(crate) key: String,
    /// The label (after the last `@`), if any.
    pub(crate) label: Option<String>,
}

/// Why a group, key or label cannot be mapped to a key path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// The key is empty.
    #[error("the key is empty")]
    EmptyKey,
    /// The key contains `@`.
    #[error("key `{0}` contains `@`, which the etcd store reads as the start of a label: pass the label as `label`")]
    AtInKey(String),
    /// The key contains `/` but no group is given.
    #[error("key `{0}` contains `/`, which the etcd store reads as `{{group}}/{{key}}`: pass the part before the first `/` as `group`")]
    SlashWithoutGroup(String),
    /// The group contains `/`.
    #[error("group `{0}` contains `/`: a group is one path segment")]
    SlashInGroup(String),
    /// The label contains `/` or `@`.
    #[error("label `{0}` contains `/` or `@`, which the etcd store cannot read back")]
    BadLabel(String),
}

/// The key layout of one store: its `keyPrefix`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KeyLayout {
    prefix: String,
}

impl KeyLayout {
    /// The layout under `prefix` (`keyPrefix`, used as is).
    pub(crate) fn new(prefix: impl Into<String>) -> Self {
        Self {
            prefix: prefix.into(),
        }
    }

    /// `keyPrefix`: the range the store watches.
    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The path of `key` in `group` with `label`.
    pub(crate) fn path(
        &self,
        group: Option<&str>,
        key: &str,
        label: Option<&str>,
    ) -> Result<String, KeyError> {
        let group = non_empty(group);
        let label = non_empty(label);
        if key.is_empty() {
            return Err(KeyError::EmptyKey);
        }
        if key.contains('@') {
            return Err(KeyError::AtInKey(key.into()));
        }
        if group.is_none() && key.contains('/') {
            return Err(KeyError::SlashWithoutGroup(key.into()));
        }
        check_label(label)?;
        let mut path = self.list_prefix(group)?;
        path.push_str(key);
        if let Some(label) = label {
            path.push('@');
            path.push_str(label);
        }
        Ok(path)
    }

    /// The paths of the keys of `query`; with no keys, just checks its
    /// group and label. An empty key names no item (as in Dapr, a key the
    /// store does not find: `?key=&key=a` reads `a`), so it has no path:
    /// a query of only empty keys has none, and reads nothing — not every
    /// item, as a query without keys does.
    pub(crate) fn paths(&self, query: &ConfigQuery) -> Result<Vec<String>, KeyError> {
        let group = query.group.as_deref();
        let label = query.label.as_deref();
        self.list_prefix(group)?;
        check_label(non_empty(label))?;
        query
            .keys
            .iter()
            .filter(|key| !key.is_empty())
            .map(|key| self.path(group, key, label))
            .collect()
    }

    /// The prefix under which the items of `group` (all items: `None`)
    /// live.
    pub(crate) fn list_prefix(&self, group: Option<&str>) -> Result<String, KeyError> {
        match non_empty(group) {
            None => Ok(self.prefix.clone()),
            Some(group) if group.contains('/') => Err(KeyError::SlashInGroup(group.into())),
            Some(group) => Ok(format!("{}{group}/", self.prefix)),
        }
    }

    /// The item stored at `path`, if `path` is under the prefix and fits
    /// the layout.
    pub(crate) fn parse(&self, path: &str) -> Option<ItemName> {
        let rest = path.strip_prefix(&self.prefix)?;
        let (group, named) = match rest.split_once('/') {
            Some((group, named)) => (Some(group), named),
            None => (None, rest),
        };
        let (key, label) = match named.rsplit_once('@') {
            Some((key, label)) => (key, Some(label)),
            None => (named, None),
        };
        if key.is_empty() || group == Some("") || label == Some("") {
            return None;
        }
        Some(ItemName {
            group: group.map(str::to_string),
            key: key.to_string(),
            label: label.map(str::to_string),
        })
    }
}

/// `query` with an empty group or label taken as none.
pub(crate) fn normalized(mut query: ConfigQuery) -> ConfigQuery {
    query.group = query.group.filter(|g| !g.is_empty());
    query.label = query.label.filter(|l| !l.is_empty());
    query
}

fn check_label(label: Option<&str>) -> Result<(), KeyError> {
    match label {
        Some(label) if label.contains(['/', '@']) => Err(KeyError::BadLabel(label.into())),
        _ => Ok(()),
    }
}

fn non_empty(text: Option<&str>) -> Option<&str> {
    text.filter(|t| !t.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(group: Option<&str>, key: &str, label: Option<&str>) -> ItemName {
        ItemName {
            group: group.map(Into::into),
            key: key.into(),
            label: label.map(Into::into),
        }
    }

    #[test]
    fn paths_round_trip() {
        let layout = KeyLayout::new("/app/");
        for (group, key, label, path) in [
            (None, "a", None, "/app/a"),
            (Some("db"), "host", None, "/app/db/host"),
            (None, "a", Some("prod"), "/app/a@prod"),
            (Some("db"), "x/y", Some("prod"), "/app/db/x/y@prod"),
        ] {
            assert_eq!(layout.path(group, key, label), Ok(path.to_string()));
            assert_eq!(layout.parse(path), Some(name(group, key, label)), "{path}");
        }
        assert_eq!(layout.path(Some(""), "a", Some("")), Ok("/app/a".into()));
        assert_eq!(layout.list_prefix(None), Ok("/app/".into()));
        assert_eq!(layout.list_prefix(Some("db")), Ok("/app/db/".into()));
    }

    #[test]
    fn paths_that_cannot_round_trip_are_rejected() {
        let layout = KeyLayout::new("");
        assert_eq!(layout.path(None, "", None), Err(KeyError::EmptyKey));
        assert!(matches!(
            layout.path(None, "a@b", None),
            Err(KeyError::AtInKey(_))
        ));
        assert!(matches!(
            layout.path(None, "a/b", None),
            Err(KeyError::SlashWithoutGroup(_))
        ));
        assert!(matches!(
            layout.path(Some("a/b"), "c", None),
            Err(KeyError::SlashInGroup(_))
        ));
        assert!(matches!(
            layout.path(None, "c", Some("x/y")),
            Err(KeyError::BadLabel(_))
        ));
    }

    #[test]
    fn an_empty_key_of_a_query_has_no_path() {
        let layout = KeyLayout::new("/app/");
        let query = |keys: &[&str]| ConfigQuery::keys(keys.iter().copied());
        assert_eq!(layout.paths(&query(&["", "a"])), Ok(vec!["/app/a".into()]));
        assert_eq!(layout.paths(&query(&[""])), Ok(Vec::new()));
        // Still an error where it names an item to write.
        assert_eq!(layout.path(None, "", None), Err(KeyError::EmptyKey));
    }

    #[test]
    fn foreign_paths_are_left_out() {
        let layout = KeyLayout::new("/app/");
        assert_eq!(layout.parse("/other/a"), None);
        assert_eq!(layout.parse("/app/"), None);
        assert_eq!(layout.parse("/app/g/"), None);
        assert_eq!(layout.parse("/app//a"), None);
        assert_eq!(layout.parse("/app/a@"), None);
        assert_eq!(layout.parse("/app/@x"), None);
    }
}
