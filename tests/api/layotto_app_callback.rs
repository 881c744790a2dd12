//! A Layotto subscriber app over the app channel (`--app-protocol grpc`):
//! it serves only Layotto's `spec.proto.runtime.v1.AppCallback`, as
//! Layotto's SDKs register it, and gets its subscription's events through
//! Layotto's `OnTopicEvent` (the CloudEvent's extensions as `metadata`),
//! a RETRY answer redelivering.

use std::sync::atomic::{AtomicBool, Ordering};

use crate::support::grpc::{self, layotto};
use crate::support::sidecar::Sidecar;
use layotto::runtime_client::RuntimeClient;
use layotto::topic_event_response::TopicEventResponseStatus as Status;
use rewire::sidecar::app::{serve_app, AppChannel, AppProtocol};
use rewire::sidecar::ApiOptions;

const CONFIG: &str =
    r#"{"appId": "shop", "components": {"pubsub": {"pubsub": {"type": "memory"}}}}"#;

/// A Layotto app subscribed to `pubsub`/`orders`: each event recorded,
/// the first answered RETRY, the others SUCCESS.
struct LayottoApp {
    events: tokio::sync::mpsc::UnboundedSender<layotto::TopicEventRequest>,
    retried: AtomicBool,
}

#[tonic::async_trait]
impl layotto::app_callback_server::AppCallback for LayottoApp {
    async fn list_topic_subscriptions(
        &self,
        _: tonic::Request<()>,
    ) -> Result<tonic::Response<layotto::ListTopicSubscriptionsResponse>, tonic::Status> {
        Ok(tonic::Response::new(
            layotto::ListTopicSubscriptionsResponse {
                subscriptions: vec![layotto::TopicSubscription {
                    pubsub_name: "pubsub".into(),
                    topic: "orders".into(),
                    metadata: Default::default(),
                }],
            },
        ))
    }

    async fn on_topic_event(
        &self,
        request: tonic::Request<layotto::TopicEventRequest>,
    ) -> Result<tonic::Response<layotto::TopicEventResponse>, tonic::Status> {
        let first = !self.retried.swap(true, Ordering::SeqCst);
        let status = if first {
            Status::Retry
        } else {
            Status::Success
        };
        let _ = self.events.send(request.into_inner());
        Ok(tonic::Response::new(layotto::TopicEventResponse {
            status: status as i32,
        }))
    }
}

async fn next_event(
    received: &mut tokio::sync::mpsc::UnboundedReceiver<layotto::TopicEventRequest>,
) -> layotto::TopicEventRequest {
    tokio::time::timeout(grpc::PATIENCE, received.recv())
        .await
        .expect("an OnTopicEvent within the patience")
        .expect("app alive")
}

#[tokio::test]
async fn a_layotto_app_gets_its_events_through_layottos_app_callback() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let (events, mut received) = tokio::sync::mpsc::unbounded_channel();
    let app = LayottoApp {
        events,
        retried: AtomicBool::new(false),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(layotto::app_callback_server::AppCallbackServer::new(app))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let stop = tokio_util::sync::CancellationToken::new();
    let channel = AppChannel::local(port).with_protocol(AppProtocol::Grpc);
    let mut service = serve_app(sidecar.runtime.clone(), channel, Vec::new(), stop.clone());
    tokio::time::timeout(
        grpc::PATIENCE,
        service
            .subscribed
            .wait_for(|running| running.contains("app#0")),
    )
    .await
    .expect("the app's Layotto subscription is taken within the patience")
    .expect("service alive");

    let mut runtime = RuntimeClient::new(grpc::channel(sidecar.grpc_url()).await);
    let cloud_event = serde_json::json!({"specversion": "1.0", "id": "o1", "source": "shop",
                                         "type": "order", "priority": "high",
                                         "datacontenttype": "text/plain", "data": "one"});
    runtime
        .publish_event(layotto::PublishEventRequest {
            pubsub_name: "pubsub".into(),
            topic: "orders".into(),
            data: cloud_event.to_string().into_bytes(),
            data_content_type: "application/cloudevents+json".into(),
            metadata: Default::default(),
        })
        .await
        .expect("published");

    let first = next_event(&mut received).await;
    assert_eq!(
        (
            first.id.as_str(),
            first.pubsub_name.as_str(),
            first.topic.as_str(),
            first.r#type.as_str()
        ),
        ("o1", "pubsub", "orders", "order")
    );
    assert_eq!(
        (first.data.as_slice(), first.data_content_type.as_str()),
        (&b"one"[..], "text/plain")
    );
    assert_eq!(
        first.metadata.get("priority").map(String::as_str),
        Some("high"),
        "{:?}",
        first.metadata
    );
    // Answered RETRY: the same event comes again.
    let again = next_event(&mut received).await;
    assert_eq!((again.id.as_str(), again.data), ("o1", first.data));
    stop.cancel();
    sidecar.stop().await;
}
