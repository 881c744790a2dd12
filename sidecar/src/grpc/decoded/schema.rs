//! The protos' messages as far as their decoded size goes: which fields
//! are messages, text or numbers, and how large each message's struct is.

use std::collections::HashMap;
use std::sync::OnceLock;

use prost::Message as _;
use prost_types::field_descriptor_proto::{Label, Type};
use prost_types::{DescriptorProto, FileDescriptorSet};

/// The descriptors of `sidecar/proto`, without comments (`build.rs`).
const EMBEDDED: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/request_schemas.bin"));

/// A message, by its place in [`Schemas`].
pub(super) type MessageId = usize;

/// What one field decodes into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum FieldKind {
    /// A number, bool or enum: at most 8 bytes.
    Scalar,
    /// A string or bytes: its bytes, copied (or a message type the
    /// descriptors do not hold, kept as bytes would be).
    Text,
    /// A message of its own (a map's entry is one).
    Message(MessageId),
}

/// One field of a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct FieldShape {
    pub(super) number: u32,
    pub(super) kind: FieldKind,
    /// Repeated (a map's field is, as the wire sees it).
    pub(super) repeated: bool,
}

/// One message: its struct's size and its fields.
#[derive(Debug)]
pub(super) struct MessageShape {
    /// The bytes of the struct it decodes into, at most.
    pub(super) struct_bytes: u64,
    /// Its fields, by number.
    fields: Vec<FieldShape>,
    /// A map's entry (its key and value), which a hash map holds.
    pub(super) map_entry: bool,
}

impl MessageShape {
    /// The field numbered `number`, if the message has one.
    pub(super) fn field(&self, number: u32) -> Option<&FieldShape> {
        self.fields
            .binary_search_by_key(&number, |field| field.number)
            .ok()
            .map(|at| &self.fields[at])
    }
}

/// Every message of a descriptor set, and each method's request message.
#[derive(Debug)]
pub(super) struct Schemas {
    messages: Vec<MessageShape>,
    /// Each method's request message by its path, `/package.Service/Method`.
    requests: HashMap<String, MessageId, foldhash::fast::RandomState>,
    /// Each message's id by its full name (`.package.Message`).
    #[cfg(test)]
    names: HashMap<String, MessageId, foldhash::fast::RandomState>,
}

/// Bytes the struct of a field of each shape takes in its message.
const VEC_BYTES: u64 = 24;
const MAP_BYTES: u64 = 48;
const SCALAR_BYTES: u64 = 8;
/// The `Option` tag of an inline message field, or a box's pointer.
const POINTER_BYTES: u64 = 8;

impl Schemas {
    /// The schemas of the sidecar's own protos.
    pub(super) fn embedded() -> &'static Self {
        static SCHEMAS: OnceLock<Schemas> = OnceLock::new();
        SCHEMAS.get_or_init(|| {
            // Written by `build.rs` from descriptors protox made: it decodes.
            let set = FileDescriptorSet::decode(EMBEDDED).unwrap_or_default();
            Self::of(&set)
        })
    }

    /// The schemas of every message and method in `set`.
    pub(super) fn of(set: &FileDescriptorSet) -> Self {
        let mut found = Vec::new();
        for file in &set.file {
            let package = file.package();
            let prefix = if package.is_empty() {
                String::new()
            } else {
                format!(".{package}")
            };
            for message in &file.message_type {
                collect(&prefix, message, &mut found);
            }
        }
        let names: HashMap<String, MessageId, _> = found
            .iter()
            .enumerate()
            .map(|(id, (name, _))| (name.clone(), id))
            .collect();
        let mut fields: Vec<Vec<FieldShape>> = found
            .iter()
            .map(|(_, message)| shapes(message, &names))
            .collect();
        for message in &mut fields {
            message.sort_by_key(|field| field.number);
        }
        let maps: Vec<bool> = found
            .iter()
            .map(|(_, message)| message.options.as_ref().is_some_and(|o| o.map_entry()))
            .collect();
        let sizes = StructSizes::of(&fields, &maps);
        let messages = fields
            .into_iter()
            .zip(sizes)
            .zip(maps)
            .map(|((fields, struct_bytes), map_entry)| MessageShape {
                struct_bytes,
                fields,
                map_entry,
            })
            .collect();
        let mut requests = HashMap::default();
        for file in &set.file {
            let package = file.package();
            for service in &file.service {
                let service_name = if package.is_empty() {
                    service.name().to_string()
                } else {
                    format!("{package}.{}", service.name())
                };
                for method in &service.method {
                    if let Some(&id) = names.get(method.input_type()) {
                        requests.insert(format!("/{service_name}/{}", method.name()), id);
                    }
                }
            }
        }
        Self {
            messages,
            requests,
            #[cfg(test)]
            names,
        }
    }

    /// The request message of the method at `path`, if it is one of these.
    pub(super) fn request_of(&self, path: &str) -> Option<MessageId> {
        self.requests.get(path).copied()
    }

    /// The message `id`.
    pub(super) fn message(&self, id: MessageId) -> &MessageShape {
        &self.messages[id]
    }

    /// The message named `name` (`.package.Message`).
    #[cfg(test)]
    pub(super) fn named(&self, name: &str) -> Option<MessageId> {
        self.names.get(name).copied()
    }
}

