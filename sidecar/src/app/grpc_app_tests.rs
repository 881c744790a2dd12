//! Tests of [`GrpcApp`](super::GrpcApp) and Dapr's `AppCallback` calls
//! (`grpc_route`): listing and delivery against apps serving one
//! service or the other.

use super::super::subscriptions::Listing;
use super::*;
use crate::grpc::proto::dapr::proto::runtime::v1 as pb;
use crate::grpc::proto::spec::proto::runtime::v1 as layotto;
use rewire_runtime::DeliveryOutcome;
use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tonic::body::Body;
use tonic::codegen::http;

/// A body that never yields a frame (no message, no trailers).
struct Stalled;

impl http_body::Body for Stalled {
    type Data = prost::bytes::Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Poll::Pending
    }
}

/// An `AppCallback` that answers every call with `200
/// application/grpc` headers, then stalls.
#[derive(Clone)]
struct HeadersOnly;

impl tonic::server::NamedService for HeadersOnly {
    const NAME: &'static str = "dapr.proto.runtime.v1.AppCallback";
}

impl tower_service::Service<http::Request<Body>> for HeadersOnly {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: http::Request<Body>) -> Self::Future {
        let mut response = http::Response::new(Body::new(Stalled));
        response.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/grpc"),
        );
        std::future::ready(Ok(response))
    }
}

/// A free local port, and the connections it accepts (for a test app).
async fn free_port() -> (
    u16,
    impl futures_util::Stream<Item = std::io::Result<tokio::net::TcpStream>>,
) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("port").port();
    let incoming = futures_util::stream::unfold(listener, |listener| async move {
        let accepted = listener.accept().await.map(|(stream, _)| stream);
        Some((accepted, listener))
    });
    (port, incoming)
}

/// A client of a [`HeadersOnly`] app on a free port, over a channel
/// as the sidecar's (whose timeout bounds only the answer's headers).
async fn stalling_app() -> GrpcApp {
    let (port, incoming) = free_port().await;
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(HeadersOnly)
            .serve_with_incoming(incoming),
    );
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
        .expect("endpoint")
        .timeout(Duration::from_secs(60));
    GrpcApp::new(endpoint.connect_lazy())
}

/// Fails (rather than hangs) a call that outlives every deadline.
async fn bounded<T>(call: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(20), call)
        .await
        .expect("the call outlived its deadline")
}

#[tokio::test]
async fn an_app_that_answers_headers_then_stalls_is_given_up_on_within_the_deadline() {
    let client = stalling_app().await;
    let event = TopicEvent {
        cloud_event: Default::default(),
        routed: Default::default(),
        id: "e1".into(),
        data_content_type: "text/plain".into(),
        data: b"x".to_vec(),
        data_unreadable: None,
        body: Vec::new(),
        metadata: Default::default(),
        pubsub_name: "bus".into(),
        topic: "orders".into(),
    };
    let within = Duration::from_millis(300);
    let outcome = bounded(client.deliver("/orders", &event, within)).await;
    assert_eq!(outcome, DeliveryOutcome::Retry);
    let listed = bounded(client.list_once(within)).await;
    assert!(
        matches!(listed, Listing::Unanswered(_)),
        "a stalled listing is no answer"
    );
}

#[tokio::test]
async fn an_event_whose_payload_cannot_be_read_is_retried_without_calling_the_app() {
    let client = stalling_app().await;
    let event = TopicEvent {
        cloud_event: Default::default(),
        routed: Default::default(),
        id: "e1".into(),
        data_content_type: "application/octet-stream".into(),
        data: Vec::new(),
        data_unreadable: Some("its `data_base64` is not base64".into()),
        body: Vec::new(),
        metadata: Default::default(),
        pubsub_name: "bus".into(),
        topic: "orders".into(),
    };
    // Called, the stalling app would hold the delivery for its minute.
    let outcome = tokio::time::timeout(
        Duration::from_secs(5),
        client.deliver("/orders", &event, Duration::from_secs(60)),
    )
    .await
    .expect("answered without calling the app");
    assert_eq!(outcome, DeliveryOutcome::Retry);
}

/// An app whose `ListTopicSubscriptions` answers each status of
/// `failures` in turn (as a mesh proxy or a starting framework does),
/// then lists one subscription to `orders`; it counts the calls.
struct FailingFirst {
    failures: std::sync::Mutex<Vec<tonic::Code>>,
    calls: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

#[tonic::async_trait]
impl pb::app_callback_server::AppCallback for FailingFirst {
    async fn list_topic_subscriptions(
        &self,
        _: tonic::Request<()>,
    ) -> Result<tonic::Response<pb::ListTopicSubscriptionsResponse>, tonic::Status> {
        self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let failure = {
            let mut failures = self.failures.lock().expect("lock");
            (!failures.is_empty()).then(|| failures.remove(0))
        };
        if let Some(code) = failure {
            return Err(tonic::Status::new(code, "not ready"));
        }
        Ok(tonic::Response::new(pb::ListTopicSubscriptionsResponse {
            subscriptions: vec![pb::TopicSubscription {
                pubsub_name: "bus".into(),
                topic: "orders".into(),
                ..Default::default()
            }],
        }))
    }

