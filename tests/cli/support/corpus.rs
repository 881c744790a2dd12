//! The bad-input corpus: every case of `tests/corpus/expected.json` with its
//! bytes (read from `tests/corpus/cases/`, or generated for the cases too
//! big to commit), the problem lines `rewire validate` must print, and the
//! Lifecycle push that expresses the same mistake, if one can.

use std::path::{Path, PathBuf};

use serde::Deserialize;

/// The corpus directory.
pub fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus")
}

/// The valid base configuration every case breaks in one small way.
pub fn valid_text() -> String {
    let path = dir().join("valid.json");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// `valid.json` with the TTL of `state/sessions` set to `ttl` (a real,
/// valid change).
pub fn valid_with_sessions_ttl(ttl: u64) -> String {
    replace_once(
        &valid_text(),
        SESSIONS_TTL,
        &format!("\"defaultTtlInSeconds\": {ttl}"),
    )
}

/// How the base declares the TTL of `state/sessions`.
const SESSIONS_TTL: &str = "\"defaultTtlInSeconds\": 300";

/// The expectations file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Expectations {
    cases: Vec<CaseSpec>,
}

/// One case as the expectations file describes it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaseSpec {
    /// The case's name (its file is `cases/<name>.json` unless generated).
    pub name: String,
    /// What the case breaks, in a few words.
    pub breaks: String,
    /// Made by [`generate`] rather than read from a file.
    #[serde(default)]
    pub generated: bool,
    /// The case replaces the whole file (empty, `null`...), so it is not a
    /// small edit of the base.
    #[serde(default)]
    pub whole_file: bool,
    /// Every line `rewire validate` prints on stderr, in order
    /// (`{long_name}` and `{size}` stand for generated values).
    #[serde(default)]
    pub errors: Vec<String>,
    /// Validation accepts the case; only building the component finds the
    /// mistake (start-up fails, a reload or a push is rolled back). Why.
    #[serde(default)]
    pub caught_at_build: Option<String>,
    /// What building the component reports, in the rolled-back reload's
    /// error (substrings).
    #[serde(default)]
    pub build_error: Vec<String>,
    /// Text that must appear in no answer (a secret value).
    #[serde(default)]
    pub never: Vec<String>,
    /// The Lifecycle push that makes the same mistake.
    #[serde(default)]
    pub push: Option<PushSpec>,
    /// Why no push expresses the case.
    #[serde(default)]
    pub push_skipped: Option<String>,
}

