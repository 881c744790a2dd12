//! The forms in which a secret value may be printed, each remembered to
//! be scrubbed ([`forms_to_scrub`]).
//!
//! Every value: raw, JSON-escaped and Debug-escaped, and the same
//! trimmed. A value of up to [`EXTRA_FORMS_UP_TO`] (64 KiB) trimmed also:
//! on one line (a password, a token, a key: what goes in a URL or is
//! quoted twice), percent-encoded three ways and escaped twice, where
//! these differ from the raw value; on several lines (a PEM key, a
//! service account's JSON), each line of base64 or hex of at least
//! [`MIN_LINE_CHARS`] characters on its own, and the last line of a PEM
//! body however short, for a value logged a line at a time or escaped
//! twice (`\\n`); other lines (`"type": "service_account",`) are no
//! secret on their own.
//! Larger values (CA bundles, certificate chains) keep the first forms
//! only, so that the limits' promises for them hold (`limits`).

use std::fmt::Write;

use super::MIN_SCRUBBED_LEN;

/// Values up to this long (trimmed) are remembered in their extra forms
/// too (see the module's docs). At worst all its forms take 40 times the
/// value (control characters with blanks around them: escaped 6 bytes a
/// byte, twice 7, percent-encoded 3), 2.5 MiB: a value this long can
/// always be replaced by another as long within the limits (`limits`).
pub(super) const EXTRA_FORMS_UP_TO: usize = 64 * 1024;

/// A line of a multi-line value shorter than this, in characters, is not
/// remembered on its own (but the last of a PEM body): short lines are no
/// secret, and would be scrubbed from every text they appear in.
const MIN_LINE_CHARS: usize = 16;

/// The forms of `value` to scrub, each once: those it may be printed in,
/// those of it trimmed, and its extra forms (see the module's docs);
/// none shorter than [`MIN_SCRUBBED_LEN`].
pub(crate) fn forms_to_scrub(value: &str) -> Vec<String> {
    let mut forms = Vec::new();
    for value in [value, value.trim()] {
        if value.len() >= MIN_SCRUBBED_LEN {
            forms.extend(printed_forms(value));
        }
    }
    let trimmed = value.trim();
    if (MIN_SCRUBBED_LEN..=EXTRA_FORMS_UP_TO).contains(&trimmed.len()) {
        if trimmed.contains('\n') {
            forms.extend(lines_of(trimmed).into_iter().map(str::to_string));
        } else {
            forms.extend(percent_encoded_forms(trimmed));
            forms.extend(escaped_twice(trimmed));
            // A one-line value that holds escaped line breaks (a PEM key
            // in an environment variable) is printed a line at a time
            // once they are read.
            forms.extend(lines_of(trimmed).into_iter().map(str::to_string));
        }
    }
    forms.sort();
    forms.dedup();
    forms
}

/// `value` as written raw, inside a JSON string, and by `{:?}` (quotes
/// stripped).
fn printed_forms(value: &str) -> Vec<String> {
    let mut forms = vec![value.to_string()];
    forms.extend(json_escaped(value));
    forms.extend(debug_escaped(value));
    forms.sort();
    forms.dedup();
    forms
}

/// `value` inside a JSON string, quotes stripped.
fn json_escaped(value: &str) -> Option<String> {
    unquoted(&serde_json::to_string(value).unwrap_or_default())
}

/// `value` as `{:?}` prints it, quotes stripped.
fn debug_escaped(value: &str) -> Option<String> {
    unquoted(&format!("{value:?}"))
}

fn unquoted(quoted: &str) -> Option<String> {
    quoted
        .strip_prefix('"')
        .and_then(|q| q.strip_suffix('"'))
        .map(str::to_string)
}

/// `value` escaped twice (JSON in JSON, Debug in Debug: an error that
/// quotes an error, a JSON log line that quotes a `{:?}`), where escaping
/// changes it.
fn escaped_twice(value: &str) -> Vec<String> {
    let mut forms = Vec::new();
    for escape in [json_escaped, debug_escaped] {
        if let Some(once) = escape(value).filter(|once| once != value) {
            forms.extend(escape(&once));
        }
    }
    forms
}

