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
const MAX_PEM_BYTES: u64 = 1024 * 1024;

/// The files one listener's configuration is made of, and what was read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Files {
    pub(super) cert: PathBuf,
    pub(super) key: PathBuf,
    /// Client CA bundles: required ones (mutual TLS), and optional ones
    /// (offered certificates are verified; the Lifecycle CA).
    pub(super) required_ca: Option<PathBuf>,
    pub(super) optional_ca: Option<PathBuf>,
}

impl Files {
    /// Every path, for following.
    pub(super) fn paths(&self) -> Vec<&Path> {
        let mut paths = vec![self.cert.as_path(), self.key.as_path()];
        paths.extend(self.required_ca.as_deref());
        paths.extend(self.optional_ca.as_deref());
        paths
    }

    /// The bytes of every file, in [`Files::paths`] order (what a change
    /// is detected on).
    pub(super) fn contents(&self) -> Result<Vec<Vec<u8>>, String> {
        self.paths().into_iter().map(read).collect()
    }

    /// A server configuration from the files' current content; the SHA-256
    /// fingerprint of the leaf certificate with it.
    pub(super) fn server_config(&self) -> Result<(ServerConfig, String), String> {
        let chain = certificates(&self.cert)?;
        let key = private_key(&self.key)?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?;
        let builder = match self.client_verifier(&provider)? {
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
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok((config, fingerprint))
    }

    fn client_verifier(
        &self,
        provider: &Arc<rustls::crypto::CryptoProvider>,
    ) -> Result<Option<Arc<dyn ClientCertVerifier>>, String> {
        let mut roots = RootCertStore::empty();
        for path in self.required_ca.iter().chain(&self.optional_ca) {
            add_roots(&mut roots, path)?;
        }
        if roots.is_empty() {
            return Ok(None);
        }
        let builder =
            WebPkiClientVerifier::builder_with_provider(Arc::new(roots), Arc::clone(provider));
        let builder = match self.required_ca {
            Some(_) => builder,
            None => builder.allow_unauthenticated(),
        };
        builder.build().map(Some).map_err(|e| e.to_string())
    }
}

/// A verifier of client certificates chaining to the CA bundle at `path`.
pub(super) fn ca_verifier(path: &Path) -> Result<Arc<dyn ClientCertVerifier>, String> {
    let mut roots = RootCertStore::empty();
    add_roots(&mut roots, path)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
        .build()
        .map_err(|e| e.to_string())
}

fn add_roots(roots: &mut RootCertStore, path: &Path) -> Result<(), String> {
    for certificate in certificates(path)? {
        roots
            .add(certificate)
            .map_err(|e| format!("`{}`: not a CA certificate: {e}", path.display()))?;
    }
    Ok(())
}

fn read(path: &Path) -> Result<Vec<u8>, String> {
    let read = || -> std::io::Result<Vec<u8>> {
        let size = std::fs::metadata(path)?.len();
        if size > MAX_PEM_BYTES {
            return Err(std::io::Error::other(format!(
                "{size} bytes, more than a PEM file may have ({MAX_PEM_BYTES})"
            )));
        }
        std::fs::read(path)
    };
    read().map_err(|e| format!("cannot read `{}`: {e}", path.display()))
}

fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let bytes = read(path)?;
    let chain = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("`{}`: not a PEM certificate: {e}", path.display()))?;
    if chain.is_empty() {
        return Err(format!(
            "`{}` holds no PEM certificate (`-----BEGIN CERTIFICATE-----`)",
            path.display()
        ));
    }
    Ok(chain)
}

fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    let bytes = read(path)?;
    PrivateKeyDer::from_pem_slice(&bytes)
        .map_err(|_| format!("`{}` holds no PEM private key", path.display()))
}

/// The SHA-256 of a certificate, hex, as `openssl x509 -fingerprint`
/// shows it (without colons).
pub(super) fn fingerprint(certificate: &CertificateDer<'_>) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, certificate.as_ref());
    digest.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}
