//! [`ClientTlsFields`] → [`ClientTls`]: a component's TLS fields, read and
//! checked, and the client configurations built from them.

use std::path::Path;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};

use super::pem::{certificates, private_key, PemSource, TlsError};
use super::system_roots;

/// A component's TLS fields as declared: each certificate a [`PemSource`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientTlsFields {
    /// `caCert`: the CA bundle that signs the server's certificate; none:
    /// the system's roots.
    pub ca_cert: Option<PemSource>,
    /// `clientCert`: the client's certificate chain, for mutual TLS.
    pub client_cert: Option<PemSource>,
    /// `clientKey`: the client certificate's private key.
    pub client_key: Option<PemSource>,
    /// `insecureSkipVerify`: accept any server certificate (tests only).
    pub insecure_skip_verify: bool,
}

/// The TLS material read and checked: PEM bytes ready for a client.
#[derive(Clone, PartialEq, Eq)]
pub struct ClientTls {
    /// The CA bundle, if one is given.
    pub ca_pem: Option<Vec<u8>>,
    /// `(certificate chain, key)`, for mutual TLS.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
    /// Whether the server's certificate goes unchecked.
    pub insecure_skip_verify: bool,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls")
            .field("ca", &self.ca_pem.as_ref().map(|_| "<PEM>"))
            .field("identity", &self.identity.as_ref().map(|_| "<PEM>"))
            .field("insecure_skip_verify", &self.insecure_skip_verify)
            .finish()
    }
}

impl ClientTlsFields {
    /// The fields with relative paths resolved against `dir`.
    pub fn resolved(self, dir: Option<&Path>) -> Self {
        Self {
            ca_cert: self.ca_cert.map(|s| s.resolved(dir)),
            client_cert: self.client_cert.map(|s| s.resolved(dir)),
            client_key: self.client_key.map(|s| s.resolved(dir)),
            ..self
        }
    }

    /// The files among the fields (to follow for rotation).
    pub fn files(&self) -> Vec<&Path> {
        [&self.ca_cert, &self.client_cert, &self.client_key]
            .into_iter()
            .filter_map(|s| s.as_ref().and_then(PemSource::path))
            .collect()
    }

    /// Reads and checks the material: the CA holds certificates, the
    /// client certificate and key come together and parse. Each file is
    /// read once: the bytes checked are the bytes kept (a second read
    /// could catch a file mid-rewrite, and keep what was never checked).
    /// Blocks on the files: async code calls
    /// [`load_within`](Self::load_within).
    pub fn load(&self) -> Result<ClientTls, TlsError> {
        self.checked(self.read()?)
    }

    /// Each field's bytes, read once.
    fn read(&self) -> Result<ReadFields, TlsError> {
        let read = |source: &Option<PemSource>, field| {
            source
                .as_ref()
                .map(|s: &PemSource| s.read(field))
                .transpose()
        };
        Ok(ReadFields {
            ca: read(&self.ca_cert, "caCert")?,
            cert: read(&self.client_cert, "clientCert")?,
            key: read(&self.client_key, "clientKey")?,
        })
    }

    /// The material of the bytes `read`, checked.
    pub(super) fn checked(&self, read: ReadFields) -> Result<ClientTls, TlsError> {
        let ca_pem = match (&self.ca_cert, read.ca) {
            (Some(source), Some(bytes)) => {
                source.certificates_in("caCert", &bytes)?;
                Some(bytes)
            }
            _ => None,
        };
        let identity = match (&self.client_cert, &self.client_key) {
            (None, None) => None,
            (Some(cert), Some(key)) => {
                let (cert_pem, key_pem) =
                    (read.cert.unwrap_or_default(), read.key.unwrap_or_default());
                cert.certificates_in("clientCert", &cert_pem)?;
                key.private_key_in("clientKey", &key_pem)?;
                Some((cert_pem, key_pem))
            }
            (Some(_), None) => {
                return Err(TlsError::Config(
                    "metadata field `clientKey` is required with `clientCert`".into(),
                ))
            }
            (None, Some(_)) => {
                return Err(TlsError::Config(
                    "metadata field `clientCert` is required with `clientKey`".into(),
                ))
            }
        };
        Ok(ClientTls {
            ca_pem,
            identity,
            insecure_skip_verify: self.insecure_skip_verify,
        })
    }
}

/// The bytes of each field, as read once.
pub(super) struct ReadFields {
    pub(super) ca: Option<Vec<u8>>,
    pub(super) cert: Option<Vec<u8>>,
    pub(super) key: Option<Vec<u8>>,
}

