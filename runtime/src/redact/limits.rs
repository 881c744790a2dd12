//! How many secret forms the redactor remembers: bounded, counting those
//! a component holds and those let go of within the grace (a retired
//! component's value may still be printed meanwhile); older ones are
//! forgotten, so values rotated in and out keep within the bound.
//!
//! A form costs its bytes, about 100 bytes held in the set, and at most
//! 20 bytes a byte in the matchers (one state a byte at worst, far fewer
//! where forms share their beginnings, as a value's forms do), built
//! anew in part when values are remembered (`finder`) and whole when old
//! ones are forgotten, the finder in use kept meanwhile: at the limits
//! about 25 MiB of set plus 8 MiB of forms, and at worst 160 MiB of
//! matchers (twice that while one is built whole). Past them a component
//! is refused, never a value in force forgotten: one whose own inline
//! secret values would take more than a component's share at
//! validation, one whose values would fill the process's room when it
//! starts.
//!
//! A value of up to 64 KiB (`forms::EXTRA_FORMS_UP_TO`) is remembered
//! in more forms (`forms`): on one line, also percent-encoded and
//! escaped twice (a password with a blank and a quote: about 8 times its
//! size in 6 forms); on several, also each line (a 3 KiB PEM key: 5
//! times its size, 15 KiB, in about 50 forms; 7 times with its line
//! breaks escaped, as in an environment variable). At worst (control
//! characters, blanks around them) its forms take 40 times its size,
//! 2.5 MiB: one of these can always be replaced by another as large. The
//! sizes below are of larger values, which keep the first 4 forms only.
//!
//! One value of up to [`ONE_VALUE_FITS`] (1 MiB) always fits in a
//! process that holds nothing else, where its JSON and Debug escapes add
//! at most half its size each (any text of line breaks, tabs and quotes:
//! a PEM chain, a CA bundle, a kubeconfig: its 4 forms, raw, escaped and
//! both trimmed, take about 4.1 times its size); one of control
//! characters, escaped 6 bytes a byte, up to 8 MiB / 26 (315 KiB).
//!
//! Replacing a value (a secret rotated) holds the old and the new at
//! once: the replacement's values are remembered before the component it
//! replaces lets go of its own. One value of text up to [`ROTATES`]
//! (512 KiB: even escaped 2 bytes a byte, the 4 forms of two such take
//! 6 MiB) can always be replaced in a process that holds nothing else; a
//! PEM chain or CA bundle (4.03 times its size) up to 960 KiB too
//! (7.6 MiB). A larger one fits, but a value as large cannot replace it
//! while it runs: the refusal says so.

use std::collections::BTreeSet;

use serde_json::{Map, Value};

/// The forms the process remembers at most.
pub(super) const MAX_FORMS: usize = 256 * 1024;
/// Their bytes at most.
pub(super) const MAX_BYTES: usize = 8 * 1024 * 1024;
/// A value of text this long fits alone (see the module's docs): its 4
/// forms take at most 2 * (1 + 1.5 + 1.5) times it, [`MAX_BYTES`].
pub(super) const ONE_VALUE_FITS: usize = MAX_BYTES / 8;
/// A value of text this long can be replaced by another as long (see the
/// module's docs): both held at once, their forms take at most
/// 2 * 2 * (1 + 2) times it, 6 MiB.
pub(super) const ROTATES: usize = MAX_BYTES / 16;
/// The forms one component's inline secret values may take.
const COMPONENT_MAX_FORMS: usize = 4096;
/// Their bytes at most.
const COMPONENT_MAX_BYTES: usize = 256 * 1024;

