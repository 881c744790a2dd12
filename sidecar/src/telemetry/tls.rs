//! TLS of the span exporter, as the OTLP exporter specification names it:
//! `OTEL_EXPORTER_OTLP_CERTIFICATE` (the CA that signs the collector's
//! certificate; without it, the system's roots, read with the files by
//! [`super::tls_reads`], bounded in time, and handed to the clients:
//! neither reqwest's platform verifier nor tonic's native roots, which
//! read them where the client is built, without a bound), and
//! `OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE` / `…_CLIENT_KEY` (mutual TLS),
//! each with its `OTEL_EXPORTER_OTLP_TRACES_*` form winning. The files are
//! read at start, after every reload and every few seconds while they are
//! configured ([`super::follow`]): a changed [`TlsFingerprint`] rebuilds
//! the exporter (a rotated certificate, a CA mounted late).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rewire_runtime::system_roots::SystemRoots;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// A PEM file is refused past this size (a CA bundle is tens of KiB).
const MAX_PEM_BYTES: usize = 1 << 20;

/// The files the `OTEL_*` variables name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExportTlsFiles {
    /// The CA bundle trusted for the collector; `None`: the system's roots.
    pub ca: Option<PathBuf>,
    /// The client's certificate chain, for mutual TLS.
    pub client_cert: Option<PathBuf>,
    /// The client certificate's private key.
    pub client_key: Option<PathBuf>,
}

/// The variable that names each file (the traces form is read first).
const CA: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
    "OTEL_EXPORTER_OTLP_CERTIFICATE",
];
const CLIENT_CERT: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE",
    "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
];
const CLIENT_KEY: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY",
    "OTEL_EXPORTER_OTLP_CLIENT_KEY",
];

impl ExportTlsFiles {
    /// The files `var` (non-empty variables only) names.
    pub(super) fn from_env(var: &dyn Fn(&str) -> Option<String>) -> Self {
        let path = |names: [&str; 2]| {
            names
                .iter()
                .find_map(|name| var(name))
                .map(|v| PathBuf::from(v.trim()))
        };
        Self {
            ca: path(CA),
            client_cert: path(CLIENT_CERT),
            client_key: path(CLIENT_KEY),
        }
    }

    /// Reads the files as they are now, unchecked (see
    /// [`TlsContents::check`]).
    pub(super) fn read(&self) -> Result<TlsContents, String> {
        let read = |path: &Option<PathBuf>, variable: &str| {
            path.as_deref().map(|p| read_pem(p, variable)).transpose()
        };
        Ok(TlsContents {
            files: self.clone(),
            ca: read(&self.ca, CA[1])?,
            client_cert: read(&self.client_cert, CLIENT_CERT[1])?,
            client_key: read(&self.client_key, CLIENT_KEY[1])?,
            system_roots: None,
        })
    }

    /// Reads and checks the files (see [`TlsContents::check`]).
    #[cfg(test)]
    pub(super) fn load(&self) -> Result<ExportTls, String> {
        self.read()?.check()
    }
}

/// The bytes of the files, as read once: the exporter is built from the
/// very bytes fingerprinted, so a file caught mid-rewrite is retried when
/// it changes again rather than taken as built from.
pub(super) struct TlsContents {
    /// Where they were read from (named by a refusal).
    files: ExportTlsFiles,
    ca: Option<Vec<u8>>,
    client_cert: Option<Vec<u8>>,
    client_key: Option<Vec<u8>>,
    /// The system's roots, read when no CA is named (`None`: not read),
    /// or why they could not be.
    system_roots: Option<Result<Arc<SystemRoots>, String>>,
}

/// SHA-256 over the files' contents (each length-prefixed, absent ones
/// marked): equal exactly when no file changed. Holds no key material.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct TlsFingerprint([u8; 32]);

impl TlsContents {
    /// Whether the system's roots are wanted with these files: no CA is
    /// named.
    pub(super) fn wants_system_roots(&self) -> bool {
        self.ca.is_none()
    }

    /// Whether the system's roots were wanted with these files and could
    /// not be read (the read timed out or failed).
    pub(super) fn system_roots_failed(&self) -> bool {
        matches!(self.system_roots, Some(Err(_)))
    }

