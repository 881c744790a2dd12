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
/// in the message would leak it.
///
/// **It replaces whatever hook is set, without a word**: Rust's default,
/// and any a host set before (a crash reporter's: Sentry, human-panic).
/// The previous hook is not called: it cannot be told from the default
/// one, which would print the raw message. A host with its own hook sets
/// it *after* this (after `rewire::init_logging`), and has it write what
/// it reports through a [`RedactingWriter`] (over a `&mut Vec<u8>` for
/// text to send elsewhere); a hook that calls the one before it (as
/// Sentry's does) then keeps this report too. `rewire::init_logging` calls
/// it (so `rewire::main()` does, first thing); a host with its own log
/// set-up calls it once at start. A second call does nothing, and does
/// not replace a hook set since. (A panic inside the report aborts the
/// process, as std does for any hook.)
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
