//! [`text_values`] gives every value the text `value_text` gives it
//! through a `serde_json::Value`.

use std::collections::BTreeMap;

use proptest::prelude::*;
use serde::Deserialize;
use serde_json::Value;

use crate::json_text::value_text;

/// `configurations` read by [`super::text_values`].
#[derive(Debug, Deserialize)]
struct Read {
    #[serde(deserialize_with = "super::text_values")]
    configurations: BTreeMap<String, String>,
}

/// `configurations` read as before: through `Value`s, then `value_text`.
fn through_values(document: &str) -> Result<BTreeMap<String, String>, String> {
    #[derive(Deserialize)]
    struct Before {
        configurations: Option<BTreeMap<String, Value>>,
    }
    let before: Before = serde_json::from_str(document).map_err(|e| e.to_string())?;
    Ok(before
        .configurations
        .unwrap_or_default()
        .iter()
        .map(|(k, v)| (k.clone(), value_text(v)))
        .collect())
}

fn read(document: &str) -> Result<BTreeMap<String, String>, String> {
    serde_json::from_str::<Read>(document)
        .map(|read| read.configurations)
        .map_err(|e| e.to_string())
}

/// Both readings of `{"configurations": {"v": value}}` agree (both fail,
/// or give the same text).
fn same_text(value: &str) {
    let document = format!(r#"{{"configurations": {{"v": {value}}}}}"#);
    match (through_values(&document), read(&document)) {
        (Ok(before), Ok(now)) => assert_eq!(before, now, "{value}"),
        (Err(_), Err(_)) => {}
        (before, now) => panic!("{value}: before {before:?}, now {now:?}"),
    }
}

#[test]
fn values_read_as_before() {
    for value in [
        r#""plain \"text\" \u0041\/ é""#,
        "null",
        "true",
        "false",
        "0",
        "-0",
        "-0.0",
        "1.0",
        "1E2",
        "1.5e-7",
        "123456789012345678901234567890",
        "18446744073709551615",
        "-9223372036854775808",
        "1e400",
        "[]",
        "{}",
        "[ 1 , [ ] , { } , null , \"a\\u001fb\" ]",
        r#"{"b": 1, "a": {"d": [3, {"z": 0, "y": 1}], "c": null}}"#,
        r#"{"k": 1, "j": 2, "k": 3}"#,
        r#"{"k": 1, "k": {"x": 2}}"#,
        r#"{"é": 1, "e": 2, "\u0000": 3, "E": 4}"#,
        r#"{"$serde_json::private::RawValue": "[1, {\"b\": 2, \"a\": 1}]"}"#,
        r#"{"$serde_json::private::RawValue": "\"text\""}"#,
        r#"{"$serde_json::private::RawValue": "null"}"#,
        r#"[{"$serde_json::private::RawValue": "\"text\""}]"#,
        r#"{"$serde_json::private::RawValue": "[1] x"}"#,
        r#"{"$serde_json::private::RawValue": 5}"#,
        r#"{"a": 1, "$serde_json::private::RawValue": "[1]"}"#,
    ] {
        same_text(value);
    }
    // Nesting: within serde_json's limit, and past it (both refused).
    for depth in [100, 126, 127, 128, 200] {
        same_text(&format!("{}{}", "[".repeat(depth), "]".repeat(depth)));
        same_text(&format!(
            "{}1{}",
            r#"{"a":"#.repeat(depth),
            "}".repeat(depth)
        ));
    }
}

#[test]
fn configurations_absent_null_or_not_a_map() {
    for document in [
        r#"{"configurations": null}"#,
        r#"{"configurations": {}}"#,
        r#"{"configurations": {"a": "1", "a": "2"}}"#,
    ] {
        assert_eq!(read(document), through_values(document), "{document}");
    }
    assert!(read(r#"{"configurations": [1]}"#).is_err());
    assert!(read(r#"{"configurations": "x"}"#).is_err());
}

/// A large value (here 2 MiB of `0,`) comes out as the same text as
/// before.
#[test]
fn a_large_value_reads_as_before() {
    let large = format!("[{}0]", "0,".repeat(1 << 20));
    let document = format!(r#"{{"configurations": {{"big": {large}, "s": "x"}}}}"#);
    let now = read(&document).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(now.get("big"), Some(&large));
    assert_eq!(Ok(now), through_values(&document));
}

/// JSON text with arbitrary whitespace, keys out of order or repeated,
/// and numbers and strings in every form.
fn json_text() -> impl Strategy<Value = String> {
    let number = prop_oneof![
        any::<i64>().prop_map(|n| n.to_string()),
        any::<u64>().prop_map(|n| n.to_string()),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| format!("{f:e}")),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| format!("{f}")),
        Just("-0".to_string()),
        Just("0.10E+3".to_string()),
        Just("1e-400".to_string()),
    ];
    let string = prop_oneof![
        "[a-zé\"\\\\/ \u{1}\u{7f}]{0,6}"
            .prop_map(|s| serde_json::to_string(&s).unwrap_or_default()),
        Just(r#""\u00e9\/\b\f\n\r\t\ud83d\ude00""#.to_string()),
    ];
    let leaf = prop_oneof![
        number,
        string,
        Just("true".to_string()),
        Just("false".to_string()),
        Just("null".to_string()),
    ];
    let space = prop_oneof![Just(""), Just(" "), Just("\n\t ")];
    leaf.prop_recursive(4, 48, 6, move |inner| {
        let space = space.clone();
        prop_oneof![
            (prop::collection::vec(inner.clone(), 0..6), space.clone())
                .prop_map(|(items, s)| format!("[{s}{}{s}]", items.join(&format!("{s},{s}")))),
            (prop::collection::vec(("[a-c]{0,2}", inner), 0..6), space).prop_map(|(entries, s)| {
                let entries: Vec<String> = entries
                    .into_iter()
                    .map(|(k, v)| format!("{s}\"{k}\"{s}:{s}{v}"))
                    .collect();
                format!("{{{}{s}}}", entries.join(","))
            }),
        ]
    })
}

proptest! {
    #[test]
    fn any_value_reads_as_before(value in json_text()) {
        same_text(&value);
    }
}

/// Set in the child process that measures the reading of a large value.
#[cfg(target_os = "linux")]
const PEAK_CHILD: &str = "REWIRE_APOLLO_VALUE_TEXTS_PEAK_CHILD";

/// A 16 MiB `[0,0,…]` value (8 million numbers) is read into its text
/// with little more memory than the text: through `Value`s it took
/// 256 MiB and more. Measured in a child process running this test alone
/// (its peak resident memory reset before the read, as Linux allows).
#[cfg(target_os = "linux")]
#[test]
fn a_large_value_is_read_without_a_tree_of_values() {
    const NAME: &str = "apollo::value_texts::tests::a_large_value_is_read_without_a_tree_of_values";
    if std::env::var_os(PEAK_CHILD).is_some() {
        let document = format!(
            r#"{{"configurations": {{"big": [{}0]}}}}"#,
            "0,".repeat(8 << 20)
        );
        std::fs::write("/proc/self/clear_refs", "5").expect("reset the peak resident memory");
        let before = memory_kib("VmRSS");
        let texts = read(&document).unwrap_or_else(|e| panic!("{e}"));
        let grown = memory_kib("VmHWM").saturating_sub(before);
        assert_eq!(texts["big"].len(), (16 << 20) + 3);
        assert!(
            grown < 96 << 10,
            "reading a 16 MiB value took {} MiB more at its peak",
            grown >> 10
        );
        return;
    }
    let child = std::process::Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", NAME, "--nocapture", "--test-threads=1"])
        .env(PEAK_CHILD, "1")
        .output()
        .expect("run the child");
    let out = String::from_utf8_lossy(&child.stdout);
    let err = String::from_utf8_lossy(&child.stderr);
    assert!(child.status.success(), "{out}\n{err}");
    assert!(out.contains("1 passed"), "the child ran the test: {out}");
}

/// A `Vm…` line of `/proc/self/status`, in KiB.
#[cfg(target_os = "linux")]
fn memory_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/self/status"))
}