    /// Whether the system's roots were read (or tried) with these files.
    #[cfg(test)]
    pub(super) fn system_roots_read(&self) -> bool {
        self.system_roots.is_some()
    }

    /// These contents with the system's roots as read (or why not).
    pub(super) fn with_system_roots(mut self, roots: Result<Arc<SystemRoots>, String>) -> Self {
        self.system_roots = Some(roots);
        self
    }

    /// What tells these contents from any other (the system's roots
    /// included: roots read after a failed read rebuild the exporter).
    pub(super) fn fingerprint(&self) -> TlsFingerprint {
        let mut digest = ring::digest::Context::new(&ring::digest::SHA256);
        let roots = match &self.system_roots {
            Some(Ok(roots)) => Some(&roots.pem),
            _ => None,
        };
        for file in [&self.ca, &self.client_cert, &self.client_key] {
            match file {
                Some(bytes) => {
                    digest.update(&[1]);
                    digest.update(&(bytes.len() as u64).to_be_bytes());
                    digest.update(bytes);
                }
                None => digest.update(&[0]),
            }
        }
        match (&self.system_roots, roots) {
            (_, Some(pem)) => {
                digest.update(&[2]);
                digest.update(&(pem.len() as u64).to_be_bytes());
                digest.update(pem);
            }
            (Some(Err(_)), None) => digest.update(&[3]),
            _ => {}
        }
        let mut out = [0; 32];
        out.copy_from_slice(digest.finish().as_ref());
        TlsFingerprint(out)
    }

    /// Checks the contents: each parses as PEM of its kind, and a client
    /// certificate comes with its key. A refusal names the variable and
    /// the file, never a key's text.
    pub(super) fn check(self) -> Result<ExportTls, String> {
        let named = |variable: &str, path: &Option<PathBuf>| match path {
            Some(path) => format!("{variable} ({})", shown_path(path)),
            None => variable.to_string(),
        };
        let ca = match self.ca {
            Some(pem) => {
                let file = named(CA[1], &self.files.ca);
                let certificates = CertificateDer::pem_slice_iter(&pem)
                    .collect::<Result<Vec<_>, _>>()
                    // Fixed words: the library's message can quote the line,
                    // which in a combined bundle may be key material.
                    .map_err(|e| format!("{file}: {}", crate::pem_reason::pem_error_reason(&e)))?;
                if certificates.is_empty() {
                    return Err(format!("{file}: the file holds no certificate"));
                }
                Some(pem)
            }
            None => None,
        };
        let identity = match (self.client_cert, self.client_key) {
            (None, None) => None,
            (Some(cert), Some(key)) => {
                let chain_found = CertificateDer::pem_slice_iter(&cert).any(|c| c.is_ok());
                if !chain_found {
                    let file = named(CLIENT_CERT[1], &self.files.client_cert);
                    return Err(format!("{file}: the file holds no certificate"));
                }
                // Never the key's text in the message: only whether it parsed.
                PrivateKeyDer::from_pem_slice(&key).map_err(|_| {
                    let file = named(CLIENT_KEY[1], &self.files.client_key);
                    format!("{file}: the file holds no private key")
                })?;
                Some((cert, key))
            }
            (Some(_), None) => {
                return Err(format!(
                    "{} is set without {}",
                    CLIENT_CERT[1], CLIENT_KEY[1]
                ))
            }
            (None, Some(_)) => {
                return Err(format!(
                    "{} is set without {}",
                    CLIENT_KEY[1], CLIENT_CERT[1]
                ))
            }
        };
        Ok(ExportTls {
            ca,
            identity,
            system_roots: self.system_roots,
        })
    }
}

fn read_pem(path: &Path, variable: &str) -> Result<Vec<u8>, String> {
    if holds_no_path(path) {
        return Err(format!(
            "{variable}: must name a PEM file, not hold the PEM itself (its value is not shown)"
        ));
    }
    rewire_runtime::read_bounded(path, MAX_PEM_BYTES).map_err(|e| {
        if looks_like_path(path) {
            format!("{variable}: {e}")
        } else {
            // The library's message quotes the path: the value itself.
            format!("{variable}: the file it names cannot be read (its value is not shown)")
        }
    })
}

