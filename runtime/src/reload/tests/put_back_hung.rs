//! Putting back staged updates that panicked when applied, whose re-apply
//! of the previous metadata never answers: the re-applies run at once,
//! so the reload (and its lock) is held about one init timeout, not one
//! per component.

use std::time::Duration;

use super::*;
use crate::component::{PendingInPlace, StagedInPlace};

/// Stages every update to panic when applied; never answers an update
/// made at once (how the previous metadata is re-applied).
struct Hung;

#[async_trait]
impl Component for Hung {
    fn as_in_place(&self) -> Option<&dyn InPlaceUpdate> {
        Some(self)
    }
}

#[async_trait]
impl InPlaceUpdate for Hung {
    async fn update_in_place(&self, _: &Metadata) -> Result<InPlace, ComponentError> {
        std::future::pending().await
    }

    async fn stage_in_place(&self, _: &Metadata) -> Result<StagedInPlace, ComponentError> {
        let apply = PendingInPlace::new(|| panic!("staged update exploded when applied"));
        Ok(StagedInPlace::Deferred(apply))
    }
}

impl Inject for Hung {}

impl Buildable for Hung {
    fn into_instance(self: Box<Self>) -> Instance {
        Instance::Custom(Arc::new(*self))
    }
}

/// `custom/h0` to `custom/h2` (`hung`), each at `rev`.
fn config(rev: u32) -> Config {
    let custom: Map<String, Value> = (0..3)
        .map(|i| {
            let spec = serde_json::json!({"type": "hung", "metadata": {"rev": rev}});
            (format!("h{i}"), spec)
        })
        .collect();
    let text = serde_json::json!({"components": {"custom": custom}}).to_string();
    parse(text.as_bytes()).unwrap_or_else(|p| panic!("{p}"))
}

#[tokio::test(start_paused = true)]
async fn hung_re_applies_of_updates_put_back_share_one_init_timeout() {
    let mut registry = registry();
    registry.register(ComponentDescriptor {
        kind: "custom",
        type_name: "hung",
        description: "",
        example_metadata: "{}",
        validate: any_metadata,
        build: |_| Ok(Box::new(Hung)),
        check_refs: None,
        in_place: None,
    });
    let valid = validate(config(1), &registry).unwrap_or_else(|p| panic!("{p}"));
    let redactor = Redactor::default();
    let timeouts = StartTimeouts {
        init: Duration::from_secs(1),
        ..StartTimeouts::default()
    };
    let running = RunningSet::start(valid, &registry, timeouts, &redactor).await;
    let running = running.unwrap_or_else(|f| panic!("{f:?}"));
    let settings = ReloadSettings {
        timeouts,
        drain_grace: Duration::from_secs(1),
    };
    let reloader = Arc::new(Reloader::new(
        running,
        Arc::new(registry),
        settings,
        redactor,
        10,
    ));

    let started = tokio::time::Instant::now();
    let record = reloader
        .reload(ReloadRequest::new(config(2), Trigger::Api))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let took = started.elapsed();

    let error = record.error.unwrap_or_default();
    for i in 0..3 {
        let key = format!("custom/h{i}");
        assert_eq!(record.actions.get(&key), Some(&Action::Failed), "{key}");
        let line = error.lines().find(|line| line.starts_with(&key));
        let line = line.unwrap_or_else(|| panic!("no line for {key}: {error}"));
        assert!(
            line.contains("re-applying its previous metadata failed too"),
            "{line}"
        );
    }
    // One init timeout (1 s), not three.
    assert!(took < Duration::from_secs(2), "took {took:?}");
    reloader.shutdown(None).await;
}
