//! The state GET, routed before the router.
//!
//! `GET /v1.0/state/{store}/{key}` is the call an app makes most, and the
//! router's own work (matching, path parameters and matched path kept in
//! the request's extensions, a clone of the route's boxed service per
//! layer, boxed futures) costs it about as much CPU as the rest of the
//! sidecar's work on it. [`HotPath`] recognises the plain form of that
//! call itself and gives it the same observation ([`observed`]) and the
//! same handler ([`state::read`]) the router would, its `+` read as a
//! space as the router reads it on Dapr's routes ([`plus_as_space`]);
//! anything else, and any path that needs percent-decoding, goes to the
//! router. Both ways give the same answer, byte for byte (`tests/api`
//! compares them).
//!
//! Every request's path is first cleaned as Dapr cleans it ([`clean_path`]:
//! `//`, `.`, `..` and a trailing `/`), so both ways route the cleaned path;
//! and a key named like a state route (`bulk`, `transaction`) is read or
//! deleted as Dapr's router does ([`key_route`]).

use crate::clean_path;
mod key_route;

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::extract::{Query, Request};
use axum::http::Method;
use axum::response::{IntoResponse, Response};
use axum::Router;

use super::error::HttpError;
use super::input::QueryPairs;
use super::observe::{observed, GET_STATE};
use super::path_params::plus_as_space;
use super::state;
use crate::dapr::{Call, StoreLabel};
use crate::ApiState;

/// The HTTP service: the state GET in [`hot_path`](self), everything else
/// through the router.
#[derive(Clone)]
pub(super) struct HotPath {
    router: Router,
    state: ApiState,
}

impl HotPath {
    /// In front of `router`, which serves `state`.
    pub(super) fn new(router: Router, state: ApiState) -> Self {
        Self { router, state }
    }
}

type Answer = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

impl tower_service::Service<Request> for HotPath {
    type Response = Response;
    type Error = Infallible;
    type Future = Answer;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // The router is always ready, and so is the hot path.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut request: Request) -> Answer {
        clean_path::clean(&mut request);
        if request.method() == Method::GET && state_key(request.uri().path()).is_some() {
            return Box::pin(get_state(self.state.clone(), request));
        }
        key_route::respell(&mut request);
        Box::pin(self.router.call(request))
    }
}

/// The store and key of a state GET's path, as written, when they are
/// plain: present, with nothing percent-encoded. A GET of `bulk` or
/// `transaction` is a key's, as in Dapr (those routes take no GET). Any
/// other path is the router's.
fn state_key(path: &str) -> Option<(&str, &str)> {
    let (store, key) = path.strip_prefix("/v1.0/state/")?.split_once('/')?;
    let plain = |segment: &str| !segment.is_empty() && !segment.contains(['/', '%']);
    (plain(store) && plain(key)).then_some((store, key))
}

/// `GET /v1.0/state/{store}/{key}` as the router would answer it: the
/// store's name is read from the request's own path, not copied.
async fn get_state(state: ApiState, request: Request) -> Result<Response, Infallible> {
    let label = StoreLabel::default();
    let response = observed(&state, GET_STATE, &label, request, |request| {
        let call = Call::new(&state.runtime, label.clone());
        let query: QueryPairs = Query::try_from_uri(request.uri());
        async move {
            match state_key(request.uri().path()) {
                Some((store, key)) => {
                    let key = plus_as_space(key).into_owned();
                    state::read(call, &plus_as_space(store), key, query)
                        .await
                        .into_response()
                }
                // `call` sent only paths with a store and key here.
                None => HttpError::RouteNotFound {
                    method: request.method().to_string(),
                    path: request.uri().path().to_owned(),
                }
                .into_response(),
            }
        }
    })
    .await;
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::{state_key, HotPath};
    use crate::http::routes;
    use crate::ApiState;
    use axum::body::Body;
    use axum::extract::Request;
    use axum::http::StatusCode;
    use axum::Router;
    use tower_service::Service;

    #[tokio::test]
    async fn a_state_get_is_cleaned_before_the_hot_path_is_chosen() {
        let state = ApiState::empty().await;
        let runtime = state.runtime.clone();
        // A router that answers 418 to everything: any other answer is the
        // hot path's own.
        let router = Router::new().fallback(|| async { StatusCode::IM_A_TEAPOT });
        let mut service = HotPath::new(router, state);
        for (path, to_the_router) in [
            ("/v1.0/state/orders/o-1", false),
            ("//v1.0/state/orders/o-1/", false),
            ("/v1.0/state/orders/x/../o-1", false),
            ("/v1.0/state/orders/o-1/..", true),
        ] {
            let request = Request::builder().uri(path).body(Body::empty()).unwrap();
            let response = service.call(request).await.unwrap();
            let routed = response.status() == StatusCode::IM_A_TEAPOT;
            assert_eq!(routed, to_the_router, "{path}");
        }
        runtime.shutdown().await;
    }

    #[test]
    fn the_paths_it_knows_are_the_routers() {
        // The prefix, and the two routes that take a key's path for their
        // `POST` and `PUT` only, as `routes` has them.
        assert_eq!(routes::STATE_KEY, "/v1.0/state/{store}/{key}");
        assert_eq!(routes::STATE_BULK, "/v1.0/state/{store}/bulk");
        assert_eq!(routes::STATE_TRANSACTION, "/v1.0/state/{store}/transaction");
    }

    #[test]
    fn only_a_plain_store_and_key_take_the_hot_path() {
        assert_eq!(state_key("/v1.0/state/orders/o-1"), Some(("orders", "o-1")));
        // As written: `+` is read as a space by `get_state`.
        assert_eq!(
            state_key("/v1.0/state/my+orders/a+b"),
            Some(("my+orders", "a+b"))
        );
        assert_eq!(
            state_key("/v1.0/state/orders/bulk"),
            Some(("orders", "bulk"))
        );
        let transaction = state_key("/v1.0/state/orders/transaction");
        assert_eq!(transaction, Some(("orders", "transaction")));
        for router_only in [
            "/v1.0/state/orders",
            "/v1.0/state/orders/",
            "/v1.0/state//o-1",
            "/v1.0/state/orders/o-1/",
            "/v1.0/state/orders/a/b",
            "/v1.0/state/orders/o%2D1",
            "/v1.0/state/%6Frders/o-1",
            "/v1.0/state/orders/a%2Bb",
            "/v1.0-alpha1/state/orders/o-1",
            "/v1.0/statex/orders/o-1",
        ] {
            assert_eq!(state_key(router_only), None, "{router_only}");
        }
    }
}
