//! A message's decoded size, from its bytes and schema, in one pass and
//! without decoding it.
//!
//! The pass is more lenient than prost: whatever it calls malformed,
//! prost refuses too (so a message it cannot measure is left to prost,
//! which says why). What it measures is an upper estimate of what prost
//! builds, not counting the spare capacity of growing vectors and maps
//! (at most as much again): each message struct at its estimated size,
//! each string and bytes value copied, each map entry with a control
//! byte's slack, each packed number at 8 bytes.

use super::schema::{FieldKind, MessageId, Schemas};

/// Nested messages measured at most: more than prost decodes (100), so a
/// message nested too deep for this is one prost refuses.
const DEPTH_LIMIT: u32 = 128;
/// Bytes a hash map spends per entry beyond the entry (control byte and
/// alignment, rounded up).
const MAP_ENTRY_SLACK: u64 = 8;
/// Bytes a decoded number takes at most.
const NUMBER_BYTES: u64 = 8;
/// A vector's header, as an element of a repeated string or bytes field.
const VEC_BYTES: u64 = 24;

/// The bytes are not protobuf that prost would decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Malformed;

/// What `bytes`, a message `id` of `schemas`, holds once decoded, at most.
pub(super) fn decoded_bytes(
    schemas: &Schemas,
    id: MessageId,
    bytes: &[u8],
) -> Result<u64, Malformed> {
    let fields = fields_bytes(schemas, id, bytes, DEPTH_LIMIT)?;
    Ok(schemas.message(id).struct_bytes.saturating_add(fields))
}

/// What the fields in `bytes` of message `id` hold beyond its struct.
fn fields_bytes(
    schemas: &Schemas,
    id: MessageId,
    mut bytes: &[u8],
    depth: u32,
) -> Result<u64, Malformed> {
    let shape = schemas.message(id);
    let mut total: u64 = 0;
    while !bytes.is_empty() {
        let (number, wire_type) = key(&mut bytes)?;
        let field = shape.field(number);
        let repeated = field.is_some_and(|field| field.repeated);
        let cost = match wire_type {
            0 => {
                varint(&mut bytes)?;
                if repeated {
                    NUMBER_BYTES
                } else {
                    0
                }
            }
            1 | 5 => {
                take(&mut bytes, if wire_type == 1 { 8 } else { 4 })?;
                if repeated {
                    NUMBER_BYTES
                } else {
                    0
                }
            }
            2 => {
                let length = varint(&mut bytes)?;
                let value = take(&mut bytes, length)?;
                match field {
                    None => 0,
                    Some(field) => match field.kind {
                        FieldKind::Text if field.repeated => VEC_BYTES + value.len() as u64,
                        FieldKind::Text => value.len() as u64,
                        // Packed numbers: one byte each at least.
                        FieldKind::Scalar if field.repeated => value.len() as u64 * NUMBER_BYTES,
                        FieldKind::Scalar => 0,
                        FieldKind::Message(inner) => {
                            let nested = depth.checked_sub(1).ok_or(Malformed)?;
                            let message = schemas.message(inner);
                            let slack = if message.map_entry {
                                MAP_ENTRY_SLACK
                            } else {
                                0
                            };
                            // A singular message is counted again though
                            // its struct is inline: an upper estimate.
                            message.struct_bytes
                                + slack
                                + fields_bytes(schemas, inner, value, nested)?
                        }
                    },
                }
            }
            3 => {
                skip_group(&mut bytes, number, depth)?;
                0
            }
            _ => return Err(Malformed),
        };
        total = total.saturating_add(cost);
    }
    Ok(total)
}

/// Skips a group's fields up to its end (prost skips unknown groups).
fn skip_group(bytes: &mut &[u8], number: u32, depth: u32) -> Result<(), Malformed> {
    let nested = depth.checked_sub(1).ok_or(Malformed)?;
    loop {
        let (inner, wire_type) = key(bytes)?;
        match wire_type {
            0 => {
                varint(bytes)?;
            }
            1 => {
                take(bytes, 8)?;
            }
            5 => {
                take(bytes, 4)?;
            }
            2 => {
                let length = varint(bytes)?;
                take(bytes, length)?;
            }
            3 => skip_group(bytes, inner, nested)?,
            4 if inner == number => return Ok(()),
            _ => return Err(Malformed),
        }
    }
}

/// A field's key: its number and wire type.
fn key(bytes: &mut &[u8]) -> Result<(u32, u8), Malformed> {
    let key = varint(bytes)?;
    let key = u32::try_from(key).map_err(|_| Malformed)?;
    let number = key >> 3;
    if number == 0 {
        return Err(Malformed);
    }
    Ok((number, (key & 7) as u8))
}

/// A varint of at most 10 bytes.
fn varint(bytes: &mut &[u8]) -> Result<u64, Malformed> {
    let mut value: u64 = 0;
    for (at, &byte) in bytes.iter().enumerate().take(10) {
        value |= u64::from(byte & 0x7f) << (7 * at);
        if byte < 0x80 {
            *bytes = &bytes[at + 1..];
            return Ok(value);
        }
    }
    Err(Malformed)
}

/// The next `length` bytes.
fn take<'a>(bytes: &mut &'a [u8], length: impl TryInto<usize>) -> Result<&'a [u8], Malformed> {
    let length = length.try_into().map_err(|_| Malformed)?;
    if length > bytes.len() {
        return Err(Malformed);
    }
    let (taken, rest) = bytes.split_at(length);
    *bytes = rest;
    Ok(taken)
}
