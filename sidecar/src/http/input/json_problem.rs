//! serde_json's reason for a body that does not decode, cut before it is
//! kept: serde quotes a mistyped string value whole, Debug-escaped
//! (`invalid type: string "…"`, up to 6 bytes per character), so a 2 MiB
//! string of U+0080 would make a message, an answer and a log line of
//! several times the body. Cut as [`rewire_runtime::echoed`] cuts a quoted
//! request value: on a character boundary, the cut marked `…`.

use std::fmt::{self, Write as _};

/// Bytes of serde's reason an error keeps at most (then `…`).
pub const MAX_PROBLEM_BYTES: usize = 1024;

/// Room past [`MAX_PROBLEM_BYTES`] for serde's ` at line L column C`, so
/// a reason under the bound is read whole with its position.
const POSITION_ROOM: usize = 128;

/// serde_json's reason for `err`, without its position, cut to
/// [`MAX_PROBLEM_BYTES`] (then `…`). serde's text is read only up to the
/// bound, never copied whole.
pub fn json_reason(err: &serde_json::Error) -> String {
    let mut read = Bounded::new(MAX_PROBLEM_BYTES + POSITION_ROOM);
    // Refused past the bound: serde's text stops being written there.
    let _ = write!(read, "{err}");
    let mut text = read.text;
    if !read.cut && err.line() != 0 {
        let position = format!(" at line {} column {}", err.line(), err.column());
        if text.ends_with(&position) {
            text.truncate(text.len() - position.len());
        }
    }
    if read.cut || text.len() > MAX_PROBLEM_BYTES {
        text.truncate(char_boundary_at_most(&text, MAX_PROBLEM_BYTES));
        text.push('…');
    }
    text
}

/// serde_json's text for `err` as [`json_reason`] cuts it, followed by its
/// position (`at line L column C`) when it has one.
pub fn json_problem(err: &serde_json::Error) -> String {
    let reason = json_reason(err);
    match err.line() {
        0 => reason,
        line => format!("{reason} at line {line} column {}", err.column()),
    }
}

/// The last character boundary of `text` at or before byte `at`
/// (`str::floor_char_boundary`, newer than the crate's minimum Rust).
fn char_boundary_at_most(text: &str, at: usize) -> usize {
    if at >= text.len() {
        return text.len();
    }
    (0..=at)
        .rev()
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(0)
}

/// A text written up to `limit` bytes: the write that would pass it keeps
/// what fits (on a character boundary) and is refused.
struct Bounded {
    text: String,
    limit: usize,
    cut: bool,
}

impl Bounded {
    fn new(limit: usize) -> Self {
        Self {
            text: String::new(),
            limit,
            cut: false,
        }
    }
}

impl fmt::Write for Bounded {
    fn write_str(&mut self, piece: &str) -> fmt::Result {
        let room = self.limit - self.text.len();
        if piece.len() <= room {
            self.text.push_str(piece);
            return Ok(());
        }
        self.text
            .push_str(&piece[..char_boundary_at_most(piece, room)]);
        self.cut = true;
        Err(fmt::Error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error_of(text: &str) -> serde_json::Error {
        serde_json::from_str::<Vec<u8>>(text).expect_err("not a list of bytes")
    }

    #[test]
    fn a_short_reason_is_kept_whole_with_its_position() {
        let err = error_of(r#""abc""#);
        assert_eq!(json_problem(&err), err.to_string());
        assert_eq!(
            json_reason(&err),
            r#"invalid type: string "abc", expected a sequence"#
        );
    }

    /// A quoted string of 2 MiB of U+0080 (each `\u{80}` in serde's text)
    /// keeps 1 KiB, cut on a character boundary, marked, with the
    /// position.
    #[test]
    fn a_long_reason_is_cut_on_a_character_boundary_and_marked() {
        let err = error_of(&serde_json::to_string(&"\u{80}".repeat(1 << 20)).unwrap());
        let reason = json_reason(&err);
        assert!(reason.len() <= MAX_PROBLEM_BYTES + '…'.len_utf8());
        assert!(
            reason.starts_with(r#"invalid type: string "\u{80}"#),
            "{reason:.80}"
        );
        assert!(reason.ends_with('…'), "{reason}");
        let problem = json_problem(&err);
        assert!(problem.starts_with(&reason), "{problem:.80}");
        assert!(problem.ends_with(" at line 1 column 2097154"), "{problem}");
        let multibyte = error_of(&serde_json::to_string(&"é".repeat(1 << 12)).unwrap());
        let reason = json_reason(&multibyte);
        assert!(reason.ends_with("éé…"), "{reason}");
    }
}
