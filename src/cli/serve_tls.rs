//! `rewire run`'s TLS flags: certificates for the listeners (both, or
//! each), mutual TLS, and the Lifecycle API's client CA. Files are
//! followed live: a rotated certificate serves the next handshake.

use std::path::PathBuf;

use clap::Args;
use rewire::sidecar::tls::{ListenerTls, TlsSettings};

/// TLS on the sidecar's listeners (default: plain text).
#[derive(Debug, Clone, Default, Args)]
pub struct ServeTlsArgs {
    /// Serve gRPC and HTTP over TLS with this certificate chain (PEM file,
    /// followed live).
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key of `--tls-cert` (PEM file, followed live).
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// TLS on the gRPC listener only, or a different certificate there.
    #[arg(long, requires = "grpc_tls_key")]
    grpc_tls_cert: Option<PathBuf>,
    /// The private key of `--grpc-tls-cert`.
    #[arg(long, requires = "grpc_tls_cert")]
    grpc_tls_key: Option<PathBuf>,
    /// TLS on the HTTP listener only, or a different certificate there.
    #[arg(long, requires = "http_tls_key")]
    http_tls_cert: Option<PathBuf>,
    /// The private key of `--http-tls-cert`.
    #[arg(long, requires = "http_tls_cert")]
    http_tls_key: Option<PathBuf>,
    /// Mutual TLS: every client of a TLS listener must present a
    /// certificate from this CA bundle (PEM file, followed live).
    #[arg(long)]
    tls_client_ca: Option<PathBuf>,
    /// Lifecycle calls must present a client certificate from this CA
    /// bundle (PEM file, followed live); app calls need none. Needs TLS on
    /// gRPC. With REWIRE_ADMIN_TOKEN set, the token is required too.
    #[arg(long)]
    lifecycle_client_ca: Option<PathBuf>,
}

impl ServeTlsArgs {
    /// The listeners' TLS settings; an error for a client CA without TLS.
    pub fn settings(&self) -> Result<TlsSettings, String> {
        let listener = |cert: &Option<PathBuf>, key: &Option<PathBuf>| {
            let pair = cert.clone().zip(key.clone());
            let (cert, key) = pair.or_else(|| self.tls_cert.clone().zip(self.tls_key.clone()))?;
            Some(ListenerTls {
                cert,
                key,
                client_ca: self.tls_client_ca.clone(),
            })
        };
        let settings = TlsSettings {
            grpc: listener(&self.grpc_tls_cert, &self.grpc_tls_key),
            http: listener(&self.http_tls_cert, &self.http_tls_key),
            lifecycle_client_ca: self.lifecycle_client_ca.clone(),
        };
        if self.tls_client_ca.is_some() && settings.grpc.is_none() && settings.http.is_none() {
            return Err(
                "--tls-client-ca needs TLS on a listener: give --tls-cert and --tls-key".into(),
            );
        }
        if self.lifecycle_client_ca.is_some() && settings.grpc.is_none() {
            return Err("--lifecycle-client-ca needs TLS on gRPC: give --tls-cert and --tls-key (or --grpc-tls-cert and --grpc-tls-key)".into());
        }
        Ok(settings)
    }
}
