//! Layotto's sequencer, File and pub/sub methods, through clients generated
//! from Layotto's definitions, on memory components: ids that only grow,
//! files streamed in and out in several messages, names that escape
//! refused, and an event published and delivered over Layotto's
//! bidirectional `SubscribeTopicEvents`.

use crate::support::grpc::{self, layotto, next};
use crate::support::sidecar::Sidecar;
use layotto::runtime_client::RuntimeClient;
use layotto::sequencer_options::AutoIncrement;
use layotto::subscribe_topic_events_request::SubscribeTopicEventsRequestType as Request;
use layotto::subscribe_topic_events_response::SubscribeTopicEventsResponseType as Response;
use rewire::sidecar::ApiOptions;
use tonic::transport::Channel;
use tonic::Code;

const CONFIG: &str = r#"{"appId": "shop", "components": {
    "sequencer": {"ids": {"type": "memory"}},
    "file": {"files": {"type": "memory"}},
    "pubsub": {"events": {"type": "memory"}}
}}"#;

async fn runtime(sidecar: &Sidecar) -> RuntimeClient<Channel> {
    RuntimeClient::new(grpc::channel(sidecar.grpc_url()).await)
}

#[tokio::test]
async fn get_next_id_only_grows() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let mut client = runtime(&sidecar).await;
    let mut last = 0;
    for increment in [
        AutoIncrement::Strong,
        AutoIncrement::Weak,
        AutoIncrement::Strong,
    ] {
        let id = client
            .get_next_id(layotto::GetNextIdRequest {
                store_name: "ids".into(),
                key: "orders".into(),
                options: Some(layotto::SequencerOptions {
                    increment: increment as i32,
                }),
                ..Default::default()
            })
            .await
            .expect("next id")
            .into_inner()
            .next_id;
        assert!(id > last, "{id} after {last}");
        last = id;
    }
    let unknown = client
        .get_next_id(layotto::GetNextIdRequest {
            store_name: "nope".into(),
            key: "orders".into(),
            ..Default::default()
        })
        .await
        .expect_err("no such sequencer");
    assert_eq!(unknown.code(), Code::InvalidArgument);
    sidecar.stop().await;
}

/// As Layotto answers: an increment that is neither WEAK nor STRONG is
/// refused (it was taken as WEAK), and with no sequencer configured at all
/// the call is `FAILED_PRECONDITION` (a sequencer not found stays
/// `INVALID_ARGUMENT`).
#[tokio::test]
async fn get_next_id_refuses_an_unknown_increment_and_needs_a_sequencer() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let mut client = runtime(&sidecar).await;
    let illegal = client
        .get_next_id(layotto::GetNextIdRequest {
            store_name: "ids".into(),
            key: "orders".into(),
            options: Some(layotto::SequencerOptions { increment: 7 }),
            ..Default::default()
        })
        .await
        .expect_err("an increment of 7");
    assert_eq!(illegal.code(), Code::InvalidArgument, "{illegal:?}");
    assert!(
        illegal.message().contains("Options.Increment is illegal"),
        "{illegal:?}"
    );
    sidecar.stop().await;

    let none = r#"{"appId": "shop", "components": {"file": {"files": {"type": "memory"}}}}"#;
    let sidecar = Sidecar::start(none, ApiOptions::default()).await;
    let mut client = runtime(&sidecar).await;
    let unconfigured = client
        .get_next_id(layotto::GetNextIdRequest {
            store_name: "ids".into(),
            key: "orders".into(),
            ..Default::default()
        })
        .await
        .expect_err("no sequencer at all");
    assert_eq!(
        unconfigured.code(),
        Code::FailedPrecondition,
        "{unconfigured:?}"
    );
    assert!(
        unconfigured.message().contains("not configured"),
        "{unconfigured:?}"
    );
    sidecar.stop().await;
}

