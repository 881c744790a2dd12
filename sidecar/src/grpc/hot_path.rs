//! The app's unary gRPC calls, answered before tonic's router and codec.
//!
//! Through tonic a unary call pays for the router (axum's matching, a
//! clone of the route's boxed service), the token interceptor (which
//! rebuilds the request around its headers), and the codec's streaming
//! decoder and encoder: through them a state GET reached about 80 % of the
//! throughput of a tonic server with one method and no other work, and
//! answered here 88-101 %, with a ninth fewer instructions per call
//! (`docs/BENCHMARKS.md`, 1r). [`HotPath`] takes the plain form of the
//! data-plane calls itself ([`UnaryMethod`]: Dapr's state, secrets,
//! configuration reads, locks, publishing and metadata; Layotto's state,
//! publishing and sequencer): the method's path, `application/grpc`, no
//! `grpc-encoding`, the app token present where one is required, and a
//! body of one uncompressed message within the size limit that decodes.
//! It calls the same [`Dapr`] or [`Runtime`] method the router would, so
//! observation, deadline and errors are the method's own, and writes the
//! answer as tonic does: one frame, then `grpc-status: 0`, or a
//! trailers-only error.
//!
//! Anything else (another method or service, a stream, a compressed or
//! oversized message, a missing token, a body that does not decode) goes
//! to tonic unchanged, the bytes already read put back in front of the
//! rest of the body (`unary_body`), so tonic answers it as it would have.

use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll};

use tonic::body::Body;
use tonic::codegen::http::request::Parts;
use tonic::codegen::http::{header, HeaderName, HeaderValue, Request, Response};
use tonic::codegen::{BoxFuture, Bytes, Service};
use tonic::metadata::MetadataMap;
use tonic::Status;

use super::auth::RequireToken;
use super::dapr::DaprApi;
use super::layotto::LayottoApi;
use super::proto::dapr::proto::runtime::v1 as pb;
use super::proto::dapr::proto::runtime::v1::dapr_server::Dapr;
use super::proto::spec::proto::runtime::v1 as layotto_pb;
use super::proto::spec::proto::runtime::v1::runtime_server::Runtime;
use super::unary_body::{one_message, read_one_message, Read, Replayed, PREFIX};

/// The header naming a message's compression. Header names are made once
/// here: a name given as text is parsed again on every lookup.
const GRPC_ENCODING: HeaderName = HeaderName::from_static("grpc-encoding");

/// Puts [`HotPath`] in front of the gRPC routes.
#[derive(Clone)]
pub(super) struct HotPathLayer(Arc<Answering>);

/// What the hot path answers with; shared by every connection's service.
struct Answering {
    dapr: Arc<DaprApi>,
    layotto: Arc<LayottoApi>,
    token: RequireToken,
    limit: usize,
}

impl HotPathLayer {
    /// Answers with the services `dapr` and `layotto`, admitting what
    /// `token` (the app token's check, both services') admits and messages
    /// of at most `limit` bytes (both services' decoding limit).
    pub(super) fn new(
        dapr: Arc<DaprApi>,
        layotto: Arc<LayottoApi>,
        token: RequireToken,
        limit: usize,
    ) -> Self {
        Self(Arc::new(Answering {
            dapr,
            layotto,
            token,
            limit,
        }))
    }
}

impl<S> tower_layer::Layer<S> for HotPathLayer {
    type Service = HotPath<S>;

    fn layer(&self, routes: S) -> HotPath<S> {
        HotPath {
            routes,
            answering: Arc::clone(&self.0),
        }
    }
}

