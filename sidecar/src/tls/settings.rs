//! What the command line asks for: TLS per listener, and the Lifecycle
//! API's client CA.

use std::path::PathBuf;

/// TLS on one listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerTls {
    /// The server certificate chain (PEM file).
    pub cert: PathBuf,
    /// Its private key (PEM file).
    pub key: PathBuf,
    /// Mutual TLS: every client must present a certificate from this CA
    /// bundle (PEM file).
    pub client_ca: Option<PathBuf>,
}

/// TLS on the sidecar's listeners; all `None`: plain text everywhere.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsSettings {
    /// TLS on the gRPC listener.
    pub grpc: Option<ListenerTls>,
    /// TLS on the HTTP listener.
    pub http: Option<ListenerTls>,
    /// Lifecycle calls must come over a connection whose client
    /// certificate chains to this CA bundle (PEM file); needs TLS on gRPC.
    /// With `REWIRE_ADMIN_TOKEN` set, both are required.
    pub lifecycle_client_ca: Option<PathBuf>,
}
