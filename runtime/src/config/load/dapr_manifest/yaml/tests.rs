use super::*;

/// `x` anchors a scalar of `scalar_bytes`; `y` lists `aliases` aliases of
/// it, one a line (the first on line 3).
fn aliased_scalar(scalar_bytes: usize, aliases: usize) -> String {
    format!(
        "x: &a \"{}\"\ny:\n{}",
        "b".repeat(scalar_bytes),
        "- *a\n".repeat(aliases)
    )
}

#[test]
fn aliases_repeating_a_large_scalar_are_refused_before_they_are_expanded() {
    // Without the check, 50 MB copied (saphyr's node budget lets 100
    // aliases by), then again into our tree; 100,000 aliases of 700 KB fit
    // in a manifest too, and asked for 70 GB.
    let bomb = aliased_scalar(500_000, 100);
    assert!(bomb.len() <= MAX_MANIFEST_BYTES);
    let started = std::time::Instant::now();
    let refused = documents(&bomb).err();
    // The anchor's copy and seven aliases' fit in 4 MiB; the eighth
    // alias (line 10) passes it.
    assert_eq!(
        refused.as_ref().map(|e| e.line),
        Some(10),
        "the eighth alias passes the {MAX_COPIED_BYTES} bytes: {refused:?}"
    );
    let message = refused.map(|e| e.message).unwrap_or_default();
    assert!(
        message.contains("anchors and aliases make the YAML loader copy more than"),
        "{message}"
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(5),
        "refused only after {:?}",
        started.elapsed()
    );
}

#[test]
fn nested_aliases_count_what_they_repeat() {
    // Each level lists the one before ten times: 10^8 scalars of 100 bytes
    // at the ninth; refused by their bytes at the fifth, before saphyr's
    // node budget (100,000 copied nodes) is spent at the sixth.
    let mut text = format!("l0: &l0 \"{}\"\n", "lol".repeat(33));
    for level in 1..=8 {
        let before = format!("*l{}", level - 1);
        let items = vec![before; 10].join(", ");
        text.push_str(&format!("l{level}: &l{level} [{items}]\n"));
    }
    let refused = documents(&text).err();
    assert!(
        refused
            .as_ref()
            .is_some_and(|e| e.line == 5 && e.message.contains("anchors and aliases")),
        "{refused:?}"
    );
}

#[test]
fn nested_anchors_count_the_copies_the_loader_keeps_without_any_alias() {
    // Each anchor is copied whole when defined: four levels around a list
    // of 10,000 items copy about 5 MB; 64 around 500,000 items asked for
    // gigabytes.
    let items = vec!["1"; 10_000].join(",");
    let text = format!("x: &a0 [&a1 [&a2 [&a3 [{items}]]]]\n");
    let refused = documents(&text).err();
    assert!(
        refused
            .as_ref()
            .is_some_and(|e| e.message.contains("anchors and aliases")),
        "{refused:?}"
    );
    // One anchor around it, used by no alias, loads.
    let docs = documents(&format!("x: &a0 [{items}]\n")).unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(
        docs[0].to_json()["x"].as_array().map(Vec::len),
        Some(10_000)
    );
}

#[test]
fn aliases_within_the_bound_still_load() {
    let text = "common: &common\n  - name: redisHost\n    value: localhost:6379\nspec:\n  metadata: *common\n";
    let docs = documents(text).unwrap_or_else(|e| panic!("{e:?}"));
    let json = docs[0].to_json();
    assert_eq!(json["spec"]["metadata"], json["common"]);
    assert_eq!(json["spec"]["metadata"][0]["value"], "localhost:6379");
    // Under the bound: the anchor's copy and seven aliases of 500 KB.
    let docs = documents(&aliased_scalar(500_000, 7)).unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(
        docs[0].to_json()["y"][1].as_str().map(str::len),
        Some(500_000)
    );
}
