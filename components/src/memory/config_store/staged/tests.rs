//! The staged view: no copy of the store, few items looked at, and the
//! same answer as reseeding a copy gave.

use std::collections::HashMap;

use rewire_runtime::{
    Action, ComponentKey, ConfigItem, ConfigQuery, Registry, Runtime, RuntimeOptions,
};
use serde_json::json;

use super::super::selection::{CLONED, VISITED};
use super::super::MemoryConfigStore;
use super::*;

/// The staged read before: a copy of the whole table, reseeded with
/// `staged`, then covered. The oracle [`ConfigTable::covered_as_seeded`]
/// must agree with.
fn covered_by_copy(
    table: &ConfigTable,
    query: &ConfigQuery,
    staged: &InitialItems,
) -> Vec<ConfigItem> {
    let mut view = table.clone();
    view.reseed(staged);
    view.covered(query)
        .into_iter()
        .map(|(id, stored)| to_item(id, stored))
        .collect()
}

/// Items looked at and copies of a table made while `work` runs.
async fn visits_and_copies_during<F: std::future::Future>(work: F) -> (F::Output, usize, usize) {
    VISITED.with(|count| count.set(0));
    CLONED.with(|count| count.set(0));
    let output = work.await;
    let visits = VISITED.with(std::cell::Cell::get);
    (output, visits, CLONED.with(std::cell::Cell::get))
}

fn seed(pairs: &[(&str, &str)]) -> InitialItems {
    InitialItems(
        pairs
            .iter()
            .map(|(key, value)| (key.to_string(), value.to_string()))
            .collect(),
    )
}

fn query(keys: &[&str], group: Option<&str>, label: Option<&str>) -> ConfigQuery {
    ConfigQuery {
        keys: keys.iter().map(|k| k.to_string()).collect(),
        group: group.map(Into::into),
        label: label.map(Into::into),
        ..ConfigQuery::default()
    }
}

fn app(components: serde_json::Value) -> rewire_runtime::config::Config {
    let text = json!({"appId": "app", "components": {"config_store": components}});
    rewire_runtime::config::parse(text.to_string().as_bytes()).unwrap_or_else(|p| panic!("{p}"))
}

/// A reload stages a change of the `items` of a store of 50,000 items
/// and builds a store whose `maxKeys` comes from the staged `key-7`
/// (a configurationRef, read in the preparing scope): the read copies
/// nothing and looks at a few items, and sees the staged value. Before,
/// it copied the whole table under its lock.
#[tokio::test]
async fn a_staged_read_of_one_key_copies_nothing_and_looks_at_few_items() {
    let settings = json!({"type": "memory", "metadata": {"items": {"seeded": "1"}}});
    let valid = rewire_runtime::config::validate(
        app(json!({"settings": settings})),
        &Registry::collected(),
    )
    .unwrap_or_else(|p| panic!("{p}"));
    let runtime = Runtime::start(valid, Registry::collected(), RuntimeOptions::default())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let store = runtime.config_store("settings").load();
    let store = store.unwrap_or_else(|e| panic!("settings: {e}"));
    let items: Vec<ConfigItem> = (0..50_000)
        .map(|n| ConfigItem {
            key: format!("key-{n}"),
            value: "100".into(),
            ..ConfigItem::default()
        })
        .collect();
    store.set(items).await.unwrap_or_else(|e| panic!("{e}"));

    let staged_settings =
        json!({"type": "memory", "metadata": {"items": {"seeded": "1", "key-7": "777"}}});
    let limits = json!({"type": "memory",
        "configurationRef": [{"store": "settings", "key": "key-7", "injectAs": "maxKeys"}]});
    let reload = runtime.apply(app(json!({"settings": staged_settings, "limits": limits})));
    let (record, visits, copies) = visits_and_copies_during(reload).await;
    let record = record.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        record.actions.get("config_store/settings"),
        Some(&Action::UpdatedInPlace),
        "{record:?}"
    );
    assert_eq!(
        record.actions.get("config_store/limits"),
        Some(&Action::Added)
    );
    let limits = runtime
        .component(ComponentKey::new("config_store", "limits"))
        .load_as::<MemoryConfigStore>()
        .unwrap_or_else(|e| panic!("limits: {e}"));
    assert_eq!(
        limits.settings.load().max_keys,
        777,
        "the ref read the staged value"
    );
    assert_eq!(copies, 0, "a staged read copied the store");
    assert!(visits <= 10, "{visits} items looked at of 50,001");
    runtime.shutdown().await;
}

