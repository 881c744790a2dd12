//! Reading the PEM files into a rustls server configuration (ring
//! provider) and client certificate verifiers. Errors name the file, never
//! its content.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::danger::ClientCertVerifier;
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};

/// Largest PEM file read.
const MAX_PEM_BYTES: usize = 1024 * 1024;

/// How far this host's clock may be behind the issuer's: a certificate
/// whose notBefore is at most this far ahead of "now" is accepted. A
/// certificate issued "now" and caught by the 1 s recheck while this
/// clock lags by a second would otherwise be refused. notAfter gets no
/// such allowance: an expired certificate stays refused. Allowed at
/// start-up, but in a rotation only when the certificate in force has
/// expired or expires within it: clients on this host share its clock and
/// would refuse the new certificate as not valid yet while the old one
/// still serves (see `LiveTls::recheck_at`).
pub(super) const NOT_BEFORE_SKEW: std::time::Duration = std::time::Duration::from_secs(5 * 60);

/// Why a set of files was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Refused {
    /// What is shown and logged (names the file, never its content).
    pub(super) reason: String,
    /// The leaf is not valid yet (notBefore beyond the allowed skew): the
    /// same files pass with time, so they are checked again rather than
    /// taken as done.
    pub(super) not_yet_valid: bool,
}

impl From<String> for Refused {
    fn from(reason: String) -> Self {
        Self {
            reason,
            not_yet_valid: false,
        }
    }
}

impl From<Refused> for String {
    fn from(refused: Refused) -> Self {
        refused.reason
    }
}

/// The files one listener's configuration is made of, and what was read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Files {
    pub(super) cert: PathBuf,
    pub(super) key: PathBuf,
    /// Client CA bundles: required ones (mutual TLS: every handshake
    /// verifies against both), and optional ones (the Lifecycle CA: alone,
    /// any certificate offered is taken at the handshake and the Lifecycle
    /// API checks it per call).
    pub(super) required_ca: Option<PathBuf>,
    pub(super) optional_ca: Option<PathBuf>,
    /// The ALPN protocols offered: `h2` only on the gRPC listener (tonic
    /// serves HTTP/2 only), `h2` and `http/1.1` on the HTTP one.
    pub(super) alpn: Vec<Vec<u8>>,
}

impl Files {
    /// Every path, for following.
    pub(super) fn paths(&self) -> Vec<&Path> {
        let mut paths = vec![self.cert.as_path(), self.key.as_path()];
        paths.extend(self.required_ca.as_deref());
        paths.extend(self.optional_ca.as_deref());
        paths
    }

    /// Every path, as messages name them: `` `cert.pem`, `key.pem` ``.
    pub(super) fn shown(&self) -> String {
        let paths: Vec<String> = self
            .paths()
            .into_iter()
            .map(|path| format!("`{}`", path.display()))
            .collect();
        paths.join(", ")
    }

    /// The bytes of every file, in [`Files::paths`] order (what a change
    /// is detected on).
    pub(super) fn contents(&self) -> Result<Vec<Vec<u8>>, String> {
        self.paths().into_iter().map(read).collect()
    }

    /// A server configuration built from `contents`, the bytes of the
    /// files as [`Files::contents`] read them (never a second read: a file
    /// caught mid-rewrite then would make a good set refused for good),
    /// with the SHA-256 fingerprint of the leaf certificate and the
    /// Lifecycle API's verifier (from the optional CA, if any). A leaf
    /// outside its validity window at `now` (expired, or not yet valid
    /// beyond `skew`: [`NOT_BEFORE_SKEW`] or none) is refused.
    pub(super) fn server_config(
        &self,
        contents: &[Vec<u8>],
        now: x509_parser::time::ASN1Time,
        skew: std::time::Duration,
    ) -> Result<Built, Refused> {
        let read = self.split(contents)?;
        let chain = certificates(&self.cert, read.cert)?;
        let not_after = check_validity(&self.cert, &chain[0], now, skew)?;
        let mut built = self.build(&read, chain)?;
        built.not_after = not_after;
        Ok(built)
    }

    /// [`Files::server_config`] for files whose leaf is the one in force
    /// (only the key's bytes or the CA files changed): its validity window
    /// is not checked, as it already serves. An expired leaf in force must
    /// not hold a CA change back (a compromised Lifecycle CA would stay
    /// trusted until a new certificate came). The notAfter is still read.
    pub(super) fn server_config_keeping_leaf(
        &self,
        contents: &[Vec<u8>],
    ) -> Result<Built, Refused> {
        let read = self.split(contents)?;
        let chain = certificates(&self.cert, read.cert)?;
        let not_after = validity_of(&self.cert, &chain[0])?.not_after.timestamp();
        let mut built = self.build(&read, chain)?;
        built.not_after = not_after;
        Ok(built)
    }

