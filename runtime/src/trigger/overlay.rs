//! The overlay: a config-store key holding component overrides, and its
//! app-specific variant `<key>.<appId>`, which wins. It is read at start
//! and watched for as long as the configuration names it.

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::store_calls::store_call_bound;
use super::TriggerContext;
use crate::component::{ComponentKey, Kind};
use crate::config::{parse_overlay, ConfigPatch, LayerChange, OverlaySpec};
use crate::handle::{ConfigStoreHandle, LiveGeneration};
use crate::kinds::{ConfigError, ConfigQuery};
use crate::reload::{ReloadRequest, Trigger};

/// The overlay documents: common, then app-specific.
pub(crate) type OverlayDocuments = (Option<ConfigPatch>, Option<ConfigPatch>);

/// The overlay documents last sent, and the generation they were sent
/// against. A watch starts (after start-up's own try, and again after
/// every commit) by reading the overlay: documents already tried against
/// the generation serving are not sent again; against a new generation
/// they are (what changed may make them valid).
///
/// It also serialises the watch rounds' sends: a round compares and sends
/// holding [`OverlayTried::sending`], and a round cancelled by then (a
/// newer one reads for itself) sends nothing.
///
/// And it holds the last rejected read (its error, and the generation it
/// was read against), so that a read rejected at start is not recorded
/// again by the watch's first read, nor by a re-read of the same
/// generation; against a new generation it is.
#[derive(Default)]
pub(crate) struct OverlayTried {
    tried: Mutex<Option<(u64, OverlayDocuments)>>,
    sending: Mutex<()>,
    rejected: Mutex<Option<(u64, String)>>,
}

impl OverlayTried {
    /// Notes `documents` as tried against `generation`; false when they
    /// already were.
    pub(crate) fn first_try(&self, generation: u64, documents: &OverlayDocuments) -> bool {
        let mut tried = self.tried.lock().unwrap_or_else(|p| p.into_inner());
        let again = tried
            .as_ref()
            .is_some_and(|(at, tried)| *at == generation && tried == documents);
        if !again {
            *tried = Some((generation, documents.clone()));
        }
        !again
    }

    /// Held by a watch round from its cancellation check to its send.
    fn sending(&self) -> MutexGuard<'_, ()> {
        self.sending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Notes `error` as the overlay's read rejected against `generation`;
    /// false when it is the last one noted against it (nothing new to
    /// record).
    pub(crate) fn first_rejection(&self, generation: u64, error: &str) -> bool {
        let mut rejected = self.rejected.lock().unwrap_or_else(|p| p.into_inner());
        let again = rejected
            .as_ref()
            .is_some_and(|(at, last)| *at == generation && last == error);
        if !again {
            *rejected = Some((generation, error.to_string()));
        }
        !again
    }

