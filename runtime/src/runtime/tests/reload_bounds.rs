//! How long a reload may hold the runtime when its components do not
//! answer (paused clock: every wait is virtual): a shutdown cuts short a
//! reload whose `init` hangs, which rolls back, instead of waiting out the
//! init timeout; a rollback closes a level's built instances at once, by
//! one deadline, not one close timeout after another.

use super::*;
use crate::assemble::FailedStep;
use crate::reload::Outcome;

/// `components` (see [`declared`]) as a candidate to apply.
fn candidate(components: &[(&str, &[&str])], close_ms: &[(&str, u64)]) -> crate::config::Config {
    let text = json!({"components": {"custom": declared(components, close_ms)}}).to_string();
    parse(text.as_bytes()).unwrap_or_else(|p| panic!("{p}"))
}

async fn started(components: &[(&str, &[&str])]) -> Runtime {
    let config = valid(&json!({"components": {"custom": declared(components, &[])}}));
    Runtime::start(config, registry(), RuntimeOptions::default())
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Far below the init timeout (30 s), far above cutting a reload short.
const CUT_SHORT: Duration = Duration::from_secs(10);

#[tokio::test(start_paused = true)]
async fn a_shutdown_cuts_short_a_reload_whose_init_hangs_and_it_rolls_back() {
    let runtime = started(&[("cut-store", &[])]).await;
    // Added by the reload, its `init` never ends (it tells `cut`'s stop).
    let adding = candidate(&[("cut-store", &[]), ("cut-hang", &["cut-store"])], &[]);

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
    assert_eq!(abandoned, 0);
    let Err(ReloadError::RolledBack(failures)) = reloaded else {
        panic!("the reload should roll back, got {reloaded:?}");
    };
    let cut = ComponentKey::new("custom", "cut-hang");
    assert!(
        failures
            .iter()
            .any(|f| f.component.as_ref() == Some(&cut) && f.step == FailedStep::Cancelled),
        "not cut short: {failures:?}"
    );
    let history = runtime.history();
    assert_eq!(history.len(), 1, "the reload was not recorded");
    assert_eq!(history[0].outcome, Outcome::RolledBack);
    let mut closed = of(&CLOSED, "cut");
    closed.sort();
    assert_eq!(closed, ["cut-hang", "cut-store"], "each closed once");
}
