//! Building components the way the runtime does: through the registry.

use std::time::Duration;

use rewire_runtime::{
    Buildable, ComponentKey, Handover, InitContext, Instance, Metadata, Registry,
};
use serde_json::Value;

/// An init context for `kind/test-N` with `metadata`: each one names
/// another component (tests run side by side in one process, and some
/// components share state between live instances of one component).
pub fn context(kind: &str, metadata: &Metadata) -> InitContext {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    named_context(kind, &format!("test-{n}"), metadata)
}

/// An init context for `kind/name` with `metadata`, of a runtime of its
/// own (a handover area no other context shares).
pub fn named_context(kind: &str, name: &str, metadata: &Metadata) -> InitContext {
    let mut cx = InitContext::new(ComponentKey::new(kind, name), "test", metadata.clone());
    cx.ready_timeout = Duration::from_secs(5);
    cx
}

/// `value` (a JSON object) as metadata.
pub fn metadata(value: Value) -> Metadata {
    Metadata::from(value.as_object().cloned().unwrap_or_default())
}

/// The uninitialised component of `kind`/`type_name` built from `value`.
pub fn build(kind: &str, type_name: &str, value: Value) -> Result<Box<dyn Buildable>, String> {
    rewire_components::link();
    let registry = Registry::collected();
    let descriptor = registry
        .get(kind, type_name)
        .ok_or_else(|| format!("{kind}/{type_name} is not registered"))?;
    (descriptor.build)(&metadata(value)).map_err(|e| e.to_string())
}

/// The initialised instance of `kind`/`type_name` with metadata `value`.
pub async fn start(kind: &str, type_name: &str, value: Value) -> Result<Instance, String> {
    let cx = context(kind, &metadata(value.clone()));
    start_as(cx, type_name, value).await
}

/// The initialised instance of component `kind/name`, of `type_name`,
/// with metadata `value`, in a runtime of its own.
pub async fn start_named(
    kind: &str,
    name: &str,
    type_name: &str,
    value: Value,
) -> Result<Instance, String> {
    let cx = named_context(kind, name, &metadata(value.clone()));
    start_as(cx, type_name, value).await
}

/// As [`start_named`], in the runtime whose handover area is `runtime`:
/// the same area again stands for a rebuild in that runtime (the new
/// instance built while the old one still serves, as a reload does),
/// another area for another runtime of the same app in the process.
pub async fn start_in(
    runtime: &Handover,
    kind: &str,
    name: &str,
    type_name: &str,
    value: Value,
) -> Result<Instance, String> {
    let mut cx = named_context(kind, name, &metadata(value.clone()));
    cx.handover = runtime.clone();
    start_as(cx, type_name, value).await
}

async fn start_as(cx: InitContext, type_name: &str, value: Value) -> Result<Instance, String> {
    let kind = cx.key.kind.to_string();
    let mut built = build(&kind, type_name, value)?;
    built.init(&cx).await.map_err(|e| e.to_string())?;
    Ok(built.into_instance())
}
