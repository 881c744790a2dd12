//! rewire's own HTTP routes for the sequencer and file kinds: next ids
//! (STRONG and WEAK), files put / get / HEAD / list / delete streamed past
//! the JSON body limit, escapes refused, and the app token required.

use crate::support::sidecar;

use reqwest::{Client, StatusCode};
use rewire::sidecar::{ApiOptions, ApiToken};
use serde_json::{json, Value};
use sidecar::Sidecar;

const TOKEN: &str = "app-token";

async fn sidecar(dir: &tempfile::TempDir, options: ApiOptions) -> Sidecar {
    let config = json!({
        "appId": "shop",
        "components": {
            "sequencer": {"ids": {"type": "memory", "metadata": {"biggerThan": {"orders": 100}}}},
            "file": {
                "files": {"type": "local", "metadata": {"root": dir.path().join("files")}},
                "scratch": {"type": "memory", "metadata": {"maxFileSize": 8}}
            }
        }
    });
    Sidecar::start(&config.to_string(), options).await
}

fn with_token() -> ApiOptions {
    ApiOptions {
        app_token: Some(ApiToken::new(TOKEN)),
        ..ApiOptions::default()
    }
}

async fn json_of(response: reqwest::Response) -> Value {
    response.json().await.expect("not JSON")
}

#[tokio::test]
async fn next_ids_strong_and_weak() {
    let dir = tempfile::tempdir().unwrap();
    let sidecar = sidecar(&dir, ApiOptions::default()).await;
    let client = Client::new();
    let url = |key: &str, query: &str| {
        format!(
            "{}/v1.0/rewire/sequencer/ids/{key}{query}",
            sidecar.http_url()
        )
    };
    let mut last = 100;
    for query in ["?increment=strong", "?increment=WEAK", ""] {
        let reply = client.get(url("orders", query)).send().await.unwrap();
        assert_eq!(reply.status(), StatusCode::OK);
        let id = json_of(reply).await["id"].as_i64().unwrap();
        assert!(id > last, "{id} after {last}");
        last = id;
    }
    let bad = client
        .get(url("orders", "?increment=sometimes"))
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
    let bad_key = client.get(url("a|||b", "")).send().await.unwrap();
    assert_eq!(bad_key.status(), StatusCode::BAD_REQUEST);
    assert_eq!(json_of(bad_key).await["errorCode"], "ERR_SEQUENCER_INVALID");
    let unknown = format!("{}/v1.0/rewire/sequencer/nope/orders", sidecar.http_url());
    let unknown = client.get(unknown).send().await.unwrap();
    assert_eq!(
        json_of(unknown).await["errorCode"],
        "ERR_SEQUENCER_NOT_FOUND"
    );
    sidecar.stop().await;
}

