//! Reading a file a user names, bounded: only regular files (a FIFO would
//! block the reader for good, a device could stream forever) and never more
//! than a limit, whatever the file claims its size is.

use std::io::Read;
use std::path::Path;

/// Why a file was not read.
#[derive(Debug, thiserror::Error)]
pub enum FileReadError {
    /// It could not be opened or read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// It is a FIFO, a device, a directory...
    #[error("{path} is not a regular file")]
    NotRegular {
        /// The file.
        path: String,
    },
    /// It is larger than the limit.
    #[error("{path} is larger than the {limit} bytes accepted")]
    TooLarge {
        /// The file.
        path: String,
        /// The limit, in bytes.
        limit: usize,
    },
}

/// Reads the regular file at `path` (symlinks followed), refusing one
/// larger than `limit` bytes without reading more than that.
pub fn read_bounded(path: &Path, limit: usize) -> Result<Vec<u8>, FileReadError> {
    let shown = || path.display().to_string();
    let io = |source| FileReadError::Io {
        path: shown(),
        source,
    };
    let meta = std::fs::metadata(path).map_err(io)?;
    if !meta.is_file() {
        return Err(FileReadError::NotRegular { path: shown() });
    }
    let too_large = || FileReadError::TooLarge {
        path: shown(),
        limit,
    };
    if meta.len() > limit as u64 {
        return Err(too_large());
    }
    let file = std::fs::File::open(path).map_err(io)?;
    // The file may have been swapped since the check: re-check what was
    // opened, and read at most one byte past the limit.
    if !file.metadata().map_err(io)?.is_file() {
        return Err(FileReadError::NotRegular { path: shown() });
    }
    let mut bytes = Vec::new();
    file.take(limit as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(io)?;
    if bytes.len() > limit {
        return Err(too_large());
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_what_is_not_a_regular_file_or_too_large() {
        let dir = std::env::temp_dir().join(format!("rewire-fs-read-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("f");
        std::fs::write(&file, b"12345").unwrap();
        assert_eq!(read_bounded(&file, 5).unwrap(), b"12345");
        assert!(matches!(
            read_bounded(&file, 4),
            Err(FileReadError::TooLarge { .. })
        ));
        assert!(matches!(
            read_bounded(&dir, 4),
            Err(FileReadError::NotRegular { .. })
        ));
        assert!(matches!(
            read_bounded(Path::new("/dev/zero"), 4),
            Err(FileReadError::NotRegular { .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
