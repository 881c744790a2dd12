//! The `file` stores: `local` (a directory) and `memory`.
//!
//! Both check every name the same way ([`names`]) and copy contents in
//! chunks of [`CHUNK`] bytes up to the store's `maxFileSize`, so a file is
//! never held whole in memory on its way through (the `memory` store, of
//! course, keeps what it stores).

pub mod local;
pub mod memory;
pub mod names;

use rewire_runtime::{FileBody, FileError, ListRequest};
use serde::Deserialize;
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};

pub use local::LocalFileStore;
pub use memory::MemoryFileStore;

/// Bytes read from a body at a time.
pub const CHUNK: usize = 64 * 1024;

/// `maxFileSize` when none is given: 1 GiB.
pub const DEFAULT_MAX_FILE_SIZE: u64 = 1 << 30;

/// Files per listed page when the request names no number.
pub const DEFAULT_PAGE: usize = 100;

/// Most files per listed page.
pub const MAX_PAGE: usize = 1_000;

/// Deserializes a size in bytes that must be positive.
pub(crate) fn deserialize_size<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<u64, D::Error> {
    let size = u64::deserialize(deserializer)?;
    if size == 0 {
        return Err(serde::de::Error::custom("must be at least one byte"));
    }
    Ok(size)
}

/// The page size `req` asks for, within bounds.
pub(crate) fn page_size(req: &ListRequest) -> usize {
    match req.max_keys {
        0 => DEFAULT_PAGE,
        n => n.min(MAX_PAGE),
    }
}

/// Copies `body` into `sink` chunk by chunk; fails with
/// [`FileError::TooLarge`] as soon as more than `limit` bytes arrive, or
/// with `reserve`'s error (asked before each chunk is written). A body
/// that fails (its client broke off, or sent nothing for the sidecar's
/// idle bound) is [`FileError::Invalid`], the request's fault: never a
/// `Backend` failure a circuit breaker would count against the store.
pub(crate) async fn copy_bounded<W: AsyncWrite + Unpin>(
    name: &str,
    mut body: FileBody,
    sink: &mut W,
    limit: u64,
    mut reserve: impl FnMut(u64) -> Result<(), FileError>,
) -> Result<u64, FileError> {
    let mut chunk = vec![0u8; CHUNK];
    let mut total: u64 = 0;
    loop {
        let read = body
            .read(&mut chunk)
            .await
            .map_err(|err| FileError::Invalid(format!("reading the body of `{name}`: {err}")))?;
        if read == 0 {
            break;
        }
        total += read as u64;
        if total > limit {
            return Err(FileError::TooLarge {
                name: name.to_string(),
                limit,
            });
        }
        reserve(read as u64)?;
        sink.write_all(&chunk[..read])
            .await
            .map_err(|err| FileError::Backend(format!("writing `{name}`: {err}")))?;
    }
    sink.flush()
        .await
        .map_err(|err| FileError::Backend(format!("writing `{name}`: {err}")))?;
    Ok(total)
}

#[cfg(test)]
mod tests {
    use rewire_runtime::resilience::Failure;

    use super::*;

    /// A body whose client resets its connection before sending a byte.
    struct Reset;

    impl tokio::io::AsyncRead for Reset {
        fn poll_read(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            _: &mut tokio::io::ReadBuf<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::task::Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::ConnectionReset,
                "the client reset the connection",
            )))
        }
    }

    #[tokio::test]
    async fn a_body_that_breaks_off_is_the_requests_fault_not_a_store_failure() {
        let mut sink = Vec::new();
        let copied = copy_bounded("a.bin", Box::pin(Reset), &mut sink, 1024, |_| Ok(())).await;
        let Err(error @ FileError::Invalid(_)) = copied else {
            panic!("{copied:?}");
        };
        assert!(!error.is_failure(), "{error}");
        assert!(
            error.to_string().contains("reading the body of `a.bin`"),
            "{error}"
        );
    }
}
