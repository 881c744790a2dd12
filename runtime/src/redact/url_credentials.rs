//! [`without_credentials`]: the passwords and tokens of URLs in a text,
//! and the passwords of `user:password@host` addresses given without a
//! scheme.

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
/// with no `#` before them (`u:12/a?b=c@h`).
///
/// An address given without a scheme (`user:password@collector:4317`, a
/// gRPC endpoint) has its password redacted too, read as the authority of
/// a URL is, but only in a narrower shape, so that ordinary text (an
/// e-mail address, `host:port`, a time of day) is left as it is:
/// - it starts a word (text between whitespace, quotes, backticks, `<`
///   and `>`) or follows an `=`, a `[` or a `{` in one (`endpoint=u:p@h`,
///   `[u:p@h]`), before the word's first `://` (past which the word is a
///   URL, read as above), and among the first 16 places of the word where
///   a user name and a `:` start (a bound on the work a long word makes);
/// - its userinfo holds a `:`: a user name (possibly empty, of the
///   characters a URL's user name may hold, but no `=`; or an e-mail
///   address, `alice@corp.com:pw@h`), a `:`, then a non-empty password; a
///   lone `token@host` is not redacted here, being indistinguishable from
///   an e-mail address (`me@example.com`);
/// - after a `[`, its userinfo holds no `]` (`[::1]:80@x`, an IPv6
///   address and a port, is left as it is);
/// - a host follows its `@`: a letter, a digit or `[` first, and not only
///   digits (`10.0.0.1:7000@17000,name`, a Redis cluster node's
///   `ip:port@busport,hostname`, is left as it is);
/// - its user name is no scheme naming an address rather than a host's
///   user (`mailto:me@example.com`, also `sip`, `sips`, `xmpp`).
///
/// Still redacted, as it is that shape: `To:alice@example.com`, written
/// without a space (read as user `To`, password `alice`), and so Go's
/// `map[to:alice@example.com]`.
///
/// Text without any of these is returned as is.
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

/// Where the credentials of the URLs in `text`, and the passwords of its
/// addresses without a scheme, are (see [`without_credentials`]), in order
/// and apart: the redactor merges them with the remembered secrets it
/// finds in the same text.
pub(crate) fn credential_spans(text: &str) -> Vec<Range<usize>> {
    let mut spans = url_credential_spans(text);
    let scheme_less = scheme_less_password_spans(text);
    if scheme_less.is_empty() {
        return spans;
    }
    spans.extend(scheme_less);
    spans.sort_by_key(|span| span.start);
    let mut merged: Vec<Range<usize>> = Vec::with_capacity(spans.len());
    for span in spans {
        match merged.last_mut() {
            Some(last) if span.start <= last.end => last.end = last.end.max(span.end),
            _ => merged.push(span),
        }
    }
    merged
}

