//! [`PemSource`]: a certificate field's value — PEM text or a file path —
//! and reading it into bytes.

use std::fmt;
use std::path::{Path, PathBuf};

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// Why TLS material could not be used. Names the field and, for a file,
/// the path; never the PEM text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("metadata field `{field}`: cannot read `{path}`: {reason}")]
    Read {
        /// The field.
        field: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The value (or the file) holds no usable PEM of the expected kind.
    #[error("metadata field `{field}`{}: {reason}", .path.as_ref().map(|p| format!(" (`{}`)", p.display())).unwrap_or_default())]
    Invalid {
        /// The field.
        field: &'static str,
        /// The file, when the value is a path.
        path: Option<PathBuf>,
        /// What is wrong.
        reason: String,
    },
    /// Fields that only make sense together, or the TLS library refused
    /// the combination.
    #[error("{0}")]
    Config(String),
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
            Self::File(path) => f.debug_tuple("File").field(path).finish(),
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
            Some(Self::File(path)) => path.display().to_string(),
        }
    }

    /// The source a field's value names; `None` for an empty value.
    pub fn parse(value: &str) -> Option<Self> {
        let trimmed = value.trim();
        if trimmed.is_empty() {
            None
        } else if trimmed.starts_with("-----BEGIN") {
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

    /// The PEM bytes (at most 1 MiB from a file).
    pub fn read(&self, field: &'static str) -> Result<Vec<u8>, TlsError> {
        const MAX_PEM_BYTES: u64 = 1024 * 1024;
        match self {
            Self::Inline(text) => Ok(text.as_bytes().to_vec()),
            Self::File(path) => {
                let read = || -> std::io::Result<Vec<u8>> {
                    let size = std::fs::metadata(path)?.len();
                    if size > MAX_PEM_BYTES {
                        return Err(std::io::Error::other(format!(
                            "{size} bytes, more than the {MAX_PEM_BYTES} a PEM file may have"
                        )));
                    }
                    std::fs::read(path)
                };
                read().map_err(|err| TlsError::Read {
                    field,
                    path: path.clone(),
                    reason: err.to_string(),
                })
            }
        }
    }

    /// The certificates in the value (at least one).
    pub fn certificates(
        &self,
        field: &'static str,
    ) -> Result<Vec<CertificateDer<'static>>, TlsError> {
        let bytes = self.read(field)?;
        certificates(&bytes).map_err(|reason| self.invalid(field, reason))
    }

    /// The private key in the value.
    pub fn private_key(&self, field: &'static str) -> Result<PrivateKeyDer<'static>, TlsError> {
        let bytes = self.read(field)?;
        private_key(&bytes).map_err(|reason| self.invalid(field, reason))
    }

    fn invalid(&self, field: &'static str, reason: String) -> TlsError {
        TlsError::Invalid {
            field,
            path: self.path().map(Path::to_path_buf),
            reason,
        }
    }
}

/// The certificates of a PEM text (at least one).
pub fn certificates(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    let certificates = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|err| format!("not a PEM certificate: {err}"))?;
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
}
