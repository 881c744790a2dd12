//! [`OfferedCertificate`]: the gRPC listener's client verifier when only a
//! Lifecycle CA is configured (`--lifecycle-client-ca` without
//! `--tls-client-ca`).
//!
//! App calls need no certificate, and a certificate from another CA (a
//! mesh client that always sends its own) must not abort the handshake:
//! the chain is taken as offered, and only the Lifecycle API checks it
//! against its CA, per call (`RequireClientCert`). The handshake still
//! proves that the client holds the certificate's key: its signature is
//! verified with the ring provider's algorithms.
//!
//! What the Lifecycle API checks is bounded ([`MAX_OFFERED_INTERMEDIATES`],
//! [`MAX_OFFERED_CHAIN_BYTES`]): it builds a path through the chain, and a
//! client offering many self-minted intermediates with one subject would
//! make each path search run to webpki's budget; a Lifecycle client needs
//! at most a few intermediates. The handshake takes more
//! ([`HANDSHAKE_MAX_INTERMEDIATES`], [`HANDSHAKE_MAX_CHAIN_BYTES`]): it
//! builds no path, and an app client whose mesh chain is longer, or whose
//! post-quantum certificates are larger, needs no certificate at all; the
//! bound only caps what a connection holds.

use std::sync::Arc;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{CertificateError, DigitallySignedStruct, DistinguishedName, Error, SignatureScheme};

/// Most intermediates a client chain may carry for the Lifecycle API's
/// per-call check (refused beyond).
pub(super) const MAX_OFFERED_INTERMEDIATES: usize = 4;

/// Most bytes (DER, end entity and intermediates together) a client chain
/// may have for the Lifecycle API's per-call check (refused beyond).
pub(super) const MAX_OFFERED_CHAIN_BYTES: usize = 16 * 1024;

/// Most intermediates a chain may carry at the handshake.
pub(super) const HANDSHAKE_MAX_INTERMEDIATES: usize = 16;

/// Most bytes a chain may have at the handshake.
pub(super) const HANDSHAKE_MAX_CHAIN_BYTES: usize = 64 * 1024;

