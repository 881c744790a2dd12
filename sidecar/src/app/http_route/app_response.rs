//! [`AppResponseScanner`]: the outcome an app's `2xx` answer to a delivery
//! means, read as daprd reads it (Go's
//! `json.NewDecoder(body).Decode(&appResponse)` into Dapr's
//! `AppResponse{Status string "json:\"status\""}`), from pieces of the body
//! as they come, in constant memory.
//!
//! As Go's decoder: only the first JSON value is read, and nothing after
//! it; its syntax is checked whole first (Go's scanner: strings without
//! raw control characters, `\u` escapes of four hex digits, any other
//! bytes taken as they are, numbers and literals exactly as JSON spells
//! them, at most [`MAX_DEPTH`] nested arrays and objects); an object's key
//! `status` matches in any case (Unicode folding, where `ſ` is an `s`),
//! the last such key wins and a `null` one changes nothing. A document Go
//! cannot decode into `AppResponse` (empty, not JSON, cut short, nested
//! too deep, not an object, a `status` that is neither a string nor
//! `null`) acknowledges, as daprd skips the status check then. Of a
//! `status` string, `""` and `SUCCESS` acknowledge, `DROP` drops, and
//! `RETRY` or any other value retries.
//!
//! Decided at the first value's end, or sooner once nothing after can
//! change the outcome (the value is no object, a `status` is neither a
//! string nor `null`, the syntax is already wrong).
//!
//! Held: the top-level key being read, the `status` value being read and
//! the last one said, each to [`HELD_TEXT_BYTES`] (a longer key cannot
//! name `status`, a longer value is none of Dapr's), and one bit per open
//! array or object.

use rewire_runtime::DeliveryOutcome;

/// Go's `encoding/json` limit on nested arrays and objects
/// (`maxNestingDepth`): one more fails the decode.
pub(super) const MAX_DEPTH: usize = 10_000;

/// The most of one key or `status` value held: `ſtatuſ` is 8 bytes and
/// Dapr's longest value 7, so more can only be told apart as "longer".
pub(super) const HELD_TEXT_BYTES: usize = 64;

/// The most the scanner holds, whatever it is fed (see
/// [`AppResponseScanner::held_bytes`]).
#[cfg(test)]
pub(super) const MAX_HELD_BYTES: usize = 3 * HELD_TEXT_BYTES + MAX_DEPTH.div_ceil(64) * 8;

