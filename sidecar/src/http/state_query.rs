//! `POST`/`PUT /v1.0-alpha1/state/{store}/query`, Dapr's
//! `QueryStateAlpha1`. No rewire state store can query (the `StateStore`
//! trait has no query), so the route answers as daprd answers for a store
//! that is not a querier: the body read first (bounded as every body: 413
//! past `max_request_bytes`), then the store looked up (400
//! `ERR_STATE_STORE_NOT_FOUND`, 500 `ERR_STATE_STORE_NOT_CONFIGURED`, as
//! the other state routes), then 500 `ERR_STATE_STORE_NOT_SUPPORTED`
//! "state store does not support querying", with Dapr's details
//! (`DAPR_STATE_QUERYING_NOT_SUPPORTED`, the store's `ResourceInfo`).
//! Before this route the SDKs' `query_state` got the router's 404.

use std::collections::HashMap;

use axum::extract::State;
use axum::http::StatusCode;

use rewire_runtime::echoed;

use super::error::HttpError;
use super::input::{body_bytes, RawBody};
use super::path_params::PathParams;
use crate::dapr::{Call, ErrorDetail, ResourceDetail};
use crate::ApiState;

/// Dapr's message for a store that cannot query (it names no store).
const QUERY_UNSUPPORTED: &str = "state store does not support querying";

/// `POST`/`PUT /v1.0-alpha1/state/{store}/query`: never answered with
/// items (see the module docs).
pub async fn query(
    State(state): State<ApiState>,
    call: Call,
    PathParams(store_name): PathParams<String>,
    body: RawBody,
) -> Result<StatusCode, HttpError> {
    // As daprd: the body is read before the store is looked up; the query
    // itself is parsed only by a store that can run it.
    drop(body_bytes(body, state.options.max_request_bytes)?);
    call.state_store(&store_name)?;
    Err(query_unsupported(&store_name))
}

/// Dapr's `StateStoreQueryUnsupported(store)`.
fn query_unsupported(store_name: &str) -> HttpError {
    HttpError::Detailed {
        status: StatusCode::INTERNAL_SERVER_ERROR,
        code: "ERR_STATE_STORE_NOT_SUPPORTED",
        message: QUERY_UNSUPPORTED.to_string(),
        detail: Box::new(ErrorDetail {
            reason: "DAPR_STATE_QUERYING_NOT_SUPPORTED",
            metadata: HashMap::new(),
            resource: Some(ResourceDetail {
                resource_type: "state",
                resource_name: echoed(store_name).into_owned(),
                description: String::new(),
            }),
            field_violation: None,
            help: None,
        }),
    }
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::extract::Request;
    use axum::http::Method;
    use serde_json::Value;
    use tower_service::Service;

    use rewire_runtime::prelude::async_trait;
    use rewire_runtime::{
        Component, DeleteRequest, GetRequest, SetRequest, StateEntry, StateError, StateStore,
    };

    use super::*;
    use crate::http::router;

    /// A state store holding nothing (every store is one that cannot
    /// query).
    #[derive(rewire_runtime::Component, Default)]
    #[component(kind = "state", type = "test.query.empty")]
    struct EmptyStore {}

    #[async_trait]
    impl Component for EmptyStore {}

    #[async_trait]
    impl StateStore for EmptyStore {
        async fn get(&self, _: GetRequest) -> Result<Option<StateEntry>, StateError> {
            Ok(None)
        }

        async fn set(&self, _: SetRequest) -> Result<(), StateError> {
            Ok(())
        }

        async fn delete(&self, _: DeleteRequest) -> Result<(), StateError> {
            Ok(())
        }
    }

    /// A runtime whose one state store is `orders`.
    async fn with_orders() -> ApiState {
        use rewire_runtime::config::{parse, validate};
        let config = serde_json::json!({
            "appId": "app",
            "components": {"state": {"orders": {"type": "test.query.empty"}}}
        });
        let file = parse(config.to_string().as_bytes()).unwrap_or_else(|p| panic!("{p}"));
        let registry = rewire_runtime::Registry::collected();
        let config = validate(file, &registry).unwrap_or_else(|p| panic!("{p}"));
        let runtime = rewire_runtime::Runtime::start(config, registry, Default::default())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        ApiState {
            runtime,
            ..ApiState::empty().await
        }
    }

    /// The status and JSON body of `method path` with `body`.
    async fn answer(state: &ApiState, method: Method, path: &str, body: Vec<u8>) -> (u16, Value) {
        let request = Request::builder()
            .method(method)
            .uri(path)
            .body(Body::from(body))
            .expect("request");
        let response = router(state.clone())
            .call(request)
            .await
            .expect("infallible");
        let status = response.status().as_u16();
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .expect("the body");
        (status, serde_json::from_slice(&bytes).expect("JSON"))
    }

    /// A known store is 500 `ERR_STATE_STORE_NOT_SUPPORTED` with Dapr's
    /// message and details, for `POST` and `PUT`; an unknown one 400
    /// `ERR_STATE_STORE_NOT_FOUND`; no store at all 500
    /// `ERR_STATE_STORE_NOT_CONFIGURED`; a body past `max_request_bytes`
    /// 413 (failed before the route: 404 `ERR_NOT_FOUND` for all).
    #[tokio::test]
    async fn a_query_is_answered_as_daprd_answers_a_store_that_cannot_query() {
        let state = with_orders().await;
        let query = br#"{"filter": {"EQ": {"state": "CA"}}}"#.to_vec();
        for method in [Method::POST, Method::PUT] {
            let path = "/v1.0-alpha1/state/orders/query";
            let (status, body) = answer(&state, method.clone(), path, query.clone()).await;
            assert_eq!(status, 500, "{method} {body}");
            assert_eq!(body["errorCode"], "ERR_STATE_STORE_NOT_SUPPORTED", "{body}");
            assert_eq!(body["message"], "state store does not support querying");
            let details = body["details"].to_string();
            assert!(
                details.contains("DAPR_STATE_QUERYING_NOT_SUPPORTED"),
                "{details}"
            );
            assert!(details.contains(r#""resource_name":"orders""#), "{details}");
        }
        let path = "/v1.0-alpha1/state/other/query";
        let (status, body) = answer(&state, Method::POST, path, query.clone()).await;
        assert_eq!(status, 400, "{body}");
        assert_eq!(body["errorCode"], "ERR_STATE_STORE_NOT_FOUND", "{body}");
        let over = vec![b' '; state.options.max_request_bytes + 1];
        let path = "/v1.0-alpha1/state/orders/query";
        let (status, body) = answer(&state, Method::POST, path, over).await;
        assert_eq!(status, 413, "{body}");
        state.runtime.shutdown().await;

        let empty = ApiState::empty().await;
        let (status, body) = answer(&empty, Method::POST, path, query).await;
        assert_eq!(status, 500, "{body}");
        assert_eq!(
            body["errorCode"], "ERR_STATE_STORE_NOT_CONFIGURED",
            "{body}"
        );
        empty.runtime.shutdown().await;
    }
}
