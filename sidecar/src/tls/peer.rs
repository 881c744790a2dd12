//! What a connection's handshake proved about the client, and the
//! Lifecycle API's check of it.
//!
//! The check's verdict is kept per connection (its chain) and verifier in
//! force for [`VERDICT_FOR`]: one connection's calls (up to 256 streams
//! at once, without end) cost one path search a second, not one each,
//! while an expired client certificate or a rotated Lifecycle CA still
//! applies within that second.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::ClientCertVerifier;
use tonic::service::Interceptor;
use tonic::transport::server::TcpConnectInfo;
use tonic::{Request, Status};

use super::live::LiveTls;
use super::offered_cert::within_offered_limits;
use crate::result_code::ResultCode;
use crate::ApiMetrics;

/// A gRPC connection's peer: its address, and the certificate chain it
/// presented over TLS (if any). Tonic puts it in each request's
/// extensions.
#[derive(Debug, Clone)]
pub struct PeerInfo {
    /// The TCP addresses.
    pub tcp: TcpConnectInfo,
    /// The client's certificate chain, end entity first.
    pub certificates: Option<Arc<Vec<CertificateDer<'static>>>>,
    /// The connection's requests in flight (each call counts itself).
    pub in_flight: crate::in_flight::InFlight,
}

/// How long a connection's verdict is reused before its chain is
/// verified again (so a client certificate's expiry applies).
const VERDICT_FOR: Duration = Duration::from_secs(1);

/// Most verdicts kept; beyond (after dropping those of closed connections
/// and stale ones), calls are verified without keeping the verdict.
const MAX_VERDICTS: usize = 4096;

/// Rejects a call whose connection did not present a certificate chaining
/// to the Lifecycle CA in force (`UNAUTHENTICATED`).
#[derive(Clone)]
pub struct RequireClientCert {
    tls: Option<Arc<LiveTls>>,
    /// Whether the serving options configure a Lifecycle CA: then no TLS
    /// (or TLS without a Lifecycle verifier) refuses every call, as the
    /// options also dropped the token fallback on the strength of the CA.
    ca_configured: bool,
    metrics: Arc<ApiMetrics>,
    /// Recent verdicts, shared by the interceptor's clones.
    verdicts: Arc<Verdicts>,
}

/// Recent verdicts, by the address of the connection's chain.
#[derive(Default)]
struct Verdicts(Mutex<HashMap<usize, Verdict>>);

/// One connection's verdict. The weak references keep both addresses
/// taken while the entry lives: a later chain or verifier can never be
/// mistaken for these.
struct Verdict {
    chain: Weak<Vec<CertificateDer<'static>>>,
    verifier: Weak<dyn ClientCertVerifier>,
    checked_at: Instant,
    verified: bool,
}

impl Verdicts {
    /// Whether `chain` verifies with `verifier`: the verdict kept for both
    /// if it is younger than [`VERDICT_FOR`], else `verify`'s (kept).
    fn verified(
        &self,
        chain: &Arc<Vec<CertificateDer<'static>>>,
        verifier: &Arc<dyn ClientCertVerifier>,
        verify: impl FnOnce() -> bool,
    ) -> bool {
        let key = Arc::as_ptr(chain) as usize;
        {
            let verdicts = self.0.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(kept) = verdicts.get(&key) {
                if std::ptr::addr_eq(kept.chain.as_ptr(), Arc::as_ptr(chain))
                    && std::ptr::addr_eq(kept.verifier.as_ptr(), Arc::as_ptr(verifier))
                    && kept.checked_at.elapsed() < VERDICT_FOR
                {
                    return kept.verified;
                }
            }
        }
        // Verified outside the lock: other connections' calls go on.
        let verified = verify();
        let mut verdicts = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if verdicts.len() >= MAX_VERDICTS && !verdicts.contains_key(&key) {
            verdicts.retain(|_, kept| {
                kept.chain.strong_count() > 0 && kept.checked_at.elapsed() < VERDICT_FOR
            });
        }
        if verdicts.len() < MAX_VERDICTS || verdicts.contains_key(&key) {
            verdicts.insert(
                key,
                Verdict {
                    chain: Arc::downgrade(chain),
                    verifier: Arc::downgrade(verifier),
                    checked_at: Instant::now(),
                    verified,
                },
            );
        }
        verified
    }
}

impl RequireClientCert {
    /// Checks against `tls`'s Lifecycle CA; `None` (or no CA): no check.
    /// Prefer [`RequireClientCert::for_state`], which also fails closed
    /// when the options configure a CA that `tls` does not carry.
    pub fn new(tls: Option<Arc<LiveTls>>, metrics: Arc<ApiMetrics>) -> Self {
        Self {
            tls,
            ca_configured: false,
            metrics,
            verdicts: Arc::default(),
        }
    }

    /// The check of `state`'s gRPC listener: against its Lifecycle CA in
    /// force; with a Lifecycle CA in `state.options.tls` but none in force
    /// (no TLS loaded, or loaded without the CA), every call is refused.
    pub fn for_state(state: &crate::ApiState) -> Self {
        Self {
            tls: state.tls.grpc.clone(),
            ca_configured: state.options.tls.lifecycle_client_ca.is_some(),
            metrics: state.metrics.clone(),
            verdicts: Arc::default(),
        }
    }

