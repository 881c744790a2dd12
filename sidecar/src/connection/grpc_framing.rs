//! Where a gRPC request stream's bytes stand in its length-prefixed
//! messages (a flag byte and a 4-byte big-endian length, then the
//! message), so that a long-lived stream is charged only for the message
//! being read, not for every message it has carried.

/// Bytes of a gRPC message's prefix.
const PREFIX: usize = 5;

/// The message a stream's reader is in the middle of.
#[derive(Debug, Default)]
pub struct GrpcFraming {
    /// The prefix bytes read so far (all of them once in the message).
    prefix: [u8; PREFIX],
    prefix_read: usize,
    /// The message's length, and how much of it is still to come.
    length: usize,
    remaining: usize,
}

impl GrpcFraming {
    /// Reads `bytes` on from where the stream stands.
    pub fn advance(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            if self.prefix_read < PREFIX {
                let take = (PREFIX - self.prefix_read).min(bytes.len());
                self.prefix[self.prefix_read..self.prefix_read + take]
                    .copy_from_slice(&bytes[..take]);
                self.prefix_read += take;
                bytes = &bytes[take..];
                if self.prefix_read == PREFIX {
                    let [_, a, b, c, d] = self.prefix;
                    self.length =
                        usize::try_from(u32::from_be_bytes([a, b, c, d])).unwrap_or(usize::MAX);
                    self.remaining = self.length;
                    self.end_if_whole();
                }
                continue;
            }
            let take = self.remaining.min(bytes.len());
            self.remaining -= take;
            bytes = &bytes[take..];
            self.end_if_whole();
        }
    }

    /// Bytes of the message not yet whole (its prefix included): what a
    /// decoder that has taken every whole message still holds.
    pub fn partial(&self) -> usize {
        if self.prefix_read < PREFIX {
            return self.prefix_read;
        }
        PREFIX + (self.length - self.remaining)
    }

    fn end_if_whole(&mut self) {
        if self.prefix_read == PREFIX && self.remaining == 0 {
            *self = Self::default();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(len: usize) -> Vec<u8> {
        let mut bytes = vec![0];
        bytes.extend_from_slice(&u32::try_from(len).expect("small").to_be_bytes());
        bytes.resize(PREFIX + len, 7);
        bytes
    }

    #[test]
    fn whole_messages_leave_nothing_and_a_split_one_counts_what_arrived() {
        let mut framing = GrpcFraming::default();
        let two: Vec<u8> = [message(10), message(0), message(3)].concat();
        framing.advance(&two);
        assert_eq!(framing.partial(), 0);
        // A message split in its prefix, then in its body.
        let split = message(100);
        framing.advance(&split[..3]);
        assert_eq!(framing.partial(), 3);
        framing.advance(&split[3..40]);
        assert_eq!(framing.partial(), 40);
        // Its end and the start of the next in one frame.
        let next = message(8);
        framing.advance(&[&split[40..], &next[..6]].concat());
        assert_eq!(framing.partial(), 6);
        framing.advance(&next[6..]);
        assert_eq!(framing.partial(), 0);
    }
}
