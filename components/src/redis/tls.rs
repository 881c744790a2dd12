//! TLS for the `redis` components: the addresses and certificates the
//! redis client wants from a [`ClientTls`] (read from the metadata fields
//! by [`RedisMetadata::client_tls`](super::metadata::RedisMetadata::client_tls)).

use redis::{ConnectionAddr, TlsCertificates, TlsMode};

use crate::tls::ClientTls;

/// The address of `host:port` for `tls` (TLS or plain).
pub fn address(host: &str, port: u16, tls: Option<&ClientTls>) -> ConnectionAddr {
    match tls {
        None => ConnectionAddr::Tcp(host.to_string(), port),
        Some(tls) => ConnectionAddr::TcpTls {
            host: host.to_string(),
            port,
            insecure: tls.insecure_skip_verify,
            tls_params: None,
        },
    }
}

/// The redis client's TLS mode for `tls`.
pub fn mode(tls: &ClientTls) -> TlsMode {
    if tls.insecure_skip_verify {
        TlsMode::Insecure
    } else {
        TlsMode::Secure
    }
}

/// The certificates as the redis client takes them: always the roots to
/// check the server against ([`ClientTls::roots_pem`]; without `caCert`,
/// the system's roots as the connection's opening read them). The redis
/// client is built with its `webpki-roots` feature so that it never reads
/// the system's roots itself: without it, it read them at every TLS
/// connection, on a runtime worker, even with `caCert` (and failed when
/// `SSL_CERT_FILE` named a missing file); its bundled roots are never
/// used, as a root store is always given.
pub fn certificates(tls: &ClientTls) -> TlsCertificates {
    TlsCertificates {
        client_tls: tls
            .identity
            .as_ref()
            .map(|(cert, key)| redis::ClientTlsConfig {
                client_cert: cert.clone(),
                client_key: key.clone(),
            }),
        root_cert: tls.roots_pem(),
    }
}
