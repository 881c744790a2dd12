//! `borrow()`: a component reached through its handle without taking a
//! reference count. It follows reloads as `load()` does (each key's slot is
//! republished at every commit), and a borrow held across a reload keeps
//! the instance it was taken from.

use crate::support::reload as reload_support;

use reload_support::{apply_ok, start};
use rewire::{GetRequest, HandleError, SetRequest};

const WITH: &str =
    r#"{"components": {"state": {"a": {"type": "memory"}, "b": {"type": "memory"}}}}"#;
const WITHOUT_A: &str = r#"{"components": {"state": {"b": {"type": "memory"}}}}"#;

fn set(key: &str, value: &str) -> SetRequest {
    SetRequest {
        key: key.into(),
        value: value.as_bytes().to_vec(),
        ..SetRequest::default()
    }
}

fn get(key: &str) -> GetRequest {
    GetRequest {
        key: key.into(),
        ..GetRequest::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_borrow_follows_reloads_and_one_held_keeps_its_instance() {
    let runtime = start(WITH).await;
    let a = runtime.state_store("a");
    a.borrow().unwrap().set(set("k", "v1")).await.unwrap();
    let read = a.borrow().unwrap().get(get("k")).await.unwrap();
    assert_eq!(read.map(|e| e.data), Some(b"v1".to_vec()));

    // Held across the removal of `a`: still the instance it was taken from.
    let held = a.borrow().unwrap();
    apply_ok(&runtime, WITHOUT_A).await;
    assert!(matches!(a.borrow().err(), Some(HandleError::NotRunning(_))));
    assert!(matches!(a.load().err(), Some(HandleError::NotRunning(_))));
    let still = held.get(get("k")).await.unwrap();
    assert_eq!(still.map(|e| e.data), Some(b"v1".to_vec()));
    drop(held);

    // Declared again: a new instance, reached by the same handle.
    apply_ok(&runtime, WITH).await;
    let fresh = a.borrow().unwrap().get(get("k")).await.unwrap();
    assert_eq!(fresh, None, "a new memory store starts empty");
    // A handle made after the reloads sees the same instance.
    let later = runtime.state_store("a");
    later.borrow().unwrap().set(set("k", "v2")).await.unwrap();
    let read = a.borrow().unwrap().get(get("k")).await.unwrap();
    assert_eq!(read.map(|e| e.data), Some(b"v2".to_vec()));
    runtime.shutdown().await;
}
