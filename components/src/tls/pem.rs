//! [`PemSource`]: a certificate field's value — PEM text or a file path —
//! and reading it into bytes.

use std::fmt;
use std::path::{Path, PathBuf};

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// Why TLS material could not be used. Names the field and, for a file,
/// the path (as [`shown_path`] shows it); never the PEM text, nor a
/// "path" that may be PEM text a value did not mark as such.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("metadata field `{field}`: cannot read `{path}`: {reason}")]
    Read {
        /// The field.
        field: &'static str,
        /// The file, as [`shown_path`] shows it.
        path: String,
        /// Why (never the file's content nor its path).
        reason: String,
    },
    /// A file's read did not finish within its deadline (a hung NFS or
    /// FUSE mount?), or an earlier read of it, given up, has not returned
    /// yet (no other was started).
    #[error("metadata field `{field}`: cannot read `{path}`: {reason}")]
    Hung {
        /// The field.
        field: &'static str,
        /// The file, as [`shown_path`] shows it.
        path: String,
        /// Which of the two.
        reason: String,
    },
    /// The value (or the file) holds no usable PEM of the expected kind.
    #[error("metadata field `{field}`{}: {reason}", .path.as_ref().map(|p| format!(" (`{p}`)")).unwrap_or_default())]
    Invalid {
        /// The field.
        field: &'static str,
        /// The file, when the value is a path, as [`shown_path`] shows it.
        path: Option<String>,
        /// What is wrong.
        reason: String,
    },
    /// Fields that only make sense together, or the TLS library refused
    /// the combination.
    #[error("{0}")]
    Config(String),
}

impl TlsError {
    /// Whether a file's read hung ([`Hung`](Self::Hung)): a follower warns
    /// once for as long as it lasts, not at every turn.
    pub fn is_hung(&self) -> bool {
        matches!(self, Self::Hung { .. })
    }
}

/// Largest "path" shown in an error, status or `Debug` output; a longer
/// one is more likely key material than a file name.
const MAX_SHOWN_PATH: usize = 1024;

/// Largest PEM file read.
pub const MAX_PEM_BYTES: usize = 1024 * 1024;

/// Longest run of base64 characters (see [`in_run`]) shown when it holds
/// upper- and lower-case letters and digits (see [`looks_like_base64`]):
/// a key's DER in base64 has longer runs, a file name's words do not
/// look like that.
const MAX_SHOWN_BASE64_RUN: usize = 40;

/// A path as errors, status and `Debug` output show it: as is, unless it
/// may be key material given without its `-----BEGIN` line — it holds a
/// line break or a control character, is longer than 1 KiB, or holds
/// base64 that looks like a key's (see [`may_hold_key_base64`]) — then
/// `<value>` stands for it.
pub fn shown_path(path: &Path) -> String {
    let text = path.to_string_lossy();
    if text.len() > MAX_SHOWN_PATH
        || text.chars().any(char::is_control)
        || may_hold_key_base64(&text)
    {
        "<value>".into()
    } else {
        text.into_owned()
    }
}

/// Whether `text` holds, anywhere, base64 (standard or URL-safe) that
/// looks like a key's rather than a file name: a run of base64
/// characters longer than [`MAX_SHOWN_BASE64_RUN`], or a run opening as
/// DER does followed by 40 base64 characters or more, counted to the end
/// of the text across any separator (`/`, a space, a quote, a `,`…) — in
/// both cases holding upper- and lower-case letters and digits. A value
/// written relative (a key taken for a path) is shown joined to the
/// configuration's folder; a plain YAML scalar over several lines is
/// folded into one with spaces; a key may be quoted or followed by a
/// `,` or a `;`: none of these lets it through.
fn may_hold_key_base64(text: &str) -> bool {
    let long_run = text
        .split(|c: char| !in_run(c))
        .any(|run| run.len() > MAX_SHOWN_BASE64_RUN && looks_like_base64(run));
    long_run
        || text.char_indices().any(|(at, _)| {
            let opens_a_run = text[..at].chars().next_back().is_none_or(|c| !in_run(c));
            opens_a_run && opens_as_der(&text[at..]) && {
                let counted: String = text[at..].chars().filter(|&c| is_base64(c)).collect();
                counted.len() >= MIN_HIDDEN_DER && looks_like_base64(&counted)
            }
        })
}