impl ClientTls {
    /// A rustls client configuration (ring provider): the CA bundle (else
    /// the system's roots), the client identity if any.
    pub fn rustls_config(&self) -> Result<ClientConfig, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(|err| TlsError::Config(err.to_string()))?;
        let builder = if self.insecure_skip_verify {
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AnyServerCertificate(provider)))
        } else {
            builder.with_root_certificates(self.roots()?)
        };
        match &self.identity {
            None => Ok(builder.with_no_client_auth()),
            Some((cert, key)) => {
                let chain = certificates(cert).map_err(TlsError::Config)?;
                let key = private_key(key).map_err(TlsError::Config)?;
                builder.with_client_auth_cert(chain, key).map_err(|err| {
                    TlsError::Config(format!(
                        "metadata fields `clientCert` and `clientKey` do not make an identity: {err}"
                    ))
                })
            }
        }
    }

    /// Reads the system's roots off the async workers
    /// ([`system_roots::preload`]) when this material trusts them (TLS
    /// verified, no `caCert`): call it in the async start of the client,
    /// before building it. None found is an error naming `caCert`.
    pub async fn preload_system_roots(&self) -> Result<(), TlsError> {
        if self.ca_pem.is_none() && !self.insecure_skip_verify {
            let roots = system_roots::preload().await?;
            if roots.certificates.is_empty() {
                return Err(TlsError::Config(
                    "no system root certificates found: set `caCert`".into(),
                ));
            }
        }
        Ok(())
    }

    /// The roots a client checks the server against, as PEM: the CA
    /// bundle, else (TLS verified) the system's roots as last read
    /// ([`ClientTls::preload_system_roots`]) — empty when none were read,
    /// so the handshake fails rather than trust roots of the client's own
    /// (the Redis client's bundled ones) or read them on whatever thread
    /// builds a connection (tonic's native roots). `None` with
    /// `insecureSkipVerify`.
    pub fn roots_pem(&self) -> Option<Vec<u8>> {
        if self.ca_pem.is_some() || self.insecure_skip_verify {
            return self.ca_pem.clone();
        }
        let system = system_roots::cached();
        Some(system.map(|roots| roots.pem.clone()).unwrap_or_default())
    }

    fn roots(&self) -> Result<RootCertStore, TlsError> {
        let mut roots = RootCertStore::empty();
        match &self.ca_pem {
            Some(pem) => {
                for certificate in certificates(pem).map_err(TlsError::Config)? {
                    roots.add(certificate).map_err(|err| TlsError::Invalid {
                        field: "caCert",
                        path: None,
                        reason: err.to_string(),
                    })?;
                }
            }
            None => {
                let system = system_roots::now();
                let (added, _ignored) =
                    roots.add_parsable_certificates(system.certificates.iter().cloned());
                if added == 0 {
                    return Err(TlsError::Config(
                        "no system root certificates found: set `caCert`".into(),
                    ));
                }
            }
        }
        Ok(roots)
    }
}

/// The configuration of an HTTP client that may speak TLS: `tls`'s, or,
/// without TLS material, one trusting the system's roots (or
/// `SSL_CERT_FILE`), as [`ClientTls::rustls_config`] does without a CA:
/// the servers configured are `http://`, but one they announce (an Apollo
/// meta server's config services) may be `https://`, and is then checked
/// as the same URL given directly would be. No system roots: one trusting
/// nothing (an `https://` server is refused, the `http://` ones work).
pub fn http_config(tls: Option<&ClientTls>) -> Result<ClientConfig, TlsError> {
    match tls {
        Some(tls) => tls.rustls_config(),
        None => {
            let mut roots = RootCertStore::empty();
            let system = system_roots::now();
            let _ = roots.add_parsable_certificates(system.certificates.iter().cloned());
            ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .map(|b| b.with_root_certificates(roots).with_no_client_auth())
                .map_err(|err| TlsError::Config(err.to_string()))
        }
    }
}

