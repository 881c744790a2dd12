//! Wording a reference to a component that is not declared: the same name
//! declared under another kind, or else the closest name of its kind
//! (did-you-mean). The names are indexed once per validation, on the first
//! such reference, and the closest-name search (which compares with every
//! name of the kind) is made for the first [`MAX_SUGGESTIONS`] references
//! only, and no more once [`MAX_COMPARED`] names were compared: 200,000
//! components each with a dangling reference are reported in time linear
//! in the configuration, not 10^10 comparisons.

use std::cell::{Cell, OnceCell};
use std::collections::HashMap;

use crate::component::{ComponentKey, Kind};
use crate::config::Config;

/// How many undeclared references get a did-you-mean search.
pub(super) const MAX_SUGGESTIONS: usize = 100;

/// After how many names compared no further did-you-mean search is made.
pub(super) const MAX_COMPARED: usize = 1_000_000;

/// How many keys of the same name under other kinds a message lists.
const MAX_ELSEWHERE: usize = 10;

/// Words the references to undeclared components of one validation.
pub(super) struct Undeclared<'c> {
    config: &'c Config,
    index: OnceCell<NameIndex<'c>>,
    /// Did-you-mean searches made so far, and the names they compared.
    searched: Cell<usize>,
    compared: Cell<usize>,
}

/// The declared keys by name, and the names of each kind (lowercased once).
struct NameIndex<'c> {
    by_name: HashMap<&'c str, Vec<&'c ComponentKey>>,
    by_kind: HashMap<&'c Kind, Vec<(String, &'c ComponentKey)>>,
}

impl<'c> Undeclared<'c> {
    pub(super) fn new(config: &'c Config) -> Self {
        Self {
            config,
            index: OnceCell::new(),
            searched: Cell::new(0),
            compared: Cell::new(0),
        }
    }

    /// The problem's message for the ref `at` to `target`, not declared.
    pub(super) fn message(&self, at: &str, target: &ComponentKey) -> String {
        let index = self.index.get_or_init(|| NameIndex::of(self.config));
        let elsewhere = index
            .by_name
            .get(&*target.name)
            .map_or(&[][..], Vec::as_slice);
        // The same name under another kind is the likelier slip: say that alone.
        if !elsewhere.is_empty() {
            let listed: Vec<String> = elsewhere
                .iter()
                .take(MAX_ELSEWHERE)
                .map(ToString::to_string)
                .collect();
            let more = match elsewhere.len().saturating_sub(MAX_ELSEWHERE) {
                0 => String::new(),
                more => format!(" (and {more} more)"),
            };
            return format!(
                "{at}: references `{target}`, which is not declared; `{}`{more} is, but it is not a {}",
                listed.join("`, `"),
                target.kind
            );
        }
        let hint = match self.may_search() {
            true => index
                .closest_of_kind(target)
                .map_or_else(String::new, |(close, compared)| {
                    self.compared.set(self.compared.get() + compared);
                    close
                        .map(|close| format!(" (did you mean `{close}`?)"))
                        .unwrap_or_default()
                }),
            false => String::new(),
        };
        format!("{at}: references `{target}`, which is not declared{hint}")
    }
}

impl Undeclared<'_> {
    /// Whether a did-you-mean search may still be made (counted as made).
    fn may_search(&self) -> bool {
        let searched = self.searched.get();
        let open = searched < MAX_SUGGESTIONS && self.compared.get() < MAX_COMPARED;
        if open {
            self.searched.set(searched + 1);
        }
        open
    }
}

impl<'c> NameIndex<'c> {
    fn of(config: &'c Config) -> Self {
        let mut by_name: HashMap<&str, Vec<&ComponentKey>> = HashMap::new();
        let mut by_kind: HashMap<&Kind, Vec<(String, &ComponentKey)>> = HashMap::new();
        for key in config.components.keys() {
            by_name.entry(&key.name).or_default().push(key);
            by_kind
                .entry(&key.kind)
                .or_default()
                .push((key.name.to_lowercase(), key));
        }
        Self { by_name, by_kind }
    }

