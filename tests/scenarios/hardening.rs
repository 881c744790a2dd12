//! Faults the runtime must outlast (issue "Hardening II", runtime side): a
//! rolled-back triggered reload is retried, a store that never answers
//! cannot hold reloads, a push without a type keeps the type in force,
//! status asks every component at once, pushes can be released, and a FIFO
//! in place of the configuration file is refused.

use crate::support::reload::{self, key};
use crate::support::triggers::eventually;

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::Duration;

use rewire::config::ComponentPatch;
use rewire::prelude::*;
use rewire::{
    ConfigError, ConfigItem, ConfigQuery, ConfigSubscription, Outcome, ReloadError, RuntimeOptions,
    StartTimeouts, SubscriptionHub, Trigger,
};
use serde::Deserialize;
use serde_json::json;

/// Metadata of [`Stalling`].
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct StallingMeta {
    /// `get` never answers.
    stall_reads: bool,
    /// Once this tag is in [`STALLED_READINESS`], `readiness` never answers.
    tag: String,
}

/// Tags whose readiness no longer answers.
static STALLED_READINESS: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

/// A config store that can stop answering reads, or readiness.
#[derive(rewire::Component)]
#[component(kind = "config_store", type = "test.stalling")]
struct Stalling {
    #[metadata]
    meta: StallingMeta,
    hub: SubscriptionHub,
}

#[async_trait]
impl Component for Stalling {
    async fn readiness(&self) -> Readiness {
        let stalled = STALLED_READINESS
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&self.meta.tag);
        if stalled {
            std::future::pending::<()>().await;
        }
        Readiness::Ready
    }
}

#[async_trait]
impl ConfigStore for Stalling {
    async fn get(&self, query: &ConfigQuery) -> Result<Vec<ConfigItem>, ConfigError> {
        if self.meta.stall_reads {
            std::future::pending::<()>().await;
        }
        Ok(query
            .keys
            .iter()
            .map(|k| ConfigItem {
                key: k.clone(),
                value: "v".into(),
                ..ConfigItem::default()
            })
            .collect())
    }

    async fn subscribe(&self, query: ConfigQuery) -> Result<ConfigSubscription, ConfigError> {
        Ok(self.hub.subscribe(query))
    }
}