    async fn on_topic_event(
        &self,
        _: tonic::Request<pb::TopicEventRequest>,
    ) -> Result<tonic::Response<pb::TopicEventResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("no events here"))
    }
}

/// A client of a [`FailingFirst`] app answering `failures` first, and
/// its count of listing calls.
async fn app_failing_first(
    failures: Vec<tonic::Code>,
) -> (GrpcApp, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    let (port, incoming) = free_port().await;
    let calls = std::sync::Arc::default();
    let app = FailingFirst {
        failures: std::sync::Mutex::new(failures),
        calls: std::sync::Arc::clone(&calls),
    };
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(pb::app_callback_server::AppCallbackServer::new(app))
            .serve_with_incoming(incoming),
    );
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
        .expect("endpoint");
    (GrpcApp::new(endpoint.connect_lazy()), calls)
}

/// A first `UNAVAILABLE` (a mesh proxy before the app is up) is asked
/// again: the app's subscription is taken, not lost until a restart.
#[tokio::test]
async fn a_listing_answered_unavailable_first_is_asked_again_and_taken() {
    let (client, calls) = app_failing_first(vec![tonic::Code::Unavailable]).await;
    let listed = bounded(ask_app(&client, &CancellationToken::new()))
        .await
        .expect("not stopped");
    let topics: Vec<&str> = listed.iter().map(|s| s.topic.as_str()).collect();
    assert_eq!(topics, ["orders"]);
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 2);
}

/// `UNIMPLEMENTED` means no subscriptions, at once, as Dapr takes it.
#[tokio::test]
async fn a_listing_answered_unimplemented_is_none_and_not_asked_again() {
    let (client, calls) = app_failing_first(vec![tonic::Code::Unimplemented]).await;
    let listed = bounded(ask_app(&client, &CancellationToken::new()))
        .await
        .expect("not stopped");
    assert!(listed.is_empty());
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 1);
}

/// A Layotto app: only Layotto's `AppCallback`, whose `OnTopicEvent`
/// answers `status` to everything.
struct LayottoApp {
    status: layotto::topic_event_response::TopicEventResponseStatus,
}

#[tonic::async_trait]
impl layotto::app_callback_server::AppCallback for LayottoApp {
    async fn list_topic_subscriptions(
        &self,
        _: tonic::Request<()>,
    ) -> Result<tonic::Response<layotto::ListTopicSubscriptionsResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("events only"))
    }

    async fn on_topic_event(
        &self,
        _: tonic::Request<layotto::TopicEventRequest>,
    ) -> Result<tonic::Response<layotto::TopicEventResponse>, tonic::Status> {
        Ok(tonic::Response::new(layotto::TopicEventResponse {
            status: self.status as i32,
        }))
    }
}

/// Dapr's `OnTopicEvent` unimplemented is not the end of an event when
/// the app serves Layotto's: its answer (here RETRY) is the outcome,
/// not an acknowledgement; an app serving neither has the event
/// acknowledged, as daprd.
#[tokio::test]
async fn an_event_dapr_s_callback_does_not_implement_goes_to_layotto_s() {
    use layotto::topic_event_response::TopicEventResponseStatus as Status;
    let (port, incoming) = free_port().await;
    let app = LayottoApp {
        status: Status::Retry,
    };
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(layotto::app_callback_server::AppCallbackServer::new(app))
            .serve_with_incoming(incoming),
    );
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
        .expect("endpoint");
    let app = GrpcApp::new(endpoint.connect_lazy());
    let event = TopicEvent {
        cloud_event: Default::default(),
        routed: Default::default(),
        id: "e1".into(),
        data_content_type: "text/plain".into(),
        data: b"x".to_vec(),
        data_unreadable: None,
        body: Vec::new(),
        metadata: Default::default(),
        pubsub_name: "bus".into(),
        topic: "orders".into(),
    };
    let within = Duration::from_secs(10);
    for attempt in 0..2 {
        let outcome = bounded(app.deliver("", &event, within)).await;
        assert_eq!(outcome, DeliveryOutcome::Retry, "attempt {attempt}");
    }
    let (neither, _) = app_failing_first(Vec::new()).await;
    let outcome = bounded(neither.deliver("", &event, within)).await;
    assert_eq!(outcome, DeliveryOutcome::Success);
}

