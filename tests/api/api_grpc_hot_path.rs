//! The Dapr service's unary calls in their plain form are answered before
//! tonic's router and codec (the hot path); with `grpc-encoding:
//! identity`, which the hot path leaves alone, they go through tonic.
//! Both ways must answer alike. For `GetState`: the same value, etag,
//! metadata and response headers, or the same status and message, for a
//! stored key, a missing key, an unknown store, request metadata, a
//! missing or wrong app token, a message over the size limit, and a body
//! that does not decode. For the other unary calls the hot path takes:
//! saves (one refused for its etag, one for its key), a bulk read, a
//! delete, publishing, secrets, configuration, locks and metadata; and
//! Layotto's state, publishing and sequencer calls.

use std::collections::BTreeMap;

use crate::support::grpc;
use crate::support::sidecar;

use grpc::common::StateItem;
use grpc::dapr::dapr_client::DaprClient;
use grpc::dapr::{
    DeleteStateRequest, GetBulkStateRequest, GetConfigurationRequest, GetMetadataRequest,
    GetSecretRequest, GetStateRequest, GetStateResponse, PublishEventRequest, SaveStateRequest,
    TryLockRequest,
};
use grpc::layotto;
use grpc::layotto::runtime_client::RuntimeClient;
use rewire::sidecar::auth::APP_TOKEN_HEADER;
use rewire::sidecar::{ApiOptions, ApiToken};
use sidecar::Sidecar;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::Channel;
use tonic::{Code, Request, Status};

const CONFIG: &str =
    r#"{"appId": "shop", "components": {"state": {"orders": {"type": "memory"}}}}"#;
const TOKEN: &str = "grpc-hot-path-token-5e1";
const LIMIT: usize = 4096;

/// What a client can see of an answer.
#[derive(Debug, PartialEq)]
enum Seen {
    Answer {
        data: Vec<u8>,
        etag: String,
        metadata: BTreeMap<String, String>,
        /// The response's header names, but `date`.
        headers: Vec<String>,
    },
    Refused {
        code: Code,
        message: String,
    },
}

fn seen(answer: Result<tonic::Response<GetStateResponse>, Status>) -> Seen {
    match answer {
        Ok(response) => {
            let mut headers: Vec<String> = response
                .metadata()
                .keys()
                .map(|key| format!("{key:?}"))
                .filter(|key| !key.contains("date"))
                .collect();
            headers.sort();
            let reply = response.into_inner();
            Seen::Answer {
                data: reply.data,
                etag: reply.etag,
                metadata: reply.metadata.into_iter().collect(),
                headers,
            }
        }
        Err(status) => Seen::Refused {
            code: status.code(),
            message: status.message().to_string(),
        },
    }
}

/// `message` with the token (if any), and through tonic if `through_tonic`.
fn request<T>(message: T, token: Option<&str>, through_tonic: bool) -> Request<T> {
    let mut request = Request::new(message);
    if let Some(token) = token {
        let token = token.parse().expect("token");
        request.metadata_mut().insert(APP_TOKEN_HEADER, token);
    }
    if through_tonic {
        let identity = "identity".parse().expect("encoding");
        request.metadata_mut().insert("grpc-encoding", identity);
    }
    request
}

/// `GetState` of `message` on the hot path and through tonic.
async fn both_ways(
    client: &mut DaprClient<Channel>,
    message: &GetStateRequest,
    token: Option<&str>,
) -> (Seen, Seen) {
    let mut answers = Vec::new();
    for through_tonic in [false, true] {
        let call = request(message.clone(), token, through_tonic);
        answers.push(seen(client.get_state(call).await));
    }
    let tonic = answers.pop().expect("two answers");
    let hot = answers.pop().expect("two answers");
    (hot, tonic)
}

