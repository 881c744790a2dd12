//! Components on the same level of the graph start concurrently: two inits
//! that wait for each other can only both finish if they run at once.

use crate::support;

use std::sync::OnceLock;
use std::time::Duration;

use rewire::prelude::*;
use tokio::sync::Barrier;

fn barrier() -> &'static Barrier {
    static BARRIER: OnceLock<Barrier> = OnceLock::new();
    BARRIER.get_or_init(|| Barrier::new(2))
}

/// Waits at the shared barrier during init.
#[derive(rewire::Component)]
#[component(kind = "worker", type = "test.rendezvous")]
struct Rendezvous {}

#[async_trait]
impl Component for Rendezvous {
    async fn init(&mut self, _cx: &InitContext) -> Result<(), ComponentError> {
        barrier().wait().await;
        Ok(())
    }
}

#[tokio::test(flavor = "current_thread")]
async fn same_level_components_start_concurrently() {
    let start = support::start(
        r#"{"components": {"worker": {
            "left": {"type": "test.rendezvous"},
            "right": {"type": "test.rendezvous"}
        }}}"#,
    );
    let runtime = tokio::time::timeout(Duration::from_secs(10), start)
        .await
        .expect("start deadlocked: the two inits ran one after the other")
        .expect("start failed");
    assert_eq!(runtime.generation().len(), 2);
    runtime.shutdown().await;
}
