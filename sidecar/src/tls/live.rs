//! [`LiveTls`]: one listener's TLS configuration in force, re-read when one
//! of its files changes.
//!
//! Every second the files are read and compared with what was loaded. On a
//! change a new configuration is built; only if every file parses and the
//! key matches the certificate is it swapped in, so a half-written
//! rotation (certificate replaced, key not yet) is refused, shown in
//! status, and retried on the next change. The next handshake uses
//! whatever is in force; open connections keep the one they started with.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::server::danger::ClientCertVerifier;
use rustls::ServerConfig;
use serde::Serialize;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use super::material::{ca_verifier, Files};
use super::settings::ListenerTls;

/// How often the files are compared with what was loaded.
const RECHECK_EVERY: Duration = Duration::from_secs(1);

/// What status shows of one listener's TLS. No key material.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct TlsStatus {
    /// `grpc` or `http`.
    pub listener: String,
    /// The certificate file.
    pub cert_file: String,
    /// SHA-256 of the certificate in force (hex).
    pub certificate_sha256: String,
    /// How many times a configuration was loaded (1 at start).
    pub loads: u64,
    /// Whether clients must present a certificate.
    pub mutual: bool,
    /// Why the last change of the files was refused, while the files stay
    /// as they are (`None` once a good set is loaded).
    pub error: Option<String>,
}

/// One listener's TLS configuration in force.
pub struct LiveTls {
    files: Files,
    lifecycle_ca: Option<std::path::PathBuf>,
    config: ArcSwap<ServerConfig>,
    lifecycle: ArcSwap<Option<Arc<dyn ClientCertVerifier>>>,
    status: Mutex<TlsStatus>,
    loaded: Mutex<Loaded>,
}

/// The files' content last built from, and why it was refused (`None`:
/// it is the configuration in force).
struct Loaded {
    contents: Vec<Vec<u8>>,
    refused: Option<String>,
}

impl LiveTls {
    /// Loads `settings` (and the Lifecycle CA, if any) for `listener`.
    pub fn load(
        listener: &str,
        settings: &ListenerTls,
        lifecycle_ca: Option<&std::path::Path>,
    ) -> Result<Arc<Self>, String> {
        let files = Files {
            cert: settings.cert.clone(),
            key: settings.key.clone(),
            required_ca: settings.client_ca.clone(),
            optional_ca: lifecycle_ca.map(std::path::Path::to_path_buf),
            alpn: match listener {
                "grpc" => vec![b"h2".to_vec()],
                _ => vec![b"h2".to_vec(), b"http/1.1".to_vec()],
            },
        };
        let contents = files.contents()?;
        let (config, fingerprint) = files.server_config()?;
        let lifecycle = lifecycle_ca.map(ca_verifier).transpose()?;
        let status = TlsStatus {
            listener: listener.to_string(),
            cert_file: files.cert.display().to_string(),
            certificate_sha256: fingerprint,
            loads: 1,
            mutual: files.required_ca.is_some(),
            error: None,
        };
        Ok(Arc::new(Self {
            lifecycle_ca: files.optional_ca.clone(),
            files,
            config: ArcSwap::from_pointee(config),
            lifecycle: ArcSwap::from_pointee(lifecycle),
            status: Mutex::new(status),
            loaded: Mutex::new(Loaded {
                contents,
                refused: None,
            }),
        }))
    }

    /// An acceptor with the configuration in force now.
    pub fn acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(self.config.load_full())
    }

    /// The Lifecycle API's client verifier in force, if one is configured.
    pub fn lifecycle_verifier(&self) -> Option<Arc<dyn ClientCertVerifier>> {
        self.lifecycle.load().as_ref().clone()
    }

    /// Whether a Lifecycle client CA is configured (then a missing
    /// verifier refuses every Lifecycle call rather than allowing it).
    pub fn lifecycle_ca_configured(&self) -> bool {
        self.lifecycle_ca.is_some()
    }

    /// The ALPN protocols the configuration in force offers.
    pub fn alpn_protocols(&self) -> Vec<Vec<u8>> {
        self.config.load().alpn_protocols.clone()
    }

    /// Drops the Lifecycle verifier (tests of the fail-closed check).
    #[cfg(test)]
    pub(super) fn drop_lifecycle_verifier(&self) {
        self.lifecycle.store(Arc::new(None));
    }

    /// What status shows.
    pub fn status(&self) -> TlsStatus {
        self.status
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Follows the files until `stop` is cancelled.
    pub fn follow(self: &Arc<Self>, stop: CancellationToken) {
        let live = Arc::clone(self);
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(RECHECK_EVERY) => {}
                }
                // Reading files may block (a slow disk): off the async
                // workers.
                let again = Arc::clone(&live);
                let _ = tokio::task::spawn_blocking(move || again.recheck()).await;
            }
        });
    }

    /// Reloads if the files changed since the last load (or the last
    /// refused attempt).
    pub fn recheck(&self) {
        let contents = match self.files.contents() {
            Ok(contents) => contents,
            Err(err) => return self.refuse(err),
        };
        let mut loaded = self.loaded.lock().unwrap_or_else(|p| p.into_inner());
        if loaded.contents == contents {
            // Unchanged since the last build: what status shows is that
            // build's outcome, not a read error seen in between (a file
            // briefly missing while being replaced).
            let mut status = self.status.lock().unwrap_or_else(|p| p.into_inner());
            if status.error != loaded.refused {
                if loaded.refused.is_none() {
                    tracing::info!(listener = %status.listener, "TLS files readable again and unchanged; the certificate in force stays.");
                }
                status.error = loaded.refused.clone();
            }
            return;
        }
        loaded.contents = contents;
        let built = self
            .files
            .server_config()
            .and_then(|(config, fingerprint)| {
                let lifecycle = self.lifecycle_ca.as_deref().map(ca_verifier).transpose()?;
                Ok((config, fingerprint, lifecycle))
            });
        match built {
            Ok((config, fingerprint, lifecycle)) => {
                loaded.refused = None;
                self.config.store(Arc::new(config));
                self.lifecycle.store(Arc::new(lifecycle));
                let mut status = self.status.lock().unwrap_or_else(|p| p.into_inner());
                status.certificate_sha256 = fingerprint;
                status.loads += 1;
                status.error = None;
                tracing::info!(listener = %status.listener, certificate_sha256 = %status.certificate_sha256, "TLS certificate reloaded; new handshakes use it.");
            }
            Err(err) => {
                loaded.refused = Some(err.clone());
                self.refuse(err);
            }
        }
    }

    fn refuse(&self, err: String) {
        let mut status = self.status.lock().unwrap_or_else(|p| p.into_inner());
        if status.error.as_deref() != Some(err.as_str()) {
            tracing::warn!(listener = %status.listener, error = %err, "New TLS files refused; the certificate in force stays.");
            status.error = Some(err);
        }
    }
}

