//! [`Matcher`]: where the remembered forms of secrets occur in a text, in
//! one pass over it whatever their number.

use std::ops::Range;

/// The root state.
const ROOT: u32 = 0;
/// No state (no child, no sibling).
const NONE: u32 = u32::MAX;

/// An Aho-Corasick automaton over the remembered forms that tells, at
/// each position of a text, the longest form ending there: that covers
/// every occurrence (a shorter one ending at the same place lies inside
/// it), so one pass finds them all, overlapping ones included.
///
/// Each state keeps that one length, not the list of every form ending
/// there (the textbook output lists, which the `aho-corasick` crate
/// copies into each state, grow as states × forms nested as suffixes of
/// each other: 627 KiB of forms such as `a…a` of every length and
/// `b0a…a` took 1.5 GB to build). So its size is linear in the forms'
/// bytes (20 bytes a state, at most one state a byte), and a scan takes
/// at most 2 transitions a byte (each up to 256 siblings compared).
#[derive(Debug, Default)]
pub(super) struct Matcher {
    /// The root first; empty when no form is remembered.
    states: Vec<State>,
    /// The root's children by byte (it has the most): 256 entries.
    root_children: Vec<u32>,
}

#[derive(Debug, Clone, Copy)]
struct State {
    /// The byte that leads here from the parent.
    byte: u8,
    first_child: u32,
    next_sibling: u32,
    /// The state of the longest proper suffix of this state's text that
    /// is a state too.
    fail: u32,
    /// The length of the longest form this state's text ends with; 0 for
    /// none.
    longest: u32,
}

impl State {
    fn new(byte: u8) -> Self {
        Self {
            byte,
            first_child: NONE,
            next_sibling: NONE,
            fail: ROOT,
            longest: 0,
        }
    }
}

/// `n` as a state index or length: the redactor's limits keep every
/// count far below `u32::MAX`.
fn index(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(NONE)
}

impl Matcher {
    /// The automaton over `forms` (each at least one byte long).
    pub(super) fn new<S: AsRef<str>>(forms: impl IntoIterator<Item = S>) -> Self {
        let mut matcher = Self {
            states: vec![State::new(0)],
            root_children: vec![NONE; 256],
        };
        for form in forms {
            let form = form.as_ref();
            let mut state = ROOT;
            for &byte in form.as_bytes() {
                state = match matcher.child(state, byte) {
                    Some(child) => child,
                    None => matcher.add_child(state, byte),
                };
            }
            if state != ROOT {
                matcher.states[state as usize].longest = index(form.len());
            }
        }
        matcher.link_failures();
        matcher
    }

    fn add_child(&mut self, parent: u32, byte: u8) -> u32 {
        let child = index(self.states.len());
        let mut state = State::new(byte);
        if parent == ROOT {
            self.root_children[usize::from(byte)] = child;
        } else {
            let parent = &mut self.states[parent as usize];
            state.next_sibling = parent.first_child;
            parent.first_child = child;
        }
        self.states.push(state);
        child
    }

    fn child(&self, state: u32, byte: u8) -> Option<u32> {
        #[cfg(test)]
        tests::count_step();
        if state == ROOT {
            let child = self.root_children[usize::from(byte)];
            return (child != NONE).then_some(child);
        }
        let mut child = self.states[state as usize].first_child;
        while child != NONE {
            #[cfg(test)]
            tests::count_step();
            let found = &self.states[child as usize];
            if found.byte == byte {
                return Some(child);
            }
            child = found.next_sibling;
        }
        None
    }

    /// Sets each state's failure link and longest form, breadth first: a
    /// state's failure is shallower, so it is done before it.
    fn link_failures(&mut self) {
        let mut queue: Vec<u32> = self
            .root_children
            .iter()
            .copied()
            .filter(|&child| child != NONE)
            .collect();
        let mut next = 0;
        while let Some(&state) = queue.get(next) {
            next += 1;
            let mut child = self.states[state as usize].first_child;
            while child != NONE {
                let byte = self.states[child as usize].byte;
                let fail = self.next(self.states[state as usize].fail, byte);
                let inherited = self.states[fail as usize].longest;
                let linked = &mut self.states[child as usize];
                linked.fail = fail;
                if linked.longest == 0 {
                    linked.longest = inherited;
                }
                queue.push(child);
                child = self.states[child as usize].next_sibling;
            }
        }
    }

