//! Keeps the watches of the running configuration in place: `watch: true`
//! configurationRefs (subscribed), `watch: true` secretRefs (polled, since
//! secret stores cannot notify), and the overlay keys. Whenever a new
//! generation is committed the watches are rebuilt from its plan and
//! compared with the values the components were started with, so no
//! change is missed in between.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::overlay::watch_overlay;
use super::TriggerContext;
use crate::component::{ComponentKey, Kind};
use crate::config::{ConfigurationRef, InjectedRef, SecretRef};
use crate::handle::{ConfigStoreHandle, SecretStoreHandle};
use crate::kinds::ConfigQuery;
use crate::reload::{ReloadRequest, Trigger};
use crate::running::{WatchPlan, WatchedRef};

/// Starts the watches; they end at shutdown or when the plans stop. They
/// are rebuilt whenever a commit changes what is watched, whether or not a
/// new generation was published (flipping `watch` alone changes no
/// instance).
pub(crate) fn spawn_watched_refs(mut cx: TriggerContext) {
    tokio::spawn(async move {
        let mut watching: Option<Arc<WatchPlan>> = None;
        loop {
            let plan = cx.plan.borrow_and_update().clone();
            let rebuild = match &watching {
                Some(current) => {
                    current.generation != plan.generation || !current.watches_as(&plan)
                }
                None => true,
            };
            if rebuild {
                watching = Some(Arc::clone(&plan));
                let round = cx.stopped.child_token();
                for watched in plan.refs.iter().cloned() {
                    tokio::spawn(run_watch(cx.clone(), watched, round.clone()));
                }
                if let Some(spec) = plan.overlay.clone() {
                    let app_id = plan.app_id.clone();
                    tokio::spawn(watch_overlay(cx.clone(), spec, app_id, round.clone()));
                }
                let stopped = cx.stopped.clone();
                tokio::select! {
                    changed = next_change(&mut cx, &plan) => if changed.is_err() { return },
                    () = stopped.cancelled() => return,
                }
                round.cancel();
            } else if cx.plan.changed().await.is_err() {
                return;
            }
        }
    });
}

/// Waits for a plan that calls for other watches than `plan`.
async fn next_change(
    cx: &mut TriggerContext,
    plan: &WatchPlan,
) -> Result<(), tokio::sync::watch::error::RecvError> {
    loop {
        cx.plan.changed().await?;
        let next = cx.plan.borrow();
        if next.generation != plan.generation || !next.watches_as(plan) {
            return Ok(());
        }
    }
}

async fn run_watch(cx: TriggerContext, watched: WatchedRef, round: CancellationToken) {
    tokio::select! {
        () = round.cancelled() => {}
        () = watch(&cx, watched) => {}
    }
}

async fn watch(cx: &TriggerContext, watched: WatchedRef) {
    let WatchedRef {
        component,
        reference,
        resolved,
    } = watched;
    match reference {
        InjectedRef::Configuration(_, r) => watch_configuration(cx, component, r, resolved).await,
        InjectedRef::Secret(_, r) => watch_secret(cx, component, r, resolved).await,
    }
}

fn force(cx: &TriggerContext, component: ComponentKey) {
    tracing::info!(component = %component, "Watched value changed.");
    cx.request(ReloadRequest {
        forced: BTreeSet::from([component]),
        ..ReloadRequest::of_changes(Trigger::WatchedRef, Vec::new())
    });
}

async fn watch_configuration(
    cx: &TriggerContext,
    component: ComponentKey,
    r: ConfigurationRef,
    resolved: Option<Value>,
) {
    let handle = ConfigStoreHandle::new(
        ComponentKey::new(Kind::ConfigStore, &r.store),
        cx.live.clone(),
    );
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
                force(cx, component);
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
            force(cx, component);
            return;
        }
    }
}

async fn watch_secret(
    cx: &TriggerContext,
    component: ComponentKey,
    r: SecretRef,
    resolved: Option<Value>,
) {
    let handle = SecretStoreHandle::new(
        ComponentKey::new(Kind::SecretStore, &r.store),
        cx.live.clone(),
    );
    let mut ticks = tokio::time::interval(cx.secret_poll_interval);
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
                force(cx, component);
                return;
            }
        }
    }
}
