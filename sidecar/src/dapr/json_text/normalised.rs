//! [`NormalisedJson`]: a JSON value written as `serde_json::Value` would
//! read and then write it, without building it, each byte copied a
//! bounded number of times however deep the value is.
//!
//! The text goes to the output in document order as it is read (scalars,
//! strings and keys as serde_json writes them, arrays as they come). An
//! object whose keys arrive strictly increasing is then already as `Value`
//! writes it. An object that is disordered (a key not after the one
//! before it: out of order or repeated) is put in order when it closes:
//! where it stands when it is small ([`SMALL_OBJECT`]), else it is
//! described (its span, and its members' spans by key, a repeated key's
//! last) and the whole text is written once more at the end with each
//! described object's members in that order. A member's text is copied by
//! its own span then, not once per level as a buffer per object did.

use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, Error, MapAccess, SeqAccess, Visitor};
use serde::Serialize;

#[cfg(test)]
mod tests;

/// The most bytes of a disordered object put in order where it stands
/// when it closes (its members copied out and back); a larger one is
/// described and written in order at the end. A byte is so copied by at
/// most about 256 / 13 nested small objects (`{"b":0,"a":…}` adds 12).
const SMALL_OBJECT: usize = 256;

/// Writes a JSON value to `out` as `serde_json::Value` would read and then
/// write it (compact, an object's members by key with a repeated key's
/// last value, numbers and strings as serde_json prints them), without
/// building it: the text is written as it is read and only disordered
/// objects are put in order (see the module), so the memory is about the
/// text's size plus 16 bytes per member of the objects open at a time (as
/// much again while one is sorted) and 8 per member of a large disordered
/// object, not a tree's. It reads in the document's own deserializer: the
/// depth is serde_json's.
pub(crate) struct NormalisedJson<'o> {
    /// Where the JSON text goes (appended).
    pub(crate) out: &'o mut Vec<u8>,
}

impl NormalisedJson<'_> {
    /// Writes `value` with serde_json's serializer.
    fn write<T: Serialize + ?Sized, E: Error>(self, value: &T) -> Result<(), E> {
        let before = self.out.len();
        serde_json::to_writer(&mut *self.out, value).map_err(E::custom)?;
        copied(self.out.len() - before);
        Ok(())
    }

    /// Writes an array or object that `read` reads into a [`Writer`] on
    /// the output, then puts its large disordered objects in order.
    fn container<E: Error>(
        self,
        read: impl FnOnce(Node<'_, '_>) -> Result<bool, E>,
    ) -> Result<(), E> {
        let mut writer = Writer::new(self.out);
        read(Node {
            writer: &mut writer,
        })?;
        writer.finish();
        Ok(())
    }
}

impl<'de> DeserializeSeed<'de> for NormalisedJson<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for NormalisedJson<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any valid JSON value")
    }

    fn visit_bool<E: Error>(self, value: bool) -> Result<(), E> {
        self.write(&value)
    }

    fn visit_i64<E: Error>(self, value: i64) -> Result<(), E> {
        self.write(&value)
    }

    fn visit_u64<E: Error>(self, value: u64) -> Result<(), E> {
        self.write(&value)
    }

    fn visit_f64<E: Error>(self, value: f64) -> Result<(), E> {
        // serde_json writes a float that is no number as `null`, as
        // `Value` holds it.
        self.write(&value)
    }

    fn visit_str<E: Error>(self, value: &str) -> Result<(), E> {
        self.write(value)
    }

    fn visit_none<E: Error>(self) -> Result<(), E> {
        self.write(&())
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        self.deserialize(deserializer)
    }

    fn visit_unit<E: Error>(self) -> Result<(), E> {
        self.write(&())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<(), A::Error> {
        self.container(|node| node.visit_seq(seq))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<(), A::Error> {
        self.container(|node| node.visit_map(map))
    }
}

/// A range of bytes: of the output, or of the open objects' keys.
#[derive(Debug, Clone, Copy)]
struct Span {
    start: u32,
    end: u32,
}

impl Span {
    /// The range `start..end`, refused past 4 GiB (offsets are `u32`, to
    /// keep 16 bytes per member).
    fn of<E: Error>(start: usize, end: usize) -> Result<Self, E> {
        let offset = |at: usize| {
            u32::try_from(at).map_err(|_| {
                E::custom("JSON value over 4 GiB: past what the normalised JSON writer indexes")
            })
        };
        Ok(Self {
            start: offset(start)?,
            end: offset(end)?,
        })
    }

    /// As a `usize` range.
    fn range(self) -> std::ops::Range<usize> {
        self.start as usize..self.end as usize
    }
}

/// A member of an open object: its key (unescaped, in [`Writer::keys`])
/// and its text (`"key":value`, in the output).
#[derive(Debug, Clone, Copy)]
struct OpenMember {
    key: Span,
    text: Span,
}

/// A large disordered object, written in order at the end: its text in
/// the output, and its members' texts in order (in
/// [`Writer::deferred_members`]).
#[derive(Debug, Clone, Copy)]
struct Deferred {
    text: Span,
    members: Span,
}

/// The state of one value written: the output (the text in document
/// order, from `base`) and what puts its disordered objects in order.
struct Writer<'o> {
    /// The output; the value's text starts at `base`.
    out: &'o mut Vec<u8>,
    /// Where the value's text starts in `out`.
    base: usize,
    /// The keys of the open objects' members, unescaped (to compare).
    keys: Vec<u8>,
    /// The open objects' members, innermost object's last.
    members: Vec<OpenMember>,
    /// The large disordered objects, as they closed.
    deferred: Vec<Deferred>,
    /// Their members' texts, each object's in order.
    deferred_members: Vec<Span>,
    /// Where a small disordered object is put in order.
    scratch: Vec<u8>,
}