/// Reads an answer fed in pieces until its outcome is decided.
pub(super) struct AppResponseScanner {
    state: State,
    /// Open arrays and objects, one bit each (set: an object), innermost
    /// last; at most [`MAX_DEPTH`].
    open: Vec<u64>,
    depth: usize,
    /// Where the string being read goes.
    text: Text,
    escape: Escape,
    /// The top-level key being read, decoded.
    key: Held,
    /// Whether the value being read at the top level is `status`'s.
    status_value: bool,
    /// The last `status` string said, decoded (none yet: acknowledges).
    said: Option<Held>,
    /// The `status` value being read, kept in `said` when it ends.
    reading: Held,
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum State {
    /// Before the first value: whitespace only.
    Start,
    /// After `{`: a key or `}`.
    ObjectStart,
    /// After `,` in an object: a key.
    Key,
    /// After a key: `:`.
    Colon,
    /// After `:` or `,` in an array: a value.
    Value,
    /// After `[`: a value or `]`.
    ArrayStart,
    /// After a value inside an array or object: `,` or its end.
    AfterValue,
    InString,
    Number(Number),
    /// The rest of `true`, `false` or `null` to come.
    Literal(&'static [u8]),
    Decided(DeliveryOutcome),
}

/// Where a number is, as Go's scanner steps through one.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Number {
    /// After `-`: a digit.
    Minus,
    /// After a leading `0`.
    Zero,
    /// In the integer digits.
    Int,
    /// After `.`: a digit.
    Dot,
    Fraction,
    /// After `e`: a sign or digit.
    E,
    /// After the exponent's sign: a digit.
    ESign,
    Exponent,
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Text {
    /// A key of the top-level object.
    TopKey,
    /// The value of a top-level `status` key.
    Status,
    /// Any other string: checked, not held.
    Other { key: bool },
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Escape {
    None,
    /// After `\`.
    Backslash,
    /// In `\u`: the hex digits read so far and their value.
    Unicode(u8, u32),
}

/// Decoded text held to [`HELD_TEXT_BYTES`]; beyond, only that it was
/// longer.
#[derive(Clone, Default)]
struct Held {
    bytes: Vec<u8>,
    longer: bool,
}

impl Held {
    fn clear(&mut self) {
        self.bytes.clear();
        self.longer = false;
    }

    fn push(&mut self, bytes: &[u8]) {
        if self.longer || self.bytes.len() + bytes.len() > HELD_TEXT_BYTES {
            self.longer = true;
            return;
        }
        if self.bytes.capacity() == 0 {
            self.bytes.reserve_exact(HELD_TEXT_BYTES);
        }
        self.bytes.extend_from_slice(bytes);
    }

    fn push_char(&mut self, c: char) {
        self.push(c.encode_utf8(&mut [0; 4]).as_bytes());
    }

    /// The text, when it was held whole.
    fn whole(&self) -> Option<&[u8]> {
        (!self.longer).then_some(&self.bytes[..])
    }
}

impl Default for AppResponseScanner {
    fn default() -> Self {
        Self {
            state: State::Start,
            open: Vec::new(),
            depth: 0,
            text: Text::Other { key: false },
            escape: Escape::None,
            key: Held::default(),
            status_value: false,
            said: None,
            reading: Held::default(),
        }
    }
}

impl AppResponseScanner {
    /// Reads `piece`, the next bytes of the answer: the outcome once
    /// decided (the first value ended, or nothing after can change it),
    /// when what follows needs not be read.
    pub(super) fn feed(&mut self, piece: &[u8]) -> Option<DeliveryOutcome> {
        for &byte in piece {
            if let State::Decided(outcome) = self.state {
                return Some(outcome);
            }
            self.step(byte);
        }
        match self.state {
            State::Decided(outcome) => Some(outcome),
            _ => None,
        }
    }

    /// The outcome when the answer ends (or fails) here: undecided, the
    /// first value is missing or cut short, which Go's decode fails on.
    pub(super) fn end(&self) -> DeliveryOutcome {
        match self.state {
            State::Decided(outcome) => outcome,
            _ => DeliveryOutcome::Success,
        }
    }

    /// The bytes allocated now, for text and the open arrays and objects.
    #[cfg(test)]
    pub(super) fn held_bytes(&self) -> usize {
        let said = self.said.as_ref().map_or(0, |said| said.bytes.capacity());
        self.key.bytes.capacity()
            + self.reading.bytes.capacity()
            + said
            + self.open.capacity() * std::mem::size_of::<u64>()
    }

    fn step(&mut self, byte: u8) {
        let is_space = matches!(byte, b' ' | b'\t' | b'\r' | b'\n');
        match self.state {
            State::Decided(_) => {}
            State::Start if is_space => {}
            // Anything but an object cannot be decoded into `AppResponse`
            // (or, `null`, leaves it as it is), valid or not.
            State::Start if byte != b'{' => self.decide(DeliveryOutcome::Success),
            State::Start => self.open_container(true),
            State::ObjectStart | State::Key | State::Colon | State::AfterValue if is_space => {}
            State::Value | State::ArrayStart if is_space => {}
            State::ObjectStart if byte == b'}' => self.close_container(),
            State::ObjectStart | State::Key if byte == b'"' => {
                self.text = if self.depth == 1 {
                    self.key.clear();
                    Text::TopKey
                } else {
                    Text::Other { key: true }
                };
                self.state = State::InString;
            }
            State::Colon if byte == b':' => self.state = State::Value,
            State::ArrayStart if byte == b']' => self.close_container(),
            State::Value | State::ArrayStart => self.start_value(byte),
            State::AfterValue => self.after_value(byte),
            State::InString => self.string_byte(byte),
            State::Number(number) => self.number_byte(number, byte),
            State::Literal(rest) if rest.first() == Some(&byte) => {
                self.state = match &rest[1..] {
                    [] => State::AfterValue,
                    rest => State::Literal(rest),
                };
            }
            _ => self.invalid(),
        }
    }

    /// Go's decode fails: daprd acknowledges.
    fn invalid(&mut self) {
        self.decide(DeliveryOutcome::Success);
    }

    fn decide(&mut self, outcome: DeliveryOutcome) {
        self.state = State::Decided(outcome);
    }

    fn start_value(&mut self, byte: u8) {
        let status = std::mem::take(&mut self.status_value);
        if status && !matches!(byte, b'"' | b'n') {
            // Not a string (nor `null`): Go's decode fails, whatever
            // follows.
            return self.decide(DeliveryOutcome::Success);
        }
        match byte {
            b'{' => self.open_container(true),
            b'[' => self.open_container(false),
            b'"' => {
                self.text = if status {
                    self.reading.clear();
                    Text::Status
                } else {
                    Text::Other { key: false }
                };
                self.state = State::InString;
            }
            b'-' => self.state = State::Number(Number::Minus),
            b'0' => self.state = State::Number(Number::Zero),
            b'1'..=b'9' => self.state = State::Number(Number::Int),
            b't' => self.state = State::Literal(b"rue"),
            b'f' => self.state = State::Literal(b"alse"),
            b'n' => self.state = State::Literal(b"ull"),
            _ => self.invalid(),
        }
    }

    fn after_value(&mut self, byte: u8) {
        let in_object = self.innermost_is_object();
        match byte {
            b',' if in_object => self.state = State::Key,
            b',' => self.state = State::Value,
            b'}' if in_object => self.close_container(),
            b']' if !in_object => self.close_container(),
            _ => self.invalid(),
        }
    }

    fn open_container(&mut self, object: bool) {
        if self.depth == MAX_DEPTH {
            return self.invalid();
        }
        let (word, bit) = (self.depth / 64, self.depth % 64);
        if word == self.open.len() {
            self.open.reserve_exact(1);
            self.open.push(0);
        }
        if object {
            self.open[word] |= 1 << bit;
        } else {
            self.open[word] &= !(1 << bit);
        }
        self.depth += 1;
        self.state = if object {
            State::ObjectStart
        } else {
            State::ArrayStart
        };
    }

    fn close_container(&mut self) {
        self.depth -= 1;
        if self.open.len() > self.depth.div_ceil(64) {
            self.open.pop();
        }
        if self.depth == 0 {
            let outcome = self.said_outcome();
            return self.decide(outcome);
        }
        self.state = State::AfterValue;
    }

    fn innermost_is_object(&self) -> bool {
        let at = self.depth - 1;
        self.open[at / 64] & (1 << (at % 64)) != 0
    }

    /// Dapr's reading of the status said (`pubsub.AppResponseStatus`,
    /// compared as it is).
    fn said_outcome(&self) -> DeliveryOutcome {
        match self.said.as_ref().map(Held::whole) {
            None | Some(Some(b"" | b"SUCCESS")) => DeliveryOutcome::Success,
            Some(Some(b"DROP")) => DeliveryOutcome::Drop,
            // `RETRY`, and a status Dapr does not know (`retry`, `drop`
            // too): not taken as having handled the event.
            Some(_) => DeliveryOutcome::Retry,
        }
    }

    fn string_byte(&mut self, byte: u8) {
        match self.escape {
            Escape::None => match byte {
                b'"' => self.string_ended(),
                b'\\' => self.escape = Escape::Backslash,
                // Go's scanner refuses raw control characters; any other
                // byte is taken (invalid UTF-8 too, replaced by Go, which
                // no key or value compared here can equal).
                0..=0x1f => self.invalid(),
                _ => self.text_push(&[byte]),
            },
            Escape::Backslash => {
                self.escape = Escape::None;
                let decoded = match byte {
                    b'"' | b'\\' | b'/' => byte,
                    b'b' => 0x08,
                    b'f' => 0x0c,
                    b'n' => b'\n',
                    b'r' => b'\r',
                    b't' => b'\t',
                    b'u' => {
                        self.escape = Escape::Unicode(0, 0);
                        return;
                    }
                    _ => return self.invalid(),
                };
                self.text_push(&[decoded]);
            }
            Escape::Unicode(read, value) => {
                let Some(digit) = (byte as char).to_digit(16) else {
                    return self.invalid();
                };
                let value = value << 4 | digit;
                if read < 3 {
                    self.escape = Escape::Unicode(read + 1, value);
                    return;
                }
                self.escape = Escape::None;
                // A surrogate (paired or not) decodes to no character
                // Dapr's values or `status` hold: held as U+FFFD, as Go
                // holds a lone one.
                let decoded = char::from_u32(value).unwrap_or(char::REPLACEMENT_CHARACTER);
                if let Some(held) = self.held_text() {
                    held.push_char(decoded);
                }
            }
        }
    }

    fn text_push(&mut self, bytes: &[u8]) {
        if let Some(held) = self.held_text() {
            held.push(bytes);
        }
    }

    fn held_text(&mut self) -> Option<&mut Held> {
        match self.text {
            Text::TopKey => Some(&mut self.key),
            Text::Status => Some(&mut self.reading),
            Text::Other { .. } => None,
        }
    }

    fn string_ended(&mut self) {
        self.state = match self.text {
            Text::TopKey => {
                self.status_value = self.key.whole().is_some_and(names_status);
                State::Colon
            }
            Text::Other { key: true } => State::Colon,
            Text::Status => {
                let said = std::mem::take(&mut self.reading);
                self.said = Some(said);
                State::AfterValue
            }
            Text::Other { key: false } => State::AfterValue,
        };
    }

    fn number_byte(&mut self, number: Number, byte: u8) {
        use Number::*;
        let next = match (number, byte) {
            (Minus, b'0') => Zero,
            (Minus | Int, b'1'..=b'9') | (Int, b'0') => Int,
            (Zero | Int, b'.') => Dot,
            (Dot | Fraction, b'0'..=b'9') => Fraction,
            (Zero | Int | Fraction, b'e' | b'E') => E,
            (E, b'+' | b'-') => ESign,
            (E | ESign | Exponent, b'0'..=b'9') => Exponent,
            // The number ended, if it may end here: this byte follows it.
            (Zero | Int | Fraction | Exponent, _) => {
                self.state = State::AfterValue;
                return self.step(byte);
            }
            _ => return self.invalid(),
        };
        self.state = State::Number(next);
    }
}

/// Whether `key` (decoded) names the `status` field for Go's
/// `encoding/json`: equal to it under Unicode case folding
/// (`bytes.EqualFold`), where the only letters of `status` with other
/// forms are ASCII, and `ſ` (U+017F) folds to `s`.
fn names_status(key: &[u8]) -> bool {
    let mut folded = Vec::with_capacity(key.len());
    let mut rest = key;
    while let Some((&first, after)) = rest.split_first() {
        match rest {
            [0xc5, 0xbf, after @ ..] => {
                folded.push(b's');
                rest = after;
            }
            _ => {
                folded.push(first.to_ascii_lowercase());
                rest = after;
            }
        }
    }
    folded == b"status"
}

#[cfg(test)]
#[path = "app_response_tests.rs"]
mod tests;