/// A table seeded with `a`..`d`, `gone` and `""`, then changed through
/// the API: `b` and `c` set (`c` to its seeded value, with metadata),
/// `gone` deleted, `x` added, and `a` in group `g` and label `prod`.
fn seeded_then_changed() -> ConfigTable {
    let mut table = ConfigTable::default();
    let first = [
        ("a", "1"),
        ("b", "1"),
        ("c", "1"),
        ("d", "1"),
        ("gone", "1"),
        ("", "e"),
    ];
    table.reseed(&seed(&first));
    table.put(plain_id("b"), "runtime".into(), HashMap::new());
    let tagged = HashMap::from([("m".to_string(), "1".to_string())]);
    table.put(plain_id("c"), "1".into(), tagged);
    table.remove(&plain_id("gone"));
    table.put(plain_id("x"), "api".into(), HashMap::new());
    table.put(
        (Some("g".into()), None, "a".into()),
        "g".into(),
        HashMap::new(),
    );
    table.put(
        (None, Some("prod".into()), "a".into()),
        "prod".into(),
        HashMap::new(),
    );
    table
}

/// For seeds that change, add, drop or keep keys, and queries with and
/// without keys, of the default scope and of others, the staged view is
/// what reseeding a copy gave: same items, values, versions, order.
#[test]
fn the_staged_view_is_what_reseeding_a_copy_gave() {
    let table = seeded_then_changed();
    let seeds = [
        seed(&[("a", "2"), ("b", "1"), ("e", "5")]),
        seed(&[]),
        seed(&[
            ("a", "1"),
            ("b", "1"),
            ("c", "1"),
            ("d", "1"),
            ("gone", "1"),
            ("", "e"),
        ]),
        seed(&[("b", "2"), ("x", "seed"), ("c", "1"), ("gone", "back")]),
        seed(&[("0", "first"), ("zz", "last"), ("a", "1"), ("", "e2")]),
    ];
    let queries = [
        query(&[], None, None),
        query(&[], Some(""), Some("")),
        query(&["a"], None, None),
        query(&["c"], None, None),
        query(&["e"], None, None),
        query(&["d", "gone"], None, None),
        query(&["b", "e", "zz", "a", "a", "missing", "0"], None, None),
        query(&["", "x"], None, None),
        query(&[], Some("g"), None),
        query(&["a", "e"], Some("g"), None),
        query(&["a"], None, Some("prod")),
        query(&["a"], Some("g"), Some("prod")),
    ];
    let mut differed = 0;
    for staged in &seeds {
        for asked in &queries {
            let expected = covered_by_copy(&table, asked, staged);
            let computed = table.covered_as_seeded(asked, staged);
            assert_eq!(computed, expected, "seed {staged:?}, query {asked:?}");
            let live: Vec<ConfigItem> = table
                .covered(asked)
                .into_iter()
                .map(|(id, stored)| to_item(id, stored))
                .collect();
            differed += usize::from(live != expected);
        }
    }
    assert!(
        differed >= 20,
        "only {differed} answers differ from the live ones"
    );
}

/// A get in the default scope without keys merges the staged new keys
/// in key order; the work is the scope's items and the seeded ones, and
/// no copy of the table.
#[test]
fn a_staged_read_without_keys_merges_the_new_keys_without_a_copy() {
    let table = seeded_then_changed();
    let staged = seed(&[("0", "first"), ("a", "2"), ("zz", "last")]);
    CLONED.with(|count| count.set(0));
    let got = table.covered_as_seeded(&query(&[], None, None), &staged);
    assert_eq!(CLONED.with(std::cell::Cell::get), 0);
    let pairs: Vec<(&str, &str)> = got
        .iter()
        .map(|item| (item.key.as_str(), item.value.as_str()))
        .collect();
    // b (set since) and x (set through the API) stay; "", c (its seeded
    // value, though tagged) and d are dropped with the seed.
    assert_eq!(
        pairs,
        vec![
            ("0", "first"),
            ("a", "2"),
            ("b", "runtime"),
            ("x", "api"),
            ("zz", "last")
        ]
    );
}
