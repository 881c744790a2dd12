//! Logging set up in one call: what `rewire run` uses, for hosts too.

use std::io::IsTerminal;

/// Logs to stderr with every known secret value scrubbed; `RUST_LOG`
/// filters (default `info`). Coloured only when stderr is a terminal and
/// `NO_COLOR` is unset. With the sidecar, also installs the tracing layer
/// (spans exported once tracing is configured; see
/// [`rewire_sidecar::telemetry`]). Panics are logged the same way, scrubbed
/// ([`rewire_runtime::redact_panics`]), not printed raw by Rust's default
/// hook. A second call does nothing.
///
/// **The panic hook replaces any set before**, silently: a crash
/// reporter's (Sentry, human-panic) installed earlier no longer runs. Set
/// yours after this call, writing what it reports through a
/// [`RedactingWriter`](rewire_runtime::RedactingWriter); one that calls
/// the hook before it (Sentry's does) keeps the scrubbed report too.
/// `rewire::main()` calls this first thing, so a hook set before it is
/// replaced.
pub fn init_logging() {
    use tracing_subscriber::filter::{filter_fn, FilterExt};
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;

    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let logs = tracing_subscriber::fmt::layer()
        .with_ansi(colour_wanted(
            std::io::stderr().is_terminal(),
            std::env::var_os("NO_COLOR"),
        ))
        .with_writer(|| rewire_runtime::RedactingWriter::new(std::io::stderr()))
        // Trace spans (`rewire.*`) are for the exporter, not the log lines.
        .with_filter(filter.and(filter_fn(|m| {
            !(m.is_span() && m.name().starts_with("rewire."))
        })));
    let registry = tracing_subscriber::registry().with(logs);
    #[cfg(feature = "sidecar")]
    let registry = registry.with(rewire_sidecar::telemetry::layer());
    let _ = registry.try_init();
    rewire_runtime::redact_panics();
}

/// Colour only on a terminal, and never when `NO_COLOR` is set (to any
/// non-empty value, as <https://no-color.org> says).
pub(crate) fn colour_wanted(is_terminal: bool, no_color: Option<std::ffi::OsString>) -> bool {
    is_terminal && no_color.is_none_or(|v| v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::colour_wanted;

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        assert!(colour_wanted(true, None));
        assert!(colour_wanted(true, Some("".into())));
        assert!(!colour_wanted(true, Some("1".into())));
        assert!(!colour_wanted(false, None));
    }
}
