//! Layotto's own configuration files, written here in their published form
//! (mosn/layotto `configs/config_in_memory.json`, `config_state_redis.json`
//! and `config_ref_example.json`: a MOSN listener whose gRPC filter carries
//! `grpc_config`), validate and run under `rewire`, unmodified but for
//! addresses and paths, and serve Layotto's gRPC clients; and what rewire
//! does not support is named.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};
use testkit::redis::RedisServer;
use testkit::{free_port, ChildProcess};

/// Layotto's MOSN wrapping around a `grpc_config`, as its files have it
/// (with the actuator listener that rewire ignores).
fn mosn(grpc_config: Value) -> String {
    json!({"servers": [{
        "default_log_path": "stdout",
        "default_log_level": "DEBUG",
        "routers": [{"router_config_name": "actuator_dont_need_router"}],
        "listeners": [
            {"name": "grpc", "address": "127.0.0.1:34904", "bind_port": true,
             "filter_chains": [{"filters": [{"type": "grpc", "config": {
                "server_name": "runtime", "grpc_config": grpc_config}}]}]},
            {"name": "actuator", "address": "127.0.0.1:34999", "bind_port": true,
             "filter_chains": [{"filters": [{"type": "proxy", "config": {
                "downstream_protocol": "Http1", "upstream_protocol": "Http1",
                "router_config_name": "actuator_dont_need_router"}}]}],
             "stream_filters": [{"type": "actuator_filter"}]}
        ]
    }]})
    .to_string()
}

fn in_memory() -> String {
    mosn(json!({
        "hellos": {"helloworld": {"hello": "greeting"}},
        "state": {"in-memory": {"metadata": {}}},
        "lock": {"in-memory": {"metadata": {}}},
        "pub_subs": {"in-memory": {"metadata": {"consumerID": "1"}}},
        "app": {"app_id": "app1", "grpc_callback_port": 9999}
    }))
}

fn state_redis(redis: &str) -> String {
    mosn(json!({
        "hellos": {"helloworld": {"type": "helloworld", "hello": "greeting"}},
        "state": {"state_demo": {"type": "redis", "metadata": {"redisHost": redis, "redisPassword": ""}}},
        "app": {"app_id": "app1", "grpc_callback_port": 9999}
    }))
}

fn sequencer_with_secret_ref(redis: &str) -> String {
    mosn(json!({
        "hellos": {"helloworld": {"type": "helloworld", "hello": "greeting"}},
        "secret_store": {
            "local.file": {"type": "local.file", "metadata": {"secretsFile": "secrets.json"}},
            "local.env": {"type": "local.env", "metadata": {}}
        },
        "sequencer": {"redis": {
            "type": "redis",
            "metadata": {"redisHost": redis, "redisPassword": ""},
            "secret_ref": [{"name": "local.file", "key": "redisPassword"}]
        }},
        "app": {"app_id": "app1", "grpc_callback_port": 9999}
    }))
}

fn rewire(args: &[&str], config: &Path) -> std::process::Output {
    testkit::output(
        Command::new(env!("CARGO_BIN_EXE_rewire"))
            .args(args)
            .arg("--config")
            .arg(config)
            .env("NO_COLOR", "1"),
    )
}

/// A blocking HTTP GET/POST through reqwest's async client (the tests are
/// plain threads; the sidecar is another process).
struct Http {
    runtime: tokio::runtime::Runtime,
    client: reqwest::Client,
}

impl Http {
    fn new() -> Self {
        rewire::components::tls::install_ring_provider();
        Self {
            runtime: tokio::runtime::Runtime::new().unwrap(),
            client: testkit::http_client(),
        }
    }

    fn get(&self, url: &str) -> (u16, String) {
        self.runtime.block_on(async {
            let answer = self.client.get(url).send().await.expect("GET failed");
            (
                answer.status().as_u16(),
                answer.text().await.unwrap_or_default(),
            )
        })
    }