/// The gRPC service: the data-plane unary calls in their plain form
/// here, everything else through `routes`.
#[derive(Clone)]
pub(super) struct HotPath<S> {
    routes: S,
    answering: Arc<Answering>,
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
        let method = UnaryMethod::of(request.uri().path());
        let Some(method) = method.filter(|_| self.answering.takes(&request)) else {
            return Box::pin(self.routes.call(request));
        };
        // The routes made ready for this call go with it (tower's rule);
        // a clone stays for the next.
        let clone = self.routes.clone();
        let mut routes = std::mem::replace(&mut self.routes, clone);
        let answering = Arc::clone(&self.answering);
        Box::pin(async move {
            match answering.serve(method, request).await {
                Answered::Here(response) => Ok(response),
                Answered::ByTonic(request) => routes.call(request).await,
            }
        })
    }
}

/// How a call taken by the hot path ends.
enum Answered {
    /// Answered here.
    Here(Response<Body>),
    /// Handed to tonic: the request, its body put back as it came.
    ByTonic(Request<Body>),
}

impl Answering {
    /// Whether `request`'s head is plain: `application/grpc`, no
    /// `grpc-encoding`, and the app token where one is required.
    fn takes(&self, request: &Request<Body>) -> bool {
        let headers = request.headers();
        matches!(
            headers.get(header::CONTENT_TYPE).map(HeaderValue::as_bytes),
            Some(b"application/grpc" | b"application/grpc+proto")
        ) && !headers.contains_key(&GRPC_ENCODING)
            && self.token.admits(headers)
    }

    /// Reads the message, then answers it as `method` or hands the call
    /// back for tonic.
    async fn serve(&self, method: UnaryMethod, request: Request<Body>) -> Answered {
        let (parts, body) = request.into_parts();
        match read_one_message(body, self.limit).await {
            Ok(Read::One(framed)) => self.answer(method, framed, parts).await,
            Ok(Read::Other(replayed)) => by_tonic(parts, replayed),
            Err(status) => Answered::Here(status.into_http()),
        }
    }

    /// Decodes `framed` as `Req` and answers it with `method` (a service's
    /// method); a message that does not decode goes to tonic, which says
    /// why.
    async fn unary<Req, Resp, F, Fut>(framed: Bytes, parts: Parts, method: F) -> Answered
    where
        Req: prost::Message + Default + 'static,
        Resp: prost::Message,
        F: FnOnce(tonic::Request<Req>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<Resp>, Status>>,
    {
        // What it holds decoded is charged first, as tonic's codec does
        // (its body, read whole, was let go of).
        if let Err(status) = super::decoded::admit::<Req>(&framed[PREFIX..], false) {
            return Answered::Here(status.into_http());
        }
        let Ok(message) = Req::decode(&framed[PREFIX..]) else {
            return by_tonic(parts, Replayed::new(framed, Body::empty()));
        };
        let request = tonic::Request::from_parts(
            MetadataMap::from_headers(parts.headers),
            parts.extensions,
            message,
        );
        Answered::Here(match method(request).await {
            Ok(response) => answer(response),
            Err(status) => status.into_http(),
        })
    }
}

/// The call for tonic: its head, and its body put back as it came.
fn by_tonic(parts: Parts, replayed: Replayed) -> Answered {
    Answered::ByTonic(Request::from_parts(parts, Body::new(replayed)))
}

/// The unary methods the hot path answers: `Variant = "/path", service,
/// RequestMessage, handler;` (`service` is the [`Answering`] field
/// serving it, `handler` its method of [`Dapr`] or [`Runtime`]).
macro_rules! unary_methods {
    ($($variant:ident = $path:literal, $service:ident, $request:ty, $handler:ident;)*) => {
        /// A unary method the hot path answers.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        enum UnaryMethod {
            $($variant,)*
        }

        impl UnaryMethod {
            /// The method served at `path`, if the hot path answers it.
            fn of(path: &str) -> Option<Self> {
                match path {
                    $($path => Some(Self::$variant),)*
                    _ => None,
                }
            }
        }

        impl Answering {
            /// Answers `framed` as `method`.
            async fn answer(&self, method: UnaryMethod, framed: Bytes, parts: Parts) -> Answered {
                match method {
                    $(UnaryMethod::$variant => {
                        let service = &*self.$service;
                        Self::unary::<$request, _, _, _>(framed, parts, |request| {
                            service.$handler(request)
                        })
                        .await
                    })*
                }
            }
        }
    };
}

