//! Keeps secret values out of every error and status text.

use std::collections::BTreeSet;
use std::io::{self, Write};
use std::sync::{Arc, OnceLock, RwLock};

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
    /// The process-wide redactor every runtime uses, so that one log writer
    /// ([`RedactingWriter`]) can scrub the secrets of all of them.
    pub fn shared() -> Self {
        static SHARED: OnceLock<Redactor> = OnceLock::new();
        SHARED.get_or_init(Redactor::default).clone()
    }

    /// Remembers a secret value, and the forms in which it may be printed:
    /// JSON-escaped (an error quoting a document) and Debug-escaped (an
    /// error quoting a string), where they differ from the raw value.
    pub fn remember(&self, value: &str) {
        if value.len() < MIN_SCRUBBED_LEN {
            return;
        }
        let mut values = self.values.write().unwrap_or_else(|p| p.into_inner());
        for form in printed_forms(value) {
            values.insert(form);
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

/// `value` as written raw, inside a JSON string, and by `{:?}` (quotes
/// stripped).
fn printed_forms(value: &str) -> Vec<String> {
    let json = serde_json::to_string(value).unwrap_or_default();
    let debug = format!("{value:?}");
    let unquote = |quoted: &str| {
        quoted
            .strip_prefix('"')
            .and_then(|q| q.strip_suffix('"'))
            .map(str::to_string)
    };
    let mut forms = vec![value.to_string()];
    forms.extend(unquote(&json));
    forms.extend(unquote(&debug));
    forms.sort();
    forms.dedup();
    forms
}

/// A writer that scrubs every secret value the runtimes have seen from what
/// passes through it: the last line of defence for logs, which also catches
/// a component that logs its own password. Give it to the log subscriber
/// (`tracing_subscriber::fmt().with_writer(|| RedactingWriter::new(std::io::stderr()))`).
/// Each write is scrubbed on its own, as log formatters write whole events.
#[derive(Debug)]
pub struct RedactingWriter<W> {
    inner: W,
    redactor: Redactor,
}

impl<W: Write> RedactingWriter<W> {
    /// Scrubs with the shared redactor before writing to `inner`.
    pub fn new(inner: W) -> Self {
        Self {
            inner,
            redactor: Redactor::shared(),
        }
    }
}

impl<W: Write> Write for RedactingWriter<W> {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        let text = String::from_utf8_lossy(bytes);
        self.inner
            .write_all(self.redactor.scrub(&text).as_bytes())?;
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scrubs_the_escaped_forms_of_a_value() {
        let redactor = Redactor::default();
        let pem = "-----BEGIN KEY-----\nab\"c\\d\te\n-----END KEY-----";
        redactor.remember(pem);
        let json = serde_json::to_string(pem).unwrap_or_default();
        let debug = format!("invalid value: {pem:?}");
        for text in [pem.to_string(), json, debug] {
            let scrubbed = redactor.scrub(&text);
            assert!(
                !scrubbed.contains("ab\\\"c") && !scrubbed.contains("ab\"c"),
                "{scrubbed}"
            );
            assert!(scrubbed.contains("[redacted]"), "{scrubbed}");
        }
    }

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