/// `value` percent-encoded as it is put in a URL, where that changes it:
/// every byte but the unreserved (`A-Za-z0-9-._~`) encoded (a query or
/// path component: `p%40ss%20word`); as a form (`application/x-www-form-urlencoded`,
/// as `reqwest`'s `.query()` and `url`'s `query_pairs_mut` write it:
/// `p%40ss+word`); and with only what a URL cannot hold as is encoded
/// (blanks, controls, quotes, `#<>`, non-ASCII: a URL written with the
/// value and parsed, `p@ss%20word`). Hex digits upper-case, as all of
/// them write them.
fn percent_encoded_forms(value: &str) -> Vec<String> {
    let unreserved = |b: u8| b.is_ascii_alphanumeric() || b"-._~".contains(&b);
    let form = |b: u8| b.is_ascii_alphanumeric() || b"*-._".contains(&b);
    let url_safe = |b: u8| b.is_ascii_graphic() && !b"\"#<>'".contains(&b);
    let forms = [
        percent_encoded(value, unreserved, "%20"),
        percent_encoded(value, form, "+"),
        percent_encoded(value, url_safe, "%20"),
    ];
    forms.into_iter().filter(|form| form != value).collect()
}

/// `value` with every byte but those `kept` (ASCII) percent-encoded, and
/// a space written as `space`.
fn percent_encoded(value: &str, kept: impl Fn(u8) -> bool, space: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for &byte in value.as_bytes() {
        if byte == b' ' {
            out.push_str(space);
        } else if byte.is_ascii() && kept(byte) {
            out.push(char::from(byte));
        } else {
            // Writing to a String cannot fail.
            let _ = write!(out, "%{byte:02X}");
        }
    }
    out
}

/// The lines of `value` to remember on their own, split at line breaks
/// written or escaped (`\n` as two characters), trimmed: those of base64
/// or hex ([`is_encoded`]) of at least [`MIN_LINE_CHARS`] characters, and
/// the last line of a PEM body (just before `-----END …`) of at least
/// [`MIN_SCRUBBED_LEN`]; none where `value` is one line. A PEM armour line
/// (`-----BEGIN …-----`, the same in every key) is none of them.
fn lines_of(value: &str) -> Vec<&str> {
    let lines: Vec<&str> = value
        .split('\n')
        .flat_map(|line| line.split("\\n"))
        .map(|line| line.strip_suffix("\\r").unwrap_or(line).trim())
        .collect();
    if lines.len() < 2 {
        return Vec::new();
    }
    let ends_a_pem_body = |at: usize| {
        lines
            .get(at + 1)
            .is_some_and(|next| next.starts_with("-----END"))
    };
    lines
        .iter()
        .enumerate()
        .filter(|&(at, line)| {
            is_encoded(line)
                && (line.len() >= MIN_LINE_CHARS
                    || (ends_a_pem_body(at) && line.len() >= MIN_SCRUBBED_LEN))
        })
        .map(|(_, line)| *line)
        .collect()
}

