//! What a server (or anyone between it and the client on a plain
//! `http://` connection) can make the client do: announce an answer of
//! 2 GiB, and see pings on a connection no call uses.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tonic::codegen::{http, BoxFuture, Context, Poll, Service};
use tonic::server::NamedService;
use tonic::transport::server::TcpIncoming;

use super::{Client, ConnectOptions, DEFAULT_MAX_RESPONSE_SIZE};
use crate::error::Error;

/// The first bytes of a `Range` answer announcing a message of
/// 0x7f7f7f7f bytes (almost 2 GiB; each byte ASCII, so the body can be a
/// `String`), of which it sends a few before it ends.
const HUGE_ANNOUNCED: &str = "\0\x7f\x7f\x7f\x7fonly these";

/// A fake etcd whose `Range` (or, as `Announcer<true>`, `Watch`) answers
/// [`HUGE_ANNOUNCED`].
#[derive(Clone)]
struct Announcer<const WATCH: bool>;

impl NamedService for Announcer<false> {
    const NAME: &'static str = "etcdserverpb.KV";
}

impl NamedService for Announcer<true> {
    const NAME: &'static str = "etcdserverpb.Watch";
}

impl<const WATCH: bool> Service<http::Request<tonic::body::Body>> for Announcer<WATCH> {
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let expected = if WATCH {
            "/etcdserverpb.Watch/Watch"
        } else {
            "/etcdserverpb.KV/Range"
        };
        assert_eq!(request.uri().path(), expected);
        Box::pin(async move {
            let body = tonic::body::Body::new(HUGE_ANNOUNCED.to_string());
            Ok(http::Response::builder()
                .status(200)
                .header("content-type", "application/grpc")
                .body(body)
                .expect("response"))
        })
    }
}

/// Serves `service` on a free loopback port; returns its address.
fn serve<S>(service: S) -> std::net::SocketAddr
where
    S: Service<
            http::Request<tonic::body::Body>,
            Response = http::Response<tonic::body::Body>,
            Error = std::convert::Infallible,
        > + NamedService
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
{
    let incoming = TcpIncoming::bind("127.0.0.1:0".parse().expect("address")).expect("bind");
    let address = incoming.local_addr().expect("local address");
    let router = tonic::transport::Server::builder().add_service(service);
    tokio::spawn(router.serve_with_incoming(incoming));
    address
}

fn quick(options: ConnectOptions) -> ConnectOptions {
    ConnectOptions {
        connect_timeout: Duration::from_secs(2),
        timeout: Duration::from_secs(5),
        ..options
    }
}

#[tokio::test]
async fn an_answer_announcing_2_gib_is_refused_by_default_before_it_is_buffered() {
    let url = format!("http://{}", serve(Announcer::<false>));
    let client = Client::connect(&[url], quick(ConnectOptions::default()))
        .await
        .unwrap_or_else(|e| panic!("connect: {e}"));
    // With the limit at 2 GiB the decoder reserved the 2 GiB announced,
    // then found the body ended: another error.
    let refused = client.get("k").await.map(drop);
    assert!(
        matches!(&refused, Err(err) if err.is_too_large() && !err.is_unreachable()),
        "{refused:?}"
    );
    let Err(Error::TooLarge { limit, .. }) = refused else {
        unreachable!("checked above");
    };
    assert_eq!(limit, DEFAULT_MAX_RESPONSE_SIZE);
    assert_eq!(limit, 64 * 1024 * 1024);
}

#[tokio::test]
async fn an_answer_over_the_limit_names_the_limit_and_the_setting_that_raises_it() {
    let url = format!("http://{}", serve(Announcer::<false>));
    let options = ConnectOptions {
        max_response_size: 4096,
        max_response_size_setting: Some("maxResponseBytes"),
        ..ConnectOptions::default()
    };
    let client = Client::connect(&[url], quick(options))
        .await
        .unwrap_or_else(|e| panic!("connect: {e}"));
    let refused = client.get("k").await.map(drop);
    let Err(err @ Error::TooLarge { .. }) = refused else {
        panic!("{refused:?}");
    };
    let text = err.to_string();
    assert!(text.contains("4096 bytes"), "{text}");
    assert!(text.contains("`maxResponseBytes`"), "{text}");
    assert!(text.contains("2139062143"), "the size announced: {text}");
}

