//! The normalised writer against `serde_json::Value`: the same text, with
//! each byte copied a bounded number of times.

use std::cell::Cell;

use serde::de::DeserializeSeed;
use serde_json::Value;

use super::{NormalisedJson, SMALL_OBJECT};

thread_local! {
    /// Bytes the writer copied on this thread (see `super::copied`).
    pub(super) static COPIED: Cell<usize> = const { Cell::new(0) };
}

/// `text` as the writer writes it after `prefix` (the output need not
/// start empty), with the bytes it copied; `None` when it refuses it.
fn normalised(prefix: &[u8], text: &str) -> Option<(String, usize)> {
    let mut out = prefix.to_vec();
    COPIED.with(|count| count.set(0));
    let mut deserializer = serde_json::Deserializer::from_str(text);
    NormalisedJson { out: &mut out }
        .deserialize(&mut deserializer)
        .and_then(|()| deserializer.end())
        .ok()?;
    let copied = COPIED.with(Cell::get);
    let written = out.strip_prefix(prefix).expect("the prefix is kept");
    Some((String::from_utf8(written.to_vec()).expect("UTF-8"), copied))
}

/// `text` as `Value` reads and writes it.
fn as_value(text: &str) -> Option<String> {
    serde_json::from_str::<Value>(text)
        .ok()
        .map(|value| value.to_string())
}

/// `levels` objects, each holding a member before and after its inner
/// one as `wrap` writes it, around a string of `size` bytes.
fn nested(levels: usize, size: usize, wrap: impl Fn(&str) -> String) -> String {
    let mut text = format!("\"{}\"", "x".repeat(size));
    for _ in 0..levels {
        text = wrap(&text);
    }
    text
}

