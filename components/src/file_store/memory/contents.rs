//! A stored file's contents, the downloads reading them, and the bytes
//! that downloads still hold of files replaced or deleted since
//! ("retired": counted against `maxTotalSize` until the last download of
//! them lets go).

use std::io;
use std::ops::Deref;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, ReadBuf};

/// The bytes downloads still hold of replaced or deleted files: shared by
/// the store and every retired file's [`Pieces`], which take their bytes
/// off when the last download drops them. An atomic, not part of the
/// store's lock, so that drop (which may come from any task, the store's
/// lock held or not) never waits on the lock.
#[derive(Debug, Default, Clone)]
pub(super) struct RetiredBytes(Arc<AtomicU64>);

impl RetiredBytes {
    /// Bytes held now.
    pub(super) fn get(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }

    /// Counts `contents` as retired while downloads still hold them (a
    /// replaced or deleted file): the bytes are taken off again when the
    /// last of them lets go. Contents no download holds free at once.
    pub(super) fn retire(&self, contents: Contents) {
        let Contents { pieces, len } = contents;
        // Clones are made only by a get, under the store's lock, which the
        // caller holds and which no longer reaches `contents`: a count of 1
        // stays 1. A higher one may fall meanwhile: the guard set below
        // still takes the bytes off, when the last holder (maybe this
        // very `pieces`) drops.
        if Arc::strong_count(&pieces) > 1 {
            let guard = RetiredGuard {
                retired: self.clone(),
                bytes: len,
            };
            // Set once only: contents are stored under one name and retired
            // when they leave it. Counted before `pieces` can drop.
            if pieces.retired.set(guard).is_ok() {
                self.0.fetch_add(len, Ordering::AcqRel);
            }
        }
    }
}

/// Takes a retired file's bytes off [`RetiredBytes`] when its pieces drop.
#[derive(Debug)]
struct RetiredGuard {
    retired: RetiredBytes,
    bytes: u64,
}

/// A file's pieces, shared by the store and the downloads reading them.
#[derive(Debug)]
pub(super) struct Pieces {
    pieces: Box<[Box<[u8]>]>,
    /// Set when the file is retired (replaced or deleted while read).
    retired: OnceLock<RetiredGuard>,
}

impl Deref for Pieces {
    type Target = [Box<[u8]>];

    fn deref(&self) -> &Self::Target {
        &self.pieces
    }
}

impl Drop for Pieces {
    fn drop(&mut self) {
        if let Some(guard) = self.retired.get() {
            guard.retired.0.fetch_sub(guard.bytes, Ordering::AcqRel);
        }
    }
}

/// A file's contents: the pieces its put read them into, each allocated
/// at exactly the size it holds.
#[derive(Debug, Clone)]
pub(super) struct Contents {
    pub(super) pieces: Arc<Pieces>,
    len: u64,
}

impl Contents {
    /// Contents of `pieces`, `len` bytes in all.
    pub(super) fn new(pieces: Vec<Box<[u8]>>, len: u64) -> Self {
        Self {
            pieces: Arc::new(Pieces {
                pieces: pieces.into(),
                retired: OnceLock::new(),
            }),
            len,
        }
    }

    /// Bytes held.
    pub(super) fn len(&self) -> u64 {
        self.len
    }

    /// Whether a download holds these contents (asked under the store's
    /// lock: none can start meanwhile; one may end).
    pub(super) fn being_read(&self) -> bool {
        Arc::strong_count(&self.pieces) > 1
    }

    /// A download of these contents, from their start.
    pub(super) fn reader(&self) -> ContentsReader {
        ContentsReader {
            contents: self.clone(),
            piece: 0,
            offset: 0,
        }
    }
}

/// Reads [`Contents`] from its start: a get's body.
pub(super) struct ContentsReader {
    contents: Contents,
    /// The piece being read.
    piece: usize,
    /// Where in that piece.
    offset: usize,
}

impl AsyncRead for ContentsReader {
    fn poll_read(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        while buf.remaining() > 0 {
            let Some(piece) = this.contents.pieces.get(this.piece) else {
                break;
            };
            let rest = &piece[this.offset..];
            let taken = rest.len().min(buf.remaining());
            buf.put_slice(&rest[..taken]);
            this.offset += taken;
            if this.offset == piece.len() {
                this.piece += 1;
                this.offset = 0;
            }
        }
        Poll::Ready(Ok(()))
    }
}
