//! Names resolved beneath a handle on the root, never by walking a path
//! again: the folder of a name is opened from the root's handle with
//! `openat2` (`RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`; where the kernel
//! has no `openat2`, part by part with `openat(O_NOFOLLOW)`), and the
//! name's last part is opened, created, renamed, removed or looked at
//! relative to that folder's handle, without following a symbolic link.
//! A folder swapped for a symbolic link at any moment is then either not
//! reached or refused; it never leads out of the root.
//!
//! Blocking calls: run them off the runtime (`spawn_blocking`).

use std::fs::{File, Metadata};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;

use rewire_runtime::FileError;
use rustix::fs::{self as sys, AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

use super::{backend, refused};

/// Opens a folder (to read its entries, sync it, or open beneath it).
const FOLDER: OFlags = OFlags::DIRECTORY
    .union(OFlags::RDONLY)
    .union(OFlags::CLOEXEC);

/// Opens a name only to look at it: the link itself for a symbolic link,
/// nothing started for a FIFO or a device.
#[cfg(any(target_os = "linux", target_os = "android"))]
const LOOK: OFlags = OFlags::PATH.union(OFlags::NOFOLLOW).union(OFlags::CLOEXEC);
#[cfg(not(any(target_os = "linux", target_os = "android")))]
const LOOK: OFlags = OFlags::RDONLY
    .union(OFlags::NOFOLLOW)
    .union(OFlags::NONBLOCK)
    .union(OFlags::NOCTTY)
    .union(OFlags::CLOEXEC);

/// Opens a file to read it (not blocking on a FIFO swapped in: refused
/// once opened).
const READ: OFlags = OFlags::RDONLY
    .union(OFlags::NOFOLLOW)
    .union(OFlags::NONBLOCK)
    .union(OFlags::NOCTTY)
    .union(OFlags::CLOEXEC);

/// Creates a put's temporary file (never an existing one).
const CREATE: OFlags = OFlags::WRONLY
    .union(OFlags::CREATE)
    .union(OFlags::EXCL)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

fn io(err: Errno) -> std::io::Error {
    err.into()
}

/// The handle on the root directory `path`, held for the store's life.
pub(super) fn open_root(path: &Path) -> std::io::Result<OwnedFd> {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    let flags = FOLDER;
    sys::open(path, flags, Mode::empty()).map_err(io)
}

/// Opens folder `at` itself (to read its entries or sync it).
pub(super) fn reopen(at: BorrowedFd<'_>) -> rustix::io::Result<OwnedFd> {
    sys::openat(at, ".", FOLDER, Mode::empty())
}

/// Opens folder `part` of `at`, not following a symbolic link.
pub(super) fn open_folder(at: BorrowedFd<'_>, part: &str) -> rustix::io::Result<OwnedFd> {
    sys::openat(at, part, FOLDER | OFlags::NOFOLLOW, Mode::empty())
}

/// A folder to open when it is walked: its name in a folder held open,
/// or (none) the root itself.
pub(super) type Later = Option<(Arc<OwnedFd>, String)>;

/// Opens folder `later` (beneath `root`), not following a symbolic link;
/// the folder it is in is let go.
pub(super) fn open_later(root: BorrowedFd<'_>, later: Later) -> rustix::io::Result<OwnedFd> {
    match later {
        None => reopen(root),
        Some((parent, part)) => open_folder(parent.as_fd(), &part),
    }
}

/// The folder `folders` (the parts before a name's last) beneath `root`,
/// every part a real directory (no symbolic link): with `create`, missing
/// folders are made, each in the one before it.
pub(super) fn folder(
    root: BorrowedFd<'_>,
    name: &str,
    folders: &[&str],
    create: bool,
) -> Result<OwnedFd, FileError> {
    if folders.is_empty() {
        return reopen(root).map_err(|err| backend("opening the folder of", name, io(err)));
    }
    #[cfg(any(target_os = "linux", target_os = "android"))]
    {
        use rustix::fs::ResolveFlags;
        let resolve =
            ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
        match sys::openat2(root, folders.join("/"), FOLDER, Mode::empty(), resolve) {
            Ok(folder) => return Ok(folder),
            Err(Errno::NOENT) if !create => return Err(backend("opening", name, io(Errno::NOENT))),
            // No `openat2` (a kernel before 5.6, or a seccomp filter
            // refusing it), a folder to make, a link or a file to tell
            // apart, or a rename beneath the root meanwhile: part by part.
            Err(
                Errno::NOSYS
                | Errno::PERM
                | Errno::NOENT
                | Errno::LOOP
                | Errno::NOTDIR
                | Errno::AGAIN
                | Errno::XDEV,
            ) => {}
            Err(err) => return Err(backend("opening", name, io(err))),
        }
    }
    walk(root, name, folders, create)
}

/// [`folder`], part by part with `openat(O_NOFOLLOW)`.
fn walk(
    root: BorrowedFd<'_>,
    name: &str,
    folders: &[&str],
    create: bool,
) -> Result<OwnedFd, FileError> {
    let mut at: Option<OwnedFd> = None;
    for part in folders {
        let dir = at.as_ref().map_or(root, AsFd::as_fd);
        let opened = match open_folder(dir, part) {
            Err(Errno::NOENT) if create => {
                match sys::mkdirat(dir, *part, Mode::from_raw_mode(0o777)) {
                    Ok(()) | Err(Errno::EXIST) => {}
                    Err(err) => return Err(backend("creating the folder of", name, io(err))),
                }
                open_folder(dir, part)
            }
            opened => opened,
        };
        match opened {
            Ok(folder) => at = Some(folder),
            // `O_NOFOLLOW | O_DIRECTORY` on a link: `ELOOP` or `ENOTDIR`.
            Err(Errno::LOOP | Errno::NOTDIR) => {
                return Err(match look(dir, part) {
                    Ok(Entry::Link) => refused(name, "passes through a symbolic link"),
                    _ => refused(name, "passes through a file"),
                });
            }
            Err(err) => return Err(backend("opening", name, io(err))),
        }
    }
    match at {
        Some(folder) => Ok(folder),
        None => folder(root, name, &[], create),
    }
}

/// What a name's last part is, as [`look`] saw it.
pub(super) enum Entry {
    /// A regular file.
    File(Metadata),
    /// A symbolic link.
    Link,
    /// A folder (only a stat answers for one, as Layotto's `os.Stat`).
    Folder(Metadata),
    /// A FIFO, device or socket.
    Other,
    /// Nothing.
    Missing,
}

/// Looks at `part` of folder `at`, following no symbolic link.
pub(super) fn look(at: BorrowedFd<'_>, part: &str) -> std::io::Result<Entry> {
    let fd = match sys::openat(at, part, LOOK, Mode::empty()) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return Ok(Entry::Missing),
        Err(Errno::LOOP) => return Ok(Entry::Link),
        Err(err) => return Err(io(err)),
    };
    let meta = File::from(fd).metadata()?;
    Ok(if meta.is_file() {
        Entry::File(meta)
    } else if meta.file_type().is_symlink() {
        Entry::Link
    } else if meta.is_dir() {
        Entry::Folder(meta)
    } else {
        Entry::Other
    })
}