/// An error where `new` forms of `new_bytes` would take the process's
/// remembered `held` forms of `held_bytes` past the limits.
pub(super) fn check_room(
    held: usize,
    held_bytes: usize,
    new: usize,
    new_bytes: usize,
) -> Result<(), String> {
    if held + new <= MAX_FORMS && held_bytes + new_bytes <= MAX_BYTES {
        return Ok(());
    }
    let wanted = format!(
        "cannot remember its secret values (new forms: {new}, {new_bytes} bytes) to scrub from logs \
         and errors"
    );
    let most = format!(
        "a process remembers at most {MAX_FORMS} forms ({MAX_BYTES} bytes; a value of text up to \
         {ONE_VALUE_FITS} bytes takes about 4 times its size and fits alone, one up to {ROTATES} \
         bytes can also be replaced)"
    );
    if new > MAX_FORMS || new_bytes > MAX_BYTES {
        return Err(format!("{wanted}: more than {most}"));
    }
    let grace = super::held::FORGET_AFTER.as_secs() / 60;
    let remembered = format!(
        "the process remembers {held} already ({held_bytes} bytes: those of the components \
         running, the values of the one this replaces among them, and of those retired in the \
         last {grace} minutes, which may still be printed)"
    );
    if 2 * new_bytes > MAX_BYTES || 2 * new > MAX_FORMS {
        // Whatever ages out, values as large as these held by a running
        // component (the one being replaced) leave no room for them.
        return Err(format!(
            "{wanted}: {remembered}; these take more than half of what {most}: replacing values \
             this large needs room for the old and the new at once"
        ));
    }
    Err(format!(
        "{wanted}: {remembered}; replacing values needs room for the old and the new at once, and \
         only the retired ones' is freed (as they age out); {most}"
    ))
}