    /// Forgets the last rejection: the overlay was read (a rejection after
    /// this one is news).
    fn read(&self) {
        *self.rejected.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// Whether documents other than `documents` were sent last (they may
    /// still be waiting in the queue, or retried after a rollback).
    pub(crate) fn other_sent(&self, documents: &OverlayDocuments) -> bool {
        let tried = self.tried.lock().unwrap_or_else(|p| p.into_inner());
        tried.as_ref().is_some_and(|(_, tried)| tried != documents)
    }
}

/// The overlay's two keys: common, then app-specific.
fn overlay_keys(spec: &OverlaySpec, app_id: &str) -> (String, String) {
    (spec.key.clone(), format!("{}.{app_id}", spec.key))
}

/// Reads and parses both overlay documents; an absent or empty key is
/// `None`. An error names the key and every problem, or says the store did
/// not answer within the store-call bound (its read is abandoned).
pub(crate) async fn read_overlay(
    live: &LiveGeneration,
    spec: &OverlaySpec,
    app_id: &str,
) -> Result<OverlayDocuments, String> {
    read_documents(live, spec, app_id)
        .await
        .map_err(OverlayUnread::into_message)
}

/// Why the overlay could not be read.
enum OverlayUnread {
    /// The store did not answer in time, or answered with an error (an
    /// etcd that forgot its auth tokens, say): worth asking again soon, or
    /// a change written meanwhile would wait for the next write.
    StoreFailed(String),
    /// The store is not running, or a document is invalid: asking again
    /// reads the same (the next write, or generation, is news).
    Failed(String),
}

impl OverlayUnread {
    fn into_message(self) -> String {
        match self {
            Self::StoreFailed(message) | Self::Failed(message) => message,
        }
    }
}

async fn read_documents(
    live: &LiveGeneration,
    spec: &OverlaySpec,
    app_id: &str,
) -> Result<OverlayDocuments, OverlayUnread> {
    let handle = ConfigStoreHandle::new(
        ComponentKey::new(Kind::ConfigStore, &spec.store),
        live.clone(),
    );
    let failed = |e: &dyn std::fmt::Display| {
        OverlayUnread::Failed(format!("overlay store `{}`: {e}", spec.store))
    };
    let store = handle.load().map_err(|e| failed(&e))?;
    let (common, app) = overlay_keys(spec, app_id);
    let within = store_call_bound(None);
    let query = ConfigQuery::keys([common.clone(), app.clone()]);
    let items = tokio::time::timeout(within, store.get(&query))
        .await
        .map_err(|_| OverlayUnread::StoreFailed(did_not_answer(spec, within)))?
        .map_err(|e| OverlayUnread::StoreFailed(store_failed(spec, &e)))?;
    let parse_key = |key: &str| {
        parse_document(
            key,
            items
                .iter()
                .find(|i| i.key == key)
                .map(|i| i.value.as_str()),
        )
    };
    let common = parse_key(&common).map_err(OverlayUnread::Failed)?;
    let app = parse_key(&app).map_err(OverlayUnread::Failed)?;
    Ok((common, app))
}

/// The error of an overlay store call abandoned at `within`.
fn did_not_answer(spec: &OverlaySpec, within: Duration) -> String {
    format!(
        "overlay store `{}`: did not answer within {within:?}; the overlay watch tries again",
        spec.store
    )
}

/// The error of an overlay store call the store answered with `error`.
fn store_failed(spec: &OverlaySpec, error: &dyn std::fmt::Display) -> String {
    format!(
        "overlay store `{}`: {error}; the overlay watch tries again",
        spec.store
    )
}

/// The overlay document `text` read from `key`: `None` when absent or
/// empty; an error names the key and every problem (a section other than
/// `components` included: an overlay overrides components only).
fn parse_document(key: &str, text: Option<&str>) -> Result<Option<ConfigPatch>, String> {
    match text.map(str::trim) {
        None | Some("") => Ok(None),
        Some(text) => parse_overlay(text.as_bytes())
            .map(Some)
            .map_err(|problems| format!("overlay key `{key}`:\n{problems}")),
    }
}

/// Watches the overlay keys until `round` ends: every change that differs
/// from the documents in force (or from those sent last) is sent as a
/// reload. A store call that does not answer within the store-call bound
/// is abandoned and tried again (a read, a bound later), as is a read the
/// store answers with an error; an invalid document is not (it is read
/// again at the next write). A store that refuses to subscribe is polled
/// instead ([`poll_overlay`]).
pub(crate) async fn watch_overlay(
    cx: TriggerContext,
    spec: OverlaySpec,
    app_id: String,
    round: CancellationToken,
) {
    tokio::select! {
        () = round.cancelled() => {}
        () = watch_overlay_round(&cx, &spec, &app_id, &round) => {}
    }
}

async fn watch_overlay_round(
    cx: &TriggerContext,
    spec: &OverlaySpec,
    app_id: &str,
    round: &CancellationToken,
) {
    let handle = ConfigStoreHandle::new(
        ComponentKey::new(Kind::ConfigStore, &spec.store),
        cx.live.clone(),
    );
    let (common, app) = overlay_keys(spec, app_id);
    let query = ConfigQuery::keys([common, app]);
    let within = store_call_bound(None);
    // The store may let a subscription go (it fell behind, a burst of
    // writes while this task waited): then it is subscribed to again, a
    // moment later (longer while subscriptions end without a change),
    // and read again.
    let mut resubscribe = super::resubscribe::Resubscribe::default();
    loop {
        let mut subscription = loop {
            match tokio::time::timeout(within, handle.subscribe(query.clone())).await {
                Ok(Ok(subscription)) => break subscription,
                // The handle's own bound on the call: as no answer.
                Ok(Err(crate::kinds::ConfigError::Timeout(_))) => {
                    tracing::warn!(store = %spec.store, timeout = ?within, "Subscribing to the overlay did not answer in time; asking again.");
                }
                Ok(Err(refused)) => {
                    return poll_overlay(cx, spec, app_id, round, &handle, &refused).await;
                }
                Err(_) => {
                    tracing::warn!(store = %spec.store, timeout = ?within, "Subscribing to the overlay did not answer in time; asking again.");
                }
            }
        };
        loop {
            let read = overlay_changed(cx, spec, app_id, round).await;
            tokio::select! {
                change = subscription.changes.recv() => match change {
                    Some(_) => resubscribe = Default::default(),
                    None => break,
                },
                () = tokio::time::sleep(within), if !read => {}
            }
        }
        let wait = resubscribe.next_wait();
        tracing::warn!(store = %spec.store, after = ?wait, "The overlay's subscription ended; subscribing again.");
        tokio::time::sleep(wait).await;
    }
}

/// Reads the overlay every secret poll period (the first read at once,
/// each read bounded by the store-call bound), sending what differs as a
/// subscription's change would be: the watch of a store that `refused` to
/// subscribe (a custom store that cannot notify), as a watched
/// configurationRef of it is polled. Ends with `round`, or when the store
/// is not running (the next generation's round reads it again).
async fn poll_overlay(
    cx: &TriggerContext,
    spec: &OverlaySpec,
    app_id: &str,
    round: &CancellationToken,
    handle: &ConfigStoreHandle,
    refused: &ConfigError,
) {
    if handle.load().is_err() {
        tracing::warn!(store = %spec.store, error = %refused, "Cannot watch the overlay: its store is not running.");
        return;
    }
    let period = super::poll_period::secret_poll_period(cx.secret_poll_interval);
    tracing::warn!(store = %spec.store, error = %refused, every = ?period, "The overlay store refused to subscribe; polling the overlay instead.");
    let mut ticks = tokio::time::interval(period);
    // After a read abandoned at its bound, the next one waits a period
    // (not a burst of the ticks missed meanwhile).
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        if handle.load().is_err() {
            return;
        }
        // A read that fails or does not answer is tried at the next tick.
        overlay_changed(cx, spec, app_id, round).await;
    }
}