unary_methods! {
    GetState = "/dapr.proto.runtime.v1.Dapr/GetState", dapr, pb::GetStateRequest, get_state;
    GetBulkState = "/dapr.proto.runtime.v1.Dapr/GetBulkState", dapr, pb::GetBulkStateRequest,
        get_bulk_state;
    SaveState = "/dapr.proto.runtime.v1.Dapr/SaveState", dapr, pb::SaveStateRequest, save_state;
    DeleteState = "/dapr.proto.runtime.v1.Dapr/DeleteState", dapr, pb::DeleteStateRequest,
        delete_state;
    ExecuteStateTransaction = "/dapr.proto.runtime.v1.Dapr/ExecuteStateTransaction", dapr,
        pb::ExecuteStateTransactionRequest, execute_state_transaction;
    GetSecret = "/dapr.proto.runtime.v1.Dapr/GetSecret", dapr, pb::GetSecretRequest, get_secret;
    GetBulkSecret = "/dapr.proto.runtime.v1.Dapr/GetBulkSecret", dapr, pb::GetBulkSecretRequest,
        get_bulk_secret;
    GetConfigurationAlpha1 = "/dapr.proto.runtime.v1.Dapr/GetConfigurationAlpha1", dapr,
        pb::GetConfigurationRequest, get_configuration_alpha1;
    GetConfiguration = "/dapr.proto.runtime.v1.Dapr/GetConfiguration", dapr,
        pb::GetConfigurationRequest, get_configuration;
    TryLockAlpha1 = "/dapr.proto.runtime.v1.Dapr/TryLockAlpha1", dapr, pb::TryLockRequest,
        try_lock_alpha1;
    UnlockAlpha1 = "/dapr.proto.runtime.v1.Dapr/UnlockAlpha1", dapr, pb::UnlockRequest,
        unlock_alpha1;
    PublishEvent = "/dapr.proto.runtime.v1.Dapr/PublishEvent", dapr, pb::PublishEventRequest,
        publish_event;
    BulkPublishEventAlpha1 = "/dapr.proto.runtime.v1.Dapr/BulkPublishEventAlpha1", dapr,
        pb::BulkPublishRequest, bulk_publish_event_alpha1;
    BulkPublishEvent = "/dapr.proto.runtime.v1.Dapr/BulkPublishEvent", dapr,
        pb::BulkPublishRequest, bulk_publish_event;
    GetMetadata = "/dapr.proto.runtime.v1.Dapr/GetMetadata", dapr, pb::GetMetadataRequest,
        get_metadata;
    LayottoGetState = "/spec.proto.runtime.v1.Runtime/GetState", layotto,
        layotto_pb::GetStateRequest, get_state;
    LayottoGetBulkState = "/spec.proto.runtime.v1.Runtime/GetBulkState", layotto,
        layotto_pb::GetBulkStateRequest, get_bulk_state;
    LayottoSaveState = "/spec.proto.runtime.v1.Runtime/SaveState", layotto,
        layotto_pb::SaveStateRequest, save_state;
    LayottoDeleteState = "/spec.proto.runtime.v1.Runtime/DeleteState", layotto,
        layotto_pb::DeleteStateRequest, delete_state;
    LayottoPublishEvent = "/spec.proto.runtime.v1.Runtime/PublishEvent", layotto,
        layotto_pb::PublishEventRequest, publish_event;
    LayottoGetNextId = "/spec.proto.runtime.v1.Runtime/GetNextId", layotto,
        layotto_pb::GetNextIdRequest, get_next_id;
}

/// The answer to a call that succeeded, as tonic writes it: the
/// response's metadata and `application/grpc`, then one frame and
/// `grpc-status: 0`.
fn answer<Resp: prost::Message>(response: tonic::Response<Resp>) -> Response<Body> {
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
