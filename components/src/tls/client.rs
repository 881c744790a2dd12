//! [`ClientTlsFields`] → [`ClientTls`]: a component's TLS fields, read and
//! checked, and the client configurations built from them.

use std::path::Path;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};

use super::pem::{certificates, private_key, PemSource, TlsError};

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
    /// client certificate and key come together and parse.
    pub fn load(&self) -> Result<ClientTls, TlsError> {
        let ca_pem = match &self.ca_cert {
            Some(source) => {
                source.certificates("caCert")?;
                Some(source.read("caCert")?)
            }
            None => None,
        };
        let identity = match (&self.client_cert, &self.client_key) {
            (None, None) => None,
            (Some(cert), Some(key)) => {
                cert.certificates("clientCert")?;
                key.private_key("clientKey")?;
                Some((cert.read("clientCert")?, key.read("clientKey")?))
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
                let (added, _ignored) =
                    roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
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
/// without TLS material, one trusting nothing (every server is `http://`;
/// the HTTP library still wants a TLS configuration).
pub fn http_config(tls: Option<&ClientTls>) -> Result<ClientConfig, TlsError> {
    match tls {
        Some(tls) => tls.rustls_config(),
        None => {
            ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .map(|b| {
                    b.with_root_certificates(RootCertStore::empty())
                        .with_no_client_auth()
                })
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
