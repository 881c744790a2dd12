//! The bad-input corpus through `rewire validate` and the library: every
//! case exits 1 with exactly its expected problem lines (each naming the
//! component and the field, or for a file-level problem what the user needs
//! to find it), never panics, and the CLI and `config::parse` + `validate`
//! agree. Each case is the valid base with one small edit, so the corpus
//! shows what each one breaks.

use crate::support::corpus;

use std::process::Command;

use corpus::Case;
use rewire::config::{parse, validate};
use rewire::Registry;

/// `rewire validate --config <path>`: exit code, stdout, stderr.
fn run_validate(path: &std::path::Path) -> (i32, String, String) {
    let out = testkit::output(
        Command::new(env!("CARGO_BIN_EXE_rewire"))
            .args(["validate", "--config"])
            .arg(path)
            .env("NO_COLOR", "1"),
    );
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The problem lines of `bytes` through the library, or `None` if valid.
fn library_problems(bytes: &[u8]) -> Option<Vec<String>> {
    let problems = match parse(bytes) {
        Ok(config) => validate(config, &Registry::collected()).err()?,
        Err(problems) => problems,
    };
    Some(problems.iter().map(ToString::to_string).collect())
}

/// The file the CLI reads for `case` (generated cases are written out).
fn file_of(case: &Case, scratch: &tempfile::TempDir) -> std::path::PathBuf {
    if case.spec.generated {
        let path = scratch.path().join(format!("{}.json", case.name()));
        std::fs::write(&path, &case.bytes)
            .unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        path
    } else {
        corpus::case_path(case.name())
    }
}

/// What is wrong with one case's answers, if anything.
fn check(case: &Case, scratch: &tempfile::TempDir) -> Vec<String> {
    let mut wrong = Vec::new();
    let (code, stdout, stderr) = run_validate(&file_of(case, scratch));
    if stderr.contains("panicked") {
        wrong.push(format!("the CLI panicked:\n{stderr}"));
    }
    let lines: Vec<String> = stderr.lines().map(str::to_string).collect();
    let library = library_problems(&case.bytes);
    if let Some(reason) = &case.spec.caught_at_build {
        // Documented gap: validation accepts it (see `caught_at_build`).
        if code != 0 || library.is_some() {
            wrong.push(format!(
                "expected to pass validation ({reason}); now rejected — move the case to `errors`:\n{stderr}"
            ));
        }
        return wrong;
    }
    if code != 1 {
        wrong.push(format!("exit code {code}, expected 1 (stdout: {stdout:?})"));
    }
    let expected = case.errors();
    if lines != expected {
        wrong.push(format!(
            "stderr lines\n  got:      {lines:?}\n  expected: {expected:?}"
        ));
    }
    if library.as_ref() != Some(&lines) {
        wrong.push(format!("the library disagrees with the CLI: {library:?}"));
    }
    for secret in &case.spec.never {
        if stderr.contains(secret.as_str()) {
            wrong.push(format!("a secret value is printed: {secret}"));
        }
    }
    for line in &lines {
        if line.trim().is_empty() {
            wrong.push("an empty problem line".to_string());
        }
    }
    wrong
}

#[test]
fn every_case_is_rejected_with_its_expected_lines() {
    let scratch = tempfile::tempdir().unwrap();
    let cases = corpus::cases();
    assert!(cases.len() >= 45, "the corpus has {} cases", cases.len());
    let mut failures = Vec::new();
    for case in &cases {
        let wrong = check(case, &scratch);
        if !wrong.is_empty() {
            failures.push(format!(
                "{}: {}\n  {}",
                case.name(),
                case.spec.breaks,
                wrong.join("\n  ")
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases answered wrongly:\n\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n\n")
    );
}

#[test]
fn every_problem_names_its_component_or_is_a_file_level_problem() {
    // A component problem starts `kind/name: `; a file-level one names the
    // top-level field, or says where in the file (or what about it) is wrong.
    let file_level = [
        "malformed JSON at line ",
        "JSON nested too deeply at line ",
        "configuration is empty",
        "configuration must be a JSON object",
        "configuration is not valid UTF-8 (line ",
        "configuration is ",
        "missing `components`",
        "field `components`",
        "components.",
        "components: ",
        "unknown top-level field ",
        "overlay.store: ",
        "field `overlay",
        "`appId` ",
    ];
    let mut failures = Vec::new();
    for case in corpus::cases() {
        let Some(problems) = library_problems(&case.bytes) else {
            continue;
        };
        for line in problems {
            let names_component = line
                .split_once(": ")
                .is_some_and(|(key, _)| key.contains('/'));
            if !names_component && !file_level.iter().any(|p| line.starts_with(p)) {
                failures.push(format!("{}: {line:?}", case.name()));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "problems that name neither a component nor the file's place:\n{}",
        failures.join("\n")
    );
}

#[test]
fn the_base_is_valid_and_every_case_is_a_small_edit_of_it() {
    let base = corpus::dir().join("valid.json");
    let (code, stdout, stderr) = run_validate(&base);
    assert_eq!(code, 0, "the base must be valid:\n{stderr}");
    assert!(stdout.contains("valid (7 components)"), "{stdout}");
    let valid = corpus::valid_text();
    let valid_json: serde_json::Value = serde_json::from_str(&valid).unwrap();
    let mut failures = Vec::new();
    for case in corpus::cases() {
        if case.spec.generated || case.spec.whole_file {
            // Generated cases are one edit of the base by construction
            // (`corpus::generate`); whole-file cases replace it.
            continue;
        }
        let text = String::from_utf8_lossy(&case.bytes);
        let lines = corpus::changed_lines(&valid, &text);
        let values = serde_json::from_str::<serde_json::Value>(&text)
            .ok()
            .and_then(|json| corpus::changed_values(&valid_json, &json));
        let small = (1..=3).contains(&lines) || values.is_some_and(|n| (1..=3).contains(&n));
        if !small {
            failures.push(format!(
                "{}: {lines} lines and {values:?} values differ from the base",
                case.name()
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "cases that are not a small edit of valid.json:\n{}",
        failures.join("\n")
    );
}

#[test]
fn every_committed_case_file_is_in_the_expectations() {
    let listed: std::collections::BTreeSet<String> = corpus::cases()
        .into_iter()
        .filter(|c| !c.spec.generated)
        .map(|c| c.name().to_string())
        .collect();
    let dir = corpus::dir().join("cases");
    let on_disk: std::collections::BTreeSet<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|entry| entry.ok())
        .filter_map(|entry| {
            entry
                .file_name()
                .to_str()?
                .strip_suffix(".json")
                .map(str::to_string)
        })
        .collect();
    assert_eq!(
        listed, on_disk,
        "tests/corpus/cases and expected.json must list the same cases"
    );
}

/// `rewire validate --config <path>` with its address space capped at
/// 1 GiB, so a reader that slurps without a bound fails fast instead of
/// eating the machine's memory.
fn run_validate_capped(path: &std::path::Path) -> (i32, String) {
    let script = format!(
        "ulimit -v 1048576; exec {} validate --config \"$0\"",
        env!("CARGO_BIN_EXE_rewire")
    );
    let out = testkit::output(Command::new("sh").args(["-c", &script]).arg(path));
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_file_far_over_the_size_limit_is_refused_without_being_read_whole() {
    let scratch = tempfile::tempdir().unwrap();
    let path = scratch.path().join("sparse.json");
    let file = std::fs::File::create(&path).unwrap();
    file.set_len(4 * 1024 * 1024 * 1024).unwrap();
    drop(file);
    let (code, stderr) = run_validate_capped(&path);
    assert_eq!(code, 1, "{stderr}");
    assert_eq!(
        stderr.trim_end(),
        "configuration is 4294967296 bytes, more than the 16777216 accepted"
    );
}

#[test]
fn an_endless_stream_is_refused_as_not_a_regular_file() {
    // Refused before a byte is read: a device or a FIFO could stream
    // forever or block the reader for good.
    let (code, stderr) = run_validate_capped(std::path::Path::new("/dev/zero"));
    assert_eq!(code, 1, "{stderr}");
    assert_eq!(
        stderr.trim_end(),
        "configuration file /dev/zero is not a regular file"
    );
}
