//! A reload in which a rebuilt component's init fails is rolled back whole:
//! the error names the component, the old generation keeps serving with its
//! very instances, everything built for the candidate is closed, an
//! in-place update left to the commit is never made (it is made last, once
//! everything else is ready), and one made early, because a component
//! rebuilt in the same reload uses it, is reverted.

use crate::support::reload as reload_support;

use reload_support::{
    action, applied, apply_ok, candidate, closes, inits, instance, key, probe, start,
};
use rewire::{Action, FailedStep, HandleError, Outcome, ReloadError};

/// `ip` takes changes in place; `base` and `bad` refuse them; `bad` uses
/// `base`; `extra` is only in the candidate.
fn config(rev: u32, fail: bool, extra: bool) -> String {
    let extra = if extra {
        r#", "extra": {"type": "test.reload.probe", "metadata": {"tag": "rbi-extra"}}"#
    } else {
        ""
    };
    format!(
        r#"{{"appId": "rollback-init", "components": {{"probe": {{
            "ip": {{"type": "test.reload.probe", "metadata": {{"tag": "rbi-ip", "inPlace": true, "rev": {rev}}}}},
            "base": {{"type": "test.reload.probe", "metadata": {{"tag": "rbi-base", "rev": {rev}}}}},
            "bad": {{"type": "test.reload.probe", "metadata": {{"tag": "rbi-bad", "rev": {rev}, "failInit": {fail}}},
                     "componentRef": [{{"type": "probe", "name": "base"}}]}}
            {extra}
        }}}}}}"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_init_rolls_back_everything() {
    let runtime = start(&config(1, false, false)).await;
    let ip = instance(&runtime, "probe/ip");
    let base = instance(&runtime, "probe/base");
    let bad = instance(&runtime, "probe/bad");
    let old_base = probe(&runtime, "base");

    let result = runtime.apply(candidate(&config(2, true, true))).await;

    let Err(ReloadError::RolledBack(failures)) = result else {
        panic!("the reload should roll back, got {result:?}");
    };
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert_eq!(failures[0].component, Some(key("probe/bad")));
    assert_eq!(failures[0].step, FailedStep::Init);
    assert_eq!(failures[0].message, "probe rbi-bad refused to start");

    // Recorded as rolled back, with what would have been done.
    let history = runtime.history();
    assert_eq!(history.len(), 1);
    let record = &history[0];
    assert_eq!(record.outcome, Outcome::RolledBack);
    assert_eq!(record.generation, 1);
    let error = record.error.clone().unwrap_or_default();
    assert!(
        error.contains("probe/bad: init failed: probe rbi-bad refused to start"),
        "{error}"
    );
    // Left to the commit, never made: recorded as kept.
    assert_eq!(action(record, "probe/ip"), Action::Unchanged);
    // Used by `bad`, rebuilt in the same reload: asked at its level (before
    // `bad`'s init), it refused and was rebuilt.
    assert_eq!(action(record, "probe/base"), Action::Rebuilt);
    assert_eq!(action(record, "probe/extra"), Action::Added);

    // Nothing changed for callers: same generation, same instances.
    assert_eq!(runtime.generation().number, 1);
    assert_eq!(runtime.generation().len(), 3);
    assert!(instance(&runtime, "probe/ip").same_as(&ip));
    assert!(instance(&runtime, "probe/base").same_as(&base));
    assert!(instance(&runtime, "probe/bad").same_as(&bad));
    assert_eq!(
        runtime.component(key("probe/extra")).load().err(),
        Some(HandleError::NotRunning(key("probe/extra")))
    );
    assert_eq!(probe(&runtime, "bad").meta().rev, 1);
    assert!(!probe(&runtime, "bad").is_closed());
    // probe/bad's dependency, as probe/bad sees it, is still the old one.
    let upstream = probe(&runtime, "bad")
        .upstream()
        .cloned()
        .expect("no upstream");
    let reached = upstream.load_as::<reload_support::Probe>().unwrap();
    assert_eq!(reached.meta().rev, 1);
    drop(reached);

    // What was built for the candidate was closed (not the old instances).
    assert_eq!(
        (inits("rbi-base"), inits("rbi-extra"), inits("rbi-bad")),
        (2, 1, 2)
    );
    assert_eq!(closes("rbi-extra"), 1, "the added probe was not closed");
    assert_eq!(closes("rbi-base"), 1, "the new probe/base was not closed");
    assert!(!old_base.is_closed(), "the old probe/base was closed");
    assert_eq!(closes("rbi-ip"), 0);

    // The in-place update was never made (the rebuild before it failed).
    assert_eq!(applied("rbi-ip"), 0, "made, then reverted");
    assert_eq!(
        probe(&runtime, "ip").meta().rev,
        1,
        "the in-place update was not reverted"
    );
    let running = runtime.config();
    let ip_spec = running
        .config
        .components
        .get(&key("probe/ip"))
        .expect("no probe/ip");
    assert_eq!(ip_spec.metadata.get("rev"), Some(&serde_json::json!(1)));

    // The runtime is not wedged: a good candidate applies.
    let record = apply_ok(&runtime, &config(2, false, true)).await;
    assert_eq!(record.generation, 2);
    assert_eq!(action(&record, "probe/bad"), Action::Rebuilt);
    assert_eq!(probe(&runtime, "ip").meta().rev, 2);
    runtime.shutdown().await;
}