/// Layotto's `AppCallback` whose `OnTopicEvent` never answers (a hung
/// handler, a proxy holding the call).
struct UnansweringLayotto;

#[tonic::async_trait]
impl layotto::app_callback_server::AppCallback for UnansweringLayotto {
    async fn list_topic_subscriptions(
        &self,
        _: tonic::Request<()>,
    ) -> Result<tonic::Response<layotto::ListTopicSubscriptionsResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("events only"))
    }

    async fn on_topic_event(
        &self,
        _: tonic::Request<layotto::TopicEventRequest>,
    ) -> Result<tonic::Response<layotto::TopicEventResponse>, tonic::Status> {
        std::future::pending().await
    }
}

/// Dapr's `OnTopicEvent` answered `UNIMPLEMENTED` and Layotto's not
/// answered in time: the event is retried and the app is still taken
/// to speak Dapr's. Before: the timeout counted as Layotto's answer
/// and switched the app to Layotto's for every later event.
#[tokio::test]
async fn the_other_service_timing_out_does_not_switch_the_app_s_flavour() {
    let (port, incoming) = free_port().await;
    let dapr = FailingFirst {
        failures: std::sync::Mutex::new(Vec::new()),
        calls: std::sync::Arc::default(),
    };
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(pb::app_callback_server::AppCallbackServer::new(dapr))
            .add_service(layotto::app_callback_server::AppCallbackServer::new(
                UnansweringLayotto,
            ))
            .serve_with_incoming(incoming),
    );
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
        .expect("endpoint");
    let app = GrpcApp::new(endpoint.connect_lazy());
    let event = TopicEvent {
        cloud_event: Default::default(),
        routed: Default::default(),
        id: "e1".into(),
        data_content_type: "text/plain".into(),
        data: b"x".to_vec(),
        data_unreadable: None,
        body: Vec::new(),
        metadata: Default::default(),
        pubsub_name: "bus".into(),
        topic: "orders".into(),
    };
    let outcome = bounded(app.deliver("/orders", &event, Duration::from_millis(300))).await;
    assert_eq!(outcome, DeliveryOutcome::Retry);
    assert_eq!(app.flavour(), Flavour::Dapr);
}

/// Dapr's `AppCallback` refusing (`UNAUTHENTICATED`) every call whose
/// `dapr-api-token` metadata is not `token`: it lists one subscription
/// and acknowledges every event.
struct RequiringToken {
    token: &'static str,
}

impl RequiringToken {
    fn check<T>(&self, request: &tonic::Request<T>) -> Result<(), tonic::Status> {
        let presented = request.metadata().get("dapr-api-token");
        if presented.map(|v| v.as_bytes()) != Some(self.token.as_bytes()) {
            return Err(tonic::Status::unauthenticated("no app token"));
        }
        Ok(())
    }
}

#[tonic::async_trait]
impl pb::app_callback_server::AppCallback for RequiringToken {
    async fn list_topic_subscriptions(
        &self,
        request: tonic::Request<()>,
    ) -> Result<tonic::Response<pb::ListTopicSubscriptionsResponse>, tonic::Status> {
        self.check(&request)?;
        Ok(tonic::Response::new(pb::ListTopicSubscriptionsResponse {
            subscriptions: vec![pb::TopicSubscription {
                pubsub_name: "bus".into(),
                topic: "orders".into(),
                ..Default::default()
            }],
        }))
    }

    async fn on_topic_event(
        &self,
        request: tonic::Request<pb::TopicEventRequest>,
    ) -> Result<tonic::Response<pb::TopicEventResponse>, tonic::Status> {
        self.check(&request)?;
        Ok(tonic::Response::new(pb::TopicEventResponse {
            status: pb::topic_event_response::TopicEventResponseStatus::Success as i32,
        }))
    }
}

/// With `APP_API_TOKEN` set, every gRPC call to the app carries it as its
/// `dapr-api-token` metadata (as Dapr), over a publisher's own: the
/// listing is taken and an event delivered. Before, it was never sent.
#[tokio::test]
async fn the_app_token_is_sent_on_every_grpc_call_to_the_app() {
    let (port, incoming) = free_port().await;
    let app = RequiringToken { token: "s3cret" };
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(pb::app_callback_server::AppCallbackServer::new(app))
            .serve_with_incoming(incoming),
    );
    let channel = super::super::AppChannel::local(port)
        .with_protocol(super::super::AppProtocol::Grpc)
        .with_app_token(Some(rewire_runtime::SecretString::new("s3cret")));
    let Some(super::super::routed::AppTarget::Grpc(app)) =
        super::super::routed::AppTarget::connect(&channel)
    else {
        panic!("a gRPC app");
    };
    let Listing::Answered(listed) = bounded(app.list_once(Duration::from_secs(10))).await else {
        panic!("the listing was refused");
    };
    assert_eq!(listed.len(), 1);
    let message = rewire_runtime::Message {
        topic: "orders".into(),
        data: b"x".to_vec(),
        metadata: std::collections::HashMap::from([(
            "dapr-api-token".to_string(),
            "a publisher's".to_string(),
        )]),
        ..Default::default()
    };
    let event = TopicEvent::of(&message, "bus", "orders");
    let outcome = bounded(app.deliver("/orders", &event, Duration::from_secs(10))).await;
    assert_eq!(outcome, DeliveryOutcome::Success);
}

