//! The app's part of the sidecar's metadata (Dapr's `GetMetadata`), as
//! the app channel books it for [`crate::dapr::metadata()`]: the app's own
//! subscriptions, and how the channel reaches the app.

use std::sync::Arc;

use super::{AppChannel, AppSubscription};
use crate::dapr::{AppConnection, ListedSubscription, SubscriptionOrigin};

/// The app's own subscriptions (by id) as the metadata lists them.
pub(super) fn programmatic(own: &[(String, AppSubscription)]) -> Arc<[ListedSubscription]> {
    own.iter()
        .map(|(_, own)| {
            ListedSubscription::new(
                &own.pubsub_name,
                &own.topic,
                &own.metadata,
                &own.routes,
                own.dead_letter_topic.as_deref(),
                SubscriptionOrigin::Programmatic,
            )
        })
        .collect()
}

/// How `channel` reaches the app, as Dapr's `AppConnectionProperties`.
pub(super) fn connection(channel: &AppChannel) -> AppConnection {
    let (host, port) = channel
        .address
        .rsplit_once(':')
        .unwrap_or((channel.address.as_str(), ""));
    AppConnection {
        port: port.parse().unwrap_or(0),
        protocol: channel.protocol.dapr_name(),
        channel_address: host.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::dapr::{metadata, Call, StoreLabel, StreamingSubscriptions};
    use crate::ApiState;

    #[tokio::test]
    async fn open_streams_and_the_app_channel_are_shown() {
        let mut state = ApiState::empty().await;
        let channel = AppChannel::local(6001).with_protocol(super::super::AppProtocol::Grpc);
        state.options = Arc::new(crate::ApiOptions {
            app_channel: Some(channel),
            ..crate::ApiOptions::default()
        });
        let streams = StreamingSubscriptions::of(&state.metrics);
        let listing = streams.open(
            "bus",
            "orders",
            BTreeMap::from([("rawPayload".into(), "true".into())]),
            Some("dead".into()),
        );
        let call = Call::new(&state.runtime, StoreLabel::default());
        let answer = metadata(&call, &state);
        assert_eq!(
            answer.app_connection,
            Some(AppConnection {
                port: 6001,
                protocol: "grpc",
                channel_address: "127.0.0.1".into(),
            })
        );
        let [stream] = answer.subscriptions.as_slice() else {
            panic!("{:?}", answer.subscriptions);
        };
        assert_eq!(
            (stream.pubsub_name.as_str(), stream.topic.as_str()),
            ("bus", "orders")
        );
        assert_eq!(stream.origin, SubscriptionOrigin::Streaming);
        assert_eq!(stream.dead_letter_topic.as_deref(), Some("dead"));
        assert_eq!(stream.metadata["rawPayload"], "true");
        drop(listing);
        assert!(metadata(&call, &state).subscriptions.is_empty());
        state.runtime.shutdown().await;
    }

    #[test]
    fn routes_are_listed_as_daprs_rules_with_the_default_last() {
        let value = serde_json::json!([{"pubsubname": "p", "topic": "t", "routes": {
            "rules": [{"match": "event.type == \"widget\"", "path": "/widgets"}],
            "default": "/products"}}]);
        let parsed = super::super::parse_subscriptions(&value).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            programmatic(&[("app#0".to_string(), parsed[0].clone())])[0].rules,
            [
                (
                    "event.type == \"widget\"".to_string(),
                    "/widgets".to_string()
                ),
                (String::new(), "/products".to_string())
            ]
        );
    }
}