/// `path` as an error or a log shows it: itself only when it looks like
/// a path ([`looks_like_path`]), else words saying it is not shown (a
/// key given on one line, base64 without PEM markers, must never be
/// printed).
pub(super) fn shown_path(path: &Path) -> String {
    match looks_like_path(path) {
        true => path.display().to_string(),
        false => "its value is not shown".to_string(),
    }
}

/// Whether `path` looks like a file path: it starts with `/`, `./`,
/// `../` or `~`, is at most 255 bytes and holds no blank.
fn looks_like_path(path: &Path) -> bool {
    let text = path.as_os_str().as_encoded_bytes();
    let rooted = [&b"/"[..], b"./", b"../", b"~"]
        .iter()
        .any(|start| text.starts_with(start));
    rooted && text.len() <= 255 && !text.iter().any(u8::is_ascii_whitespace)
}

/// Whether a variable meant to name a file holds something else: the PEM
/// itself (a key given with `valueFrom.secretKeyRef`), which must never
/// be quoted in an error or a log.
pub(super) fn holds_no_path(path: &Path) -> bool {
    let text = path.as_os_str().as_encoded_bytes();
    text.len() > 4096 || text.contains(&b'\n') || text.windows(10).any(|w| w == b"-----BEGIN")
}

/// The TLS material read and checked.
pub(super) struct ExportTls {
    ca: Option<Vec<u8>>,
    identity: Option<(Vec<u8>, Vec<u8>)>,
    /// Without a CA: the system's roots as read, or why not.
    system_roots: Option<Result<Arc<SystemRoots>, String>>,
}

impl ExportTls {
    /// The OTLP/HTTP client for `endpoint`, each request cut after
    /// `timeout`. An `http://` collector gets a plain-HTTP client
    /// ([`crate::plain_http`]): no system certificate is read to build it
    /// (none found, or a bundle on a hung mount, would fail or hold the
    /// build); the TLS files then go unused.
    pub(super) fn http_client(
        &self,
        endpoint: &str,
        timeout: Duration,
    ) -> Result<reqwest::Client, String> {
        let builder = if is_https(endpoint) {
            self.reqwest(reqwest::Client::builder())?
        } else {
            crate::plain_http::client_builder()
        };
        // No redirect is followed: the headers (API keys in
        // `OTEL_EXPORTER_OTLP_HEADERS`) must not go to another host, and
        // an `http://` client trusts no root to follow one to `https://`.
        builder
            .redirect(reqwest::redirect::Policy::none())
            .timeout(timeout)
            .build()
            .map_err(|e| format!("cannot build the HTTP client: {e}"))
    }

    /// `builder` trusting only the CA (when one is given), else only the
    /// system's roots as read (none: an error saying to give the CA), and
    /// presenting the client identity (when one is given).
    fn reqwest(&self, builder: reqwest::ClientBuilder) -> Result<reqwest::ClientBuilder, String> {
        Ok(builder.tls_backend_preconfigured(self.rustls_config()?))
    }

    /// The rustls configuration (ring) of the OTLP/HTTP client: a bundle
    /// entry that does not parse as a certificate is skipped, as tonic,
    /// the components and the CLI skip it (reqwest's own `tls_certs_only`
    /// failed the whole build on one); refused only when none is left.
    fn rustls_config(&self) -> Result<rustls::ClientConfig, String> {
        let mut roots = rustls::RootCertStore::empty();
        let (added, _skipped) = match &self.ca {
            Some(ca) => roots.add_parsable_certificates(
                CertificateDer::pem_slice_iter(ca).filter_map(Result::ok),
            ),
            None => {
                roots.add_parsable_certificates(self.system_roots()?.certificates.iter().cloned())
            }
        };
        if added == 0 {
            // Fixed words, as for every PEM error: never the file's text.
            return Err(match &self.ca {
                Some(_) => format!("{}: no certificate in it can be loaded", CA[1]),
                None => format!("no system CA certificate can be loaded; give {}", CA[1]),
            });
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("cannot configure TLS for the OTLP collector: {e}"))?
            .with_root_certificates(roots);
        let mut config = match &self.identity {
            Some((cert, key)) => {
                let not_identity = || {
                    format!(
                        "{} and {} do not make a client identity",
                        CLIENT_CERT[1], CLIENT_KEY[1]
                    )
                };
                let chain = CertificateDer::pem_slice_iter(cert)
                    .filter_map(Result::ok)
                    .collect::<Vec<_>>();
                // Never the key's text in the message.
                let key = PrivateKeyDer::from_pem_slice(key).map_err(|_| not_identity())?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|_| not_identity())?
            }
            None => builder.with_no_client_auth(),
        };
        // reqwest offers HTTP/1.1 (it is built without HTTP/2 here).
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(config)
    }

    /// tonic's client configuration: the CA, else the system's roots; the
    /// client identity if any; the handshake cut after `handshake`. tonic
    /// bounds a handshake only when told to, and while one is pending its
    /// channel never dials again: a collector that accepts TCP and then
    /// says nothing would otherwise fail every export for good.
    /// The system's roots come as read with the files: none read, it
    /// trusts nothing (the exporter is refused before, by
    /// [`ExportTls::missing_roots`]).
    pub(super) fn tonic(&self, handshake: Duration) -> tonic::transport::ClientTlsConfig {
        use tonic::transport::{Certificate, ClientTlsConfig, Identity};
        let config = ClientTlsConfig::new().timeout(handshake);
        let config = match (&self.ca, self.system_roots()) {
            (Some(ca), _) => config.ca_certificate(Certificate::from_pem(ca)),
            (None, Ok(roots)) => config.ca_certificate(Certificate::from_pem(&roots.pem)),
            (None, Err(_)) => config,
        };
        match &self.identity {
            Some((cert, key)) => config.identity(Identity::from_pem(cert, key)),
            None => config,
        }
    }
}

