//! Tasks that each assemble one component (at start-up, or in a reload's
//! level): joined as they finish, a panic failing the component it
//! happened in, by name.

use std::collections::HashMap;
use std::future::Future;

use tokio::task::{Id, JoinSet};

use crate::assemble::{AssemblyContext, ComponentFailure, FailedStep};
use crate::component::ComponentKey;
use crate::guarded::panic_message;

/// One task per component, each known by its key.
pub(crate) struct ComponentTasks<T> {
    tasks: JoinSet<T>,
    keys: HashMap<Id, ComponentKey>,
}

impl<T: Send + 'static> ComponentTasks<T> {
    pub(crate) fn new() -> Self {
        Self {
            tasks: JoinSet::new(),
            keys: HashMap::new(),
        }
    }

    /// Runs `task`, which assembles `key`, on a task of its own.
    pub(crate) fn spawn(
        &mut self,
        key: ComponentKey,
        task: impl Future<Output = T> + Send + 'static,
    ) {
        let spawned = self.tasks.spawn(task);
        self.keys.insert(spawned.id(), key);
    }

    /// The next task to finish: its output, or the failure of the
    /// component it was assembling when it panicked (text scrubbed by
    /// `cx`). `None` once every task is joined.
    pub(crate) async fn join_next(
        &mut self,
        cx: &AssemblyContext,
    ) -> Option<Result<T, ComponentFailure>> {
        let joined = self.tasks.join_next_with_id().await?;
        Some(match joined {
            Ok((id, output)) => {
                self.keys.remove(&id);
                Ok(output)
            }
            Err(err) => {
                let key = self.keys.remove(&err.id());
                let message = if err.is_panic() {
                    panic_message(&*err.into_panic()).to_string()
                } else {
                    "cancelled".to_string()
                };
                Err(match key {
                    Some(key) => cx.fail(&key, FailedStep::Panicked, message),
                    None => ComponentFailure {
                        component: None,
                        step: FailedStep::Panicked,
                        message,
                    },
                })
            }
        })
    }
}