/// Whether a client chain of `end_entity` and `intermediates` is within
/// [`MAX_OFFERED_INTERMEDIATES`] and [`MAX_OFFERED_CHAIN_BYTES`] (what
/// the Lifecycle API checks).
pub(super) fn within_offered_limits(
    end_entity: &CertificateDer<'_>,
    intermediates: &[CertificateDer<'_>],
) -> bool {
    within(
        end_entity,
        intermediates,
        MAX_OFFERED_INTERMEDIATES,
        MAX_OFFERED_CHAIN_BYTES,
    )
}

/// Whether a chain has at most `most` intermediates and `bytes` bytes.
fn within(
    end_entity: &CertificateDer<'_>,
    intermediates: &[CertificateDer<'_>],
    most: usize,
    bytes: usize,
) -> bool {
    let total = intermediates
        .iter()
        .fold(end_entity.len(), |sum, c| sum.saturating_add(c.len()));
    intermediates.len() <= most && total <= bytes
}

/// Asks for a client certificate without requiring one, and accepts any
/// chain offered, within the limits, whose key signs the handshake.
#[derive(Debug)]
pub(super) struct OfferedCertificate {
    /// The Lifecycle CA's subjects, hinted to clients so that one holding
    /// several certificates picks the Lifecycle one.
    hints: Vec<DistinguishedName>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl OfferedCertificate {
    /// Hints `hints` and verifies handshake signatures with `provider`'s
    /// algorithms.
    pub(super) fn new(hints: Vec<DistinguishedName>, provider: &Arc<CryptoProvider>) -> Self {
        Self {
            hints,
            algorithms: provider.signature_verification_algorithms,
        }
    }
}

impl ClientCertVerifier for OfferedCertificate {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &self.hints
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, Error> {
        // Taken as offered, if small enough: the Lifecycle API verifies the
        // chain per call. The certificate is parsed when the handshake
        // signature is checked.
        if !within(
            end_entity,
            intermediates,
            HANDSHAKE_MAX_INTERMEDIATES,
            HANDSHAKE_MAX_CHAIN_BYTES,
        ) {
            return Err(Error::InvalidCertificate(
                CertificateError::ApplicationVerificationFailure,
            ));
        }
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use rustls::client::ResolvesClientCert;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::PrivateKeyDer;
    use rustls::sign::CertifiedKey;

    use super::super::live::LiveTls;
    use super::super::ListenerTls;
    use super::*;

    /// Always presents one certificate and key, matching or not.
    #[derive(Debug)]
    struct Presents(Arc<CertifiedKey>);

    impl ResolvesClientCert for Presents {
        fn resolve(&self, _: &[&[u8]], _: &[SignatureScheme]) -> Option<Arc<CertifiedKey>> {
            Some(Arc::clone(&self.0))
        }

        fn has_certs(&self) -> bool {
            true
        }
    }

    fn chain(pem: &str) -> Vec<CertificateDer<'static>> {
        CertificateDer::pem_slice_iter(pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .expect("pem")
    }

    /// A handshake with `live`'s listener by a client trusting `ca_pem`
    /// presenting `cert_pem` signed for with `key_pem`: the chain the
    /// listener saw, or why the handshake failed.
    async fn handshake(
        live: &LiveTls,
        ca_pem: &str,
        cert_pem: &str,
        key_pem: &str,
    ) -> Result<Vec<CertificateDer<'static>>, String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).expect("key");
        let signing = provider.key_provider.load_private_key(key).expect("key");
        let certified = Arc::new(CertifiedKey::new(chain(cert_pem), signing));
        let mut roots = rustls::RootCertStore::empty();
        for certificate in chain(ca_pem) {
            roots.add(certificate).expect("root");
        }
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_root_certificates(roots)
            .with_client_cert_resolver(Arc::new(Presents(certified)));
        let (near, far) = tokio::io::duplex(64 * 1024);
        let acceptor = live.acceptor();
        let served = tokio::spawn(async move {
            let stream = acceptor.accept(far).await.map_err(|e| e.to_string())?;
            let seen: Vec<CertificateDer<'static>> = stream
                .get_ref()
                .1
                .peer_certificates()
                .unwrap_or_default()
                .iter()
                .map(|c| c.clone().into_owned())
                .collect();
            Ok::<_, String>(seen)
        });
        let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
        let connector = tokio_rustls::TlsConnector::from(Arc::new(client));
        let connected =
            tokio::time::timeout(Duration::from_secs(10), connector.connect(name, near))
                .await
                .expect("handshake within 10 s")
                .map_err(|e| e.to_string());
        // Kept open until the listener's side is done: it still writes
        // (session tickets) after the client's side completes.
        let seen = tokio::time::timeout(Duration::from_secs(10), served)
            .await
            .expect("served within 10 s")
            .expect("joined");
        connected?;
        seen
    }

    /// With only a Lifecycle CA, a client certificate from another CA (a
    /// mesh client that always sends one) passes the handshake, for app
    /// calls; the Lifecycle verifier still refuses it and takes the
    /// Lifecycle CA's. Before: the handshake failed (UnknownIssuer).
    #[tokio::test]
    async fn with_only_a_lifecycle_ca_any_certificate_passes_the_handshake() {
        crate::crypto::install_ring_provider();
        let ca = testkit::certs::TestCa::new("offered-server-ca");
        let admins = testkit::certs::TestCa::new("offered-admin-ca");
        let intruders = testkit::certs::TestCa::new("offered-intruder-ca");
        let server = ca.server("localhost");
        let settings = ListenerTls {
            cert: server.cert_path.clone(),
            key: server.key_path.clone(),
            client_ca: None,
        };
        let live = LiveTls::load("grpc", &settings, Some(&admins.ca_path)).expect("loads");
        let verifier = live.lifecycle_verifier().expect("a Lifecycle verifier");
        for (client, from_lifecycle_ca) in [
            (intruders.client("intruder"), false),
            (admins.client("admin"), true),
        ] {
            let seen = handshake(&live, &ca.ca_pem, &client.cert_pem, &client.key_pem)
                .await
                .unwrap_or_else(|e| panic!("handshake refused: {e}"));
            assert_eq!(seen, chain(&client.cert_pem));
            let checked = verifier.verify_client_cert(&seen[0], &seen[1..], UnixTime::now());
            assert_eq!(checked.is_ok(), from_lifecycle_ca, "{checked:?}");
        }
    }

    /// A certificate presented without its key (the Lifecycle CA's, signed
    /// for with another key) fails the handshake: possession is proven.
    #[tokio::test]
    async fn a_certificate_without_its_key_fails_the_handshake() {
        crate::crypto::install_ring_provider();
        let ca = testkit::certs::TestCa::new("offered-key-server-ca");
        let admins = testkit::certs::TestCa::new("offered-key-admin-ca");
        let server = ca.server("localhost");
        let settings = ListenerTls {
            cert: server.cert_path.clone(),
            key: server.key_path.clone(),
            client_ca: None,
        };
        let live = LiveTls::load("grpc", &settings, Some(&admins.ca_path)).expect("loads");
        let (admin, thief) = (admins.client("admin"), admins.client("thief"));
        let refused = handshake(&live, &ca.ca_pem, &admin.cert_pem, &thief.key_pem).await;
        assert!(refused.is_err(), "{refused:?}");
    }

    /// An end entity and `count` self-issued intermediates sharing one
    /// subject, each with a key of its own, none from a configured CA
    /// (what makes a path search run to its budget): the chain's PEM, end
    /// entity first, and the end entity's key.
    fn same_subject_intermediates(count: usize) -> (String, String) {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
        let mut issuers = Vec::new();
        let mut pem = String::new();
        for _ in 0..count {
            let key = KeyPair::generate().expect("key");
            let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
            params
                .distinguished_name
                .push(DnType::CommonName, "offered-junk-intermediate");
            params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            let certificate = params.self_signed(&key).expect("intermediate");
            pem.push_str(&certificate.pem());
            issuers.push(Issuer::new(params, key));
        }
        let key = KeyPair::generate().expect("key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params
            .distinguished_name
            .push(DnType::CommonName, "offered-junk-client");
        let leaf = params.signed_by(&key, &issuers[0]).expect("leaf");
        (format!("{}{pem}", leaf.pem()), key.serialize_pem())
    }

    /// A chain of an end entity and 30 self-issued intermediates with one
    /// subject is refused by the verifier and at the handshake; one within
    /// the limits still passes. Before: taken, and the Lifecycle API ran a
    /// path search through it on every call.
    #[tokio::test]
    async fn a_chain_beyond_the_handshakes_limits_is_refused_and_an_app_clients_longer_one_passes()
    {
        crate::crypto::install_ring_provider();
        let ca = testkit::certs::TestCa::new("offered-limits-server-ca");
        let admins = testkit::certs::TestCa::new("offered-limits-admin-ca");
        let server = ca.server("localhost");
        let settings = ListenerTls {
            cert: server.cert_path.clone(),
            key: server.key_path.clone(),
            client_ca: None,
        };
        let live = LiveTls::load("grpc", &settings, Some(&admins.ca_path)).expect("loads");
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let offered = OfferedCertificate::new(Vec::new(), &provider);
        let (long, key) = same_subject_intermediates(30);
        let long_chain = chain(&long);
        assert!(offered
            .verify_client_cert(&long_chain[0], &long_chain[1..], UnixTime::now())
            .is_err());
        let refused = handshake(&live, &ca.ca_pem, &long, &key).await;
        assert!(refused.is_err(), "{refused:?}");
        // Too many bytes, in few certificates.
        let big = CertificateDer::from(vec![0u8; HANDSHAKE_MAX_CHAIN_BYTES]);
        assert!(offered
            .verify_client_cert(&long_chain[0], std::slice::from_ref(&big), UnixTime::now())
            .is_err());
        // An app client's longer chain (more than the Lifecycle API takes)
        // passes the handshake: it needs no certificate.
        let (longer, key) = same_subject_intermediates(MAX_OFFERED_INTERMEDIATES + 2);
        let longer_chain = chain(&longer);
        assert!(!within_offered_limits(&longer_chain[0], &longer_chain[1..]));
        let seen = handshake(&live, &ca.ca_pem, &longer, &key).await;
        assert_eq!(seen, Ok(longer_chain));
    }
}