/// Accepts any server certificate (`insecureSkipVerify`), still checking
/// the handshake's signatures.
#[derive(Debug)]
struct AnyServerCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyServerCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::pem::private_key;

    #[test]
    fn the_material_kept_is_the_bytes_checked_though_a_file_changes_after_the_read() {
        let ca = testkit::certs::TestCa::new("client-tls-one-read");
        let client = ca.client("client");
        let fields = ClientTlsFields {
            ca_cert: Some(PemSource::File(ca.ca_path.clone())),
            client_cert: Some(PemSource::File(client.cert_path.clone())),
            client_key: Some(PemSource::File(client.key_path.clone())),
            insecure_skip_verify: false,
        };
        let read = fields.read().expect("read");
        // Every file caught mid-rewrite after that read.
        for path in [&ca.ca_path, &client.cert_path, &client.key_path] {
            std::fs::write(path, "-----BEGIN CERTIFICATE-----\ngarbled").expect("garble");
        }
        let material = fields.checked(read).expect("the bytes read are good");
        assert_eq!(material.ca_pem.as_deref(), Some(ca.ca_pem.as_bytes()));
        assert_eq!(
            material.identity,
            Some((
                client.cert_pem.clone().into_bytes(),
                client.key_pem.clone().into_bytes()
            ))
        );
        material
            .rustls_config()
            .expect("a client from the bytes read");
        assert!(
            fields.load().is_err(),
            "the garbled files themselves are refused"
        );
    }

    /// Runs a TLS handshake in memory between `client` and a server with
    /// `server`'s certificate for `localhost`.
    fn handshake(
        client: ClientConfig,
        server: &testkit::certs::CertFiles,
    ) -> Result<(), rustls::Error> {
        let chain = certificates(server.cert_pem.as_bytes()).expect("chain");
        let key = private_key(server.key_pem.as_bytes()).expect("key");
        let server_config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .expect("server config");
        let name = ServerName::try_from("localhost").expect("name");
        let mut client = rustls::ClientConnection::new(Arc::new(client), name)?;
        let mut server = rustls::ServerConnection::new(Arc::new(server_config))?;
        fn pass(
            from: &mut impl std::ops::DerefMut<Target = rustls::ConnectionCommon<impl Sized>>,
            to: &mut impl std::ops::DerefMut<Target = rustls::ConnectionCommon<impl Sized>>,
        ) -> Result<(), rustls::Error> {
            let mut wire = Vec::new();
            while from.wants_write() {
                from.write_tls(&mut wire).expect("write");
            }
            let mut rest = wire.as_slice();
            while !rest.is_empty() {
                to.read_tls(&mut rest).expect("read");
                to.process_new_packets()?;
            }
            Ok(())
        }
        for _ in 0..10 {
            pass(&mut client, &mut server)?;
            pass(&mut server, &mut client)?;
            if !client.is_handshaking() && !server.is_handshaking() {
                return Ok(());
            }
        }
        panic!("the handshake did not finish");
    }

    /// Set in the child process the roots test runs itself in: the
    /// server certificate's file, its key beside it.
    const ROOTS_CHILD: &str = "REWIRE_TEST_HTTP_CONFIG_ROOTS_SERVER";

    #[test]
    fn a_client_without_material_trusts_the_system_roots() {
        const NAME: &str = "tls::client::tests::a_client_without_material_trusts_the_system_roots";
        if let Some(cert_path) = std::env::var_os(ROOTS_CHILD) {
            // The child: `SSL_CERT_FILE` (the system's roots, for
            // rustls-native-certs) is the test CA, set for it alone.
            let cert_path = std::path::PathBuf::from(cert_path);
            let key_path = cert_path.with_extension("key");
            let server = testkit::certs::CertFiles {
                cert_pem: std::fs::read_to_string(&cert_path).expect("cert"),
                key_pem: std::fs::read_to_string(&key_path).expect("key"),
                cert_path,
                key_path,
            };
            let config = http_config(None).expect("config");
            handshake(config, &server).expect("the CA in SSL_CERT_FILE is trusted");
            return;
        }
        let ca = testkit::certs::TestCa::new("http-config-roots");
        let server = ca.server("localhost");
        let cert_path = ca.dir().join("server.crt");
        std::fs::write(&cert_path, &server.cert_pem).expect("cert");
        std::fs::write(cert_path.with_extension("key"), &server.key_pem).expect("key");
        let child = std::process::Command::new(std::env::current_exe().expect("test binary"))
            .args(["--exact", NAME, "--nocapture", "--test-threads=1"])
            .env(ROOTS_CHILD, &cert_path)
            .env("SSL_CERT_FILE", &ca.ca_path)
            .env_remove("SSL_CERT_DIR")
            .output()
            .expect("run the child");
        let out = String::from_utf8_lossy(&child.stdout);
        let err = String::from_utf8_lossy(&child.stderr);
        assert!(child.status.success(), "{out}\n{err}");
        assert!(out.contains("1 passed"), "the child ran the test: {out}");
    }
}
