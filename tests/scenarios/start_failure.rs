//! A component whose init fails stops start-up with an error naming it; it
//! is closed (to release what it took), then everything started before it,
//! users before their stores.

use crate::support;

use std::sync::Mutex;
use std::time::Duration;

use rewire::prelude::*;
use rewire::{FailedStep, RuntimeOptions, StartError, StartTimeouts};
use serde::Deserialize;

static CLOSED: Mutex<Vec<String>> = Mutex::new(Vec::new());

#[derive(Deserialize)]
struct Meta {
    name: String,
    #[serde(default)]
    fail: bool,
    #[serde(default)]
    hang: bool,
    #[serde(default)]
    panic: bool,
    /// Waits once before panicking (so the panic is in a spawned task).
    #[serde(default)]
    wait_first: bool,
}

/// Records its close; fails, hangs or panics in init when told to.
#[derive(rewire::Component)]
#[component(kind = "probe", type = "test.probe")]
struct Probe {
    #[metadata]
    meta: Meta,
    #[inject]
    upstream: Option<ComponentHandle>,
}

#[async_trait]
impl Component for Probe {
    async fn init(&mut self, _cx: &InitContext) -> Result<(), ComponentError> {
        if self.meta.hang {
            std::future::pending::<()>().await;
        }
        if self.meta.wait_first {
            tokio::task::yield_now().await;
        }
        if self.meta.panic {
            panic!("init exploded");
        }
        if self.meta.fail {
            return Err(ComponentError::new("backend refused the connection"));
        }
        Ok(())
    }

    async fn close(&self) -> Result<(), ComponentError> {
        CLOSED
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(self.meta.name.clone());
        Ok(())
    }
}

fn closed_of(prefix: &str) -> Vec<String> {
    CLOSED
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .filter(|n| n.starts_with(prefix))
        .cloned()
        .collect()
}

#[tokio::test]
async fn init_failure_names_the_component_and_closes_what_started() {
    let result = support::start(
        r#"{"components": {"probe": {
            "base": {"type": "test.probe", "metadata": {"name": "f-base"}},
            "middle": {"type": "test.probe", "metadata": {"name": "f-middle"},
                       "componentRef": [{"type": "probe", "name": "base"}]},
            "broken": {"type": "test.probe", "metadata": {"name": "f-broken", "fail": true},
                       "componentRef": [{"type": "probe", "name": "middle"}]},
            "never": {"type": "test.probe", "metadata": {"name": "f-never"},
                      "componentRef": [{"type": "probe", "name": "broken"}]}
        }}}"#,
    )
    .await;
    let Err(StartError::Failed(failures)) = result else {
        panic!("start should fail");
    };
    assert_eq!(failures.len(), 1);
    assert_eq!(
        failures[0]
            .component
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default(),
        "probe/broken"
    );
    assert_eq!(failures[0].step, FailedStep::Init);
    assert_eq!(
        failures[0].to_string(),
        "probe/broken: init failed: backend refused the connection"
    );
    assert_eq!(
        closed_of("f-"),
        ["f-broken", "f-middle", "f-base"],
        "the failed one is closed to release what it took, then the started ones in reverse order; never-started ones untouched"
    );
}

#[tokio::test]
async fn hanging_init_times_out() {
    let options = RuntimeOptions {
        timeouts: StartTimeouts {
            init: Duration::from_millis(200),
            ..StartTimeouts::default()
        },
        ..RuntimeOptions::default()
    };
    let config = support::valid(
        r#"{"components": {"probe": {
            "ok": {"type": "test.probe", "metadata": {"name": "h-ok"}},
            "stuck": {"type": "test.probe", "metadata": {"name": "h-stuck", "hang": true},
                      "componentRef": [{"type": "probe", "name": "ok"}]}
        }}}"#,
    );
    let result = rewire::Runtime::start(config, rewire::Registry::collected(), options).await;
    let Err(StartError::Failed(failures)) = result else {
        panic!("start should fail");
    };
    assert_eq!(
        failures[0]
            .component
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default(),
        "probe/stuck"
    );
    assert_eq!(failures[0].step, FailedStep::InitTimeout);
    assert_eq!(
        closed_of("h-"),
        ["h-stuck", "h-ok"],
        "the abandoned init is closed too"
    );
}

#[tokio::test]
async fn a_panicking_init_fails_start_naming_the_component() {
    for (name, wait_first) in [("p-now", false), ("p-later", true)] {
        let result = support::start(&format!(
            r#"{{"components": {{"probe": {{
                "ok": {{"type": "test.probe", "metadata": {{"name": "{name}-ok"}}}},
                "bomb": {{"type": "test.probe",
                          "metadata": {{"name": "{name}-bomb", "panic": true, "wait_first": {wait_first}}}}}
            }}}}}}"#
        ))
        .await;
        let Err(StartError::Failed(failures)) = result else {
            panic!("{name}: start should fail");
        };
        assert_eq!(failures.len(), 1, "{name}: {failures:?}");
        assert_eq!(failures[0].step, FailedStep::Panicked, "{name}");
        assert_eq!(
            failures[0].to_string(),
            "probe/bomb: panicked: init exploded",
            "{name}"
        );
        assert_eq!(
            closed_of(&format!("{name}-")),
            [format!("{name}-ok")],
            "{name}: what started is closed"
        );
    }
}
