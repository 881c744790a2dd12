//! The status asks every component for its readiness: one whose
//! `readiness` panics is shown as having panicked, not as slow.

use crate::support::reload as reload_support;

use reload_support::{apply_ok, start};

fn config(panic_ready: bool) -> String {
    format!(
        r#"{{"appId": "status-readiness", "components": {{"probe": {{
            "p": {{"type": "test.reload.probe",
                   "metadata": {{"tag": "srp", "inPlace": true, "panicReady": {panic_ready}}}}}
        }}}}}}"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_readiness_that_panics_during_status_says_it_panicked() {
    let runtime = start(&config(false)).await;
    // Updated in place: from now on, its readiness panics.
    apply_ok(&runtime, &config(true)).await;

    let status = runtime.status().await;
    let probe = status
        .components
        .iter()
        .find(|c| c.name == "p")
        .expect("no probe/p in the status");
    assert_eq!(probe.state, "not_ready");
    let reason = probe.reason.clone().unwrap_or_default();
    assert!(
        reason.starts_with("readiness panicked: probe srp exploded while asked if ready"),
        "{reason}"
    );
    runtime.shutdown().await;
}
