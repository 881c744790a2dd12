//! How many threads serve the process's async work: `--workers`, else
//! `REWIRE_WORKERS`, else tokio's own `TOKIO_WORKER_THREADS`, else one per
//! CPU the process may use. Every source is checked here, so a bad value is
//! a clear error at start, never tokio's panic.

use std::num::NonZeroUsize;

/// The most worker threads accepted (far past any useful count).
pub(super) const MAX_WORKERS: usize = 1024;

/// The environment variables read, in order, when `--workers` is not given.
const ENV_SOURCES: [&str; 2] = ["REWIRE_WORKERS", "TOKIO_WORKER_THREADS"];

/// The worker count `flag` or the environment asks for, or one per CPU
/// available to the process (its cgroup's quota included).
pub(super) fn worker_threads(flag: Option<usize>) -> Result<usize, String> {
    from_sources(flag, |name| {
        std::env::var_os(name).map(|text| text.to_string_lossy().into_owned())
    })
}

/// [`worker_threads`] with the environment read through `var`. A variable
/// set empty (or to blanks only), as `REWIRE_WORKERS=` leaves it, counts
/// as unset.
fn from_sources(
    flag: Option<usize>,
    var: impl Fn(&str) -> Option<String>,
) -> Result<usize, String> {
    if let Some(count) = flag {
        return Ok(count);
    }
    for source in ENV_SOURCES {
        if let Some(text) = var(source).filter(|text| !text.trim().is_empty()) {
            return parse(&text).map_err(|why| format!("{source}: {why}"));
        }
    }
    Ok(std::thread::available_parallelism().map_or(1, NonZeroUsize::get))
}

/// `--workers`' value parser: a whole number from 1 to [`MAX_WORKERS`].
pub(super) fn parse(text: &str) -> Result<usize, String> {
    match text.trim().parse::<usize>() {
        Ok(count) if (1..=MAX_WORKERS).contains(&count) => Ok(count),
        _ => Err(format!(
            "expected a whole number of worker threads from 1 to {MAX_WORKERS}, got {text:?}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_from_one_to_the_maximum_are_accepted() {
        assert_eq!(parse("1"), Ok(1));
        assert_eq!(parse(" 4 "), Ok(4));
        assert_eq!(parse("1024"), Ok(MAX_WORKERS));
    }

    #[test]
    fn anything_else_is_refused_with_what_was_given() {
        for bad in ["0", "-1", "1025", "two", "", "1.5"] {
            let err = parse(bad).expect_err(bad);
            assert!(err.contains(&format!("{bad:?}")), "{err}");
            assert!(err.contains("from 1 to 1024"), "{err}");
        }
    }

    #[test]
    fn the_flag_wins_over_the_environment() {
        assert_eq!(worker_threads(Some(3)), Ok(3));
    }

    #[test]
    fn an_empty_variable_counts_as_unset() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, v)| (*v).to_string())
            }
        };
        let cpus = std::thread::available_parallelism().map_or(1, NonZeroUsize::get);
        assert_eq!(from_sources(None, env(&[("REWIRE_WORKERS", "")])), Ok(cpus));
        assert_eq!(
            from_sources(None, env(&[("REWIRE_WORKERS", "  ")])),
            Ok(cpus)
        );
        assert_eq!(
            from_sources(
                None,
                env(&[("REWIRE_WORKERS", ""), ("TOKIO_WORKER_THREADS", "2")])
            ),
            Ok(2),
            "the next source is read"
        );
        assert_eq!(from_sources(None, env(&[("REWIRE_WORKERS", "3")])), Ok(3));
        let err = from_sources(None, env(&[("REWIRE_WORKERS", "x")])).expect_err("x");
        assert!(err.starts_with("REWIRE_WORKERS: "), "{err}");
    }
}
