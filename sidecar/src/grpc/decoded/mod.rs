//! What a call's request holds once decoded, bounded before it is decoded.
//!
//! The listeners bound request bytes on the wire, but prost decodes a
//! repeated message of empty elements (2 bytes each on the wire) into
//! structs of ~100–150 bytes each: a 4 MiB `SaveState` of empty items
//! would hold ~300 MB. So each request message is measured first, by its
//! proto's schema (`schema`, from the descriptors the build compiled), in
//! one pass over its bytes (`estimate`), and charged to the listener's
//! body budget for as long as the call holds it (`scope`): a message that
//! could never fit is refused with `RESOURCE_EXHAUSTED` naming its decoded
//! size, and one that does not fit now with `RESOURCE_EXHAUSTED` the client
//! may retry.
//!
//! A unary call holds its request's charge until its handler answers; a
//! request stream's messages are checked against what is free as each is
//! decoded, and not held (its reader handles one before it reads the next,
//! and a stream gone quiet must not pin the budget). While tonic's codec
//! decodes, the message's bytes are still charged as a body being read,
//! and count toward what could fit. Messages decoded outside a call (an
//! app's answers to the sidecar's own calls) are not measured.

mod estimate;
mod schema;
mod scope;

pub(super) use scope::{admit, carried, HoldDecodedLayer};

#[cfg(test)]
mod tests;
