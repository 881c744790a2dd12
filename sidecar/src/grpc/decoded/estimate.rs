//! A message's decoded size, from its bytes and schema, in one pass and
//! without decoding it.
//!
//! The pass is more lenient than prost: whatever it calls malformed,
//! prost refuses too (so a message it cannot measure is left to prost,
//! which says why). What it measures is an upper estimate of the memory
//! prost's decoding takes at its peak: each message struct at its
//! estimated size; each string and bytes value as the allocator holds it
//! (its bytes, at least 8, in a chunk of at least 32); each repeated
//! field's array at the capacity a vector grows to (the next power of two)
//! and each map's table at hashbrown's (the next power of two of 8/7 of
//! its entries, a control byte each), half again for the old array or
//! table still held while it grows.

use super::schema::{FieldKind, MessageId, Schemas};

/// Nested messages measured at most: more than prost decodes (100), so a
/// message nested too deep for this is one prost refuses.
const DEPTH_LIMIT: u32 = 128;
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

/// The elements one repeated field holds in one message: its array is
/// charged once, at the capacity they make it grow to.
struct Elements {
    number: u32,
    count: u64,
    /// Bytes of one element in the array.
    element: u64,
    /// A map's table rather than a vector.
    map: bool,
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
    let mut arrays: Vec<Elements> = Vec::new();
    let mut add = |number: u32, count: u64, element: u64, map: bool| match arrays
        .iter_mut()
        .find(|array| array.number == number)
    {
        Some(array) => array.count = array.count.saturating_add(count),
        None => arrays.push(Elements {
            number,
            count,
            element,
            map,
        }),
    };
    while !bytes.is_empty() {
        let (number, wire_type) = key(&mut bytes)?;
        let field = shape.field(number);
        let repeated = field.is_some_and(|field| field.repeated);
        let cost = match wire_type {
            0 | 1 | 5 => {
                match wire_type {
                    0 => {
                        varint(&mut bytes)?;
                    }
                    1 => {
                        take(&mut bytes, 8)?;
                    }
                    _ => {
                        take(&mut bytes, 4)?;
                    }
                }
                if repeated {
                    add(number, 1, NUMBER_BYTES, false);
                }
                0
            }
            2 => {
                let length = varint(&mut bytes)?;
                let value = take(&mut bytes, length)?;
                let Some(field) = field else {
                    // Unknown: prost skips it.
                    continue;
                };
                match field.kind {
                    FieldKind::Text => {
                        if field.repeated {
                            add(number, 1, VEC_BYTES, false);
                        }
                        heap_bytes(value.len() as u64)
                    }
                    // Packed numbers: one byte each at least.
                    FieldKind::Scalar if field.repeated => {
                        add(number, value.len() as u64, NUMBER_BYTES, false);
                        0
                    }
                    FieldKind::Scalar => 0,
                    FieldKind::Message(inner) => {
                        let nested = depth.checked_sub(1).ok_or(Malformed)?;
                        let message = schemas.message(inner);
                        let within = fields_bytes(schemas, inner, value, nested)?;
                        if field.repeated {
                            add(number, 1, message.struct_bytes, message.map_entry);
                            within
                        } else {
                            // Inline in its parent's struct, or boxed
                            // (a message inside itself): counted again,
                            // an upper estimate either way.
                            message.struct_bytes.saturating_add(within)
                        }
                    }
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
    for array in &arrays {
        let held = if array.map {
            table_bytes(array.count, array.element)
        } else {
            vector_bytes(array.count, array.element)
        };
        total = total.saturating_add(held);
    }
    Ok(total)
}

/// What the allocator holds for `bytes` of a string or bytes value: at
/// least 8 (a vector's first capacity), in a chunk of at least 32 with 8
/// bytes of header, rounded to 16 (glibc's malloc).
fn heap_bytes(bytes: u64) -> u64 {
    if bytes == 0 {
        return 0;
    }
    let chunk = bytes.max(8).saturating_add(8 + 15) & !15;
    chunk.max(32)
}

/// What a vector of `count` elements of `element` bytes holds at its peak:
/// its capacity (doubled as it grew, from 4 or 8), and half again for the
/// old array while it grows.
fn vector_bytes(count: u64, element: u64) -> u64 {
    if count == 0 || element == 0 {
        return 0;
    }
    let first = if element == 1 { 8 } else { 4 };
    let capacity = count
        .max(first)
        .checked_next_power_of_two()
        .unwrap_or(u64::MAX);
    let array = heap_bytes(capacity.saturating_mul(element));
    array.saturating_add(array / 2)
}

/// What a hash map of `count` entries of `entry` bytes holds at its peak:
/// hashbrown's buckets (the next power of two of 8/7 of its entries, 4 or
/// 8 for a few), an entry and a control byte each and a group's width,
/// and half again for the old table while it grows.
fn table_bytes(count: u64, entry: u64) -> u64 {
    if count == 0 {
        return 0;
    }
    let buckets = match count {
        0..4 => 4,
        4..8 => 8,
        _ => (count.saturating_mul(8) / 7)
            .checked_next_power_of_two()
            .unwrap_or(u64::MAX),
    };
    let table = heap_bytes(
        buckets
            .saturating_mul(entry.saturating_add(1))
            .saturating_add(16),
    );
    table.saturating_add(table / 2)
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
