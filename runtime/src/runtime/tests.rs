//! A start-up cancelled while its last level starts: every component
//! started is closed once, users before what they use, and the start says
//! it was cancelled.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use serde_json::{json, Map, Value};
use tokio::sync::Notify;

use super::*;
use crate::component::{Component, ComponentError, InitContext};
use crate::config::{parse, validate};
use crate::handle::{InjectedHandle, Instance};
use crate::metadata::{Metadata, MetadataError};
use crate::registry::{Buildable, ComponentDescriptor, Inject, InjectError};

/// The names of the `recorder`s closed, in the order they closed.
static CLOSED: Mutex<Vec<String>> = Mutex::new(Vec::new());
/// Told when a `recorder` that `hangs` is in its `init`.
static HANGING: Notify = Notify::const_new();

/// Records its `close` under its metadata's `name`; takes any
/// componentRef; when its metadata says `hangs`, its `init` never ends.
struct Recorder {
    name: String,
    hangs: bool,
}

#[async_trait]
impl Component for Recorder {
    async fn init(&mut self, _cx: &InitContext) -> Result<(), ComponentError> {
        if self.hangs {
            HANGING.notify_one();
            std::future::pending::<()>().await;
        }
        Ok(())
    }

    async fn close(&self) -> Result<(), ComponentError> {
        CLOSED
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(self.name.clone());
        Ok(())
    }
}

impl Inject for Recorder {
    fn set_component(&mut self, _handle: InjectedHandle) -> Result<(), InjectError> {
        Ok(())
    }
}

impl Buildable for Recorder {
    fn into_instance(self: Box<Self>) -> Instance {
        Instance::Custom(Arc::new(*self))
    }
}

fn any_metadata(_: &Map<String, Value>, _: &[String]) -> Result<(), MetadataError> {
    Ok(())
}

fn build_recorder(metadata: &Metadata) -> Result<Box<dyn Buildable>, MetadataError> {
    let name = metadata.get("name").and_then(Value::as_str).unwrap_or("");
    Ok(Box::new(Recorder {
        name: name.to_string(),
        hangs: metadata.get("hangs") == Some(&Value::Bool(true)),
    }))
}

fn registry() -> Registry {
    let mut registry = Registry::default();
    registry.register(ComponentDescriptor {
        kind: "custom",
        type_name: "recorder",
        description: "",
        example_metadata: "{}",
        validate: any_metadata,
        build: build_recorder,
        check_refs: None,
        in_place: None,
    });
    registry
}

/// Each `(name, uses)` as a `custom` `recorder` with componentRefs to
/// what it uses; `hang` hangs in `init`.
fn declared(components: &[(&str, &[&str])]) -> ValidConfig {
    let custom: Map<String, Value> = components
        .iter()
        .map(|(name, uses)| {
            let refs: Vec<Value> = uses
                .iter()
                .map(|used| json!({"kind": "custom", "name": used}))
                .collect();
            let metadata = json!({"name": name, "hangs": *name == "hang"});
            let declared = json!({"type": "recorder", "metadata": metadata, "componentRef": refs});
            (name.to_string(), declared)
        })
        .collect();
    let text = json!({"components": {"custom": custom}}).to_string();
    let config = parse(text.as_bytes()).unwrap_or_else(|p| panic!("{p}"));
    validate(config, &registry()).unwrap_or_else(|p| panic!("{p}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_cancelled_in_its_last_level_closes_every_started_component_users_first() {
    // Levels: store; cache and queue; user; hang and sibling.
    let uses: [(&str, &[&str]); 6] = [
        ("store", &[]),
        ("cache", &["store"]),
        ("queue", &["store"]),
        ("user", &["cache", "queue"]),
        ("hang", &["user"]),
        ("sibling", &["user"]),
    ];
    let started = Runtime::start_until(
        declared(&uses),
        registry(),
        RuntimeOptions::default(),
        HANGING.notified(),
    )
    .await;

    assert!(
        matches!(started, Err(StartError::Cancelled)),
        "{:?}",
        started.err()
    );
    let closed = CLOSED.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let mut sorted = closed.clone();
    sorted.sort();
    assert_eq!(
        sorted,
        ["cache", "hang", "queue", "sibling", "store", "user"],
        "each closed once: {closed:?}"
    );
    let at = |name: &str| closed.iter().position(|c| c == name);
    for (user, used) in uses {
        for used in used {
            assert!(
                at(user) < at(used),
                "{user} closed after {used}: {closed:?}"
            );
        }
    }
}
