//! A manifest file holding no resource is refused, not read as declaring
//! nothing: `sops -d x.enc.yaml > statestore.yaml` truncates the file and
//! then waits on its KMS, and a reload reading it then would remove the
//! store (and a memory store's data) before adding it back empty.

use super::*;

const REFUSED: &str = "holds no resource; delete it to remove its components";

#[test]
fn an_empty_or_comment_only_manifest_is_refused_naming_its_file() {
    let found = problems_of(
        &[
            ("comments.yml", "# statestore, being decrypted\n\n"),
            ("empty.yaml", ""),
            ("markers.yaml", "---\n---\n...\n"),
            ("secrets.yaml", SECRETS),
            ("spaces.yaml", " \n\t\n"),
        ],
        "a",
    );
    assert_eq!(
        found,
        [
            format!("c/comments.yml: {REFUSED}"),
            format!("c/empty.yaml: {REFUSED}"),
            format!("c/markers.yaml: {REFUSED}"),
            format!("c/spaces.yaml: {REFUSED}"),
        ]
    );
}

#[test]
fn a_folder_with_an_empty_manifest_does_not_load() {
    let refused = load_dir(
        "empty-file",
        &[("mem.yaml", MEMORY), ("statestore.yaml", "")],
        "checkout",
    )
    .err()
    .unwrap_or_default();
    assert_eq!(refused, [format!("D/statestore.yaml: {REFUSED}")]);
    // Deleting it is how its components are removed.
    let valid = load_dir("empty-file-gone", &[("mem.yaml", MEMORY)], "checkout")
        .unwrap_or_else(|p| panic!("{p:?}"));
    assert_eq!(valid.config.components.len(), 1);
}
