//! Retiring replaced instances: each is closed once its last in-flight user
//! has let go, or after a grace period.

use std::sync::Arc;
use std::time::Duration;

use crate::component::ComponentKey;
use crate::running::{close_one, Running};

/// How often the holders of a retired instance are counted.
const POLL: Duration = Duration::from_millis(5);

/// Closes `retired` (in the order given), each after its users let go or
/// `grace` passes. Runs in the background.
pub(crate) fn spawn_drain(retired: Vec<(ComponentKey, Arc<Running>)>, grace: Duration) {
    if retired.is_empty() {
        return;
    }
    tokio::spawn(async move {
        for (key, running) in retired {
            let instance = &running.assembled.instance;
            let deadline = tokio::time::Instant::now() + grace;
            // One holder is `running` itself.
            while instance.holders() > 1 && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(POLL).await;
            }
            let holders = instance.holders();
            if holders > 1 {
                tracing::warn!(component = %key, holders = holders - 1, ?grace, "Closing a replaced instance still in use after the grace period.");
            }
            close_one(&key, instance, &running.assembled.shutdown).await;
        }
    });
}