impl ExportTls {
    /// Why a TLS client of this material would trust nothing: no CA is
    /// given and no system root was found (or read in time). `None` when
    /// it trusts some.
    pub(super) fn missing_roots(&self) -> Option<String> {
        match &self.ca {
            Some(_) => None,
            None => self.system_roots().err(),
        }
    }

    /// The system's roots as read with the files, or why there are none
    /// to trust (naming the variable to set instead).
    fn system_roots(&self) -> Result<&SystemRoots, String> {
        let give_ca = |why: &str| format!("{why}; give {}", CA[1]);
        match &self.system_roots {
            Some(Ok(roots)) if !roots.certificates.is_empty() => Ok(roots),
            Some(Ok(_)) => Err(give_ca(
                "no system CA certificates found (`SSL_CERT_FILE`, `SSL_CERT_DIR`, the \
                 system's bundle)",
            )),
            Some(Err(why)) => Err(give_ca(why)),
            None => Err(give_ca("the system's root certificates were not read")),
        }
    }
}

/// Whether `endpoint` is an `https://` URL (any case, leading blanks
/// skipped).
pub(super) fn is_https(endpoint: &str) -> bool {
    endpoint
        .trim_start()
        .get(..8)
        .is_some_and(|scheme| scheme.eq_ignore_ascii_case("https://"))
}

#[cfg(test)]
pub(super) mod tests {
    use std::net::SocketAddr;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use opentelemetry_sdk::trace::SpanExporter as _;
    use rewire_runtime::config::OtelProtocol;
    use rustls::server::WebPkiClientVerifier;
    use rustls::{RootCertStore, ServerConfig};
    use testkit::certs::{CertFiles, TestCa};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tonic::codegen::{http, Service};

    use super::*;
    use crate::telemetry::export::build_exporter;
    use crate::telemetry::{SamplerChoice, TraceSettings};

    fn settings(protocol: OtelProtocol, tls: ExportTlsFiles) -> TraceSettings {
        TraceSettings {
            endpoint: None,
            protocol,
            sampler: SamplerChoice::AlwaysOn,
            service_name: "tls-test".into(),
            export_timeout: Duration::from_secs(10),
            tls,
        }
    }