/// The TLS in force on both listeners (`None`: plain text).
#[derive(Clone, Default)]
pub struct ServingTls {
    /// The gRPC listener's.
    pub grpc: Option<Arc<LiveTls>>,
    /// The HTTP listener's.
    pub http: Option<Arc<LiveTls>>,
}

impl ServingTls {
    /// Loads what `settings` asks for and follows the files until `stop`.
    pub fn start(settings: &super::TlsSettings, stop: &CancellationToken) -> Result<Self, String> {
        if settings.lifecycle_client_ca.is_some() && settings.grpc.is_none() {
            return Err("a Lifecycle client CA needs TLS on the gRPC listener (--tls-cert and --tls-key, or --grpc-tls-cert and --grpc-tls-key)".into());
        }
        let load = |listener: &str, tls: &Option<ListenerTls>, lifecycle| {
            tls.as_ref()
                .map(|tls| {
                    let live = LiveTls::load(listener, tls, lifecycle)
                        .map_err(|err| format!("TLS on the {listener} listener: {err}"))?;
                    live.follow(stop.clone());
                    Ok::<_, String>(live)
                })
                .transpose()
        };
        Ok(Self {
            grpc: load(
                "grpc",
                &settings.grpc,
                settings.lifecycle_client_ca.as_deref(),
            )?,
            http: load("http", &settings.http, None)?,
        })
    }

    /// Each TLS listener's status.
    pub fn status(&self) -> Vec<TlsStatus> {
        [&self.grpc, &self.http]
            .into_iter()
            .flatten()
            .map(|live| live.status())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_error_clears_once_the_same_files_are_back() {
        let ca = testkit::certs::TestCa::new("live-tls");
        let server = ca.server("localhost");
        let settings = ListenerTls {
            cert: server.cert_path.clone(),
            key: server.key_path.clone(),
            client_ca: None,
        };
        let live = LiveTls::load("grpc", &settings, None).expect("loads");
        std::fs::remove_file(&server.cert_path).expect("remove");
        live.recheck();
        assert!(live.status().error.is_some(), "a missing file is shown");
        std::fs::write(&server.cert_path, &server.cert_pem).expect("restore");
        live.recheck();
        let status = live.status();
        assert_eq!(status.error, None, "{status:?}");
        assert_eq!(status.loads, 1, "nothing changed: no reload");

        // A refused set stays shown as refused after the same blip.
        let other = ca.server("other");
        std::fs::write(&server.cert_path, &other.cert_pem).expect("mismatched key");
        live.recheck();
        let refused = live.status().error.expect("refused");
        std::fs::remove_file(&server.cert_path).expect("remove");
        live.recheck();
        std::fs::write(&server.cert_path, &other.cert_pem).expect("restore");
        live.recheck();
        assert_eq!(live.status().error.as_deref(), Some(refused.as_str()));
    }

    #[test]
    fn the_grpc_listener_offers_only_h2() {
        let ca = testkit::certs::TestCa::new("live-tls-alpn");
        let server = ca.server("localhost");
        let settings = ListenerTls {
            cert: server.cert_path.clone(),
            key: server.key_path.clone(),
            client_ca: None,
        };
        let grpc = LiveTls::load("grpc", &settings, None).expect("grpc");
        assert_eq!(grpc.alpn_protocols(), vec![b"h2".to_vec()]);
        let http = LiveTls::load("http", &settings, None).expect("http");
        assert_eq!(
            http.alpn_protocols(),
            vec![b"h2".to_vec(), b"http/1.1".to_vec()]
        );
    }
}
