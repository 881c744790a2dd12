//! Dapr component types (`state.redis`) and rewire's kinds and types
//! (`state/redis`): `<building block>.<implementation>`, the building block
//! named as rewire names the kind, the implementation as rewire names the
//! type (a few are spelled differently).

use crate::registry::Registry;

/// Dapr's building blocks and the rewire kind of each.
const BUILDING_BLOCKS: &[(&str, &str)] = &[
    ("state", "state"),
    ("lock", "lock"),
    ("secretstores", "secret_store"),
    ("configuration", "config_store"),
    ("pubsub", "pubsub"),
];

/// Dapr types whose rewire type is not the part after the building block.
const RENAMED: &[(&str, &str)] = &[
    ("state.in-memory", "memory"),
    ("lock.in-memory", "memory"),
    ("pubsub.in-memory", "memory"),
    ("configuration.in-memory", "memory"),
    ("secretstores.local.env", "env"),
];

/// Metadata fields that name a file: Dapr reads them relative to the
/// working directory, so they are made absolute against it.
const PATH_FIELDS: &[(&str, &str)] = &[("secretstores.local.file", "secretsFile")];

/// Metadata fields Dapr knows for a building block that mean nothing to
/// rewire, dropped with a note rather than refused.
const IGNORED_FIELDS: &[(&str, &str, &str)] =
    &[("state", "actorStateStore", "rewire has no actors")];

/// The rewire kind and type of Dapr type `dapr_type`, when rewire
/// implements it.
pub(super) fn rewire_kind_and_type(
    dapr_type: &str,
    registry: &Registry,
) -> Option<(&'static str, String)> {
    let (block, implementation) = dapr_type.split_once('.')?;
    let kind = BUILDING_BLOCKS
        .iter()
        .find(|(b, _)| *b == block)
        .map(|(_, kind)| *kind)?;
    let type_name = RENAMED
        .iter()
        .find(|(d, _)| *d == dapr_type)
        .map_or(implementation, |(_, t)| *t);
    registry
        .get(kind, type_name)
        .map(|_| (kind, type_name.to_string()))
}

/// The kind a Dapr type's building block stands for, or the building
/// block itself when rewire has no such kind (to name the component).
pub(super) fn kind_of(dapr_type: &str) -> String {
    let block = dapr_type.split_once('.').map_or(dapr_type, |(b, _)| b);
    BUILDING_BLOCKS
        .iter()
        .find(|(b, _)| *b == block)
        .map_or(block, |(_, kind)| *kind)
        .to_string()
}

/// Every Dapr type rewire implements with `registry`, sorted.
pub(super) fn implemented(registry: &Registry) -> Vec<String> {
    let mut types: Vec<String> = registry
        .iter()
        .filter_map(|d| {
            let kind = d.kind;
            let (block, _) = BUILDING_BLOCKS.iter().find(|(_, k)| *k == kind)?;
            let renamed = RENAMED.iter().find(|(dapr, t)| {
                *t == d.type_name && dapr.split_once('.').is_some_and(|(b, _)| b == *block)
            });
            Some(renamed.map_or_else(
                || format!("{block}.{}", d.type_name),
                |(dapr, _)| (*dapr).to_string(),
            ))
        })
        .collect();
    types.sort();
    types.dedup();
    types
}

/// Whether `field` of Dapr type `dapr_type` names a file.
pub(super) fn is_path_field(dapr_type: &str, field: &str) -> bool {
    PATH_FIELDS.contains(&(dapr_type, field))
}

/// Why `field` of Dapr type `dapr_type` is dropped, if it is.
pub(super) fn ignored_field(dapr_type: &str, field: &str) -> Option<&'static str> {
    let block = dapr_type.split_once('.').map_or(dapr_type, |(b, _)| b);
    IGNORED_FIELDS
        .iter()
        .find(|(b, f, _)| *b == block && *f == field)
        .map(|(_, _, why)| *why)
}