    fn post_json(&self, url: &str, body: &Value) -> u16 {
        self.runtime.block_on(async {
            let answer = self
                .client
                .post(url)
                .json(body)
                .send()
                .await
                .expect("POST failed");
            answer.status().as_u16()
        })
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `rewire run --config` on `config` (gRPC on `grpc_port`), until its APIs
/// listen.
fn run_with_grpc(config: &Path, http_port: u16, grpc_port: u16) -> ChildProcess {
    let config = config.to_path_buf();
    let log = config.with_extension("log");
    let mut sidecar = ChildProcess::new("rewire run", log, move || {
        let mut command = Command::new(env!("CARGO_BIN_EXE_rewire"));
        command
            .arg("run")
            .arg("--config")
            .arg(&config)
            .args(["--grpc-addr", &format!("127.0.0.1:{grpc_port}")])
            .args(["--http-addr", &format!("127.0.0.1:{http_port}")])
            .env("NO_COLOR", "1");
        command
    });
    sidecar
        .start_until_logged(Duration::from_secs(60), "Sidecar APIs listening.")
        .unwrap_or_else(|err| panic!("rewire did not start: {err}"));
    sidecar
}

/// `rewire run --config` on `config`, until its APIs listen.
fn run(config: &Path, http_port: u16) -> ChildProcess {
    run_with_grpc(config, http_port, free_port())
}

#[test]
fn layottos_in_memory_file_validates_and_runs_with_its_components() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config_in_memory.json");
    std::fs::write(&config, in_memory()).unwrap();
    let checked = rewire(&["validate"], &config);
    assert!(checked.status.success(), "{}", text(&checked.stderr));

    let http = free_port();
    let mut sidecar = run(&config, http);
    let (_, body) = Http::new().get(&format!("http://127.0.0.1:{http}/v1.0/metadata"));
    let metadata: Value = serde_json::from_str(&body).expect("metadata");
    assert_eq!(
        metadata["id"], "app1",
        "app.app_id is the app id: {metadata}"
    );
    let names: Vec<&str> = metadata["components"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert_eq!(
        names.iter().filter(|n| **n == "in-memory").count(),
        3,
        "{metadata}"
    );
    assert!(
        sidecar
            .log()
            .contains("hello components are not part of rewire"),
        "{}",
        sidecar.log()
    );
    assert!(
        sidecar.terminate().is_ok_and(|s| s.success()),
        "{}",
        sidecar.log()
    );
}

#[test]
fn layottos_redis_state_file_serves_state() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let redis = runtime.block_on(RedisServer::start());
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config_state_redis.json");
    std::fs::write(&config, state_redis(&redis.addr())).unwrap();
    let checked = rewire(&["validate"], &config);
    assert!(checked.status.success(), "{}", text(&checked.stderr));

    let http = free_port();
    let mut sidecar = run(&config, http);
    let client = Http::new();
    let url = format!("http://127.0.0.1:{http}/v1.0/state/state_demo");
    let saved = client.post_json(&url, &json!([{"key": "k", "value": "v"}]));
    assert_eq!(saved, 204);
    let (status, body) = client.get(&format!("{url}/k"));
    assert_eq!((status, body.as_str()), (200, r#""v""#));
    assert!(
        sidecar.terminate().is_ok_and(|s| s.success()),
        "{}",
        sidecar.log()
    );
}

#[test]
fn layottos_sequencer_with_a_secret_ref_gets_its_password_from_the_secret_store() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let redis = runtime.block_on(RedisServer::start_with_password("layotto-pw"));
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("secrets.json"),
        r#"{"redisPassword": "layotto-pw"}"#,
    )
    .unwrap();
    let config = dir.path().join("config_ref_example.json");
    std::fs::write(&config, sequencer_with_secret_ref(&redis.addr())).unwrap();
    let checked = rewire(&["validate"], &config);
    assert!(checked.status.success(), "{}", text(&checked.stderr));

    let (http, grpc) = (free_port(), free_port());
    let mut sidecar = run_with_grpc(&config, http, grpc);
    let client = Http::new();
    // Layotto's own client, generated from its definitions, on the gRPC port.
    let from_layotto = client.runtime.block_on(async {
        use rewire::sidecar::grpc::proto::spec::proto::runtime::v1 as layotto;
        let channel = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{grpc}"))
            .expect("url")
            .connect()
            .await
            .expect("connect");
        let mut runtime = layotto::runtime_client::RuntimeClient::new(channel);
        let request = layotto::GetNextIdRequest {
            store_name: "redis".into(),
            key: "orders".into(),
            ..Default::default()
        };
        runtime
            .get_next_id(request)
            .await
            .expect("GetNextId")
            .into_inner()
            .next_id
    });
    assert!(from_layotto > 0);
    let url =
        format!("http://127.0.0.1:{http}/v1.0/rewire/sequencer/redis/orders?increment=strong");
    let ids: Vec<i64> = (0..3)
        .map(|_| {
            let (status, body) = client.get(&url);
            let answer: Value = serde_json::from_str(&body).unwrap_or_default();
            assert_eq!(status, 200, "{body}");
            answer["id"]
                .as_i64()
                .unwrap_or_else(|| panic!("no id: {body}"))
        })
        .collect();
    assert!(ids[0] > from_layotto, "{ids:?} after {from_layotto}");
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
    assert!(
        !sidecar.log().contains("layotto-pw"),
        "the password is never logged"
    );
    assert!(
        sidecar.terminate().is_ok_and(|s| s.success()),
        "{}",
        sidecar.log()
    );
}

#[test]
fn what_rewire_does_not_support_is_named_where_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config_bindings.json");
    std::fs::write(
        &config,
        mosn(json!({
            "bindings": {"http": {"metadata": {"url": "https://example.com"}}},
            "state": {"mongo": {"metadata": {}}},
            "app": {"app_id": "app1"}
        })),
    )
    .unwrap();
    let checked = rewire(&["validate"], &config);
    assert_eq!(checked.status.code(), Some(1));
    let stderr = text(&checked.stderr);
    assert!(
        stderr.contains("filters[0].config.grpc_config.bindings: Layotto building block `bindings` is not supported"),
        "{stderr}"
    );
    assert!(
        stderr.contains("state/mongo"),
        "an unknown type names its component: {stderr}"
    );
}