#[tokio::test]
async fn a_watch_response_over_the_limit_names_the_setting_that_raises_it() {
    let url = format!("http://{}", serve(Announcer::<true>));
    let options = ConnectOptions {
        max_response_size_setting: Some("maxResponseBytes"),
        ..ConnectOptions::default()
    };
    let client = Client::connect(&[url], quick(options))
        .await
        .unwrap_or_else(|e| panic!("connect: {e}"));
    let mut watch = client
        .watch(crate::pb::WatchCreateRequest::default())
        .await
        .unwrap_or_else(|e| panic!("watch: {e}"));
    let refused = watch.message().await;
    let Err(err @ Error::TooLarge { .. }) = refused else {
        panic!("{refused:?}");
    };
    assert!(err.to_string().contains("`maxResponseBytes`"), "{err}");
}

/// The HTTP/2 client preface, before the first frame.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// An HTTP/2 frame header: length (3), type (1), flags (1), stream (4).
const FRAME_HEADER: usize = 9;
/// The frame type of a PING.
const PING: u8 = 0x6;
/// The flag of a PING that answers one.
const ACK: u8 = 0x1;

/// Relays one connection at a time to `upstream`, counting the PINGs the
/// client sends (not its answers to the server's).
async fn count_pings(
    listener: TcpListener,
    upstream: std::net::SocketAddr,
    pings: Arc<AtomicUsize>,
) {
    while let Ok((client, _)) = listener.accept().await {
        let Ok(server) = TcpStream::connect(upstream).await else {
            return;
        };
        let (mut from_client, mut to_client) = client.into_split();
        let (mut from_server, mut to_server) = server.into_split();
        tokio::spawn(async move { tokio::io::copy(&mut from_server, &mut to_client).await });
        let pings = Arc::clone(&pings);
        tokio::spawn(async move {
            let mut seen = Vec::new();
            let mut parsed = PREFACE.len();
            let mut chunk = [0u8; 16 * 1024];
            while let Ok(read) = from_client.read(&mut chunk).await {
                if read == 0 || to_server.write_all(&chunk[..read]).await.is_err() {
                    return;
                }
                seen.extend_from_slice(&chunk[..read]);
                while seen.len() >= parsed + FRAME_HEADER {
                    let header = &seen[parsed..parsed + FRAME_HEADER];
                    let length = usize::from(header[0]) << 16
                        | usize::from(header[1]) << 8
                        | usize::from(header[2]);
                    if header[3] == PING && header[4] & ACK == 0 {
                        pings.fetch_add(1, Ordering::AcqRel);
                    }
                    parsed += FRAME_HEADER + length;
                }
            }
        });
    }
}

/// A fake etcd answering every `Range` with an empty answer.
#[derive(Clone)]
struct EmptyRanges;

impl NamedService for EmptyRanges {
    const NAME: &'static str = "etcdserverpb.KV";
}

impl Service<http::Request<tonic::body::Body>> for EmptyRanges {
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        struct Range;
        impl tonic::server::UnaryService<crate::pb::RangeRequest> for Range {
            type Response = crate::pb::RangeResponse;
            type Future = BoxFuture<tonic::Response<Self::Response>, tonic::Status>;
            fn call(&mut self, _: tonic::Request<crate::pb::RangeRequest>) -> Self::Future {
                Box::pin(async { Ok(tonic::Response::new(crate::pb::RangeResponse::default())) })
            }
        }
        Box::pin(async move {
            Ok(tonic::server::Grpc::new(tonic_prost::ProstCodec::default())
                .unary(Range, request)
                .await)
        })
    }
}

