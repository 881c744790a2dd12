//! A `serde_json::Value` deserializer that accepts strings for scalars and
//! rejects unknown struct fields, recording which one.

use std::cell::RefCell;

use serde::de::value::BorrowedStrDeserializer;
use serde::de::{
    self, DeserializeSeed, Deserializer, IntoDeserializer, MapAccess, SeqAccess, Unexpected,
    Visitor,
};
use serde_json::{Map, Value};

use super::error::MetadataError;

/// Stands for a value injected later (validation only).
pub(crate) const PLACEHOLDER: &str = "\u{0}rewire:injected";

type Error = serde_json::Error;

/// Deserializes borrowed metadata leniently. Nothing is copied: the
/// metadata object is read where it lies, and a value's path is worked out
/// only for an error.
pub(crate) struct Lenient<'p, 'a> {
    value: Node<'a>,
    placeholders: bool,
    findings: &'a Findings,
    at: At<'p>,
}

/// What a decode found wrong, shared by every level of it.
#[derive(Default)]
pub(crate) struct Findings {
    /// The first unknown field.
    pub(crate) unknown: RefCell<Option<MetadataError>>,
    /// Where the error the decode failed with arose: the path of the
    /// deepest value that failed (empty at the top).
    pub(crate) failed_at: RefCell<Option<String>>,
}

/// What a [`Lenient`] reads.
#[derive(Clone, Copy)]
enum Node<'a> {
    /// A value inside the metadata.
    Value(&'a Value),
    /// The metadata object itself (read as a `Value::Object` would be).
    Object(&'a Map<String, Value>),
}

/// Where a value sits in the metadata: a chain up to the top, on the stack.
#[derive(Clone, Copy)]
enum At<'p> {
    Top,
    Field(&'p At<'p>, &'p str),
    Index(&'p At<'p>, usize),
}

impl At<'_> {
    /// The path as errors show it: `a.b[2].c` (empty at the top).
    fn render(&self) -> String {
        match self {
            At::Top => String::new(),
            At::Field(parent, name) => {
                let parent = parent.render();
                if parent.is_empty() {
                    name.to_string()
                } else {
                    format!("{parent}.{name}")
                }
            }
            At::Index(parent, i) => format!("{}[{i}]", parent.render()),
        }
    }
}

impl<'a> Lenient<'_, 'a> {
    /// Reads the metadata object `map`.
    pub(crate) fn object(
        map: &'a Map<String, Value>,
        placeholders: bool,
        findings: &'a Findings,
    ) -> Self {
        Self {
            value: Node::Object(map),
            placeholders,
            findings,
            at: At::Top,
        }
    }
}

impl<'p, 'a> Lenient<'p, 'a> {
    fn child<'c>(&'c self, value: &'a Value, at: At<'c>) -> Lenient<'c, 'a> {
        Lenient {
            value: Node::Value(value),
            placeholders: self.placeholders,
            findings: self.findings,
            at,
        }
    }

    /// Reads the value at `at` with `seed`; an error is noted there when
    /// it is the first (an error passes every level on its way out, the
    /// deepest first). The seed's own errors count too: a type that reads
    /// a string and then refuses it fails at the string's path.
    fn read<T: DeserializeSeed<'a>>(
        &self,
        seed: T,
        value: &'a Value,
        at: At<'_>,
    ) -> Result<T::Value, Error> {
        self.read_with(value, at, |child| seed.deserialize(child))
    }

    /// Reads the value at `at` with `read`, noting an error there as
    /// [`Lenient::read`] does.
    fn read_with<T>(
        &self,
        value: &'a Value,
        at: At<'_>,
        read: impl FnOnce(Lenient<'_, 'a>) -> Result<T, Error>,
    ) -> Result<T, Error> {
        let result = read(self.child(value, at));
        if result.is_err() {
            let mut failed_at = self.findings.failed_at.borrow_mut();
            if failed_at.is_none() {
                *failed_at = Some(at.render());
            }
        }
        result
    }

    fn is_placeholder(&self) -> bool {
        self.placeholders && matches!(self.value, Node::Value(Value::String(s)) if s == PLACEHOLDER)
    }

    fn number<V: Visitor<'a>>(self, visitor: V) -> Result<V::Value, Error> {
        if self.is_placeholder() {
            return visitor.visit_u64(0);
        }
        match self.value {
            Node::Value(Value::String(s)) => {
                let s = s.trim();
                if let Ok(n) = s.parse::<u64>() {
                    visitor.visit_u64(n)
                } else if let Ok(n) = s.parse::<i64>() {
                    visitor.visit_i64(n)
                } else if let Ok(n) = s.parse::<f64>() {
                    visitor.visit_f64(n)
                } else {
                    Err(de::Error::invalid_type(Unexpected::Str(s), &visitor))
                }
            }
            _ => self.deserialize_any(visitor),
        }
    }

    fn check_fields(
        &self,
        map: &Map<String, Value>,
        fields: &'static [&'static str],
    ) -> Result<(), Error> {
        let Some(field) = map.keys().find(|k| !fields.contains(&k.as_str())) else {
            return Ok(());
        };
        let suggestion = fields
            .iter()
            .map(|known| {
                (
                    strsim::jaro_winkler(&field.to_lowercase(), &known.to_lowercase()),
                    *known,
                )
            })
            .filter(|(score, _)| *score > 0.8)
            .max_by(|a, b| a.0.total_cmp(&b.0))
            .map(|(_, known)| known.to_string());
        let path = self.at.render();
        let full = if path.is_empty() {
            field.clone()
        } else {
            format!("{path}.{field}")
        };
        *self.findings.unknown.borrow_mut() = Some(MetadataError::UnknownField {
            field: full,
            suggestion,
            known: fields.iter().map(|f| f.to_string()).collect(),
        });
        Err(de::Error::custom(format!("unknown field `{field}`")))
    }
}