    /// The state after reading `byte` in `state`.
    fn next(&self, mut state: u32, byte: u8) -> u32 {
        loop {
            if let Some(child) = self.child(state, byte) {
                return child;
            }
            if state == ROOT {
                return ROOT;
            }
            state = self.states[state as usize].fail;
        }
    }

    /// Where the forms occur in `text`, in order, the overlapping and
    /// adjacent occurrences as one span.
    pub(super) fn covered(&self, text: &str) -> Vec<Range<usize>> {
        let mut spans: Vec<Range<usize>> = Vec::new();
        if self.states.len() <= 1 {
            return spans;
        }
        let mut state = ROOT;
        for (at, &byte) in text.as_bytes().iter().enumerate() {
            state = self.next(state, byte);
            let longest = self.states[state as usize].longest as usize;
            if longest == 0 {
                continue;
            }
            let end = at + 1;
            let mut start = end - longest;
            // A longer form ending here may start before spans found.
            while let Some(last) = spans.last() {
                if start > last.end {
                    break;
                }
                start = start.min(last.start);
                spans.pop();
            }
            spans.push(start..end);
        }
        spans
    }
}

#[cfg(test)]
pub(super) mod tests {
    use std::cell::Cell;

    use super::*;

    thread_local! {
        static STEPS: Cell<usize> = const { Cell::new(0) };
    }

    pub(super) fn count_step() {
        count_steps(1);
    }

    /// Counts a search of `bytes` for one form, outside the matcher.
    pub(in crate::redact) fn count_steps(bytes: usize) {
        STEPS.with(|steps| steps.set(steps.get() + bytes));
    }

    /// The steps (transitions tried, siblings compared) `run` took on
    /// this thread.
    pub(crate) fn steps_of(run: impl FnOnce()) -> usize {
        let before = STEPS.with(Cell::get);
        run();
        STEPS.with(Cell::get) - before
    }

    /// The spans covered, as (start, end).
    fn covered(forms: &[&str], text: &str) -> Vec<(usize, usize)> {
        let forms: Vec<String> = forms.iter().map(ToString::to_string).collect();
        bounds(&Matcher::new(&forms), text)
    }

    fn bounds(matcher: &Matcher, text: &str) -> Vec<(usize, usize)> {
        let spans = matcher.covered(text);
        spans.iter().map(|span| (span.start, span.end)).collect()
    }

    #[test]
    fn covers_every_occurrence_nested_overlapping_or_apart() {
        // Nested: the shorter form inside the longer one ending later.
        assert_eq!(covered(&["bc", "abcd"], "xabcdx"), [(1, 5)]);
        // A suffix of a form found through its failure link.
        assert_eq!(covered(&["abcx", "bcd"], "abcd"), [(1, 4)]);
        assert_eq!(covered(&["abab"], "ababab ab abab"), [(0, 6), (10, 14)]);
        assert_eq!(covered(&["abc", "def"], "abcdef"), [(0, 6)]);
        assert!(covered(&[], "abc").is_empty());
    }

    #[test]
    fn nested_suffixes_take_no_more_than_a_state_a_byte() {
        // `a…a` of every length and `bN a…a`: the case that made output
        // lists quadratic.
        let mut forms: Vec<String> = (4..400).map(|n| "a".repeat(n)).collect();
        forms.extend((0..200).map(|i| format!("b{i:03}{}", "a".repeat(400))));
        let bytes: usize = forms.iter().map(String::len).sum();
        let matcher = Matcher::new(&forms);
        assert!(matcher.states.len() <= bytes + 1);
        let text = format!("x{}y", "a".repeat(1000));
        assert_eq!(bounds(&matcher, &text), [(1, 1001)]);
    }
}
