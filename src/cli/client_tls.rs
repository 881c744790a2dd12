//! The TLS flags of the commands that call a running sidecar (`apply`,
//! `status`): the CA that signs the sidecar's certificate, and a client
//! certificate for mutual TLS.

use std::path::PathBuf;

use clap::Args;
use rewire_components::tls::{ClientTlsFields, PemSource};

/// How to reach a sidecar over TLS (default: plain text).
#[derive(Debug, Clone, Default, Args)]
pub struct ClientTlsArgs {
    /// Call the sidecar over TLS, trusting this CA bundle (PEM file) for
    /// its certificate.
    #[arg(long)]
    tls_ca: Option<PathBuf>,
    /// A client certificate (PEM file) for mutual TLS; implies TLS.
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key of `--tls-cert` (PEM file).
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
}

impl ClientTlsArgs {
    /// `https` when a TLS flag is given, else `http`.
    pub fn scheme(&self) -> &'static str {
        if self.tls_ca.is_some() || self.tls_cert.is_some() {
            "https"
        } else {
            "http"
        }
    }

    fn fields(&self) -> ClientTlsFields {
        let source = |path: &Option<PathBuf>| path.clone().map(PemSource::File);
        ClientTlsFields {
            ca_cert: source(&self.tls_ca),
            client_cert: source(&self.tls_cert),
            client_key: source(&self.tls_key),
            insecure_skip_verify: false,
        }
    }

    /// The rustls configuration for an HTTPS client (ring provider).
    pub fn rustls(&self) -> Result<rustls::ClientConfig, String> {
        let flags = |e: rewire_components::tls::TlsError| {
            e.to_string()
                .replace("metadata field `caCert`", "--tls-ca")
                .replace("metadata field `clientCert`", "--tls-cert")
                .replace("metadata field `clientKey`", "--tls-key")
        };
        let material = self.fields().load().map_err(flags)?;
        material.rustls_config().map_err(flags)
    }

    /// The tonic TLS configuration for a gRPC client, if TLS is asked for.
    pub fn tonic(&self) -> Result<Option<tonic::transport::ClientTlsConfig>, String> {
        use tonic::transport::{Certificate, ClientTlsConfig, Identity};
        if self.scheme() == "http" {
            return Ok(None);
        }
        // Bounded, regular files only: a FIFO or a device is refused.
        let read = |path: &PathBuf, flag: &str| {
            PemSource::File(path.clone())
                .read("file")
                .map_err(|e| e.to_string().replace("metadata field `file`", flag))
        };
        // tonic bounds the TLS handshake only when told to: a peer that
        // accepts TCP and then says nothing (a stopped sidecar, a dead
        // port-forward) would hold the handshake, and `apply`, for ever.
        // Set here, it also bounds the handshake of a reconnection.
        let mut config = ClientTlsConfig::new().timeout(super::remote::CONNECT_TIMEOUT);
        config = match &self.tls_ca {
            Some(ca) => config.ca_certificate(Certificate::from_pem(read(ca, "--tls-ca")?)),
            // The system's roots (tonic's `tls-native-roots`).
            None => config.with_native_roots(),
        };
        if let (Some(cert), Some(key)) = (&self.tls_cert, &self.tls_key) {
            let identity = Identity::from_pem(read(cert, "--tls-cert")?, read(key, "--tls-key")?);
            config = config.identity(identity);
        }
        Ok(Some(config))
    }
}
