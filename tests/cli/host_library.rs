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

/// Waits up to 5 s for `flag`; whether it was set by then.
async fn set_within_5s(flag: &AtomicBool) -> bool {
    tokio::time::timeout(Duration::from_secs(5), async {
        while !flag.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .is_ok()
}

/// Writes `config` as `rewire.json` in a new folder; the folder (kept
/// while the host runs) and the file's path.
fn config_file(config: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rewire.json");
    std::fs::write(&path, config).unwrap();
    (dir, path)
}

/// Set when a [`UsedStore`] is closed.
static USED_STORE_CLOSED: AtomicBool = AtomicBool::new(false);

/// A component another one uses (closed after it), recording its close.
#[derive(rewire::Component)]
#[component(kind = "probe", type = "test.host.used-store")]
struct UsedStore {}

#[async_trait]
impl Component for UsedStore {
    async fn close(&self) -> Result<(), ComponentError> {
        USED_STORE_CLOSED.store(true, Ordering::SeqCst);
        Ok(())
    }
}

/// A user of a [`UsedStore`] whose close takes 2 s.
#[derive(rewire::Component)]
#[component(kind = "probe", type = "test.host.slow-user")]
struct SlowUser {
    /// The store it uses.
    #[inject]
    _store: Option<ComponentHandle>,
}

#[async_trait]
impl Component for SlowUser {
    async fn close(&self) -> Result<(), ComponentError> {
        tokio::time::sleep(Duration::from_secs(2)).await;
        Ok(())
    }
}

/// A `Host::shutdown` cut short (its future dropped by a timeout) while a
/// user's close runs still closes the store it uses: the close goes on
/// in the background, to its bound. Before, the levels not reached yet
/// (the stores) were dropped without a close, and the drop's shutdown
/// found nothing left to close.
#[tokio::test]
async fn a_shutdown_cut_short_still_closes_the_stores() {
    let (_dir, config) = config_file(
        r#"{"components": {"probe": {
            "store": {"type": "test.host.used-store"},
            "user": {"type": "test.host.slow-user",
                     "componentRef": [{"type": "probe", "name": "store"}]}
        }}}"#,
    );
    let host = rewire::Host::start(&config).await.unwrap();
    let cut = tokio::time::timeout(Duration::from_millis(100), host.shutdown()).await;
    assert!(cut.is_err(), "the shutdown ended before the user's close");
    assert!(
        set_within_5s(&USED_STORE_CLOSED).await,
        "the store was not closed within 5 s of the cut-short shutdown"
    );
}

/// Set when a [`SlowToClose`] is closed.
static SLOW_TO_CLOSE_CLOSED: AtomicBool = AtomicBool::new(false);

/// Records its close, 200 ms after it is asked.
#[derive(rewire::Component)]
#[component(kind = "probe", type = "test.host.slow-to-close")]
struct SlowToClose {}

#[async_trait]
impl Component for SlowToClose {
    async fn close(&self) -> Result<(), ComponentError> {
        tokio::time::sleep(Duration::from_millis(200)).await;
        SLOW_TO_CLOSE_CLOSED.store(true, Ordering::SeqCst);
        Ok(())
    }
}

/// A host dropped at the end of `main` (an error returned by `?` after its
/// start) on a multi-thread runtime closes its components before the drop
/// returns, so before the runtime ends. Before, the drop only spawned the
/// shutdown, which the runtime's end cancelled at its first wait.
#[test]
fn a_host_dropped_as_main_returns_closes_its_components_before_the_runtime_ends() {
    let (_dir, config) =
        config_file(r#"{"components": {"probe": {"slow": {"type": "test.host.slow-to-close"}}}}"#);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let _host = rewire::Host::start(&config).await.unwrap();
    });
    drop(runtime);
    assert!(
        SLOW_TO_CLOSE_CLOSED.load(Ordering::SeqCst),
        "the component was not closed before the runtime ended"
    );
}

/// Set when a [`ClosedInLocalSet`] is closed.
static CLOSED_IN_LOCAL_SET: AtomicBool = AtomicBool::new(false);

/// Records its close, 100 ms after it is asked.
#[derive(rewire::Component)]
#[component(kind = "probe", type = "test.host.closed-in-local-set")]
struct ClosedInLocalSet {}

#[async_trait]
impl Component for ClosedInLocalSet {
    async fn close(&self) -> Result<(), ComponentError> {
        tokio::time::sleep(Duration::from_millis(100)).await;
        CLOSED_IN_LOCAL_SET.store(true, Ordering::SeqCst);
        Ok(())
    }
}

