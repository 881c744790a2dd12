//! How [`Replying`](super::Replying) and
//! [`ChargedAsSent`](super::ChargedAsSent) hand a reply's data frames on:
//! in slices of at most [`SLICE`], the charge following the memory the
//! sidecar holds. A frame of one slice or less (the usual answer) is
//! handed on as it is. A larger one is handed on in copies: slices of it
//! would share its one allocation, which the last slice h2 holds (waiting
//! for window) would keep whole while charged for a slice. So the frame
//! stays charged whole while the body keeps what is not handed on yet
//! (the copies handed on meanwhile within its charge), and the last copy
//! from when it is handed on until the next is asked for: what a stream
//! holds uncharged is at most the one copy h2 still holds.

use http_body::Frame;
use tonic::codegen::Bytes;

use super::{ReplyCharge, SLICE};

/// A reply's frame being handed on, and the slice the server holds.
#[derive(Default)]
pub(super) struct Slices {
    /// What is not handed on yet of a frame larger than a slice (holding
    /// its whole allocation).
    rest: Bytes,
    /// The length of the frame `rest` is of, charged while `rest` is held.
    frame: usize,
    /// Bytes of the last slice, held by the server until it asks for the
    /// next, charged apart from a frame still held (0 while one is).
    handed: usize,
}

impl Slices {
    /// The server asks for more, so it has passed the last slice on: that
    /// slice is let go of from `charge`, and the next slice of the frame
    /// being handed on is returned, if any is left.
    pub(super) fn next(&mut self, charge: &mut ReplyCharge) -> Option<Frame<Bytes>> {
        charge.taken(std::mem::take(&mut self.handed));
        if self.rest.is_empty() {
            return None;
        }
        Some(self.copy_next(charge))
    }

    /// The first slice of `data`, a new frame charged to `charge`; a
    /// frame of one slice or less is handed on as it is.
    pub(super) fn first(&mut self, data: Bytes, charge: &mut ReplyCharge) -> Frame<Bytes> {
        if data.len() <= SLICE {
            self.handed = data.len();
            return Frame::data(data);
        }
        self.frame = data.len();
        self.rest = data;
        self.copy_next(charge)
    }

    /// Bytes of the frame not handed on yet.
    pub(super) fn rest_len(&self) -> usize {
        self.rest.len()
    }

    /// A copy of the next slice of `rest`. Once it is the last, the
    /// frame's allocation is dropped and its charge let go of but for the
    /// copy, let go of when the next is asked for.
    fn copy_next(&mut self, charge: &mut ReplyCharge) -> Frame<Bytes> {
        let len = self.rest.len().min(SLICE);
        let copy = Bytes::copy_from_slice(&self.rest[..len]);
        if len < self.rest.len() {
            self.rest = self.rest.slice(len..);
        } else {
            self.rest = Bytes::new();
            charge.taken(std::mem::take(&mut self.frame) - len);
            self.handed = len;
        }
        Frame::data(copy)
    }
}
