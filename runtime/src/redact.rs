//! Keeps secret values out of every error and status text: the values
//! read through secretRef or written inline in a field named like a secret
//! ([`is_secret_field`]), and the credentials of URLs
//! ([`without_credentials`]).

mod finder;
mod forms;
mod held;
mod limits;
mod matcher;
mod panics;
mod secret_fields;
mod url_credentials;

use std::collections::BTreeSet;
use std::io::{self, Write};
use std::ops::Range;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;

use finder::Finder;
#[cfg(test)]
use finder::PENDING_MAX;
pub(crate) use forms::forms_to_scrub;
use held::HeldForms;
pub use held::HeldSecrets;
pub(crate) use limits::too_many_secret_values;
pub use panics::redact_panics;
pub use secret_fields::is_secret_field;
pub(crate) use secret_fields::{
    hides as hides_field_value, is_a_pair, secret_field_values, shown_fields,
};
pub use url_credentials::without_credentials;

/// Secret values shorter than this are not scrubbed from text (scrubbing a
/// one-letter value would mangle every message); such values are too weak to
/// be secrets anyway.
const MIN_SCRUBBED_LEN: usize = 4;

/// The secret values in force, and how to scrub them from text.
///
/// A value is remembered while a guard ([`HeldSecrets`]) holds it: the
/// metadata of the component that uses it, until the component is
/// retired. It is forgotten once no guard has held it for a grace
/// (`held::FORGET_AFTER`, 10 minutes: a retired component's close and the
/// tasks it left may still print it meanwhile), when a later value is
/// remembered (at most once a minute, `held::FORGET_EVERY`, unless the
/// room is needed). The forms remembered are bounded too (`limits`,
/// counting only those held or within their grace): a component whose
/// values would pass the bound is refused.
#[derive(Debug, Clone, Default)]
pub struct Redactor {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    /// The forms remembered; one writer at a time makes the next finder.
    forms: Mutex<HeldForms>,
    /// The forms guards let go of, and when, oldest first: counted in
    /// `forms` by the next writer. A guard dropped on a runtime worker
    /// takes only this lock, never held long, not `forms`, held while a
    /// finder is built (maybe hundreds of milliseconds after a forget).
    released: Mutex<Vec<(Instant, Vec<Arc<str>>)>>,
    /// What finds `forms` in a text, as last made. Scrubbing reads it
    /// without a lock: the panic hook scrubs, maybe while the panicking
    /// thread holds `forms`.
    finder: ArcSwap<Finder>,
    /// How long a form no guard holds is still scrubbed.
    grace: Duration,
    /// How often forms past their grace are forgotten, unless their room
    /// is needed.
    forget_every: Duration,
}

impl Default for Shared {
    fn default() -> Self {
        Self {
            forms: Mutex::default(),
            released: Mutex::default(),
            finder: ArcSwap::default(),
            grace: held::FORGET_AFTER,
            forget_every: held::FORGET_EVERY,
        }
    }
}

impl Shared {
    /// Counts in `held` the forms guards let go of since last counted, in
    /// the order they did: a form let go of and held again meanwhile is
    /// still held once counted, never forgotten.
    fn count_released(&self, held: &mut HeldForms) {
        let released = {
            let mut queue = self.released.lock().unwrap_or_else(|p| p.into_inner());
            std::mem::take(&mut *queue)
        };
        for (at, forms) in released {
            for form in &forms {
                held.release(form, at);
            }
        }
    }
}

impl Redactor {
    /// The process-wide redactor every runtime uses, so that one log writer
    /// ([`RedactingWriter`]) can scrub the secrets of all of them.
    pub fn shared() -> Self {
        static SHARED: OnceLock<Redactor> = OnceLock::new();
        SHARED.get_or_init(Redactor::default).clone()
    }

    /// A redactor that forgets a value no guard holds `grace` after it
    /// was let go (at most every `grace / 10`, unless the room is needed).
    #[cfg(test)]
    pub(crate) fn forgetting_after(grace: Duration) -> Self {
        Self::forgetting_every(grace, grace / 10)
    }

    /// A redactor that forgets a value no guard holds `grace` after it
    /// was let go, at most every `every` unless the room is needed.
    #[cfg(test)]
    pub(crate) fn forgetting_every(grace: Duration, every: Duration) -> Self {
        let shared = Shared {
            grace,
            forget_every: every,
            ..Shared::default()
        };
        Self {
            shared: Arc::new(shared),
        }
    }

