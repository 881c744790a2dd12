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
/// fit for an error or a log: in each, what comes before the last `@` (and
/// after a `scheme://`) is taken as credentials, and replaced by
/// `[redacted]` but for the user's name. Unlike
/// [`without_credentials`](rewire_runtime::without_credentials), it holds
/// for text no URL parser accepted (a password with a `/` or a space).
pub(crate) fn shown_addresses(text: &str) -> String {
    text.split(',')
        .map(shown_address)
        .collect::<Vec<_>>()
        .join(",")
}

fn shown_address(text: &str) -> String {
    let (scheme, rest) = match text.split_once("://") {
        Some((scheme, rest)) => (format!("{scheme}://"), rest),
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
            "redis://:[redacted]@h:1, root:[redacted]@g:2,plain:3"
        );
        assert_eq!(
            shown_addresses("http://u:pass word/x@h/p, https://tok@h"),
            "http://u:[redacted]@h/p, https://[redacted]@h"
        );
        assert_eq!(shown_addresses("[::1]:2379"), "[::1]:2379");
    }
}