/// Where the credentials of the URLs (`scheme://…`) in `text` are, in
/// order and apart.
fn url_credential_spans(text: &str) -> Vec<Range<usize>> {
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

/// The user names of addresses without a scheme that name no host's user
/// (`mailto:me@example.com`): their `user:…@host` shape is no password.
const ADDRESS_SCHEMES: [&str; 4] = ["mailto", "sip", "sips", "xmpp"];

/// At how many places of a word (where a user name and a `:` start) an
/// address without a scheme is looked for at most. Each look may read the
/// rest of the word: a word of many `=…:` pieces (`=:/=:/…`; 64 KiB of it
/// took 26 s in a test build) is read this many times at most, not once
/// per piece.
/// An address past so many such places in one word is not redacted.
const MOST_LOOKS_PER_WORD: usize = 16;

/// Where the passwords of the addresses without a scheme in `text` are
/// (`user:password@host`, see [`without_credentials`] for the shape), in
/// order and apart.
fn scheme_less_password_spans(text: &str) -> Vec<Range<usize>> {
    let mut spans: Vec<Range<usize>> = Vec::new();
    if !text.contains('@') {
        return spans;
    }
    let mut word_start = 0;
    let ends = text
        .char_indices()
        .filter(|&(_, c)| ends_url(c))
        .chain(std::iter::once((text.len(), ' ')));
    for (word_end, separator) in ends {
        let word = &text[word_start..word_end];
        // Past a `://` the word is a URL, read by `url_credential_spans`.
        let word = &word[..word.find("://").unwrap_or(word.len())];
        // Where a user name may start: the word's start, and after each
        // `=`, `[` or `{` (none a user name's character, so that no two
        // user names overlap), with whether a `[` opened it.
        let starts = std::iter::once((0, false)).chain(
            word.match_indices(['=', '[', '{'])
                .map(|(i, opening)| (i + 1, opening == "[")),
        );
        let mut looks = 0;
        for (start, after_bracket) in starts.map(|(offset, after)| (word_start + offset, after)) {
            // Inside a password found already (`u:a=b:c@h`).
            if spans.last().is_some_and(|last| start < last.end) {
                continue;
            }
            let Some(user) = scheme_less_user(text, start) else {
                continue;
            };
            looks += 1;
            if looks > MOST_LOOKS_PER_WORD {
                break;
            }
            let Some(password) = scheme_less_password(text, user) else {
                continue;
            };
            // An IPv6 address's `]` (`[::1]:80@x`): no userinfo.
            if !(after_bracket && text[start..password.end].contains(']')) {
                spans.push(password);
            }
        }
        word_start = word_end + separator.len_utf8();
    }
    spans
}

/// Where the user name of an address without a scheme is, if one starts
/// at `text[start..]`: a user name (maybe empty, no address scheme) or an
/// e-mail address (`alice@corp.com`, its one `@` between user name
/// characters), followed by a `:`. Reads only the user name.
fn scheme_less_user(text: &str, start: usize) -> Option<Range<usize>> {
    let rest = &text[start..];
    let user_chars = |s: &str| s.find(|c| !is_scheme_less_user_char(c)).unwrap_or(s.len());
    let mut user_len = user_chars(rest);
    if user_len > 0 && rest[user_len..].starts_with('@') {
        let domain_len = user_chars(&rest[user_len + 1..]);
        if domain_len > 0 {
            user_len += 1 + domain_len;
        }
    }
    let user = &rest[..user_len];
    let is_address_scheme = ADDRESS_SCHEMES
        .iter()
        .any(|scheme| user.eq_ignore_ascii_case(scheme));
    (rest[user.len()..].starts_with(':') && !is_address_scheme).then_some(start..start + user.len())
}

/// Where the password of the address without a scheme whose user name is
/// `text[user]` (a `:` after it) is, if it is one: `user:password@host`,
/// its userinfo ending as a URL's does (the last `@` of the authority, or
/// past it for a password holding a `/`, `?` or `#`); the authority of
/// an e-mail address as the user name starts past its `@`. May read up to
/// the end of the word.
fn scheme_less_password(text: &str, user: Range<usize>) -> Option<Range<usize>> {
    let start = text[user.clone()]
        .find('@')
        .map_or(user.start, |at| user.start + at + 1);
    let end = text[start..]
        .find(ends_authority)
        .map_or(text.len(), |i| start + i);
    let at = match text[start..end].rfind('@') {
        Some(at) => start + at,
        None => userinfo_past_authority(text, start, end)?,
    };
    let password = user.end + ':'.len_utf8()..at;
    let secret = &text[password.clone()];
    (!secret.is_empty() && secret != REDACTED && names_a_host(&text[at + 1..])).then_some(password)
}

/// Whether `c` may stand in the user name of an address without a
/// scheme: as in a URL's ([`is_userinfo_char`]), but an `=` (after which
/// another address may start) and a `'` (which ends a word) end it, so
/// that no character is read in more than one user name.
fn is_scheme_less_user_char(c: char) -> bool {
    c != '=' && !ends_url(c) && is_userinfo_char(c)
}

/// Whether `after_at`, what follows an address's `@`, starts with a host:
/// a letter, a digit or `[` first, and not only digits up to a `:`, a `,`
/// or the authority's end (`ip:port@17000` and `ip:port@17000,name` are a
/// Redis cluster node's bus port and name).
fn names_a_host(after_at: &str) -> bool {
    let host = &after_at[..after_at
        .find(|c| matches!(c, ':' | ',') || ends_authority(c))
        .unwrap_or(after_at.len())];
    host.starts_with(|c: char| c.is_alphanumeric() || c == '[')
        && !host.bytes().all(|b| b.is_ascii_digit())
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
    let rest = up_to_url_end_or_next_url(&text[end..]);
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

/// `rest` up to the end of its URL ([`ends_url`]) or the next `://`,
/// whichever comes first. Reads no further: each `://` of a word reads at
/// most up to the one after it, so a word of many (`a://:x/a://:x/…`) is
/// read in time linear in its length (read to the word's end for each, a
/// 256 KiB word took 4.6 s).
fn up_to_url_end_or_next_url(rest: &str) -> &str {
    let end = rest
        .char_indices()
        .find(|&(i, c)| ends_url(c) || rest[i..].starts_with("://"))
        .map_or(rest.len(), |(i, _)| i);
    #[cfg(test)]
    tests::note_bytes_read_past_authorities(end);
    &rest[..end]
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
    use std::cell::Cell;

    thread_local! {
        /// How many bytes past URL authorities this test's thread read in
        /// [`up_to_url_end_or_next_url`].
        static BYTES_READ_PAST_AUTHORITIES: Cell<usize> = const { Cell::new(0) };
    }

    /// Counts `bytes` read past a URL's authority on this thread.
    pub(super) fn note_bytes_read_past_authorities(bytes: usize) {
        BYTES_READ_PAST_AUTHORITIES.with(|read| read.set(read.get() + bytes));
    }

    /// How many bytes past URL authorities `without_credentials(text)`
    /// reads, and what it returns.
    fn bytes_read_past_authorities(text: &str) -> (usize, String) {
        BYTES_READ_PAST_AUTHORITIES.with(|read| read.set(0));
        let redacted = without_credentials(text).into_owned();
        (BYTES_READ_PAST_AUTHORITIES.with(Cell::get), redacted)
    }

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

    /// Failed before: a `user:password@host` given without a scheme (a
    /// gRPC endpoint as configured) was shown whole, in every text
    /// scrubbed (the log writer's too).
    #[test]
    fn redacts_the_password_of_an_address_without_a_scheme() {
        for (text, shown) in [
            (
                "user:pw-9x@collector:4317",
                "user:[redacted]@collector:4317",
            ),
            (
                "user:pw-9x@collector:4318/v1/traces",
                "user:[redacted]@collector:4318/v1/traces",
            ),
            (":hunter2@db:6379", ":[redacted]@db:6379"),
            ("u:Zm9v/YmFy+cXV4@db:6379", "u:[redacted]@db:6379"),
            ("u:p@ss@[::1]:4317", "u:[redacted]@[::1]:4317"),
            (
                "endpoint=user:pw-9x@collector:4317 protocol=grpc",
                "endpoint=user:[redacted]@collector:4317 protocol=grpc",
            ),
            (
                "dial \"u:pw-9x@h:1\": refused; `u:pw-9x@h:1` <u:pw-9x@h>",
                "dial \"u:[redacted]@h:1\": refused; `u:[redacted]@h:1` <u:[redacted]@h>",
            ),
            (
                r#"{"endpoint":"u:pw-9x@h:1","x":1}"#,
                r#"{"endpoint":"u:[redacted]@h:1","x":1}"#,
            ),
            ("a=b:pw-9x@d", "a=b:[redacted]@d"),
            ("u:a=b:c@h", "u:[redacted]@h"),
            ("é ü:pässwört@hóst é", "é ü:[redacted]@hóst é"),
            // With a URL after it, or in its password: each redacted.
            (
                "u:pw-9x@h, also http://x:pw-9y@z",
                "u:[redacted]@h, also http://x:[redacted]@z",
            ),
            ("u:a://b@h", "u:[redacted]@h"),
            // Documented: the shape, though no credentials.
            ("To:alice@example.com", "To:[redacted]@example.com"),
        ] {
            assert_eq!(without_credentials(text), shown, "{text}");
            // In order and apart: one span for each password redacted.
            assert_eq!(
                credential_spans(text).len(),
                shown.matches(REDACTED).count(),
                "{text}"
            );
            // Idempotent.
            assert_eq!(without_credentials(shown), shown);
        }
    }

    /// A word of many places where a user name and a `:` start is read a
    /// bounded number of times (read once for each, this took minutes),
    /// and the bound is where documented.
    #[test]
    fn a_word_of_many_user_and_colon_pieces_is_read_a_bounded_number_of_times() {
        for long in [
            format!("{} x@y", "=:/".repeat(100_000)),
            format!("{} x@y", "a'".repeat(100_000)),
            format!("{} x@y", "[:/".repeat(100_000)),
            format!("{} x@y", "{a@b:/".repeat(100_000)),
            format!("{} x@y", "[a@b".repeat(100_000)),
        ] {
            assert!(matches!(without_credentials(&long), Cow::Borrowed(_)));
        }
        let after = |pieces: usize| format!("k{}=u:pw-9x@h", "=a:/".repeat(pieces));
        assert_eq!(
            without_credentials(&after(MOST_LOOKS_PER_WORD - 1)),
            format!("k{}=u:[redacted]@h", "=a:/".repeat(MOST_LOOKS_PER_WORD - 1))
        );
        assert_eq!(
            without_credentials(&after(MOST_LOOKS_PER_WORD)),
            after(MOST_LOOKS_PER_WORD)
        );
    }

    /// Failed before (rv7 1): past an authority without an `@` that is
    /// `user:` or `:x` ending at a `/`, `?` or `#`, the rest of the word
    /// was read to its end before being cut at the next `://`, for each
    /// `://`: a word of many (a client's state key, logged) took time
    /// quadratic in its length, on every log line. Counted, not timed.
    #[test]
    fn a_word_of_many_urls_is_read_past_their_authorities_in_linear_time() {
        for piece in ["a://:x/", "a://u:p?", "a://:x#/", "h://u:p/a?b=c"] {
            let long = format!("{} x@y", piece.repeat(40_000));
            let (read, redacted) = bytes_read_past_authorities(&long);
            assert!(
                read <= 2 * long.len(),
                "{piece}: read {read} bytes past authorities in {}",
                long.len()
            );
            assert_eq!(redacted, long, "{piece}");
        }
        // What it reads up to is as before: each URL's password (up to the
        // next URL, or the end of the word) is still found.
        let urls = "redis://:a/b@h1:1,redis://:c/d@h2:2,x".repeat(1_000);
        let (read, redacted) = bytes_read_past_authorities(&urls);
        assert!(read <= 2 * urls.len(), "read {read} in {}", urls.len());
        assert_eq!(
            redacted,
            "redis://:[redacted]@h1:1,redis://:[redacted]@h2:2,x".repeat(1_000)
        );
    }

    /// Failed before (rv7 2): the password of an address without a scheme
    /// whose user name is an e-mail address, or which follows a `[` or a
    /// `{`, was shown whole.
    #[test]
    fn redacts_a_password_after_an_email_user_name_or_an_opening_bracket() {
        for (text, shown) in [
            (
                "alice@corp.com:pw-9x@collector:4317",
                "alice@corp.com:[redacted]@collector:4317",
            ),
            (
                "endpoint=alice@corp.com:pw-9x@collector:4317 x",
                "endpoint=alice@corp.com:[redacted]@collector:4317 x",
            ),
            (
                "a.b+c@corp.com:Zm9v/YmFy@db:6379/0",
                "a.b+c@corp.com:[redacted]@db:6379/0",
            ),
            (
                "alice@corp.com:p@ss@[::1]:4317",
                "alice@corp.com:[redacted]@[::1]:4317",
            ),
            ("[u:pw-9x@h]", "[u:[redacted]@h]"),
            ("{u:pw-9x@h}", "{u:[redacted]@h}"),
            ("peers=[u:pw-9x@h:1]", "peers=[u:[redacted]@h:1]"),
            ("[u:pw-9x@[::1]:80]", "[u:[redacted]@[::1]:80]"),
            ("{alice@corp.com:pw-9x@h}", "{alice@corp.com:[redacted]@h}"),
            // A `(` is a user name's character: read from the word's start.
            ("(u:pw-9x@h)", "(u:[redacted]@h)"),
            // Documented: the shape, though no credentials.
            (
                "map[to:alice@example.com]",
                "map[to:[redacted]@example.com]",
            ),
        ] {
            assert_eq!(without_credentials(text), shown, "{text}");
            assert_eq!(
                credential_spans(text).len(),
                shown.matches(REDACTED).count(),
                "{text}"
            );
            assert_eq!(without_credentials(shown), shown);
        }
        for plain in [
            "[::1]:80@x [fe80::1%eth0]:6379@node-a x[::1]:80@h {[::1]:80@x}",
            "addr=[::1]:6379 [::1]:30004@31004",
            "mail alice@corp.com: see [a@b.com] {me@example.com} x@y@z",
            "ssh user@host:22 [user@host:22] git@github.com:org/repo",
            "scp f user@host:/tmp/a@b @user_script:1: a@:b@c",
            "fe80::1:7000@17000 127.0.0.1:30004@31004,node-d,tls-port=0,shard-id=e2b0",
        ] {
            assert!(
                matches!(without_credentials(plain), Cow::Borrowed(_)),
                "{plain}: {}",
                without_credentials(plain)
            );
        }
    }

    /// What an address without a scheme must not be read in: ordinary
    /// text with an `@` or a `:` is shown as it is.
    #[test]
    fn leaves_text_that_is_no_address_without_a_scheme_as_is() {
        for plain in [
            "mail me@example.com at 10:30",
            "Error: me@example.com",
            "ssh from user@host:22",
            "mailto:me@example.com <SIP:alice@atlanta.example> xmpp:a@b",
            "07c37dfe 127.0.0.1:30004@31004 slave node-a:7000@17000",
            "c3 127.0.0.1:7002@17002,node-c master - 0 0 3 connected",
            "2026-12-07T22:03:30Z a@b",
            "src/a:b@c x.y/u:p@h",
            "u:p@ u:p@ h u:p@/x u:@h u:p@-h",
            "https://host?u=x:y@z&v=a:b@c",
            "key=:@h",
        ] {
            assert!(
                matches!(without_credentials(plain), Cow::Borrowed(_)),
                "{plain}: {}",
                without_credentials(plain)
            );
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
