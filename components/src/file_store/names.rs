//! File names: `/`-separated, relative, confined to the store.

use rewire_runtime::FileError;

/// Longest name accepted, in bytes.
pub const MAX_NAME_BYTES: usize = 1_024;

/// Prefix of the temporary files a put writes (never listed, never a name).
pub const TEMP_PREFIX: &str = ".rewire-tmp-";

/// The parts of `name`, checked: not empty, not absolute, no `.` or `..`
/// part, no empty part, no NUL or backslash, not a temporary file's name.
pub fn parts(name: &str) -> Result<Vec<&str>, FileError> {
    let refuse = |why: &str| FileError::Invalid(format!("file name `{}`: {why}", printable(name)));
    if name.is_empty() {
        return Err(FileError::Invalid("the file name is empty".into()));
    }
    if name.len() > MAX_NAME_BYTES {
        return Err(refuse(&format!("longer than {MAX_NAME_BYTES} bytes")));
    }
    if name.contains('\0') {
        return Err(refuse("contains NUL"));
    }
    if name.contains('\\') {
        return Err(refuse("contains a backslash (use `/`)"));
    }
    if name.starts_with('/') {
        return Err(refuse("is absolute"));
    }
    let parts: Vec<&str> = name.split('/').collect();
    for part in &parts {
        match *part {
            "" => return Err(refuse("has an empty part")),
            "." | ".." => return Err(refuse("has a `.` or `..` part")),
            part if part.starts_with(TEMP_PREFIX) => {
                return Err(refuse("is reserved for temporary files"))
            }
            _ => {}
        }
    }
    Ok(parts)
}

/// `name` with control characters escaped, for messages.
fn printable(name: &str) -> String {
    name.chars().flat_map(char::escape_debug).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_are_refused_and_plain_names_pass() {
        for bad in [
            "",
            "/etc/passwd",
            "../x",
            "a/../../x",
            "a/./b",
            "a//b",
            "a/",
            "a\0b",
            "a\\..\\b",
            ".rewire-tmp-1",
        ] {
            assert!(matches!(parts(bad), Err(FileError::Invalid(_))), "{bad:?}");
        }
        assert_eq!(parts("a/b.txt").unwrap(), ["a", "b.txt"]);
        assert_eq!(parts("..a").unwrap(), ["..a"]);
        assert!(parts(&"x".repeat(MAX_NAME_BYTES + 1)).is_err());
    }
}