    /// A key given as the variable's value (Kubernetes `secretKeyRef`)
    /// instead of a path: refused without quoting it. Failed before: the
    /// read error quoted the "path", the whole key, in the log.
    #[test]
    fn a_pem_given_instead_of_a_path_is_refused_unquoted() {
        let ca = TestCa::new("export-ca");
        let client = ca.client("client");
        let key = std::fs::read_to_string(&client.key_path).unwrap();
        let files = ExportTlsFiles {
            client_cert: Some(client.cert_path.clone()),
            client_key: Some(PathBuf::from(key.trim())),
            ..ExportTlsFiles::default()
        };
        let err = files.read().err().expect("refused");
        let body = key.lines().nth(1).expect("a body line");
        assert!(!err.contains(body), "{err}");
        assert!(err.contains("must name a PEM file"), "{err}");
        let shown = crate::telemetry::tls_reads::shown(&files);
        assert!(!shown.contains(body), "{shown}");
        // The key's DER in base64 on one line, no PEM markers: not a
        // path, never shown (it is tried as a relative path and not found).
        let one_line: String = key.lines().filter(|l| !l.starts_with("-----")).collect();
        let files = ExportTlsFiles {
            client_cert: Some(client.cert_path.clone()),
            client_key: Some(PathBuf::from(&one_line)),
            ..ExportTlsFiles::default()
        };
        let err = files.read().err().expect("refused");
        assert!(!err.contains(&one_line[..40]), "{err}");
        assert!(err.contains("OTEL_EXPORTER_OTLP_CLIENT_KEY"), "{err}");
        let shown = crate::telemetry::tls_reads::shown(&files);
        assert!(!shown.contains(&one_line[..40]), "{shown}");
        assert!(
            shown.contains(&client.cert_path.display().to_string()),
            "{shown}"
        );
    }

    fn trusting(ca: &TestCa) -> ExportTlsFiles {
        ExportTlsFiles {
            ca: Some(ca.ca_path.clone()),
            ..ExportTlsFiles::default()
        }
    }