impl<'o> Writer<'o> {
    /// A writer appending to `out`.
    fn new(out: &'o mut Vec<u8>) -> Self {
        Self {
            base: out.len(),
            out,
            keys: Vec::new(),
            members: Vec::new(),
            deferred: Vec::new(),
            deferred_members: Vec::new(),
            scratch: Vec::new(),
        }
    }

    /// Appends one byte.
    fn push(&mut self, byte: u8) {
        self.out.push(byte);
        copied(1);
    }

    /// Appends `value` as serde_json writes it.
    fn write<T: Serialize + ?Sized, E: Error>(&mut self, value: &T) -> Result<(), E> {
        let before = self.out.len();
        serde_json::to_writer(&mut *self.out, value).map_err(E::custom)?;
        copied(self.out.len() - before);
        Ok(())
    }

    /// A key of an open object.
    fn key(&self, key: Span) -> &[u8] {
        &self.keys[key.range()]
    }

    /// Puts the object that just closed in order if it is disordered:
    /// its members are `members[first_member..]`, its text
    /// `out[start..]`. Whether its text now holds a deferred object.
    fn close<E: Error>(
        &mut self,
        start: usize,
        first_member: usize,
        disordered: bool,
        holds_deferred: bool,
    ) -> Result<bool, E> {
        if !disordered {
            return Ok(holds_deferred);
        }
        let text = Span::of(start, self.out.len())?;
        let keys = &self.keys;
        let members = &mut self.members[first_member..];
        // By key; stable, so a repeated key's last value ends its run
        // (and members in order, or strictly reversed, sort in one pass).
        members.sort_by(|a, b| keys[a.key.range()].cmp(&keys[b.key.range()]));
        let members = &self.members[first_member..];
        let kept = members.iter().enumerate().filter(|(at, member)| {
            members
                .get(at + 1)
                .is_none_or(|next| keys[next.key.range()] != keys[member.key.range()])
        });
        if !holds_deferred && text.range().len() <= SMALL_OBJECT {
            // Small and plain text: in order where it stands.
            self.scratch.clear();
            self.scratch.push(b'{');
            for (written, (_, member)) in kept.enumerate() {
                if written > 0 {
                    self.scratch.push(b',');
                }
                self.scratch
                    .extend_from_slice(&self.out[member.text.range()]);
            }
            self.scratch.push(b'}');
            self.out.truncate(start);
            self.out.extend_from_slice(&self.scratch);
            copied(2 * self.scratch.len());
            return Ok(false);
        }
        let first = self.deferred_members.len();
        self.deferred_members
            .extend(kept.map(|(_, member)| member.text));
        let members = Span::of(first, self.deferred_members.len())?;
        self.deferred.push(Deferred { text, members });
        Ok(true)
    }

    /// Writes the large disordered objects in order: the value's text is
    /// written once more, each such object's members by key.
    fn finish(self) {
        let Writer {
            out,
            base,
            mut deferred,
            deferred_members,
            ..
        } = self;
        if deferred.is_empty() {
            return;
        }
        deferred.sort_unstable_by_key(|object| object.text.start);
        let ordered = Ordered {
            text: out.as_slice(),
            deferred: &deferred,
            deferred_members: &deferred_members,
        };
        let mut written = Vec::with_capacity(out.len() - base);
        ordered.write(&mut written, base..out.len());
        if base == 0 {
            *out = written;
        } else {
            out.truncate(base);
            out.extend_from_slice(&written);
            copied(written.len());
        }
    }
}

/// The text read, with its large disordered objects to write in order.
struct Ordered<'t> {
    /// The text in document order.
    text: &'t [u8],
    /// The large disordered objects, by where they start.
    deferred: &'t [Deferred],
    /// Their members' texts, each object's in order.
    deferred_members: &'t [Span],
}

impl Ordered<'_> {
    /// Writes `text[range]` to `to`, each large disordered object in it
    /// with its members in order (each member written the same way, as it
    /// may hold more). Nested as deep as the objects are (serde_json's
    /// limit: 127).
    fn write(&self, to: &mut Vec<u8>, range: std::ops::Range<usize>) {
        let mut at = range.start;
        let mut next = self
            .deferred
            .partition_point(|object| (object.text.start as usize) < at);
        while let Some(object) = self
            .deferred
            .get(next)
            .filter(|object| (object.text.start as usize) < range.end)
        {
            let before = to.len();
            to.extend_from_slice(&self.text[at..object.text.start as usize]);
            to.push(b'{');
            copied(to.len() - before);
            for (written, member) in self.deferred_members[object.members.range()]
                .iter()
                .enumerate()
            {
                if written > 0 {
                    to.push(b',');
                    copied(1);
                }
                self.write(to, member.range());
            }
            to.push(b'}');
            copied(1);
            at = object.text.end as usize;
            // The objects inside this one start before its end.
            next += self.deferred[next..].partition_point(|inner| (inner.text.start as usize) < at);
        }
        to.extend_from_slice(&self.text[at..range.end]);
        copied(range.end - at);
    }
}

