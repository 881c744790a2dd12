//! What a `local` stat says of a file beyond its size and age, as
//! Layotto's `local` store's `Stat` says it: `FileMode` (Go's
//! `os.FileMode`, in decimal) and `IsDir`. Listings say nothing of it, as
//! Layotto's `List` (it sets no `FilesInfo` metadata).

use std::collections::BTreeMap;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};

/// Go's `os.ModeDir`: a directory.
const GO_DIR: u32 = 1 << 31;
/// Go's `os.ModeSymlink`.
const GO_SYMLINK: u32 = 1 << 27;
/// Go's `os.ModeDevice`: a block or character device.
const GO_DEVICE: u32 = 1 << 26;
/// Go's `os.ModeNamedPipe`: a FIFO.
const GO_NAMED_PIPE: u32 = 1 << 25;
/// Go's `os.ModeSocket`.
const GO_SOCKET: u32 = 1 << 24;
/// Go's `os.ModeSetuid`.
const GO_SETUID: u32 = 1 << 23;
/// Go's `os.ModeSetgid`.
const GO_SETGID: u32 = 1 << 22;
/// Go's `os.ModeCharDevice` (set with [`GO_DEVICE`]).
const GO_CHAR_DEVICE: u32 = 1 << 21;
/// Go's `os.ModeSticky`.
const GO_STICKY: u32 = 1 << 20;

/// `FileMode` and `IsDir` of `meta`, as Layotto's `local` store's `Stat`
/// answers them (`strconv.Itoa(int(Mode()))`, and `"true"`/`"false"`).
pub(super) fn stat_metadata(meta: &std::fs::Metadata) -> BTreeMap<String, String> {
    [
        ("FileMode".to_string(), go_file_mode(meta).to_string()),
        ("IsDir".to_string(), meta.is_dir().to_string()),
    ]
    .into()
}

/// `meta`'s mode as Go's `os.FileMode` holds it (Go's `os.Stat` on Unix):
/// the permission bits, the file's type as Go's type bits, and setuid,
/// setgid and sticky moved to Go's own bits.
fn go_file_mode(meta: &std::fs::Metadata) -> u32 {
    let kind = meta.file_type();
    let type_bits = if kind.is_dir() {
        GO_DIR
    } else if kind.is_symlink() {
        GO_SYMLINK
    } else if kind.is_block_device() {
        GO_DEVICE
    } else if kind.is_char_device() {
        GO_DEVICE | GO_CHAR_DEVICE
    } else if kind.is_fifo() {
        GO_NAMED_PIPE
    } else if kind.is_socket() {
        GO_SOCKET
    } else {
        0
    };
    let unix = meta.permissions().mode();
    [
        (0o4000, GO_SETUID),
        (0o2000, GO_SETGID),
        (0o1000, GO_STICKY),
    ]
    .iter()
    .filter(|(bit, _)| unix & bit != 0)
    .fold(unix & 0o777 | type_bits, |mode, (_, go)| mode | go)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::Permissions;

    fn described(meta: &std::fs::Metadata) -> (String, String) {
        let described = stat_metadata(meta);
        (described["FileMode"].clone(), described["IsDir"].clone())
    }

    #[test]
    fn a_directory_carries_gos_mode_dir_bit_and_is_a_dir() {
        let dir = tempfile::tempdir().unwrap();
        let folder = dir.path().join("docs");
        std::fs::create_dir(&folder).unwrap();
        std::fs::set_permissions(&folder, Permissions::from_mode(0o750)).unwrap();
        // Go: os.ModeDir | 0o750 = 2147483648 + 488.
        assert_eq!(
            described(&std::fs::metadata(&folder).unwrap()),
            ("2147484136".to_string(), "true".to_string())
        );
    }

    #[test]
    fn a_regular_file_carries_its_permissions_and_special_bits_as_gos() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("report.txt");
        std::fs::write(&path, "x").unwrap();
        std::fs::set_permissions(&path, Permissions::from_mode(0o640)).unwrap();
        assert_eq!(
            described(&std::fs::metadata(&path).unwrap()),
            ("416".to_string(), "false".to_string())
        );
        // Setuid and sticky: Go's bits 23 and 20, not Unix's.
        std::fs::set_permissions(&path, Permissions::from_mode(0o4640)).unwrap();
        let mode = go_file_mode(&std::fs::metadata(&path).unwrap());
        assert_eq!(mode, GO_SETUID | 0o640);
        let shared = dir.path().join("shared");
        std::fs::create_dir(&shared).unwrap();
        std::fs::set_permissions(&shared, Permissions::from_mode(0o1770)).unwrap();
        let mode = go_file_mode(&std::fs::metadata(&shared).unwrap());
        assert_eq!(mode, GO_DIR | GO_STICKY | 0o770);
    }

    #[test]
    fn links_sockets_pipes_and_devices_carry_gos_type_bits() {
        let dir = tempfile::tempdir().unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink("nowhere", &link).unwrap();
        let socket = dir.path().join("socket");
        let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        let fifo = dir.path().join("fifo");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        let type_of = |meta: std::fs::Metadata| go_file_mode(&meta) & !0o777;
        assert_eq!(
            type_of(std::fs::symlink_metadata(&link).unwrap()),
            GO_SYMLINK
        );
        assert_eq!(type_of(std::fs::metadata(&socket).unwrap()), GO_SOCKET);
        assert_eq!(type_of(std::fs::metadata(&fifo).unwrap()), GO_NAMED_PIPE);
        assert_eq!(
            type_of(std::fs::metadata("/dev/null").unwrap()),
            GO_DEVICE | GO_CHAR_DEVICE
        );
    }
}