/// The regular file `part` of folder `at`, opened for reading, and its
/// metadata (from the opened file).
pub(super) fn open_read(
    at: BorrowedFd<'_>,
    name: &str,
    part: &str,
) -> Result<(File, Metadata), FileError> {
    let fd = match sys::openat(at, part, READ, Mode::empty()) {
        Ok(fd) => fd,
        Err(Errno::LOOP) => return Err(refused(name, "is a symbolic link")),
        Err(err) => return Err(backend("opening", name, io(err))),
    };
    let file = File::from(fd);
    let meta = file
        .metadata()
        .map_err(|err| backend("reading", name, err))?;
    if !meta.is_file() {
        return Err(FileError::NotFound(name.to_string()));
    }
    // Reads of the regular file block as usual.
    sys::fcntl_getfl(&file)
        .and_then(|flags| sys::fcntl_setfl(&file, flags.difference(OFlags::NONBLOCK)))
        .map_err(|err| backend("opening", name, io(err)))?;
    Ok((file, meta))
}

/// Creates the temporary file `part` in folder `at` (none of that name
/// may exist).
pub(super) fn create(at: BorrowedFd<'_>, part: &str) -> std::io::Result<File> {
    sys::openat(at, part, CREATE, Mode::from_raw_mode(0o666))
        .map(File::from)
        .map_err(io)
}

