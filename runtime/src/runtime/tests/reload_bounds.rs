//! How long a reload may hold the runtime when its components do not
//! answer (paused clock: every wait is virtual): a shutdown cuts short a
//! reload whose `init` hangs, which rolls back, instead of waiting out the
//! init timeout; a rollback closes a level's built instances at once, by
//! one deadline, not one close timeout after another.

use super::*;
use crate::reload::Outcome;

/// `components` (see [`declared`]) as a candidate to apply.
fn candidate(components: &[(&str, &[&str])], close_ms: &[(&str, u64)]) -> crate::config::Config {
    let text = json!({"components": {"custom": declared(components, close_ms)}}).to_string();
    parse(text.as_bytes()).unwrap_or_else(|p| panic!("{p}"))
}

async fn started(components: &[(&str, &[&str])]) -> Runtime {
    started_slow(components, &[]).await
}

/// [`started`], each named in `close_ms` slow to close.
async fn started_slow(components: &[(&str, &[&str])], close_ms: &[(&str, u64)]) -> Runtime {
    let config = valid(&json!({"components": {"custom": declared(components, close_ms)}}));
    Runtime::start(config, registry(), RuntimeOptions::default())
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Far below the init timeout (30 s), far above cutting a reload short.
const CUT_SHORT: Duration = Duration::from_secs(10);

#[tokio::test(start_paused = true)]
async fn a_shutdown_cuts_short_a_reload_whose_init_hangs_and_it_rolls_back() {
    let runtime = started(&[("cut-store", &[])]).await;
    // Added by the reload, its `init` never ends (it tells `cut`'s stop),
    // nor does its close.
    let uses: [(&str, &[&str]); 2] = [("cut-store", &[]), ("cut-hang", &["cut-store"])];
    let adding = candidate(&uses, &[("cut-hang", 60_000)]);

    let reload = runtime.apply(adding);
    let shutdown = async {
        stopped("cut").await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        let asked = tokio::time::Instant::now();
        let abandoned = runtime.shutdown().await;
        (asked.elapsed(), abandoned)
    };
    let (reloaded, (took, abandoned)) = tokio::join!(reload, shutdown);

    assert!(
        took < CUT_SHORT,
        "the shutdown waited {took:?} for the reload"
    );
    assert_eq!(abandoned, 1, "the reload's close that hung is not counted");
    // The runtime is going away: not a rejection of the change.
    assert!(
        matches!(reloaded, Err(ReloadError::Stopped)),
        "the reload should say the runtime stopped, got {reloaded:?}"
    );
    let history = runtime.history();
    assert_eq!(history.len(), 1, "the reload was not recorded");
    assert_eq!(history[0].outcome, Outcome::RolledBack);
    let said = history[0].error.clone().unwrap_or_default();
    assert!(
        said.contains("custom/cut-hang") && said.contains("the reload was cut short by shutdown"),
        "not cut short: {said}"
    );
    assert!(!said.contains("start-up"), "told in start-up words: {said}");
    let mut closed = of(&CLOSED, "cut");
    closed.sort();
    assert_eq!(closed, ["cut-hang", "cut-store"], "each closed once");
}

#[tokio::test(start_paused = true)]
async fn a_close_its_undo_abandons_when_shutdown_cuts_a_reload_short_is_counted() {
    let runtime = started(&[("severed-store", &[])]).await;
    // Built beside the one whose `init` never ends, it is undone; its
    // close never ends.
    let uses: [(&str, &[&str]); 3] = [
        ("severed-store", &[]),
        ("severed-built", &["severed-store"]),
        ("severed-hang", &["severed-store"]),
    ];
    let adding = candidate(&uses, &[("severed-built", 60_000)]);

    let reload = runtime.apply(adding);
    let shutdown = async {
        stopped("severed").await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        runtime.shutdown().await
    };
    let (reloaded, abandoned) = tokio::join!(reload, shutdown);

    assert!(
        matches!(reloaded, Err(ReloadError::Stopped)),
        "the reload should say the runtime stopped, got {reloaded:?}"
    );
    assert_eq!(abandoned, 1, "the undo's close that hung is not counted");
    let closed = of(&CLOSED, "severed");
    assert!(closed.iter().any(|c| c == "severed-built"), "{closed:?}");
}

/// Built by the rolled-back reload, each slow to close past the close
/// timeout: one after another they would hold it 10 × 5 s.
const SLOW: [&str; 10] = [
    "undo-slow0",
    "undo-slow1",
    "undo-slow2",
    "undo-slow3",
    "undo-slow4",
    "undo-slow5",
    "undo-slow6",
    "undo-slow7",
    "undo-slow8",
    "undo-slow9",
];

#[tokio::test(start_paused = true)]
async fn a_rollback_closes_a_levels_built_instances_at_once_users_first() {
    let runtime = started(&[("undo-base", &[])]).await;
    // Levels: the slow ones; a user of one; one that fails, last.
    let mut uses: Vec<(&str, &[&str])> = vec![("undo-base", &[])];
    uses.extend(SLOW.iter().map(|name| (*name, &[] as &[&str])));
    uses.push(("undo-user", &["undo-slow0"]));
    uses.push(("undo-last-fails", &["undo-user"]));
    let close_ms: Vec<(&str, u64)> = SLOW.iter().map(|name| (*name, 60_000)).collect();

    let asked = tokio::time::Instant::now();
    let reloaded = runtime.apply(candidate(&uses, &close_ms)).await;
    let took = asked.elapsed();

    assert!(
        matches!(reloaded, Err(ReloadError::RolledBack(_))),
        "{reloaded:?}"
    );
    // One close timeout for the slow level, not ten.
    let bound = crate::closing::CLOSE_TIMEOUT * 2;
    assert!(took < bound, "the rollback took {took:?}");
    let closed = of(&CLOSED, "undo");
    let at = |name: &str| closed.iter().position(|c| c == name);
    for slow in SLOW {
        assert!(at(slow).is_some(), "{slow} was not closed: {closed:?}");
        assert!(
            at("undo-user") < at(slow),
            "a store closed before its user: {closed:?}"
        );
    }
    assert_eq!(at("undo-base"), None, "a kept component was closed");
    assert_eq!(runtime.history()[0].outcome, Outcome::RolledBack);
    runtime.shutdown().await;
}

/// A store, then a chain of users, each of the one before.
static CHAIN: [&str; 14] = [
    "deep-store",
    "deep-1",
    "deep-2",
    "deep-3",
    "deep-4",
    "deep-5",
    "deep-6",
    "deep-7",
    "deep-8",
    "deep-9",
    "deep-10",
    "deep-11",
    "deep-12",
    "deep-13",
];

#[tokio::test(start_paused = true)]
async fn a_shutdown_by_a_deadline_closes_the_stores_under_levels_of_closes_that_hang() {
    // Thirteen levels whose close hangs: one close timeout each (65 s)
    // would leave the store, closed last, past the deadline.
    let mut uses: Vec<(&str, &[&str])> = vec![(CHAIN[0], &[])];
    uses.extend(CHAIN.windows(2).map(|pair| (pair[1], &pair[..1])));
    let close_ms: Vec<(&str, u64)> = CHAIN[1..].iter().map(|name| (*name, 60_000)).collect();
    let runtime = started_slow(&uses, &close_ms).await;

    let bound = Duration::from_secs(60);
    let asked = tokio::time::Instant::now();
    let abandoned = runtime.shutdown_by(asked + bound).await;
    let took = asked.elapsed();

    assert!(took <= bound, "the shutdown took {took:?}");
    let closed = of(&CLOSED, "deep");
    assert!(
        closed.iter().any(|c| c == "deep-store"),
        "the store was never closed: {closed:?}"
    );
    assert_eq!(closed.len(), CHAIN.len(), "each asked once: {closed:?}");
    assert_eq!(abandoned, CHAIN.len() - 1, "each hanging close counted");
}

/// An in-place component whose backend is gone: neither its staging nor
/// its updates (the revert included) ever answer. Its staging tells
/// `stuck`'s stop.
struct Stuck;

#[async_trait]
impl Component for Stuck {
    fn as_in_place(&self) -> Option<&dyn crate::component::InPlaceUpdate> {
        Some(self)
    }
}

#[async_trait]
impl crate::component::InPlaceUpdate for Stuck {
    async fn update_in_place(
        &self,
        _metadata: &Metadata,
    ) -> Result<crate::component::InPlace, ComponentError> {
        std::future::pending().await
    }

    async fn stage_in_place(
        &self,
        _metadata: &Metadata,
    ) -> Result<crate::component::StagedInPlace, ComponentError> {
        stop_of("stuck").notify_one();
        std::future::pending().await
    }
}

impl Inject for Stuck {}

impl Buildable for Stuck {
    fn into_instance(self: Box<Self>) -> Instance {
        Instance::Custom(Arc::new(*self))
    }
}

/// `stuck-one`, a [`Stuck`], at `version`.
fn stuck_config(version: &str) -> Value {
    json!({"components": {"custom": {"stuck-one": {"type": "stuck", "metadata": {"version": version}}}}})
}

#[tokio::test(start_paused = true)]
async fn a_shutdown_cuts_short_an_in_place_update_that_never_answers() {
    let mut registry = registry();
    registry.register(ComponentDescriptor {
        kind: "custom",
        type_name: "stuck",
        description: "",
        example_metadata: "{}",
        validate: any_metadata,
        build: |_| Ok(Box::new(Stuck)),
        check_refs: None,
        in_place: None,
    });
    let text = stuck_config("1").to_string();
    let config = parse(text.as_bytes()).unwrap_or_else(|p| panic!("{p}"));
    let config = validate(config, &registry).unwrap_or_else(|p| panic!("{p}"));
    let runtime = Runtime::start(config, registry, RuntimeOptions::default())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let changed = parse(stuck_config("2").to_string().as_bytes()).unwrap_or_else(|p| panic!("{p}"));

    let reload = runtime.apply(changed);
    let shutdown = async {
        stopped("stuck").await;
        let asked = tokio::time::Instant::now();
        let abandoned = runtime.shutdown().await;
        (asked.elapsed(), abandoned)
    };
    let (reloaded, (took, abandoned)) = tokio::join!(reload, shutdown);

    // Staging, then its revert, each an init timeout (60 s) before.
    assert!(
        took < CUT_SHORT,
        "the shutdown waited {took:?} for the update"
    );
    assert!(
        matches!(reloaded, Err(ReloadError::Stopped)),
        "the update was not cut short: {reloaded:?}"
    );
    // Its revert, abandoned after the close timeout, is no close; its
    // close answers.
    assert_eq!(abandoned, 0, "an abandoned close was counted");
}

#[tokio::test(start_paused = true)]
async fn stopping_reloads_cuts_one_whose_init_hangs_while_the_components_serve() {
    let runtime = started(&[("halt-store", &[])]).await;
    let uses: [(&str, &[&str]); 2] = [("halt-store", &[]), ("halt-hang", &["halt-store"])];

    let reload = runtime.apply(candidate(&uses, &[]));
    let stop = async {
        stopped("halt").await;
        runtime.stop_reloads();
        tokio::time::Instant::now()
    };
    let (reloaded, asked) = tokio::join!(reload, stop);

    assert!(
        asked.elapsed() < CUT_SHORT,
        "the reload held on {:?} after the stop",
        asked.elapsed()
    );
    assert!(
        matches!(reloaded, Err(ReloadError::Stopped)),
        "the reload should say the runtime stopped, got {reloaded:?}"
    );
    // Still serving the generation in force; a later reload is refused.
    let key = ComponentKey::new("custom", "halt-store");
    assert!(runtime.generation().get(&key).is_some(), "not serving");
    assert_eq!(
        of(&CLOSED, "halt"),
        ["halt-hang"],
        "only the undone one closed"
    );
    let later = runtime.apply(candidate(&[("halt-store", &[])], &[])).await;
    assert!(matches!(later, Err(ReloadError::Stopped)), "{later:?}");
    runtime.shutdown().await;
    assert_eq!(of(&CLOSED, "halt"), ["halt-hang", "halt-store"]);
}

#[tokio::test(start_paused = true)]
async fn a_shutdown_by_a_deadline_already_past_still_asks_each_close() {
    let uses: [(&str, &[&str]); 2] = [("past-store", &[]), ("past-user", &["past-store"])];
    let runtime = started(&uses).await;

    let abandoned = runtime.shutdown_by(tokio::time::Instant::now()).await;

    assert_eq!(abandoned, 0, "each close ends at once");
    assert_eq!(
        of(&CLOSED, "past"),
        ["past-user", "past-store"],
        "a close was never asked"
    );
}

#[tokio::test(start_paused = true)]
async fn a_reload_a_shutdown_cuts_while_it_warms_is_undone_not_committed() {
    let runtime = started(&[("warm-store", &[])]).await;
    // A subscription that never answers would hold the reload in its
    // warm (5 s), past the shutdown's wait for it (half of 4 s): the
    // shutdown cuts the warming instead.
    let (mut deaf, _) = runtime.running().live().warmer();
    let uses: [(&str, &[&str]); 2] = [("warm-store", &[]), ("warm-new", &["warm-store"])];

    let reload = runtime.apply(candidate(&uses, &[]));
    let shutdown = async {
        let offered = deaf.recv().await;
        let abandoned = runtime
            .shutdown_by(tokio::time::Instant::now() + Duration::from_secs(4))
            .await;
        (abandoned, offered)
    };
    let (reloaded, (abandoned, _offered)) = tokio::join!(reload, shutdown);

    assert!(
        matches!(reloaded, Err(ReloadError::Stopped)),
        "the reload should say the runtime stopped, got {reloaded:?}"
    );
    assert_eq!(
        abandoned, 0,
        "the reload cut while it warms is not left behind"
    );
    assert!(
        runtime.generation().is_empty(),
        "a generation was published after the empty one"
    );
    let mut closed = of(&CLOSED, "warm");
    closed.sort();
    assert_eq!(closed, ["warm-new", "warm-store"], "each closed once");
    assert_eq!(runtime.history()[0].outcome, Outcome::RolledBack);
}

/// A shutdown asked for is seen by whoever holds the runtime (a host that
/// then need not shut it down again).
#[tokio::test(start_paused = true)]
async fn a_shutdown_asked_for_is_seen() {
    let runtime = started(&[("seen-store", &[])]).await;
    assert!(!runtime.is_shutting_down());
    runtime.shutdown().await;
    assert!(runtime.is_shutting_down());
}