/// A sidecar requiring [`TOKEN`] and refusing messages over [`LIMIT`],
/// and a client of its Dapr service.
async fn sidecar() -> (Sidecar, DaprClient<Channel>) {
    let options = ApiOptions {
        app_token: Some(ApiToken::new(TOKEN)),
        max_request_bytes: LIMIT,
        ..ApiOptions::default()
    };
    let sidecar = Sidecar::start(CONFIG, options).await;
    let client = grpc::dapr_client(sidecar.grpc_url()).await;
    (sidecar, client)
}

fn get(store: &str, key: &str) -> GetStateRequest {
    GetStateRequest {
        store_name: store.into(),
        key: key.into(),
        ..GetStateRequest::default()
    }
}

#[tokio::test]
async fn the_hot_path_answers_get_state_as_tonic_does() {
    let (sidecar, mut client) = sidecar().await;
    // Not UTF-8, and not JSON: the bytes must come back as stored.
    let value = vec![0xff, 0x00, b'{', 0x80];
    let save = SaveStateRequest {
        store_name: "orders".into(),
        states: vec![StateItem {
            key: "o-1".into(),
            value: value.clone(),
            ..StateItem::default()
        }],
    };
    client
        .save_state(request(save, Some(TOKEN), false))
        .await
        .expect("save failed");

    let (hot, tonic) = both_ways(&mut client, &get("orders", "o-1"), Some(TOKEN)).await;
    assert!(
        matches!(&hot, Seen::Answer { data, etag, .. } if *data == value && !etag.is_empty()),
        "{hot:?}"
    );
    assert_eq!(hot, tonic, "a stored key");

    let mut with_metadata = get("orders", "o-1");
    with_metadata
        .metadata
        .insert("contentType".into(), "application/octet-stream".into());
    let (hot, tonic) = both_ways(&mut client, &with_metadata, Some(TOKEN)).await;
    assert_eq!(hot, tonic, "request metadata");

    let (hot, tonic) = both_ways(&mut client, &get("orders", "absent"), Some(TOKEN)).await;
    assert!(
        matches!(&hot, Seen::Answer { data, .. } if data.is_empty()),
        "{hot:?}"
    );
    assert_eq!(hot, tonic, "a missing key");

    let (hot, tonic) = both_ways(&mut client, &get("nowhere", "o-1"), Some(TOKEN)).await;
    assert!(
        matches!(&hot, Seen::Refused { code: Code::InvalidArgument, message } if message.contains("nowhere")),
        "{hot:?}"
    );
    assert_eq!(hot, tonic, "an unknown store");

    for token in [None, Some("grpc-hot-path-token-5e"), Some("wrong")] {
        let (hot, tonic) = both_ways(&mut client, &get("orders", "o-1"), token).await;
        assert!(
            matches!(
                &hot,
                Seen::Refused {
                    code: Code::Unauthenticated,
                    ..
                }
            ),
            "{hot:?}"
        );
        assert_eq!(hot, tonic, "token {token:?}");
    }

    let oversized = get("orders", &"k".repeat(LIMIT + 1));
    let (hot, tonic) = both_ways(&mut client, &oversized, Some(TOKEN)).await;
    assert!(
        matches!(&hot, Seen::Refused { code: Code::ResourceExhausted, message } if message.contains(&format!("the limit is {LIMIT} bytes"))),
        "{hot:?}"
    );
    assert_eq!(hot, tonic, "a message over the limit");

    let under = get("orders", &"k".repeat(LIMIT - 64));
    let (hot, tonic) = both_ways(&mut client, &under, Some(TOKEN)).await;
    assert!(matches!(&hot, Seen::Answer { .. }), "{hot:?}");
    assert_eq!(hot, tonic, "a message under the limit");

    let channel = grpc::channel(sidecar.grpc_url()).await;
    let mut undecodable = Vec::new();
    for through_tonic in [false, true] {
        undecodable.push(not_utf8_store_name(channel.clone(), through_tonic).await);
    }
    assert!(
        matches!(&undecodable[0], Err((Code::Internal, message)) if message.contains("decode")),
        "{undecodable:?}"
    );
    assert_eq!(
        undecodable[0], undecodable[1],
        "a body that does not decode"
    );
    sidecar.stop().await;
}