/// A value written into a [`Writer`]; reads as whether its text holds a
/// large disordered object.
struct Node<'w, 'o> {
    writer: &'w mut Writer<'o>,
}

impl<'de> DeserializeSeed<'de> for Node<'_, '_> {
    type Value = bool;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<bool, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Node<'_, '_> {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any valid JSON value")
    }

    fn visit_bool<E: Error>(self, value: bool) -> Result<bool, E> {
        self.writer.write(&value).map(|()| false)
    }

    fn visit_i64<E: Error>(self, value: i64) -> Result<bool, E> {
        self.writer.write(&value).map(|()| false)
    }

    fn visit_u64<E: Error>(self, value: u64) -> Result<bool, E> {
        self.writer.write(&value).map(|()| false)
    }

    fn visit_f64<E: Error>(self, value: f64) -> Result<bool, E> {
        // serde_json writes a float that is no number as `null`, as
        // `Value` holds it.
        self.writer.write(&value).map(|()| false)
    }

    fn visit_str<E: Error>(self, value: &str) -> Result<bool, E> {
        self.writer.write(value).map(|()| false)
    }

    fn visit_none<E: Error>(self) -> Result<bool, E> {
        self.writer.write(&()).map(|()| false)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<bool, D::Error> {
        self.deserialize(deserializer)
    }

    fn visit_unit<E: Error>(self) -> Result<bool, E> {
        self.writer.write(&()).map(|()| false)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<bool, A::Error> {
        let writer = self.writer;
        writer.push(b'[');
        let mut holds_deferred = false;
        let mut first = true;
        while let Some(held) = seq.next_element_seed(Element {
            writer: &mut *writer,
            comma: !first,
        })? {
            holds_deferred |= held;
            first = false;
        }
        writer.push(b']');
        Ok(holds_deferred)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<bool, A::Error> {
        let writer = self.writer;
        let start = writer.out.len();
        writer.push(b'{');
        let first_member = writer.members.len();
        let first_key = writer.keys.len();
        let mut disordered = false;
        let mut holds_deferred = false;
        loop {
            let comma = writer.members.len() > first_member;
            let Some((key, text_start)) = map.next_key_seed(MemberKey {
                writer: &mut *writer,
                comma,
            })?
            else {
                break;
            };
            holds_deferred |= map.next_value_seed(Node {
                writer: &mut *writer,
            })?;
            let text = Span::of(text_start, writer.out.len())?;
            if let Some(previous) = writer.members[first_member..].last() {
                disordered |= writer.key(previous.key) >= writer.key(key);
            }
            writer.members.push(OpenMember { key, text });
        }
        writer.push(b'}');
        let held = writer.close(start, first_member, disordered, holds_deferred);
        writer.members.truncate(first_member);
        writer.keys.truncate(first_key);
        held
    }
}

/// An array's element, after a comma unless it is the first.
struct Element<'w, 'o> {
    writer: &'w mut Writer<'o>,
    comma: bool,
}

impl<'de> DeserializeSeed<'de> for Element<'_, '_> {
    type Value = bool;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<bool, D::Error> {
        if self.comma {
            self.writer.push(b',');
        }
        Node {
            writer: self.writer,
        }
        .deserialize(deserializer)
    }
}

/// A member's key, after a comma unless it is the first: written as
/// serde_json writes a string then `:`, and kept unescaped to compare.
/// Reads as the key's span and where the member's text starts.
struct MemberKey<'w, 'o> {
    writer: &'w mut Writer<'o>,
    comma: bool,
}

impl<'de> DeserializeSeed<'de> for MemberKey<'_, '_> {
    type Value = (Span, usize);

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for MemberKey<'_, '_> {
    type Value = (Span, usize);

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string key")
    }

    fn visit_str<E: Error>(self, key: &str) -> Result<Self::Value, E> {
        let writer = self.writer;
        if self.comma {
            writer.push(b',');
        }
        let text_start = writer.out.len();
        let key_start = writer.keys.len();
        writer.keys.extend_from_slice(key.as_bytes());
        copied(key.len());
        let span = Span::of(key_start, writer.keys.len())?;
        writer.write(key)?;
        writer.push(b':');
        Ok((span, text_start))
    }
}

/// Bytes the writer copied, in tests: every byte written to the output or
/// a buffer, each time it is.
#[cfg(test)]
fn copied(bytes: usize) {
    tests::COPIED.with(|count| count.set(count.get() + bytes));
}

/// Bytes the writer copied: counted in tests only.
#[cfg(not(test))]
fn copied(_: usize) {}
