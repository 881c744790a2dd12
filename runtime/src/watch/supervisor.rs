//! Keeps the watches of the running configuration in place: `watch: true`
//! configurationRefs (subscribed), `watch: true` secretRefs (polled, since
//! secret stores cannot notify), and the overlay keys. After every publish
//! the watches are rebuilt from the new configuration and compared with the
//! values the components were started with, so no change is missed in
//! between.

use std::collections::{BTreeSet, HashMap};
use std::sync::Weak;

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::overlay::{overlay_keys, read_overlay};
use super::queue::Queued;
use crate::config::{ConfigurationRef, OverlaySpec, SecretRef};
use crate::handle::{ConfigStoreHandle, SecretStoreHandle};
use crate::key::{ComponentKey, CONFIG_STORE, SECRET_STORE};
use crate::kinds::ConfigQuery;
use crate::reload::{LayerChange, Trigger};
use crate::runtime::{Inner, Runtime};

/// Starts the supervisor; it ends at shutdown or when the runtime is dropped.
pub(crate) fn spawn_supervisor(inner: Weak<Inner>) {
    tokio::spawn(async move {
        let Some((mut published, stopped)) = inner
            .upgrade()
            .map(|i| (i.live.changes(), i.stopped.clone()))
        else {
            return;
        };
        loop {
            let round = stopped.child_token();
            if let Some(inner) = inner.upgrade() {
                start_watches(&Runtime { inner }, &round);
            }
            tokio::select! {
                changed = published.changed() => if changed.is_err() { return },
                () = stopped.cancelled() => return,
            }
            round.cancel();
        }
    });
}

fn start_watches(runtime: &Runtime, round: &CancellationToken) {
    let (app_id, overlay, watched) = {
        let state = runtime.inner.state();
        let mut watched = Vec::new();
        for (key, running) in &state.running {
            let resolved = &running.assembled.resolved;
            for r in running.spec.configuration_refs.iter().filter(|r| r.watch) {
                watched.push(Watch::Config(
                    key.clone(),
                    r.clone(),
                    resolved.get(&r.inject_as).cloned(),
                ));
            }
            for r in running.spec.secret_refs.iter().filter(|r| r.watch) {
                watched.push(Watch::Secret(
                    key.clone(),
                    r.clone(),
                    resolved.get(&r.inject_as).cloned(),
                ));
            }
        }
        (
            state.config.config.app_id.clone(),
            state.config.config.overlay.clone(),
            watched,
        )
    };
    for watch in watched {
        tokio::spawn(watch.run(runtime.clone(), round.clone()));
    }
    if let Some(spec) = overlay {
        tokio::spawn(watch_overlay(runtime.clone(), spec, app_id, round.clone()));
    }
}

enum Watch {
    Config(ComponentKey, ConfigurationRef, Option<Value>),
    Secret(ComponentKey, SecretRef, Option<Value>),
}

impl Watch {
    async fn run(self, runtime: Runtime, round: CancellationToken) {
        tokio::select! {
            () = round.cancelled() => {}
            () = self.watch(&runtime) => {}
        }
    }

    async fn watch(self, runtime: &Runtime) {
        match self {
            Watch::Config(component, r, resolved) => {
                watch_configuration(runtime, component, r, resolved).await
            }
            Watch::Secret(component, r, resolved) => {
                watch_secret(runtime, component, r, resolved).await
            }
        }
    }
}

fn force(runtime: &Runtime, component: ComponentKey) {
    tracing::info!(component = %component, "Watched value changed.");
    runtime.enqueue(Queued {
        trigger: Trigger::Watch,
        change: None,
        forced: BTreeSet::from([component]),
    });
}

async fn watch_configuration(
    runtime: &Runtime,
    component: ComponentKey,
    r: ConfigurationRef,
    resolved: Option<Value>,
) {
    let handle = ConfigStoreHandle::new(ComponentKey::new(CONFIG_STORE, &r.store), runtime.live());
    let query = ConfigQuery {
        keys: vec![r.key.clone()],
        group: r.group.clone(),
        label: r.label.clone(),
        metadata: HashMap::new(),
    };
    let mut subscription = match handle.subscribe(query.clone()).await {
        Ok(subscription) => subscription,
        Err(err) => {
            tracing::warn!(component = %component, store = %r.store, key = %r.key, error = %err, "Cannot watch configurationRef.");
            return;
        }
    };
    // A change between the component's start and the subscription.
    if let Ok(store) = handle.load() {
        if let Ok(items) = store.get(&query).await {
            let now = items
                .into_iter()
                .find(|i| i.key == r.key)
                .map(|i| Value::String(i.value));
            if now.is_some() && now != resolved {
                force(runtime, component);
                return;
            }
        }
    }
    while let Some(change) = subscription.changes.recv().await {
        let changed = change
            .items
            .iter()
            .any(|i| i.key == r.key && Some(Value::String(i.value.clone())) != resolved);
        if changed {
            force(runtime, component);
            return;
        }
    }
}

async fn watch_secret(
    runtime: &Runtime,
    component: ComponentKey,
    r: SecretRef,
    resolved: Option<Value>,
) {
    let handle = SecretStoreHandle::new(ComponentKey::new(SECRET_STORE, &r.store), runtime.live());
    let mut ticks = tokio::time::interval(runtime.inner.options.secret_poll_interval);
    loop {
        ticks.tick().await;
        let Ok(store) = handle.load() else {
            return;
        };
        // Errors (store briefly unavailable) are retried at the next tick.
        if let Ok(secret) = store.get_secret(&r.name, &HashMap::new()).await {
            let now = secret
                .get(&r.key)
                .map(|v| Value::String(v.expose().to_string()));
            if now.is_some() && now != resolved {
                force(runtime, component);
                return;
            }
        }
    }
}

async fn watch_overlay(
    runtime: Runtime,
    spec: OverlaySpec,
    app_id: String,
    round: CancellationToken,
) {
    let handle =
        ConfigStoreHandle::new(ComponentKey::new(CONFIG_STORE, &spec.store), runtime.live());
    let (common, app) = overlay_keys(&spec, &app_id);
    let subscription = handle.subscribe(ConfigQuery::keys([common, app])).await;
    let mut subscription = match subscription {
        Ok(subscription) => subscription,
        Err(err) => {
            tracing::warn!(store = %spec.store, error = %err, "Cannot watch the overlay.");
            return;
        }
    };
    let mut last_error = None;
    loop {
        overlay_changed(&runtime, &spec, &app_id, &mut last_error).await;
        tokio::select! {
            () = round.cancelled() => return,
            change = subscription.changes.recv() => if change.is_none() { return },
        }
    }
}

/// Queues the overlay if it differs from the layers in force; records an
/// invalid one as rejected (once per distinct error).
async fn overlay_changed(
    runtime: &Runtime,
    spec: &OverlaySpec,
    app_id: &str,
    last_error: &mut Option<String>,
) {
    match read_overlay(runtime, spec, app_id).await {
        Ok((common, app)) => {
            let layers = runtime.layers();
            if layers.overlay != common || layers.overlay_app != app {
                runtime.enqueue(Queued {
                    trigger: Trigger::Overlay,
                    change: Some(LayerChange::Overlay(common, app)),
                    forced: BTreeSet::new(),
                });
            }
        }
        Err(error) => {
            if last_error.as_ref() != Some(&error) {
                runtime.record_rejected(Trigger::Overlay, &error);
                *last_error = Some(error);
            }
        }
    }
}
