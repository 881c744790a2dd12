//! [`without_credentials`]: the passwords and tokens of URLs in a text.

use std::borrow::Cow;
use std::ops::Range;

/// What replaces a URL's password or token.
const REDACTED: &str = "[redacted]";

/// `text` with the credentials of every URL in it redacted:
/// `scheme://user:pass@host` becomes `scheme://user:[redacted]@host`, and
/// `scheme://token@host` (a token passed as the user) becomes
/// `scheme://[redacted]@host`.
///
/// A URL's authority starts after `://` and ends at `/`, `?`, `#`,
/// whitespace, a quote, a backtick, `<`, `>` or the end of the text; its
/// userinfo ends at the last `@` inside it, so a password holding an `@`
/// is redacted whole. A password may hold an unencoded `/`, `?` or `#`
/// too (a generated, base64-like one): where the authority has no `@` but
/// is `user:` (or `:`) and something, the userinfo ends at the last `@`
/// before the next whitespace, quote or URL, if a host follows it: the
/// password runs up to there. One exception keeps an `@` in a query value
/// of a plain URL: where the authority is `host:digits` (a host and a
/// port) and a query follows (a `?` before any `#`), an `@` after the
/// query's first `=` (before any `#`) does not end the userinfo. Any other
/// authority (`user:abc`, `:x`, `user:1a`) may be `user:password`, and its
/// `?` may be in the password, so the last `@` is used: when in doubt,
/// more is redacted. So `http://host/a?x=u@h`, `http://host:8080/a?x=u@h`
/// and `http://[::1]:80/a@h` are left as they are; `http://host:8080/a@h`
/// and `http://host:abc/a?x=u@h` are read as `user:password@host`.
/// Still shown (indistinguishable from a port, a path and a query value):
/// a password of digits up to a `/` or `?` that holds a `?`, then a `=`,
/// with no `#` before them (`u:12/a?b=c@h`). Text without such a URL is
/// returned as is.
///
/// ```
/// use rewire_runtime::without_credentials;
///
/// assert_eq!(
///     without_credentials("`redis://:hunter2@127.0.0.1:6379` is not host:port"),
///     "`redis://:[redacted]@127.0.0.1:6379` is not host:port"
/// );
/// assert_eq!(
///     without_credentials("https://ghp_abc@example.com/x"),
///     "https://[redacted]@example.com/x"
/// );
/// assert_eq!(
///     without_credentials("redis://:Zm9v/YmFy+cXV4@db:6379"),
///     "redis://:[redacted]@db:6379"
/// );
/// assert_eq!(without_credentials("http://h:2379"), "http://h:2379");
/// ```
pub fn without_credentials(text: &str) -> Cow<'_, str> {
    let spans = credential_spans(text);
    if spans.is_empty() {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    let mut copied = 0;
    for span in spans {
        out.push_str(&text[copied..span.start]);
        out.push_str(REDACTED);
        copied = span.end;
    }
    out.push_str(&text[copied..]);
    Cow::Owned(out)
}

/// Where the credentials of the URLs in `text` are (see
/// [`without_credentials`]), in order and apart: the redactor merges them
/// with the remembered secrets it finds in the same text.
pub(crate) fn credential_spans(text: &str) -> Vec<Range<usize>> {
    let mut spans: Vec<Range<usize>> = Vec::new();
    let mut from = 0;
    while let Some(found) = text[from..].find("://") {
        let start = from + found + "://".len();
        let end = text[start..]
            .find(ends_authority)
            .map_or(text.len(), |i| start + i);
        // Not `end`: the `:` of a next `://` may be inside this authority.
        from = start;
        // Inside a password already redacted.
        if spans.last().is_some_and(|last| start < last.end) {
            continue;
        }
        let at = match text[start..end].rfind('@') {
            Some(at) => start + at,
            None => match userinfo_past_authority(text, start, end) {
                Some(at) => at,
                None => continue,
            },
        };
        let userinfo = &text[start..at];
        // A user with a password keeps its name; a lone user is a token.
        let secret_start = match userinfo.find(':') {
            Some(colon) => start + colon + 1,
            None => start,
        };
        let secret = &text[secret_start..at];
        if secret.is_empty() || secret == REDACTED {
            continue;
        }
        spans.push(secret_start..at);
    }
    spans
}