#[tokio::test]
async fn files_stream_in_and_out_and_escapes_are_refused() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let mut client = runtime(&sidecar).await;
    // Three messages: the first names the store and file.
    let parts: Vec<Vec<u8>> = vec![vec![b'a'; 70_000], vec![b'b'; 5], vec![b'c'; 100_000]];
    let whole: Vec<u8> = parts.concat();
    let messages: Vec<layotto::PutFileRequest> = parts
        .iter()
        .enumerate()
        .map(|(i, data)| layotto::PutFileRequest {
            store_name: if i == 0 {
                "files".into()
            } else {
                String::new()
            },
            name: if i == 0 {
                "docs/report.txt".into()
            } else {
                String::new()
            },
            data: data.clone(),
            ..Default::default()
        })
        .collect();
    client
        .put_file(tokio_stream::iter(messages))
        .await
        .expect("put");

    let mut got = client
        .get_file(layotto::GetFileRequest {
            store_name: "files".into(),
            name: "docs/report.txt".into(),
            ..Default::default()
        })
        .await
        .expect("get")
        .into_inner();
    let (mut read, mut messages) = (Vec::new(), 0);
    while let Some(chunk) = next(&mut got).await {
        read.extend(chunk.expect("chunk").data);
        messages += 1;
    }
    assert_eq!(read, whole);
    assert!(messages > 1, "streamed in chunks, not whole");

    let request = |name: &str| layotto::FileRequest {
        store_name: "files".into(),
        name: name.into(),
        ..Default::default()
    };
    let listed = client
        .list_file(layotto::ListFileRequest {
            request: Some(request("docs/")),
            page_size: 10,
            marker: String::new(),
        })
        .await
        .expect("list")
        .into_inner();
    let names: Vec<_> = listed.files.iter().map(|f| f.file_name.as_str()).collect();
    assert_eq!(names, ["docs/report.txt"]);
    assert!(!listed.is_truncated);
    let meta = client
        .get_file_meta(layotto::GetFileMetaRequest {
            request: Some(request("docs/report.txt")),
        })
        .await
        .expect("meta")
        .into_inner();
    assert_eq!(meta.size, whole.len() as i64);
    assert!(!meta.last_modified.is_empty());

    let escape = client
        .put_file(tokio_stream::iter(vec![layotto::PutFileRequest {
            store_name: "files".into(),
            name: "../outside".into(),
            data: b"x".to_vec(),
            ..Default::default()
        }]))
        .await
        .expect_err("escape");
    assert_eq!(escape.code(), Code::InvalidArgument, "{escape:?}");

    client
        .del_file(layotto::DelFileRequest {
            request: Some(request("docs/report.txt")),
        })
        .await
        .expect("delete");
    let gone = client
        .get_file_meta(layotto::GetFileMetaRequest {
            request: Some(request("docs/report.txt")),
        })
        .await
        .expect_err("deleted");
    assert_eq!(gone.code(), Code::NotFound);
    sidecar.stop().await;
}

#[tokio::test]
async fn publish_and_subscribe_over_layottos_stream() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let mut client = runtime(&sidecar).await;
    let (requests, outgoing) = tokio::sync::mpsc::channel(4);
    requests
        .send(layotto::SubscribeTopicEventsRequest {
            subscribe_topic_events_request_type: Some(Request::InitialRequest(
                layotto::SubscribeTopicEventsRequestInitial {
                    pubsub_name: "events".into(),
                    topic: "orders".into(),
                    ..Default::default()
                },
            )),
        })
        .await
        .unwrap();
    let mut events = client
        .subscribe_topic_events(tokio_stream::wrappers::ReceiverStream::new(outgoing))
        .await
        .expect("subscribe")
        .into_inner();
    let first = next(&mut events).await.expect("open").expect("no error");
    assert!(matches!(
        first.subscribe_topic_events_response_type,
        Some(Response::InitialResponse(_))
    ));

    client
        .publish_event(layotto::PublishEventRequest {
            pubsub_name: "events".into(),
            topic: "orders".into(),
            data: br#"{"order": 7}"#.to_vec(),
            data_content_type: "application/json".into(),
            ..Default::default()
        })
        .await
        .expect("publish");
    let delivered = next(&mut events).await.expect("open").expect("no error");
    let Some(Response::EventMessage(event)) = delivered.subscribe_topic_events_response_type else {
        panic!("not an event: {delivered:?}");
    };
    assert_eq!(
        (event.topic.as_str(), event.pubsub_name.as_str()),
        ("orders", "events")
    );
    assert_eq!(event.spec_version, "1.0");
    // The CloudEvent's other fields, which Dapr's stream passes on as
    // `extensions`, are Layotto's `metadata`.
    assert_eq!(
        event.metadata.get("topic").map(String::as_str),
        Some("orders"),
        "{:?}",
        event.metadata
    );
    assert_eq!(
        event.metadata.get("pubsubname").map(String::as_str),
        Some("events"),
        "{:?}",
        event.metadata
    );
    let data: serde_json::Value = serde_json::from_slice(&event.data).expect("JSON data");
    assert_eq!(data["order"], 7, "{data}");
    requests
        .send(layotto::SubscribeTopicEventsRequest {
            subscribe_topic_events_request_type: Some(Request::EventProcessed(
                layotto::SubscribeTopicEventsRequestProcessed {
                    id: event.id,
                    status: Some(layotto::TopicEventResponse { status: 0 }),
                },
            )),
        })
        .await
        .unwrap();
    sidecar.stop().await;
}

