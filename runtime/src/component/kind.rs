//! What a component serves: one of the built-in kinds, or a custom one.

use std::cmp::Ordering;
use std::fmt;
use std::sync::Arc;

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
        match text {
            "state" => Kind::State,
            "config_store" => Kind::ConfigStore,
            "secret_store" => Kind::SecretStore,
            "lock" => Kind::Lock,
            "sequencer" => Kind::Sequencer,
            "file" => Kind::File,
            "pubsub" | "pub_subs" => Kind::PubSub,
            other => Kind::Custom(Arc::from(other)),
        }
    }
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
        self.as_str().cmp(other.as_str())
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
}