#[tokio::test]
async fn files_put_get_stat_list_delete_past_the_body_limit() {
    let dir = tempfile::tempdir().unwrap();
    let options = ApiOptions {
        max_request_bytes: 1024,
        ..ApiOptions::default()
    };
    let sidecar = sidecar(&dir, options).await;
    let client = Client::new();
    let base = format!("{}/v1.0/rewire/file/files", sidecar.http_url());
    // 2 MiB through a sidecar whose JSON bodies stop at 1 KiB: streamed.
    let contents: Vec<u8> = (0..2 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
    let put = client
        .put(format!("{base}/reports/2026/big.bin"))
        .body(contents.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), StatusCode::OK);
    let info = json_of(put).await;
    assert_eq!(info["size"], contents.len());
    assert_eq!(info["name"], "reports/2026/big.bin");
    for name in ["reports/a.txt", "reports/b.txt"] {
        let put = client
            .put(format!("{base}/{name}"))
            .body("x")
            .send()
            .await
            .unwrap();
        assert_eq!(put.status(), StatusCode::OK);
    }

    let got = client
        .get(format!("{base}/reports/2026/big.bin"))
        .send()
        .await
        .unwrap();
    assert_eq!(got.status(), StatusCode::OK);
    assert!(got.headers().contains_key("last-modified"));
    assert_eq!(got.bytes().await.unwrap(), contents);
    let head = client
        .head(format!("{base}/reports/a.txt"))
        .send()
        .await
        .unwrap();
    assert_eq!(head.status(), StatusCode::OK);
    assert_eq!(head.headers()["content-length"], "1");
    // A folder is no file here (gRPC `GetFileMeta` stats it, as Layotto).
    let folder = client.head(format!("{base}/reports")).send().await.unwrap();
    assert_eq!(folder.status(), StatusCode::NOT_FOUND);

    let page = json_of(
        client
            .get(format!("{base}?prefix=reports/&limit=2"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    let names: Vec<&str> = page["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["reports/2026/big.bin", "reports/a.txt"]);
    assert_eq!(page["marker"], "reports/a.txt");
    let next = format!("{base}?prefix=reports/&limit=2&marker=reports/a.txt");
    let page = json_of(client.get(next).send().await.unwrap()).await;
    assert_eq!(page, json!({"files": [page["files"][0].clone()]}));
    assert_eq!(page["files"][0]["name"], "reports/b.txt");

    let deleted = client
        .delete(format!("{base}/reports/a.txt"))
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), StatusCode::NO_CONTENT);
    let gone = client
        .get(format!("{base}/reports/a.txt"))
        .send()
        .await
        .unwrap();
    assert_eq!(gone.status(), StatusCode::NOT_FOUND);
    assert_eq!(json_of(gone).await["errorCode"], "ERR_FILE_NOT_FOUND");

    // An escape, its slashes percent-encoded so no client tidies it away.
    let escape = format!("{base}/reports%2F..%2F..%2Fsecrets.json");
    let escape = client.get(escape).send().await.unwrap();
    assert_eq!(escape.status(), StatusCode::BAD_REQUEST);
    assert_eq!(json_of(escape).await["errorCode"], "ERR_FILE_INVALID");
    let scratch = format!("{}/v1.0/rewire/file/scratch/big", sidecar.http_url());
    let too_large = client.put(scratch).body("123456789").send().await.unwrap();
    assert_eq!(too_large.status(), StatusCode::PAYLOAD_TOO_LARGE);
    sidecar.stop().await;
}

#[tokio::test]
async fn the_routes_need_the_app_token() {
    let dir = tempfile::tempdir().unwrap();
    let sidecar = sidecar(&dir, with_token()).await;
    let client = Client::new();
    let sequencer = format!("{}/v1.0/rewire/sequencer/ids/orders", sidecar.http_url());
    let file = format!("{}/v1.0/rewire/file/files/a.txt", sidecar.http_url());
    let refused = client.get(&sequencer).send().await.unwrap();
    assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
    let refused = client.put(&file).body("x").send().await.unwrap();
    assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
    assert!(!dir.path().join("files/a.txt").exists());
    let allowed = client
        .get(&sequencer)
        .header("dapr-api-token", TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(allowed.status(), StatusCode::OK);
    sidecar.stop().await;
}

/// Sends a `PUT` of `pieces` (each after a pause of `every`) to the file
/// route, the body `length` bytes long by its header, and reads the
/// answer: its status line and body.
async fn put_slowly(
    sidecar: &Sidecar,
    name: &str,
    length: usize,
    pieces: Vec<Vec<u8>>,
    every: std::time::Duration,
) -> (String, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(sidecar.http_addr)
        .await
        .unwrap();
    let head = format!(
        "PUT /v1.0/rewire/file/files/{name} HTTP/1.1\r\nHost: sidecar\r\n\
         Content-Length: {length}\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    for piece in pieces {
        tokio::time::sleep(every).await;
        if stream.write_all(&piece).await.is_err() {
            break;
        }
    }
    let mut answer = Vec::new();
    tokio::time::timeout(
        std::time::Duration::from_secs(10),
        stream.read_to_end(&mut answer),
    )
    .await
    .expect("answered within 10 s")
    .unwrap();
    let answer = String::from_utf8_lossy(&answer).to_string();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    let status = head.lines().next().unwrap_or_default().to_string();
    (status, body.to_string())
}

#[tokio::test]
async fn an_upload_is_bounded_by_inactivity_not_as_a_whole() {
    use std::time::Duration;
    let dir = tempfile::tempdir().unwrap();
    let options = ApiOptions {
        request_timeout: Duration::from_secs(1),
        ..ApiOptions::default()
    };
    let sidecar = sidecar(&dir, options).await;
    // A piece every 300 ms for 3 s: three times `request_timeout`.
    let pieces: Vec<Vec<u8>> = (0..10u8).map(|i| vec![b'a' + i; 1000]).collect();
    let whole = pieces.concat();
    let (status, body) = put_slowly(
        &sidecar,
        "steady.bin",
        whole.len(),
        pieces,
        Duration::from_millis(300),
    )
    .await;
    assert!(status.contains(" 200 "), "{status}: {body}");
    assert_eq!(
        std::fs::read(dir.path().join("files/steady.bin")).unwrap(),
        whole
    );

    // One piece of the 2000 bytes announced, then silence.
    let (status, body) = put_slowly(
        &sidecar,
        "stalled.bin",
        2000,
        vec![vec![b'x'; 1000]],
        Duration::from_millis(100),
    )
    .await;
    assert!(status.contains(" 408 "), "{status}: {body}");
    assert!(
        body.contains("ERR_TIMEOUT")
            && body.contains("file `stalled.bin`")
            && body.contains("file store `files`"),
        "{body}"
    );
    // Nothing left of it, not even a partial file (the abandoned put's
    // temporary file is removed off the request's task: waited for, up to
    // a limit that counts as a failure).
    let names = || -> Vec<_> {
        std::fs::read_dir(dir.path().join("files"))
            .unwrap()
            .map(|entry| entry.unwrap().file_name())
            .collect()
    };
    let cleaned = tokio::time::timeout(Duration::from_secs(10), async {
        while names() != ["steady.bin"] {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(cleaned.is_ok(), "left: {:?}", names());
    sidecar.stop().await;
}

/// Opens a `PUT` of `length` bytes (by its header) to `path` and returns
/// the connection, the head sent.
async fn open_put(sidecar: &Sidecar, path: &str, length: usize) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let mut stream = tokio::net::TcpStream::connect(sidecar.http_addr)
        .await
        .unwrap();
    let head = format!(
        "PUT {path} HTTP/1.1\r\nHost: sidecar\r\nContent-Length: {length}\r\n\
         Connection: close\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream
}

/// Writes `bytes` of made-up contents (one 1 MiB buffer, sent again and
/// again) to `stream`.
async fn send_generated(stream: &mut tokio::net::TcpStream, bytes: usize) {
    use tokio::io::AsyncWriteExt;
    let buffer: Vec<u8> = (0..1 << 20).map(|i: u32| (i % 251) as u8).collect();
    let mut left = bytes;
    while left > 0 {
        let n = left.min(buffer.len());
        stream.write_all(&buffer[..n]).await.unwrap();
        left -= n;
    }
}

/// The status line and body of the answer on `stream`.
async fn answer(stream: &mut tokio::net::TcpStream) -> (String, String) {
    use tokio::io::AsyncReadExt;
    let mut answer = Vec::new();
    tokio::time::timeout(
        std::time::Duration::from_secs(10),
        stream.read_to_end(&mut answer),
    )
    .await
    .expect("answered within 10 s")
    .unwrap();
    let answer = String::from_utf8_lossy(&answer).to_string();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    let status = head.lines().next().unwrap_or_default().to_string();
    (status, body.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_larger_than_the_listeners_budget_of_request_bytes_passes() {
    const SIZE: usize = 70 << 20;
    let dir = tempfile::tempdir().unwrap();
    // The default budget: 64 MiB of request bytes across the listener.
    let sidecar = sidecar(&dir, ApiOptions::default()).await;
    // A path that needs cleaning is routed as an upload, so it is charged
    // as one too.
    for (path, name) in [
        ("/v1.0/rewire/file/files/big.bin", "big.bin"),
        ("//v1.0/rewire/./file/files/big2.bin", "big2.bin"),
    ] {
        let mut stream = open_put(&sidecar, path, SIZE).await;
        send_generated(&mut stream, SIZE).await;
        let (status, body) = answer(&mut stream).await;
        assert!(status.contains(" 200 "), "{path}: {status}: {body}");
        let info: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(info["size"], SIZE);
        let stored = std::fs::metadata(dir.path().join("files").join(name)).unwrap();
        assert_eq!(stored.len(), SIZE as u64, "{path}");
    }
    sidecar.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_upload_holds_only_what_it_has_not_passed_on() {
    const MIB: usize = 1 << 20;
    let dir = tempfile::tempdir().unwrap();
    let config = json!({
        "appId": "shop",
        "components": {
            "state": {"orders": {"type": "memory"}},
            "file": {"files": {"type": "local", "metadata": {"root": dir.path().join("files")}}}
        }
    });
    // A budget of 1 MiB of request bytes across the listener.
    let options = ApiOptions {
        max_request_bytes: 64 * 1024,
        max_request_bytes_in_flight: MIB,
        ..ApiOptions::default()
    };
    let sidecar = Sidecar::start(&config.to_string(), options).await;
    let mut upload = open_put(&sidecar, "/v1.0/rewire/file/files/slow.bin", 4 * MIB).await;
    send_generated(&mut upload, 3 * MIB).await;
    // Wait until the store has taken more than twice the budget.
    let root = dir.path().join("files");
    let taken = || {
        std::fs::read_dir(&root)
            .map(|entries| {
                entries
                    .filter_map(|entry| entry.ok()?.metadata().ok())
                    .map(|meta| meta.len())
                    .max()
                    .unwrap_or(0)
            })
            .unwrap_or(0)
    };
    tokio::time::timeout(std::time::Duration::from_secs(10), async {
        while taken() < 2 * MIB as u64 {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the store took 2 MiB within 10 s");
    // The upload, paused, keeps its connection; a state save still passes.
    let value = "v".repeat(60 * 1024);
    let saved = Client::new()
        .post(format!("{}/v1.0/state/orders", sidecar.http_url()))
        .json(&json!([{"key": "k", "value": value}]))
        .send()
        .await
        .unwrap();
    assert_eq!(saved.status(), StatusCode::NO_CONTENT);
    send_generated(&mut upload, MIB).await;
    let (status, body) = answer(&mut upload).await;
    assert!(status.contains(" 200 "), "{status}: {body}");
    assert_eq!(
        std::fs::metadata(root.join("slow.bin")).unwrap().len(),
        4 * MIB as u64
    );
    sidecar.stop().await;
}

#[tokio::test]
async fn a_file_dated_before_1970_is_listed_and_stated() {
    let dir = tempfile::tempdir().unwrap();
    let sidecar = sidecar(&dir, ApiOptions::default()).await;
    let client = Client::new();
    let base = format!("{}/v1.0/rewire/file/files", sidecar.http_url());
    let put = client
        .put(format!("{base}/old.txt"))
        .body("x")
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), StatusCode::OK);
    // As `touch -d 1960-01-01` leaves it.
    let ten_years = std::time::Duration::from_secs(10 * 365 * 24 * 3600);
    std::fs::File::options()
        .write(true)
        .open(dir.path().join("files/old.txt"))
        .unwrap()
        .set_modified(std::time::UNIX_EPOCH - ten_years)
        .unwrap();
    let epoch = "Thu, 01 Jan 1970 00:00:00 GMT";
    let head = client.head(format!("{base}/old.txt")).send().await.unwrap();
    assert_eq!(head.status(), StatusCode::OK);
    assert_eq!(head.headers()["last-modified"], epoch);
    let got = client.get(format!("{base}/old.txt")).send().await.unwrap();
    assert_eq!(got.status(), StatusCode::OK);
    assert_eq!(got.headers()["last-modified"], epoch);
    let listed = client.get(&base).send().await.unwrap();
    assert_eq!(listed.status(), StatusCode::OK);
    assert_eq!(json_of(listed).await["files"][0]["lastModified"], epoch);
    sidecar.stop().await;
}

/// A sidecar whose `files` store (local, in `dir`) is targeted by the
/// resiliency policies `outbound` (`short`: a 1 s timeout; `cb`: a breaker
/// that trips at 2 consecutive failures).
async fn guarded_sidecar(dir: &tempfile::TempDir, outbound: Value, options: ApiOptions) -> Sidecar {
    let config = json!({
        "appId": "shop",
        "components": {
            "file": {"files": {"type": "local", "metadata": {"root": dir.path().join("files")}}}
        },
        "resiliency": {
            "policies": {
                "timeouts": {"short": "1s"},
                "circuitBreakers": {"cb": {"trip": "consecutiveFailures >= 2", "timeout": "60s"}}
            },
            "targets": {"components": {"files": {"outbound": outbound}}}
        }
    });
    Sidecar::start(&config.to_string(), options).await
}

/// The entries of `folder` now (a put's temporary file among them).
fn entries(folder: &std::path::Path) -> Vec<std::ffi::OsString> {
    std::fs::read_dir(folder)
        .map(|read| read.filter_map(|e| Some(e.ok()?.file_name())).collect())
        .unwrap_or_default()
}

/// Waits, up to 10 s, until `folder` holds `count` entries.
async fn holds(folder: &std::path::Path, count: usize, what: &str) {
    let waited = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        while entries(folder).len() != count {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "{what}: {:?}", entries(folder));
}

#[tokio::test]
async fn an_upload_outlasts_its_stores_resiliency_timeout_while_it_keeps_sending() {
    use std::time::Duration;
    let dir = tempfile::tempdir().unwrap();
    let sidecar = guarded_sidecar(&dir, json!({"timeout": "short"}), ApiOptions::default()).await;
    // A piece every 300 ms for 3 s: three times the store's 1 s timeout.
    let pieces: Vec<Vec<u8>> = (0..10u8).map(|i| vec![b'a' + i; 1000]).collect();
    let whole = pieces.concat();
    let (status, body) = put_slowly(
        &sidecar,
        "steady.bin",
        whole.len(),
        pieces,
        Duration::from_millis(300),
    )
    .await;
    assert!(status.contains(" 200 "), "{status}: {body}");
    assert_eq!(
        std::fs::read(dir.path().join("files/steady.bin")).unwrap(),
        whole
    );
    sidecar.stop().await;
}

#[tokio::test]
async fn uploads_their_client_breaks_off_do_not_open_the_stores_breaker() {
    let dir = tempfile::tempdir().unwrap();
    let options = ApiOptions {
        request_timeout: std::time::Duration::from_secs(1),
        ..ApiOptions::default()
    };
    let sidecar = guarded_sidecar(&dir, json!({"circuitBreaker": "cb"}), options).await;
    let root = dir.path().join("files");
    // Three uploads, past the breaker's trip at 2, each broken off by its
    // client once the store writes it; then one that goes silent.
    for i in 0..3 {
        let mut upload = open_put(
            &sidecar,
            &format!("/v1.0/rewire/file/files/cut{i}.bin"),
            2000,
        )
        .await;
        send_generated(&mut upload, 1000).await;
        holds(
            &root,
            1,
            &format!("the store writes cut{i}.bin (its breaker closed)"),
        )
        .await;
        drop(upload);
        holds(&root, 0, &format!("cut{i}.bin is abandoned, nothing kept")).await;
    }
    let (status, body) = put_slowly(
        &sidecar,
        "stalled.bin",
        2000,
        vec![vec![b'x'; 1000]],
        std::time::Duration::from_millis(10),
    )
    .await;
    assert!(status.contains(" 408 "), "{status}: {body}");
    holds(&root, 0, "stalled.bin is abandoned, nothing kept").await;
    let put = Client::new()
        .put(format!(
            "{}/v1.0/rewire/file/files/whole.txt",
            sidecar.http_url()
        ))
        .body("whole")
        .send()
        .await
        .unwrap();
    let status = put.status();
    assert_eq!(status, StatusCode::OK, "{}", put.text().await.unwrap());
    assert_eq!(std::fs::read(root.join("whole.txt")).unwrap(), b"whole");
    sidecar.stop().await;
}

#[tokio::test]
async fn uploads_past_max_uploads_are_refused_until_one_finishes() {
    let dir = tempfile::tempdir().unwrap();
    let options = ApiOptions {
        max_uploads: 2,
        ..ApiOptions::default()
    };
    let sidecar = sidecar(&dir, options).await;
    let root = dir.path().join("files");
    let path = |name: &str| format!("/v1.0/rewire/file/files/{name}");
    let mut first = open_put(&sidecar, &path("one.bin"), 2000).await;
    send_generated(&mut first, 1000).await;
    let mut second = open_put(&sidecar, &path("two.bin"), 2000).await;
    send_generated(&mut second, 1000).await;
    holds(&root, 2, "both uploads are being written").await;
    let client = Client::new();
    let put = |name: &str| {
        client
            .put(format!("{}{}", sidecar.http_url(), path(name)))
            .body("third")
            .send()
    };
    let refused = put("three.bin").await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    let body = json_of(refused).await;
    assert_eq!(body["errorCode"], "ERR_TOO_MANY_REQUESTS", "{body}");
    let message = body["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("max_uploads: 2") && message.contains("file `three.bin`"),
        "{message}"
    );
    send_generated(&mut first, 1000).await;
    let (status, body) = answer(&mut first).await;
    assert!(status.contains(" 200 "), "{status}: {body}");
    let passed = put("three.bin").await.unwrap();
    assert_eq!(passed.status(), StatusCode::OK);
    send_generated(&mut second, 1000).await;
    let (status, body) = answer(&mut second).await;
    assert!(status.contains(" 200 "), "{status}: {body}");
    assert_eq!(std::fs::read(root.join("three.bin")).unwrap(), b"third");
    sidecar.stop().await;
}