/// An embedder's [`GrpcRoute`] built [`with_token`](GrpcRoute::with_token)
/// delivers to an app that requires the token; one built with
/// [`new`](GrpcRoute::new) sends none and is refused. A token that cannot
/// be metadata is an error that does not say it.
#[tokio::test]
async fn a_grpc_route_built_with_a_token_delivers_to_an_app_requiring_it() {
    let (port, incoming) = free_port().await;
    let app = RequiringToken { token: "s3cret" };
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(pb::app_callback_server::AppCallbackServer::new(app))
            .serve_with_incoming(incoming),
    );
    let channel = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
        .expect("endpoint")
        .connect_lazy();
    let message = rewire_runtime::Message {
        topic: "orders".into(),
        data: b"x".to_vec(),
        ..Default::default()
    };
    let event = TopicEvent::of(&message, "bus", "orders");
    let token = Some(rewire_runtime::SecretString::new("s3cret"));
    let route = GrpcRoute::with_token(channel.clone(), "/orders".into(), token).expect("a token");
    let outcome = bounded(route.send(&event, Duration::from_secs(10))).await;
    assert_eq!(outcome, DeliveryOutcome::Success);
    let untokened = GrpcRoute::new(channel.clone(), "/orders".into());
    let outcome = bounded(untokened.send(&event, Duration::from_secs(10))).await;
    assert_ne!(outcome, DeliveryOutcome::Success);
    let bad = Some(rewire_runtime::SecretString::new("s3cret\n"));
    let Err(refused) = GrpcRoute::with_token(channel, "/orders".into(), bad) else {
        panic!("a token with a line feed was taken");
    };
    assert!(
        refused.contains("app token") && !refused.contains("s3cret"),
        "{refused}"
    );
}

/// A delivery whose call could not connect to the app (nothing listens on
/// its port: a restart) is told apart from one the app answered: `None`,
/// so the engine waits for the app ([`GrpcApp::reachable`], its port)
/// rather than spend an attempt, and dead-letter the event within seconds.
/// Once the app listens the event is delivered; an error the app answers
/// itself (`UNAUTHENTICATED`) is an answer, a retry that spends one.
#[tokio::test]
async fn a_delivery_that_could_not_connect_waits_for_the_app_s_port() {
    let (port, incoming) = free_port().await;
    drop(incoming);
    let channel = super::super::AppChannel::local(port)
        .with_protocol(super::super::AppProtocol::Grpc)
        .with_app_token(Some(rewire_runtime::SecretString::new("s3cret")));
    let Some(super::super::routed::AppTarget::Grpc(app)) =
        super::super::routed::AppTarget::connect(&channel)
    else {
        panic!("a gRPC app");
    };
    let message = rewire_runtime::Message {
        topic: "orders".into(),
        data: b"x".to_vec(),
        ..Default::default()
    };
    let event = TopicEvent::of(&message, "bus", "orders");
    let within = Duration::from_secs(10);
    let unreached = bounded(app.deliver_if_reachable("/orders", &event, within)).await;
    assert_eq!(unreached, None, "nothing listens: not an answer");
    assert_eq!(
        bounded(app.deliver("/orders", &event, within)).await,
        DeliveryOutcome::Retry,
        "a plain delivery still retries"
    );

    let waiting = tokio::spawn({
        let app = app.clone();
        async move { app.reachable().await }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!waiting.is_finished(), "the port was taken for open");
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .expect("the app's port again");
    let incoming = futures_util::stream::unfold(listener, |listener| async move {
        Some((listener.accept().await.map(|(stream, _)| stream), listener))
    });
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(pb::app_callback_server::AppCallbackServer::new(
                RequiringToken { token: "s3cret" },
            ))
            .serve_with_incoming(incoming),
    );
    bounded(waiting).await.expect("no panic");
    let delivered = bounded(app.deliver_if_reachable("/orders", &event, within)).await;
    assert_eq!(delivered, Some(DeliveryOutcome::Success));

    let untokened = GrpcRoute::new(
        tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
            .expect("endpoint")
            .connect_lazy(),
        "/orders".into(),
    );
    let refused = bounded(untokened.send_if_reachable(&event, within)).await;
    assert_eq!(refused, Some(DeliveryOutcome::Retry), "the app's own error");
}
