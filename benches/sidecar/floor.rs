//! The floor of the load part: the two loopback hops alone, with the
//! crates the sidecar uses and nothing else, so the sidecar's rows can be
//! read against what any process in its place would reach.
//!
//! * HTTP: a tokio accept loop whose connections read a request head,
//!   send `HMGET key data version` on one shared multiplexed `redis`
//!   connection and write the value back with a `Content-Length` (no HTTP
//!   library, no routing, no checks, no metrics, no deadline);
//! * gRPC: tonic serving one method, `GetState`, answered the same way;
//! * gRPC before the routes: the same server with `GetState` answered by a
//!   layer in tonic's transport, in front of tonic's router and codec
//!   (what the sidecar's gRPC hot path skips).
//!
//! Both run on their own runtime, with as many workers as the sidecar's
//! (one per CPU, or `TOKIO_WORKER_THREADS`).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::task::{Context, Poll};

use redis::aio::MultiplexedConnection;
use rewire::sidecar::grpc::proto::dapr::proto::runtime::v1::{GetStateRequest, GetStateResponse};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tonic::codegen::{http, BoxFuture, Bytes, Service};
use tonic::server::{Grpc, NamedService, UnaryService};

/// The Redis hash the floors read (`data` and `version` fields, as the
/// redis store keeps a value).
pub const HASH: &str = "floor:key";

/// The floor servers, serving until dropped.
pub struct Floors {
    /// The HTTP floor's address.
    pub http_addr: SocketAddr,
    /// The gRPC floor's address.
    pub grpc_addr: SocketAddr,
    /// The gRPC floor without tonic's router and codec.
    pub grpc_before_routes_addr: SocketAddr,
    _runtime: tokio::runtime::Runtime,
}

/// Starts the floors on the Redis of `client`, storing `value` in
/// [`HASH`] for them.
pub fn start(client: redis::Client, value: &[u8]) -> Floors {
    // Workers as the sidecar's runtime has them (`TOKIO_WORKER_THREADS`
    // sets both).
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("floor runtime");
    let (http_addr, grpc_addr, grpc_before_routes_addr) = runtime.block_on(async {
        // Made here, so its connection is driven by this runtime.
        let mut redis = client
            .get_multiplexed_async_connection()
            .await
            .expect("floor connection");
        redis::cmd("HSET")
            .arg(HASH)
            .arg("data")
            .arg(value)
            .arg("version")
            .arg(1)
            .query_async::<()>(&mut redis)
            .await
            .expect("floor HSET");
        let http = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let grpc = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let before_routes = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addrs = (
            http.local_addr().expect("addr"),
            grpc.local_addr().expect("addr"),
            before_routes.local_addr().expect("addr"),
        );
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(before_routes);
        tokio::spawn(
            tonic::transport::Server::builder()
                .layer(BeforeTheRoutes(redis.clone()))
                .add_service(GetStateOnly(redis.clone()))
                .serve_with_incoming(incoming),
        );
        tokio::spawn(serve_http(http, redis.clone()));
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(grpc);
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(GetStateOnly(redis))
                .serve_with_incoming(incoming),
        );
        addrs
    });
    Floors {
        http_addr,
        grpc_addr,
        grpc_before_routes_addr,
        _runtime: runtime,
    }
}

/// The stored value (empty when there is none).
async fn read(redis: &mut MultiplexedConnection) -> (Vec<u8>, String) {
    let (data, version): (Option<Vec<u8>>, Option<String>) = redis::cmd("HMGET")
        .arg(HASH)
        .arg("data")
        .arg("version")
        .query_async(redis)
        .await
        .expect("floor HMGET");
    (data.unwrap_or_default(), version.unwrap_or_default())
}

async fn serve_http(listener: TcpListener, redis: MultiplexedConnection) {
    while let Ok((stream, _)) = listener.accept().await {
        stream.set_nodelay(true).expect("nodelay");
        tokio::spawn(answer_http(stream, redis.clone()));
    }
}