fn probe(name: &str, meta: serde_json::Value) -> serde_json::Value {
    json!({ name: {"type": "test.reload.probe", "metadata": meta} })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_never_answers_cannot_hold_reloads() {
    let options = RuntimeOptions {
        timeouts: StartTimeouts {
            init: Duration::from_millis(300),
            ..StartTimeouts::default()
        },
        ..RuntimeOptions::default()
    };
    let base = json!({"components": {
        "config_store": {"mute": {"type": "test.stalling", "metadata": {"stallReads": true}}},
        "probe": probe("steady", json!({"tag": "hardening-steady"}))
    }});
    let runtime = reload::start_with(&base.to_string(), options).await;
    let mut reading = base.clone();
    reading["components"]["probe"]["reader"] = json!({"type": "test.reload.probe",
        "configurationRef": [{"store": "mute", "key": "k", "injectAs": "value"}]});
    // Were the read unbounded, this would never return.
    let answer = tokio::time::timeout(
        Duration::from_secs(20),
        runtime.apply(reload::candidate(&reading.to_string())),
    )
    .await
    .expect("the reload is bounded by the init timeout");
    match answer {
        Err(ReloadError::RolledBack(failures)) => {
            assert!(
                failures[0].message.contains("did not answer within"),
                "{failures:?}"
            )
        }
        other => panic!("expected a rollback, got {other:?}"),
    }
    // The next reload is not stuck behind it.
    let mut next = base.clone();
    next["components"]["probe"]["steady"]["metadata"]["rev"] = json!(1);
    let record = tokio::time::timeout(
        Duration::from_secs(20),
        runtime.apply(reload::candidate(&next.to_string())),
    )
    .await
    .expect("a later reload runs")
    .expect("and applies");
    assert_eq!(record.outcome, Outcome::Applied);
    runtime.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn status_asks_every_component_for_its_readiness_at_once() {
    let stores: serde_json::Map<String, serde_json::Value> = (0..8)
        .map(|i| {
            (
                format!("s{i}"),
                json!({"type": "test.stalling", "metadata": {"tag": "hardening-status"}}),
            )
        })
        .collect();
    let config = json!({"components": {"config_store": stores}});
    let runtime = reload::start(&config.to_string()).await;
    STALLED_READINESS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert("hardening-status".into());
    let asked = tokio::time::Instant::now();
    let status = runtime.status().await;
    // Virtual time (the clock is paused): one readiness deadline for all
    // eight, where asking one at a time would take eight.
    let took = asked.elapsed();
    assert!(took < Duration::from_secs(2), "status took {took:?}");
    assert_eq!(status.components.len(), 8);
    assert!(status.components.iter().all(|c| c.state == "not_ready"));
    STALLED_READINESS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove("hardening-status");
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_without_a_type_keeps_the_type_in_force() {
    let config = json!({"components": {"probe": probe("p", json!({"tag": "hardening-typeless"}))}});
    let runtime = reload::start(&config.to_string()).await;
    let metadata_only = ComponentPatch {
        metadata: json!({"tag": "hardening-typeless", "rev": 7})
            .as_object()
            .cloned()
            .unwrap(),
        ..ComponentPatch::default()
    };
    let record = runtime
        .apply_component(key("probe/p"), metadata_only, None)
        .await
        .expect("a metadata-only push applies");
    assert_eq!(record.outcome, Outcome::Applied);
    let running = runtime.config();
    assert_eq!(
        running.config.components[&key("probe/p")].type_name,
        "test.reload.probe"
    );
    assert_eq!(reload::probe(&runtime, "p").meta().rev, 7);
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_push_gives_the_component_back_to_the_file_and_unknown_ones_are_refused() {
    let config =
        json!({"components": {"probe": probe("p", json!({"tag": "hardening-release", "rev": 1}))}});
    let runtime = reload::start(&config.to_string()).await;
    let pushed = ComponentPatch {
        metadata: json!({"tag": "hardening-release", "rev": 2})
            .as_object()
            .cloned()
            .unwrap(),
        ..ComponentPatch::default()
    };
    runtime
        .apply_component(key("probe/p"), pushed, None)
        .await
        .unwrap();
    assert_eq!(reload::probe(&runtime, "p").meta().rev, 2);
    runtime
        .release_component(key("probe/p"), None)
        .await
        .expect("a push can be released");
    assert_eq!(
        reload::probe(&runtime, "p").meta().rev,
        1,
        "the file's again"
    );
    for refused in [
        runtime.release_component(key("probe/p"), None).await,
        runtime.remove_component(key("probe/ghost"), None).await,
    ] {
        match refused {
            Err(ReloadError::Invalid(problems)) => assert!(
                problems.to_string().contains("probe/"),
                "names the component: {problems}"
            ),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }
    // The refused removal left nothing behind: the file may add it.
    let mut with_ghost = config.clone();
    with_ghost["components"]["probe"]["ghost"] =
        json!({"type": "test.reload.probe", "metadata": {"tag": "hardening-ghost"}});
    let record = runtime
        .apply(reload::candidate(&with_ghost.to_string()))
        .await
        .unwrap();
    assert_eq!(
        reload::action(&record, "probe/ghost"),
        rewire::Action::Added
    );
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_in_place_of_the_config_file_is_refused_and_a_good_write_then_applies() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rewire.json");
    let config = |rev: u64| {
        json!({"components": {"probe": probe("p", json!({"tag": "hardening-fifo", "rev": rev}))}})
            .to_string()
    };
    std::fs::write(&path, config(1)).unwrap();
    let runtime = reload::start(&config(1)).await;
    let _watch = runtime.watch_config_file(path.clone(), Duration::from_secs(1));
    std::fs::remove_file(&path).unwrap();
    let made = std::process::Command::new("mkfifo")
        .arg(&path)
        .status()
        .unwrap();
    assert!(made.success());
    let refused = eventually(Duration::from_secs(10), || {
        runtime.history().into_iter().find(|r| {
            r.trigger == Trigger::File
                && r.error
                    .as_deref()
                    .is_some_and(|e| e.contains("not a regular file"))
        })
    })
    .await;
    assert!(refused.is_some(), "{:#?}", runtime.history());
    std::fs::remove_file(&path).unwrap();
    std::fs::write(&path, config(2)).unwrap();
    let applied = eventually(Duration::from_secs(10), || {
        (reload::probe(&runtime, "p").meta().rev == 2).then_some(())
    })
    .await;
    assert!(applied.is_some(), "{:#?}", runtime.history());
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolled_back_file_reload_is_retried_until_its_backend_answers() {
    let mut redis = testkit::redis::RedisServer::start().await;
    let host = redis.addr();
    redis.stop();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rewire.json");
    let base = json!({"components": {"probe": probe("p", json!({"tag": "hardening-retry"}))}});
    std::fs::write(&path, base.to_string()).unwrap();
    let options = RuntimeOptions {
        timeouts: StartTimeouts {
            init: Duration::from_secs(2),
            ready: Duration::from_secs(2),
            ..StartTimeouts::default()
        },
        ..RuntimeOptions::default()
    };
    let runtime = reload::start_with(&base.to_string(), options).await;
    let _watch = runtime.watch_config_file(path.clone(), Duration::from_secs(30));
    let mut with_redis = base.clone();
    with_redis["components"]["state"] = json!({"orders": {"type": "redis",
        "metadata": {"redisHost": host, "dialTimeout": "200ms"}}});
    std::fs::write(&path, with_redis.to_string()).unwrap();
    let rolled_back = eventually(Duration::from_secs(20), || {
        runtime
            .history()
            .into_iter()
            .find(|r| r.trigger == Trigger::File && r.outcome == Outcome::RolledBack)
    })
    .await;
    assert!(rolled_back.is_some(), "{:#?}", runtime.history());
    let pending = eventually(Duration::from_secs(5), || runtime.pending_retry()).await;
    assert_eq!(pending.map(|p| p.trigger), Some(Trigger::File));
    // The server comes up; nobody touches the file again.
    redis.restart().await;
    let applied = eventually(Duration::from_secs(60), || {
        runtime
            .history()
            .into_iter()
            .find(|r| r.trigger == Trigger::File && r.outcome == Outcome::Applied)
    })
    .await;
    assert!(applied.is_some(), "{:#?}", runtime.history());
    assert!(runtime.state_store("orders").load().is_ok());
    assert_eq!(runtime.pending_retry(), None);
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn turning_watch_on_takes_effect_on_the_reload_that_does_it() {
    let config = |watch: bool| {
        json!({"components": {
            "config_store": {"cfg": {"type": "memory", "metadata": {"items": {"orders.ttl": "5"}}}},
            "state": {"orders": {"type": "memory",
                "configurationRef": [{"store": "cfg", "key": "orders.ttl", "injectAs": "defaultTtlInSeconds", "watch": watch}]}}
        }})
        .to_string()
    };
    let runtime = reload::start(&config(false)).await;
    // Only `watch` changes: no instance changes, no new generation.
    let flipped = runtime
        .apply(reload::candidate(&config(true)))
        .await
        .unwrap();
    assert_eq!(flipped.generation, 1);
    let store = runtime.config_store("cfg").load().unwrap();
    // The watch subscribes in the background: change the value until the
    // change is seen (each write is a real change).
    let seen = eventually(Duration::from_secs(10), || {
        let (writer, store) = (runtime.clone(), store.clone());
        tokio::spawn(async move {
            let ttl = 6 + writer.history().len();
            let item = ConfigItem {
                key: "orders.ttl".into(),
                value: ttl.to_string(),
                ..ConfigItem::default()
            };
            let _ = store.set(vec![item]).await;
        });
        runtime
            .history()
            .into_iter()
            .find(|r| r.trigger == Trigger::WatchedRef && r.outcome == Outcome::Applied)
    })
    .await;
    assert!(seen.is_some(), "{:#?}", runtime.history());
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relative_paths_in_metadata_are_the_configuration_files_neighbours() {
    // The process runs elsewhere (the package root): `c.json` and `s.json`
    // are found next to the configuration file, not in the working directory.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("c.json"), r#"{"greeting": "hello"}"#).unwrap();
    std::fs::write(dir.path().join("s.json"), r#"{"db": "pw-relative-1"}"#).unwrap();
    let path = dir.path().join("rewire.json");
    let config = |store_file: &str| {
        json!({"components": {
            "config_store": {"cfg": {"type": "file", "metadata": {"path": store_file}}},
            "secret_store": {"local": {"type": "local.file", "metadata": {"secretsFile": "s.json"}}}
        }})
        .to_string()
    };
    std::fs::write(&path, config("c.json")).unwrap();
    let registry = rewire::Registry::collected();
    let valid = rewire::ValidConfig::from_path(&path, &registry).unwrap();
    let runtime = rewire::Runtime::start(valid, registry, RuntimeOptions::default())
        .await
        .expect("relative paths resolve against the file's folder");
    let items = runtime
        .config_store("cfg")
        .load()
        .unwrap()
        .get(&ConfigQuery::keys(["greeting"]))
        .await
        .unwrap();
    assert_eq!(items[0].value, "hello");
    // A reload from the watched file resolves the same way, and a missing
    // file is named by its full path.
    let _watch = runtime.watch_config_file(path.clone(), Duration::from_secs(30));
    std::fs::write(&path, config("missing.json")).unwrap();
    let rolled_back = eventually(Duration::from_secs(10), || {
        runtime
            .history()
            .into_iter()
            .find(|r| r.trigger == Trigger::File && r.outcome == Outcome::RolledBack)
    })
    .await
    .unwrap_or_else(|| panic!("{:#?}", runtime.history()));
    let full = dir.path().join("missing.json");
    assert!(
        rolled_back
            .error
            .as_deref()
            .is_some_and(|e| e.contains(&full.display().to_string())),
        "{rolled_back:?}"
    );
    runtime.shutdown().await;
}

/// Short start timeouts: a readiness that never answers fails at once.
fn quick_ready() -> RuntimeOptions {
    RuntimeOptions {
        timeouts: StartTimeouts {
            ready: Duration::from_millis(300),
            ..StartTimeouts::default()
        },
        ..RuntimeOptions::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_readiness_that_never_answers_fails_the_reload_at_the_ready_deadline() {
    STALLED_READINESS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert("hardening-mute-ready".into());
    let base =
        json!({"components": {"probe": probe("steady", json!({"tag": "hardening-mr-steady"}))}});
    let runtime = reload::start_with(&base.to_string(), quick_ready()).await;
    let mut stalling = base.clone();
    stalling["components"]["config_store"] =
        json!({"mute": {"type": "test.stalling", "metadata": {"tag": "hardening-mute-ready"}}});
    // Were the readiness unbounded, this would never return.
    let answer = tokio::time::timeout(
        Duration::from_secs(20),
        runtime.apply(reload::candidate(&stalling.to_string())),
    )
    .await
    .expect("the reload is bounded by the readiness timeout");
    match answer {
        Err(ReloadError::RolledBack(failures)) => assert!(
            failures
                .iter()
                .any(|f| f.step == rewire::FailedStep::NotReady
                    && f.message.contains("readiness did not answer within")),
            "{failures:?}"
        ),
        other => panic!("expected a rollback, got {other:?}"),
    }
    // The next reload is not stuck behind it.
    let mut next = base.clone();
    next["components"]["probe"]["steady"]["metadata"]["rev"] = json!(1);
    let record = tokio::time::timeout(
        Duration::from_secs(20),
        runtime.apply(reload::candidate(&next.to_string())),
    )
    .await
    .expect("a later reload runs")
    .expect("and applies");
    assert_eq!(record.outcome, Outcome::Applied);
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_readiness_that_never_answers_fails_the_start_at_the_ready_deadline() {
    STALLED_READINESS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert("hardening-mute-start".into());
    let config = json!({"components": {"config_store":
        {"mute": {"type": "test.stalling", "metadata": {"tag": "hardening-mute-start"}}}}});
    let valid = rewire::config::validate(
        reload::candidate(&config.to_string()),
        &rewire::Registry::collected(),
    )
    .expect("valid");
    let started = tokio::time::timeout(
        Duration::from_secs(20),
        rewire::Runtime::start(valid, rewire::Registry::collected(), quick_ready()),
    )
    .await
    .expect("the start is bounded by the readiness timeout");
    let Err(rewire::StartError::Failed(failures)) = started else {
        panic!("the start should fail");
    };
    assert!(
        failures
            .iter()
            .any(|f| f.message.contains("readiness did not answer within")),
        "{failures:?}"
    );
}