/// Whether `c` is part of a run of base64 characters: a letter, a digit
/// or a `+`. A `/` (a path's separator too), the `-` and `_` of URL-safe
/// base64 (a file name's word separators), and the padding `=` end a run.
fn in_run(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '+'
}

/// Whether `c` is a base64 character, standard or URL-safe.
fn is_base64(c: char) -> bool {
    in_run(c) || matches!(c, '/' | '=' | '-' | '_')
}

/// Whether `text` mixes upper- and lower-case letters and digits, as a
/// key's base64 does (an Ed25519 key's DER header alone does; an EC
/// key's 112 random characters lack a digit with odds under 1 in 10^8),
/// and words, a hexadecimal digest or a name in capitals do not.
fn looks_like_base64(text: &str) -> bool {
    text.chars().any(|c| c.is_ascii_uppercase())
        && text.chars().any(|c| c.is_ascii_lowercase())
        && text.chars().any(|c| c.is_ascii_digit())
}

/// Whether `text` opens as a DER structure in base64 does: a SEQUENCE
/// (`0x30`, `M`) then its length's first bits (a short length, up to
/// 127, gives `A` to `H`; a long one, `0x81` to `0x84`, gives `I`).
fn opens_as_der(text: &str) -> bool {
    let mut chars = text.chars();
    chars.next() == Some('M') && matches!(chars.next(), Some('A'..='I'))
}

/// Shortest DER in base64 hidden whatever its runs (an Ed25519 key is 64
/// characters, and `/` being a base64 character, its runs may all be
/// short; a folded or quoted key's runs are cut by spaces or quotes).
const MIN_HIDDEN_DER: usize = 40;

/// Why a PEM text did not parse, in fixed words: the library's own
/// message can quote the offending line, which may be key material.
pub fn pem_error_reason(err: &rustls_pki_types::pem::Error) -> &'static str {
    use rustls_pki_types::pem::Error;
    match err {
        Error::MissingSectionEnd { .. } => "a PEM section has no `-----END` line",
        Error::IllegalSectionStart { .. } => "a PEM `-----BEGIN` line is malformed",
        Error::Base64Decode(_) => "a PEM section is not valid base64",
        Error::Io(_) => "the PEM text could not be read",
        Error::NoItemsFound => "no PEM section of the expected kind",
        _ => "the PEM text is malformed",
    }
}

/// Why a certificate file could not be read, without its path (the
/// error names the field and the path itself).
pub(super) fn read_error_reason(err: &rewire_runtime::FileReadError) -> String {
    use rewire_runtime::FileReadError;
    match err {
        FileReadError::Io { source, .. } => source.to_string(),
        FileReadError::NotRegular { .. } => {
            "not a regular file (a FIFO, a device or a directory)".into()
        }
        FileReadError::TooLarge { limit, .. } => {
            format!("larger than the {limit} bytes a PEM file may have")
        }
    }
}

/// A certificate field's value: PEM text, or the path of a PEM file.
#[derive(Clone, PartialEq, Eq)]
pub enum PemSource {
    /// PEM text given in the metadata (or injected by a secretRef).
    Inline(String),
    /// A file holding PEM text.
    File(PathBuf),
}

impl fmt::Debug for PemSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Inline(_) => f.write_str("Inline(<PEM>)"),
            Self::File(path) => f.debug_tuple("File").field(&shown_path(path)).finish(),
        }
    }
}