/// One keep-alive connection: a value per request head (`wrk` sends one
/// request at a time and no body).
async fn answer_http(mut stream: TcpStream, mut redis: MultiplexedConnection) {
    let mut buf = vec![0u8; 4096];
    let mut filled = 0;
    loop {
        let end = loop {
            if let Some(at) = buf[..filled].windows(4).position(|w| w == b"\r\n\r\n") {
                break at + 4;
            }
            if filled == buf.len() {
                return;
            }
            match stream.read(&mut buf[filled..]).await {
                Ok(0) | Err(_) => return,
                Ok(n) => filled += n,
            }
        };
        buf.copy_within(end..filled, 0);
        filled -= end;
        let (data, _) = read(&mut redis).await;
        let mut out = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            data.len()
        )
        .into_bytes();
        out.extend_from_slice(&data);
        if stream.write_all(&out).await.is_err() {
            return;
        }
    }
}

/// A gRPC service with one method, `Dapr/GetState`.
#[derive(Clone)]
struct GetStateOnly(MultiplexedConnection);

impl NamedService for GetStateOnly {
    const NAME: &'static str = "dapr.proto.runtime.v1.Dapr";
}

impl Service<http::Request<tonic::body::Body>> for GetStateOnly {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Infallible>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let redis = self.0.clone();
        Box::pin(async move {
            if request.uri().path() != "/dapr.proto.runtime.v1.Dapr/GetState" {
                return Ok(tonic::Status::unimplemented("").into_http());
            }
            let codec = tonic_prost::ProstCodec::<GetStateResponse, GetStateRequest>::default();
            Ok(Grpc::new(codec).unary(GetState(redis), request).await)
        })
    }
}

struct GetState(MultiplexedConnection);

impl UnaryService<GetStateRequest> for GetState {
    type Response = GetStateResponse;
    type Future = BoxFuture<tonic::Response<GetStateResponse>, tonic::Status>;

    fn call(&mut self, _request: tonic::Request<GetStateRequest>) -> Self::Future {
        let mut redis = self.0.clone();
        Box::pin(async move {
            let (data, etag) = read(&mut redis).await;
            Ok(tonic::Response::new(GetStateResponse {
                data,
                etag,
                ..GetStateResponse::default()
            }))
        })
    }
}

/// `GetState` in tonic's transport without tonic's router and codec: a
/// layer in front of the routes reads the request's one message and
/// writes the answer's frame and `grpc-status` itself (as the sidecar's
/// gRPC hot path does), every other path going on to the routes.
#[derive(Clone)]
struct BeforeTheRoutes(MultiplexedConnection);

impl<S> tower_layer::Layer<S> for BeforeTheRoutes {
    type Service = GetStateBeforeRoutes<S>;

    fn layer(&self, routes: S) -> GetStateBeforeRoutes<S> {
        GetStateBeforeRoutes {
            redis: self.0.clone(),
            routes,
        }
    }
}

#[derive(Clone)]
struct GetStateBeforeRoutes<S> {
    redis: MultiplexedConnection,
    routes: S,
}

type GrpcRequest = http::Request<tonic::body::Body>;
type GrpcResponse = http::Response<tonic::body::Body>;

impl<S> Service<GrpcRequest> for GetStateBeforeRoutes<S>
where
    S: Service<GrpcRequest, Response = GrpcResponse, Error = Infallible>,
    S::Future: Send + 'static,
{
    type Response = GrpcResponse;
    type Error = Infallible;
    type Future = BoxFuture<GrpcResponse, Infallible>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.routes.poll_ready(cx)
    }

    fn call(&mut self, request: GrpcRequest) -> Self::Future {
        if request.uri().path() != "/dapr.proto.runtime.v1.Dapr/GetState" {
            return Box::pin(self.routes.call(request));
        }
        let mut redis = self.redis.clone();
        Box::pin(async move {
            use http_body_util::BodyExt;
            let body = request.into_body().collect().await.expect("floor body");
            let body = body.to_bytes();
            let _request: GetStateRequest =
                prost::Message::decode(body.get(5..).unwrap_or_default()).expect("floor decode");
            let (data, etag) = read(&mut redis).await;
            let reply = GetStateResponse {
                data,
                etag,
                ..GetStateResponse::default()
            };
            let length = u32::try_from(prost::Message::encoded_len(&reply)).expect("small");
            let mut frame = vec![0];
            frame.extend_from_slice(&length.to_be_bytes());
            prost::Message::encode_raw(&reply, &mut frame);
            let mut trailers = http::HeaderMap::new();
            trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
            let body = http_body_util::Full::new(Bytes::from(frame))
                .with_trailers(async move { Some(Ok(trailers)) });
            let mut response = http::Response::new(tonic::body::Body::new(body));
            response.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/grpc"),
            );
            Ok(response)
        })
    }
}
