//! Configuration problems, each tied to the component it is about.

use std::fmt;

use crate::component::ComponentKey;

/// One thing wrong with a configuration.
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
            message: message.into(),
            location: None,
        }
    }

    /// A problem with one component.
    pub fn component(key: &ComponentKey, message: impl Into<String>) -> Self {
        Self {
            component: Some(key.clone()),
            message: message.into(),
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
        write!(f, "{}", OneLine(&self.message))
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
