//! The built-in kinds as the derive knows them, and the custom kinds that
//! are most likely a misspelled built-in one.

/// The built-in kinds and their `Instance` variants (the runtime's
/// `Kind::BUILT_IN`, plus Layotto's alias `pub_subs`).
pub(crate) const BUILT_IN_KINDS: &[(&str, &str)] = &[
    ("state", "State"),
    ("config_store", "ConfigStore"),
    ("secret_store", "SecretStore"),
    ("lock", "Lock"),
    ("sequencer", "Sequencer"),
    ("file", "File"),
    ("pubsub", "PubSub"),
    ("pub_subs", "PubSub"),
];

/// Other spellings of each built-in kind, as [`normalised`]: the kind
/// trait's name (`StateStore`) and Dapr's names (`state.redis`,
/// `secretstores.local.file`, `configuration.redis`).
const OTHER_SPELLINGS: &[(&str, &str)] = &[
    ("statestore", "state"),
    ("configstore", "config_store"),
    ("configuration", "config_store"),
    ("configurationstore", "config_store"),
    ("secretstore", "secret_store"),
    ("filestore", "file"),
    ("lockstore", "lock"),
];

/// `kind` lowercased, without `_`, `-` or `.`, and without one trailing
/// `s`: `State`, `secret_stores` and `pub-subs` become `state`,
/// `secretstore` and `pubsub`.
fn normalised(kind: &str) -> String {
    let mut text: String = kind
        .chars()
        .filter(|c| !matches!(c, '_' | '-' | '.'))
        .flat_map(char::to_lowercase)
        .collect();
    if text.len() > 1 && text.ends_with('s') {
        text.pop();
    }
    text
}

/// The built-in kind `kind` is most likely a misspelling of, when `kind` is
/// not itself a built-in kind's name: as a custom kind, the struct's kind
/// trait impl would never serve that kind's components.
pub(crate) fn misspelled_built_in(kind: &str) -> Option<&'static str> {
    if BUILT_IN_KINDS.iter().any(|(name, _)| *name == kind) {
        return None;
    }
    let text = normalised(kind);
    let built_in = BUILT_IN_KINDS
        .iter()
        .find(|(name, _)| normalised(name) == text)
        .map(|(name, _)| canonical_kind(name));
    built_in.or_else(|| {
        OTHER_SPELLINGS
            .iter()
            .find(|(spelling, _)| *spelling == text)
            .map(|(_, name)| *name)
    })
}

/// The kind as the runtime spells it (`Kind::as_str`): an alias of a
/// built-in kind (`pub_subs`) is registered under the kind's first name
/// (`pubsub`), where lookups find it.
pub(crate) fn canonical_kind(kind: &str) -> &str {
    let variant = BUILT_IN_KINDS.iter().find(|(name, _)| *name == kind);
    match variant {
        Some((_, variant)) => BUILT_IN_KINDS
            .iter()
            .find(|(_, v)| v == variant)
            .map_or(kind, |(name, _)| name),
        None => kind,
    }
}

#[cfg(test)]
mod tests {
    use super::{canonical_kind, misspelled_built_in};

    #[test]
    fn aliases_register_under_the_kind_the_runtime_looks_up() {
        assert_eq!(canonical_kind("pub_subs"), "pubsub");
        assert_eq!(canonical_kind("pubsub"), "pubsub");
        assert_eq!(canonical_kind("state"), "state");
        assert_eq!(canonical_kind("my_kind"), "my_kind");
    }

    #[test]
    fn a_built_in_kind_spelled_another_way_is_named() {
        for (kind, built_in) in [
            ("state_store", "state"),
            ("statestore", "state"),
            ("StateStore", "state"),
            ("State", "state"),
            ("states", "state"),
            ("secretstores", "secret_store"),
            ("secret-store", "secret_store"),
            ("configuration", "config_store"),
            ("ConfigStore", "config_store"),
            ("pubsubs", "pubsub"),
            ("pub-sub", "pubsub"),
            ("PubSub", "pubsub"),
            ("locks", "lock"),
            ("sequencers", "sequencer"),
            ("files", "file"),
            ("file_store", "file"),
        ] {
            assert_eq!(misspelled_built_in(kind), Some(built_in), "{kind}");
        }
    }

    #[test]
    fn built_in_and_other_custom_kinds_are_left_alone() {
        for kind in [
            "state",
            "config_store",
            "secret_store",
            "lock",
            "sequencer",
            "file",
            "pubsub",
            "pub_subs",
            "cache",
            "greeter",
            "stubconfig",
            "config",
            "secrets_manager",
            "s",
        ] {
            assert_eq!(misspelled_built_in(kind), None, "{kind}");
        }
    }
}