/// A `ComponentConfig` as JSON (the proto's fields and names).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PushSpec {
    pub kind: String,
    pub name: String,
    #[serde(default, rename = "type")]
    pub type_name: String,
    #[serde(default)]
    pub metadata: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    pub metadata_json: String,
    #[serde(default)]
    pub component_refs: Vec<PushComponentRef>,
    #[serde(default)]
    pub secret_refs: Vec<PushSecretRef>,
    #[serde(default)]
    pub configuration_refs: Vec<PushConfigurationRef>,
    /// Every error of the NACK, in order.
    #[serde(default)]
    pub errors: Vec<String>,
    /// Substrings of the NACK's errors (when the text is not stable).
    #[serde(default)]
    pub errors_contain: Vec<String>,
    /// `rejected` (default) or `rolled_back`.
    #[serde(default)]
    pub outcome: Option<String>,
    /// The push is refused with this gRPC code rather than NACKed.
    #[serde(default)]
    pub refused: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PushComponentRef {
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub name: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PushSecretRef {
    #[serde(default)]
    pub store: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub key: String,
    #[serde(default)]
    pub inject_as: String,
    #[serde(default)]
    pub watch: bool,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PushConfigurationRef {
    #[serde(default)]
    pub store: String,
    #[serde(default)]
    pub key: String,
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub label: String,
    #[serde(default)]
    pub inject_as: String,
    #[serde(default)]
    pub watch: bool,
}

/// A case ready to run: its spec with placeholders filled, and its bytes.
#[derive(Debug, Clone)]
pub struct Case {
    pub spec: CaseSpec,
    pub bytes: Vec<u8>,
}

impl Case {
    /// The case's name.
    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// The lines `rewire validate` must print.
    pub fn errors(&self) -> Vec<String> {
        self.spec
            .errors
            .iter()
            .map(|line| self.fill(line))
            .collect()
    }

    /// The push expressing the case, placeholders filled.
    pub fn push(&self) -> Option<PushSpec> {
        let mut push = self.spec.push.clone()?;
        push.name = self.fill(&push.name);
        push.metadata_json = self.fill(&push.metadata_json);
        push.errors = push.errors.iter().map(|line| self.fill(line)).collect();
        Some(push)
    }

    fn fill(&self, text: &str) -> String {
        text.replace("{long_name}", &long_name())
            .replace("{size}", &self.bytes.len().to_string())
            .replace("{deep}", &deep_arrays())
            .replace("{padding}", &padding())
    }
}

/// Every case of the corpus, in the expectations file's order.
pub fn cases() -> Vec<Case> {
    let path = dir().join("expected.json");
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let expectations: Expectations =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    expectations
        .cases
        .into_iter()
        .map(|spec| {
            let bytes = if spec.generated {
                generate(&spec.name)
            } else {
                let file = case_path(&spec.name);
                std::fs::read(&file).unwrap_or_else(|e| panic!("read {}: {e}", file.display()))
            };
            Case { spec, bytes }
        })
        .collect()
}

/// The committed file of case `name`.
pub fn case_path(name: &str) -> PathBuf {
    dir().join("cases").join(format!("{name}.json"))
}

/// A component name of 100,000 characters.
pub fn long_name() -> String {
    "l".repeat(100_000)
}

/// 10,000 nested arrays.
pub fn deep_arrays() -> String {
    format!("{}{}", "[".repeat(10_000), "]".repeat(10_000))
}

/// A 20 MiB string value's content.
pub fn padding() -> String {
    "x".repeat(20 * 1024 * 1024)
}

/// The bytes of a generated case: the base with one edit too big to commit.
pub fn generate(name: &str) -> Vec<u8> {
    let valid = valid_text();
    let text = match name {
        "huge_file" => replace_once(
            &valid,
            SESSIONS_TTL,
            &format!("{SESSIONS_TTL}, \"padding\": \"{}\"", padding()),
        ),
        "deep_nesting" => replace_once(
            &valid,
            SESSIONS_TTL,
            &format!("{SESSIONS_TTL}, \"deep\": {}", deep_arrays()),
        ),
        "very_long_name" => replace_once(
            &valid,
            "\"locks\": {\"type\": \"memory\"}",
            &format!("\"{}\": {{\"type\": \"memroy\"}}", long_name()),
        ),
        other => panic!("no generator for case `{other}`"),
    };
    text.into_bytes()
}

fn replace_once(text: &str, from: &str, to: &str) -> String {
    assert_eq!(
        text.matches(from).count(),
        1,
        "`{from}` must occur once in the base"
    );
    text.replacen(from, to, 1)
}

/// How many lines differ between `a` and `b` (removed plus added, by the
/// longest common subsequence).
pub fn changed_lines(a: &str, b: &str) -> usize {
    let a: Vec<&str> = a.lines().collect();
    let b: Vec<&str> = b.lines().collect();
    let mut lcs = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    a.len() + b.len() - 2 * lcs[0][0]
}

/// How many subtrees differ between two JSON documents (a value replaced,
/// added or removed counts one); `None` when the root itself differs in
/// type.
pub fn changed_values(a: &serde_json::Value, b: &serde_json::Value) -> Option<usize> {
    use serde_json::Value;
    fn count(a: &Value, b: &Value) -> usize {
        match (a, b) {
            _ if a == b => 0,
            (Value::Object(x), Value::Object(y)) => {
                let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
                keys.into_iter()
                    .map(|k| match (x.get(k), y.get(k)) {
                        (Some(p), Some(q)) => count(p, q),
                        _ => 1,
                    })
                    .sum()
            }
            (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
                x.iter().zip(y).map(|(p, q)| count(p, q)).sum()
            }
            _ => 1,
        }
    }
    match (a, b) {
        (Value::Object(_), Value::Object(_)) => Some(count(a, b)),
        _ => None,
    }
}
