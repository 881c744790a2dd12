//! A tracing subscriber for unit tests that keeps the text of every event
//! logged while it is the default, so a test can assert what reached the
//! log (and what did not).

use std::sync::{Arc, Mutex};

use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::Interest;
use tracing::{Event, Metadata, Subscriber};

/// The text of every event logged while it is the default subscriber.
#[derive(Clone, Default)]
pub(crate) struct Logged(Arc<Mutex<String>>);

impl Logged {
    /// Everything logged so far.
    pub(crate) fn text(&self) -> String {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

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
