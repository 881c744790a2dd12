//! `rewire run --resources-path`: a Dapr components folder, unmodified
//! (a `state.redis` store whose password is a `secretKeyRef` into a
//! `secretstores.local.file` store, `scopes`, Dapr-only metadata, a
//! `Configuration` beside it (skipped)), serves state over the Dapr HTTP API; editing
//! a manifest under load switches to another redis-server without a failed
//! request; an invalid manifest is rejected with its file and line; adding
//! and removing a manifest adds and removes its component; a manifest read
//! while empty (being rewritten) is refused, its component kept.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};
use testkit::load::{lost_writes, stored_value, Load, ReadBack, Round};
use testkit::redis::RedisServer;
use testkit::{free_port, ChildProcess};

const PASSWORD: &str = "dapr-yaml-pw";

/// How long a reload may take to show in the status.
const PATIENCE: Duration = Duration::from_secs(20);

fn statestore(redis_host: &str) -> String {
    format!(
        "apiVersion: dapr.io/v1alpha1
kind: Component
metadata:
  name: statestore
spec:
  type: state.redis
  version: v1
  metadata:
  - name: redisHost
    value: {redis_host}
  - name: redisPassword
    secretKeyRef:
      name: redisPassword
      key: redisPassword
  - name: actorStateStore
    value: \"true\"
auth:
  secretStore: localsecretstore
scopes:
- checkout
"
    )
}

const SECRET_STORE: &str = "apiVersion: dapr.io/v1alpha1
kind: Component
metadata:
  name: localsecretstore
spec:
  type: secretstores.local.file
  version: v1
  metadata:
  - name: secretsFile
    value: ./secrets.json
  - name: nestedSeparator
    value: \":\"
---
apiVersion: dapr.io/v1alpha1
kind: Configuration
metadata:
  name: appconfig
spec:
  tracing:
    samplingRate: \"1\"
";

/// Replaces `path`'s content at once (an editor's rename-write).
fn write_whole(path: &Path, text: &str) {
    let temp = path.with_extension("tmp");
    std::fs::write(&temp, text).unwrap();
    std::fs::rename(&temp, path).unwrap();
}

/// `rewire run --resources-path components --app-id checkout` in `dir`.
fn start(dir: &Path, http: &str) -> ChildProcess {
    let (dir, http) = (dir.to_path_buf(), http.to_string());
    let grpc = format!("127.0.0.1:{}", free_port());
    let mut sidecar = ChildProcess::new("rewire run", dir.join("rewire.log"), move || {
        let mut command = Command::new(env!("CARGO_BIN_EXE_rewire"));
        command
            .current_dir(&dir)
            .args([
                "run",
                "--resources-path",
                "components",
                "--app-id",
                "checkout",
            ])
            .args(["--grpc-addr", &grpc, "--http-addr", &http])
            .env("NO_COLOR", "1")
            .env_remove("DAPR_API_TOKEN");
        command
    });
    if let Err(err) = sidecar.start_until_logged(PATIENCE, "Sidecar APIs listening.") {
        panic!("sidecar did not start: {err}");
    }
    sidecar
}

async fn status(http: &reqwest::Client, base: &str) -> Value {
    let url = format!("{base}/v1.0/rewire/status");
    http.get(url).send().await.unwrap().json().await.unwrap()
}

