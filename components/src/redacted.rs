//! How the components show a secret in their `Debug` output and errors.

/// `<redacted>` for a set secret, nothing for an empty one (so a missing
/// password still shows as missing).
pub(crate) fn redacted(secret: &str) -> &'static str {
    if secret.is_empty() {
        ""
    } else {
        "<redacted>"
    }
}

/// A comma-separated list of addresses (or URLs) as written in metadata,
/// fit for an error or a log: in each part (see [`address_parts`]), what
/// comes before the last `@` (and after a `scheme://`) is taken as
/// credentials, and replaced by `[redacted]` but for the user's name.
/// Unlike [`without_credentials`](rewire_runtime::without_credentials), it
/// holds for text no URL parser accepted (a password with a `/`, a `,` or a
/// space).
pub(crate) fn shown_addresses(text: &str) -> String {
    address_parts(text)
        .into_iter()
        .map(shown_address)
        .collect::<Vec<_>>()
        .join(",")
}

/// The parts of a comma-separated list of addresses, as written (neither
/// trimmed nor blanks dropped), a `,` written in credentials not taken as a
/// separator: from where a part starts, the text up to the last `@` before
/// the next piece that starts with `scheme://` (or the end) is one part, so
/// `redis://:pa,ss@h:1` is one part, and so is `a:1,root:pa,ss@h:1`.
pub(crate) fn address_parts(text: &str) -> Vec<&str> {
    let mut pieces = Vec::new();
    let mut start = 0;
    for (at, _) in text.match_indices(',') {
        pieces.push((start, at));
        start = at + 1;
    }
    pieces.push((start, text.len()));
    let mut parts = Vec::with_capacity(pieces.len());
    let mut i = 0;
    while i < pieces.len() {
        let segment_end = (i + 1..pieces.len())
            .find(|&j| scheme_of(&text[pieces[j].0..pieces[j].1]).is_some())
            .unwrap_or(pieces.len());
        let last = (i..segment_end)
            .rev()
            .find(|&j| text[pieces[j].0..pieces[j].1].contains('@'))
            .unwrap_or(i);
        parts.push(&text[pieces[i].0..pieces[last].1]);
        i = last + 1;
    }
    parts
}

/// The `scheme` of a part that starts (after blanks) with `scheme://`: an
/// ASCII letter, then letters, digits, `+`, `-` or `.`.
pub(crate) fn scheme_of(part: &str) -> Option<&str> {
    let (scheme, _) = part.trim_start().split_once("://")?;
    let mut chars = scheme.chars();
    let first = chars.next()?;
    (first.is_ascii_alphabetic()
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')))
    .then_some(scheme)
}

fn shown_address(text: &str) -> String {
    let (scheme, rest) = match scheme_of(text) {
        Some(_) => {
            let (before, rest) = text.split_once("://").unwrap_or_default();
            (format!("{before}://"), rest)
        }
        None => (String::new(), text),
    };
    match rest.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo
                .split_once(':')
                .map_or(String::new(), |(user, _)| format!("{user}:"));
            format!("{scheme}{user}[redacted]@{host}")
        }
        None => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_shown_without_credentials() {
        assert_eq!(
            shown_addresses("redis://:hunter2@h:1, root:hunter2@g:2,plain:3"),
            // The text between the two `@` might be a password's.
            "redis://:[redacted]@g:2,plain:3"
        );
        assert_eq!(
            shown_addresses("http://u:pass word/x@h/p, https://tok@h"),
            "http://u:[redacted]@h/p, https://[redacted]@h"
        );
        assert_eq!(shown_addresses("[::1]:2379"), "[::1]:2379");
    }

    #[test]
    fn a_comma_in_credentials_is_not_a_separator() {
        for (text, shown) in [
            ("redis://:pa,ss@h:1", "redis://:[redacted]@h:1"),
            ("http://root:pa,ss@h:2379", "http://root:[redacted]@h:2379"),
            ("root:pa,ss@h:1,g:2", "root:[redacted]@h:1,g:2"),
            ("a:1,redis://:pa,ss@h:1", "a:1,redis://:[redacted]@h:1"),
            (
                "http://u:p,1@a:1,http://u:p,2@b:2",
                "http://u:[redacted]@a:1,http://u:[redacted]@b:2",
            ),
            ("redis://:p@x,y@h:1", "redis://:[redacted]@h:1"),
            (":a://b,c@h:1", ":[redacted]@h:1"),
        ] {
            let got = shown_addresses(text);
            assert_eq!(got, shown, "{text}");
            for secret in ["pa", "ss", "p,", ",1", ",2", "x", "y", "a:/", "b,c"] {
                assert!(!got.contains(secret), "{text}: {got}");
            }
        }
        assert_eq!(
            address_parts("a:1, redis://:pa,ss@h:1 ,b:2,,c"),
            ["a:1", " redis://:pa,ss@h:1 ", "b:2", "", "c"]
        );
    }
}
