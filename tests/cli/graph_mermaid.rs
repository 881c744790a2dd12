//! `rewire graph --format mermaid` renders: the official mermaid parser
//! (installed into tests/mermaid by scripts/test.sh) accepts it, for a
//! graph with every kind of reference and names that need escaping.

use std::process::Command;
use std::time::Duration;

use testkit::output_within;

#[test]
fn the_mermaid_graph_parses_with_the_official_mermaid_parser() {
    let checker = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/mermaid");
    assert!(
        std::path::Path::new(checker).join("node_modules/mermaid").exists(),
        "the mermaid parser is not installed: run ./scripts/test.sh (it installs it with npm into tests/mermaid)"
    );
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("rewire.json");
    std::fs::write(
        &config,
        r#"{"components": {
            "secret_store": {"local": {"type": "local.file", "metadata": {"secretsFile": "s.json"}}},
            "config_store": {"settings \"eu\"": {"type": "file", "metadata": {"path": "c.json"},
                "secretRef": [{"store": "local", "name": "a", "key": "b", "injectAs": "pollIntervalMs"}]}},
            "state": {"orders<v2>": {"type": "redis",
                "configurationRef": [{"store": "settings \"eu\"", "key": "h", "injectAs": "redisHost"}]}},
            "lock": {"l": {"type": "memory"}}
        }}"#,
    )
    .unwrap();
    let graph = Command::new(env!("CARGO_BIN_EXE_rewire"))
        .args(["graph", "--format", "mermaid", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(
        graph.status.success(),
        "{}",
        String::from_utf8_lossy(&graph.stderr)
    );
    let mmd = dir.path().join("graph.mmd");
    std::fs::write(&mmd, &graph.stdout).unwrap();
    let parsed = output_within(
        Command::new("node")
            .arg(format!("{checker}/check.mjs"))
            .arg(&mmd),
        Duration::from_secs(120),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        parsed.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&parsed.stderr),
        String::from_utf8_lossy(&graph.stdout)
    );
    assert!(String::from_utf8_lossy(&parsed.stdout).contains("parsed: flowchart"));
}