/// A `PutFile` stream whose chunks `send` yields over time: the first
/// message names `name` in store `files`.
fn upload(
    name: &'static str,
    chunks: usize,
    every: std::time::Duration,
    then_stall: bool,
) -> tokio_stream::wrappers::ReceiverStream<layotto::PutFileRequest> {
    let (sender, receiver) = tokio::sync::mpsc::channel(1);
    tokio::spawn(async move {
        for i in 0..chunks {
            let message = layotto::PutFileRequest {
                store_name: if i == 0 {
                    "files".into()
                } else {
                    String::new()
                },
                name: if i == 0 { name.into() } else { String::new() },
                data: vec![b'a' + i as u8; 1000],
                ..Default::default()
            };
            if sender.send(message).await.is_err() {
                return;
            }
            tokio::time::sleep(every).await;
        }
        if then_stall {
            // Silent, the stream kept open, until the sidecar gives up.
            sender.closed().await;
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(receiver)
}

#[tokio::test]
async fn an_upload_that_keeps_sending_outlasts_request_timeout_and_one_that_stalls_is_cut() {
    use std::time::Duration;
    let options = ApiOptions {
        request_timeout: Duration::from_secs(1),
        ..ApiOptions::default()
    };
    let sidecar = Sidecar::start(CONFIG, options).await;
    let mut client = runtime(&sidecar).await;
    // A chunk every 300 ms for 3 s: three times `request_timeout`.
    let steady = upload("steady.bin", 10, Duration::from_millis(300), false);
    client.put_file(steady).await.expect("a steady upload");
    let mut got = client
        .get_file(layotto::GetFileRequest {
            store_name: "files".into(),
            name: "steady.bin".into(),
            ..Default::default()
        })
        .await
        .expect("get")
        .into_inner();
    let mut read = Vec::new();
    while let Some(chunk) = next(&mut got).await {
        read.extend(chunk.expect("chunk").data);
    }
    let whole: Vec<u8> = (0..10u8).flat_map(|i| vec![b'a' + i; 1000]).collect();
    assert_eq!(read, whole, "stored whole");

    // Two chunks, then nothing for longer than `request_timeout`.
    let stalled = upload("stalled.bin", 2, Duration::from_millis(100), true);
    let refused = tokio::time::timeout(grpc::PATIENCE, client.put_file(stalled))
        .await
        .expect("cut within the test's patience")
        .expect_err("a stalled upload");
    assert_eq!(refused.code(), Code::DeadlineExceeded, "{refused:?}");
    assert!(
        refused.message().contains("file `stalled.bin`")
            && refused.message().contains("file store `files`")
            && refused.message().contains("no bytes arrived for 1s"),
        "{}",
        refused.message()
    );
    let gone = client
        .get_file_meta(layotto::GetFileMetaRequest {
            request: Some(layotto::FileRequest {
                store_name: "files".into(),
                name: "stalled.bin".into(),
                ..Default::default()
            }),
        })
        .await
        .expect_err("nothing stored");
    assert_eq!(gone.code(), Code::NotFound);
    sidecar.stop().await;
}

/// Messages without data are no progress: an upload that sends only empty
/// `PutFileRequest`s, each well within `request_timeout`, is cut as a
/// stalled one is (they held it open forever).
#[tokio::test]
async fn an_upload_kept_open_by_empty_messages_is_cut_as_a_stalled_one() {
    use std::time::Duration;
    let options = ApiOptions {
        request_timeout: Duration::from_secs(1),
        ..ApiOptions::default()
    };
    let sidecar = Sidecar::start(CONFIG, options).await;
    let mut client = runtime(&sidecar).await;
    let (sender, receiver) = tokio::sync::mpsc::channel(1);
    tokio::spawn(async move {
        let first = layotto::PutFileRequest {
            store_name: "files".into(),
            name: "empty.bin".into(),
            data: vec![b'a'; 1000],
            ..Default::default()
        };
        if sender.send(first).await.is_err() {
            return;
        }
        // An empty message every 300 ms, until the sidecar gives up.
        loop {
            tokio::time::sleep(Duration::from_millis(300)).await;
            if sender
                .send(layotto::PutFileRequest::default())
                .await
                .is_err()
            {
                return;
            }
        }
    });
    let put = client.put_file(tokio_stream::wrappers::ReceiverStream::new(receiver));
    let refused = tokio::time::timeout(grpc::PATIENCE, put)
        .await
        .expect("cut within the test's patience, not held open by empty messages")
        .expect_err("an upload sending no bytes");
    assert_eq!(refused.code(), Code::DeadlineExceeded, "{refused:?}");
    assert!(
        refused.message().contains("file `empty.bin`")
            && refused.message().contains("no bytes arrived for 1s"),
        "{}",
        refused.message()
    );
    sidecar.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn put_file_larger_than_the_listeners_budget_of_request_bytes_passes() {
    const CHUNK: usize = 64 * 1024;
    const CHUNKS: usize = 70 * 16; // 70 MiB, past the default budget of 64 MiB
    let dir = tempfile::tempdir().unwrap();
    let config = serde_json::json!({
        "appId": "shop",
        "components": {
            "file": {"files": {"type": "local", "metadata": {"root": dir.path().join("files")}}}
        }
    });
    let sidecar = Sidecar::start(&config.to_string(), ApiOptions::default()).await;
    let mut client = runtime(&sidecar).await;
    // Made up as sent: one chunk's worth at a time.
    let messages = tokio_stream::iter((0..CHUNKS).map(|i| layotto::PutFileRequest {
        store_name: if i == 0 {
            "files".into()
        } else {
            String::new()
        },
        name: if i == 0 {
            "big.bin".into()
        } else {
            String::new()
        },
        data: vec![(i % 251) as u8; CHUNK],
        ..Default::default()
    }));
    tokio::time::timeout(grpc::PATIENCE, client.put_file(messages))
        .await
        .expect("stored within the test's patience")
        .expect("a 70 MiB upload");
    let stored = std::fs::metadata(dir.path().join("files/big.bin")).unwrap();
    assert_eq!(stored.len(), (CHUNK * CHUNKS) as u64);
    sidecar.stop().await;
}

#[tokio::test]
async fn a_file_dated_before_1970_is_listed_and_stated() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("files");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(root.join("old.txt"), "x").unwrap();
    // As `touch -d 1960-01-01` leaves it.
    let ten_years = std::time::Duration::from_secs(10 * 365 * 24 * 3600);
    std::fs::File::options()
        .write(true)
        .open(root.join("old.txt"))
        .unwrap()
        .set_modified(std::time::UNIX_EPOCH - ten_years)
        .unwrap();
    let config = serde_json::json!({
        "appId": "shop",
        "components": {"file": {"files": {"type": "local", "metadata": {"root": root}}}}
    });
    let sidecar = Sidecar::start(&config.to_string(), ApiOptions::default()).await;
    let mut client = runtime(&sidecar).await;
    let request = || layotto::FileRequest {
        store_name: "files".into(),
        name: "old.txt".into(),
        ..Default::default()
    };
    // As Layotto writes it (Go's `time.Time.String()`), the date itself.
    let epoch = "1960-01-04 00:00:00 +0000 UTC";
    let meta = client
        .get_file_meta(layotto::GetFileMetaRequest {
            request: Some(request()),
        })
        .await
        .expect("meta")
        .into_inner();
    assert_eq!(meta.last_modified, epoch);
    let listed = client
        .list_file(layotto::ListFileRequest {
            request: Some(layotto::FileRequest {
                name: String::new(),
                ..request()
            }),
            page_size: 10,
            marker: String::new(),
        })
        .await
        .expect("list")
        .into_inner();
    assert_eq!(listed.files.len(), 1);
    assert_eq!(listed.files[0].last_modified, epoch);
    sidecar.stop().await;
}

#[tokio::test]
async fn a_put_file_stream_with_no_message_is_ok_and_writes_nothing() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let mut client = runtime(&sidecar).await;
    // Closed before its first message: Layotto answers OK (a client that
    // sends EOF at once), and so does rewire.
    client
        .put_file(tokio_stream::empty::<layotto::PutFileRequest>())
        .await
        .expect("an empty upload is OK");
    let listed = client
        .list_file(layotto::ListFileRequest {
            request: Some(layotto::FileRequest {
                store_name: "files".into(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .expect("list")
        .into_inner();
    assert!(listed.files.is_empty(), "nothing written: {listed:?}");
    sidecar.stop().await;
}

/// As Layotto's `local` store answers: `ListFile` and `GetFileMeta` carry
/// the file's size and its modification time as Go's `time.Time.String()`
/// writes it; `GetFileMeta` alone carries `FileMode` (Go's `os.FileMode`,
/// in decimal) and `IsDir` (Layotto's `List` sets no metadata).
#[tokio::test]
async fn listed_and_stated_files_carry_size_date_and_mode_as_layottos_local_store() {
    use std::os::unix::fs::PermissionsExt;

    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("files");
    let config = serde_json::json!({
        "appId": "shop",
        "components": {"file": {"files": {"type": "local", "metadata": {"root": root}}}}
    });
    let sidecar = Sidecar::start(&config.to_string(), ApiOptions::default()).await;
    let mut client = runtime(&sidecar).await;
    client
        .put_file(tokio_stream::iter(vec![layotto::PutFileRequest {
            store_name: "files".into(),
            name: "docs/report.txt".into(),
            data: b"quarterly".to_vec(),
            ..Default::default()
        }]))
        .await
        .expect("put");
    // Dated to the nanosecond, so the whole of the date shows.
    let path = root.join("docs/report.txt");
    let modified = std::time::UNIX_EPOCH + std::time::Duration::new(1_700_000_000, 120_000_000);
    std::fs::File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_modified(modified)
        .unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
    let date = "2023-11-14 22:13:20.12 +0000 UTC";

    let request = || layotto::FileRequest {
        store_name: "files".into(),
        name: "docs/report.txt".into(),
        ..Default::default()
    };
    let meta = client
        .get_file_meta(layotto::GetFileMetaRequest {
            request: Some(request()),
        })
        .await
        .expect("meta")
        .into_inner();
    assert_eq!(meta.size, 9);
    assert_eq!(meta.last_modified, date);
    let values: std::collections::BTreeMap<_, _> = meta
        .response
        .expect("a FileMeta")
        .metadata
        .into_iter()
        .map(|(name, value)| (name, value.value))
        .collect();
    // 0o640 is 416.
    assert_eq!(
        values,
        [
            ("FileMode".to_string(), vec!["416".to_string()]),
            ("IsDir".to_string(), vec!["false".to_string()]),
        ]
        .into()
    );

    let listed = client
        .list_file(layotto::ListFileRequest {
            request: Some(layotto::FileRequest {
                name: "docs/".into(),
                ..request()
            }),
            page_size: 10,
            marker: String::new(),
        })
        .await
        .expect("list")
        .into_inner();
    let [file] = listed.files.as_slice() else {
        panic!("one file: {listed:?}");
    };
    assert_eq!(
        (
            file.file_name.as_str(),
            file.size,
            file.last_modified.as_str()
        ),
        ("docs/report.txt", 9, date)
    );
    assert!(file.metadata.is_empty(), "listed metadata: {file:?}");

    // A folder is stated too, as Layotto's `os.Stat`: its size and mode
    // (Go's `os.ModeDir`, 1 << 31, with 0o750, 488) and `IsDir` true.
    let folder = root.join("docs");
    std::fs::set_permissions(&folder, std::fs::Permissions::from_mode(0o750)).unwrap();
    let meta = client
        .get_file_meta(layotto::GetFileMetaRequest {
            request: Some(layotto::FileRequest {
                name: "docs".into(),
                ..request()
            }),
        })
        .await
        .expect("a folder's meta")
        .into_inner();
    let size = std::fs::metadata(&folder).unwrap().len();
    assert_eq!(meta.size, i64::try_from(size).unwrap());
    let values: std::collections::BTreeMap<_, _> = meta
        .response
        .expect("a FileMeta")
        .metadata
        .into_iter()
        .map(|(name, value)| (name, value.value))
        .collect();
    assert_eq!(
        values,
        [
            (
                "FileMode".to_string(),
                vec![((1u64 << 31) + 0o750).to_string()]
            ),
            ("IsDir".to_string(), vec!["true".to_string()]),
        ]
        .into()
    );
    sidecar.stop().await;
}

/// A `PutFileRequest` with a field Layotto's has not (number 1000): the
/// sidecar's decoder drops it, so it weighs on the wire what the decoded
/// message does not.
#[derive(Clone, PartialEq, prost::Message)]
struct PaddedPutFile {
    #[prost(string, tag = "1")]
    store_name: String,
    #[prost(string, tag = "2")]
    name: String,
    #[prost(bytes = "vec", tag = "3")]
    data: Vec<u8>,
    #[prost(bytes = "vec", tag = "1000")]
    padding: Vec<u8>,
}

/// A `PutFile` is charged to the listener's budget by its messages' wire
/// bytes and lets go of as many once the store takes them: messages padded
/// with unknown fields (1 MiB each, dropped by the decoder) pin nothing,
/// so an open upload does not refuse every other call's body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn put_file_padded_with_unknown_fields_pins_no_budget() {
    const MIB: usize = 1 << 20;
    let config = r#"{"appId": "shop", "components": {
        "file": {"files": {"type": "memory"}},
        "state": {"orders": {"type": "memory"}}
    }}"#;
    // A budget of 8 MiB of request bytes across the listener.
    let options = ApiOptions {
        max_request_bytes_in_flight: 8 * MIB,
        ..ApiOptions::default()
    };
    let sidecar = Sidecar::start(config, options).await;
    let mut uploader = tonic::client::Grpc::new(grpc::channel(sidecar.grpc_url()).await);
    let (sender, receiver) = tokio::sync::mpsc::channel(1);
    let upload = tokio::spawn(async move {
        uploader.ready().await.unwrap();
        let path = tonic::codegen::http::uri::PathAndQuery::from_static(
            "/spec.proto.runtime.v1.Runtime/PutFile",
        );
        let codec = tonic_prost::ProstCodec::<PaddedPutFile, ()>::default();
        let messages = tokio_stream::wrappers::ReceiverStream::new(receiver);
        uploader
            .client_streaming(tonic::Request::new(messages), path, codec)
            .await
    });
    // 6 MiB of padding on the wire, 6 bytes of contents.
    for i in 0..6 {
        let (store_name, name) = match i {
            0 => ("files".into(), "padded.bin".into()),
            _ => (String::new(), String::new()),
        };
        let message = PaddedPutFile {
            store_name,
            name,
            data: vec![b'x'],
            padding: vec![0; MIB],
        };
        sender.send(message).await.unwrap();
    }
    // The upload stays open; a 3 MiB save (6 + 3 past the 8 MiB budget,
    // were the padding still held) passes once the store has taken them.
    let mut client = grpc::dapr_client(sidecar.grpc_url()).await;
    let save = grpc::dapr::SaveStateRequest {
        store_name: "orders".into(),
        states: vec![grpc::common::StateItem {
            key: "k".into(),
            value: vec![7; 3 * MIB],
            ..Default::default()
        }],
    };
    let saved = tokio::time::timeout(grpc::PATIENCE, async {
        loop {
            match client.save_state(save.clone()).await {
                Ok(_) => return,
                Err(status) if status.code() == Code::ResourceExhausted => {
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
                Err(status) => panic!("{status:?}"),
            }
        }
    })
    .await;
    assert!(saved.is_ok(), "an open upload's padding kept the budget");
    drop(sender);
    let stored = tokio::time::timeout(grpc::PATIENCE, upload)
        .await
        .expect("the upload ended within the test's patience")
        .unwrap();
    assert!(stored.is_ok(), "{stored:?}");
    let mut runtime = runtime(&sidecar).await;
    let mut read = runtime
        .get_file(layotto::GetFileRequest {
            store_name: "files".into(),
            name: "padded.bin".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut contents = Vec::new();
    while let Some(chunk) = read.message().await.unwrap() {
        contents.extend(chunk.data);
    }
    assert_eq!(contents, b"xxxxxx");
    sidecar.stop().await;
}

#[tokio::test]
async fn put_file_and_get_next_id_metadata_past_the_bound_is_refused_naming_it() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let mut client = runtime(&sidecar).await;
    let metadata: std::collections::HashMap<String, String> =
        (0..65).map(|i| (format!("k{i}"), "v".into())).collect();
    let put = client
        .put_file(tokio_stream::iter(vec![layotto::PutFileRequest {
            store_name: "files".into(),
            name: "tagged.txt".into(),
            data: b"abc".to_vec(),
            metadata: metadata.clone(),
        }]))
        .await
        .expect_err("too much metadata");
    assert_eq!(put.code(), Code::InvalidArgument, "{put:?}");
    assert!(
        put.message().contains("more than 64 entries")
            && put.message().contains("file store `files`"),
        "{}",
        put.message()
    );
    let stored = client
        .get_file_meta(layotto::GetFileMetaRequest {
            request: Some(layotto::FileRequest {
                store_name: "files".into(),
                name: "tagged.txt".into(),
                ..Default::default()
            }),
        })
        .await
        .expect_err("nothing stored");
    assert_eq!(stored.code(), Code::NotFound);
    let id = client
        .get_next_id(layotto::GetNextIdRequest {
            store_name: "ids".into(),
            key: "orders".into(),
            metadata,
            ..Default::default()
        })
        .await
        .expect_err("too much metadata");
    assert_eq!(id.code(), Code::InvalidArgument, "{id:?}");
    assert!(
        id.message().contains("more than 64 entries") && id.message().contains("sequencer `ids`"),
        "{}",
        id.message()
    );
    sidecar.stop().await;
}

/// A sidecar whose `files` store is local (in `dir`), with `options`, the
/// store targeted by the resiliency `outbound` if any (`short`: a 1 s
/// timeout; `cb`: a breaker that trips at 2 consecutive failures).
async fn local_files(
    dir: &tempfile::TempDir,
    outbound: Option<serde_json::Value>,
    options: ApiOptions,
) -> Sidecar {
    let mut config = serde_json::json!({
        "appId": "shop",
        "components": {
            "file": {"files": {"type": "local", "metadata": {"root": dir.path().join("files")}}}
        }
    });
    if let Some(outbound) = outbound {
        config["resiliency"] = serde_json::json!({
            "policies": {
                "timeouts": {"short": "1s"},
                "circuitBreakers": {"cb": {"trip": "consecutiveFailures >= 2", "timeout": "60s"}}
            },
            "targets": {"components": {"files": {"outbound": outbound}}}
        });
    }
    Sidecar::start(&config.to_string(), options).await
}

#[tokio::test]
async fn put_file_outlasts_its_stores_resiliency_timeout_while_it_keeps_sending() {
    let dir = tempfile::tempdir().unwrap();
    let sidecar = local_files(
        &dir,
        Some(serde_json::json!({"timeout": "short"})),
        ApiOptions::default(),
    )
    .await;
    let mut client = runtime(&sidecar).await;
    // A chunk every 300 ms for 3 s: three times the store's timeout.
    let steady = upload(
        "steady.bin",
        10,
        std::time::Duration::from_millis(300),
        false,
    );
    client.put_file(steady).await.expect("a steady upload");
    let whole: Vec<u8> = (0..10u8).flat_map(|i| vec![b'a' + i; 1000]).collect();
    assert_eq!(
        std::fs::read(dir.path().join("files/steady.bin")).unwrap(),
        whole
    );
    sidecar.stop().await;
}

#[tokio::test]
async fn a_put_file_past_max_uploads_is_refused_until_the_running_one_ends() {
    let dir = tempfile::tempdir().unwrap();
    let options = ApiOptions {
        max_uploads: 1,
        ..ApiOptions::default()
    };
    let sidecar = local_files(&dir, None, options).await;
    let mut client = runtime(&sidecar).await;
    let message = |name: &str| layotto::PutFileRequest {
        store_name: "files".into(),
        name: name.into(),
        data: b"abc".to_vec(),
        ..Default::default()
    };
    // One upload, kept open: its first chunk sent, no end.
    let (sender, receiver) = tokio::sync::mpsc::channel(1);
    sender.send(message("one.bin")).await.unwrap();
    let mut running = client.clone();
    let first = tokio::spawn(async move {
        running
            .put_file(tokio_stream::wrappers::ReceiverStream::new(receiver))
            .await
    });
    let root = dir.path().join("files");
    let writing = tokio::time::timeout(grpc::PATIENCE, async {
        while std::fs::read_dir(&root).map_or(0, Iterator::count) == 0 {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(writing.is_ok(), "the store writes the first upload");
    let refused = client
        .put_file(tokio_stream::iter(vec![message("two.bin")]))
        .await
        .expect_err("no place left");
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(
        refused.message().contains("max_uploads: 1")
            && refused.message().contains("file `two.bin`"),
        "{}",
        refused.message()
    );
    drop(sender);
    tokio::time::timeout(grpc::PATIENCE, first)
        .await
        .expect("the first upload ends with its stream")
        .unwrap()
        .expect("stored");
    client
        .put_file(tokio_stream::iter(vec![message("two.bin")]))
        .await
        .expect("a place was given back");
    assert_eq!(std::fs::read(root.join("two.bin")).unwrap(), b"abc");
    sidecar.stop().await;
}

/// Downloads share one bound across both servers: a `GetFile` whose
/// client reads nothing holds its place (and the open file) until it is
/// dropped; meanwhile another `GetFile` is `RESOURCE_EXHAUSTED` and an
/// HTTP `GET` 429, both naming `max_downloads`. Failed before the bound:
/// every download was served, each holding a file and chunks for as long
/// as its client kept the stream.
#[tokio::test]
async fn downloads_past_max_downloads_are_refused_until_one_is_let_go_of() {
    let dir = tempfile::tempdir().unwrap();
    let options = ApiOptions {
        max_downloads: 1,
        ..ApiOptions::default()
    };
    let sidecar = local_files(&dir, None, options).await;
    let root = dir.path().join("files");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(root.join("big.bin"), vec![7u8; 8 << 20]).unwrap();
    let mut client = runtime(&sidecar).await;
    let request = || layotto::GetFileRequest {
        store_name: "files".into(),
        name: "big.bin".into(),
        ..Default::default()
    };
    let unread = client
        .get_file(request())
        .await
        .expect("a place")
        .into_inner();
    let refused = client.get_file(request()).await.expect_err("no place left");
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(
        refused.message().contains("max_downloads: 1")
            && refused.message().contains("file `big.bin`"),
        "{}",
        refused.message()
    );
    let url = format!("{}/v1.0/rewire/file/files/big.bin", sidecar.http_url());
    let http = reqwest::get(&url).await.expect("answered");
    assert_eq!(http.status(), reqwest::StatusCode::TOO_MANY_REQUESTS);
    assert!(http.text().await.unwrap().contains("max_downloads: 1"));
    drop(unread);
    let read = tokio::time::timeout(grpc::PATIENCE, async {
        loop {
            match client.get_file(request()).await {
                Ok(stream) => break stream.into_inner(),
                Err(status) => {
                    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
            }
        }
    })
    .await;
    let mut read = read.expect("a place was given back once the stream was dropped");
    let mut length = 0;
    while let Some(chunk) = read.message().await.unwrap() {
        length += chunk.data.len();
    }
    assert_eq!(length, 8 << 20);
    sidecar.stop().await;
}

/// Waits, up to the test's patience, until `folder` holds `count` entries
/// (a put's temporary file among them).
async fn holds(folder: &std::path::Path, count: usize, what: &str) {
    let count_now = || std::fs::read_dir(folder).map_or(0, Iterator::count);
    let waited = tokio::time::timeout(grpc::PATIENCE, async {
        while count_now() != count {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "{what}: {} entries", count_now());
}

#[tokio::test]
async fn put_files_their_client_cancels_do_not_open_the_stores_breaker() {
    let dir = tempfile::tempdir().unwrap();
    let sidecar = local_files(
        &dir,
        Some(serde_json::json!({"circuitBreaker": "cb"})),
        ApiOptions::default(),
    )
    .await;
    let client = runtime(&sidecar).await;
    let root = dir.path().join("files");
    // Three uploads, past the breaker's trip at 2, each cancelled by its
    // client (the call dropped: the stream reset) once the store writes it.
    for i in 0..3 {
        let name = format!("cut{i}.bin");
        let (sender, receiver) = tokio::sync::mpsc::channel(1);
        sender
            .send(layotto::PutFileRequest {
                store_name: "files".into(),
                name: name.clone(),
                data: vec![b'x'; 1000],
                ..Default::default()
            })
            .await
            .unwrap();
        let mut uploading = client.clone();
        let call = tokio::spawn(async move {
            uploading
                .put_file(tokio_stream::wrappers::ReceiverStream::new(receiver))
                .await
        });
        holds(
            &root,
            1,
            &format!("the store writes {name} (its breaker closed)"),
        )
        .await;
        call.abort();
        let _ = call.await;
        holds(&root, 0, &format!("{name} is abandoned, nothing kept")).await;
        drop(sender);
    }
    client
        .clone()
        .put_file(tokio_stream::iter(vec![layotto::PutFileRequest {
            store_name: "files".into(),
            name: "whole.txt".into(),
            data: b"whole".to_vec(),
            ..Default::default()
        }]))
        .await
        .expect("the breaker is closed");
    assert_eq!(std::fs::read(root.join("whole.txt")).unwrap(), b"whole");
    sidecar.stop().await;
}
