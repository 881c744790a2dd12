//! HTTP clients that only ever speak plain `http://` (the app channel,
//! `rewire status` without TLS flags, an OTLP/HTTP exporter to an
//! `http://` collector) read no system certificate.
//!
//! reqwest (built with `rustls-no-provider`) creates its platform
//! verifier at `ClientBuilder::build` unless it is given a TLS
//! configuration: on Linux that reads the system's roots
//! (`SSL_CERT_FILE`, `SSL_CERT_DIR`, the bundle) on the calling thread,
//! with no time limit (a FIFO, a hung mount), and fails the build when
//! none are found (an image without a CA bundle: `builder error`). A
//! client built from [`client_builder`] carries its own rustls
//! configuration (ring provider, an empty root store) instead: building
//! it reads nothing and needs no process-wide provider, and an
//! `https://` URL given to it by mistake is refused at the handshake.

use std::sync::Arc;

/// A reqwest client builder for plain HTTP only: TLS trusts no root, so
/// no system certificate is read when it is built. Chain the client's
/// own settings (timeouts, redirects, proxies) onto it.
pub fn client_builder() -> reqwest::ClientBuilder {
    reqwest::Client::builder().tls_backend_preconfigured(no_roots())
}

/// A rustls client configuration (ring) that trusts no certificate.
fn no_roots() -> rustls::ClientConfig {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("ring supports rustls's default TLS versions")
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Set in the child process the test below runs itself in.
    const NO_ROOTS_CHILD: &str = "REWIRE_TEST_PLAIN_HTTP_NO_ROOTS_CHILD";

    /// Built and used where no system certificate can be found
    /// (`SSL_CERT_FILE` and `SSL_CERT_DIR` naming nothing: an image
    /// without a CA bundle) and no rustls provider was installed: a plain
    /// HTTP request goes through. Before, `build` failed with
    /// `builder error` (reqwest's platform verifier found no root), so
    /// the app was never called. Run in a fresh process: the variables
    /// are the process's.
    #[test]
    fn a_plain_http_client_is_built_and_used_without_system_certificates() {
        const NAME: &str =
            "plain_http::tests::a_plain_http_client_is_built_and_used_without_system_certificates";
        if std::env::var_os(NO_ROOTS_CHILD).is_some() {
            assert!(rustls::crypto::CryptoProvider::get_default().is_none());
            let client = client_builder().no_proxy().build().expect("built");
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            let body = runtime.block_on(async {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                let addr = listener.local_addr().unwrap();
                tokio::spawn(async move {
                    let (mut tcp, _) = listener.accept().await.unwrap();
                    let mut head = [0u8; 1024];
                    let _ = tcp.read(&mut head).await;
                    let answer =
                        "HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok";
                    tcp.write_all(answer.as_bytes()).await.unwrap();
                });
                let response = client.get(format!("http://{addr}/")).send().await;
                response.expect("answered").text().await.expect("body")
            });
            assert_eq!(body, "ok");
            return;
        }
        let output = testkit::output(
            std::process::Command::new(std::env::current_exe().expect("test binary"))
                .args(["--exact", NAME, "--test-threads=1"])
                .env(NO_ROOTS_CHILD, "1")
                .env("SSL_CERT_FILE", "/nonexistent/ca.pem")
                .env("SSL_CERT_DIR", "/nonexistent"),
        );
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success() && stdout.contains("1 passed"),
            "the child failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}