/// The status once `done` holds for it.
async fn status_when(http: &reqwest::Client, base: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let now = status(http, base).await;
        if done(&now) {
            return now;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "status never got there: {now}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn newest_reload(status: &Value) -> &Value {
    status["reloads"]
        .as_array()
        .and_then(|r| r.last())
        .unwrap_or(&Value::Null)
}

fn components_folder(dir: &Path) -> PathBuf {
    let components = dir.join("components");
    std::fs::create_dir_all(&components).unwrap();
    components
}

/// One write through the Dapr HTTP API, then its read-back.
async fn round(http: reqwest::Client, url: String, key: String, value: String) -> Round {
    // A number, so that redis holds the same text as the value.
    let value: u64 = value.parse().unwrap_or_default();
    let saved = http
        .post(&url)
        .json(&json!([{"key": key, "value": value}]))
        .send()
        .await;
    match saved {
        Ok(r) if r.status().is_success() => {}
        Ok(r) => return Round::WriteFailed(format!("save: HTTP {}", r.status())),
        Err(e) => return Round::WriteFailed(format!("save: {e}")),
    }
    match http.get(format!("{url}/{key}")).send().await {
        // Written on the old server, read on the new one, at the switch.
        Ok(r) if r.status().as_u16() == 204 => Round::Written(ReadBack::Missed),
        Ok(r) if r.status().is_success() => match r.json::<Value>().await {
            Ok(got) if got == json!(value) => Round::Written(ReadBack::Same),
            Ok(_) => Round::Written(ReadBack::Missed),
            Err(e) => Round::Written(ReadBack::Failed(format!("get body: {e}"))),
        },
        Ok(r) => Round::Written(ReadBack::Failed(format!("get: HTTP {}", r.status()))),
        Err(e) => Round::Written(ReadBack::Failed(format!("get: {e}"))),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dapr_components_folder_runs_unmodified_and_a_manifest_edit_reloads_losslessly() {
    let (first, second) = (
        RedisServer::start_with_password(PASSWORD).await,
        RedisServer::start_with_password(PASSWORD).await,
    );
    let dir = tempfile::tempdir().unwrap();
    let components = components_folder(dir.path());
    std::fs::write(
        dir.path().join("secrets.json"),
        format!(r#"{{"redisPassword": "{PASSWORD}"}}"#),
    )
    .unwrap();
    std::fs::write(components.join("secretstore.yaml"), SECRET_STORE).unwrap();
    let manifest = components.join("statestore.yaml");
    std::fs::write(&manifest, statestore(&first.addr())).unwrap();
    let http_addr = format!("127.0.0.1:{}", free_port());
    let sidecar = start(dir.path(), &http_addr);
    let log = sidecar.log();
    assert!(log.contains("skipped a `Configuration`"), "{log}");
    assert!(log.contains("metadata `actorStateStore` ignored"), "{log}");
    assert!(!log.contains(PASSWORD), "the password leaked into the log");

    let (base, http) = (format!("http://{http_addr}"), testkit::http_client());
    let url = format!("{base}/v1.0/state/statestore");
    let load = Load::start(4, "dapr-", {
        let (http, url) = (http.clone(), url.clone());
        move |key, value| round(http.clone(), url.clone(), key, value)
    });
    // Writes reach the first server before the edit.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    // State keys are stored as Dapr's `{appId}||{key}`.
    while stored_value(&first.client_with_password(PASSWORD), "checkout||dapr-0-1")
        .await
        .is_none()
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no write reached the first server"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    write_whole(&manifest, &statestore(&second.addr()));
    let applied = status_when(&http, &base, |s| s["generation"].as_u64() >= Some(2)).await;
    let reload = newest_reload(&applied);
    assert_eq!(
        (reload["trigger"].as_str(), reload["outcome"].as_str()),
        (Some("file"), Some("applied")),
        "{applied}"
    );
    let action = reload["actions"]["state/statestore"].as_str();
    assert!(
        matches!(action, Some("updated_in_place" | "rebuilt")),
        "{reload}"
    );
    // Writes reach the second server after it.
    let marker = "after-switch";
    let saved = http
        .post(&url)
        .json(&json!([{"key": "after-switch", "value": 1}]))
        .send()
        .await
        .unwrap();
    assert!(saved.status().is_success());
    let seen = load.finish().await;
    println!(
        "{} writes acknowledged, {} read-backs missed at the switch, {} failed",
        seen.acked.len(),
        seen.missed,
        seen.failed.len()
    );
    assert!(
        seen.failed.is_empty(),
        "requests failed across the reload: {:?}",
        seen.failed
    );
    assert!(!seen.acked.is_empty());
    let servers = [
        first.client_with_password(PASSWORD),
        second.client_with_password(PASSWORD),
    ];
    let stored: Vec<(String, String)> = seen
        .acked
        .iter()
        .map(|(key, value)| (format!("checkout||{key}"), value.clone()))
        .collect();
    assert_eq!(
        lost_writes(&stored, &servers).await,
        Vec::<(String, String)>::new()
    );
    assert!(
        stored_value(&servers[1], &format!("checkout||{marker}"))
            .await
            .is_some(),
        "the new generation does not write to the second server"
    );

    // An invalid manifest is refused with its file and line; generation 2 stays.
    write_whole(
        &manifest,
        &statestore(&second.addr()).replace("state.redis", "state.mongodb"),
    );
    let rejected = status_when(&http, &base, |s| {
        newest_reload(s)["outcome"] == json!("rejected")
    })
    .await;
    let error = newest_reload(&rejected)["error"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        error.contains("statestore.yaml:6: state/statestore: unsupported type state.mongodb"),
        "{error}"
    );
    assert_eq!(rejected["generation"], json!(2));
    let got = http
        .get(format!("{url}/after-switch"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        got.json::<Value>().await.unwrap(),
        json!(1),
        "the running store still serves"
    );
    drop(sidecar);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adding_and_removing_a_manifest_adds_and_removes_its_component() {
    let dir = tempfile::tempdir().unwrap();
    let components = components_folder(dir.path());
    let memory = |name: &str, dapr_type: &str| {
        format!("apiVersion: dapr.io/v1alpha1\nkind: Component\nmetadata:\n  name: {name}\nspec:\n  type: {dapr_type}\n  version: v1\n")
    };
    std::fs::write(
        components.join("cache.yaml"),
        memory("cache", "state.in-memory"),
    )
    .unwrap();
    let http_addr = format!("127.0.0.1:{}", free_port());
    let _sidecar = start(dir.path(), &http_addr);
    let (base, http) = (format!("http://{http_addr}"), testkit::http_client());
    let names = |s: &Value| -> Vec<String> {
        let mut names: Vec<String> = s["components"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| {
                format!(
                    "{}/{}",
                    c["kind"].as_str().unwrap_or(""),
                    c["name"].as_str().unwrap_or("")
                )
            })
            .collect();
        names.sort();
        names
    };
    assert_eq!(names(&status(&http, &base).await), ["state/cache"]);

    write_whole(
        &components.join("locks.yml"),
        &memory("locks", "lock.in-memory"),
    );
    let added = status_when(&http, &base, |s| s["generation"].as_u64() >= Some(2)).await;
    assert_eq!(names(&added), ["lock/locks", "state/cache"]);
    assert_eq!(
        newest_reload(&added)["actions"]["lock/locks"],
        json!("added")
    );

    std::fs::remove_file(components.join("cache.yaml")).unwrap();
    let removed = status_when(&http, &base, |s| s["generation"].as_u64() >= Some(3)).await;
    assert_eq!(names(&removed), ["lock/locks"]);
    assert_eq!(
        newest_reload(&removed)["actions"]["state/cache"],
        json!("removed")
    );
}

#[test]
fn validate_names_the_file_and_line_of_every_problem() {
    let dir = tempfile::tempdir().unwrap();
    let components = components_folder(dir.path());
    let typo = statestore("localhost:6379").replace("redisHost", "redisHots");
    std::fs::write(components.join("statestore.yaml"), typo).unwrap();
    std::fs::write(
        components.join("secretstore.yaml"),
        SECRET_STORE.replace("version: v1", "version: v2"),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_rewire"))
        .current_dir(dir.path())
        .args([
            "validate",
            "--components-path",
            "components",
            "--app-id",
            "checkout",
        ])
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let problems: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("components/"))
        .collect();
    assert_eq!(
        problems,
        [
            "components/secretstore.yaml:7: secret_store/localsecretstore: unsupported spec.version `v2` (rewire implements v1)",
            "components/statestore.yaml:9: state/statestore: unknown metadata field `redisHots` (did you mean `redisHost`?)",
        ],
        "{stderr}"
    );
}

/// Kubernetes' atomic writer: the files live in a timestamped folder that
/// `..data` links to, each manifest a link through `..data`; an update
/// writes a new folder and swaps the `..data` link by a rename.
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configmap_update_swapping_the_data_link_reloads() {
    use std::os::unix::fs::symlink;
    let dir = tempfile::tempdir().unwrap();
    let components = components_folder(dir.path());
    let cache = |ttl: u32| {
        format!("apiVersion: dapr.io/v1alpha1\nkind: Component\nmetadata:\n  name: cache\nspec:\n  type: state.in-memory\n  metadata:\n  - name: defaultTtlInSeconds\n    value: \"{ttl}\"\n")
    };
    let version = |name: &str, ttl: u32| {
        let folder = components.join(name);
        std::fs::create_dir(&folder).unwrap();
        std::fs::write(folder.join("cache.yaml"), cache(ttl)).unwrap();
    };
    version("..2026_01", 30);
    symlink("..2026_01", components.join("..data")).unwrap();
    symlink("..data/cache.yaml", components.join("cache.yaml")).unwrap();
    let http_addr = format!("127.0.0.1:{}", free_port());
    let _sidecar = start(dir.path(), &http_addr);
    let (base, http) = (format!("http://{http_addr}"), testkit::http_client());
    assert_eq!(status(&http, &base).await["generation"], json!(1));

    version("..2026_02", 60);
    symlink("..2026_02", components.join("..data_tmp")).unwrap();
    std::fs::rename(components.join("..data_tmp"), components.join("..data")).unwrap();
    let updated = status_when(&http, &base, |s| s["generation"].as_u64() >= Some(2)).await;
    let reload = newest_reload(&updated);
    assert_eq!(reload["outcome"], json!("applied"), "{updated}");
    assert_eq!(
        reload["actions"]["state/cache"],
        json!("updated_in_place"),
        "{reload}"
    );
}

/// `sops -d cache.enc.yaml > cache.yaml` truncates the manifest, then waits
/// on its KMS longer than the watch's 100 ms of quiet: the empty file read
/// meanwhile used to be a folder without `state/cache`, a reload removed
/// it (and the memory store's data) and the write-back added it empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manifest_read_while_empty_keeps_its_component_and_data() {
    let dir = tempfile::tempdir().unwrap();
    let components = components_folder(dir.path());
    let manifest = components.join("cache.yaml");
    let cache = "apiVersion: dapr.io/v1alpha1\nkind: Component\nmetadata:\n  name: cache\nspec:\n  type: state.in-memory\n  version: v1\n";
    std::fs::write(&manifest, cache).unwrap();
    let http_addr = format!("127.0.0.1:{}", free_port());
    let _sidecar = start(dir.path(), &http_addr);
    let (base, http) = (format!("http://{http_addr}"), testkit::http_client());
    let url = format!("{base}/v1.0/state/cache");
    let saved = http
        .post(&url)
        .json(&json!([{"key": "kept", "value": 7}]))
        .send()
        .await
        .unwrap();
    assert!(saved.status().is_success(), "{}", saved.status());

    // Truncated; written back once the empty file has been read.
    std::fs::File::create(&manifest).unwrap();
    let read_empty = status_when(&http, &base, |s| !newest_reload(s).is_null()).await;
    let reload = newest_reload(&read_empty);
    assert_eq!(reload["outcome"], json!("rejected"), "{read_empty}");
    let error = reload["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("cache.yaml: holds no resource; delete it to remove its components"),
        "{error}"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    std::fs::write(&manifest, cache).unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;

    let after = status(&http, &base).await;
    assert_eq!(after["generation"], json!(1), "{after}");
    let removed = after["reloads"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|r| r["actions"]["state/cache"] == json!("removed"));
    assert!(!removed, "{after}");
    let got = http.get(format!("{url}/kept")).send().await.unwrap();
    assert_eq!(
        got.json::<Value>().await.unwrap(),
        json!(7),
        "the data is kept"
    );
}
