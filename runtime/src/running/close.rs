//! Closing: one component, or a whole set in reverse start order.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::Components;
use crate::assembly_tasks::{guarded, Answer};
use crate::component::ComponentKey;
use crate::handle::Instance;
use crate::redact::Redactor;

/// The longest a component's `close` may take. Past it the close is
/// abandoned (its task aborted) and the caller goes on: a rolled-back
/// reload, a drain, a shutdown or a failed start-up is never held by one
/// component that does not let go.
pub(crate) const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// Closes the components of `levels` found in `components`, last level
/// first.
pub(crate) async fn close_in_reverse(levels: &[Vec<ComponentKey>], components: &mut Components) {
    for level in levels.iter().rev() {
        for key in level.iter().rev() {
            if let Some(r) = components.remove(key) {
                close_one(key, &r.assembled.instance, &r.assembled.shutdown).await;
            }
        }
    }
}

/// Cancels a component's background work and closes it, in a task of its
/// own: a `close` that panics or does not end within [`CLOSE_TIMEOUT`] is
/// logged, and the caller goes on.
pub(crate) async fn close_one(
    key: &ComponentKey,
    instance: &Instance,
    shutdown: &CancellationToken,
) {
    shutdown.cancel();
    let component = instance.component();
    match guarded(async move { component.close().await }, CLOSE_TIMEOUT).await {
        Answer::Answered(Ok(())) => tracing::info!(component = %key, "Component closed."),
        Answer::Answered(Err(err)) => {
            let error = Redactor::shared().scrub(&err.to_string());
            tracing::warn!(component = %key, error = %error, "Component close failed.")
        }
        Answer::TimedOut => {
            tracing::warn!(component = %key, timeout = ?CLOSE_TIMEOUT, "Component close did not end in time; abandoned.")
        }
        Answer::Panicked(message) => {
            let error = Redactor::shared().scrub(&message);
            tracing::error!(component = %key, error = %error, "Component close panicked.")
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use async_trait::async_trait;
    use tracing::span::{Attributes, Id, Record};
    use tracing::subscriber::Interest;
    use tracing::{Event, Metadata, Subscriber};

    use super::*;
    use crate::component::{Component, ComponentError};

    /// The text of every event logged while it is the default subscriber.
    #[derive(Clone, Default)]
    struct Logged(Arc<Mutex<String>>);

    struct Fields<'a>(&'a mut String);

    impl tracing::field::Visit for Fields<'_> {
        fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
            self.0.push_str(&format!(" {}={value:?}", field.name()));
        }
    }

    impl Subscriber for Logged {
        fn register_callsite(&self, _: &'static Metadata<'static>) -> Interest {
            Interest::sometimes()
        }
        fn enabled(&self, _: &Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, _: &Attributes<'_>) -> Id {
            Id::from_u64(1)
        }
        fn record(&self, _: &Id, _: &Record<'_>) {}
        fn record_follows_from(&self, _: &Id, _: &Id) {}
        fn event(&self, event: &Event<'_>) {
            let mut logged = self.0.lock().unwrap_or_else(|p| p.into_inner());
            event.record(&mut Fields(&mut logged));
            logged.push('\n');
        }
        fn enter(&self, _: &Id) {}
        fn exit(&self, _: &Id) {}
    }

    /// A component whose `close` fails (or panics) quoting a secret.
    #[derive(Debug)]
    struct Careless {
        secret: &'static str,
        panics: bool,
    }

    #[async_trait]
    impl Component for Careless {
        async fn close(&self) -> Result<(), ComponentError> {
            if self.panics {
                panic!("close exploded with password {}", self.secret);
            }
            Err(ComponentError::new(format!(
                "cannot close: auth {} refused",
                self.secret
            )))
        }
    }

    #[tokio::test]
    async fn a_close_error_or_panic_is_logged_without_the_secret_it_quotes() {
        let logged = Logged::default();
        let _default = tracing::subscriber::set_default(logged.clone());
        for (secret, panics) in [("cl0se-err-s3cret", false), ("cl0se-panic-s3cret", true)] {
            Redactor::shared().remember(secret);
            let instance = Instance::Custom(Arc::new(Careless { secret, panics }));
            let key = ComponentKey::new("custom", "careless");
            close_one(&key, &instance, &CancellationToken::new()).await;
        }
        let text = logged.0.lock().unwrap_or_else(|p| p.into_inner()).clone();
        assert!(text.contains("cannot close: auth [redacted]"), "{text}");
        assert!(
            text.contains("close exploded with password [redacted]"),
            "{text}"
        );
        assert!(!text.contains("s3cret"), "a secret reached the log: {text}");
    }
}
