//! Log lines of every test of the binary, captured from `tracing`.

use std::fmt::{self, Write as _};
use std::sync::{Mutex, OnceLock};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

static LINES: Mutex<Vec<String>> = Mutex::new(Vec::new());
static INSTALLED: OnceLock<()> = OnceLock::new();

struct Capture;

struct Line(String);

impl Visit for Line {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        let _ = write!(self.0, " {}={value:?}", field.name());
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        let _ = write!(self.0, " {}={value}", field.name());
    }
}

impl Subscriber for Capture {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        *metadata.level() <= Level::INFO
    }

    fn new_span(&self, _span: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }

    fn record(&self, _span: &Id, _values: &Record<'_>) {}

    fn record_follows_from(&self, _span: &Id, _follows: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let mut line = Line(format!("{}", event.metadata().level()));
        event.record(&mut line);
        LINES.lock().unwrap_or_else(|p| p.into_inner()).push(line.0);
    }

    fn enter(&self, _span: &Id) {}

    fn exit(&self, _span: &Id) {}
}

/// Starts capturing (once per test binary).
pub fn capture() {
    INSTALLED.get_or_init(|| {
        let _ = tracing::subscriber::set_global_default(Capture);
    });
}

/// Every line captured so far.
pub fn lines() -> Vec<String> {
    LINES.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

/// Whether a captured line contains every one of `parts`.
pub fn any(parts: &[&str]) -> bool {
    lines()
        .iter()
        .any(|line| parts.iter().all(|p| line.contains(p)))
}
