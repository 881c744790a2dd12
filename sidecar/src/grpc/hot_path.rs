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
//! ([`Replayed`]), so tonic answers it as it would have.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http_body::{Body as _, Frame};
use prost::Message as _;
use tonic::body::Body;
use tonic::codegen::http::{header, HeaderMap, HeaderName, HeaderValue, Request, Response};
use tonic::codegen::{BoxFuture, Bytes, Service};
use tonic::metadata::MetadataMap;
use tonic::Status;

use super::auth::RequireToken;
use super::dapr::DaprApi;
use super::proto::dapr::proto::runtime::v1 as pb;
use super::proto::dapr::proto::runtime::v1::dapr_server::Dapr;

/// The path of the one method the hot path takes.
const GET_STATE: &str = "/dapr.proto.runtime.v1.Dapr/GetState";
/// A gRPC message's prefix: a compression flag and a 4-byte length.
const PREFIX: usize = 5;
/// The header naming a message's compression. Header names are made once
/// here: a name given as text is parsed again on every lookup.
const GRPC_ENCODING: HeaderName = HeaderName::from_static("grpc-encoding");
/// The trailer carrying a call's status code.
const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");

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

/// What a request's body held.
enum Read {
    /// One uncompressed message, its prefix included, and nothing else.
    One(Bytes),
    /// Anything else, to be read again from the start.
    Other(Replayed),
}

/// Reads `body` while it can be one message of at most `limit` bytes.
async fn read_one_message(mut body: Body, limit: usize) -> Result<Read, Status> {
    let mut read = Vec::new();
    while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
        // A request's trailers carry nothing gRPC reads.
        let Ok(data) = frame?.into_data() else {
            continue;
        };
        read.extend_from_slice(&data);
        if read.len() > PREFIX + limit {
            return Ok(Read::Other(Replayed::new(read.into(), body)));
        }
    }
    let read = Bytes::from(read);
    Ok(match read.get(..PREFIX) {
        Some([0, length @ ..]) if declared(length) == Some(read.len() - PREFIX) => Read::One(read),
        _ => Read::Other(Replayed::new(read, Body::empty())),
    })
}

/// The length a message's prefix declares.
fn declared(length: &[u8]) -> Option<usize> {
    let length: [u8; 4] = length.try_into().ok()?;
    usize::try_from(u32::from_be_bytes(length)).ok()
}

/// The answer to a call that succeeded, as tonic writes it: the
/// response's metadata and `application/grpc`, one frame, `grpc-status: 0`.
fn answer(response: tonic::Response<pb::GetStateResponse>) -> Response<Body> {
    let (metadata, reply, extensions) = response.into_parts();
    let length = reply.encoded_len();
    let Ok(prefix) = u32::try_from(length) else {
        return Status::resource_exhausted(format!(
            "the answer of {length} bytes is larger than a gRPC message can be"
        ))
        .into_http();
    };
    let mut frame = Vec::with_capacity(PREFIX + length);
    frame.push(0);
    frame.extend_from_slice(&prefix.to_be_bytes());
    reply.encode_raw(&mut frame);
    // What tonic's `Status::ok("")` puts in the trailers, without making
    // a status to write it.
    let mut trailers = HeaderMap::with_capacity(1);
    trailers.insert(GRPC_STATUS, HeaderValue::from_static("0"));
    let mut response = Response::new(Body::new(OneMessage {
        frame: Some(frame.into()),
        trailers: Some(trailers),
    }));
    *response.headers_mut() = metadata.into_headers();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    *response.extensions_mut() = extensions;
    response
}

/// An answer's body: one frame, then the trailers.
struct OneMessage {
    frame: Option<Bytes>,
    trailers: Option<HeaderMap>,
}

impl http_body::Body for OneMessage {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let frame = match (self.frame.take(), self.trailers.take()) {
            (Some(data), trailers) => {
                self.trailers = trailers;
                Frame::data(data)
            }
            (None, Some(trailers)) => Frame::trailers(trailers),
            (None, None) => return Poll::Ready(None),
        };
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.frame.is_none() && self.trailers.is_none()
    }
}