/// Sends the overlay if it differs from the documents in force, or from
/// the documents sent last (reverted to the documents in force while other
/// ones are queued or retried: sent, so they replace those); sends an
/// invalid one as rejected (once per distinct error and generation: not
/// again when the start or a previous read already did). A read made by a
/// `round` cancelled meanwhile is dropped: the newer round's read may
/// already be sent, and an older one sent after it would win. So is one
/// made for an app id or overlay the watch plan no longer gives (a commit
/// changed it, and this round is about to be cancelled): the layers would
/// ignore it, and noted as tried against the new generation it would hold
/// back the new round's read of the same documents (an app document
/// copied for the renamed app), leaving them out of force. False when
/// the store did not answer or failed (to be read again).
async fn overlay_changed(
    cx: &TriggerContext,
    spec: &OverlaySpec,
    app_id: &str,
    round: &CancellationToken,
) -> bool {
    let read = read_documents(&cx.live, spec, app_id).await;
    let answered = !matches!(read, Err(OverlayUnread::StoreFailed(_)));
    let _sending = cx.overlay_tried.sending();
    if round.is_cancelled() {
        return answered;
    }
    let (generation, in_force, for_the_plan) = {
        let plan = cx.plan.borrow();
        let for_the_plan = plan.app_id == app_id && plan.overlay.as_ref() == Some(spec);
        (plan.generation, plan.overlay_in_force.clone(), for_the_plan)
    };
    if !for_the_plan {
        tracing::debug!(
            read_for = %app_id,
            store = %spec.store,
            key = %spec.key,
            "Overlay read dropped: made for an app id or overlay the configuration no longer gives (the new watch reads for itself)."
        );
        return answered;
    }
    match read {
        Ok(documents) => {
            cx.overlay_tried.read();
            let differs = in_force != documents || cx.overlay_tried.other_sent(&documents);
            if differs && cx.overlay_tried.first_try(generation, &documents) {
                let (common, app) = documents;
                let change = LayerChange::overlay_read(spec.clone(), app_id, common, app);
                cx.request(ReloadRequest::of_changes(Trigger::Overlay, vec![change]));
            }
        }
        Err(unread) => {
            let error = unread.into_message();
            if cx.overlay_tried.first_rejection(generation, &error) {
                cx.reject(Trigger::Overlay, error);
            }
        }
    }
    answered
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    use async_trait::async_trait;
    use tokio::sync::{watch, Notify};

    use super::super::store_calls::MIN_STORE_CALL;
    use super::*;
    use crate::component::Component;
    use crate::config::{parse_patch, OverlayRead};
    use crate::handle::{Generation, Instance, Live};
    use crate::kinds::{ConfigError, ConfigItem, ConfigStore, ConfigSubscription, SubscriptionHub};
    use crate::reload::queue::{QueueReceiver, Queued};
    use crate::running::WatchPlan;

    fn documents(ttl: u32) -> OverlayDocuments {
        let text =
            format!(r#"{{"components": {{"state": {{"s": {{"metadata": {{"ttl": {ttl}}}}}}}}}}}"#);
        (parse_patch(text.as_bytes()).ok(), None)
    }

    /// A config store holding the overlay's common key (and `others`);
    /// its next get, once told so, reads the value, then waits to be
    /// released, or fails.
    #[derive(Default)]
    struct GatedStore {
        value: Mutex<String>,
        /// Other keys' items, answered by every get after the common key's.
        others: Mutex<Vec<ConfigItem>>,
        hold_next: AtomicBool,
        fail_next: AtomicBool,
        /// `subscribe` is refused (a store that cannot notify).
        refuses_to_subscribe: AtomicBool,
        held: Notify,
        release: Notify,
        hub: SubscriptionHub,
    }

    impl GatedStore {
        /// Sets the value and tells the subscribers.
        fn write(&self, value: String) {
            *self.value.lock().unwrap_or_else(|p| p.into_inner()) = value.clone();
            self.hub.publish(&[ConfigItem {
                key: "rewire.components".into(),
                value,
                ..ConfigItem::default()
            }]);
        }
    }

    #[async_trait]
    impl Component for GatedStore {}

    #[async_trait]
    impl ConfigStore for GatedStore {
        async fn get(&self, _: &ConfigQuery) -> Result<Vec<ConfigItem>, ConfigError> {
            if self.fail_next.swap(false, Ordering::SeqCst) {
                return Err(ConfigError::Backend("invalid auth token".into()));
            }
            let value = self.value.lock().unwrap_or_else(|p| p.into_inner()).clone();
            if self.hold_next.swap(false, Ordering::SeqCst) {
                self.held.notify_one();
                self.release.notified().await;
            }
            let common = ConfigItem {
                key: "rewire.components".into(),
                value,
                ..ConfigItem::default()
            };
            let others = self.others.lock().unwrap_or_else(|p| p.into_inner());
            Ok([common].into_iter().chain(others.iter().cloned()).collect())
        }

        async fn subscribe(&self, query: ConfigQuery) -> Result<ConfigSubscription, ConfigError> {
            if self.refuses_to_subscribe.load(Ordering::SeqCst) {
                return Err(ConfigError::Unsupported("subscribe".into()));
            }
            Ok(self.hub.subscribe(query))
        }
    }

    fn text(ttl: u32) -> String {
        format!(r#"{{"components": {{"state": {{"s": {{"metadata": {{"ttl": {ttl}}}}}}}}}}}"#)
    }

    /// The overlay documents of the next reload queued (within a minute),
    /// read from the overlay at `rewire.components` of `cfg` (as
    /// [`overlay_of`] names it) for the app `shop`.
    async fn next_sent(queued: &mut QueueReceiver) -> OverlayDocuments {
        next_sent_for(queued, "rewire.components", "shop").await
    }

    /// [`next_sent`], read from the key `from_key` of `cfg` for the app
    /// `read_for`.
    async fn next_sent_for(
        queued: &mut QueueReceiver,
        from_key: &str,
        read_for: &str,
    ) -> OverlayDocuments {
        let next = tokio::time::timeout(Duration::from_secs(60), queued.recv()).await;
        match next {
            Ok(Some(Queued::Reload(request))) => match request.changes.as_slice() {
                [LayerChange::Overlay {
                    common,
                    read: Some(OverlayRead { from, app_id, app }),
                }] => {
                    assert_eq!(
                        (from.store.as_str(), from.key.as_str()),
                        ("cfg", from_key),
                        "the overlay read from"
                    );
                    assert_eq!(app_id, read_for, "the app id read for");
                    (common.clone(), app.clone())
                }
                other => panic!("not an overlay change naming its overlay: {other:?}"),
            },
            other => panic!("no overlay reload queued: {other:?}"),
        }
    }

    /// A watch plan of `generation` for `app_id`, naming the overlay
    /// `spec` (none of its documents in force); it never changes.
    fn plan_of(
        generation: u64,
        app_id: &str,
        spec: &OverlaySpec,
    ) -> watch::Receiver<Arc<WatchPlan>> {
        let plan = WatchPlan {
            generation,
            app_id: app_id.into(),
            overlay: Some(spec.clone()),
            overlay_in_force: (None, None),
            refs: Vec::new(),
        };
        watch::channel(Arc::new(plan)).1
    }

    /// What an overlay watch of `store` (as `cfg`, holding D1) is given,
    /// with the reload queue it sends to (generation 1 of `shop` names
    /// the overlay, none of its documents in force).
    fn overlay_of(store: &Arc<GatedStore>) -> (TriggerContext, QueueReceiver, OverlaySpec) {
        *store.value.lock().unwrap_or_else(|p| p.into_inner()) = text(1);
        let live = Live::new();
        let instance: Arc<dyn ConfigStore> = store.clone();
        let key = ComponentKey::new(Kind::ConfigStore, "cfg");
        live.publish(Generation::new(
            1,
            BTreeMap::from([(key, Instance::ConfigStore(instance))]),
        ));
        let (mut cx, queued) = TriggerContext::for_tests(live, "shop");
        let spec = OverlaySpec {
            store: "cfg".into(),
            key: "rewire.components".into(),
        };
        cx.plan = plan_of(1, "shop", &spec);
        (cx, queued, spec)
    }

    /// The file changes the app id from shop to shop2 (generation 2), and
    /// the app document D is copied to `<key>.shop2`: the old watch's read
    /// for shop, finishing once generation 2 is out, does not count as
    /// tried against it, so the shop2 watch's read of the same documents
    /// is sent (not held back until another commit).
    #[tokio::test(start_paused = true)]
    async fn a_read_for_the_replaced_app_id_does_not_hold_back_the_new_app_ids() {
        let store = Arc::new(GatedStore::default());
        let (mut cx, mut queued, spec) = overlay_of(&store);
        let app = r#"{"components": {"state": {"s": {"metadata": {"app": "d"}}}}}"#;
        *store.others.lock().unwrap_or_else(|p| p.into_inner()) = ["shop", "shop2"]
            .map(|app_id| ConfigItem {
                key: format!("rewire.components.{app_id}"),
                value: app.into(),
                ..ConfigItem::default()
            })
            .to_vec();
        cx.plan = plan_of(2, "shop2", &spec);
        // The old watch's last read, for shop, before its round is
        // cancelled (the layers ignore it if sent: another app's).
        let old_round = CancellationToken::new();
        overlay_changed(&cx, &spec, "shop", &old_round).await;
        old_round.cancel();
        while queued.try_recv().is_ok() {}

        let round = CancellationToken::new();
        let watch = tokio::spawn(watch_overlay(cx, spec, "shop2".into(), round.clone()));
        let read = (documents(1).0, parse_patch(app.as_bytes()).ok());
        let sent = next_sent_for(&mut queued, "rewire.components", "shop2").await;
        assert_eq!(sent, read);
        round.cancel();
        let _ = watch.await;
    }

    /// The same when the file moves the overlay to another key holding
    /// the same documents: the old key's late read does not hold back the
    /// new key's.
    #[tokio::test(start_paused = true)]
    async fn a_read_of_the_key_moved_away_from_does_not_hold_back_the_new_keys() {
        let store = Arc::new(GatedStore::default());
        let (mut cx, mut queued, old) = overlay_of(&store);
        *store.others.lock().unwrap_or_else(|p| p.into_inner()) = vec![ConfigItem {
            key: "rewire.moved".into(),
            value: text(1),
            ..ConfigItem::default()
        }];
        let moved = OverlaySpec {
            key: "rewire.moved".into(),
            ..old.clone()
        };
        cx.plan = plan_of(2, "shop", &moved);
        let old_round = CancellationToken::new();
        overlay_changed(&cx, &old, "shop", &old_round).await;
        old_round.cancel();
        while queued.try_recv().is_ok() {}

        let round = CancellationToken::new();
        let watch = tokio::spawn(watch_overlay(cx, moved, "shop".into(), round.clone()));
        let sent = next_sent_for(&mut queued, "rewire.moved", "shop").await;
        assert_eq!(sent, documents(1));
        round.cancel();
        let _ = watch.await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_change_whose_read_the_store_fails_is_read_again_and_sent() {
        let store = Arc::new(GatedStore::default());
        let (cx, mut queued, spec) = overlay_of(&store);
        let round = CancellationToken::new();
        let watch = tokio::spawn(watch_overlay(cx, spec, "shop".into(), round.clone()));
        assert_eq!(next_sent(&mut queued).await, documents(1));
        // The store has forgotten its auth tokens when D2 is written: the
        // read of the change fails (recorded), and D2 is read again.
        store.fail_next.store(true, Ordering::SeqCst);
        store.write(text(2));
        let within = 2 * MIN_STORE_CALL;
        match tokio::time::timeout(within, queued.recv()).await {
            Ok(Some(Queued::Rejected { error, .. })) => {
                assert!(error.contains("invalid auth token"), "{error}");
            }
            other => panic!("the failed read was not recorded: {other:?}"),
        }
        let again = tokio::time::timeout(within, next_sent(&mut queued)).await;
        assert_eq!(
            again.ok(),
            Some(documents(2)),
            "D2 not sent within {within:?} of its failed read"
        );
        round.cancel();
        let _ = watch.await;
    }

    /// A store that cannot notify: the overlay is read at once, then
    /// polled, and a change written later is sent.
    #[tokio::test(start_paused = true)]
    async fn an_overlay_whose_store_refuses_to_subscribe_is_polled() {
        let store = Arc::new(GatedStore::default());
        store.refuses_to_subscribe.store(true, Ordering::SeqCst);
        let (mut cx, mut queued, spec) = overlay_of(&store);
        cx.secret_poll_interval = Duration::from_secs(1);
        let round = CancellationToken::new();
        let watch = tokio::spawn(watch_overlay(cx, spec, "shop".into(), round.clone()));
        assert_eq!(next_sent(&mut queued).await, documents(1), "first read");
        store.write(text(2));
        assert_eq!(next_sent(&mut queued).await, documents(2), "polled");
        round.cancel();
        let _ = watch.await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_watch_whose_subscription_the_store_dropped_subscribes_again() {
        let store = Arc::new(GatedStore::default());
        let (cx, mut queued, spec) = overlay_of(&store);
        let round = CancellationToken::new();
        let watch = tokio::spawn(watch_overlay(cx, spec, "shop".into(), round.clone()));
        assert_eq!(next_sent(&mut queued).await, documents(1));
        // A burst of writes of the same documents while the watch cannot
        // run: the store drops it as a subscriber that stopped reading.
        for _ in 0..1_000 {
            store.write(text(1));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        store.write(text(2));
        let within = super::super::resubscribe::RESUBSCRIBE_AFTER + 2 * MIN_STORE_CALL;
        let again = tokio::time::timeout(within, next_sent(&mut queued)).await;
        assert_eq!(
            again.ok(),
            Some(documents(2)),
            "D2 not sent within {within:?}"
        );
        round.cancel();
        let _ = watch.await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancelled_rounds_late_read_is_not_sent_after_the_newer_rounds() {
        let store = Arc::new(GatedStore::default());
        let (cx, mut queued, spec) = overlay_of(&store);
        let first = CancellationToken::new();
        let old_round = tokio::spawn(watch_overlay(
            cx.clone(),
            spec.clone(),
            "shop".into(),
            first.clone(),
        ));
        assert_eq!(next_sent(&mut queued).await, documents(1));
        // The old round reads D3, and its read is slow to return ...
        store.hold_next.store(true, Ordering::SeqCst);
        store.write(text(3));
        store.held.notified().await;
        // ... while D4 is written and a new round (a new generation)
        // reads and sends it.
        store.write(text(4));
        first.cancel();
        let second = CancellationToken::new();
        let new_round = tokio::spawn(watch_overlay(cx, spec, "shop".into(), second.clone()));
        assert_eq!(next_sent(&mut queued).await, documents(4));
        store.release.notify_one();
        tokio::time::timeout(Duration::from_secs(60), old_round)
            .await
            .expect("the old round ends")
            .expect("joined");
        match queued.try_recv() {
            Err(_) => {}
            Ok(late) => panic!("the old round's stale read was sent after D4: {late:?}"),
        }
        second.cancel();
        let _ = new_round.await;
    }

    #[test]
    fn documents_are_tried_once_per_generation() {
        let tried = OverlayTried::default();
        assert!(tried.first_try(1, &documents(1)));
        assert!(
            !tried.first_try(1, &documents(1)),
            "the same documents, the same generation"
        );
        assert!(tried.first_try(1, &documents(2)), "other documents");
        assert!(tried.first_try(1, &documents(1)), "back to the first ones");
        assert!(tried.first_try(2, &documents(1)), "a new generation");
        assert!(!tried.first_try(2, &documents(1)));
        assert!(tried.other_sent(&documents(2)), "reverting is news");
        assert!(!tried.other_sent(&documents(1)));
        assert!(!OverlayTried::default().other_sent(&documents(1)));
    }

    #[test]
    fn a_rejection_is_news_once_per_generation_until_a_read_succeeds() {
        let tried = OverlayTried::default();
        assert!(tried.first_rejection(1, "bad"));
        assert!(!tried.first_rejection(1, "bad"), "the same read again");
        assert!(tried.first_rejection(1, "worse"), "another error");
        assert!(tried.first_rejection(1, "bad"), "back to the first one");
        assert!(tried.first_rejection(2, "bad"), "a new generation");
        tried.read();
        assert!(
            tried.first_rejection(2, "bad"),
            "rejected again after a read"
        );
    }

    #[test]
    fn an_overlay_holds_components_only() {
        let components = r#""components": {"state": {"s": {"metadata": {"ttl": 1}}}}"#;
        let read = parse_document("rewire.components", Some(&format!("{{{components}}}")));
        assert_eq!(read, Ok(documents(1).0));
        assert_eq!(parse_document("k", Some("  ")), Ok(None));
        assert_eq!(parse_document("k", None), Ok(None));
        for section in [
            r#""appId": "other""#,
            r#""resiliency": {}"#,
            r#""subscriptions": []"#,
            r#""overlay": {"store": "s", "key": "k"}"#,
            r#""tracing": {}"#,
        ] {
            let name = section.split('"').nth(1).unwrap_or_default();
            let text = format!("{{{section}, {components}}}");
            let err = parse_document("rewire.components.shop", Some(&text))
                .expect_err("a section other than components is refused");
            assert_eq!(
                err,
                format!(
                    "overlay key `rewire.components.shop`:\n`{name}` is not read from an \
                     overlay: an overlay holds only `components` (set it in the configuration file)"
                ),
                "{section}"
            );
        }
    }
}
