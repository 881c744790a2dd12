//! What a component serves: one of the built-in kinds, or a custom one.

use std::cmp::Ordering;
use std::fmt;
use std::sync::{Arc, RwLock};

/// The kind of a component, written as in configuration (`state`,
/// `config_store`...). Kinds order by that spelling.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Kind {
    /// `state`: a [`StateStore`](crate::StateStore).
    State,
    /// `config_store`: a [`ConfigStore`](crate::ConfigStore).
    ConfigStore,
    /// `secret_store`: a [`SecretStore`](crate::SecretStore).
    SecretStore,
    /// `lock`: a [`Lock`](crate::Lock).
    Lock,
    /// `sequencer`: a [`Sequencer`](crate::Sequencer).
    Sequencer,
    /// `file`: a [`FileStore`](crate::FileStore).
    File,
    /// `pubsub` (Layotto: `pub_subs`): a [`PubSub`](crate::PubSub) broker.
    PubSub,
    /// Any other kind: a plain [`Component`](crate::Component).
    Custom(Arc<str>),
}

impl Kind {
    /// The built-in kinds.
    pub const BUILT_IN: [Kind; 7] = [
        Kind::ConfigStore,
        Kind::File,
        Kind::Lock,
        Kind::PubSub,
        Kind::SecretStore,
        Kind::Sequencer,
        Kind::State,
    ];

    /// The kind as written in configuration.
    pub fn as_str(&self) -> &str {
        match self {
            Kind::State => "state",
            Kind::ConfigStore => "config_store",
            Kind::SecretStore => "secret_store",
            Kind::Lock => "lock",
            Kind::Sequencer => "sequencer",
            Kind::File => "file",
            Kind::PubSub => "pubsub",
            Kind::Custom(kind) => kind,
        }
    }

    /// The kind written `text` (a built-in one when it is spelled so).
    pub fn parse(text: &str) -> Self {
        match Self::canonical_spelling(text) {
            "state" => Kind::State,
            "config_store" => Kind::ConfigStore,
            "secret_store" => Kind::SecretStore,
            "lock" => Kind::Lock,
            "sequencer" => Kind::Sequencer,
            "file" => Kind::File,
            "pubsub" => Kind::PubSub,
            other => Kind::Custom(custom_name(other)),
        }
    }

    /// `text` as the kind it names is spelled: a built-in kind's alias
    /// (Layotto's `pub_subs`) as that kind (`pubsub`), anything else as it
    /// is. Where kinds are keyed by their text (the registry), an alias
    /// then finds what its kind does.
    pub(crate) fn canonical_spelling(text: &str) -> &str {
        match text {
            "pub_subs" => "pubsub",
            other => other,
        }
    }

    /// Whether it is a custom kind.
    fn is_custom(&self) -> bool {
        matches!(self, Kind::Custom(_))
    }
}

/// At most this many custom kind names are shared process-wide, each at
/// most [`SHARED_NAME_MAX`] bytes: what a client sends cannot grow the
/// table past a few kilobytes. Others are allocated per key.
const SHARED_NAMES_MAX: usize = 64;
const SHARED_NAME_MAX: usize = 64;

/// The name of custom kind `text`, shared by every key of that kind: keys
/// of one kind then compare (and sort, and hash into the graph) without
/// reading a string from every key.
fn custom_name(text: &str) -> Arc<str> {
    static SHARED: RwLock<Vec<Arc<str>>> = RwLock::new(Vec::new());
    let find = |names: &[Arc<str>]| names.iter().find(|name| ***name == *text).cloned();
    if let Some(name) = find(&SHARED.read().unwrap_or_else(|p| p.into_inner())) {
        return name;
    }
    let name: Arc<str> = Arc::from(text);
    if text.len() > SHARED_NAME_MAX {
        return name;
    }
    let mut shared = SHARED.write().unwrap_or_else(|p| p.into_inner());
    if let Some(raced) = find(&shared) {
        return raced;
    }
    if shared.len() < SHARED_NAMES_MAX {
        shared.push(name.clone());
    }
    name
}

impl From<&str> for Kind {
    fn from(text: &str) -> Self {
        Kind::parse(text)
    }
}

impl From<&String> for Kind {
    fn from(text: &String) -> Self {
        Kind::parse(text)
    }
}

impl From<String> for Kind {
    fn from(text: String) -> Self {
        Kind::parse(&text)
    }
}

impl From<&Kind> for Kind {
    fn from(kind: &Kind) -> Self {
        kind.clone()
    }
}

