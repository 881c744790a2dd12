//! The hot path: loads and borrows through slots
//! follow every publish, never mix generations, and never keep a replaced
//! instance alive.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

use async_trait::async_trait;

use super::{ComponentHandle, Generation, Instance, Live, LiveGeneration};
use crate::component::{Component, ComponentKey};
use crate::kinds::{DeleteRequest, GetRequest, SetRequest, StateEntry, StateError, StateStore};

/// A component (a state store, for typed handles) that knows the
/// generation it was built for.
pub(super) struct Stamped(pub(super) u64);

#[async_trait]
impl Component for Stamped {}

#[async_trait]
impl StateStore for Stamped {
    async fn get(&self, _: GetRequest) -> Result<Option<StateEntry>, StateError> {
        Ok(None)
    }
    async fn set(&self, _: SetRequest) -> Result<(), StateError> {
        Ok(())
    }
    async fn delete(&self, _: DeleteRequest) -> Result<(), StateError> {
        Ok(())
    }
}

fn key(name: &str) -> ComponentKey {
    ComponentKey::new("custom", name)
}

/// Generation `number` with a fresh `Stamped(number)` for each of `names`.
fn publish(live: &LiveGeneration, number: u64, names: &[&str]) -> Vec<Instance> {
    let instances: BTreeMap<ComponentKey, Instance> = names
        .iter()
        .map(|name| (key(name), Instance::Custom(Arc::new(Stamped(number)))))
        .collect();
    let kept = instances.values().cloned().collect();
    live.publish(Generation::new(number, instances));
    kept
}

fn stamp(handle: &ComponentHandle) -> u64 {
    let loaded = handle.load_as::<Stamped>();
    loaded.map(|s| s.0).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn a_repeated_load_follows_every_publish_and_a_removal() {
    let live = Live::new();
    publish(&live, 1, &["a"]);
    let a = ComponentHandle::new(key("a"), live.clone());
    assert_eq!((stamp(&a), stamp(&a)), (1, 1));
    publish(&live, 2, &["a"]);
    assert_eq!(stamp(&a), 2);
    publish(&live, 3, &[]);
    assert!(a.load().is_err(), "removed: not running");
    publish(&live, 4, &["a"]);
    assert_eq!(stamp(&a), 4);
}

#[test]
fn a_handle_does_not_keep_a_replaced_instance_alive() {
    let live = Live::new();
    let mut first = publish(&live, 1, &["a"]);
    let a = ComponentHandle::new(key("a"), live.clone());
    let weak: Weak<dyn Component> = Arc::downgrade(&a.load().unwrap_or_else(|e| panic!("{e}")));
    assert!(weak.upgrade().is_some());
    publish(&live, 2, &["a"]);
    first.clear();
    assert!(
        weak.upgrade().is_none(),
        "only the handle loaded it, and nothing of the handle holds it"
    );
    assert_eq!(stamp(&a), 2);
}

#[test]
fn loads_on_other_threads_never_see_an_older_generation_after_a_newer_one() {
    let live = Live::new();
    let names = ["a", "b", "c", "d"];
    publish(&live, 1, &names);
    let handles: Vec<ComponentHandle> = names
        .iter()
        .map(|name| ComponentHandle::new(key(name), live.clone()))
        .collect();
    readers_never_go_back(&handles, stamp, |number| {
        publish(&live, number, &names);
    });
}

/// While this thread publishes generations 2 to 300 (`publish`), two
/// threads read every handle's generation (`stamp`) over and over: none
/// ever sees an older generation after a newer one, and afterwards every
/// handle, on this thread, sees the last.
pub(super) fn readers_never_go_back<H: Sync>(
    handles: &[H],
    stamp: impl Fn(&H) -> u64 + Sync,
    mut publish: impl FnMut(u64),
) {
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let readers: Vec<_> = (0..2)
            .map(|_| {
                scope.spawn(|| {
                    let mut newest = 0;
                    let mut loads = 0u64;
                    while !stop.load(Ordering::Relaxed) || loads == 0 {
                        for handle in handles {
                            let seen = stamp(handle);
                            assert!(seen >= newest, "saw {seen} after {newest}");
                            newest = seen;
                            loads += 1;
                        }
                    }
                    newest
                })
            })
            .collect();
        for number in 2..=300 {
            publish(number);
        }
        stop.store(true, Ordering::Relaxed);
        for reader in readers {
            let newest = reader.join().unwrap_or_else(|_| panic!("a reader failed"));
            assert!(newest >= 1);
        }
    });
    for handle in handles {
        assert_eq!(stamp(handle), 300);
    }
}

#[test]
fn borrow_follows_publishes_without_a_reference_count() {
    let live = Live::new();
    let first = publish(&live, 1, &["a"]);
    let a = ComponentHandle::new(key("a"), live.clone());
    // The first load takes the key's slot, which holds the instance.
    let untouched = first[0].holders();
    assert_eq!(stamp(&a), 1);
    let before = first[0].holders();
    assert_eq!(before, untouched + 1, "the slot is taken on the first load");
    let borrowed = a.0.borrow().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(first[0].holders(), before, "a borrow takes no count");
    drop(borrowed);
    publish(&live, 2, &["a"]);
    assert_eq!(stamp(&a), 2);
}

/// The handles validation offers to setters: the variant of the key's kind,
/// every load failing, and one shared runtime behind all of them.
#[test]
fn unstarted_handles_fit_their_kind_load_nothing_and_share_one_runtime() {
    use super::{HandleError, InjectedHandle};
    let state = ComponentKey::new(crate::component::Kind::State, "orders");
    let InjectedHandle::State(orders) = InjectedHandle::unstarted(state.clone()) else {
        panic!("a state key gives a state handle");
    };
    assert!(matches!(orders.load(), Err(HandleError::NotRunning(k)) if k == state));
    let InjectedHandle::Custom(greeter) = InjectedHandle::unstarted(key("greeter")) else {
        panic!("a custom key gives a component handle");
    };
    assert_eq!(greeter.key(), Some(&key("greeter")));
    assert!(greeter.load().is_err());
    let live = |target: &super::Target| target.bound.as_ref().map(|b| b.live.clone());
    let (a, b) = (live(&orders.0), live(&greeter.0));
    assert!(matches!((a, b), (Some(a), Some(b)) if Arc::ptr_eq(&a, &b)));
}

/// Two runtimes in one process: while one prepares a generation, another
/// runtime's handle to the same key goes on resolving in its own runtime
/// (not in the generation staged for the first, unpublished and maybe
/// rolled back), and the first's handles resolve in what it stages.
#[tokio::test]
async fn a_generation_staged_for_one_runtime_is_not_seen_by_anothers_handles() {
    let (a, b) = (Live::new(), Live::new());
    publish(&a, 1, &["k"]);
    publish(&b, 7, &["k"]);
    let (in_a, in_b) = (
        ComponentHandle::new(key("k"), a.clone()),
        ComponentHandle::new(key("k"), b.clone()),
    );
    let staged_for_a = Generation::new(
        2,
        BTreeMap::from([(key("k"), Instance::Custom(Arc::new(Stamped(2))))]),
    );
    let seen = super::with_staged(a.clone(), Arc::new(staged_for_a), async {
        (stamp(&in_a), stamp(&in_b))
    })
    .await;
    assert_eq!(seen, (2, 7), "(runtime A's handle, runtime B's handle)");
    assert_eq!((stamp(&in_a), stamp(&in_b)), (1, 7), "outside the scope");
}
