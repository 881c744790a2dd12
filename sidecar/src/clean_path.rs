//! Request paths cleaned before routing, as Dapr cleans them.
//!
//! Dapr's HTTP server routes every request on `path.Clean` of its escaped
//! path (its `CleanPathMiddleware`, on the whole router; the
//! `StripSlashesMiddleware` after it finds no trailing `/` left): repeated
//! `/` collapse, `.` segments go, `..` takes the segment before it (none
//! past the root), and no trailing `/` stays. The path is the one on the
//! wire, still percent-encoded, so `%2F` is never a separator and `%2E%2E`
//! is no `..`. Everything after routing (the token check, the handler, a
//! 404's message) sees the cleaned path. A clean path costs one scan and
//! no allocation; only a path that needs cleaning is rebuilt.

use axum::extract::Request;
use axum::http::uri::PathAndQuery;
use axum::http::Uri;

/// Routes `request` by its cleaned path; its query, and the scheme and
/// authority of an HTTP/2 request, are kept. A clean path is untouched.
pub(crate) fn clean(request: &mut Request) {
    if let Some(path) = cleaned(request.uri().path()) {
        set_path(request, path);
    }
}

/// Routes `request` by `path` (a valid path) instead of its own; its query,
/// and the scheme and authority of an HTTP/2 request, are kept.
pub(crate) fn set_path(request: &mut Request, path: String) {
    let path_and_query = match request.uri().query() {
        Some(query) => format!("{path}?{query}"),
        None => path,
    };
    // Every caller's path holds only bytes a valid path holds.
    let Ok(path_and_query) = PathAndQuery::try_from(path_and_query) else {
        return;
    };
    let mut parts = request.uri().clone().into_parts();
    parts.path_and_query = Some(path_and_query);
    if let Ok(uri) = Uri::from_parts(parts) {
        *request.uri_mut() = uri;
    }
}

/// `path` as Go's `path.Clean` leaves it, or `None` when that is `path`
/// itself (or `path` is not rooted, as `*` is). Also how the connection
/// layer tells an upload, before the path is cleaned for routing.
pub(crate) fn cleaned(path: &str) -> Option<String> {
    let rest = path.strip_prefix('/')?;
    if rest.is_empty() || !has_dirty_segment(rest.as_bytes()) {
        return None;
    }
    let mut kept: Vec<&str> = Vec::new();
    for segment in rest.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                kept.pop();
            }
            _ => kept.push(segment),
        }
    }
    let mut clean = String::with_capacity(path.len());
    for segment in kept {
        clean.push('/');
        clean.push_str(segment);
    }
    if clean.is_empty() {
        clean.push('/');
    }
    Some(clean)
}

/// Whether a segment of `rest` (a path without its leading `/`) is empty,
/// `.` or `..`. Every request pays it, so a path with no segment that
/// starts with `/` or `.` and no trailing `/` (nearly every one) is told
/// by one comparison a byte; only the others are split.
fn has_dirty_segment(rest: &[u8]) -> bool {
    let segment_may_be_dirty = match rest {
        [] | [.., b'/'] | [b'/' | b'.', ..] => true,
        _ => rest
            .windows(2)
            .any(|pair| pair[0] == b'/' && matches!(pair[1], b'/' | b'.')),
    };
    segment_may_be_dirty && has_dirty_segment_exactly(rest)
}

/// [`has_dirty_segment`], segment by segment.
fn has_dirty_segment_exactly(rest: &[u8]) -> bool {
    // The length of the current segment so far, and whether it holds only
    // dots (a segment of one or two dots is dirty).
    let mut length = 0usize;
    let mut dots_only = true;
    for &byte in rest {
        if byte == b'/' {
            if length == 0 || (dots_only && length <= 2) {
                return true;
            }
            length = 0;
            dots_only = true;
        } else {
            length += 1;
            dots_only &= byte == b'.';
        }
    }
    length == 0 || (dots_only && length <= 2)
}

#[cfg(test)]
mod tests {
    use super::{clean, cleaned};
    use axum::body::Body;
    use axum::extract::Request;

    #[test]
    fn the_byte_scan_finds_what_a_split_into_segments_finds() {
        let split = |rest: &str| rest.split('/').any(|s| matches!(s, "" | "." | ".."));
        for rest in [
            "a",
            "a/",
            "a//b",
            ".",
            "..",
            "...",
            ".a",
            "a.",
            "a/.",
            "a/..",
            "a/...",
            "./a",
            "../a",
            ".../a",
            "a/./b",
            "a/../b",
            "a/.b/c",
            "v1.0/state/orders/o-1",
            "/",
            "//",
            "%2E%2E",
            "a/b/",
        ] {
            assert_eq!(
                super::has_dirty_segment(rest.as_bytes()),
                split(rest),
                "{rest}"
            );
        }
    }

    #[test]
    fn a_clean_path_is_left_alone() {
        for path in [
            "/",
            "/v1.0/state/orders/o-1",
            "/v1.0/state/orders/a%2Fb",
            "/v1.0/state/orders/%2E%2E",
            "/v1.0/state/orders/...",
            "/v1.0/state/orders/.k",
            "*",
        ] {
            assert_eq!(cleaned(path), None, "{path}");
        }
    }

    #[test]
    fn a_path_is_cleaned_as_gos_path_clean_cleans_it() {
        // Expected values are Go's `path.Clean` of each input.
        for (path, clean) in [
            ("//v1.0/state/orders/o-1", "/v1.0/state/orders/o-1"),
            ("/v1.0//state/orders/o-1", "/v1.0/state/orders/o-1"),
            ("/v1.0/state/orders/o-1/", "/v1.0/state/orders/o-1"),
            ("/v1.0/state/orders/o-1//", "/v1.0/state/orders/o-1"),
            ("/v1.0/state/./orders/o-1/.", "/v1.0/state/orders/o-1"),
            ("/v1.0/state/orders/x/../o-1", "/v1.0/state/orders/o-1"),
            ("/v1.0/state/orders/o-1/..", "/v1.0/state/orders"),
            ("/../v1.0/metadata", "/v1.0/metadata"),
            ("/a/b/../../..", "/"),
            ("//", "/"),
            ("/./", "/"),
            (
                "/v1.0/state/orders/a%2F..%2Fb/",
                "/v1.0/state/orders/a%2F..%2Fb",
            ),
        ] {
            assert_eq!(cleaned(path).as_deref(), Some(clean), "{path}");
        }
    }

    #[test]
    fn the_query_scheme_and_authority_are_kept() {
        let mut request = Request::builder()
            .uri("http://sidecar:3500//v1.0/state/orders/o-1/?metadata.ttl=1")
            .body(Body::empty())
            .unwrap();
        clean(&mut request);
        assert_eq!(
            request.uri().to_string(),
            "http://sidecar:3500/v1.0/state/orders/o-1?metadata.ttl=1"
        );
        let mut request = Request::builder()
            .uri("/v1.0//metadata")
            .body(Body::empty())
            .unwrap();
        clean(&mut request);
        assert_eq!(request.uri().to_string(), "/v1.0/metadata");
    }
}