/// Every message under `prefix`, nested ones included, with full names.
fn collect<'a>(
    prefix: &str,
    message: &'a DescriptorProto,
    found: &mut Vec<(String, &'a DescriptorProto)>,
) {
    let name = format!("{prefix}.{}", message.name());
    for nested in &message.nested_type {
        collect(&name, nested, found);
    }
    found.push((name, message));
}

/// The fields of `message`.
fn shapes(
    message: &DescriptorProto,
    names: &HashMap<String, MessageId, foldhash::fast::RandomState>,
) -> Vec<FieldShape> {
    message
        .field
        .iter()
        .filter_map(|field| {
            let number = u32::try_from(field.number()).ok()?;
            let kind = match field.r#type() {
                Type::Message | Type::Group => names
                    .get(field.type_name())
                    .map_or(FieldKind::Text, |&id| FieldKind::Message(id)),
                Type::String | Type::Bytes => FieldKind::Text,
                _ => FieldKind::Scalar,
            };
            Some(FieldShape {
                number,
                kind,
                repeated: field.label() == Label::Repeated,
            })
        })
        .collect()
}

/// Each message's struct size, worked out once: a message inside itself
/// (prost boxes it) counts as a pointer.
struct StructSizes<'a> {
    fields: &'a [Vec<FieldShape>],
    maps: &'a [bool],
    sizes: Vec<Option<u64>>,
    in_progress: Vec<bool>,
}

impl<'a> StructSizes<'a> {
    fn of(fields: &'a [Vec<FieldShape>], maps: &'a [bool]) -> Vec<u64> {
        let mut sizes = Self {
            fields,
            maps,
            sizes: vec![None; fields.len()],
            in_progress: vec![false; fields.len()],
        };
        (0..fields.len()).map(|id| sizes.size(id)).collect()
    }

    fn size(&mut self, id: MessageId) -> u64 {
        if let Some(size) = self.sizes[id] {
            return size;
        }
        self.in_progress[id] = true;
        let mut total = 0;
        for field in self.fields[id].iter().copied() {
            total += match (field.kind, field.repeated) {
                (FieldKind::Message(entry), true) if self.maps[entry] => MAP_BYTES,
                (_, true) | (FieldKind::Text, false) => VEC_BYTES,
                (FieldKind::Scalar, false) => SCALAR_BYTES,
                (FieldKind::Message(inner), false) if self.in_progress[inner] => POINTER_BYTES,
                (FieldKind::Message(inner), false) => POINTER_BYTES + self.size(inner),
            };
        }
        self.in_progress[id] = false;
        self.sizes[id] = Some(total);
        total
    }
}