/// Both answers of one call, plainly and through tonic, as text: the
/// reply, or the status code and message.
macro_rules! both_ways {
    ($client:ident . $method:ident($message:expr)) => {{
        let mut answers = Vec::new();
        for through_tonic in [false, true] {
            let call = request($message, Some(TOKEN), through_tonic);
            let answer = $client.$method(call).await;
            answers.push(format!(
                "{:?}",
                answer
                    .map(tonic::Response::into_inner)
                    .map_err(|s| (s.code(), s.message().to_string()))
            ));
        }
        (answers.remove(0), answers.remove(0))
    }};
}

#[tokio::test]
async fn the_other_unary_calls_answer_on_the_hot_path_as_through_tonic() {
    let (sidecar, mut client) = sidecar().await;
    let item = |key: &str, etag: Option<&str>| StateItem {
        key: key.into(),
        value: b"v".to_vec(),
        etag: etag.map(|value| grpc::common::Etag {
            value: value.into(),
        }),
        ..StateItem::default()
    };
    let save = |items: Vec<StateItem>| SaveStateRequest {
        store_name: "orders".into(),
        states: items,
    };
    let cases = [
        both_ways!(client.save_state(save(vec![item("a", None)]))),
        both_ways!(client.save_state(save(vec![item("a", Some("999"))]))),
        both_ways!(client.save_state(save(vec![item("a||b", None)]))),
        both_ways!(client.get_bulk_state(GetBulkStateRequest {
            store_name: "orders".into(),
            keys: vec!["a".into(), "absent".into()],
            ..GetBulkStateRequest::default()
        })),
        both_ways!(client.delete_state(DeleteStateRequest {
            store_name: "orders".into(),
            key: "absent".into(),
            ..DeleteStateRequest::default()
        })),
        both_ways!(client.publish_event(PublishEventRequest {
            pubsub_name: "nowhere".into(),
            topic: "t".into(),
            ..PublishEventRequest::default()
        })),
        both_ways!(client.get_secret(GetSecretRequest {
            store_name: "nowhere".into(),
            key: "k".into(),
            ..GetSecretRequest::default()
        })),
        both_ways!(client.get_configuration(GetConfigurationRequest {
            store_name: "nowhere".into(),
            ..GetConfigurationRequest::default()
        })),
        both_ways!(client.try_lock_alpha1(TryLockRequest {
            store_name: "nowhere".into(),
            resource_id: "r".into(),
            lock_owner: "o".into(),
            expiry_in_seconds: 5,
        })),
    ];
    for (hot, tonic) in &cases {
        assert_eq!(hot, tonic);
    }
    // Compared as messages: the extended metadata is a map, whose entries
    // print in no fixed order.
    let mut metadata = Vec::new();
    for through_tonic in [false, true] {
        let call = request(GetMetadataRequest {}, Some(TOKEN), through_tonic);
        let answer = client.get_metadata(call).await;
        metadata.push(
            answer
                .map(tonic::Response::into_inner)
                .map_err(|s| (s.code(), s.message().to_string())),
        );
    }
    assert_eq!(metadata[0], metadata[1]);
    assert!(metadata[0].is_ok(), "{:?}", metadata[0]);
    // Saved, refused for its etag, refused for its key; found.
    assert!(cases[0].0.starts_with("Ok"), "{}", cases[0].0);
    assert!(cases[1].0.starts_with("Err((Aborted"), "{}", cases[1].0);
    assert!(
        cases[2].0.starts_with("Err((InvalidArgument"),
        "{}",
        cases[2].0
    );
    assert!(
        cases[3].0.contains("key: \"a\", data: [118]"),
        "{}",
        cases[3].0
    );
    sidecar.stop().await;
}

