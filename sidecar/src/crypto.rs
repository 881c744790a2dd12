//! The process's rustls crypto provider: one place that TLS serving and
//! the trace exporter's client both rely on.

/// Installs rustls's ring provider as the process default if no provider
/// is installed yet (a choice made earlier stands). Called when the APIs
/// start: HTTP clients in the same process that build a rustls
/// configuration without naming a provider (reqwest) then find one.
pub fn install_ring_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
