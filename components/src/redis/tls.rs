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
///
/// Installs ring as the process's rustls provider first (unless one is
/// installed): redis-rs builds its TLS configuration at every connect
/// without naming a provider, and rustls panics on that when no default is
/// installed and another dependency of the program enables aws-lc-rs too
/// (a library host that never ran `rewire::main()`).
pub fn certificates(tls: &ClientTls) -> TlsCertificates {
    crate::tls::install_ring_provider();
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Set in the child process the test runs itself in.
    const CHILD: &str = "REWIRE_TEST_REDIS_TLS_PROVIDER_CHILD";

    /// The certificates handed to redis-rs come with a process rustls
    /// provider in place, in a process where nothing installed one (a
    /// library host): redis-rs needs it at every TLS connect. Run in a
    /// fresh process, as the provider is set once per process.
    #[test]
    fn handing_certificates_to_redis_installs_a_process_provider() {
        const NAME: &str =
            "redis::tls::tests::handing_certificates_to_redis_installs_a_process_provider";
        let provider = rustls::crypto::CryptoProvider::get_default;
        if std::env::var_os(CHILD).is_some() {
            assert!(provider().is_none(), "installed before the test");
            let material = ClientTls {
                ca_pem: Some(b"a CA".to_vec()),
                identity: None,
                insecure_skip_verify: false,
            };
            let _ = certificates(&material);
            assert!(provider().is_some(), "no process rustls provider");
            return;
        }
        let output = testkit::output(
            std::process::Command::new(std::env::current_exe().expect("test binary"))
                .args(["--exact", NAME, "--test-threads=1"])
                .env(CHILD, "1"),
        );
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success() && stdout.contains("1 passed"),
            "the child failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}
