//! What `Host` sets up for a program using rewire as a library, which
//! never runs `rewire::main()`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rewire::prelude::*;
use rustls::crypto::CryptoProvider;

use crate::support::child;

/// Set in the child process the test runs itself in.
const CHILD: &str = "REWIRE_TEST_HOST_PROVIDER_CHILD";

/// `Host::start` installs ring as the process's rustls provider, as
/// `rewire::main()` does: redis-rs builds its TLS configuration at every
/// connect without naming one, and without a process default rustls
/// panics there when another dependency of the host (reqwest 0.13 with
/// its defaults) enables aws-lc-rs too. In a fresh process, where nothing
/// installed one before.
#[tokio::test]
async fn starting_a_host_installs_the_ring_provider() {
    if !child::is_child(CHILD) {
        return child::run_alone(
            "host_library::starting_a_host_installs_the_ring_provider",
            CHILD,
            &[],
            &[],
        )
        .await;
    }
    assert!(
        CryptoProvider::get_default().is_none(),
        "a provider was installed before the host started"
    );
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("rewire.json");
    std::fs::write(
        &config,
        r#"{"components": {"state": {"cache": {"type": "memory"}}}}"#,
    )
    .unwrap();
    let host = rewire::Host::start(&config).await.unwrap();
    assert!(
        CryptoProvider::get_default().is_some(),
        "no process rustls provider once the host started"
    );
    host.shutdown().await;
}

/// Set when a [`ClosedOnDrop`] is closed.
static CLOSED_ON_DROP: AtomicBool = AtomicBool::new(false);

/// Records its close.
#[derive(rewire::Component)]
#[component(kind = "probe", type = "test.closed-on-drop")]
struct ClosedOnDrop {}

#[async_trait]
impl Component for ClosedOnDrop {
    async fn close(&self) -> Result<(), ComponentError> {
        CLOSED_ON_DROP.store(true, Ordering::SeqCst);
        Ok(())
    }
}

/// A host dropped without `Host::shutdown` (an error returned between its
/// start and its shutdown) still closes its components, in the
/// background: their tasks do not run on beside the next host.
#[tokio::test]
async fn a_host_dropped_without_shutdown_closes_its_components() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("rewire.json");
    std::fs::write(
        &config,
        r#"{"components": {"probe": {"dropped": {"type": "test.closed-on-drop"}}}}"#,
    )
    .unwrap();
    let host = rewire::Host::start(&config).await.unwrap();
    assert!(
        !CLOSED_ON_DROP.load(Ordering::SeqCst),
        "closed while running"
    );
    drop(host);
    let closed = tokio::time::timeout(Duration::from_secs(5), async {
        while !CLOSED_ON_DROP.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(
        closed.is_ok(),
        "the dropped host's component was not closed within 5 s"
    );
}
