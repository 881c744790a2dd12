//! Configuration problems, each tied to the component it is about.

use std::fmt;

use crate::component::ComponentKey;
use crate::redact::without_credentials;

/// One thing wrong with a configuration. Its message never holds a URL's
/// credentials: a value quoted from a document (`redis://:pw@host`) is
/// shown without them ([`without_credentials`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The component concerned, if any (file-level problems have none).
    pub component: Option<ComponentKey>,
    /// What is wrong, naming the field.
    pub message: String,
    /// Where in which file, as `path:line`, when the problem is tied to a
    /// line (Dapr component manifests).
    pub location: Option<String>,
}

impl Problem {
    /// A problem with the whole file.
    pub fn file(message: impl Into<String>) -> Self {
        Self {
            component: None,
            message: shown_message(message.into()),
            location: None,
        }
    }

    /// A problem with one component.
    pub fn component(key: &ComponentKey, message: impl Into<String>) -> Self {
        Self {
            component: Some(key.clone()),
            message: shown_message(message.into()),
            location: None,
        }
    }

    /// The same problem, said to be at `location` (`path:line`).
    pub fn at(mut self, location: impl Into<String>) -> Self {
        self.location = Some(location.into());
        self
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(location) = &self.location {
            write!(f, "{}: ", OneLine(location))?;
        }
        if let Some(key) = &self.component {
            write!(f, "{}: ", OneLine(&key.to_string()))?;
        }
        write!(f, "{}", OneLine(&without_credentials(&self.message)))
    }
}

/// `message` without URL credentials.
fn shown_message(message: String) -> String {
    match without_credentials(&message) {
        std::borrow::Cow::Borrowed(_) => message,
        std::borrow::Cow::Owned(shown) => shown,
    }
}

/// Writes text with its control characters escaped (`\n`, `\u{1b}`): kinds,
/// names, fields and values quoted from a document must not split a problem
/// over several lines.
struct OneLine<'a>(&'a str);

impl fmt::Display for OneLine<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for c in self.0.chars() {
            if c.is_control() {
                write!(f, "{}", c.escape_default())?;
            } else {
                fmt::Write::write_char(f, c)?;
            }
        }
        Ok(())
    }
}

/// Every problem found in a configuration, one per line when displayed.
///
/// Its `Debug` is its `Display` too, so a `main` returning it with `?`
/// (`fn main() -> Result<(), Box<dyn Error>>`) prints the problems, one
/// per line, not a dump of the structure:
///
/// ```
/// use rewire_runtime::config::{Problem, Problems};
///
/// let mut problems = Problems::default();
/// problems.push(Problem::file("first problem"));
/// problems.push(Problem::file("second problem"));
/// assert_eq!(format!("{problems:?}"), "first problem\nsecond problem");
/// assert_eq!(format!("{problems:?}"), problems.to_string());
/// ```
#[derive(Clone, Default, PartialEq, Eq, thiserror::Error)]
pub struct Problems(pub Vec<Problem>);

impl Problems {
    /// Adds a problem.
    pub fn push(&mut self, problem: Problem) {
        self.0.push(problem);
    }

    /// Whether nothing is wrong.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// `Ok(value)` when nothing is wrong, else `Err(self)`.
    pub fn into_result<T>(self, value: T) -> Result<T, Problems> {
        if self.is_empty() {
            Ok(value)
        } else {
            Err(self)
        }
    }

    /// The problems, in order.
    pub fn iter(&self) -> impl Iterator<Item = &Problem> {
        self.0.iter()
    }
}

impl fmt::Debug for Problems {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for Problems {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, problem) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{problem}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Map, Value};

    use super::*;
    use crate::metadata::MetadataError;
    use crate::registry::{ComponentDescriptor, Registry};
    use crate::ValidConfig;

    /// Rejects `redisHost`, quoting it twice (as components' errors do).
    fn echoing_validate(map: &Map<String, Value>, _: &[String]) -> Result<(), MetadataError> {
        let host = map.get("redisHost").and_then(Value::as_str).unwrap_or("");
        Err(MetadataError::Invalid {
            field: "redisHost".into(),
            message: format!("`{host}` is not `host:port`: give `{host}` without a URL scheme"),
        })
    }

    fn unbuildable(_: &crate::Metadata) -> Result<Box<dyn crate::Buildable>, MetadataError> {
        Err(MetadataError::Invalid {
            field: ".".into(),
            message: "test registry cannot build".into(),
        })
    }

    #[test]
    fn validation_problems_show_no_url_credentials() {
        let mut registry = Registry::default();
        registry.register(ComponentDescriptor {
            kind: "state",
            type_name: "redis",
            description: "",
            example_metadata: "{}",
            validate: echoing_validate,
            build: unbuildable,
            check_refs: None,
            in_place: None,
        });
        let config = br#"{"components": {"state": {"cache": {"type": "redis",
            "metadata": {"redisHost": "redis://:hunter2@127.0.0.1:6379"}}}}}"#;
        let problems = match ValidConfig::from_slice(config, &registry) {
            Ok(_) => panic!("a URL is not a valid redisHost here"),
            Err(problems) => problems,
        };
        // As `rewire validate` prints them.
        let printed: Vec<String> = problems.iter().map(ToString::to_string).collect();
        assert_eq!(printed.len(), 1, "{printed:?}");
        assert!(!printed[0].contains("hunter2"), "{}", printed[0]);
        assert!(
            printed[0].contains("redis://:[redacted]@127.0.0.1:6379"),
            "{}",
            printed[0]
        );
    }

    #[test]
    fn a_problem_never_shows_url_credentials() {
        let key = ComponentKey::new("state", "cache");
        let quoted =
            "metadata field `redisHost`: `redis://:hunter2@127.0.0.1:6379` is not `host:port`";
        for problem in [Problem::component(&key, quoted), Problem::file(quoted)] {
            assert!(!problem.message.contains("hunter2"), "{}", problem.message);
            assert!(!problem.to_string().contains("hunter2"), "{problem}");
        }
        // Built by hand, it is still shown without them.
        let by_hand = Problem {
            component: None,
            message: "`http://root:hunter2@h:2379`".into(),
            location: None,
        };
        assert_eq!(by_hand.to_string(), "`http://root:[redacted]@h:2379`");
    }
}
