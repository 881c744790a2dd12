//! Tasks that each assemble one component (at start-up, or in a reload's
//! level): joined as they finish, a panic failing the component it
//! happened in, by name.

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use tokio::task::{Id, JoinSet};
use tracing::Instrument;

use crate::assemble::{AssemblyContext, ComponentFailure, FailedStep};
use crate::component::{ComponentError, ComponentKey};

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

/// The text a panic was raised with.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a panic without a message")
}

/// How a call into a component made with [`guarded`] ended.
pub(crate) enum Answer<T> {
    /// It answered.
    Answered(Result<T, ComponentError>),
    /// No answer within the time allowed; the call was abandoned.
    TimedOut,
    /// It panicked, with this message.
    Panicked(String),
}

/// Runs `call` (a call into a component: an in-place update, a close) in
/// a task of its own, in the current span, so a panic in it fails that
/// call, not its caller; aborts it if it does not answer `within`.
pub(crate) async fn guarded<T: Send + 'static>(
    call: impl Future<Output = Result<T, ComponentError>> + Send + 'static,
    within: Duration,
) -> Answer<T> {
    let mut task = tokio::spawn(call.in_current_span());
    match tokio::time::timeout(within, &mut task).await {
        Err(_) => {
            task.abort();
            Answer::TimedOut
        }
        Ok(Ok(answer)) => Answer::Answered(answer),
        Ok(Err(err)) if err.is_panic() => {
            Answer::Panicked(panic_message(&*err.into_panic()).to_string())
        }
        Ok(Err(err)) => Answer::Panicked(err.to_string()),
    }
}
