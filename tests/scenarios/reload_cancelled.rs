//! A reload whose caller goes away (a control-plane client that times out
//! and drops the request) must still end in a consistent state: either the
//! candidate is committed whole, or everything it did is undone — never an
//! in-place update left applied under the old generation, nor a built
//! instance left open.

use crate::support::reload as reload_support;

use std::time::Duration;

use reload_support::{candidate, closes, inits, key, probe, start};
use rewire::{Action, Outcome};

/// `ip` takes changes in place; the candidate adds `extra` and `slow`
/// (whose init takes 500 ms and which uses `extra`, so it is built after).
fn config(rev: u32, added: bool) -> String {
    let added = if added {
        r#", "extra": {"type": "test.reload.probe", "metadata": {"tag": "cx-extra"}},
             "slow": {"type": "test.reload.probe", "metadata": {"tag": "cx-slow", "initDelayMs": 500},
                      "componentRef": [{"type": "probe", "name": "extra"}]}"#
    } else {
        ""
    };
    format!(
        r#"{{"appId": "cancelled", "components": {{"probe": {{
            "ip": {{"type": "test.reload.probe", "metadata": {{"tag": "cx-ip", "inPlace": true, "rev": {rev}}}}}
            {added}
        }}}}}}"#
    )
}

/// Committed: generation 2 serves the whole candidate.
fn committed(runtime: &rewire::Runtime) -> bool {
    let generation = runtime.generation();
    generation.number == 2
        && generation.get(&key("probe/slow")).is_some()
        && probe(runtime, "ip").meta().rev == 2
        && runtime
            .history()
            .last()
            .is_some_and(|r| r.outcome == Outcome::Applied)
}

/// Undone: generation 1 as before, in-place update reverted, what was
/// built closed.
fn undone(runtime: &rewire::Runtime) -> bool {
    runtime.generation().number == 1
        && probe(runtime, "ip").meta().rev == 1
        && closes("cx-extra") == inits("cx-extra")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoned_reload_is_committed_or_undone() {
    let runtime = start(&config(1, false)).await;

    // The caller gives up while `slow` is still in init.
    let abandoned = tokio::time::timeout(
        Duration::from_millis(100),
        runtime.apply(candidate(&config(2, true))),
    )
    .await;
    assert!(
        abandoned.is_err(),
        "the reload should still be running after 100 ms"
    );

    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    while !(committed(&runtime) || undone(&runtime)) {
        if tokio::time::Instant::now() >= deadline {
            panic!(
                "inconsistent after an abandoned reload: generation {}, probe/ip rev {} (running config says {}), \
                 probe/extra inits {} closes {}, {} reload(s) recorded",
                runtime.generation().number,
                probe(&runtime, "ip").meta().rev,
                runtime.config().config.components[&key("probe/ip")].metadata["rev"],
                inits("cx-extra"),
                closes("cx-extra"),
                runtime.history().len(),
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // Either way, re-applying the old configuration yields exactly it.
    let record = runtime.apply(candidate(&config(1, false))).await.unwrap();
    assert_ne!(record.outcome, Outcome::RolledBack);
    assert_eq!(
        probe(&runtime, "ip").meta().rev,
        1,
        "probe/ip does not serve the running configuration"
    );
    if record.outcome == Outcome::Applied {
        assert_eq!(
            reload_support::action(&record, "probe/slow"),
            Action::Removed
        );
    }
    runtime.shutdown().await;
}