/// etcd (grpc-go, `PermitWithoutStream: false`) counts a ping on a
/// connection without a stream as a strike, and closes the connection
/// after two: the client sends none while idle, however short its
/// interval.
#[tokio::test]
async fn no_ping_goes_out_while_no_call_is_open() {
    let upstream = serve(EmptyRanges);
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let relay = listener.local_addr().expect("local address");
    let pings = Arc::new(AtomicUsize::new(0));
    tokio::spawn(count_pings(listener, upstream, Arc::clone(&pings)));
    let interval = Duration::from_millis(20);
    let options = ConnectOptions {
        keep_alive: Some((interval, Duration::from_secs(5))),
        ..ConnectOptions::default()
    };
    let client = Client::connect(&[format!("http://{relay}")], quick(options))
        .await
        .unwrap_or_else(|e| panic!("connect: {e}"));
    client
        .get("k")
        .await
        .unwrap_or_else(|e| panic!("first read: {e}"));
    let before = pings.load(Ordering::Acquire);
    // Idle for 25 intervals (pinging while idle sends one per interval).
    tokio::time::sleep(interval * 25).await;
    let idle = pings.load(Ordering::Acquire) - before;
    assert_eq!(idle, 0, "pings sent while no call was open");
}

/// A fake etcd whose `Watch` answers `created` and then nothing, the
/// stream left open.
#[derive(Clone)]
struct OpenWatch;

impl NamedService for OpenWatch {
    const NAME: &'static str = "etcdserverpb.Watch";
}

impl Service<http::Request<tonic::body::Body>> for OpenWatch {
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        use tokio_stream::StreamExt;
        type Responses = std::pin::Pin<
            Box<
                dyn tokio_stream::Stream<Item = Result<crate::pb::WatchResponse, tonic::Status>>
                    + Send,
            >,
        >;
        struct Watch;
        impl tonic::server::StreamingService<crate::pb::WatchRequest> for Watch {
            type Response = crate::pb::WatchResponse;
            type ResponseStream = Responses;
            type Future = BoxFuture<tonic::Response<Self::ResponseStream>, tonic::Status>;
            fn call(
                &mut self,
                _: tonic::Request<tonic::Streaming<crate::pb::WatchRequest>>,
            ) -> Self::Future {
                let created = crate::pb::WatchResponse {
                    created: true,
                    ..crate::pb::WatchResponse::default()
                };
                let responses = tokio_stream::once(Ok(created)).chain(tokio_stream::pending());
                Box::pin(async move { Ok(tonic::Response::new(Box::pin(responses) as Responses)) })
            }
        }
        Box::pin(async move {
            Ok(tonic::server::Grpc::new(tonic_prost::ProstCodec::default())
                .streaming(Watch, request)
                .await)
        })
    }
}

/// The other side of [`no_ping_goes_out_while_no_call_is_open`]: with a
/// watch open, the pings go out (else a member gone silent under a watch
/// would not be found out by them).
#[tokio::test]
async fn pings_go_out_while_a_watch_is_open() {
    let upstream = serve(OpenWatch);
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let relay = listener.local_addr().expect("local address");
    let pings = Arc::new(AtomicUsize::new(0));
    tokio::spawn(count_pings(listener, upstream, Arc::clone(&pings)));
    let interval = Duration::from_millis(20);
    let options = ConnectOptions {
        keep_alive: Some((interval, Duration::from_secs(5))),
        ..ConnectOptions::default()
    };
    let client = Client::connect(&[format!("http://{relay}")], quick(options))
        .await
        .unwrap_or_else(|e| panic!("connect: {e}"));
    let mut watch = client
        .watch(crate::pb::WatchCreateRequest::default())
        .await
        .unwrap_or_else(|e| panic!("watch: {e}"));
    let created = watch.message().await;
    assert!(
        matches!(&created, Ok(Some(response)) if response.created),
        "{created:?}"
    );
    // Idle for 25 intervals, the watch open: at least one ping.
    tokio::time::sleep(interval * 25).await;
    assert!(
        pings.load(Ordering::Acquire) >= 1,
        "no ping went out while a watch was open"
    );
    drop(watch);
}