    fn verified(&self, request: &Request<()>) -> Result<(), &'static str> {
        let Some(tls) = self.tls.as_ref() else {
            return if self.ca_configured {
                Err("a Lifecycle client CA is configured but the gRPC listener has no TLS loaded: every Lifecycle call is refused")
            } else {
                Ok(())
            };
        };
        let Some(verifier) = tls.lifecycle_verifier() else {
            // A configured CA without a verifier must not open the API.
            return if tls.lifecycle_ca_configured() || self.ca_configured {
                Err("the Lifecycle API's client CA is not usable")
            } else {
                Ok(())
            };
        };
        let chain = request
            .extensions()
            .get::<PeerInfo>()
            .and_then(|p| p.certificates.clone())
            .ok_or("the Lifecycle API requires a client certificate")?;
        let (end_entity, intermediates) = chain
            .split_first()
            .ok_or("the Lifecycle API requires a client certificate")?;
        // Bounded here too: with mutual TLS the handshake's verifier takes
        // any chain reaching the app CA, however long.
        if !within_offered_limits(end_entity, intermediates) {
            return Err("the client certificate chain is longer than the Lifecycle API takes");
        }
        let verified = self.verdicts.verified(&chain, &verifier, || {
            verifier
                .verify_client_cert(end_entity, intermediates, UnixTime::now())
                .is_ok()
        });
        if verified {
            Ok(())
        } else {
            Err("the client certificate is not from the Lifecycle API's CA")
        }
    }
}

impl Interceptor for RequireClientCert {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        match self.verified(&request) {
            Ok(()) => Ok(request),
            Err(reason) => {
                self.metrics.observe_request(
                    "grpc",
                    "Unauthenticated",
                    None,
                    ResultCode::Grpc("UNAUTHENTICATED"),
                    Duration::ZERO,
                );
                Err(Status::unauthenticated(reason))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::ListenerTls;

    #[test]
    fn a_configured_lifecycle_ca_without_a_verifier_refuses() {
        let ca = testkit::certs::TestCa::new("peer-ca");
        let admins = testkit::certs::TestCa::new("peer-admin-ca");
        let server = ca.server("localhost");
        let settings = ListenerTls {
            cert: server.cert_path.clone(),
            key: server.key_path.clone(),
            client_ca: None,
        };
        let live = LiveTls::load("grpc", &settings, Some(&admins.ca_path)).expect("loads");
        live.drop_lifecycle_verifier();
        let check = RequireClientCert::new(Some(live), Arc::new(ApiMetrics::default()));
        assert!(check.verified(&Request::new(())).is_err());
    }

    #[tokio::test]
    async fn a_lifecycle_ca_in_the_options_without_tls_loaded_refuses() {
        let mut state = crate::ApiState::empty().await;
        let ca = testkit::certs::TestCa::new("peer-options-ca");
        let mut options = (*state.options).clone();
        options.tls.lifecycle_client_ca = Some(ca.ca_path.clone());
        state.options = Arc::new(options);
        let check = RequireClientCert::for_state(&state);
        let err = check.verified(&Request::new(())).expect_err("fails closed");
        assert!(err.contains("no TLS loaded"), "{err}");

        // TLS loaded, but without the CA the options configure.
        let server = ca.server("localhost");
        let settings = ListenerTls {
            cert: server.cert_path.clone(),
            key: server.key_path.clone(),
            client_ca: None,
        };
        state.tls.grpc = Some(LiveTls::load("grpc", &settings, None).expect("loads"));
        let check = RequireClientCert::for_state(&state);
        assert!(check.verified(&Request::new(())).is_err());

        // No CA configured anywhere: no certificate check.
        let mut options = (*state.options).clone();
        options.tls.lifecycle_client_ca = None;
        state.options = Arc::new(options);
        assert!(RequireClientCert::for_state(&state)
            .verified(&Request::new(()))
            .is_ok());
    }

    /// A connection's verdict is reused for its later calls (one path
    /// search, not one per call), not for another connection with the same
    /// chain, and not once another verifier is in force (a rotated CA).
    /// Before: every call searched a path.
    #[test]
    fn a_connections_verdict_is_reused_until_the_verifier_changes() {
        let ca = testkit::certs::TestCa::new("peer-verdict-ca");
        let admins = testkit::certs::TestCa::new("peer-verdict-admin-ca");
        let server = ca.server("localhost");
        let settings = ListenerTls {
            cert: server.cert_path.clone(),
            key: server.key_path.clone(),
            client_ca: None,
        };
        let live = LiveTls::load("grpc", &settings, Some(&admins.ca_path)).expect("loads");
        let verifier = live.lifecycle_verifier().expect("a verifier");
        let admin = admins.client("admin");
        let chain: Vec<CertificateDer<'static>> =
            rustls::pki_types::pem::PemObject::pem_slice_iter(admin.cert_pem.as_bytes())
                .collect::<Result<_, _>>()
                .expect("pem");
        let connection = Arc::new(chain.clone());
        let verdicts = Verdicts::default();
        let searches = std::cell::Cell::new(0);
        let search = |verdict: bool| {
            searches.set(searches.get() + 1);
            verdict
        };
        for _ in 0..100 {
            assert!(verdicts.verified(&connection, &verifier, || search(true)));
        }
        assert_eq!(searches.get(), 1, "one search for the connection's calls");
        let other_connection = Arc::new(chain);
        assert!(!verdicts.verified(&other_connection, &verifier, || search(false)));
        assert_eq!(searches.get(), 2, "another connection is searched");
        let rotated =
            super::super::material::ca_verifier(&admins.ca_path, admins.ca_pem.as_bytes())
                .expect("verifier");
        assert!(!verdicts.verified(&connection, &rotated, || search(false)));
        assert_eq!(searches.get(), 3, "another verifier is searched");
    }
}
