//! Applying the running configuration again (even written differently)
//! changes nothing: outcome `NoChange`, same generation, every instance
//! kept and not even asked to apply anything.

use crate::support::reload as reload_support;

use std::sync::Arc;
use std::time::Duration;

use reload_support::{applied, candidate, closes, inits, instance, start};
use rewire::{Action, Outcome};

const CONFIG: &str = r#"{"appId": "no-change", "components": {
    "config_store": {"cfg": {"type": "memory", "metadata": {"items": {"host": "db", "port": "5432"}}}},
    "state": {"cache": {"type": "memory", "metadata": {"defaultTtlInSeconds": 60}}},
    "probe": {
        "reader": {"type": "test.reload.probe", "metadata": {"tag": "nc-reader", "inPlace": true},
                   "componentRef": [{"type": "state", "name": "cache"}],
                   "configurationRef": [{"store": "cfg", "key": "host", "injectAs": "value"}]},
        "user": {"type": "test.reload.probe", "metadata": {"tag": "nc-user", "inPlace": true, "rev": 3},
                 "componentRef": [{"type": "probe", "name": "reader"}]}
    }
}}"#;

/// The same configuration, with kinds, components and metadata fields in
/// another order.
const REORDERED: &str = r#"{
    "components": {
        "probe": {
            "user": {"componentRef": [{"type": "probe", "name": "reader"}],
                     "metadata": {"rev": 3, "inPlace": true, "tag": "nc-user"}, "type": "test.reload.probe"},
            "reader": {"configurationRef": [{"store": "cfg", "key": "host", "injectAs": "value"}],
                       "componentRef": [{"type": "state", "name": "cache"}],
                       "type": "test.reload.probe", "metadata": {"inPlace": true, "tag": "nc-reader"}}
        },
        "state": {"cache": {"metadata": {"defaultTtlInSeconds": 60}, "type": "memory"}},
        "config_store": {"cfg": {"type": "memory", "metadata": {"items": {"port": "5432", "host": "db"}}}}
    },
    "appId": "no-change"
}"#;

const KEYS: [&str; 4] = [
    "config_store/cfg",
    "probe/reader",
    "probe/user",
    "state/cache",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_configuration_is_no_change() {
    let runtime = start(CONFIG).await;
    let before = runtime.generation();
    let instances: Vec<_> = KEYS.iter().map(|k| instance(&runtime, k)).collect();

    for (i, text) in [CONFIG, REORDERED].into_iter().enumerate() {
        let record = runtime.apply(candidate(text)).await.expect("reload failed");
        assert_eq!(record.outcome, Outcome::NoChange, "{record:?}");
        assert_eq!(record.generation, 1);
        assert_eq!(record.error, None);
        let expected: Vec<(String, Action)> = KEYS
            .iter()
            .map(|k| (k.to_string(), Action::Unchanged))
            .collect();
        assert_eq!(reload_support::actions(&record), expected);
        assert_eq!(runtime.history().len(), i + 1);
        assert_eq!(runtime.history()[i], record);
    }

    // Nothing was published: the very same generation, the same instances.
    let after = runtime.generation();
    assert_eq!(after.number, 1);
    assert!(Arc::ptr_eq(&before, &after), "a generation was published");
    for (key, old) in KEYS.iter().zip(&instances) {
        assert!(instance(&runtime, key).same_as(old), "{key} was replaced");
    }
    assert_eq!((inits("nc-reader"), inits("nc-user")), (1, 1));
    assert_eq!(
        (applied("nc-reader"), applied("nc-user")),
        (0, 0),
        "update_in_place was called"
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!((closes("nc-reader"), closes("nc-user")), (0, 0));
    runtime.shutdown().await;
}
