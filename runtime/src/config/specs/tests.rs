use serde_json::json;

use super::*;
use crate::config::{parse, ConfigDiff};

fn specs(text: serde_json::Value) -> ComponentSpecs {
    parse(text.to_string().as_bytes())
        .expect("valid document")
        .components
}

fn two(first: serde_json::Value, second: serde_json::Value) -> (Digest, Digest) {
    let doc = |component| json!({"components": {"state": {"a": component}}});
    (
        specs(doc(first)).digests()[0],
        specs(doc(second)).digests()[0],
    )
}

#[test]
fn equal_declarations_have_equal_digests_and_any_difference_shows() {
    let base = json!({
        "type": "redis",
        "metadata": {"host": "h", "n": 1, "nested": {"list": [1, "x", null, true]}},
        "componentRef": [{"type": "lock", "name": "l"}, {"type": "lock", "name": "m"}],
        "secretRef": [{"store": "s", "name": "n", "key": "k", "injectAs": "password"}],
        "scopes": ["state/b"]
    });
    let (a, b) = two(base.clone(), base.clone());
    assert_eq!(a, b, "one declaration parsed twice");
    let variants = [
        json!({"type": "memory"}),
        json!({"metadata": {"host": "h", "n": 1.0, "nested": {"list": [1, "x", null, true]}}}),
        json!({"metadata": {"host": "h", "n": 1, "nested": {"list": [1, "x", null, false]}}}),
        json!({"metadata": {"host": "h", "n": 1, "nested": {"list": ["x", 1, null, true]}}}),
        json!({"metadata": {"host": "h", "n": 1}}),
        json!({"componentRef": [{"type": "lock", "name": "m"}, {"type": "lock", "name": "l"}]}),
        json!({"secretRef": [{"store": "s", "name": "n", "key": "k", "injectAs": "password", "watch": true}]}),
        json!({"scopes": ["state/c"]}),
        json!({"scopes": null}),
    ];
    for variant in variants {
        let mut changed = base.clone();
        for (field, value) in variant.as_object().expect("object") {
            if value.is_null() {
                changed.as_object_mut().expect("object").remove(field);
            } else {
                changed[field] = value.clone();
            }
        }
        let (a, b) = two(base.clone(), changed.clone());
        assert_ne!(a, b, "not seen: {changed}");
    }
}

#[test]
fn a_write_through_the_map_drops_the_digests() {
    let doc = json!({"components": {"state": {"a": {"type": "memory"}, "b": {"type": "memory"}}}});
    let running = parse(doc.to_string().as_bytes()).expect("valid");
    let mut candidate = running.clone();
    assert_eq!(running.components.digests(), candidate.components.digests());
    let key = ComponentKey::new(crate::Kind::State, "b");
    let shared = candidate.components.get_mut(&key).expect("declared");
    Arc::make_mut(shared).metadata.insert("x".into(), json!(1));
    assert!(
        running.components[&key].metadata.is_empty(),
        "a write copies the shared declaration, it does not change the other copy's"
    );
    assert_ne!(
        running.components.digests()[1],
        candidate.components.digests()[1]
    );
    let diff = ConfigDiff::between(&running, &candidate);
    assert_eq!(diff.changed.keys().collect::<Vec<_>>(), [&key]);
}

#[test]
fn the_table_holds_every_declaration_in_key_order_and_lets_go_on_a_write() {
    let doc = json!({"components": {"state": {"b": {}, "a": {}}, "lock": {"c": {}}}});
    let mut config = parse(doc.to_string().as_bytes()).expect("valid");
    let keys: Vec<String> = config
        .components
        .in_key_order()
        .iter()
        .map(|spec| spec.key.to_string())
        .collect();
    let in_map: Vec<String> = config.components.keys().map(ToString::to_string).collect();
    assert_eq!(keys, in_map);
    let key = ComponentKey::new(crate::Kind::State, "a");
    assert!(Arc::ptr_eq(
        &config.components.in_key_order()[1],
        &config.components[&key]
    ));
    // Its share of the declaration goes with the write: an unshared
    // declaration is changed in place, not copied.
    let before = Arc::as_ptr(&config.components[&key]);
    let declared = config.components.get_mut(&key).expect("declared");
    Arc::make_mut(declared)
        .metadata
        .insert("x".into(), json!(1));
    assert_eq!(Arc::as_ptr(&config.components[&key]), before);
    assert!(config.components.in_key_order_if_made().is_none());
    assert_eq!(config.components.in_key_order()[1].metadata["x"], json!(1));
}

#[test]
fn items_out_of_order_or_repeated_are_digested_as_the_map_holds_them() {
    let spec = |name: &str, type_name: &str| {
        let key = ComponentKey::new(crate::Kind::State, name);
        let spec = ComponentSpec {
            key: key.clone(),
            type_name: type_name.into(),
            metadata: serde_json::Map::new(),
            component_refs: Vec::new(),
            secret_refs: Vec::new(),
            configuration_refs: Vec::new(),
            scopes: None,
        };
        (key, spec)
    };
    let in_order: ComponentSpecs = [spec("a", "memory"), spec("b", "redis")]
        .into_iter()
        .collect();
    let shuffled: ComponentSpecs = [spec("b", "memory"), spec("a", "memory"), spec("b", "redis")]
        .into_iter()
        .collect();
    assert_eq!(in_order, shuffled);
    // Shown as the map alone.
    assert_eq!(
        format!("{in_order:?}"),
        format!("{:?}", in_order.clone().into_map())
    );
    assert_eq!(in_order.digests(), shuffled.digests());
    assert_eq!(shuffled.digests().len(), 2);
}

#[test]
fn the_diff_finds_changes_added_and_removed_with_digests() {
    let old = parse(
        json!({"components": {"state": {
            "a": {"type": "memory"}, "b": {"type": "memory"}, "c": {"type": "memory"}
        }}})
        .to_string()
        .as_bytes(),
    )
    .expect("valid");
    // Same keys: only `b` differs.
    let mut same_keys = old.clone();
    let b = ComponentKey::new(crate::Kind::State, "b");
    Arc::make_mut(same_keys.components.get_mut(&b).expect("b")).type_name = "redis".into();
    let diff = ConfigDiff::between(&old, &same_keys);
    assert_eq!(diff.changed.keys().collect::<Vec<_>>(), [&b]);
    assert!(diff.changed[&b].type_changed);
    assert!(diff.added.is_empty() && diff.removed.is_empty() && diff.rewritten.is_empty());
    // Other keys: `a` gone, `d` new, `c` rescoped only (rewritten).
    let mut other_keys = old.clone();
    let (a, c, d) = (
        ComponentKey::new(crate::Kind::State, "a"),
        ComponentKey::new(crate::Kind::State, "c"),
        ComponentKey::new(crate::Kind::State, "d"),
    );
    other_keys.components.remove(&a);
    let mut new_d = Arc::clone(&other_keys.components[&c]);
    Arc::make_mut(&mut new_d).key = d.clone();
    other_keys.components.insert(d.clone(), new_d);
    Arc::make_mut(other_keys.components.get_mut(&c).expect("c")).scopes = Some(vec![b.clone()]);
    let diff = ConfigDiff::between(&old, &other_keys);
    assert_eq!(diff.removed, [a].into());
    assert_eq!(diff.added, [d].into());
    assert_eq!(diff.rewritten, [c].into());
    assert!(diff.changed.is_empty());
}