impl From<Kind> for String {
    fn from(kind: Kind) -> Self {
        match kind {
            Kind::Custom(kind) => kind.to_string(),
            built_in => built_in.as_str().to_string(),
        }
    }
}

impl AsRef<str> for Kind {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl PartialEq<str> for Kind {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for Kind {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl Ord for Kind {
    fn cmp(&self, other: &Self) -> Ordering {
        // One kind is equal to itself without reading its spelling: keys of
        // one custom kind, parsed together, share its name.
        let same = match (self, other) {
            (Kind::Custom(a), Kind::Custom(b)) => Arc::ptr_eq(a, b),
            (Kind::Custom(_), _) | (_, Kind::Custom(_)) => false,
            _ => std::mem::discriminant(self) == std::mem::discriminant(other),
        };
        if same {
            return Ordering::Equal;
        }
        // A custom kind spelled as a built-in one (`Kind::Custom("state")`,
        // made by hand: parsing makes `Kind::State`) is another kind, as
        // `==` says: after the built-in one, not equal to it.
        self.as_str()
            .cmp(other.as_str())
            .then_with(|| self.is_custom().cmp(&other.is_custom()))
    }
}

impl PartialOrd for Kind {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl serde::Serialize for Kind {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spelling_round_trips_and_orders_as_written() {
        for kind in Kind::BUILT_IN {
            assert_eq!(Kind::parse(kind.as_str()), kind);
        }
        assert_eq!(Kind::parse("binding"), Kind::Custom("binding".into()));
        assert_eq!(Kind::parse("pub_subs"), Kind::PubSub);
        let mut kinds = [Kind::State, Kind::parse("binding"), Kind::ConfigStore];
        kinds.sort();
        let spelled: Vec<&str> = kinds.iter().map(Kind::as_str).collect();
        assert_eq!(spelled, ["binding", "config_store", "state"]);
    }

    #[test]
    fn every_pair_orders_as_its_spelling() {
        let mut kinds = Kind::BUILT_IN.to_vec();
        kinds.extend(["binding", "sequencer2", "a", "zzz"].map(Kind::parse));
        for a in &kinds {
            for b in &kinds {
                assert_eq!(a.cmp(b), a.as_str().cmp(b.as_str()), "{a} vs {b}");
            }
        }
    }

    #[test]
    fn a_custom_kind_spelled_as_a_built_in_one_orders_as_it_compares() {
        for built_in in Kind::BUILT_IN {
            let custom = Kind::Custom(built_in.as_str().into());
            assert_ne!(custom, built_in);
            assert_eq!(custom.cmp(&built_in), Ordering::Greater, "{custom}");
            assert_eq!(built_in.cmp(&custom), Ordering::Less, "{custom}");
            assert_eq!(custom.cmp(&custom.clone()), Ordering::Equal);
        }
        let set: std::collections::BTreeSet<Kind> =
            [Kind::State, Kind::Custom("state".into())].into();
        assert_eq!(set.len(), 2, "one of two different kinds was lost");
    }

    #[test]
    fn an_alias_is_spelled_as_its_kind() {
        assert_eq!(Kind::canonical_spelling("pub_subs"), "pubsub");
        assert_eq!(Kind::canonical_spelling("pubsub"), "pubsub");
        assert_eq!(Kind::canonical_spelling("binding"), "binding");
    }

    fn shares(a: &Kind, b: &Kind) -> bool {
        matches!((a, b), (Kind::Custom(a), Kind::Custom(b)) if Arc::ptr_eq(a, b))
    }

    #[test]
    fn a_custom_kind_name_is_shared_within_bounds() {
        assert!(shares(
            &Kind::parse("acme.widget"),
            &Kind::parse("acme.widget")
        ));
        let long = "k".repeat(SHARED_NAME_MAX + 1);
        assert!(!shares(&Kind::parse(&long), &Kind::parse(&long)));
        // However many names a client makes up, the table stays bounded;
        // each kind still parses and compares as written.
        for i in 0..SHARED_NAMES_MAX * 2 {
            let kind = Kind::parse(&format!("made-up-{i}"));
            assert_eq!(kind.as_str(), format!("made-up-{i}"));
        }
        let table_full = Kind::parse("after.the.table.is.full");
        assert!(!shares(
            &table_full,
            &Kind::parse("after.the.table.is.full")
        ));
        assert_eq!(table_full, Kind::parse("after.the.table.is.full"));
        assert_eq!(
            table_full.cmp(&Kind::parse("after.the.table.is.full")),
            Ordering::Equal
        );
    }
}