/// A request body whose first bytes were already read: those, then the
/// rest.
struct Replayed {
    read: Option<Bytes>,
    rest: Body,
}

impl Replayed {
    fn new(read: Bytes, rest: Body) -> Self {
        Self {
            read: Some(read).filter(|read| !read.is_empty()),
            rest,
        }
    }
}

impl http_body::Body for Replayed {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        match self.read.take() {
            Some(read) => Poll::Ready(Some(Ok(Frame::data(read)))),
            None => Pin::new(&mut self.rest).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.read.is_none() && self.rest.is_end_stream()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A body of `chunks`, one data frame each.
    fn body(chunks: &[&[u8]]) -> Body {
        chunks.iter().rev().fold(Body::empty(), |rest, chunk| {
            Body::new(Replayed::new(Bytes::copy_from_slice(chunk), rest))
        })
    }

    /// Every data byte of `body`, and its trailers.
    async fn drain<B>(mut body: B) -> (Vec<u8>, Option<HeaderMap>)
    where
        B: http_body::Body<Data = Bytes> + Unpin,
        B::Error: std::fmt::Debug,
    {
        let (mut data, mut trailers) = (Vec::new(), None);
        while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await
        {
            match frame.expect("frame").into_data() {
                Ok(bytes) => data.extend_from_slice(&bytes),
                Err(frame) => trailers = frame.into_trailers().ok(),
            }
        }
        (data, trailers)
    }

    fn framed(flag: u8, message: &[u8]) -> Vec<u8> {
        let mut framed = vec![flag];
        framed.extend_from_slice(&u32::try_from(message.len()).expect("small").to_be_bytes());
        framed.extend_from_slice(message);
        framed
    }

    #[tokio::test]
    async fn one_uncompressed_message_is_read_whole_across_chunks() {
        let framed = framed(0, b"abcdef");
        let read = read_one_message(body(&[&framed[..3], &framed[3..]]), 64).await;
        assert!(matches!(read, Ok(Read::One(bytes)) if bytes[..] == framed[..]));
    }

    #[tokio::test]
    async fn anything_else_is_replayed_byte_for_byte() {
        let compressed = framed(1, b"abcdef");
        let mut two = framed(0, b"ab");
        two.extend_from_slice(&framed(0, b"cd"));
        let short = framed(0, b"abcdef")[..7].to_vec();
        for bytes in [compressed, two, short, vec![0, 0]] {
            let Ok(Read::Other(replayed)) = read_one_message(body(&[&bytes]), 64).await else {
                panic!("{bytes:?} was taken as one message");
            };
            assert_eq!(drain(replayed).await.0, bytes);
        }
    }

    #[tokio::test]
    async fn a_body_over_the_limit_stops_being_read_and_is_replayed_whole() {
        let framed = framed(0, &[7; 25]);
        let chunks = [&framed[..10], &framed[10..20], &framed[20..]];
        let Ok(Read::Other(replayed)) = read_one_message(body(&chunks), 8).await else {
            panic!("over the limit was taken");
        };
        // Read as far as the second chunk (past 5 + 8 bytes); the third is
        // still in the rest.
        assert_eq!(replayed.read.as_ref().map(Bytes::len), Some(20));
        assert_eq!(drain(replayed).await.0, framed);
    }

    #[tokio::test]
    async fn an_answer_is_one_frame_then_grpc_status_0() {
        let reply = pb::GetStateResponse {
            data: b"value".to_vec(),
            etag: "3".into(),
            ..pb::GetStateResponse::default()
        };
        let response = answer(tonic::Response::new(reply.clone()));
        assert_eq!(
            response.headers().get(header::CONTENT_TYPE),
            Some(&HeaderValue::from_static("application/grpc"))
        );
        let (data, trailers) = drain(response.into_body()).await;
        assert_eq!(data, framed(0, &reply.encode_to_vec()));
        let trailers = trailers.expect("trailers");
        assert_eq!(
            trailers.get("grpc-status"),
            Some(&HeaderValue::from_static("0"))
        );
        assert_eq!(trailers.len(), 1);
    }
}