    /// A server configuration for `server`, asking for a client
    /// certificate signed by `clients` when given.
    pub(crate) fn server_config(server: &CertFiles, clients: Option<&TestCa>) -> Arc<ServerConfig> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap();
        let builder = match clients {
            Some(ca) => {
                let mut roots = RootCertStore::empty();
                for cert in CertificateDer::pem_slice_iter(ca.ca_pem.as_bytes()) {
                    roots.add(cert.unwrap()).unwrap();
                }
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                        .build()
                        .unwrap();
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        let chain = CertificateDer::pem_slice_iter(server.cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = PrivateKeyDer::from_pem_slice(server.key_pem.as_bytes()).unwrap();
        Arc::new(builder.with_single_cert(chain, key).unwrap())
    }

    /// An OTLP/HTTP collector over TLS (HTTP/1.1): counts the POSTs to
    /// `/v1/traces` it answers.
    pub(crate) async fn https_collector(
        config: Arc<ServerConfig>,
    ) -> (SocketAddr, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let exports = Arc::new(AtomicUsize::new(0));
        let counted = exports.clone();
        let acceptor = tokio_rustls::TlsAcceptor::from(config);
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, counted) = (acceptor.clone(), counted.clone());
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let mut head = Vec::new();
                    let mut byte = [0u8; 1];
                    while !head.ends_with(b"\r\n\r\n") {
                        if tls.read(&mut byte).await.unwrap_or(0) == 0 {
                            return;
                        }
                        head.push(byte[0]);
                    }
                    let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
                    let length: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .map_or(0, |v| v.trim().parse().unwrap());
                    let mut body = vec![0u8; length];
                    tls.read_exact(&mut body).await.unwrap();
                    if head.starts_with("post /v1/traces ") {
                        counted.fetch_add(1, Ordering::SeqCst);
                    }
                    let answer = "HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n";
                    tls.write_all(answer.as_bytes()).await.unwrap();
                    tls.flush().await.unwrap();
                });
            }
        });
        (addr, exports)
    }

    /// Any protobuf message (every field skipped).
    #[derive(Clone, PartialEq, prost::Message)]
    struct Anything {}

    /// The OTLP trace service, answering every export and counting it.
    #[derive(Clone)]
    struct Collector(Arc<AtomicUsize>);

    impl tonic::server::NamedService for Collector {
        const NAME: &'static str = "opentelemetry.proto.collector.trace.v1.TraceService";
    }

    impl tonic::server::UnaryService<Anything> for Collector {
        type Response = Anything;
        type Future = std::future::Ready<Result<tonic::Response<Anything>, tonic::Status>>;
        fn call(&mut self, _request: tonic::Request<Anything>) -> Self::Future {
            self.0.fetch_add(1, Ordering::SeqCst);
            std::future::ready(Ok(tonic::Response::new(Anything {})))
        }
    }

    impl Service<http::Request<tonic::body::Body>> for Collector {
        type Response = http::Response<tonic::body::Body>;
        type Error = std::convert::Infallible;
        type Future = std::pin::Pin<
            Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>,
        >;
        fn poll_ready(
            &mut self,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Result<(), Self::Error>> {
            std::task::Poll::Ready(Ok(()))
        }
        fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
            let collector = self.clone();
            Box::pin(async move {
                let mut grpc = tonic::server::Grpc::new(tonic_prost::ProstCodec::default());
                Ok(grpc.unary(collector, request).await)
            })
        }
    }

    /// An OTLP/gRPC collector over TLS; the exports it answered.
    pub(crate) async fn grpc_collector(server: &CertFiles) -> (SocketAddr, Arc<AtomicUsize>) {
        let exports = Arc::new(AtomicUsize::new(0));
        let addr: SocketAddr = format!("127.0.0.1:{}", testkit::free_port())
            .parse()
            .unwrap();
        let identity = tonic::transport::Identity::from_pem(&server.cert_pem, &server.key_pem);
        let router = tonic::transport::Server::builder()
            .tls_config(tonic::transport::ServerTlsConfig::new().identity(identity))
            .unwrap()
            .add_service(Collector(exports.clone()));
        tokio::spawn(router.serve(addr));
        tokio::time::sleep(Duration::from_millis(100)).await;
        (addr, exports)
    }

    async fn export_once(settings: &TraceSettings, endpoint: &str) -> Result<(), String> {
        let exporter = build_exporter(settings, endpoint, &settings.tls.load()?)?;
        tokio::time::timeout(Duration::from_secs(20), exporter.inner.export(Vec::new()))
            .await
            .map_err(|_| "no answer".to_string())?
            .map_err(|e| e.to_string())
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn spans_reach_a_grpc_collector_over_tls_trusting_the_given_ca() {
        crate::crypto::install_ring_provider();
        let ca = TestCa::new("otlp-grpc");
        let (addr, exports) = grpc_collector(&ca.server("collector")).await;
        let endpoint = format!("https://localhost:{}", addr.port());
        let grpc = settings(OtelProtocol::Grpc, trusting(&ca));
        export_once(&grpc, &endpoint).await.unwrap();
        assert_eq!(exports.load(Ordering::SeqCst), 1);
        // Another CA's collector certificate is refused: nothing arrives.
        let other = TestCa::new("other");
        let error = export_once(&settings(OtelProtocol::Grpc, trusting(&other)), &endpoint)
            .await
            .unwrap_err();
        assert_eq!(exports.load(Ordering::SeqCst), 1, "{error}");
    }

    /// A collector reached through a listener that takes the first
    /// connection and never answers it (a peer that accepts TCP and then
    /// stalls the TLS handshake): the handshake is cut, the channel dials
    /// again and later exports arrive.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stalled_grpc_handshake_is_cut_and_later_exports_arrive() {
        crate::crypto::install_ring_provider();
        let ca = TestCa::new("otlp-grpc-stall");
        let (collector, exports) = grpc_collector(&ca.server("collector")).await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            let mut stalled = Vec::new();
            while let Ok((mut tcp, _)) = listener.accept().await {
                if stalled.is_empty() {
                    stalled.push(tcp);
                    continue;
                }
                tokio::spawn(async move {
                    if let Ok(mut upstream) = tokio::net::TcpStream::connect(collector).await {
                        let _ = tokio::io::copy_bidirectional(&mut tcp, &mut upstream).await;
                    }
                });
            }
        });
        let mut grpc = settings(OtelProtocol::Grpc, trusting(&ca));
        grpc.export_timeout = Duration::from_millis(500);
        let endpoint = format!("https://localhost:{port}");
        let exporter = build_exporter(&grpc, &endpoint, &grpc.tls.load().unwrap()).unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        while exports.load(Ordering::SeqCst) == 0 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "no export arrived past the stalled handshake"
            );
            let _ = tokio::time::timeout(Duration::from_secs(2), exporter.inner.export(Vec::new()))
                .await;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn spans_reach_an_http_collector_over_mutual_tls() {
        crate::crypto::install_ring_provider();
        let ca = TestCa::new("otlp-http");
        let config = server_config(&ca.server("collector"), Some(&ca));
        let (addr, exports) = https_collector(config).await;
        let endpoint = format!("https://localhost:{}/v1/traces", addr.port());
        let client = ca.client("sidecar");
        let mutual = ExportTlsFiles {
            ca: Some(ca.ca_path.clone()),
            client_cert: Some(client.cert_path.clone()),
            client_key: Some(client.key_path.clone()),
        };
        export_once(&settings(OtelProtocol::Http, mutual), &endpoint)
            .await
            .unwrap();
        assert_eq!(exports.load(Ordering::SeqCst), 1);
        // Without the client certificate the collector refuses the
        // handshake.
        let error = export_once(&settings(OtelProtocol::Http, trusting(&ca)), &endpoint)
            .await
            .unwrap_err();
        assert_eq!(exports.load(Ordering::SeqCst), 1, "{error}");
    }

    /// A CA bundle holding one entry that is no certificate (a PEM block
    /// of garbage) besides the collector's CA: the OTLP/HTTP exporter to
    /// an `https://` collector skips the entry, is built and its spans
    /// arrive. Before: reqwest's `tls_certs_only` refused the whole
    /// bundle ("builder error"), while tonic skipped the entry.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_bad_entry_in_the_bundle_is_skipped_by_the_http_exporter() {
        crate::crypto::install_ring_provider();
        let ca = TestCa::new("otlp-http-bad-entry");
        let bundle = ca.dir().join("bundle-with-garbage.pem");
        let garbage = "-----BEGIN CERTIFICATE-----\nMAMCAQE=\n-----END CERTIFICATE-----\n";
        std::fs::write(&bundle, format!("{garbage}{}", ca.ca_pem)).unwrap();
        let config = server_config(&ca.server("collector"), None);
        let (addr, exports) = https_collector(config).await;
        let endpoint = format!("https://localhost:{}/v1/traces", addr.port());
        let http = settings(OtelProtocol::Http, trusting_path(bundle.to_str().unwrap()));
        export_once(&http, &endpoint).await.unwrap();
        assert_eq!(exports.load(Ordering::SeqCst), 1);
        // Garbage alone: refused, saying so.
        std::fs::write(&bundle, garbage).unwrap();
        let error = export_once(&http, &endpoint).await.unwrap_err();
        assert!(error.contains("OTEL_EXPORTER_OTLP_CERTIFICATE"), "{error}");
    }

    /// A collector answering with a redirect to another host: the
    /// exporter does not follow it (the export fails, nothing reaches the
    /// other host). Before: reqwest followed up to 10 hops, headers and
    /// all.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_http_exporter_follows_no_redirect() {
        let elsewhere = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let elsewhere_port = elsewhere.local_addr().unwrap().port();
        let reached = Arc::new(AtomicUsize::new(0));
        let counted = reached.clone();
        tokio::spawn(async move {
            while let Ok((_tcp, _)) = elsewhere.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
            }
        });
        let redirecting = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = redirecting.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut tcp, _)) = redirecting.accept().await {
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut byte = [0u8; 1];
                    while !head.ends_with(b"\r\n\r\n") {
                        if tcp.read(&mut byte).await.unwrap_or(0) == 0 {
                            return;
                        }
                        head.push(byte[0]);
                    }
                    let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
                    let length: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .map_or(0, |v| v.trim().parse().unwrap());
                    let mut body = vec![0u8; length];
                    let _ = tcp.read_exact(&mut body).await;
                    let answer = format!(
                        "HTTP/1.1 307 Temporary Redirect\r\nlocation: http://127.0.0.1:{elsewhere_port}/v1/traces\r\ncontent-length: 0\r\n\r\n"
                    );
                    let _ = tcp.write_all(answer.as_bytes()).await;
                    let _ = tcp.flush().await;
                    let _ = tcp.read(&mut byte).await;
                });
            }
        });
        let http = settings(OtelProtocol::Http, ExportTlsFiles::default());
        let endpoint = format!("http://127.0.0.1:{port}/v1/traces");
        let outcome = export_once(&http, &endpoint).await;
        assert!(outcome.is_err(), "a redirect is no success");
        assert_eq!(
            reached.load(Ordering::SeqCst),
            0,
            "the redirect was followed"
        );
    }

    #[test]
    fn variables_name_the_files_the_traces_form_first() {
        let env = |name: &str| match name {
            "OTEL_EXPORTER_OTLP_CERTIFICATE" => Some("/any/ca.pem".to_string()),
            "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE" => Some("/traces/ca.pem".to_string()),
            "OTEL_EXPORTER_OTLP_CLIENT_KEY" => Some("/k.pem".to_string()),
            _ => None,
        };
        let files = ExportTlsFiles::from_env(&env);
        assert_eq!(files.ca.as_deref(), Some(Path::new("/traces/ca.pem")));
        assert_eq!(files.client_key.as_deref(), Some(Path::new("/k.pem")));
        assert_eq!(files.client_cert, None);
    }

    #[test]
    fn bad_files_are_named_by_their_variable_and_a_key_is_never_shown() {
        let ca = TestCa::new("otlp-bad");
        let client = ca.client("sidecar");
        let alone = ExportTlsFiles {
            client_cert: Some(client.cert_path.clone()),
            ..ExportTlsFiles::default()
        };
        let error = alone.load().err().unwrap();
        assert!(error.contains("OTEL_EXPORTER_OTLP_CLIENT_KEY"), "{error}");
        // A certificate given as the key: refused without its text.
        let swapped = ExportTlsFiles {
            client_cert: Some(client.cert_path.clone()),
            client_key: Some(client.cert_path.clone()),
            ..ExportTlsFiles::default()
        };
        let error = swapped.load().err().unwrap();
        assert!(error.contains("no private key"), "{error}");
        assert!(!error.contains("BEGIN"), "{error}");
        // A key given as the CA: no certificate in it.
        let not_ca = ExportTlsFiles {
            ca: Some(client.key_path.clone()),
            ..ExportTlsFiles::default()
        };
        let error = not_ca.load().err().unwrap();
        assert!(error.contains("OTEL_EXPORTER_OTLP_CERTIFICATE"), "{error}");
        assert!(
            !error.contains(client.key_pem.lines().nth(1).unwrap()),
            "{error}"
        );
        let missing = trusting_path("/nonexistent/ca.pem").load().err().unwrap();
        assert!(
            missing.contains("OTEL_EXPORTER_OTLP_CERTIFICATE"),
            "{missing}"
        );
    }

    #[test]
    fn a_malformed_pem_file_is_refused_without_its_text() {
        // A one-line PEM: the library's own message would print the rest
        // of the line (as a list of bytes) as the missing end marker.
        let dir = std::env::temp_dir().join(format!("rewire-otlp-pem-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ca = dir.join("ca.pem");
        std::fs::write(
            &ca,
            "-----BEGIN CERTIFICATE----- c2VjcmV0 -----END CERTIFICATE-----\n",
        )
        .unwrap();
        let error = trusting_path(ca.to_str().unwrap()).load().err().unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(error.contains("OTEL_EXPORTER_OTLP_CERTIFICATE"), "{error}");
        assert!(!error.contains("c2VjcmV0"), "{error}");
        assert!(!error.contains("99, 50, 86"), "{error}");
    }

    /// Set in the child process the test below runs itself in.
    const NO_ROOTS_CHILD: &str = "REWIRE_TEST_OTLP_HTTP_NO_ROOTS_CHILD";

    /// An OTLP/HTTP exporter to an `http://` collector is built where no
    /// system certificate can be found (`SSL_CERT_FILE`, `SSL_CERT_DIR`
    /// naming nothing: an image without a CA bundle). Before: "Cannot
    /// export spans … builder error" (reqwest's platform verifier found
    /// no root), and tracing stayed off. Run in a fresh process: the
    /// variables are the process's.
    #[test]
    fn an_http_exporter_is_built_without_system_certificates() {
        const NAME: &str =
            "telemetry::tls::tests::an_http_exporter_is_built_without_system_certificates";
        if std::env::var_os(NO_ROOTS_CHILD).is_some() {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            let _entered = runtime.enter();
            let http = settings(OtelProtocol::Http, ExportTlsFiles::default());
            let tls = http.tls.load().expect("no files");
            let built = build_exporter(&http, "http://127.0.0.1:4318/v1/traces", &tls);
            assert!(built.is_ok(), "{:?}", built.err());
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

    fn trusting_path(path: &str) -> ExportTlsFiles {
        ExportTlsFiles {
            ca: Some(PathBuf::from(path)),
            ..ExportTlsFiles::default()
        }
    }
}