impl PemSource {
    /// A certificate field's value for `Debug` output: a path as is, PEM
    /// text hidden, nothing for an empty value.
    pub fn shown(value: &str) -> String {
        match Self::parse(value) {
            None => String::new(),
            Some(Self::Inline(_)) => "<PEM>".into(),
            Some(Self::File(path)) => shown_path(&path),
        }
    }

    /// The source a field's value names; `None` for an empty value. A
    /// value holding `-----BEGIN` anywhere (after a byte-order mark, or
    /// `Bag Attributes` lines as `openssl pkcs12 -nodes` writes them) or a
    /// line break (even a trailing one: a key's bare base64 body) is PEM
    /// text; anything else is a path.
    pub fn parse(value: &str) -> Option<Self> {
        let trimmed = value.trim_matches(|c: char| c.is_whitespace() || c == '\u{feff}');
        if trimmed.is_empty() {
            None
        } else if value.contains("-----BEGIN") || value.contains(['\n', '\r']) {
            Some(Self::Inline(value.to_string()))
        } else {
            Some(Self::File(PathBuf::from(trimmed)))
        }
    }

    /// The source with a relative path resolved against `dir`.
    pub fn resolved(self, dir: Option<&Path>) -> Self {
        match (self, dir) {
            (Self::File(path), Some(dir)) if path.is_relative() => Self::File(dir.join(path)),
            (other, _) => other,
        }
    }

    /// The file, when the value is a path.
    pub fn path(&self) -> Option<&Path> {
        match self {
            Self::File(path) => Some(path),
            Self::Inline(_) => None,
        }
    }

    /// The PEM bytes (at most 1 MiB, from a regular file only: a FIFO or
    /// a device is refused rather than read).
    pub fn read(&self, field: &'static str) -> Result<Vec<u8>, TlsError> {
        match self {
            Self::Inline(text) => Ok(text.as_bytes().to_vec()),
            Self::File(path) => {
                rewire_runtime::read_bounded(path, MAX_PEM_BYTES).map_err(|err| TlsError::Read {
                    field,
                    path: shown_path(path),
                    reason: read_error_reason(&err),
                })
            }
        }
    }

    /// The certificates in the value (at least one).
    pub fn certificates(
        &self,
        field: &'static str,
    ) -> Result<Vec<CertificateDer<'static>>, TlsError> {
        self.certificates_in(field, &self.read(field)?)
    }

    /// The certificates in `bytes`, what [`PemSource::read`] gave (at
    /// least one); errors name the field and the file.
    pub fn certificates_in(
        &self,
        field: &'static str,
        bytes: &[u8],
    ) -> Result<Vec<CertificateDer<'static>>, TlsError> {
        certificates(bytes).map_err(|reason| self.invalid(field, reason))
    }

    /// The private key in the value.
    pub fn private_key(&self, field: &'static str) -> Result<PrivateKeyDer<'static>, TlsError> {
        self.private_key_in(field, &self.read(field)?)
    }

    /// The private key in `bytes`, what [`PemSource::read`] gave; errors
    /// name the field and the file.
    pub fn private_key_in(
        &self,
        field: &'static str,
        bytes: &[u8],
    ) -> Result<PrivateKeyDer<'static>, TlsError> {
        private_key(bytes).map_err(|reason| self.invalid(field, reason))
    }

    fn invalid(&self, field: &'static str, reason: String) -> TlsError {
        TlsError::Invalid {
            field,
            path: self.path().map(shown_path),
            reason,
        }
    }
}

/// The certificates of a PEM text (at least one).
pub fn certificates(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    let certificates = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|err| format!("not a PEM certificate: {}", pem_error_reason(&err)))?;
    if certificates.is_empty() {
        return Err("holds no PEM certificate (`-----BEGIN CERTIFICATE-----`)".into());
    }
    Ok(certificates)
}