/// A second `grpc_config` (another listener's) is a problem naming it:
/// its components would not be loaded. MOSN's top-level settings other
/// than `servers` (`tracing`, `metrics`) are left out with a note each.
#[test]
fn a_second_grpc_config_is_a_problem_and_other_mosn_settings_are_noted() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config_two_listeners.json");
    let mut document: Value = serde_json::from_str(&in_memory()).unwrap();
    let second = json!({"name": "grpc2", "address": "127.0.0.1:34905", "bind_port": true,
        "filter_chains": [{"filters": [{"type": "grpc", "config": {
            "server_name": "runtime2",
            "grpc_config": {"state": {"orders": {"type": "in-memory", "metadata": {}}}}}}]}]});
    document["servers"][0]["listeners"]
        .as_array_mut()
        .unwrap()
        .push(second);
    document["tracing"] = json!({"enable": true, "driver": "SOFATracer"});
    document["metrics"] = json!({"sinks": [{"type": "prometheus", "config": {"port": 34903}}]});
    std::fs::write(&config, document.to_string()).unwrap();
    let checked = rewire(&["validate"], &config);
    let stderr = text(&checked.stderr);
    assert_eq!(checked.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(
            "servers[0].listeners[2].filter_chains[0].filters[0].config.grpc_config: a second \
             `grpc_config` is not supported by rewire: only the first \
             (servers[0].listeners[0].filter_chains[0].filters[0].config.grpc_config) is loaded"
        ),
        "{stderr}"
    );
    for setting in ["tracing", "metrics"] {
        assert!(
            stderr.contains(&format!(
                "`{setting}`: a MOSN setting rewire does not read; left out"
            )),
            "{setting}: {stderr}"
        );
    }
}