/// A host dropped in a `LocalSet`'s `run_until` on a multi-thread runtime
/// (where tokio refuses to block in place) neither panics nor leaves its
/// components running: the drop waits on a helper thread until they are
/// closed. Before, the drop panicked ("can call blocking only when running
/// on the multi-threaded runtime"), an abort were it unwinding already.
#[test]
fn a_host_dropped_in_a_local_set_closes_its_components_without_panicking() {
    let (_dir, config) = config_file(
        r#"{"components": {"probe": {"local": {"type": "test.host.closed-in-local-set"}}}}"#,
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let closed_by_drop = runtime.block_on(tokio::task::LocalSet::new().run_until(async {
        let host = rewire::Host::start(&config).await.unwrap();
        drop(host);
        CLOSED_IN_LOCAL_SET.load(Ordering::SeqCst)
    }));
    assert!(closed_by_drop, "the component was not closed by the drop");
}

/// Set in the child process of the unwinding `LocalSet` test.
const UNWINDING_CHILD: &str = "REWIRE_TEST_HOST_UNWINDING_LOCAL_SET_CHILD";

/// A host dropped in a `LocalSet`'s `run_until` while a panic unwinds (a
/// panic between its start and its shutdown) lets the panic go on to be
/// caught. Before, the drop panicked again, which aborted the process. In
/// a fresh process, whose abort fails the test alone.
#[test]
fn a_host_dropped_in_a_local_set_while_a_panic_unwinds_does_not_abort() {
    if !child::is_child(UNWINDING_CHILD) {
        let parent = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        return parent.block_on(child::run_alone(
            "host_library::a_host_dropped_in_a_local_set_while_a_panic_unwinds_does_not_abort",
            UNWINDING_CHILD,
            &[],
            &[],
        ));
    }
    let (_dir, config) = config_file(r#"{"components": {"state": {"cache": {"type": "memory"}}}}"#);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let caught = runtime.block_on(tokio::task::LocalSet::new().run_until(async {
        let host = rewire::Host::start(&config).await.unwrap();
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
            let _host = host;
            panic!("an error between the host's start and its shutdown");
        }))
    }));
    assert!(caught.is_err(), "the panic was not caught");
}

/// A host held by a task the multi-thread runtime drops as it shuts down
/// neither panics nor holds the runtime's end: with the runtime going,
/// its drop can only stop the reloads and say so.
#[test]
fn a_host_dropped_as_its_runtime_shuts_down_lets_it_end() {
    let (_dir, config) = config_file(r#"{"components": {"state": {"cache": {"type": "memory"}}}}"#);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (started, host_started) = tokio::sync::oneshot::channel();
    runtime.spawn(async move {
        let _host = rewire::Host::start(&config).await.unwrap();
        let _ = started.send(());
        std::future::pending::<()>().await;
    });
    runtime
        .block_on(async { tokio::time::timeout(Duration::from_secs(10), host_started).await })
        .expect("the host did not start within 10 s")
        .unwrap();
    let (ended, runtime_ended) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        drop(runtime);
        let _ = ended.send(());
    });
    assert!(
        runtime_ended.recv_timeout(Duration::from_secs(10)).is_ok(),
        "the runtime did not end within 10 s of its shutdown"
    );
}

/// Set in the child process of the second-signal test.
const SECOND_SIGNAL_CHILD: &str = "REWIRE_TEST_HOST_SECOND_SIGNAL_CHILD";

/// Set once a [`HangsInClose`] close has started.
static CLOSE_STARTED: AtomicBool = AtomicBool::new(false);

/// A component whose close takes 20 s (cut at the close timeout).
#[derive(rewire::Component)]
#[component(kind = "probe", type = "test.host.hangs-in-close")]
struct HangsInClose {}

#[async_trait]
impl Component for HangsInClose {
    async fn close(&self) -> Result<(), ComponentError> {
        CLOSE_STARTED.store(true, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_secs(20)).await;
        Ok(())
    }
}

/// Sends SIGTERM to this process (with `kill`).
fn terminate_self() {
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &std::process::id().to_string()])
        .status();
}

/// Longer than the 500 ms after a first stop signal in which a second is
/// the same stop request.
const AFTER_THE_SAME_STOP_WINDOW: Duration = Duration::from_secs(1);

