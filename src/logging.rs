//! Logging set up in one call: what `rewire run` uses, for hosts too.

use std::io::IsTerminal;

/// Logs to stderr with every known secret value scrubbed; `RUST_LOG`
/// filters (default `info`). Coloured only when stderr is a terminal and
/// `NO_COLOR` is unset. A second call does nothing.
pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour_wanted(
            std::io::stderr().is_terminal(),
            std::env::var_os("NO_COLOR"),
        ))
        .with_writer(|| rewire_runtime::RedactingWriter::new(std::io::stderr()))
        .try_init();
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