/// Layotto's config-store files keep the connection at the component's top
/// level (`address`, `timeout`, `store_name`, `app_id`, Layotto's
/// `StoreConfig`) and name the block `config_stores`, as
/// `configs/config_apollo.json` and `config_integration_redis_etcd.json`
/// have them: they validate, the address and timeout becoming the store's
/// metadata.
#[test]
fn layottos_config_store_files_validate_with_their_address_and_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config_apollo.json");
    std::fs::write(
        &config,
        mosn(json!({
            "hellos": {"helloworld": {"hello": "greeting"}},
            "config_stores": {
                "apollo": {
                    "address": ["http://127.0.0.1:8080"],
                    "metadata": {
                        "app_id": "testApplication_yang",
                        "cluster": "default",
                        "namespace_name": "dubbo,product.joe,application",
                        "is_backup_config": "true",
                        "secret": "6ce3ff7e96a24335a9634fe9abca6d51",
                        "open_api_token": "947b0db097d2931ba5bf503f1e33c10394f90d11",
                        "open_api_address": "http://127.0.0.1",
                        "open_api_user": "apollo"
                    }
                },
                "etcd": {"address": ["127.0.0.1:2379", "127.0.0.1:2380"], "timeout": "10",
                         "store_name": "etcd", "app_id": "app1"}
            },
            "app": {"app_id": "app1", "grpc_callback_port": 9999}
        })),
    )
    .unwrap();
    let checked = rewire(&["validate"], &config);
    let stderr = text(&checked.stderr);
    assert!(checked.status.success(), "{stderr}");
    assert!(
        text(&checked.stdout).contains("valid (2 components)"),
        "{}",
        text(&checked.stdout)
    );

    // A bad address is the store's problem, named as the metadata it became.
    let mut document: Value =
        serde_json::from_str(&std::fs::read_to_string(&config).unwrap()).unwrap();
    let grpc_config = document
        .pointer_mut("/servers/0/listeners/0/filter_chains/0/filters/0/config/grpc_config")
        .unwrap();
    grpc_config["config_stores"]["etcd"]["address"] = json!(["not an address"]);
    std::fs::write(&config, document.to_string()).unwrap();
    let checked = rewire(&["validate"], &config);
    let stderr = text(&checked.stderr);
    assert_eq!(checked.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("config_store/etcd"), "{stderr}");
    assert!(stderr.contains("endpoints"), "{stderr}");
}

/// Layotto's shipped `configs/config_sequencer_etcd.json` (segment fields,
/// `"dialTimeout": "5"` meaning seconds) validates; and a redis sequencer
/// with Layotto's `biggerThan` beside its metadata hands out ids above it,
/// at Layotto's key (`sequencer|||{appId}||{key}`).
#[test]
fn layottos_sequencer_files_validate_and_honour_bigger_than() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config_sequencer_etcd.json");
    std::fs::write(
        &config,
        mosn(json!({
            "hellos": {"helloworld": {"hello": "greeting"}},
            "sequencer": {"etcd": {"metadata": {
                "endpoints": "localhost:2379",
                "segmentCacheEnable": "false",
                "segmentStep": "1",
                "username": "",
                "password": "",
                "dialTimeout": "5"
            }}},
            "app": {"app_id": "app1", "grpc_callback_port": 9999}
        })),
    )
    .unwrap();
    let checked = rewire(&["validate"], &config);
    let stderr = text(&checked.stderr);
    assert!(checked.status.success(), "{stderr}");
    assert!(
        stderr.contains("sequencer.etcd.metadata.segmentCacheEnable: left out"),
        "{stderr}"
    );
    assert!(
        text(&checked.stdout).contains("valid (1 component"),
        "{}",
        text(&checked.stdout)
    );

    let runtime = tokio::runtime::Runtime::new().unwrap();
    let redis = runtime.block_on(RedisServer::start());
    let config = dir.path().join("config_sequencer_redis.json");
    std::fs::write(
        &config,
        mosn(json!({
            "hellos": {"helloworld": {"hello": "greeting"}},
            "sequencer": {"redis": {
                "biggerThan": {"orders": 100},
                "metadata": {"redisHost": redis.addr(), "redisPassword": ""}
            }},
            "app": {"app_id": "app1", "grpc_callback_port": 9999}
        })),
    )
    .unwrap();
    let checked = rewire(&["validate"], &config);
    assert!(checked.status.success(), "{}", text(&checked.stderr));
    let http = free_port();
    let mut sidecar = run(&config, http);
    let client = Http::new();
    let url =
        format!("http://127.0.0.1:{http}/v1.0/rewire/sequencer/redis/orders?increment=strong");
    let (status, body) = client.get(&url);
    assert_eq!(status, 200, "{body}");
    let answer: Value = serde_json::from_str(&body).unwrap_or_default();
    assert_eq!(answer["id"], 101, "{body}");
    let counter = runtime
        .block_on(redis.query(&["GET", "sequencer|||app1||orders"]))
        .unwrap();
    assert_eq!(counter, ["101"]);
    assert!(
        sidecar.terminate().is_ok_and(|s| s.success()),
        "{}",
        sidecar.log()
    );
}
