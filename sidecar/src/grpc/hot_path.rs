//! `Dapr/GetState`, answered before tonic's router and codec.
//!
//! `GetState` is the call an app makes most over gRPC. Through tonic it
//! pays for the router (axum's matching, a clone of the route's boxed
//! service), the token interceptor (which rebuilds the request around its
//! headers), and the codec's streaming decoder and encoder: through them
//! the sidecar reached about 80 % of the throughput of a tonic server with
//! one method and no other work, and answered here 88-101 %, with a ninth
//! fewer instructions per call (`docs/BENCHMARKS.md`, 1r). [`HotPath`]
//! takes the plain form of the call itself: the method's path,
//! `application/grpc`, no `grpc-encoding`, the app token present where one
//! is required, and a body of one uncompressed message within the size
//! limit that decodes.
//! It calls the same [`Dapr::get_state`] the router would, so observation,
//! deadline and errors are the method's own, and writes the answer as
//! tonic does: one frame, then `grpc-status: 0`, or a trailers-only error.
//!
//! Anything else (another method, a compressed or oversized message, a
//! missing token, a body that does not decode) goes to tonic unchanged,
//! the bytes already read put back in front of the rest of the body
//! (`unary_body`), so tonic answers it as it would have.

use std::sync::Arc;
use std::task::{Context, Poll};

use prost::Message as _;
use tonic::body::Body;
use tonic::codegen::http::{header, HeaderName, HeaderValue, Request, Response};
use tonic::codegen::{BoxFuture, Service};
use tonic::metadata::MetadataMap;

use super::auth::RequireToken;
use super::dapr::DaprApi;
use super::proto::dapr::proto::runtime::v1 as pb;
use super::proto::dapr::proto::runtime::v1::dapr_server::Dapr;
use super::unary_body::{one_message, read_one_message, Read, Replayed, PREFIX};

/// The path of the one method the hot path takes.
const GET_STATE: &str = "/dapr.proto.runtime.v1.Dapr/GetState";
/// The header naming a message's compression. Header names are made once
/// here: a name given as text is parsed again on every lookup.
const GRPC_ENCODING: HeaderName = HeaderName::from_static("grpc-encoding");

/// Puts [`HotPath`] in front of the gRPC routes.
#[derive(Clone)]
pub(super) struct HotPathLayer(Arc<GetStateHere>);

/// What the hot path answers with; shared by every connection's service.
struct GetStateHere {
    api: Arc<DaprApi>,
    token: RequireToken,
    limit: usize,
}

impl HotPathLayer {
    /// Answers with `api`, admitting what `token` admits and messages of
    /// at most `limit` bytes (the decoding limit of the Dapr service).
    pub(super) fn new(api: Arc<DaprApi>, token: RequireToken, limit: usize) -> Self {
        Self(Arc::new(GetStateHere { api, token, limit }))
    }
}

impl<S> tower_layer::Layer<S> for HotPathLayer {
    type Service = HotPath<S>;

    fn layer(&self, routes: S) -> HotPath<S> {
        HotPath {
            routes,
            here: Arc::clone(&self.0),
        }
    }
}

/// The gRPC service: `GetState` in its plain form here, everything else
/// through `routes`.
#[derive(Clone)]
pub(super) struct HotPath<S> {
    routes: S,
    here: Arc<GetStateHere>,
}

impl<S> Service<Request<Body>> for HotPath<S>
where
    S: Service<Request<Body>, Response = Response<Body>> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<Response<Body>, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.routes.poll_ready(cx)
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        if !self.here.takes(&request) {
            return Box::pin(self.routes.call(request));
        }
        // The routes made ready for this call go with it (tower's rule);
        // a clone stays for the next.
        let clone = self.routes.clone();
        let routes = std::mem::replace(&mut self.routes, clone);
        let here = Arc::clone(&self.here);
        Box::pin(async move { here.get_state(routes, request).await })
    }
}

impl GetStateHere {
    /// Whether `request` is `GetState` in the form the hot path answers,
    /// as far as its head tells.
    fn takes(&self, request: &Request<Body>) -> bool {
        let headers = request.headers();
        request.uri().path() == GET_STATE
            && matches!(
                headers.get(header::CONTENT_TYPE).map(HeaderValue::as_bytes),
                Some(b"application/grpc" | b"application/grpc+proto")
            )
            && !headers.contains_key(&GRPC_ENCODING)
            && self.token.admits(headers)
    }

    /// Reads the message, then answers it or hands the call to `routes`.
    async fn get_state<S>(
        &self,
        mut routes: S,
        request: Request<Body>,
    ) -> Result<Response<Body>, S::Error>
    where
        S: Service<Request<Body>, Response = Response<Body>>,
    {
        let (parts, body) = request.into_parts();
        let message = match read_one_message(body, self.limit).await {
            Ok(Read::One(framed)) => pb::GetStateRequest::decode(&framed[PREFIX..])
                .map_err(|_| Replayed::new(framed, Body::empty())),
            Ok(Read::Other(replayed)) => Err(replayed),
            Err(status) => return Ok(status.into_http()),
        };
        let message = match message {
            Ok(message) => message,
            Err(replayed) => {
                return routes
                    .call(Request::from_parts(parts, Body::new(replayed)))
                    .await
            }
        };
        let request = tonic::Request::from_parts(
            MetadataMap::from_headers(parts.headers),
            parts.extensions,
            message,
        );
        Ok(match self.api.get_state(request).await {
            Ok(response) => answer(response),
            Err(status) => status.into_http(),
        })
    }
}

/// The answer to a call that succeeded, as tonic writes it: the
/// response's metadata and `application/grpc`, then one frame and
/// `grpc-status: 0`.
fn answer(response: tonic::Response<pb::GetStateResponse>) -> Response<Body> {
    let (metadata, reply, extensions) = response.into_parts();
    let body = match one_message(&reply) {
        Ok(body) => body,
        Err(status) => return status.into_http(),
    };
    let mut response = Response::new(body);
    *response.headers_mut() = metadata.into_headers();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    *response.extensions_mut() = extensions;
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_carries_the_grpc_content_type_and_the_response_metadata() {
        let mut response = tonic::Response::new(pb::GetStateResponse::default());
        let value = "v".parse().expect("value");
        response.metadata_mut().insert("x-seen", value);
        let answer = answer(response);
        let headers = answer.headers();
        assert_eq!(
            headers.get(header::CONTENT_TYPE),
            Some(&HeaderValue::from_static("application/grpc"))
        );
        assert_eq!(headers.get("x-seen"), Some(&HeaderValue::from_static("v")));
        assert_eq!(headers.len(), 2);
    }
}