    /// The declared component of `target`'s kind whose name is closest to
    /// `target`'s, if one is close enough to be a likely misspelling (the
    /// same measure and threshold as metadata's did-you-mean), and how
    /// many names were compared; `None` when no component is of that kind.
    fn closest_of_kind(&self, target: &ComponentKey) -> Option<(Option<&'c ComponentKey>, usize)> {
        let names = self.by_kind.get(&target.kind)?;
        let wanted = target.name.to_lowercase();
        let closest = names
            .iter()
            .filter(|(_, k)| k.name != target.name)
            .map(|(name, k)| (strsim::jaro_winkler(&wanted, name), *k))
            .filter(|(score, _)| *score > 0.8)
            .max_by(|a, b| a.0.total_cmp(&b.0))
            .map(|(_, k)| k);
        Some((closest, names.len()))
    }
}

#[cfg(test)]
mod tests {
    use std::fmt::Write;

    use super::{MAX_COMPARED, MAX_SUGGESTIONS};
    use crate::config::{parse, validate};
    use crate::metadata::{decode_for_validation, MetadataError, NoMetadata};
    use crate::registry::{ComponentDescriptor, Registry};

    fn registry() -> Registry {
        fn unbuildable(_: &crate::Metadata) -> Result<Box<dyn crate::Buildable>, MetadataError> {
            Err(MetadataError::Invalid {
                field: ".".into(),
                message: "test registry cannot build".into(),
            })
        }
        let mut registry = Registry::default();
        registry.register(ComponentDescriptor {
            kind: "state",
            type_name: "memory",
            description: "",
            example_metadata: "{}",
            validate: |map, injected| decode_for_validation::<NoMetadata>(map, injected),
            build: unbuildable,
            check_refs: None,
            in_place: None,
        });
        registry
    }

    /// 20,000 components, each referencing a misspelling of its own name:
    /// every reference is reported, naming its component and field, and
    /// only the first are offered a did-you-mean (each search compares with
    /// every name of the kind): no more than [`MAX_SUGGESTIONS`], and none
    /// once [`MAX_COMPARED`] names were compared.
    #[test]
    fn many_undeclared_refs_are_all_reported_and_suggestions_are_capped() {
        const N: usize = 20_000;
        let mut text = String::from(r#"{"components": {"state": {"#);
        for i in 0..N {
            let sep = if i == 0 { "" } else { "," };
            let _ = write!(
                text,
                r#"{sep}"s{i:05}": {{"type": "memory", "componentRef": [{{"type": "state", "name": "s{i:05}x"}}]}}"#
            );
        }
        text.push_str("}}}");
        let config = parse(text.as_bytes()).unwrap_or_else(|p| panic!("{p}"));
        let problems: Vec<String> = match validate(config, &registry()) {
            Ok(_) => panic!("dangling refs passed"),
            Err(problems) => problems.iter().map(ToString::to_string).collect(),
        };
        assert_eq!(problems.len(), N, "{:?}", &problems[..3]);
        for (i, problem) in problems.iter().enumerate() {
            let reported = format!(
                "state/s{i:05}: componentRef[0]: references `state/s{i:05}x`, which is not declared"
            );
            assert!(problem.starts_with(&reported), "{problem}");
        }
        let suggested = problems
            .iter()
            .filter(|p| p.contains("did you mean"))
            .count();
        let searches = MAX_SUGGESTIONS.min(MAX_COMPARED.div_ceil(N));
        assert!(searches < N);
        assert_eq!(suggested, searches);
        assert!(
            problems[0].ends_with("(did you mean `state/s00000`?)"),
            "{}",
            problems[0]
        );
        assert!(
            !problems[searches].contains("did you mean"),
            "{}",
            problems[searches]
        );
    }

    /// A name declared under many other kinds: the first few are listed.
    #[test]
    fn the_same_name_under_many_other_kinds_is_listed_in_part() {
        let mut text = String::from(
            r#"{"components": {"state": {"a": {"type": "memory", "componentRef": [{"type": "lock", "name": "x"}]}}"#,
        );
        for k in 0..12 {
            let _ = write!(text, r#","kind{k:02}": {{"x": {{}}}}"#);
        }
        text.push('}');
        text.push('}');
        let config = parse(text.as_bytes()).unwrap_or_else(|p| panic!("{p}"));
        let Err(problems) = validate(config, &registry()) else {
            panic!("a dangling ref passed");
        };
        let listed = (0..10)
            .map(|k| format!("kind{k:02}/x"))
            .collect::<Vec<_>>()
            .join("`, `");
        let wanted = format!(
            "state/a: componentRef[0]: references `lock/x`, which is not declared; `{listed}` (and 2 more) is, but it is not a lock"
        );
        assert!(
            problems.iter().any(|p| p.to_string() == wanted),
            "{problems}"
        );
    }
}
