//! A response byte budget: answers a client can make the sidecar build
//! (bulk state, configuration items) are counted in bytes as they are
//! gathered, and refused once they would exceed the limit, instead of being
//! held whole in memory.

/// Bytes an answer may still take.
#[derive(Debug, Clone, Copy)]
pub struct ResponseBudget {
    limit: usize,
    used: usize,
}

/// An answer that would exceed its budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "the answer would exceed the sidecar's response limit of {limit} bytes (max_response_bytes)"
)]
pub struct OverBudget {
    /// The limit, in bytes.
    pub limit: usize,
}

impl ResponseBudget {
    /// A budget of `limit` bytes.
    pub fn new(limit: usize) -> Self {
        Self { limit, used: 0 }
    }

    /// Counts `bytes` more; fails once the total exceeds the limit.
    pub fn take(&mut self, bytes: usize) -> Result<(), OverBudget> {
        self.used = self.used.saturating_add(bytes);
        if self.used > self.limit {
            return Err(OverBudget { limit: self.limit });
        }
        Ok(())
    }

    /// The limit, in bytes.
    pub fn limit(&self) -> usize {
        self.limit
    }
}

/// What `text` takes as a JSON string, quotes and escapes included (a
/// control character takes six bytes, `\u00XX`): an answer written as
/// JSON is counted by it, not by the raw bytes.
pub fn json_string_bytes(text: &str) -> usize {
    let escapes: usize = text
        .bytes()
        .map(|byte| match byte {
            b'"' | b'\\' | b'\n' | b'\r' | b'\t' | 0x08 | 0x0c => 1,
            0..=0x1f => 5,
            _ => 0,
        })
        .sum();
    text.len() + escapes + 2
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_json_string_is_counted_as_serde_json_writes_it() {
        for text in [
            "",
            "plain",
            "\u{1}\u{1f}",
            "\"\\\n\r\t\u{8}\u{c}",
            "é\u{7f}ü",
            "a\u{0}b",
        ] {
            let written = serde_json::to_string(text).map_or(0, |json| json.len());
            assert_eq!(json_string_bytes(text), written, "{text:?}");
        }
    }

    #[test]
    fn refuses_once_the_total_exceeds_the_limit() {
        let mut budget = ResponseBudget::new(10);
        assert_eq!(budget.take(6), Ok(()));
        assert_eq!(budget.take(4), Ok(()));
        assert_eq!(budget.take(1), Err(OverBudget { limit: 10 }));
        assert_eq!(budget.take(usize::MAX), Err(OverBudget { limit: 10 }));
    }
}
