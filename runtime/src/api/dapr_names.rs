//! Dapr's names for things, shared by the gRPC and HTTP metadata answers.

use crate::key::{CONFIG_STORE, LOCK, SECRET_STORE, STATE};

/// A component's type as Dapr spells it: `{category}.{type}`, e.g.
/// `state.redis`, `secretstores.local.file`, `configuration.apollo`; a
/// custom kind is its own category.
pub fn dapr_component_type(kind: &str, type_name: &str) -> String {
    let category = match kind {
        STATE => "state",
        SECRET_STORE => "secretstores",
        CONFIG_STORE => "configuration",
        LOCK => "lock",
        custom => custom,
    };
    format!("{category}.{type_name}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_in_kinds_use_dapr_categories() {
        assert_eq!(dapr_component_type(STATE, "redis"), "state.redis");
        assert_eq!(
            dapr_component_type(SECRET_STORE, "local.file"),
            "secretstores.local.file"
        );
        assert_eq!(
            dapr_component_type(CONFIG_STORE, "apollo"),
            "configuration.apollo"
        );
        assert_eq!(dapr_component_type(LOCK, "memory"), "lock.memory");
        assert_eq!(dapr_component_type("greeter", "english"), "greeter.english");
    }
}
