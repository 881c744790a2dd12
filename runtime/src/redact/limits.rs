//! How many secret forms the redactor remembers: bounded, counting those
//! a component holds and those let go of within the grace (a retired
//! component's value may still be printed meanwhile); older ones are
//! forgotten, so values rotated in and out keep within the bound.
//!
//! A form costs its bytes, about 100 bytes held in the set, and at most
//! 20 bytes a byte in the matcher, rebuilt (linear in the bytes) when a
//! new value is remembered or old ones forgotten: at the limits, about
//! 25 MiB of set and 40 MiB of matcher. Past them a component is refused,
//! never a value in force forgotten:
//! one whose own inline secret values would take more than a component's
//! share at validation, one whose values would fill the process's room
//! when it starts.

use std::collections::BTreeSet;

use serde_json::{Map, Value};

/// The forms the process remembers at most.
pub(super) const MAX_FORMS: usize = 256 * 1024;
/// Their bytes at most.
pub(super) const MAX_BYTES: usize = 2 * 1024 * 1024;
/// The forms one component's inline secret values may take.
const COMPONENT_MAX_FORMS: usize = 4096;
/// Their bytes at most.
const COMPONENT_MAX_BYTES: usize = 256 * 1024;

/// An error where `new` forms of `new_bytes` would take the process's
/// remembered `held` forms of `held_bytes` past the limits.
pub(super) fn check_room(
    held: usize,
    held_bytes: usize,
    new: usize,
    new_bytes: usize,
) -> Result<(), String> {
    if held + new <= MAX_FORMS && held_bytes + new_bytes <= MAX_BYTES {
        return Ok(());
    }
    Err(format!(
        "cannot remember its secret values (new forms: {new}, {new_bytes} bytes) to scrub from logs \
         and errors: the process already remembers {held} ({held_bytes} bytes: those of the components \
         running, and of those retired in the last {grace} minutes, which may still be printed), and holds \
         at most {MAX_FORMS} ({MAX_BYTES} bytes)",
        grace = super::held::FORGET_AFTER.as_secs() / 60
    ))
}

/// The problem of a component whose metadata holds more inline values in
/// fields named like a secret than one component may have remembered
/// ([`COMPONENT_MAX_FORMS`], [`COMPONENT_MAX_BYTES`]); `None` where they
/// fit. Counted in the forms the redactor would remember.
pub(crate) fn too_many_secret_values(metadata: &Map<String, Value>) -> Option<String> {
    let values = super::secret_fields::secret_field_values(metadata);
    let raw_bytes: usize = values.iter().map(String::len).sum();
    // Each value takes a form or more, of its bytes or more: past the
    // limits without building them.
    let past_already = values.len() > COMPONENT_MAX_FORMS || raw_bytes > COMPONENT_MAX_BYTES;
    let (forms, bytes, at_least) = if past_already {
        (values.len(), raw_bytes, " or more")
    } else {
        let forms: BTreeSet<String> = values
            .iter()
            .flat_map(|value| super::forms_to_scrub(value))
            .collect();
        (forms.len(), forms.iter().map(String::len).sum(), "")
    };
    if forms <= COMPONENT_MAX_FORMS && bytes <= COMPONENT_MAX_BYTES {
        return None;
    }
    Some(format!(
        "metadata holds {} values in fields named like a secret, {forms}{at_least} forms \
         ({bytes}{at_least} bytes) to remember to scrub them from logs and errors: a component \
         may have at most {COMPONENT_MAX_FORMS} ({COMPONENT_MAX_BYTES} bytes)",
        values.len()
    ))
}