/// A 1 MiB string under 127 objects that are all out of order (or repeat
/// a key) was copied into each parent's buffer, ~127 times; now each
/// byte is written about twice (read, then written in order once).
#[test]
fn a_large_value_deep_in_disordered_objects_is_copied_a_bounded_number_of_times() {
    /// A level around the inner value's text.
    type Wrap = fn(&str) -> String;
    // Arrays count as levels too: 63 objects in 63 arrays.
    let shapes: [(&str, usize, Wrap); 4] = [
        ("out of order", 127, |inner| {
            format!(r#"{{"b":0,"a":{inner}}}"#)
        }),
        ("a repeated key", 127, |inner| {
            format!(r#"{{"a":0,"a":{inner}}}"#)
        }),
        ("in arrays", 63, |inner| {
            format!(r#"[{{"b":[0],"a":{inner}}}]"#)
        }),
        ("in order", 127, |inner| format!(r#"{{"a":0,"b":{inner}}}"#)),
    ];
    for (shape, levels, wrap) in shapes {
        let text = nested(levels, 1 << 20, wrap);
        let (written, copied) = normalised(b"", &text).expect("read");
        assert_eq!(Some(&written), as_value(&text).as_ref(), "{shape}");
        assert!(
            copied < 4 * text.len(),
            "{shape}: {copied} bytes copied for {} of text",
            text.len()
        );
    }
}

/// Small disordered objects are put in order where they stand: a byte is
/// copied again only by the few small objects around it (at most
/// ~`SMALL_OBJECT` / 12 of them, twice each), however many there are.
#[test]
fn small_disordered_objects_are_put_in_order_where_they_stand_and_bounded() {
    let deep = nested(40, 1, |inner| format!(r#"{{"b":[],"a":{inner}}}"#));
    let many = format!(
        "[{}0]",
        r#"{"b":0,"a":{"d":1,"c":2},"a":3},"#.repeat(10_000)
    );
    for text in [deep, many] {
        let (written, copied) = normalised(b"", &text).expect("read");
        assert_eq!(Some(written), as_value(&text));
        assert!(
            copied < (4 + 2 * SMALL_OBJECT / 12) * text.len(),
            "{copied} bytes copied for {} of text",
            text.len()
        );
    }
}

/// A small pseudo-random generator (xorshift), so the documents are the
/// same on every run.
struct Random(u64);

impl Random {
    /// A number below `bound`.
    fn below(&mut self, bound: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % bound as u64) as usize
    }

    /// One of `choices`.
    fn pick<'c>(&mut self, choices: &[&'c str]) -> &'c str {
        choices[self.below(choices.len())]
    }
}

/// Keys that sort apart escaped and unescaped (`\u0041` is `A`, before
/// `B`), repeat, and hold multi-byte and control characters.
const KEYS: &[&str] = &[
    r#""a""#,
    r#""b""#,
    r#""B""#,
    r#""A""#,
    r#""\u0041""#,
    r#""""#,
    r#""é""#,
    r#""\u00e9""#,
    r#""\ud83d\ude00""#,
    r#""ab""#,
    r#""a\u0000""#,
    r#""~""#,
    r#""\/""#,
];

/// Scalars as `Value` writes them differently (`1e2` as `100.0`, `-0`).
const SCALARS: &[&str] = &[
    "0",
    "-0",
    "1.5",
    "1e2",
    "-1e-7",
    "18446744073709551616",
    "-9223372036854775809",
    "12345678901234567890",
    "true",
    "false",
    "null",
    r#""\u0041\n\"""#,
    r#""é\t""#,
    "[]",
    "{}",
];

/// Whitespace between tokens.
const SPACE: &[&str] = &["", "", "", " ", "\n\t "];

/// A random JSON value at most `depth` containers deep.
fn value(random: &mut Random, depth: usize, text: &mut String) {
    let kind = match depth {
        0 => 0,
        _ => random.below(6),
    };
    match kind {
        0 | 1 => match random.below(8) {
            // Strings around the size of a small object, both sides.
            0 => {
                let size = random.below(2 * SMALL_OBJECT);
                text.push('"');
                text.push_str(&"y".repeat(size));
                text.push('"');
            }
            _ => text.push_str(random.pick(SCALARS)),
        },
        2 => {
            text.push('[');
            for at in 0..random.below(4) {
                if at > 0 {
                    text.push(',');
                }
                text.push_str(random.pick(SPACE));
                value(random, depth - 1, text);
            }
            text.push(']');
        }
        _ => {
            text.push('{');
            for at in 0..random.below(6) {
                if at > 0 {
                    text.push(',');
                }
                text.push_str(random.pick(SPACE));
                text.push_str(random.pick(KEYS));
                text.push_str(random.pick(SPACE));
                text.push(':');
                value(random, depth - 1, text);
            }
            text.push_str(random.pick(SPACE));
            text.push('}');
        }
    }
}

/// Many documents of random nesting, key order and repeated keys (some
/// chains past serde_json's depth): each written as `Value` writes it,
/// after an output that already holds text too.
#[test]
fn random_documents_are_written_as_value_writes_them() {
    let mut random = Random(0x9e37_79b9_7f4a_7c15);
    for round in 0..3000 {
        let mut text = String::new();
        let depth = match round % 50 {
            0 => 130,
            _ => 1 + random.below(7),
        };
        if depth > 8 {
            // A chain: one object or array per level, to the limit.
            let mut chain = String::new();
            value(&mut random, 2, &mut chain);
            for _ in 0..depth - 1 {
                chain = match random.below(3) {
                    0 => format!("[{chain},1]"),
                    1 => format!(r#"{{"b":{chain},"a":0,"a":1}}"#),
                    _ => format!(r#"{{"a":0,"b":{chain}}}"#),
                };
            }
            text = chain;
        } else {
            value(&mut random, depth, &mut text);
        }
        let expected = as_value(&text);
        let prefix: &[u8] = match round % 2 {
            0 => b"",
            _ => b"[0,",
        };
        let written = normalised(prefix, &text).map(|(written, _)| written);
        assert_eq!(written, expected, "{text}");
    }
}
