//! Test certificates made with rcgen (no `openssl` command): a CA, server
//! certificates for `localhost` and `127.0.0.1`, client certificates, all
//! written as PEM files into the CA's temporary directory.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// A certificate and its key, as PEM text and as files.
#[derive(Debug, Clone)]
pub struct CertFiles {
    /// The certificate, PEM.
    pub cert_pem: String,
    /// The private key, PEM.
    pub key_pem: String,
    /// Where the certificate is written.
    pub cert_path: PathBuf,
    /// Where the key is written.
    pub key_path: PathBuf,
}

impl CertFiles {
    /// Writes this certificate and key over the files at `cert_path` and
    /// `key_path` (a rotation: rename-over, as Kubernetes and editors do).
    pub fn install_at(&self, cert_path: &Path, key_path: &Path) {
        replace_file(cert_path, &self.cert_pem);
        replace_file(key_path, &self.key_pem);
    }

    /// Writes this certificate and key as `client.crt` and `client.key`
    /// in `dir` (the files a component follows, renewed later with
    /// [`install_at`](Self::install_at)); their paths.
    pub fn installed_in(&self, dir: &Path) -> (PathBuf, PathBuf) {
        let (cert, key) = (dir.join("client.crt"), dir.join("client.key"));
        self.install_at(&cert, &key);
        (cert, key)
    }
}

/// A test certificate authority.
pub struct TestCa {
    issuer: Issuer<'static, KeyPair>,
    /// The CA certificate, PEM.
    pub ca_pem: String,
    /// Where the CA certificate is written.
    pub ca_path: PathBuf,
    dir: tempfile::TempDir,
}

impl TestCa {
    /// A new CA named `name`, its certificate written to `ca.pem`.
    pub fn new(name: &str) -> Self {
        let key = KeyPair::generate().expect("CA key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let certificate = params.self_signed(&key).expect("CA certificate");
        let dir = tempfile::tempdir().expect("temp dir");
        let ca_pem = certificate.pem();
        let ca_path = dir.path().join("ca.pem");
        std::fs::write(&ca_path, &ca_pem).expect("write ca.pem");
        Self {
            issuer: Issuer::new(params, key),
            ca_pem,
            ca_path,
            dir,
        }
    }

    /// A server certificate for `localhost` and `127.0.0.1` (also good as
    /// a client certificate), written as `{name}.pem` / `{name}-key.pem`.
    pub fn server(&self, name: &str) -> CertFiles {
        self.issue(name, &["localhost", "127.0.0.1"])
    }

    /// A server certificate for `names` only (DNS names or IP addresses),
    /// written as `{name}.pem` / `{name}-key.pem`.
    pub fn server_for(&self, name: &str, names: &[&str]) -> CertFiles {
        self.issue(name, names)
    }

    /// A client certificate with common name `name`.
    pub fn client(&self, name: &str) -> CertFiles {
        self.issue(name, &[])
    }

    /// The folder the files are written to.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    fn issue(&self, name: &str, names: &[&str]) -> CertFiles {
        let key = KeyPair::generate().expect("key");
        let names: Vec<String> = names.iter().map(|n| (*n).to_string()).collect();
        let mut params = CertificateParams::new(names).expect("params");
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let certificate = params.signed_by(&key, &self.issuer).expect("sign");
        let files = CertFiles {
            cert_pem: certificate.pem(),
            key_pem: key.serialize_pem(),
            cert_path: self.dir.path().join(format!("{name}.pem")),
            key_path: self.dir.path().join(format!("{name}-key.pem")),
        };
        std::fs::write(&files.cert_path, &files.cert_pem).expect("write cert");
        std::fs::write(&files.key_path, &files.key_pem).expect("write key");
        files
    }
}

/// Replaces `path` with `text` atomically (write aside, rename over).
pub fn replace_file(path: &Path, text: &str) {
    let aside = path.with_extension("tmp-rotate");
    std::fs::write(&aside, text).expect("write aside");
    std::fs::rename(&aside, path).expect("rename over");
}
