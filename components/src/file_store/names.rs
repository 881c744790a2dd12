//! File names: `/`-separated, relative, confined to the store.

use rewire_runtime::FileError;

/// Longest name accepted, in bytes.
pub const MAX_NAME_BYTES: usize = 1_024;

/// Longest part of a name (between slashes) accepted, in bytes: what
/// most file systems take as one file or folder name.
pub const MAX_PART_BYTES: usize = 255;

/// Most parts a name has: a file at most 63 folders deep, within what a
/// listing walks (`local::listing::MAX_DEPTH`), so every file stored can be
/// listed.
pub const MAX_PARTS: usize = 64;

/// Prefix of the temporary files a put writes (never listed, never a name).
pub const TEMP_PREFIX: &str = ".rewire-tmp-";

/// The parts of `name`, checked: not empty, not absolute, no `.` or `..`
/// part, no empty part, no part over [`MAX_PART_BYTES`], no NUL or
/// backslash, not a temporary file's name.
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
    if parts.len() > MAX_PARTS {
        return Err(refuse(&format!(
            "has {} parts, more than {MAX_PARTS} (a file at most {} folders deep)",
            parts.len(),
            MAX_PARTS - 1
        )));
    }
    for part in &parts {
        match *part {
            "" => return Err(refuse("has an empty part")),
            "." | ".." => return Err(refuse("has a `.` or `..` part")),
            part if part.starts_with(TEMP_PREFIX) => {
                return Err(refuse("is reserved for temporary files"))
            }
            part if part.len() > MAX_PART_BYTES => {
                return Err(refuse(&format!(
                    "has a part longer than {MAX_PART_BYTES} bytes"
                )))
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
    fn a_name_has_at_most_as_many_parts_as_a_listing_walks() {
        let deepest = vec!["d"; MAX_PARTS].join("/");
        assert_eq!(parts(&deepest).unwrap().len(), MAX_PARTS);
        let deeper = vec!["d"; MAX_PARTS + 1].join("/");
        let Err(FileError::Invalid(why)) = parts(&deeper) else {
            panic!("accepted {} parts", MAX_PARTS + 1);
        };
        assert!(why.contains("more than 64"), "{why}");
    }

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

    #[test]
    fn a_part_longer_than_a_file_system_takes_is_refused() {
        let longest = "é".repeat(MAX_PART_BYTES / 2) + "x";
        assert_eq!(longest.len(), MAX_PART_BYTES);
        assert_eq!(parts(&format!("a/{longest}")).unwrap(), ["a", &longest]);
        for bad in [format!("a/{longest}x"), format!("{longest}x/b")] {
            let Err(FileError::Invalid(why)) = parts(&bad) else {
                panic!("accepted {} bytes", bad.len());
            };
            assert!(why.contains("longer than 255 bytes"), "{why}");
        }
    }
}
