//! What a connection's handshake proved about the client, and the
//! Lifecycle API's check of it.

use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::{CertificateDer, UnixTime};
use tonic::service::Interceptor;
use tonic::transport::server::TcpConnectInfo;
use tonic::{Request, Status};

use super::live::LiveTls;
use crate::metrics::ResultCode;
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
        verifier
            .verify_client_cert(end_entity, intermediates, UnixTime::now())
            .map(drop)
            .map_err(|_| "the client certificate is not from the Lifecycle API's CA")
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
}
