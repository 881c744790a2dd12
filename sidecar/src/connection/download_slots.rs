//! The bound on file downloads running at once
//! (`ApiOptions::max_downloads`): the HTTP file `GET` and Layotto's
//! `GetFile` together. A download holds its store's reader (with the
//! `local` store an open file) and a few chunks queued for its client for
//! as long as the client takes a chunk every
//! [`CLIENT_READS_WITHIN`](super::CLIENT_READS_WITHIN): a client granting
//! a trickle of window keeps each alive, so without a bound streams at the
//! connection limits (1,024 connections × 256 streams) could take every
//! file descriptor of the process and hundreds of MiB each second.
//!
//! The place is taken before the store opens the file and given back when
//! the reader is dropped (the pump ended: the file sent, failed, the
//! client gone or stalled).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, ReadBuf};

use crate::slots::{Full, Slot, Slots};

/// A download refused: `max` run already.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "reading file `{name}` of file store `{store}`: the sidecar's bound on downloads running at \
     once (max_downloads: {max}, HTTP file GETs and Layotto GetFile calls together) is reached; \
     retry once one has finished"
)]
pub struct DownloadsFull {
    /// The store, as quoted.
    pub store: String,
    /// The file, as quoted.
    pub name: String,
    /// The bound.
    pub max: usize,
}

impl Full for DownloadsFull {
    fn at_bound(store: String, name: String, max: usize) -> Self {
        Self { store, name, max }
    }
}

/// The downloads running now, counted against a bound: a place for the
/// download of `name` from file store `store` is [`Slots::take`]n, or
/// refused with [`DownloadsFull`].
pub type DownloadSlots = Slots<DownloadsFull>;

/// One download's place among the [`DownloadSlots`]: given back when
/// dropped.
pub type DownloadSlot = Slot<DownloadsFull>;

impl DownloadSlot {
    /// `reader`, holding this place until it is dropped.
    pub fn holding<R>(self, reader: R) -> HeldReader<R> {
        HeldReader {
            reader,
            _slot: self,
        }
    }
}

/// A download's reader with its place among the [`DownloadSlots`].
#[derive(Debug)]
pub struct HeldReader<R> {
    reader: R,
    _slot: DownloadSlot,
}

impl<R: AsyncRead + Unpin> AsyncRead for HeldReader<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.reader).poll_read(cx, buf)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncReadExt;

    use super::*;

    #[tokio::test]
    async fn downloads_past_the_bound_are_refused_naming_it_until_a_reader_is_dropped() {
        let slots = DownloadSlots::default();
        let mut first = slots
            .take(2, "files", "a.bin")
            .expect("room")
            .holding(&b"abc"[..]);
        let _second = slots.take(2, "files", "b.bin").expect("room");
        let refused = slots.take(2, "files", "c.bin").expect_err("full");
        let text = refused.to_string();
        assert!(
            text.contains("max_downloads: 2")
                && text.contains("file `c.bin`")
                && text.contains("file store `files`"),
            "{text}"
        );
        let mut read = String::new();
        first.read_to_string(&mut read).await.expect("read");
        assert_eq!(read, "abc", "the reader reads through");
        assert_eq!(slots.running(), 2, "held until dropped, not until read");
        drop(first);
        assert_eq!(slots.running(), 1);
        slots
            .take(2, "files", "c.bin")
            .expect("a place was given back");
    }
}