/// The memory config store `s` with `items`, read by `reader`, which fails
/// to start when told.
fn store_config(items: &str, fail: bool) -> String {
    format!(
        r#"{{"appId": "rollback-init", "components": {{
            "config_store": {{"s": {{"type": "memory", "metadata": {{"items": {items}}}}}}},
            "probe": {{"reader": {{"type": "test.reload.probe", "metadata": {{"tag": "rbi-reader", "failInit": {fail}}},
                                  "configurationRef": [{{"store": "s", "key": "host", "injectAs": "value"}}]}}}}
        }}}}"#
    )
}

/// A rolled-back reload must leave no trace in a config store it updated in
/// place: a key the candidate added must be gone again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolled_back_config_store_update_leaves_no_trace() {
    let runtime = start(&store_config(r#"{"host": "a"}"#, false)).await;
    let s = instance(&runtime, "config_store/s");

    let result = runtime
        .apply(candidate(&store_config(
            r#"{"host": "b", "added": "x"}"#,
            true,
        )))
        .await;

    let Err(ReloadError::RolledBack(failures)) = result else {
        panic!("the reload should roll back, got {result:?}");
    };
    assert_eq!(failures[0].component, Some(key("probe/reader")));
    let record = reload_support::last_record(&runtime);
    assert_eq!(action(&record, "config_store/s"), Action::UpdatedInPlace);
    assert!(instance(&runtime, "config_store/s").same_as(&s));
    let store = runtime.config_store("s").load().unwrap();
    let items = store.get(&rewire::ConfigQuery::default()).await.unwrap();
    let values: Vec<(String, String)> = items.into_iter().map(|i| (i.key, i.value)).collect();
    assert_eq!(
        values,
        [("host".to_string(), "a".to_string())],
        "the rolled-back candidate's items are still served"
    );
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_init_rolls_back_naming_the_component() {
    let config = |rev: u32, panic: bool| {
        format!(
            r#"{{"appId": "rollback-panic", "components": {{"probe": {{
                "keep": {{"type": "test.reload.probe", "metadata": {{"tag": "rbp-keep"}}}},
                "bomb": {{"type": "test.reload.probe",
                          "metadata": {{"tag": "rbp-bomb", "rev": {rev}, "panicInit": {panic}}}}}
            }}}}}}"#
        )
    };
    let runtime = start(&config(1, false)).await;
    let bomb = instance(&runtime, "probe/bomb");

    let result = runtime.apply(candidate(&config(2, true))).await;

    let Err(ReloadError::RolledBack(failures)) = result else {
        panic!("the reload should roll back, got {result:?}");
    };
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert_eq!(failures[0].component, Some(key("probe/bomb")));
    assert_eq!(failures[0].step, FailedStep::Panicked);
    assert_eq!(failures[0].message, "probe rbp-bomb exploded");
    assert_eq!(runtime.generation().number, 1);
    assert!(instance(&runtime, "probe/bomb").same_as(&bomb));
    runtime.shutdown().await;
}

/// The cache's entries: `size` of them, evicted down to a smaller size.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(default)]
struct CacheMeta {
    size: usize,
}

/// How many in-place updates the cache took (reverts included).
static CACHE_UPDATES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// An in-memory cache updated in place the default way (it does not stage
/// its update): shrinking it evicts entries, which growing it back cannot
/// restore.
#[derive(rewire::Component)]
#[component(kind = "probe", type = "test.rollback_init.cache")]
struct Cache {
    #[metadata]
    meta: CacheMeta,
    entries: std::sync::Mutex<Vec<usize>>,
}

impl Cache {
    fn entries(&self) -> usize {
        self.entries.lock().unwrap().len()
    }
}

#[rewire::prelude::async_trait]
impl rewire::prelude::Component for Cache {
    async fn init(
        &mut self,
        _cx: &rewire::prelude::InitContext,
    ) -> Result<(), rewire::prelude::ComponentError> {
        *self.entries.lock().unwrap() = (0..self.meta.size).collect();
        Ok(())
    }

    fn as_in_place(&self) -> Option<&dyn rewire::prelude::InPlaceUpdate> {
        Some(self)
    }
}

#[rewire::prelude::async_trait]
impl rewire::prelude::InPlaceUpdate for Cache {
    async fn update_in_place(
        &self,
        metadata: &rewire::prelude::Metadata,
    ) -> Result<rewire::prelude::InPlace, rewire::prelude::ComponentError> {
        let new: CacheMeta = metadata
            .decode()
            .map_err(|e| rewire::prelude::ComponentError::new(e.to_string()))?;
        CACHE_UPDATES.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.entries.lock().unwrap().truncate(new.size);
        Ok(rewire::prelude::InPlace::Applied)
    }
}