/// The problem of a component whose metadata holds more inline values in
/// fields named like a secret than one component may have remembered
/// ([`COMPONENT_MAX_FORMS`], [`COMPONENT_MAX_BYTES`]); `None` where they
/// fit. Counted in the forms the redactor would remember.
pub(crate) fn too_many_secret_values(metadata: &Map<String, Value>) -> Option<String> {
    let all = super::secret_fields::secret_field_values(metadata);
    // Those that take forms, each once (the same key in several fields
    // is remembered once; one too short to scrub, not at all).
    let values: BTreeSet<&str> = all
        .iter()
        .map(String::as_str)
        .filter(|value| value.len() >= super::MIN_SCRUBBED_LEN)
        .collect();
    let raw_bytes: usize = values.iter().map(|value| value.len()).sum();
    // Each value takes a form or more, of its bytes or more: past the
    // limits without building them.
    let past_already = values.len() > COMPONENT_MAX_FORMS || raw_bytes > COMPONENT_MAX_BYTES;
    let (forms, bytes, at_least) = if past_already {
        (values.len(), raw_bytes, " or more")
    } else {
        let forms: BTreeSet<String> = values
            .iter()
            .flat_map(|value| super::forms_to_scrub(value))
            .collect();
        (forms.len(), forms.iter().map(String::len).sum(), "")
    };
    if forms <= COMPONENT_MAX_FORMS && bytes <= COMPONENT_MAX_BYTES {
        return None;
    }
    Some(format!(
        "metadata holds {} distinct values in fields named like a secret, {forms}{at_least} forms \
         ({bytes}{at_least} bytes) to remember to scrub them from logs and errors: a component \
         may have at most {COMPONENT_MAX_FORMS} ({COMPONENT_MAX_BYTES} bytes)",
        values.len()
    ))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::redact::Redactor;

    /// A PEM chain of about `size` bytes, with line breaks inside and a
    /// last one: 4 forms (raw, JSON-escaped, both trimmed).
    fn pem_chain(size: usize) -> String {
        let line = "MIIDdzCCAl+gAwIBAgIEAgAAuTANBgkqhkiG9w0BAQUFADBaMQswCQYDVQQGEwJJ\n";
        let mut pem = String::from("-----BEGIN CERTIFICATE-----\n");
        let mut i = 0;
        while pem.len() < size {
            // Distinct lines, as a real chain's are.
            pem.push_str(&format!("{i:08}{}", &line[8..]));
            i += 1;
        }
        pem.push_str("-----END CERTIFICATE-----\n");
        pem
    }

    #[test]
    fn one_large_pem_chain_fits_in_a_fresh_process() {
        for size in [600 * 1000, ONE_VALUE_FITS - 64] {
            let pem = pem_chain(size);
            let held = Redactor::default().try_remember_all([pem.as_str()]);
            assert!(held.is_ok(), "{size}: {}", held.err().unwrap_or_default());
        }
    }

    /// Text of `size` bytes that escapes 2 bytes a byte but at its ends,
    /// which are not blank: its 4 forms take about 6 times its size.
    fn quotes(size: usize, first: char) -> String {
        format!("{first}{}{first}\n", "\"".repeat(size - 3))
    }

    #[test]
    fn a_value_of_the_size_that_rotates_can_be_replaced_by_another_as_large() {
        let pems = (
            pem_chain(960 * 1024 - 64),
            pem_chain(960 * 1024 - 64).replace('0', "1"),
        );
        let texts = (quotes(ROTATES, 'a'), quotes(ROTATES, 'b'));
        for (old, new) in [pems, texts] {
            assert_eq!(old.len(), new.len());
            let redactor = Redactor::default();
            let _running = redactor
                .try_remember_all([old.as_str()])
                .expect("fits alone");
            let replacing = redactor.try_remember_all([new.as_str()]);
            assert!(replacing.is_ok(), "{}", replacing.err().unwrap_or_default());
        }
        // Past it, a PEM chain fits alone but cannot be replaced.
        let (old, new) = (
            pem_chain(ONE_VALUE_FITS - 64),
            pem_chain(ONE_VALUE_FITS - 64).replace('0', "1"),
        );
        let redactor = Redactor::default();
        let _running = redactor
            .try_remember_all([old.as_str()])
            .expect("fits alone");
        let refused = redactor
            .try_remember_all([new.as_str()])
            .err()
            .unwrap_or_default();
        assert!(
            refused.contains("needs room for the old and the new at once"),
            "{refused}"
        );
    }

    #[test]
    fn a_value_of_the_extra_forms_size_can_be_replaced_by_another_as_large() {
        // The worst case of the extra forms: control characters (escaped
        // 6 bytes a byte, twice 7, percent-encoded 3), blanks around.
        let size = super::super::forms::EXTRA_FORMS_UP_TO;
        let worst = |first: char| format!(" {first}{} ", "\u{1}".repeat(size - 3));
        let (old, new) = (worst('a'), worst('b'));
        let forms = super::super::forms_to_scrub(&old);
        let bytes: usize = forms.iter().map(String::len).sum();
        assert!(bytes <= 40 * old.len(), "{bytes} bytes of forms");
        let redactor = Redactor::default();
        let _running = redactor
            .try_remember_all([old.as_str()])
            .expect("fits alone");
        let replacing = redactor.try_remember_all([new.as_str()]);
        assert!(replacing.is_ok(), "{}", replacing.err().unwrap_or_default());
    }

    #[test]
    fn a_refusal_says_what_the_limit_is_and_promises_no_restart() {
        let alone = check_room(0, 0, 4, MAX_BYTES + 1).err().unwrap_or_default();
        assert!(
            alone.contains("more than a process remembers at most"),
            "{alone}"
        );
        let full = check_room(10, MAX_BYTES - 5, 1, 10)
            .err()
            .unwrap_or_default();
        assert!(full.contains("only the retired ones' is freed"), "{full}");
        assert!(
            full.contains("room for the old and the new at once"),
            "{full}"
        );
        let large = check_room(4, ONE_VALUE_FITS * 4, 4, ONE_VALUE_FITS * 4 + 64)
            .err()
            .unwrap_or_default();
        assert!(
            large.contains("replacing values this large needs room for the old and the new"),
            "{large}"
        );
        assert!(!large.contains("freed"), "{large}");
        assert!(full.contains(&format!("at most {MAX_FORMS} forms ({MAX_BYTES} bytes")));
        for message in [alone, full, large] {
            assert!(!message.contains("restart"), "{message}");
        }
    }

    #[test]
    fn values_too_short_to_scrub_or_repeated_are_not_counted() {
        // 5,000 secret-named fields left empty take no form at all.
        let empty: Map<String, Value> = (0..5_000)
            .map(|i| (format!("token{i}"), json!("")))
            .collect();
        assert_eq!(too_many_secret_values(&empty), None);
        // The same 100 KiB key in three fields is remembered once.
        let key = "k".repeat(100 * 1024);
        let three: Map<String, Value> = ["apiKey", "secretKey", "privateKey"]
            .into_iter()
            .map(|name| (name.to_string(), json!(key)))
            .collect();
        assert_eq!(too_many_secret_values(&three), None);
        // Three distinct ones are 300 KiB: past a component's share.
        let distinct: Map<String, Value> = ["apiKey", "secretKey", "privateKey"]
            .into_iter()
            .map(|name| (name.to_string(), json!(format!("{name}{key}"))))
            .collect();
        let problem = too_many_secret_values(&distinct).unwrap_or_default();
        assert!(
            problem.starts_with("metadata holds 3 distinct values"),
            "{problem}"
        );
    }
}