    /// Remembers a secret value for good (see
    /// [`Redactor::try_remember_all`]).
    #[cfg(test)]
    pub fn remember(&self, value: &str) {
        match self.try_remember_all([value]) {
            Ok(held) => held.keep_for_good(),
            Err(full) => panic!("{full}"),
        }
    }

    /// How many forms are remembered (held, or let go within the grace),
    /// and how many of them a guard holds.
    #[cfg(test)]
    pub(crate) fn forms_remembered(&self) -> (usize, usize) {
        let mut held = self.shared.forms.lock().unwrap_or_else(|p| p.into_inner());
        self.shared.count_released(&mut held);
        (held.len(), held.held())
    }

    /// Remembers secret values, and the forms in which each may be
    /// printed: JSON-escaped (an error quoting a document) and
    /// Debug-escaped (an error quoting a string), where they differ from
    /// the raw value; and the same for the value trimmed, where blanks
    /// around it (a secret file's last newline) differ: a lenient number
    /// or flag is read, and quoted when bad, trimmed. A value of up to
    /// 64 KiB also: on one line, percent-encoded (a URL quoted by an
    /// HTTP client's error) and escaped twice; on several, each line of
    /// 16 characters or more (a PEM key logged a line at a time), as
    /// `forms` says. All of them, held
    /// by the guard returned (scrubbed while it lives, and a grace after),
    /// or none with an error where they would pass the process's limits
    /// (`limits`: 256 Ki forms, 8 MiB, counting the forms held or within
    /// their grace; one value of up to 1 MiB of text always fits alone,
    /// and one of up to 512 KiB can be replaced by another as large, both
    /// held at once while the replacement starts):
    /// the caller refuses the component that would use them. The forms let
    /// go of longer ago than the grace are forgotten first (at most once a
    /// minute, unless their room is needed). Give a component's values in
    /// one call: each call that remembers new forms makes a new finder.
    pub fn try_remember_all<'a>(
        &self,
        values: impl IntoIterator<Item = &'a str>,
    ) -> Result<HeldSecrets, String> {
        // Built before the lock is taken.
        let forms: BTreeSet<String> = values.into_iter().flat_map(forms_to_scrub).collect();
        if forms.is_empty() {
            return Ok(HeldSecrets::default());
        }
        let mut held = self.shared.forms.lock().unwrap_or_else(|p| p.into_inner());
        self.shared.count_released(&mut held);
        let (now, grace) = (Instant::now(), self.shared.grace);
        let mut forgot = held.forget_released(now, grace, self.shared.forget_every);
        let mut room = room_for(&held, &forms);
        if room.is_err() && !forgot {
            // The room is needed: what is past its grace goes now.
            forgot = held.forget_released(now, grace, Duration::ZERO);
            room = room_for(&held, &forms);
        }
        let (added, refused): (Vec<Arc<str>>, _) = match room {
            Ok(new) => (
                new.into_iter().map(|f| Arc::from(f.as_str())).collect(),
                None,
            ),
            Err(full) => (Vec::new(), Some(full)),
        };
        // Made here, one writer at a time, so that no value remembered is
        // missing from the finder in force once this returns; readers go
        // on with the last one meanwhile. (A panic while it is made, none
        // expected: allocation failure aborts, leaves a finder that finds
        // forms forgotten: more is scrubbed, never less.)
        if forgot {
            // Built whole, so that the forgotten are no longer scrubbed.
            let all = held.forms().cloned().chain(added.iter().cloned());
            let finder = Finder::of_all(all.collect());
            self.shared.finder.store(Arc::new(finder));
        } else if !added.is_empty() {
            let finder = self.shared.finder.load().with(added.clone());
            self.shared.finder.store(Arc::new(finder));
        }
        if let Some(full) = refused {
            return Err(full);
        }
        // The new forms kept as the finder has them, not copied again.
        let mut added = added.into_iter().peekable();
        let kept = forms
            .iter()
            .map(|form| {
                let new = added.next_if(|new| **new == **form);
                held.hold(form, new)
            })
            .collect();
        Ok(HeldSecrets::new(self.shared.clone(), kept))
    }

    /// `text` without URL credentials ([`without_credentials`]) and with
    /// every remembered secret value replaced by `[redacted]`. Every
    /// occurrence of every value, and every URL credential, is found in
    /// the text as given first (a remembered URL is found whole, not only
    /// its password), and the overlapping or adjacent ones are replaced as
    /// one: no part of a secret survives next to another. One pass over
    /// the text finds every value, however many are remembered.
    pub fn scrub(&self, text: &str) -> String {
        self.scrub_spans(text, Vec::new())
    }

    /// `text` scrubbed as by [`Redactor::scrub`], and of `values` too
    /// (in all their forms), which are not remembered: for an error met
    /// while a component's values are read, before they are remembered
    /// together.
    pub(crate) fn scrub_with<'a>(
        &self,
        text: &str,
        values: impl IntoIterator<Item = &'a str>,
    ) -> String {
        let mut spans = Vec::new();
        for form in values.into_iter().flat_map(forms_to_scrub) {
            spans.extend(occurrences(text, &form));
        }
        self.scrub_spans(text, spans)
    }

    /// `text` with `spans`, the remembered forms and URL credentials
    /// replaced, the overlapping or adjacent ones as one.
    fn scrub_spans(&self, text: &str, mut spans: Vec<Range<usize>>) -> String {
        spans.extend(url_credentials::credential_spans(text));
        spans.extend(self.shared.finder.load().spans(text));
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

/// The forms of `forms` that `held` does not remember, if they fit in the
/// process's limits with those it does.
fn room_for<'f>(held: &HeldForms, forms: &'f BTreeSet<String>) -> Result<Vec<&'f String>, String> {
    let new: Vec<&String> = forms.iter().filter(|form| !held.contains(form)).collect();
    let bytes: usize = new.iter().map(|form| form.len()).sum();
    limits::check_room(held.len(), held.bytes(), new.len(), bytes)?;
    Ok(new)
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
    fn overlapping_secrets_are_scrubbed_whole_by_the_matcher_too() {
        // Remembered with more than are searched one by one: in the matcher.
        let redactor = Redactor::default();
        let fillers: Vec<String> = (0..PENDING_MAX).map(|i| format!("filler-{i}")).collect();
        let values = ["abcdef", "defghi", "abab", "hunter2", "hunter2-extra"];
        let all = fillers.iter().map(String::as_str).chain(values);
        let _held = redactor.try_remember_all(all).expect("fits");
        assert_eq!(redactor.shared.finder.load().pending(), 0);
        assert_eq!(redactor.scrub("x abcdefghi y"), "x [redacted] y");
        assert_eq!(redactor.scrub("abcdefdefghi!"), "[redacted]!");
        assert_eq!(redactor.scrub("ababab."), "[redacted].");
        assert_eq!(redactor.scrub("é abcdef é"), "é [redacted] é");
        assert_eq!(
            redactor.scrub("auth hunter2-extra then hunter2, ab"),
            "auth [redacted] then [redacted], ab"
        );
        // One more is searched alone until the next build, then merged
        // with the matcher's spans.
        redactor.remember("ghi-jkl");
        assert_eq!(redactor.shared.finder.load().pending(), 1);
        assert_eq!(redactor.scrub("abcdefghi-jkl."), "[redacted].");
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
    fn a_value_percent_encoded_in_a_url_is_scrubbed() {
        let redactor = Redactor::default();
        redactor.remember("p@ss word/1");
        for (text, left) in [
            (
                "GET /x?pw=p%40ss%20word%2F1 failed",
                "GET /x?pw=[redacted] failed",
            ),
            ("GET /x?a=1&pw=p%40ss+word%2F1", "GET /x?a=1&pw=[redacted]"),
            (
                "http://h/x?pw=p@ss%20word/1#top",
                "http://h/x?pw=[redacted]#top",
            ),
        ] {
            let scrubbed = redactor.scrub(text);
            assert_eq!(scrubbed, left);
            assert!(!scrubbed.contains("ss%20word") && !scrubbed.contains("ss+word"));
        }
    }

    #[test]
    fn a_value_escaped_twice_is_scrubbed() {
        let redactor = Redactor::default();
        let value = "pa\"ss\\word";
        redactor.remember(value);
        let once = serde_json::to_string(value).unwrap_or_default();
        let twice = serde_json::to_string(&format!("error: {once}")).unwrap_or_default();
        let scrubbed = redactor.scrub(&format!("{{\"message\":{twice}}}"));
        assert_eq!(scrubbed, "{\"message\":\"error: \\\"[redacted]\\\"\"}");
    }

    /// Failed before: the log writer showed the password of an address
    /// given without a scheme (a gRPC endpoint, `user:pw@collector:4317`).
    #[test]
    fn a_logged_address_without_a_scheme_is_scrubbed() {
        let redactor = Redactor::default();
        let mut log = RedactingWriter {
            inner: Vec::new(),
            redactor: redactor.clone(),
        };
        let line = "INFO Tracing: exporting spans over OTLP. endpoint=user:pw-9x@collector:4317 mail=me@example.com\n";
        log.write_all(line.as_bytes()).expect("written");
        assert_eq!(
            String::from_utf8_lossy(&log.inner),
            "INFO Tracing: exporting spans over OTLP. endpoint=user:[redacted]@collector:4317 mail=me@example.com\n"
        );
        // Remembered too: replaced once, as one.
        redactor.remember("pw-9x-remembered");
        assert_eq!(
            redactor.scrub("dial \"user:pw-9x-remembered@collector:4317\""),
            "dial \"user:[redacted]@collector:4317\""
        );
    }

    #[test]
    fn a_pem_key_logged_a_line_at_a_time_is_scrubbed() {
        let redactor = Redactor::default();
        let lines = [
            "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7",
            "VJTUt9Us8cKjMzEfYyjiWA4R4/M2bS1GB4t7NXp98C3SC6dVMvDuictG",
        ];
        let pem = format!(
            "-----BEGIN PRIVATE KEY-----\n{}\n{}\n-----END PRIVATE KEY-----\n",
            lines[0], lines[1]
        );
        redactor.remember(&pem);
        for line in lines {
            assert_eq!(
                redactor.scrub(&format!("key line: {line}")),
                "key line: [redacted]"
            );
        }
        // Escaped twice: its line breaks as `\\n`.
        let twice = pem.replace('\n', "\\\\n");
        let scrubbed = redactor.scrub(&twice);
        assert!(
            !lines.iter().any(|line| scrubbed.contains(line)),
            "{scrubbed}"
        );
        // Its armour is no secret.
        assert_eq!(
            redactor.scrub("expected -----BEGIN PRIVATE KEY-----"),
            "expected -----BEGIN PRIVATE KEY-----"
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
        let fields = metadata.as_object().cloned().unwrap_or_default();
        let values = secret_field_values(&fields);
        let _held = redactor
            .try_remember_all(values.iter().map(String::as_str))
            .expect("fits");
        assert_eq!(
            redactor.scrub("auth hunter2 failed for app||"),
            "auth [redacted] failed for app||"
        );
    }

    #[test]
    fn scrubbing_takes_one_pass_whatever_the_number_of_values() {
        // A pushed store's 150,000 secret-named fields: each scrub used to
        // search the text once a value.
        let redactor = Redactor::default();
        let values: Vec<String> = (0..150_000).map(|i| format!("v{i:06}")).collect();
        let fit = redactor.try_remember_all(values.iter().map(String::as_str));
        let _held = fit.expect("fits");
        let mut text = "status line, nothing secret; ".repeat(360);
        text.push_str("v149999 and v000000 and v07500");
        assert!(text.len() >= 10 * 1024);
        let mut scrubbed = String::new();
        let steps = matcher::tests::steps_of(|| scrubbed = redactor.scrub(&text));
        assert!(
            scrubbed.ends_with("; [redacted] and [redacted] and v07500"),
            "{}",
            &scrubbed[scrubbed.len() - 60..]
        );
        // At most 2 transitions a byte, each comparing up to 256 siblings,
        // and a search for each form remembered since the matcher's build.
        let bound = (2 * 257 + PENDING_MAX) * text.len();
        assert!(steps <= bound, "{steps} steps");
    }

    #[test]
    fn values_past_the_limits_are_refused_not_others_forgotten() {
        let redactor = Redactor::default();
        redactor.remember("hunter2-kept");
        let huge = "k".repeat(limits::MAX_BYTES);
        let refused = redactor.try_remember_all(["another-one", huge.as_str()]);
        let Err(message) = refused else {
            panic!("{} bytes of secrets remembered", huge.len());
        };
        assert!(
            message.contains("cannot remember its secret values (new forms: 2,"),
            "{message}"
        );
        assert!(!message.contains("kkkk"), "{message}");
        // All or none: what fits stays, nothing of the refused is kept.
        assert_eq!(
            redactor.scrub("hunter2-kept another-one"),
            "[redacted] another-one"
        );
        let many: Vec<String> = (0..=limits::MAX_FORMS).map(|i| format!("{i:07}")).collect();
        assert!(redactor
            .try_remember_all(many.iter().map(String::as_str))
            .is_err());
    }

    #[test]
    fn scrubbing_never_waits_on_a_value_being_remembered() {
        // The panic hook scrubs: a panic while remembering must not leave
        // it waiting on the lock the panicking thread holds.
        let redactor = Redactor::default();
        redactor.remember("hunter2-held");
        let _held = redactor.shared.forms.lock();
        assert_eq!(redactor.scrub("auth hunter2-held"), "auth [redacted]");
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