/// Whether `line` is base64 (standard or URL-safe, padded or not), hex or
/// a token of them (a JWT's `.`-separated parts): `A-Z`, `a-z`, `0-9`,
/// `+`, `/`, `=`, `_`, `-`, `.`, `~` only (no blank, quote or colon), and
/// not all `-` (an armour's dashes).
fn is_encoded(line: &str) -> bool {
    line.bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"+/=_-.~".contains(&b))
        && !line.bytes().all(|b| b == b'-')
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A JWT a line (`.`-separated base64url) is remembered on its own.
    #[test]
    fn a_multi_line_value_of_tokens_has_each_token_remembered() {
        let first = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.abcDEF";
        let forms = forms_to_scrub(&format!("{first}\nsecond-line-token.part.two"));
        assert!(forms.iter().any(|form| form == first), "{forms:?}");
    }

    #[test]
    fn a_one_line_value_is_remembered_percent_encoded_and_escaped_twice() {
        let forms = forms_to_scrub("p@ss word/1\"x");
        for form in [
            "p@ss word/1\"x",
            "p@ss word/1\\\"x",
            "p@ss word/1\\\\\\\"x",
            "p%40ss%20word%2F1%22x",
            "p%40ss+word%2F1%22x",
            "p@ss%20word/1%22x",
        ] {
            assert!(forms.iter().any(|f| f == form), "{form}: {forms:?}");
        }
        // Nothing to encode or escape: the raw value alone.
        assert_eq!(forms_to_scrub("hunter2-abc"), ["hunter2-abc"]);
    }

    #[test]
    fn a_multi_line_value_is_remembered_line_by_line_but_not_its_armour() {
        let body = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASC";
        let pem = format!(
            "-----BEGIN PRIVATE KEY-----\r\nshort\r\n{body}\r\n-----END PRIVATE KEY-----\n"
        );
        let forms = forms_to_scrub(&pem);
        assert!(forms.iter().any(|f| f == body), "{forms:?}");
        for armour in ["-----BEGIN PRIVATE KEY-----", "-----END PRIVATE KEY-----"] {
            assert!(!forms.iter().any(|f| f == armour), "{forms:?}");
        }
        assert!(!forms.iter().any(|f| f == "short"), "{forms:?}");
        // Not percent-encoded: a multi-line value goes in no URL.
        assert!(!forms.iter().any(|f| f.contains("%0A")), "{forms:?}");
        // Escaped line breaks split it too.
        let escaped = format!("-----BEGIN PRIVATE KEY-----\\n{body}\\n-----END PRIVATE KEY-----");
        assert!(forms_to_scrub(&escaped).iter().any(|f| f == body));
    }

    #[test]
    fn a_value_past_the_extra_forms_size_keeps_the_first_forms_only() {
        let line = "MIIDdzCCAl+gAwIBAgIEAgAAuTANBgkqhkiG9w0BAQUFADBaMQswCQYDVQQGEwJJ\n";
        let bundle = line.repeat(EXTRA_FORMS_UP_TO / line.len() + 1);
        // Raw, JSON-escaped (the same as Debug), both trimmed.
        assert_eq!(forms_to_scrub(&bundle).len(), 4);
        let token = "a b".repeat(EXTRA_FORMS_UP_TO / 3 + 1);
        assert_eq!(forms_to_scrub(&token), [token]);
    }

    #[test]
    fn only_encoded_lines_of_a_multi_line_value_are_remembered_on_their_own() {
        let key_line = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7";
        let account = format!(
            "{{\n  \"type\": \"service_account\",\n  \"project_id\": \"payments-prod\",\n  \
             \"private_key\": \"-----BEGIN PRIVATE KEY-----\\n{key_line}\\nAbCd==\\n-----END PRIVATE KEY-----\\n\",\n  \
             \"auth_uri\": \"https://accounts.google.com/o/oauth2/auth\",\n}}"
        );
        let forms = forms_to_scrub(&account);
        for plain in [
            "\"type\": \"service_account\",",
            "\"auth_uri\": \"https://accounts.google.com/o/oauth2/auth\",",
        ] {
            assert!(!forms.iter().any(|f| f == plain), "{plain}: {forms:?}");
        }
        assert!(forms.iter().any(|f| f == key_line), "{forms:?}");
        // The last line of the PEM body, however short, is remembered.
        assert!(forms.iter().any(|f| f == "AbCd=="), "{forms:?}");
        let pem =
            format!("-----BEGIN PRIVATE KEY-----\n{key_line}\nAbCd==\n-----END PRIVATE KEY-----\n");
        assert!(forms_to_scrub(&pem).iter().any(|f| f == "AbCd=="));
    }
}