macro_rules! lenient_numbers {
    ($($method:ident)*) => {
        $(fn $method<V: Visitor<'a>>(self, visitor: V) -> Result<V::Value, Error> {
            self.number(visitor)
        })*
    };
}

macro_rules! forward_to_any {
    ($($method:ident)*) => {
        $(fn $method<V: Visitor<'a>>(self, visitor: V) -> Result<V::Value, Error> {
            self.deserialize_any(visitor)
        })*
    };
}

impl<'a> Deserializer<'a> for Lenient<'_, 'a> {
    type Error = Error;

    fn deserialize_any<V: Visitor<'a>>(self, visitor: V) -> Result<V::Value, Error> {
        let value = match self.value {
            Node::Value(value) => value,
            Node::Object(map) => {
                return visitor.visit_map(Entries {
                    parent: &self,
                    entries: map.iter(),
                    value: None,
                })
            }
        };
        match value {
            Value::Null => visitor.visit_unit(),
            Value::Bool(b) => visitor.visit_bool(*b),
            Value::Number(n) => {
                if let Some(u) = n.as_u64() {
                    visitor.visit_u64(u)
                } else if let Some(i) = n.as_i64() {
                    visitor.visit_i64(i)
                } else {
                    visitor.visit_f64(n.as_f64().unwrap_or_default())
                }
            }
            Value::String(s) if self.is_placeholder() => {
                let _ = s;
                visitor.visit_borrowed_str("")
            }
            Value::String(s) => visitor.visit_borrowed_str(s),
            Value::Array(items) => visitor.visit_seq(Items {
                parent: &self,
                items: items.iter().enumerate(),
            }),
            Value::Object(map) => visitor.visit_map(Entries {
                parent: &self,
                entries: map.iter(),
                value: None,
            }),
        }
    }

    lenient_numbers!(deserialize_i8 deserialize_i16 deserialize_i32 deserialize_i64 deserialize_i128
        deserialize_u8 deserialize_u16 deserialize_u32 deserialize_u64 deserialize_u128
        deserialize_f32 deserialize_f64);

    forward_to_any!(deserialize_char deserialize_bytes deserialize_byte_buf deserialize_unit
        deserialize_seq deserialize_map deserialize_identifier deserialize_ignored_any);

    fn deserialize_bool<V: Visitor<'a>>(self, visitor: V) -> Result<V::Value, Error> {
        if self.is_placeholder() {
            return visitor.visit_bool(false);
        }
        match self.value {
            Node::Value(Value::String(s)) => match s.trim().to_ascii_lowercase().as_str() {
                "true" => visitor.visit_bool(true),
                "false" => visitor.visit_bool(false),
                _ => Err(de::Error::invalid_type(Unexpected::Str(s), &visitor)),
            },
            _ => self.deserialize_any(visitor),
        }
    }

    fn deserialize_str<V: Visitor<'a>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.value {
            Node::Value(Value::Number(n)) => visitor.visit_string(n.to_string()),
            Node::Value(Value::Bool(b)) => visitor.visit_string(b.to_string()),
            _ => self.deserialize_any(visitor),
        }
    }

    fn deserialize_string<V: Visitor<'a>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_str(visitor)
    }

    fn deserialize_option<V: Visitor<'a>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.value {
            Node::Value(Value::Null) => visitor.visit_none(),
            _ => visitor.visit_some(self),
        }
    }

    fn deserialize_unit_struct<V: Visitor<'a>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Error> {
        self.deserialize_any(visitor)
    }

    fn deserialize_newtype_struct<V: Visitor<'a>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Error> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_tuple<V: Visitor<'a>>(self, _len: usize, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_any(visitor)
    }

    fn deserialize_tuple_struct<V: Visitor<'a>>(
        self,
        _name: &'static str,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, Error> {
        self.deserialize_any(visitor)
    }

    fn deserialize_struct<V: Visitor<'a>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        if let Node::Value(Value::Object(map)) | Node::Object(map) = self.value {
            self.check_fields(map, fields)?;
        }
        self.deserialize_any(visitor)
    }

    fn deserialize_enum<V: Visitor<'a>>(
        self,
        _name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        match self.value {
            Node::Value(Value::String(_)) if self.is_placeholder() => {
                let first = variants.first().copied().unwrap_or_default();
                visitor.visit_enum(first.into_deserializer())
            }
            // A unit variant, named.
            Node::Value(Value::String(s)) => {
                visitor.visit_enum(BorrowedStrDeserializer::<Error>::new(s))
            }
            // `{"Variant": content}`: the content is read here, at
            // `….Variant`, as any other value is.
            Node::Value(Value::Object(map)) | Node::Object(map) => {
                let mut entries = map.iter();
                match (entries.next(), entries.next()) {
                    (Some((variant, content)), None) => visitor.visit_enum(Variant {
                        parent: &self,
                        name: variant,
                        content,
                    }),
                    _ => Err(de::Error::invalid_value(
                        Unexpected::Map,
                        &"a map with a single key (the variant)",
                    )),
                }
            }
            Node::Value(other) => Err(de::Error::invalid_type(
                kind_of(other),
                &"a string or a map with a single key (the variant)",
            )),
        }
    }
}