#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct GateMeta {
    rev: u64,
    fail_init: bool,
}

/// Set by a failing gate's `init` once it started.
static GATE_STARTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
/// A failing gate's `init` fails once this is set.
static GATE_RELEASED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Uses the cache; its `init` fails, when told, once the test lets it.
#[derive(rewire::Component)]
#[component(kind = "probe", type = "test.rollback_init.gate")]
struct Gate {
    #[metadata]
    meta: GateMeta,
    #[inject]
    _cache: Option<rewire::prelude::ComponentHandle>,
}

#[rewire::prelude::async_trait]
impl rewire::prelude::Component for Gate {
    async fn init(
        &mut self,
        _cx: &rewire::prelude::InitContext,
    ) -> Result<(), rewire::prelude::ComponentError> {
        if !self.meta.fail_init {
            return Ok(());
        }
        GATE_STARTED.store(true, std::sync::atomic::Ordering::SeqCst);
        while !GATE_RELEASED.load(std::sync::atomic::Ordering::SeqCst) {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        Err(rewire::prelude::ComponentError::new(
            "gate refused to start",
        ))
    }
}

/// The cache `c` (level 0), the gate `u` using it (level 1, never
/// changed: it keeps its instance), and the gate `g` at `rev`, which does
/// not use it.
fn cache_config(size: usize, rev: u64, fail: bool) -> String {
    format!(
        r#"{{"appId": "rollback-cache", "components": {{"probe": {{
            "c": {{"type": "test.rollback_init.cache", "metadata": {{"size": {size}}}}},
            "u": {{"type": "test.rollback_init.gate", "metadata": {{"rev": 1}},
                   "componentRef": [{{"type": "probe", "name": "c"}}]}},
            "g": {{"type": "test.rollback_init.gate", "metadata": {{"rev": {rev}, "failInit": {fail}}}}}
        }}}}}}"#
    )
}

fn live_cache(runtime: &rewire::Runtime) -> std::sync::Arc<Cache> {
    runtime
        .component(key("probe/c"))
        .load_as::<Cache>()
        .expect("probe/c")
}

/// An in-place update that is not staged, of a component no component
/// rebuilt in the reload uses, is made last: while another component
/// rebuilt in the same reload is still starting, and after that start
/// fails, the running cache has never been shrunk (no entry evicted) and
/// the record does not claim it was updated; a reload that succeeds
/// shrinks it, on the same instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unstaged_in_place_update_is_never_made_by_a_reload_that_fails() {
    let runtime = start(&cache_config(100, 1, false)).await;
    let cache = instance(&runtime, "probe/c");
    assert_eq!(live_cache(&runtime).entries(), 100);

    let runtime = std::sync::Arc::new(runtime);
    let reload = tokio::spawn({
        let runtime = runtime.clone();
        async move { runtime.apply(candidate(&cache_config(10, 2, true))).await }
    });
    reload_support::wait_until("the gate's init started", || {
        GATE_STARTED.load(std::sync::atomic::Ordering::SeqCst)
    })
    .await;
    // The reload is under way, blocked in the gate's init.
    for _ in 0..10 {
        assert_eq!(live_cache(&runtime).entries(), 100, "shrunk before commit");
        assert_eq!(CACHE_UPDATES.load(std::sync::atomic::Ordering::SeqCst), 0);
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    GATE_RELEASED.store(true, std::sync::atomic::Ordering::SeqCst);
    let result = reload.await.expect("the reload task");

    let Err(ReloadError::RolledBack(failures)) = result else {
        panic!("the reload should roll back, got {result:?}");
    };
    assert_eq!(failures[0].component, Some(key("probe/g")), "{failures:?}");
    assert_eq!(failures[0].step, FailedStep::Init);
    let record = reload_support::last_record(&runtime);
    assert_eq!(action(&record, "probe/c"), Action::Unchanged);
    assert!(instance(&runtime, "probe/c").same_as(&cache));
    assert_eq!(live_cache(&runtime).entries(), 100, "entries were evicted");
    assert_eq!(
        CACHE_UPDATES.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "update_in_place was called (made, then reverted)"
    );

    // A reload that succeeds makes it, in place.
    let record = apply_ok(&runtime, &cache_config(10, 2, false)).await;
    assert_eq!(action(&record, "probe/c"), Action::UpdatedInPlace);
    assert_eq!(action(&record, "probe/g"), Action::Rebuilt);
    assert_eq!(action(&record, "probe/u"), Action::Unchanged);
    assert!(instance(&runtime, "probe/c").same_as(&cache));
    assert_eq!(live_cache(&runtime).entries(), 10);
    assert_eq!(CACHE_UPDATES.load(std::sync::atomic::Ordering::SeqCst), 1);
    match std::sync::Arc::try_unwrap(runtime) {
        Ok(runtime) => assert_eq!(runtime.shutdown().await, 0, "a close was abandoned"),
        Err(_) => panic!("the runtime is still shared"),
    }
}