#[tokio::test]
async fn layottos_unary_calls_answer_on_the_hot_path_as_through_tonic() {
    let (sidecar, _) = sidecar().await;
    let mut client = RuntimeClient::new(grpc::channel(sidecar.grpc_url()).await);
    let save = |key: &str, etag: Option<&str>| layotto::SaveStateRequest {
        store_name: "orders".into(),
        states: vec![layotto::StateItem {
            key: key.into(),
            value: vec![0xfe, b'x'],
            etag: etag.map(|value| layotto::Etag {
                value: value.into(),
            }),
            ..layotto::StateItem::default()
        }],
    };
    let get = |store: &str| layotto::GetStateRequest {
        store_name: store.into(),
        key: "a".into(),
        ..layotto::GetStateRequest::default()
    };
    let cases = [
        both_ways!(client.save_state(save("a", None))),
        both_ways!(client.save_state(save("a", Some("999")))),
        both_ways!(client.get_state(get("orders"))),
        both_ways!(client.get_state(get("nowhere"))),
        both_ways!(client.get_bulk_state(layotto::GetBulkStateRequest {
            store_name: "orders".into(),
            keys: vec!["a".into(), "absent".into()],
            ..layotto::GetBulkStateRequest::default()
        })),
        both_ways!(client.delete_state(layotto::DeleteStateRequest {
            store_name: "orders".into(),
            key: "absent".into(),
            ..layotto::DeleteStateRequest::default()
        })),
        both_ways!(client.publish_event(layotto::PublishEventRequest {
            pubsub_name: "nowhere".into(),
            topic: "t".into(),
            ..layotto::PublishEventRequest::default()
        })),
        both_ways!(client.get_next_id(layotto::GetNextIdRequest {
            store_name: "nowhere".into(),
            key: "k".into(),
            ..layotto::GetNextIdRequest::default()
        })),
    ];
    for (hot, tonic) in &cases {
        assert_eq!(hot, tonic);
    }
    // Saved, refused for its etag; read back; an unknown store refused.
    assert!(cases[0].0.starts_with("Ok"), "{}", cases[0].0);
    assert!(cases[1].0.starts_with("Err((Aborted"), "{}", cases[1].0);
    assert!(cases[2].0.contains("data: [254, 120]"), "{}", cases[2].0);
    assert!(
        cases[3].0.starts_with("Err((InvalidArgument"),
        "{}",
        cases[3].0
    );
    let mut unauthenticated = Vec::new();
    for through_tonic in [false, true] {
        let call = request(get("orders"), None, through_tonic);
        let status = client.get_state(call).await.expect_err("no token");
        unauthenticated.push((status.code(), status.message().to_string()));
    }
    assert_eq!(unauthenticated[0].0, Code::Unauthenticated);
    assert_eq!(unauthenticated[0], unauthenticated[1]);
    sidecar.stop().await;
}

/// A `GetStateRequest` whose store name (field 1, a string) is not UTF-8.
#[derive(Clone, PartialEq, prost::Message)]
struct NotUtf8 {
    #[prost(bytes = "vec", tag = "1")]
    store_name: Vec<u8>,
}

/// Sends a [`NotUtf8`] as `GetState`; the status code and message.
async fn not_utf8_store_name(channel: Channel, through_tonic: bool) -> Result<(), (Code, String)> {
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.expect("ready");
    let message = NotUtf8 {
        store_name: vec![0xc3, 0x28],
    };
    let path = PathAndQuery::from_static("/dapr.proto.runtime.v1.Dapr/GetState");
    let codec = tonic_prost::ProstCodec::<NotUtf8, GetStateResponse>::default();
    grpc.unary(request(message, Some(TOKEN), through_tonic), path, codec)
        .await
        .map(drop)
        .map_err(|status| (status.code(), status.message().to_string()))
}
