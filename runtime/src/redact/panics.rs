//! [`redact_panics`]: panic reports with the secrets scrubbed.

use std::io::Write;
use std::panic::PanicHookInfo;
use std::sync::Once;

use super::{RedactingWriter, Redactor};

/// Installs a panic hook that reports a panic (`thread '…' panicked at
/// …`) with every secret the runtimes have seen scrubbed, as an error log
/// event, or straight to stderr (through [`RedactingWriter`]) where no
/// log subscriber takes it. Rust's default hook prints the panic's message
/// raw to stderr, the log stream, before the runtime catches a component's
/// panic and logs a scrubbed copy: a component panicking with its password
/// in the message would leak it. The default hook is replaced, not called
/// — and so is any hook set before (a crash reporter's): a host with one
/// sets it after this, and has it write what it reports through
/// [`Redactor::scrub`]. `rewire::init_logging` calls it; a host with its
/// own log set-up calls it once at start. A second call does nothing. (A
/// panic inside the report aborts the process, as std does for any hook.)
pub fn redact_panics() {
    static INSTALLED: Once = Once::new();
    INSTALLED.call_once(|| std::panic::set_hook(Box::new(report)));
}

fn report(info: &PanicHookInfo<'_>) {
    let scrubbed = Redactor::shared().scrub(&panic_text(info));
    if tracing::enabled!(target: "panic", tracing::Level::ERROR) {
        tracing::error!(target: "panic", "{scrubbed}");
    } else {
        let _ = writeln!(RedactingWriter::new(std::io::stderr()), "{scrubbed}");
    }
}

/// What the default hook prints: the thread, where, the message, and the
/// backtrace where `RUST_BACKTRACE` asks for one.
fn panic_text(info: &PanicHookInfo<'_>) -> String {
    let thread = std::thread::current();
    let name = thread.name().unwrap_or("<unnamed>");
    let location = info
        .location()
        .map_or_else(|| "an unknown place".to_string(), ToString::to_string);
    let message = crate::panic_text::panic_message(info.payload());
    let mut text = format!("thread '{name}' panicked at {location}:\n{message}");
    let backtrace = std::backtrace::Backtrace::capture();
    if backtrace.status() == std::backtrace::BacktraceStatus::Captured {
        text.push_str(&format!("\nstack backtrace:\n{backtrace}"));
    }
    text
}
