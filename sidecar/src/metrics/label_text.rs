//! [`LabelText`]: a label value that is free text (a component's or a
//! resiliency policy's name), written escaped as the Prometheus text format
//! asks.
//!
//! prometheus-client writes label values as given, and a name may hold `"`
//! or `\` (validation refuses only control characters and `/`): unescaped,
//! `store="orders"x"` made the whole exposition unreadable to Prometheus,
//! every metric lost with it.

use std::fmt::Write;

use prometheus_client::encoding::{EncodeLabelValue, LabelValueEncoder};

/// A free-text label value, written with `\`, `"` and line feeds escaped
/// (`\\`, `\"`, `\n`). Only the text format is written here.
#[derive(Debug, Clone, Hash, PartialEq, Eq)]
pub(super) struct LabelText<T>(pub(super) T);

impl<T: AsRef<str>> EncodeLabelValue for LabelText<T> {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        write_escaped(self.0.as_ref(), encoder)
    }
}

/// Writes `text` to `out` escaped as a label value of the Prometheus text
/// format: runs of plain characters in one write each.
fn write_escaped(text: &str, out: &mut impl Write) -> std::fmt::Result {
    let mut plain_from = 0;
    for (at, character) in text.char_indices() {
        let escaped = match character {
            '\\' => "\\\\",
            '"' => "\\\"",
            '\n' => "\\n",
            _ => continue,
        };
        out.write_str(&text[plain_from..at])?;
        out.write_str(escaped)?;
        plain_from = at + character.len_utf8();
    }
    out.write_str(&text[plain_from..])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn escaped(text: &str) -> String {
        let mut out = String::new();
        write_escaped(text, &mut out).unwrap();
        out
    }

    #[test]
    fn backslashes_quotes_and_line_feeds_are_escaped_and_nothing_else() {
        assert_eq!(escaped("orders"), "orders");
        assert_eq!(escaped(""), "");
        assert_eq!(escaped(r#"a"b\"#), r#"a\"b\\"#);
        assert_eq!(escaped("é\nü\"\""), r#"é\nü\"\""#);
    }
}
