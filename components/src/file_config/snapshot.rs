//! The content of a configuration file: parsing it into key → value and
//! working out what changed between two versions of it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::component_file::ComponentFileError;
use crate::json_text::value_text;

/// Why a configuration file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum FileConfigError {
    /// The file could not be read: missing, not a regular file (a FIFO, a
    /// device), larger than the limit of [`crate::component_file`], or too
    /// slow.
    #[error("cannot read the config file: {0}")]
    Read(#[from] ComponentFileError),
    /// The file is not valid JSON.
    #[error("config file `{}` is not valid JSON: {message} at line {line}, column {column}", .path.display())]
    Parse {
        /// The configured path.
        path: PathBuf,
        /// What is wrong.
        message: String,
        /// 1-based line of the problem.
        line: usize,
        /// 1-based column of the problem.
        column: usize,
    },
    /// The file is JSON but not an object.
    #[error("config file `{}` must hold a JSON object of key → value", .path.display())]
    NotAnObject {
        /// The configured path.
        path: PathBuf,
    },
}

/// The keys and values of one version of the file.
pub(crate) type Values = BTreeMap<String, String>;

/// Parses the file's `text`: a JSON object whose string values are taken as
/// is and other values as their JSON text.
pub(crate) fn parse(path: &Path, text: &str) -> Result<Values, FileConfigError> {
    let value: Value = serde_json::from_str(text).map_err(|err| {
        let suffix = format!(" at line {} column {}", err.line(), err.column());
        let full = err.to_string();
        FileConfigError::Parse {
            path: path.to_path_buf(),
            message: full.strip_suffix(&suffix).unwrap_or(&full).to_string(),
            line: err.line(),
            column: err.column(),
        }
    })?;
    match value {
        Value::Object(object) => Ok(object
            .iter()
            .map(|(k, v)| (k.clone(), value_text(v)))
            .collect()),
        _ => Err(FileConfigError::NotAnObject {
            path: path.to_path_buf(),
        }),
    }
}

/// What changed from `old` to `new`: each changed or added key with its new
/// value, each removed key with `None`.
pub(crate) fn diff(old: &Values, new: &Values) -> Vec<(String, Option<String>)> {
    let changed = new
        .iter()
        .filter(|(key, value)| old.get(*key) != Some(*value))
        .map(|(key, value)| (key.clone(), Some(value.clone())));
    let removed = old
        .keys()
        .filter(|key| !new.contains_key(*key))
        .map(|key| (key.clone(), None));
    changed.chain(removed).collect()
}

impl From<FileConfigError> for rewire_runtime::ComponentError {
    fn from(err: FileConfigError) -> Self {
        Self::new(err.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(pairs: &[(&str, &str)]) -> Values {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn non_string_values_become_json_text() {
        let parsed = parse(
            Path::new("c.json"),
            r#"{"a": "x", "n": 5, "o": {"b": true}}"#,
        );
        let parsed = parsed.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            parsed,
            values(&[("a", "x"), ("n", "5"), ("o", r#"{"b":true}"#)])
        );
    }

    #[test]
    fn syntax_errors_carry_line_and_column() {
        let err =
            parse(Path::new("dir/c.json"), "{\n  \"a\": \"x\",\n}").expect_err("expected an error");
        match &err {
            FileConfigError::Parse { line, column, .. } => assert_eq!((*line, *column), (3, 1)),
            other => panic!("unexpected {other}"),
        }
        let text = err.to_string();
        assert!(
            text.starts_with("config file `dir/c.json` is not valid JSON: "),
            "{text}"
        );
        assert!(text.ends_with("at line 3, column 1"), "{text}");
    }

    #[test]
    fn arrays_are_rejected() {
        let err = parse(Path::new("c.json"), "[1]").expect_err("expected an error");
        assert!(matches!(err, FileConfigError::NotAnObject { .. }), "{err}");
    }

    #[test]
    fn diff_lists_changes_and_removals() {
        let old = values(&[("a", "1"), ("b", "1"), ("c", "1")]);
        let new = values(&[("a", "1"), ("b", "2"), ("d", "1")]);
        assert_eq!(
            diff(&old, &new),
            vec![
                ("b".to_string(), Some("2".to_string())),
                ("d".to_string(), Some("1".to_string())),
                ("c".to_string(), None),
            ]
        );
        assert!(diff(&new, &new).is_empty());
    }
}