/// The private key of a PEM text (PKCS#8, PKCS#1 or SEC1).
pub fn private_key(pem: &[u8]) -> Result<PrivateKeyDer<'static>, String> {
    PrivateKeyDer::from_pem_slice(pem).map_err(|_| {
        "holds no PEM private key (`-----BEGIN PRIVATE KEY-----`, `RSA PRIVATE KEY` or `EC PRIVATE KEY`)".into()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_is_pem_text_or_a_path() {
        assert_eq!(PemSource::parse("  "), None);
        assert_eq!(
            PemSource::parse("certs/ca.pem"),
            Some(PemSource::File("certs/ca.pem".into()))
        );
        let inline = PemSource::parse("-----BEGIN CERTIFICATE-----\nx").expect("inline");
        assert!(matches!(inline, PemSource::Inline(_)));
        assert_eq!(format!("{inline:?}"), "Inline(<PEM>)");
        let resolved = PemSource::parse("ca.pem")
            .expect("path")
            .resolved(Some(Path::new("/etc/rewire")));
        assert_eq!(resolved.path(), Some(Path::new("/etc/rewire/ca.pem")));
    }

    #[test]
    fn errors_name_the_field_never_the_text() {
        let secret = "-----BEGIN PRIVATE KEY-----\nc2VjcmV0\n-----END CERTIFICATE-----\n";
        let source = PemSource::parse(secret).expect("inline");
        let err = source.certificates("clientCert").expect_err("not a cert");
        let text = err.to_string();
        assert!(text.starts_with("metadata field `clientCert`"), "{text}");
        assert!(!text.contains("c2VjcmV0"), "{text}");
        let missing = PemSource::File("/nonexistent/ca.pem".into());
        let text = missing
            .certificates("caCert")
            .expect_err("missing")
            .to_string();
        assert!(
            text.contains("`caCert`") && text.contains("/nonexistent/ca.pem"),
            "{text}"
        );
    }

    /// A key whose value does not start with `-----BEGIN`: what
    /// `openssl pkcs12 -nodes` writes (`Bag Attributes` first), a
    /// byte-order mark, or the bare base64 body with a line break.
    fn disguised_keys() -> Vec<(&'static str, String)> {
        let body = "MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgS3cR3tK3yB0dYfragment";
        let pem = format!("-----BEGIN PRIVATE KEY-----\n{body}\n-----END PRIVATE KEY-----\n");
        vec![
            (
                body,
                format!("Bag Attributes\n    localKeyID: 01 02 03\n{pem}"),
            ),
            (body, format!("\u{feff}{pem}")),
            (body, format!("{body}\n")),
            (body, format!("  {body}\r\n{body}")),
        ]
    }

    #[test]
    fn a_key_without_a_leading_begin_line_never_shows() {
        for (fragment, value) in disguised_keys() {
            let source = PemSource::parse(&value).expect("a value");
            assert!(
                matches!(source, PemSource::Inline(_)),
                "{:?} taken for a path",
                value.len()
            );
            let shown = PemSource::shown(&value);
            let debug = format!("{source:?}");
            let errors = [
                source.certificates("clientCert").map(drop),
                source.private_key("caCert").map(drop),
            ];
            let mut texts = vec![shown, debug];
            for err in errors.into_iter().filter_map(Result::err) {
                texts.push(err.to_string());
                texts.push(format!("{err:?}"));
            }
            for text in texts {
                assert!(!text.contains(&fragment[..16]), "{text}");
                assert!(!text.contains("localKeyID"), "{text}");
            }
        }
    }

    #[test]
    fn a_path_that_may_be_key_material_is_never_shown() {
        let long = "A".repeat(2000);
        for source in [
            PemSource::File(long.clone().into()),
            PemSource::File("MIGHAgEAMBMGByqG\nSM49AgEGCCqG".into()),
            // An Ed25519 key's DER in base64 whose runs between slashes
            // are all short.
            PemSource::File("MC4CAQAwBQYDK2VwBCIEIJx/1d9kq0f+Tq3a8mW/7h2rS9yP/Lb5vZ+eQxNc0aHk".into()),
            // An EC key's DER in base64 on one line (a secretRef's value).
            PemSource::File(
                "MHcCAQEEIIrYSSNQFaA2Hwf1duRSxKtLYX5CB04fSeQ6tF1aY/zuoAoGCCqGSM49AwEHoUQDQgAE\
                 PR3tU2Fd5Yk0wGAtIEbgFbX7n0zhY3kkdLcxGmlpUxbfJtHhAWu/R0JhMBa2TgvY9gSpyJpxXM7sbnNcCQ=="
                    .into(),
            ),
        ] {
            let err = source.certificates("clientKey").expect_err("no such file");
            for text in [err.to_string(), format!("{err:?}"), format!("{source:?}")] {
                assert!(!text.contains("AAAAAAAA"), "{text}");
                assert!(!text.contains("MIGHAgEA"), "{text}");
                assert!(!text.contains("MHcCAQEE"), "{text}");
                assert!(!text.contains("MC4CAQAw"), "{text}");
                assert!(text.contains("<value>"), "{text}");
            }
        }
        assert_eq!(PemSource::shown(&long), "<value>");
        // File names stay shown, base64-looking parts and all.
        for path in [
            "certs/app.key",
            "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt",
            "/etc/ssl/private/redis-client-key",
            "/vault/secrets/0123456789abcdef0123456789abcdef/tls",
        ] {
            assert_eq!(shown_path(Path::new(path)), path);
        }
    }

    /// An Ed25519 key's DER in base64 on one line: its runs between
    /// slashes are all short.
    const ED25519_B64: &str = "MC4CAQAwBQYDK2VwBCIEIJx/1d9kq0f+Tq3a8mW/7h2rS9yP/Lb5vZ+eQxNc0aHk";
    /// An EC key's DER in base64 on one line.
    const EC_B64: &str = "MHcCAQEEIIrYSSNQFaA2Hwf1duRSxKtLYX5CB04fSeQ6tF1aY/zuoAoGCCqGSM49AwEHoUQDQgAEPR3tU2Fd5Yk0wGAtIEbgFbX7n0zhY3kkdLcxGmlpUxbfJtHhAWu/R0JhMBa2TgvY9gSpyJpxXM7sbnNcCQ==";
    /// An RSA key's DER in base64 on one line (cut short).
    const RSA_B64: &str = "MIIBOwIBAAJBAKj34GkxFhD90vcNLYLInFEX6Ppy1tPf9Cnzj4p4WGeKLs1Pt8QuKUpRKfFLfRYC9AIKjbJTWit+CqvjWYzvQwECAwEAAQJAIJLixBy2qpFoS4DSmoEmo3qGy0t6z09AIJtH+5OeRV1be+N4cDYJKffGzDa88vQENZiRm0GRq6a+HPGQMd2kTQIhAKMSvzIBnni7ot";

    /// A one-line base64 key given where a path is expected (`clientKey`
    /// in a file, or `rewire apply -m clientKey=…`) is taken for a
    /// relative path and joined to the configuration's folder: the joined
    /// path is hidden too, whatever the folder holds (a leading `/`, a
    /// `.`, a `-`, a space), in every error, `Debug` included.
    #[test]
    fn a_key_taken_for_a_relative_path_never_shows_once_resolved() {
        for key in [ED25519_B64, EC_B64, RSA_B64] {
            for dir in [
                "/etc/rewire",
                "/home/u/.config/rewire",
                "/opt/app-1.2",
                "/srv/my app",
            ] {
                let source = PemSource::parse(key)
                    .expect("a value")
                    .resolved(Some(Path::new(dir)));
                assert_eq!(source.path(), Some(Path::new(dir).join(key).as_path()));
                let errors = [
                    source.certificates("clientKey").map(drop),
                    source.private_key("clientKey").map(drop),
                    source.read("clientKey").map(drop),
                ];
                let mut texts = vec![format!("{source:?}")];
                for err in errors.into_iter().filter_map(Result::err) {
                    texts.push(err.to_string());
                    texts.push(format!("{err:?}"));
                }
                assert_eq!(texts.len(), 7, "every read fails: no such file");
                for text in texts {
                    assert!(!text.contains(&key[..8]), "{dir}: {text}");
                    assert!(!text.contains(&key[key.len() - 8..]), "{dir}: {text}");
                    assert!(text.contains("<value>"), "{dir}: {text}");
                }
            }
        }
    }

    /// A file found at such a joined path (not PEM) names it hidden as
    /// well; a path as the read-with-a-deadline shows it, too.
    #[test]
    fn a_found_file_named_as_a_key_is_not_shown() {
        let dir = std::env::temp_dir().join(format!("rewire-pem-key-{}.d", std::process::id()));
        let path = dir.join(ED25519_B64);
        std::fs::create_dir_all(path.parent().expect("a parent")).expect("dir");
        std::fs::write(&path, "not PEM").expect("write");
        let source = PemSource::parse(ED25519_B64)
            .expect("a value")
            .resolved(Some(&dir));
        let err = source.private_key("clientKey").expect_err("not PEM");
        assert!(matches!(err, TlsError::Invalid { .. }), "{err:?}");
        for text in [err.to_string(), format!("{err:?}"), shown_path(&path)] {
            assert!(!text.contains("MC4CAQAw"), "{text}");
            assert!(text.contains("<value>"), "{text}");
        }
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }

    /// File names stay shown in folders with a `.`, a `-` or a space, even
    /// with a part opening with `M`.
    #[test]
    fn file_names_in_any_folder_stay_shown() {
        for path in [
            "/home/u/.config/rewire/certs/client.key",
            "/home/u/.config/rewire/Microsoft/Azure/Redis/ClientCertificate",
            "/opt/app-1.2/Media/production/redis/client/tls/key",
            "/srv/my app/MIGRATED/key",
            "/var/lib/rewire/certs/redis-client-key",
            // A last part over 40 characters of letters and `-`.
            "/home/u/.config/rewire/production-redis-cluster-client-private-key",
            // A folder opening as DER does (`ME`), 40 characters and more of
            // words after it.
            "/data/MEDIA/certificates/redis/production/client",
            // A SHA-256 digest in hexadecimal: 64 characters, one case.
            "/vault/secrets/9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08/tls",
        ] {
            assert_eq!(shown_path(Path::new(path)), path);
        }
    }

    /// `key` with a space every `width` characters: a plain YAML scalar
    /// written over several lines, folded.
    fn folded(key: &str, width: usize) -> String {
        let chars: Vec<char> = key.chars().collect();
        let lines: Vec<String> = chars
            .chunks(width)
            .map(|line| line.iter().collect())
            .collect();
        lines.join(" ")
    }

    /// A one-line key with spaces in it (a folded YAML scalar), in quotes,
    /// or followed by a `,` or a `;` is taken for a relative path too: the
    /// path stays hidden once joined to the configuration's folder, in
    /// every error, `Debug` included.
    #[test]
    fn a_key_with_spaces_quotes_or_punctuation_never_shows() {
        for key in [ED25519_B64, EC_B64, RSA_B64] {
            for width in [64, 16] {
                let folded = folded(key, width);
                for value in [
                    folded.clone(),
                    format!("\"{folded}\""),
                    format!("'{folded}'"),
                    format!("{folded},"),
                    format!("{folded};"),
                    format!("clientKey={folded}"),
                ] {
                    for dir in [None, Some("/etc/rewire"), Some("/home/u/.config/rewire")] {
                        let source = PemSource::parse(&value)
                            .expect("a value")
                            .resolved(dir.map(Path::new));
                        assert!(source.path().is_some(), "taken for a path");
                        let errors = [
                            source.certificates("clientKey").map(drop),
                            source.private_key("clientKey").map(drop),
                        ];
                        let mut texts = vec![format!("{source:?}"), PemSource::shown(&value)];
                        for err in errors.into_iter().filter_map(Result::err) {
                            texts.push(err.to_string());
                            texts.push(format!("{err:?}"));
                        }
                        for text in texts {
                            assert!(!text.contains(&key[..8]), "{dir:?}: {text}");
                            assert!(text.contains("<value>"), "{dir:?}: {text}");
                        }
                    }
                }
            }
        }
        // The reviewer's case: the EC key folded at 64 characters, joined.
        let joined = Path::new("/etc/rewire").join(folded(EC_B64, 64));
        assert!(!shown_path(&joined).contains(&EC_B64[..8]));
    }

    /// Keys of random bytes (a fixed sequence, the same at every run) after
    /// the Ed25519 and EC DER headers, folded at any width, quoted or not,
    /// joined to a folder: none shows.
    #[test]
    fn random_keys_in_any_disguise_never_show() {
        const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let mut state: u64 = 0x5eed_6773_008a;
        let mut next = move |bound: usize| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (state >> 33) as usize % bound
        };
        for round in 0..2000 {
            let (header, random) = if round % 2 == 0 {
                ("MC4CAQAwBQYDK2VwBCIEI", 43)
            } else {
                ("MHcCAQEEI", 112)
            };
            let body: String = (0..random)
                .map(|_| char::from(ALPHABET[next(ALPHABET.len())]))
                .collect();
            let key = format!("{header}{body}");
            let folded = folded(&key, 4 + next(61));
            let value = match next(4) {
                0 => folded,
                1 => format!("\"{folded}\""),
                2 => format!("{folded},"),
                _ => format!("'{folded}';"),
            };
            let path = Path::new("/home/u/.config/rewire").join(&value);
            let shown = shown_path(&path);
            assert_eq!(shown, "<value>", "{value}");
            assert_eq!(shown_path(Path::new(&value)), "<value>", "{value}");
        }
    }

    #[test]
    fn pem_library_errors_are_fixed_words() {
        let key_line = "-----BEGIN PRIVATE KEY c2VjcmV0LWtleS1ieXRlcw";
        let source = PemSource::Inline(format!("{key_line}\n"));
        let err = source.certificates("caCert").expect_err("malformed");
        let text = format!("{err} {err:?}");
        // Neither as text nor as the library's list of byte values.
        let as_bytes = format!("{:?}", b"c2VjcmV0".as_slice());
        let as_bytes = as_bytes.trim_matches(['[', ']']);
        assert!(!text.contains("c2VjcmV0"), "{text}");
        assert!(!text.contains(as_bytes), "{text}");
        let unterminated =
            PemSource::Inline("-----BEGIN CERTIFICATE-----\nc2VjcmV0LWtleS1ieXRlcw==\n".into());
        let err = unterminated.certificates("caCert").expect_err("no end");
        let text = format!("{err} {err:?}");
        assert!(!text.contains("c2VjcmV0"), "{text}");
    }

    #[test]
    fn a_device_or_a_fifo_is_refused_not_read() {
        let err = PemSource::File("/dev/zero".into())
            .certificates("caCert")
            .expect_err("a device");
        let text = err.to_string();
        assert!(text.contains("`caCert`"), "{text}");
        assert!(text.contains("not a regular file"), "{text}");
        let dir = std::env::temp_dir().join(format!("rewire-pem-fifo-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let fifo = dir.join("ca.pem");
        let _ = std::fs::remove_file(&fifo);
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .expect("mkfifo");
        assert!(made.success());
        let err = PemSource::File(fifo.clone())
            .certificates("caCert")
            .expect_err("a FIFO");
        let text = err.to_string();
        assert!(
            text.contains("`caCert`") && text.contains("not a regular file"),
            "{text}"
        );
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }
}