/// Whether `c` ends a URL's authority (as far as finding credentials goes).
fn ends_authority(c: char) -> bool {
    matches!(c, '/' | '?' | '#') || ends_url(c)
}

/// Whether `c` ends a URL in a text.
fn ends_url(c: char) -> bool {
    matches!(c, '"' | '\'' | '`' | '<' | '>') || c.is_whitespace()
}

/// Where the userinfo of the URL whose authority (without an `@`) is
/// `text[start..end]` ends, if its password holds a `/`, `?` or `#`: the
/// authority is `user:` (or `:`) and something (a port too: a password of
/// digits is one), and ends at one of them; the userinfo ends at the last
/// `@` before the end of the URL (or the next `://`) which a host follows,
/// and, where the authority is `host:digits`, before its query's first `=`.
fn userinfo_past_authority(text: &str, start: usize, end: usize) -> Option<usize> {
    if !text[end..].starts_with(['/', '?', '#']) {
        return None;
    }
    let authority = &text[start..end];
    let (user, after_colon) = authority.split_once(':')?;
    if !user.chars().all(is_userinfo_char) {
        return None;
    }
    // `host:` (an empty port) has no password; `:` alone may start one.
    if !user.is_empty() && after_colon.is_empty() {
        return None;
    }
    let rest = &text[end..];
    let rest = &rest[..rest.find(ends_url).unwrap_or(rest.len())];
    let rest = &rest[..rest.find("://").unwrap_or(rest.len())];
    // Only a plain `host:port` may have a query: elsewhere a `?` may be in
    // the password.
    let is_host_and_port = !user.is_empty() && after_colon.bytes().all(|b| b.is_ascii_digit());
    let rest = if is_host_and_port {
        before_query_value(rest)
    } else {
        rest
    };
    let at = end + rest.rfind('@')?;
    let host = text[at + 1..].chars().next()?;
    (host.is_alphanumeric() || host == '[').then_some(at)
}

/// `rest` (what follows a `host:port`) up to its query's first `=`: an `@`
/// after it is in a query value (`?email=a@b.com`), not a userinfo's end.
/// The query starts at a `?` before any `#` and ends at a `#`.
fn before_query_value(rest: &str) -> &str {
    let Some(query) = rest
        .find(['?', '#'])
        .filter(|&i| rest[i..].starts_with('?'))
    else {
        return rest;
    };
    let query_end = rest[query..].find('#').map_or(rest.len(), |i| query + i);
    match rest[query..query_end].find('=') {
        Some(eq) => &rest[..query + eq],
        None => rest,
    }
}

