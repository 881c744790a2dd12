//! A state key named like a state route, routed as Dapr routes it.
//!
//! `/v1.0/state/{store}/bulk` and `…/transaction` are routes of their own
//! for `POST` and `PUT`. Dapr's router (chi) falls back to `{key}` for
//! another method, so a `GET` or `DELETE` there reads or deletes the key
//! `bulk` or `transaction`; axum's does not fall back. Such a call is
//! routed by its path with the key's first letter percent-encoded
//! (`%62ulk`: the same path, RFC 3986 §6.2.2.2, and the same key once
//! decoded), which only the key route matches. A plain state GET never
//! comes here: the hot path reads it.

use axum::extract::Request;
use axum::http::Method;

use crate::clean_path::set_path;
use crate::http::routes;

/// Routes a `GET`, `HEAD` or `DELETE` of a state key named like a state
/// route to the key route; any other request is untouched.
pub(super) fn respell(request: &mut Request) {
    if !matches!(
        *request.method(),
        Method::GET | Method::HEAD | Method::DELETE
    ) {
        return;
    }
    if let Some(path) = respelled(request.uri().path()) {
        set_path(request, path);
    }
}

/// `path` spelled so that only the key route matches it, when a state
/// route would match it as written.
fn respelled(path: &str) -> Option<String> {
    let (store, key) = path.strip_prefix("/v1.0/state/")?.split_once('/')?;
    let named_like_a_route = [routes::STATE_BULK, routes::STATE_TRANSACTION]
        .iter()
        .any(|route| route.strip_prefix("/v1.0/state/{store}/") == Some(key));
    if store.is_empty() || !named_like_a_route {
        return None;
    }
    // The route names are ASCII letters.
    let (first, rest) = key.split_at(1);
    let first = first.as_bytes()[0];
    Some(format!("/v1.0/state/{store}/%{first:02X}{rest}"))
}

#[cfg(test)]
mod tests {
    use super::respelled;

    #[test]
    fn only_a_key_named_like_a_state_route_is_respelled() {
        for (path, routed_by) in [
            ("/v1.0/state/orders/bulk", "/v1.0/state/orders/%62ulk"),
            (
                "/v1.0/state/orders/transaction",
                "/v1.0/state/orders/%74ransaction",
            ),
            ("/v1.0/state/%6Frders/bulk", "/v1.0/state/%6Frders/%62ulk"),
        ] {
            assert_eq!(respelled(path).as_deref(), Some(routed_by), "{path}");
        }
        for path in [
            "/v1.0/state/orders/k",
            "/v1.0/state/orders/bulky",
            "/v1.0/state/orders/bulk/x",
            "/v1.0/state//bulk",
            "/v1.0/state/bulk",
            "/v1.0/secrets/vault/bulk",
            "/v1.0-alpha1/state/orders/bulk",
        ] {
            assert_eq!(respelled(path), None, "{path}");
        }
    }
}