/// What kind of value `value` is, for an error, without the value itself.
fn kind_of(value: &Value) -> Unexpected<'static> {
    match value {
        Value::Null => Unexpected::Unit,
        Value::Bool(_) => Unexpected::Other("a boolean"),
        Value::Number(_) => Unexpected::Other("a number"),
        Value::String(_) => Unexpected::Other("a string"),
        Value::Array(_) => Unexpected::Seq,
        Value::Object(_) => Unexpected::Map,
    }
}

/// The variant `name` of an externally tagged enum, holding `content`.
struct Variant<'p, 'a> {
    parent: &'p Lenient<'p, 'a>,
    name: &'a str,
    content: &'a Value,
}

impl<'a> de::EnumAccess<'a> for Variant<'_, 'a> {
    type Error = Error;
    type Variant = Self;

    fn variant_seed<V: DeserializeSeed<'a>>(self, seed: V) -> Result<(V::Value, Self), Error> {
        let variant = seed.deserialize(BorrowedStrDeserializer::new(self.name))?;
        Ok((variant, self))
    }
}

impl<'a> de::VariantAccess<'a> for Variant<'_, 'a> {
    type Error = Error;

    fn unit_variant(self) -> Result<(), Error> {
        let at = At::Field(&self.parent.at, self.name);
        self.parent
            .read_with(self.content, at, |_| match self.content {
                Value::Null => Ok(()),
                other => Err(de::Error::invalid_type(kind_of(other), &"unit variant")),
            })
    }

    fn newtype_variant_seed<T: DeserializeSeed<'a>>(self, seed: T) -> Result<T::Value, Error> {
        let at = At::Field(&self.parent.at, self.name);
        self.parent.read(seed, self.content, at)
    }

    fn tuple_variant<V: Visitor<'a>>(self, len: usize, visitor: V) -> Result<V::Value, Error> {
        let at = At::Field(&self.parent.at, self.name);
        self.parent.read_with(self.content, at, |content| {
            content.deserialize_tuple(len, visitor)
        })
    }

    fn struct_variant<V: Visitor<'a>>(
        self,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        let at = At::Field(&self.parent.at, self.name);
        self.parent.read_with(self.content, at, |content| {
            content.deserialize_struct("", fields, visitor)
        })
    }
}

struct Items<'p, 'a> {
    parent: &'p Lenient<'p, 'a>,
    items: std::iter::Enumerate<std::slice::Iter<'a, Value>>,
}

impl<'a> SeqAccess<'a> for Items<'_, 'a> {
    type Error = Error;

    fn next_element_seed<T: DeserializeSeed<'a>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Error> {
        match self.items.next() {
            Some((i, value)) => self
                .parent
                .read(seed, value, At::Index(&self.parent.at, i))
                .map(Some),
            None => Ok(None),
        }
    }
}

struct Entries<'p, 'a> {
    parent: &'p Lenient<'p, 'a>,
    entries: serde_json::map::Iter<'a>,
    value: Option<(&'a String, &'a Value)>,
}

impl<'a> MapAccess<'a> for Entries<'_, 'a> {
    type Error = Error;

    fn next_key_seed<K: DeserializeSeed<'a>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Error> {
        match self.entries.next() {
            Some((key, value)) => {
                self.value = Some((key, value));
                seed.deserialize(BorrowedStrDeserializer::new(key))
                    .map(Some)
            }
            None => Ok(None),
        }
    }

    fn next_value_seed<V: DeserializeSeed<'a>>(&mut self, seed: V) -> Result<V::Value, Error> {
        match self.value.take() {
            Some((key, value)) => self
                .parent
                .read(seed, value, At::Field(&self.parent.at, key)),
            None => Err(de::Error::custom("value requested before key")),
        }
    }
}