    /// The configuration from files already read and a leaf already
    /// checked.
    fn build(&self, read: &Read<'_>, chain: Vec<CertificateDer<'static>>) -> Result<Built, String> {
        let key = private_key(&self.key, read.key)?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?;
        let builder = match self.client_verifier(read, &provider)? {
            Some(verifier) => builder.with_client_cert_verifier(verifier),
            None => builder.with_no_client_auth(),
        };
        let fingerprint = fingerprint(&chain[0]);
        let mut config = builder.with_single_cert(chain, key).map_err(|e| {
            format!(
                "`{}` and `{}` do not make a server identity: {e}",
                self.cert.display(),
                self.key.display()
            )
        })?;
        config.alpn_protocols.clone_from(&self.alpn);
        let lifecycle = match (&self.optional_ca, read.optional_ca) {
            (Some(path), Some(bytes)) => Some(ca_verifier(path, bytes)?),
            _ => None,
        };
        Ok(Built {
            config,
            fingerprint,
            lifecycle,
            not_after: i64::MAX,
        })
    }

    /// `contents` (in [`Files::paths`] order) per file.
    fn split<'a>(&self, contents: &'a [Vec<u8>]) -> Result<Read<'a>, String> {
        let mut bytes = contents.iter().map(Vec::as_slice);
        let mut next = || {
            bytes
                .next()
                .ok_or_else(|| "fewer file contents than files".to_string())
        };
        Ok(Read {
            cert: next()?,
            key: next()?,
            required_ca: self.required_ca.as_ref().map(|_| next()).transpose()?,
            optional_ca: self.optional_ca.as_ref().map(|_| next()).transpose()?,
        })
    }

    fn client_verifier(
        &self,
        read: &Read<'_>,
        provider: &Arc<rustls::crypto::CryptoProvider>,
    ) -> Result<Option<Arc<dyn ClientCertVerifier>>, String> {
        let mut roots = RootCertStore::empty();
        let cas = [
            (self.required_ca.as_deref(), read.required_ca),
            (self.optional_ca.as_deref(), read.optional_ca),
        ];
        for (path, bytes) in cas {
            if let (Some(path), Some(bytes)) = (path, bytes) {
                add_roots(&mut roots, path, bytes)?;
            }
        }
        if roots.is_empty() {
            return Ok(None);
        }
        if self.required_ca.is_none() {
            // Only the Lifecycle CA: app calls need no certificate, and one
            // from another CA must not abort the handshake (verified
            // against these roots, it would). The Lifecycle API checks the
            // chain per call.
            let offered = super::offered_cert::OfferedCertificate::new(roots.subjects(), provider);
            return Ok(Some(Arc::new(offered)));
        }
        WebPkiClientVerifier::builder_with_provider(Arc::new(roots), Arc::clone(provider))
            .build()
            .map(Some)
            .map_err(|e| e.to_string())
    }
}

/// What [`Files::server_config`] builds.
pub(super) struct Built {
    pub(super) config: ServerConfig,
    /// SHA-256 of the leaf certificate (hex).
    pub(super) fingerprint: String,
    /// The Lifecycle API's client verifier, with a Lifecycle CA.
    pub(super) lifecycle: Option<Arc<dyn ClientCertVerifier>>,
    /// The leaf's notAfter (Unix seconds).
    pub(super) not_after: i64,
}

/// The bytes read of each file.
struct Read<'a> {
    cert: &'a [u8],
    key: &'a [u8],
    required_ca: Option<&'a [u8]>,
    optional_ca: Option<&'a [u8]>,
}

/// Refuses a certificate outside its validity window at `now`: expired
/// (after notAfter) or not yet valid (notBefore more than `skew` after
/// `now`: this clock may lag the issuer's). The error names the file and
/// the bound passed; a not-yet-valid refusal says so
/// ([`Refused::not_yet_valid`]). Accepted: the notAfter (Unix seconds).
pub(super) fn check_validity(
    path: &Path,
    certificate: &CertificateDer<'_>,
    now: x509_parser::time::ASN1Time,
    skew: std::time::Duration,
) -> Result<i64, Refused> {
    let validity = validity_of(path, certificate)?;
    let skew = i64::try_from(skew.as_secs()).unwrap_or(i64::MAX);
    if now.timestamp().saturating_add(skew) < validity.not_before.timestamp() {
        return Err(Refused {
            reason: format!(
                "`{}`: certificate not valid before {}",
                path.display(),
                validity.not_before
            ),
            not_yet_valid: true,
        });
    }
    if now > validity.not_after {
        return Err(format!(
            "`{}`: certificate expired at {}",
            path.display(),
            validity.not_after
        )
        .into());
    }
    Ok(validity.not_after.timestamp())
}