/// A second SIGTERM while `Host::run_until_stopped` shuts down (a close
/// hanging; sent after the window in which it would be the same stop
/// request) makes it return at once, saying so, as `rewire run` does,
/// counting the shutdown left undone as an abandoned close.
/// Before: the second signal was ignored, and the shutdown waited out
/// every close's bound. In a fresh process, which signals itself.
#[tokio::test(flavor = "multi_thread")]
async fn a_second_signal_cuts_run_until_stopped_short() {
    if !child::is_child(SECOND_SIGNAL_CHILD) {
        let mut command = std::process::Command::new(std::env::current_exe().unwrap());
        command
            .args([
                "--exact",
                "host_library::a_second_signal_cuts_run_until_stopped_short",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(SECOND_SIGNAL_CHILD, "1")
            .env("NO_COLOR", "1")
            .env("RUST_LOG", "info");
        let out = tokio::task::spawn_blocking(move || testkit::output(&mut command))
            .await
            .unwrap();
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert!(
            out.status.success() && stdout.contains("1 passed"),
            "the child failed:\n{stdout}\n{stderr}"
        );
        assert!(
            stderr.contains("Shutdown cut short by a second signal")
                || stdout.contains("Shutdown cut short by a second signal"),
            "the second signal was not heeded:\n{stdout}\n{stderr}"
        );
        return;
    }
    rewire::init_logging();
    let (_dir, config) = config_file(
        r#"{"components": {"probe": {"hangs": {"type": "test.host.hangs-in-close"}}}}"#,
    );
    let host = rewire::Host::start(&config).await.unwrap();
    // SIGTERM is handled (not the default, ending the process) from here on.
    let _handled =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).unwrap();
    let signaller = tokio::spawn(async {
        // The first signal, until the shutdown it starts reaches the close
        // (one sent before `run_until_stopped` listens is not seen by it).
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !CLOSE_STARTED.load(Ordering::SeqCst) && tokio::time::Instant::now() < deadline {
            terminate_self();
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // Past the window in which a second signal is the same stop
        // request (500 ms from the first), the close still hanging.
        tokio::time::sleep(AFTER_THE_SAME_STOP_WINDOW).await;
        terminate_self();
    });
    let abandoned = host.run_until_stopped().await;
    signaller.abort();
    assert_eq!(abandoned, 1, "the shutdown cut short was not counted");
}

/// Set in the child process of the back-to-back signals test.
const BACK_TO_BACK_CHILD: &str = "REWIRE_TEST_HOST_BACK_TO_BACK_SIGNALS_CHILD";

/// Set once a [`ClosedAfterTwoSignals`] close has started.
static TWO_SIGNALS_CLOSE_STARTED: AtomicBool = AtomicBool::new(false);
/// Set when a [`ClosedAfterTwoSignals`] is closed.
static CLOSED_AFTER_TWO_SIGNALS: AtomicBool = AtomicBool::new(false);

/// Records its close, 300 ms after it is asked (a shutdown a second
/// signal could cut short).
#[derive(rewire::Component)]
#[component(kind = "probe", type = "test.host.closed-after-two-signals")]
struct ClosedAfterTwoSignals {}

#[async_trait]
impl Component for ClosedAfterTwoSignals {
    async fn close(&self) -> Result<(), ComponentError> {
        TWO_SIGNALS_CLOSE_STARTED.store(true, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(300)).await;
        CLOSED_AFTER_TWO_SIGNALS.store(true, Ordering::SeqCst);
        Ok(())
    }
}

/// This test binary, to run the test `name` alone with `marker` set and
/// the logs at info.
fn child_command(name: &str, marker: &str) -> std::process::Command {
    let mut command = std::process::Command::new(std::env::current_exe().unwrap());
    command
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(marker, "1")
        .env("NO_COLOR", "1")
        .env("RUST_LOG", "info");
    command
}

/// SIGINT and SIGTERM back to back (Ctrl-C reaching the process group
/// while a launcher sends SIGTERM too) are one stop request to
/// `Host::run_until_stopped`: the shutdown runs to its end, the component
/// closed, and it returns 0 abandoned closes. Before: the second signal
/// cut the shutdown short (or, the race unbiased, dropped it before it
/// began: the drop's minute-long shutdown, "dropped without
/// `Host::shutdown`" logged). In a fresh process, which signals itself.
#[tokio::test(flavor = "multi_thread")]
async fn sigint_and_sigterm_back_to_back_are_one_stop_request_to_run_until_stopped() {
    if !child::is_child(BACK_TO_BACK_CHILD) {
        let mut command = child_command(
            "host_library::sigint_and_sigterm_back_to_back_are_one_stop_request_to_run_until_stopped",
            BACK_TO_BACK_CHILD,
        );
        let out = tokio::task::spawn_blocking(move || testkit::output(&mut command))
            .await
            .unwrap();
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert!(
            out.status.success() && stdout.contains("1 passed"),
            "the child failed:\n{stdout}\n{stderr}"
        );
        for unwanted in ["cut short", "dropped without"] {
            assert!(
                !stdout.contains(unwanted) && !stderr.contains(unwanted),
                "{unwanted}:\n{stdout}\n{stderr}"
            );
        }
        return;
    }
    rewire::init_logging();
    let (_dir, config) = config_file(
        r#"{"components": {"probe": {"two": {"type": "test.host.closed-after-two-signals"}}}}"#,
    );
    let host = rewire::Host::start(&config).await.unwrap();
    // Both signals are handled (not their default, ending the process)
    // from here on; `run_until_stopped` may listen after the first pair.
    use tokio::signal::unix::{signal, SignalKind};
    let _handled = (
        signal(SignalKind::interrupt()).unwrap(),
        signal(SignalKind::terminate()).unwrap(),
    );
    let signaller = tokio::spawn(async {
        // A pair, from one shell (`kill` is a builtin), until the shutdown
        // it starts reaches the close (a pair sent before
        // `run_until_stopped` listens is not seen by it); a pair after the
        // one seen comes within 100 ms of it.
        let pid = std::process::id().to_string();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !TWO_SIGNALS_CLOSE_STARTED.load(Ordering::SeqCst)
            && tokio::time::Instant::now() < deadline
        {
            let _ = std::process::Command::new("sh")
                .args(["-c", "kill -INT \"$1\" && kill -TERM \"$1\"", "sh", &pid])
                .status();
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let abandoned = host.run_until_stopped().await;
    signaller.abort();
    assert_eq!(abandoned, 0, "closes abandoned");
    assert!(
        CLOSED_AFTER_TWO_SIGNALS.load(Ordering::SeqCst),
        "the component was not closed"
    );
}

/// Set in the child process of the stop-during-start test.
const STOPPED_STARTING_CHILD: &str = "REWIRE_TEST_HOST_STOPPED_WHILE_STARTING_CHILD";

/// Set when a [`StartedBeforeTheHang`] is closed.
static STARTED_BEFORE_THE_HANG_CLOSED: AtomicBool = AtomicBool::new(false);
/// Set once a [`HangsInInit`] init has started.
static INIT_HANGING: AtomicBool = AtomicBool::new(false);

/// A store the hanging component uses (so started first), recording its
/// close.
#[derive(rewire::Component)]
#[component(kind = "probe", type = "test.host.started-before-the-hang")]
struct StartedBeforeTheHang {}

#[async_trait]
impl Component for StartedBeforeTheHang {
    async fn close(&self) -> Result<(), ComponentError> {
        STARTED_BEFORE_THE_HANG_CLOSED.store(true, Ordering::SeqCst);
        Ok(())
    }
}

/// A user of a [`StartedBeforeTheHang`] whose `init` never ends (a store
/// dialling a server that never answers, for up to the init timeout).
#[derive(rewire::Component)]
#[component(kind = "probe", type = "test.host.hangs-in-init")]
struct HangsInInit {
    /// The store it uses.
    #[inject]
    _store: Option<ComponentHandle>,
}

#[async_trait]
impl Component for HangsInInit {
    async fn init(&mut self, _cx: &InitContext) -> Result<(), ComponentError> {
        INIT_HANGING.store(true, Ordering::SeqCst);
        std::future::pending().await
    }
}

/// SIGTERM while `Host::start_until` waits on an `init` that hangs, the
/// signal its `stop`: the start is cut short, the store started before
/// is closed, and the start returns `StartError::Cancelled` saying every
/// close ended. Before: `Host::start` took no stop, so a host could only
/// let SIGTERM end the process with nothing closed, or drop the start and
/// leave the started store unclosed. In a fresh process, which signals
/// itself.
#[tokio::test(flavor = "multi_thread")]
async fn sigterm_during_host_start_until_closes_what_started() {
    if !child::is_child(STOPPED_STARTING_CHILD) {
        return child::run_alone(
            "host_library::sigterm_during_host_start_until_closes_what_started",
            STOPPED_STARTING_CHILD,
            &[],
            &[],
        )
        .await;
    }
    let (_dir, config) = config_file(
        r#"{"components": {"probe": {
            "store": {"type": "test.host.started-before-the-hang"},
            "hanging": {"type": "test.host.hangs-in-init",
                        "componentRef": [{"type": "probe", "name": "store"}]}
        }}}"#,
    );
    let mut sigterm =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).unwrap();
    let stop = async move {
        sigterm.recv().await;
    };
    let signaller = tokio::spawn(async {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !INIT_HANGING.load(Ordering::SeqCst) && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        terminate_self();
    });
    let started = tokio::time::timeout(
        Duration::from_secs(20),
        rewire::Host::start_until(&config, stop),
    )
    .await
    .expect("the start did not end within 20 s of the signal");
    signaller.await.unwrap();
    match started {
        Err(rewire::StartError::Cancelled { abandoned: 0 }) => {}
        Err(error) => panic!("not the cancelled start expected: {error}"),
        Ok(host) => {
            host.shutdown().await;
            panic!("the host started despite the stop");
        }
    }
    assert!(
        STARTED_BEFORE_THE_HANG_CLOSED.load(Ordering::SeqCst),
        "the store started before the stop was not closed"
    );
}
