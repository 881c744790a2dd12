//! Adding components by reload: the new ones are built against the running
//! ones and serve at once; everything already running keeps its very
//! instance (and its data).

use crate::support::reload as reload_support;

use reload_support::{action, actions, apply_ok, inits, instance, probe, start};
use rewire::{Action, GetRequest, Outcome, SetRequest, Trigger};

const BEFORE: &str = r#"{"appId": "add", "components": {
    "probe": {"a": {"type": "test.reload.probe", "metadata": {"tag": "add-a"}}},
    "state": {"cache": {"type": "memory"}}
}}"#;

const AFTER: &str = r#"{"appId": "add", "components": {
    "probe": {
        "a": {"type": "test.reload.probe", "metadata": {"tag": "add-a"}},
        "b": {"type": "test.reload.probe", "metadata": {"tag": "add-b"},
              "componentRef": [{"type": "probe", "name": "a"}]}
    },
    "state": {"cache": {"type": "memory"}, "extra": {"type": "memory"}}
}}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn added_components_serve_and_the_others_keep_their_instance() {
    let runtime = start(BEFORE).await;
    let a = instance(&runtime, "probe/a");
    let cache = instance(&runtime, "state/cache");
    let set = SetRequest {
        key: "k".into(),
        value: b"v".to_vec(),
        ..SetRequest::default()
    };
    runtime
        .state_store("cache")
        .load()
        .unwrap()
        .set(set)
        .await
        .unwrap();
    assert!(
        runtime.state_store("extra").load().is_err(),
        "not declared yet"
    );

    let record = apply_ok(&runtime, AFTER).await;

    assert_eq!(record.generation, 2);
    assert_eq!(record.trigger, Trigger::Programmatic);
    assert_eq!(
        actions(&record),
        [
            ("probe/a".to_string(), Action::Unchanged),
            ("probe/b".to_string(), Action::Added),
            ("state/cache".to_string(), Action::Unchanged),
            ("state/extra".to_string(), Action::Added),
        ]
    );
    assert_eq!(runtime.generation().number, 2);
    assert_eq!(runtime.generation().len(), 4);

    // The added ones serve, the probe with its reference injected.
    let b = probe(&runtime, "b");
    assert_eq!(b.meta().tag, "add-b");
    let upstream = b.upstream().expect("probe/b has no upstream");
    let a_seen_by_b = upstream.load_as::<reload_support::Probe>().unwrap();
    assert_eq!(a_seen_by_b.meta().tag, "add-a");
    let extra = runtime.state_store("extra").load().unwrap();
    let set = SetRequest {
        key: "x".into(),
        value: b"1".to_vec(),
        ..SetRequest::default()
    };
    extra.set(set).await.unwrap();

    // The others are the very same instances, with their data.
    assert!(
        instance(&runtime, "probe/a").same_as(&a),
        "probe/a was replaced"
    );
    assert!(
        instance(&runtime, "state/cache").same_as(&cache),
        "state/cache was replaced"
    );
    let get = GetRequest {
        key: "k".into(),
        ..GetRequest::default()
    };
    let kept = runtime.state_store("cache").load().unwrap().get(get).await;
    assert_eq!(kept.unwrap().map(|e| e.data), Some(b"v".to_vec()));
    assert_eq!(inits("add-a"), 1, "probe/a was initialised again");
    assert_eq!(inits("add-b"), 1);

    let history = runtime.history();
    assert_eq!(history.len(), 1);
    assert_eq!(history[0], record);
    assert_eq!(history[0].outcome, Outcome::Applied);
    assert_eq!(action(&history[0], "probe/b"), Action::Added);
    runtime.shutdown().await;
}