/// The validity window of `certificate` (read from `path`, named in the
/// error).
fn validity_of(
    path: &Path,
    certificate: &CertificateDer<'_>,
) -> Result<x509_parser::certificate::Validity, String> {
    let (_, parsed) = x509_parser::parse_x509_certificate(certificate.as_ref())
        .map_err(|_| format!("`{}`: the certificate is not valid X.509", path.display()))?;
    Ok(parsed.validity().clone())
}

/// A verifier of client certificates chaining to the CA bundle `bytes`
/// (read from `path`).
pub(super) fn ca_verifier(
    path: &Path,
    bytes: &[u8],
) -> Result<Arc<dyn ClientCertVerifier>, String> {
    let mut roots = RootCertStore::empty();
    add_roots(&mut roots, path, bytes)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
        .build()
        .map_err(|e| e.to_string())
}

fn add_roots(roots: &mut RootCertStore, path: &Path, bytes: &[u8]) -> Result<(), String> {
    for certificate in certificates(path, bytes)? {
        roots
            .add(certificate)
            .map_err(|e| format!("`{}`: not a CA certificate: {e}", path.display()))?;
    }
    Ok(())
}

/// Reads a PEM file: a regular file of at most 1 MiB (a FIFO or a device
/// is refused, never read). The error names the file, never its content.
fn read(path: &Path) -> Result<Vec<u8>, String> {
    use rewire_runtime::FileReadError;
    rewire_runtime::read_bounded(path, MAX_PEM_BYTES).map_err(|err| {
        let reason = match err {
            FileReadError::Io { source, .. } => source.to_string(),
            FileReadError::NotRegular { .. } => {
                "not a regular file (a FIFO, a device or a directory)".into()
            }
            FileReadError::TooLarge { limit, .. } => {
                format!("larger than the {limit} bytes a PEM file may have")
            }
        };
        format!("cannot read `{}`: {reason}", path.display())
    })
}

/// The certificates in `bytes`, read from `path` (named in errors).
fn certificates(path: &Path, bytes: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    let chain = CertificateDer::pem_slice_iter(bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| {
            format!(
                "`{}`: not a PEM certificate: {}",
                path.display(),
                crate::pem_reason::pem_error_reason(&e)
            )
        })?;
    if chain.is_empty() {
        return Err(format!(
            "`{}` holds no PEM certificate (`-----BEGIN CERTIFICATE-----`)",
            path.display()
        ));
    }
    Ok(chain)
}

/// The private key in `bytes`, read from `path` (named in errors).
fn private_key(path: &Path, bytes: &[u8]) -> Result<PrivateKeyDer<'static>, String> {
    PrivateKeyDer::from_pem_slice(bytes)
        .map_err(|_| format!("`{}` holds no PEM private key", path.display()))
}

/// The SHA-256 of a certificate, hex, as `openssl x509 -fingerprint`
/// shows it (without colons).
pub(super) fn fingerprint(certificate: &CertificateDer<'_>) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, certificate.as_ref());
    digest.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_or_a_fifo_is_refused_not_read() {
        let err = read(Path::new("/dev/zero")).expect_err("a device");
        assert!(
            err.contains("/dev/zero") && err.contains("not a regular file"),
            "{err}"
        );
        let dir = std::env::temp_dir().join(format!("rewire-tls-fifo-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let fifo = dir.join("client-ca.pem");
        let _ = std::fs::remove_file(&fifo);
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .expect("mkfifo");
        assert!(made.success());
        let err = read(&fifo).expect_err("a FIFO");
        assert!(
            err.contains("client-ca.pem") && err.contains("not a regular file"),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }

    #[test]
    fn pem_library_errors_never_quote_the_file() {
        let dir = std::env::temp_dir().join(format!("rewire-tls-pem-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let file = dir.join("cert.pem");
        std::fs::write(&file, "-----BEGIN CERTIFICATE c2VjcmV0LWtleQ\n").expect("write");
        let bytes = read(&file).expect("read");
        let err = certificates(&file, &bytes).expect_err("malformed");
        let as_bytes = format!("{:?}", b"c2VjcmV0".as_slice());
        assert!(!err.contains("c2VjcmV0"), "{err}");
        assert!(!err.contains(as_bytes.trim_matches(['[', ']'])), "{err}");
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }
}
