//! [`Finder`]: what scrubbing searches for, made anew as forms are
//! remembered at a cost linear in them (up to a logarithm), not in
//! everything remembered each time.
//!
//! The forms are kept in a few matchers ("levels"), largest first, each
//! at least [`LEVEL_RATIO`] times the bytes of the next, and the last few
//! forms remembered ([`PENDING_MAX`] at most) searched one by one. When
//! those overflow they become a level of their own, merged with the
//! smaller levels up to the first one [`LEVEL_RATIO`] times larger, built
//! anew. A form is rebuilt only into a level at least 5/4 the size of the
//! one it was in: remembering values one at a time up to the limits
//! builds each byte a few dozen times at most (not once every 64 forms,
//! as when the one matcher was rebuilt: ~4,096 builds of up to all of
//! them), and a scrub takes one pass a level, about 9 at the limits.

use std::ops::Range;
use std::sync::Arc;

use super::matcher::Matcher;

/// Forms remembered since the last level was built, searched one by one,
/// at most this many.
pub(super) const PENDING_MAX: usize = 64;

/// How many times the bytes of the next level a level has at least.
const LEVEL_RATIO: usize = 4;

/// The matchers over the remembered forms, and those remembered since.
#[derive(Debug, Default)]
pub(super) struct Finder {
    /// Largest first.
    levels: Vec<Arc<Level>>,
    pending: Vec<Arc<str>>,
}

/// One matcher and the forms it was built from (to build it anew with
/// others).
#[derive(Debug)]
struct Level {
    matcher: Matcher,
    forms: Vec<Arc<str>>,
    bytes: usize,
}

impl Level {
    fn new(forms: Vec<Arc<str>>) -> Self {
        let bytes = forms.iter().map(|form| form.len()).sum();
        #[cfg(test)]
        tests::count_build(bytes);
        Self {
            matcher: Matcher::new(forms.iter()),
            forms,
            bytes,
        }
    }
}

impl Finder {
    /// A finder of `forms`, in one matcher (after forms were forgotten:
    /// none of them is left).
    pub(super) fn of_all(forms: Vec<Arc<str>>) -> Self {
        if forms.is_empty() {
            return Self::default();
        }
        Self {
            levels: vec![Arc::new(Level::new(forms))],
            pending: Vec::new(),
        }
    }

    /// This finder with `added` too (none of them in it already).
    pub(super) fn with(&self, added: Vec<Arc<str>>) -> Self {
        let mut levels = self.levels.clone();
        let mut run = self.pending.clone();
        run.extend(added);
        if run.len() <= PENDING_MAX {
            return Self {
                levels,
                pending: run,
            };
        }
        let mut bytes: usize = run.iter().map(|form| form.len()).sum();
        while let Some(last) = levels.last() {
            if last.bytes >= LEVEL_RATIO * bytes {
                break;
            }
            bytes += last.bytes;
            run.extend(last.forms.iter().cloned());
            levels.pop();
        }
        levels.push(Arc::new(Level::new(run)));
        Self {
            levels,
            pending: Vec::new(),
        }
    }

    /// Where the forms occur in `text`, overlapping spans not merged.
    pub(super) fn spans(&self, text: &str) -> Vec<Range<usize>> {
        let mut spans = Vec::new();
        for level in &self.levels {
            spans.extend(level.matcher.covered(text));
        }
        for form in &self.pending {
            #[cfg(test)]
            super::matcher::tests::count_steps(text.len());
            spans.extend(super::occurrences(text, form));
        }
        spans
    }

    /// How many forms are searched one by one.
    #[cfg(test)]
    pub(super) fn pending(&self) -> usize {
        self.pending.len()
    }

    /// How many matchers a scrub runs.
    #[cfg(test)]
    pub(super) fn levels(&self) -> usize {
        self.levels.len()
    }
}

#[cfg(test)]
pub(super) mod tests {
    use std::cell::Cell;

    use super::*;
    use crate::redact::Redactor;

    thread_local! {
        /// Matchers built on this thread, and their bytes.
        static BUILT: Cell<(usize, usize)> = const { Cell::new((0, 0)) };
    }

    pub(super) fn count_build(bytes: usize) {
        BUILT.with(|built| {
            let (builds, total) = built.get();
            built.set((builds + 1, total + bytes));
        });
    }

    /// The matchers `run` built on this thread, and their bytes.
    pub(crate) fn builds_of(run: impl FnOnce()) -> (usize, usize) {
        let (builds, bytes) = BUILT.with(Cell::get);
        run();
        let (after, after_bytes) = BUILT.with(Cell::get);
        (after - builds, after_bytes - bytes)
    }

    #[test]
    fn values_remembered_one_at_a_time_are_built_a_few_times_each_not_once_a_64() {
        // A start of 20,000 components with a secret each: the matcher
        // was rebuilt whole every 64 forms (~312 builds of ~80 KiB).
        let redactor = Redactor::default();
        let values: Vec<String> = (0..20_000).map(|i| format!("secret-{i:06}")).collect();
        let mut kept = Vec::new();
        let (builds, built) = builds_of(|| {
            for value in &values {
                kept.push(redactor.try_remember_all([value.as_str()]).expect("fits"));
            }
        });
        let bytes: usize = values.iter().map(String::len).sum();
        assert!(
            built <= 12 * bytes,
            "{builds} builds of {built} bytes for {bytes}"
        );
        let finder = redactor.shared.finder.load();
        assert!(finder.levels() <= 6, "{} levels", finder.levels());
        for value in [&values[0], &values[9_999], &values[19_999]] {
            assert_eq!(
                redactor.scrub(&format!("auth {value}.")),
                "auth [redacted]."
            );
        }
        assert_eq!(redactor.scrub("secret-0200000"), "secret-0200000");
    }

    #[test]
    fn levels_keep_every_form_and_find_them_across_levels() {
        let forms = |range: Range<usize>| -> Vec<Arc<str>> {
            range.map(|i| Arc::from(format!("form-{i:05}"))).collect()
        };
        let mut finder = Finder::default();
        for start in (0..2_000).step_by(50) {
            finder = finder.with(forms(start..start + 50));
        }
        assert!(finder.levels() > 1, "{} levels", finder.levels());
        for i in [0, 1_234, 1_999] {
            let text = format!("x form-{i:05} y");
            assert_eq!(finder.spans(&text), vec![2..12], "{i}");
        }
        // Overlapping forms in different levels: both spans found.
        let finder = finder.with(vec![Arc::from("00007 y")]);
        let mut spans = finder.spans("x form-00007 y");
        spans.sort_by_key(|span| span.start);
        assert_eq!(spans, vec![2..12, 7..14]);
    }
}