/// Renames `from` over `to`, both in folder `at`.
pub(super) fn rename(at: BorrowedFd<'_>, from: &str, to: &str) -> std::io::Result<()> {
    sys::renameat(at, from, at, to).map_err(io)
}

/// Removes the file (or link) `part` of folder `at`.
pub(super) fn remove(at: BorrowedFd<'_>, part: &str) -> std::io::Result<()> {
    sys::unlinkat(at, part, AtFlags::empty()).map_err(io)
}

/// Syncs folder `at` itself (its entries: a rename in it).
pub(super) fn sync(at: BorrowedFd<'_>) -> std::io::Result<()> {
    sys::fsync(at).map_err(io)
}

/// What an entry of a folder read with [`entries`] is.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Folder,
    File,
    Other,
}

/// The entries of folder `at` (but `.` and `..`, and names not UTF-8),
/// with their kind (told without following a symbolic link), read as
/// they are iterated.
pub(super) fn entries(
    at: BorrowedFd<'_>,
) -> std::io::Result<impl Iterator<Item = std::io::Result<(String, Kind)>> + '_> {
    let dir = sys::Dir::read_from(at).map_err(io)?;
    Ok(dir.filter_map(move |entry| {
        let entry = match entry {
            Ok(entry) => entry,
            Err(err) => return Some(Err(io(err))),
        };
        let part = entry.file_name().to_str().ok()?;
        if part == "." || part == ".." {
            return None;
        }
        let kind = match entry.file_type() {
            FileType::Directory => Kind::Folder,
            FileType::RegularFile => Kind::File,
            // Not told by the file system: asked of the entry itself.
            FileType::Unknown => match sys::statat(at, part, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(stat) => match FileType::from_raw_mode(stat.st_mode) {
                    FileType::Directory => Kind::Folder,
                    FileType::RegularFile => Kind::File,
                    _ => Kind::Other,
                },
                Err(_) => Kind::Other,
            },
            _ => Kind::Other,
        };
        Some(Ok((part.to_string(), kind)))
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn invalid(result: Result<OwnedFd, FileError>) -> String {
        match result {
            Err(FileError::Invalid(why)) => why,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    /// The walk part by part (where `openat2` is missing) answers as
    /// `openat2` does.
    #[test]
    fn both_ways_refuse_links_and_files_on_the_way_and_make_missing_folders() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir(root.join("real")).unwrap();
        std::fs::write(root.join("file"), "x").unwrap();
        std::fs::write(root.join("real/file"), "x").unwrap();
        std::os::unix::fs::symlink(root.join("real"), root.join("link")).unwrap();
        std::os::unix::fs::symlink(root.join("real"), root.join("real/link")).unwrap();
        let handle = open_root(root).unwrap();
        let handle = handle.as_fd();
        type Way = fn(BorrowedFd<'_>, &str, &[&str], bool) -> Result<OwnedFd, FileError>;
        for (way, made) in [(folder as Way, "one"), (walk as Way, "two")] {
            for create in [false, true] {
                for (folders, why) in [
                    (&["link"][..], "passes through a symbolic link"),
                    (&["real", "link"], "passes through a symbolic link"),
                    (&["file"], "passes through a file"),
                    (&["real", "file"], "passes through a file"),
                ] {
                    let refusal = invalid(way(handle, "x", folders, create));
                    assert!(refusal.contains(why), "{folders:?}: {refusal}");
                }
            }
            assert!(way(handle, "x", &["real"], false).is_ok());
            assert_eq!(
                way(handle, "x", &[made, "deep"], false).unwrap_err(),
                FileError::NotFound("x".into())
            );
            let deep = way(handle, "x", &[made, "deep"], true).unwrap();
            create(deep.as_fd(), "file").unwrap();
            assert!(root.join(made).join("deep/file").is_file());
        }
    }

    #[test]
    fn a_fifo_is_neither_opened_for_reading_nor_taken_for_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let handle = open_root(dir.path()).unwrap();
        sys::mknodat(
            &handle,
            "fifo",
            FileType::Fifo,
            Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        assert!(matches!(look(handle.as_fd(), "fifo"), Ok(Entry::Other)));
        // Opening it for reading does not wait for a writer; it is refused.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(open_read(handle.as_fd(), "fifo", "fifo").map(|_| ()));
        });
        let answer = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("reading a FIFO blocked");
        assert_eq!(answer, Err(FileError::NotFound("fifo".into())));
    }
}
