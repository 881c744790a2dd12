//! Changing a component's `type` always rebuilds it with the new type, even
//! when the old instance would take its metadata in place.

use crate::support::reload as reload_support;

use reload_support::{actions, applied, apply_ok, closes, instance, key, start, wait_until, Probe};
use rewire::prelude::*;
use rewire::{Action, HandleError, Outcome};
use serde::Deserialize;

#[derive(Deserialize)]
struct AltMeta {
    tag: String,
}

/// Another implementation of the `probe` kind.
#[derive(rewire::Component)]
#[component(kind = "probe", type = "test.change_type.alt")]
struct Alt {
    #[metadata]
    meta: AltMeta,
}

#[async_trait]
impl Component for Alt {}

const BEFORE: &str = r#"{"appId": "change-type", "components": {"probe": {
    "x": {"type": "test.reload.probe", "metadata": {"tag": "ct-x", "inPlace": true}},
    "user": {"type": "test.reload.probe", "metadata": {"tag": "ct-user"},
             "componentRef": [{"type": "probe", "name": "x"}]}
}}}"#;

const AFTER: &str = r#"{"appId": "change-type", "components": {"probe": {
    "x": {"type": "test.change_type.alt", "metadata": {"tag": "ct-x-alt"}},
    "user": {"type": "test.reload.probe", "metadata": {"tag": "ct-user"},
             "componentRef": [{"type": "probe", "name": "x"}]}
}}}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn type_change_rebuilds_with_the_new_type() {
    let runtime = start(BEFORE).await;
    let user = instance(&runtime, "probe/user");
    let handle = runtime.component(key("probe/x"));
    assert!(handle.load_as::<Probe>().is_ok());

    let record = apply_ok(&runtime, AFTER).await;

    assert_eq!(record.generation, 2);
    assert_eq!(
        actions(&record),
        [
            ("probe/user".to_string(), Action::Unchanged),
            ("probe/x".to_string(), Action::Rebuilt),
        ]
    );
    // The same handle now gives the new type.
    let alt = handle
        .load_as::<Alt>()
        .expect("probe/x is not the new type");
    assert_eq!(alt.meta.tag, "ct-x-alt");
    assert!(matches!(
        handle.load_as::<Probe>(),
        Err(HandleError::WrongType(..))
    ));
    assert_eq!(
        applied("ct-x"),
        0,
        "a type change must not go through update_in_place"
    );
    let running = runtime.config();
    let spec = running
        .config
        .components
        .get(&key("probe/x"))
        .expect("probe/x not in config");
    assert_eq!(spec.type_name, "test.change_type.alt");

    // The dependent keeps its instance and its handle reaches the new type.
    assert!(instance(&runtime, "probe/user").same_as(&user));
    let user_probe = runtime
        .component(key("probe/user"))
        .load_as::<Probe>()
        .unwrap();
    let upstream = user_probe.upstream().cloned().expect("no upstream");
    assert!(upstream.load_as::<Alt>().is_ok());

    wait_until("the old probe/x is closed", || closes("ct-x") == 1).await;
    assert_eq!(closes("ct-user"), 0);

    assert_eq!(runtime.history().len(), 1);
    assert_eq!(runtime.history()[0].outcome, Outcome::Applied);
    runtime.shutdown().await;
}
