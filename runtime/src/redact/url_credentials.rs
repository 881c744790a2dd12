//! [`without_credentials`]: the passwords and tokens of URLs in a text.

use std::borrow::Cow;

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
/// is redacted whole. Text without such a URL is returned as is.
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
/// assert_eq!(without_credentials("http://h:2379"), "http://h:2379");
/// ```
pub fn without_credentials(text: &str) -> Cow<'_, str> {
    let mut out = String::new();
    // Copied to `out` up to here.
    let mut copied = 0;
    let mut from = 0;
    while let Some(found) = text[from..].find("://") {
        let start = from + found + "://".len();
        let end = text[start..]
            .find(ends_authority)
            .map_or(text.len(), |i| start + i);
        // Not `end`: the `:` of a next `://` may be inside this authority.
        from = start;
        let Some(at) = text[start..end].rfind('@') else {
            continue;
        };
        let userinfo = &text[start..start + at];
        // A user with a password keeps its name; a lone user is a token.
        let secret_start = match userinfo.find(':') {
            Some(colon) => start + colon + 1,
            None => start,
        };
        let secret = &text[secret_start..start + at];
        if secret.is_empty() || secret == REDACTED {
            continue;
        }
        out.push_str(&text[copied..secret_start]);
        out.push_str(REDACTED);
        copied = start + at;
    }
    if copied == 0 {
        return Cow::Borrowed(text);
    }
    out.push_str(&text[copied..]);
    Cow::Owned(out)
}

/// Whether `c` ends a URL's authority (as far as finding credentials goes).
fn ends_authority(c: char) -> bool {
    matches!(c, '/' | '?' | '#' | '"' | '\'' | '`' | '<' | '>') || c.is_whitespace()
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
    fn keeps_multibyte_text_whole() {
        assert_eq!(
            without_credentials("é http://ü:pässwört@hóst/ é"),
            "é http://ü:[redacted]@hóst/ é"
        );
    }
}
