//! Keeps secret values out of every error and status text.

use std::collections::BTreeSet;
use std::sync::{Arc, RwLock};

/// Secret values shorter than this are not scrubbed from text (scrubbing a
/// one-letter value would mangle every message); such values are too weak to
/// be secrets anyway.
const MIN_SCRUBBED_LEN: usize = 4;

/// The secret values seen so far, and how to scrub them from text.
#[derive(Debug, Clone, Default)]
pub struct Redactor {
    values: Arc<RwLock<BTreeSet<String>>>,
}

impl Redactor {
    /// Remembers a secret value.
    pub fn remember(&self, value: &str) {
        if value.len() >= MIN_SCRUBBED_LEN {
            self.values.write().unwrap_or_else(|p| p.into_inner()).insert(value.to_string());
        }
    }

    /// `text` with every remembered secret value replaced by `[redacted]`.
    pub fn scrub(&self, text: &str) -> String {
        let values = self.values.read().unwrap_or_else(|p| p.into_inner());
        let mut by_length: Vec<&String> = values.iter().collect();
        by_length.sort_by_key(|v| std::cmp::Reverse(v.len()));
        let mut out = text.to_string();
        for value in by_length {
            if out.contains(value.as_str()) {
                out = out.replace(value.as_str(), "[redacted]");
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scrubs_longest_first_and_skips_short_values() {
        let redactor = Redactor::default();
        redactor.remember("hunter2");
        redactor.remember("hunter2-extra");
        redactor.remember("ab");
        assert_eq!(
            redactor.scrub("auth hunter2-extra then hunter2, ab"),
            "auth [redacted] then [redacted], ab"
        );
    }
}
