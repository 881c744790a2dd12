//! Keeps secret values out of every error and status text: the values
//! read through secretRef or written inline in a field named like a secret
//! ([`is_secret_field`]), and the credentials of URLs
//! ([`without_credentials`]).

mod panics;
mod secret_fields;
mod url_credentials;

use std::collections::BTreeSet;
use std::io::{self, Write};
use std::ops::Range;
use std::sync::{Arc, OnceLock, RwLock};

use serde_json::{Map, Value};

pub use panics::redact_panics;
pub use secret_fields::is_secret_field;
pub(crate) use secret_fields::shown_fields;
pub use url_credentials::without_credentials;

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
    /// error quoting a string), where they differ from the raw value; and
    /// the same for the value trimmed, where blanks around it (a secret
    /// file's last newline) differ: a lenient number or flag is read, and
    /// quoted when bad, trimmed.
    pub fn remember(&self, value: &str) {
        let mut forms = Vec::new();
        for value in [value, value.trim()] {
            if value.len() >= MIN_SCRUBBED_LEN {
                forms.extend(printed_forms(value));
            }
        }
        if forms.is_empty() {
            return;
        }
        // Built before the lock is taken: nothing panics while it is held
        // (the panic hook scrubs, and would wait on it).
        let mut values = self.values.write().unwrap_or_else(|p| p.into_inner());
        values.extend(forms);
    }

    /// Remembers the inline values of the fields of `metadata` named like
    /// a secret ([`is_secret_field`]), so that an error or log echoing one
    /// is scrubbed as a secretRef value is.
    pub fn remember_secret_fields(&self, metadata: &Map<String, Value>) {
        for value in secret_fields::secret_field_values(metadata) {
            self.remember(&value);
        }
    }

    /// `text` without URL credentials ([`without_credentials`]) and with
    /// every remembered secret value replaced by `[redacted]`. Every
    /// occurrence of every value, and every URL credential, is found in
    /// the text as given first (a remembered URL is found whole, not only
    /// its password), and the overlapping or adjacent ones are replaced as
    /// one: no part of a secret survives next to another.
    pub fn scrub(&self, text: &str) -> String {
        let mut spans = url_credentials::credential_spans(text);
        let values = self.values.read().unwrap_or_else(|p| p.into_inner());
        for value in values.iter() {
            spans.extend(occurrences(text, value));
        }
        drop(values);
        if spans.is_empty() {
            return text.to_string();
        }
        spans.sort_by_key(|span| span.start);
        let mut out = String::with_capacity(text.len());
        let mut copied = 0;
        let mut spans = spans.into_iter().peekable();
        while let Some(mut merged) = spans.next() {
            while let Some(next) = spans.next_if(|next| next.start <= merged.end) {
                merged.end = merged.end.max(next.end);
            }
            out.push_str(&text[copied..merged.start]);
            out.push_str("[redacted]");
            copied = merged.end;
        }
        out.push_str(&text[copied..]);
        out
    }
}

/// Where `value` occurs in `text`, overlapping occurrences included.
fn occurrences<'a>(text: &'a str, value: &'a str) -> impl Iterator<Item = Range<usize>> + 'a {
    let mut from = 0;
    std::iter::from_fn(move || {
        let start = from + text.get(from..)?.find(value)?;
        // On past the first character of this occurrence.
        from = start + text[start..].chars().next().map_or(1, char::len_utf8);
        Some(start..start + value.len())
    })
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
    fn overlapping_secrets_are_scrubbed_whole() {
        let redactor = Redactor::default();
        redactor.remember("abcdef");
        redactor.remember("defghi");
        assert_eq!(redactor.scrub("x abcdefghi y"), "x [redacted] y");
        // Adjacent: one span, nothing in between to read.
        assert_eq!(redactor.scrub("abcdefdefghi!"), "[redacted]!");
        // A value overlapping itself.
        redactor.remember("abab");
        assert_eq!(redactor.scrub("ababab."), "[redacted].");
        assert_eq!(redactor.scrub("é abcdef é"), "é [redacted] é");
    }

    #[test]
    fn scrub_removes_url_credentials_even_unremembered() {
        let redactor = Redactor::default();
        redactor.remember("p@ss word");
        // The url crate's form of a URL whose password came from a store.
        let url = "redis://:p%40ss%20word@h:6379/";
        assert_eq!(
            redactor.scrub(&format!("cannot connect to {url}")),
            "cannot connect to redis://:[redacted]@h:6379/"
        );
        assert_eq!(
            redactor.scrub("http://root:hunter2@h:2379 and p@ss word"),
            "http://root:[redacted]@h:2379 and [redacted]"
        );
    }

    #[test]
    fn a_remembered_url_is_scrubbed_whole_not_only_its_password() {
        let redactor = Redactor::default();
        let url = "https://bot:pw12@hooks.example.com/T0/B0/XSECRETTOKEN";
        redactor.remember(url);
        let scrubbed = redactor.scrub(&format!("error sending request for url ({url})"));
        assert_eq!(scrubbed, "error sending request for url ([redacted])");
        // Next to an unremembered URL's credentials, both go.
        assert_eq!(
            redactor.scrub(&format!("{url} then http://u:hunter2@h/x")),
            "[redacted] then http://u:[redacted]@h/x"
        );
    }

    #[test]
    fn a_value_is_scrubbed_trimmed_too() {
        let redactor = Redactor::default();
        // A watched secret file's value, with its last newline; a lenient
        // number reads (and quotes) it trimmed.
        redactor.remember("tok-1234-abcd\n");
        redactor.remember("  ab\n");
        assert_eq!(
            redactor.scrub("invalid type: string \"tok-1234-abcd\", expected u64"),
            "invalid type: string \"[redacted]\", expected u64"
        );
        // Trimmed below the length scrubbed: left alone.
        assert_eq!(redactor.scrub("ab"), "ab");
    }

    #[test]
    fn remembers_the_inline_values_of_secret_fields() {
        let redactor = Redactor::default();
        let metadata = serde_json::json!({"redisPassword": "hunter2", "keyPrefix": "app||"});
        redactor.remember_secret_fields(metadata.as_object().unwrap_or(&Map::new()));
        assert_eq!(
            redactor.scrub("auth hunter2 failed for app||"),
            "auth [redacted] failed for app||"
        );
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