/// Whether `c` may stand in a URL's user name (RFC 3986 `userinfo`
/// before its `:`, non-ASCII letters allowed).
fn is_userinfo_char(c: char) -> bool {
    c.is_alphanumeric() || "-._~%!$&'()*+,;=".contains(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_the_password_and_keeps_the_user() {
        assert_eq!(
            without_credentials("http://root:hunter2@h:2379"),
            "http://root:[redacted]@h:2379"
        );
        assert_eq!(
            without_credentials("redis://:hunter2@127.0.0.1:6379/0"),
            "redis://:[redacted]@127.0.0.1:6379/0"
        );
    }

    #[test]
    fn redacts_a_lone_user_as_a_token() {
        assert_eq!(
            without_credentials("git clone https://ghp_token@github.com/a/b"),
            "git clone https://[redacted]@github.com/a/b"
        );
    }

    #[test]
    fn uses_the_last_at_of_the_authority_and_stops_at_its_end() {
        assert_eq!(
            without_credentials("http://u:p@ss@h/path@x?q=a@b#c@d"),
            "http://u:[redacted]@h/path@x?q=a@b#c@d"
        );
        assert_eq!(
            without_credentials("\"http://u:pw@h\" and `https://t@[::1]:80`, <ws://a:b@c>"),
            "\"http://u:[redacted]@h\" and `https://[redacted]@[::1]:80`, <ws://a:[redacted]@c>"
        );
        assert_eq!(
            without_credentials("http://h mail me@example.com"),
            "http://h mail me@example.com"
        );
    }

    #[test]
    fn finds_every_url_and_leaves_text_without_credentials_as_is() {
        assert_eq!(
            without_credentials("a,redis://:one@h1:1,redis://:two@h2:2 end"),
            "a,redis://:[redacted]@h1:1,redis://:[redacted]@h2:2 end"
        );
        for plain in [
            "",
            "http://h:1/x",
            "no url",
            "http://@h",
            "http://u:@h",
            "://",
        ] {
            assert!(
                matches!(without_credentials(plain), Cow::Borrowed(_)),
                "{plain}"
            );
        }
        // Idempotent.
        let once = without_credentials("http://u:p@h").into_owned();
        assert_eq!(without_credentials(&once), once);
    }

    #[test]
    fn redacts_a_password_holding_a_slash_question_mark_or_hash() {
        for (url, shown) in [
            (
                "redis://:Zm9v/YmFy+cXV4@db:6379",
                "redis://:[redacted]@db:6379",
            ),
            (
                "redis://default:Zm9v/YmFy@db:6379/0",
                "redis://default:[redacted]@db:6379/0",
            ),
            ("http://u:a?b#c/d@h/x", "http://u:[redacted]@h/x"),
            ("http://u:p/q@ss@h:1/x", "http://u:[redacted]@h:1/x"),
            (
                "redis://:1234/5678@[::1]:6379",
                "redis://:[redacted]@[::1]:6379",
            ),
        ] {
            assert_eq!(without_credentials(url), shown);
            let quoted = format!("connect `{url}`: refused, also http://h:1/x?m=a@y");
            assert_eq!(
                without_credentials(&quoted),
                format!("connect `{shown}`: refused, also http://h:1/x?m=a@y")
            );
        }
        // Up to the next URL, which is redacted on its own.
        assert_eq!(
            without_credentials("redis://:a/b@h1:1,redis://:c/d@h2:2,x"),
            "redis://:[redacted]@h1:1,redis://:[redacted]@h2:2,x"
        );
        assert_eq!(
            without_credentials("http://u:a://b@h"),
            "http://u:[redacted]@h"
        );
    }

    #[test]
    fn leaves_an_at_in_the_path_or_query_of_a_url_without_credentials() {
        for plain in [
            "http://host/path?x=a@b",
            "https://host/path/user@x",
            "https://host/a:b@c",
            "https://host?u=x:y@z",
            "http://host:8080/cb?email=a@b.com",
            "http://host:/x@y",
            "http://[::1]:80/x@y",
            "http://u:p/q @h",
            "http://u:p/q@",
            "http://u:p/q@/x",
        ] {
            assert!(
                matches!(without_credentials(plain), Cow::Borrowed(_)),
                "{plain}"
            );
        }
    }

    #[test]
    fn redacts_a_digits_password_holding_a_slash_after_a_user() {
        for (url, shown) in [
            ("redis://u:1234/ab@db", "redis://u:[redacted]@db"),
            (
                "redis://u:1234/ab@db:6379/0",
                "redis://u:[redacted]@db:6379/0",
            ),
            (
                "redis://u:1234/ab@[::1]:6379",
                "redis://u:[redacted]@[::1]:6379",
            ),
            // Read as `user:password@host`, as it may be one: redact more.
            ("http://h:1/x@y", "http://h:[redacted]@y"),
        ] {
            assert_eq!(without_credentials(url), shown);
            assert_eq!(
                without_credentials(&format!("connect `{url}`: refused")),
                format!("connect `{shown}`: refused")
            );
        }
    }

    #[test]
    fn leaves_an_at_in_a_query_value_after_a_host_and_port() {
        for plain in [
            "http://host:8080/path?x=a@b&y=c@d",
            "http://host:8080?x=a@b",
            "http://h:1/p?a=b#c@d",
            "http://[::1]:6379/x?to=a@b",
            "http://[::1]:6379",
        ] {
            assert!(
                matches!(without_credentials(plain), Cow::Borrowed(_)),
                "{plain}"
            );
        }
        // `u:1` may be a host and port: the userinfo ends before the query.
        assert_eq!(
            without_credentials("http://u:1/q@h/path?email=a@b.com"),
            "http://u:[redacted]@h/path?email=a@b.com"
        );
    }

    /// What a reviewer found shown after 39c065c (redacted before it): the
    /// `?` of a password read as a query's, an `@` after its `=` kept.
    #[test]
    fn redacts_a_password_whose_question_mark_and_equals_look_like_a_query() {
        for (url, shown, password) in [
            (
                "redis://:x?y=z@db:6379",
                "redis://:[redacted]@db:6379",
                "x?y=z",
            ),
            (
                "redis://u:p?ss=w0rd@db:6379/0",
                "redis://u:[redacted]@db:6379/0",
                "p?ss=w0rd",
            ),
            (
                "https://u:Zm9v?YmFy==@h/x",
                "https://u:[redacted]@h/x",
                "Zm9v?YmFy==",
            ),
            (
                "amqp://guest:gu?est=1@rabbit:5672/vhost",
                "amqp://guest:[redacted]@rabbit:5672/vhost",
                "gu?est=1",
            ),
            // A `?` after a `#` is no query.
            (
                "redis://u:a#b?c=d@h:6379",
                "redis://u:[redacted]@h:6379",
                "a#b?c=d",
            ),
            ("redis://u:p?x=1@2@h", "redis://u:[redacted]@h", "p?x=1@2"),
            (
                "redis://u:a/b@c?d=e@db",
                "redis://u:[redacted]@db",
                "a/b@c?d=e",
            ),
            // `abc` is no port: `host:abc` may be `user:password`.
            (
                "http://host:abc/path?x=a@b",
                "http://host:[redacted]@b",
                "abc/path?x=a",
            ),
            // The `?` may be in the password: the last `@` ends it.
            (
                "http://u:p/q@h:1/path?email=a@b.com",
                "http://u:[redacted]@b.com",
                "p/q@h:1/path?email=a",
            ),
            // `host:port`, but a `#` before the query's `=` ends the query.
            ("http://h:1/p?a#b=c@d", "http://h:[redacted]@d", "1/p?a#b=c"),
            (
                "http://h:80/x#f?a=b@c",
                "http://h:[redacted]@c",
                "80/x#f?a=b",
            ),
        ] {
            for (text, expected) in [
                (url.to_owned(), shown.to_owned()),
                (
                    format!("dial \"{url}\": refused, http://h:1/x?m=a@y"),
                    format!("dial \"{shown}\": refused, http://h:1/x?m=a@y"),
                ),
            ] {
                let redacted = without_credentials(&text);
                assert_eq!(redacted, expected);
                assert!(!redacted.contains(password), "{redacted}");
            }
        }
    }

    #[test]
    fn user_only_empty_password_and_percent_encoded_at() {
        assert_eq!(
            without_credentials("redis://default@db:6379"),
            "redis://[redacted]@db:6379"
        );
        for plain in ["redis://u:@db:6379", "redis://u:@[::1]:6379/0"] {
            assert!(
                matches!(without_credentials(plain), Cow::Borrowed(_)),
                "{plain}"
            );
        }
        for (url, shown) in [
            ("redis://u:p%40ss@db:6379", "redis://u:[redacted]@db:6379"),
            ("redis://u:12%40/34@db", "redis://u:[redacted]@db"),
            (
                "redis://u:1234%40@[::1]:6379",
                "redis://u:[redacted]@[::1]:6379",
            ),
        ] {
            assert_eq!(without_credentials(url), shown);
        }
    }

    #[test]
    fn keeps_multibyte_text_whole() {
        assert_eq!(
            without_credentials("é http://ü:pässwört@hóst/ é"),
            "é http://ü:[redacted]@hóst/ é"
        );
    }
}
