//! The TLS flags of the commands that call a running sidecar (`apply`,
//! `status`): the CA that signs the sidecar's certificate, and a client
//! certificate for mutual TLS.

use std::path::PathBuf;

use clap::Args;
use rewire_components::tls::{ClientTls, ClientTlsFields, PemSource};

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

    /// The files read and checked, as `rustls` and `tonic` both need them:
    /// the CA holds certificates, the client certificate and key parse and
    /// make an identity (a key that does not match its certificate is
    /// refused here, not at the handshake). Errors name the flags.
    ///
    /// Read on a thread of its own and waited for at most
    /// [`CONNECT_TIMEOUT`](super::remote::CONNECT_TIMEOUT), as the
    /// connection is: a flag naming a file on a hung mount, or (without
    /// `--tls-ca`) a system bundle that does not answer (`SSL_CERT_FILE`
    /// a FIFO), fails the command instead of holding it. The thread left
    /// behind ends with the process.
    fn material(&self) -> Result<Material, String> {
        let fields = self.fields();
        let (answer, answered) = std::sync::mpsc::sync_channel(1);
        std::thread::Builder::new()
            .name("rewire-cli-tls-read".into())
            .spawn(move || {
                let _ = answer.send(Material::read(&fields));
            })
            .map_err(|e| format!("cannot start the TLS files' reading thread: {e}"))?;
        let within = super::remote::CONNECT_TIMEOUT;
        match answered.recv_timeout(within) {
            Ok(material) => material,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Err(format!(
                "the TLS material (the files of --tls-ca, --tls-cert and --tls-key, else the \
                 system's root certificates: `SSL_CERT_FILE`, `SSL_CERT_DIR`) was not read \
                 within {}s (a hung mount?)",
                within.as_secs()
            )),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                Err("the TLS files' reading thread ended without an answer".into())
            }
        }
    }

    /// The rustls configuration for an HTTPS client (ring provider).
    pub fn rustls(&self) -> Result<rustls::ClientConfig, String> {
        self.material().map(|material| material.rustls)
    }

    /// The tonic TLS configuration for a gRPC client, if TLS is asked for:
    /// the same files, checked as [`rustls`](Self::rustls) checks them
    /// (read once: the bytes checked are the bytes used).
    pub fn tonic(&self) -> Result<Option<tonic::transport::ClientTlsConfig>, String> {
        use tonic::transport::{Certificate, ClientTlsConfig, Identity};
        if self.scheme() == "http" {
            return Ok(None);
        }
        let material = self.material()?;
        // tonic bounds the TLS handshake only when told to: a peer that
        // accepts TCP and then says nothing (a stopped sidecar, a dead
        // port-forward) would hold the handshake, and `apply`, for ever.
        // Set here, it also bounds the handshake of a reconnection.
        let mut config = ClientTlsConfig::new().timeout(super::remote::CONNECT_TIMEOUT);
        // The CA, else the system's roots as read with the files: never
        // tonic's own native roots, read without a bound where the
        // endpoint is configured.
        config = config.ca_certificate(Certificate::from_pem(material.roots_pem));
        if let Some((cert, key)) = material.tls.identity {
            config = config.identity(Identity::from_pem(cert, key));
        }
        Ok(Some(config))
    }
}

/// The TLS material of the flags, read and checked.
struct Material {
    tls: ClientTls,
    /// The rustls configuration of it.
    rustls: rustls::ClientConfig,
    /// The roots trusted, as PEM: `--tls-ca`'s, else the system's.
    roots_pem: Vec<u8>,
}

impl Material {
    /// Reads `fields` and (without a CA) the system's roots, blocking.
    fn read(fields: &ClientTlsFields) -> Result<Self, String> {
        let tls = fields.load().map_err(|e| with_flags(&e))?;
        // Without a CA this reads the system's roots (on this thread) and
        // refuses none found.
        let rustls = tls.rustls_config().map_err(|e| with_flags(&e))?;
        let roots_pem = match &tls.ca_pem {
            Some(ca) => ca.clone(),
            None => rewire_components::tls::system_roots::now().pem.clone(),
        };
        Ok(Self {
            tls,
            rustls,
            roots_pem,
        })
    }
}

/// A TLS error with the component's metadata field names (`caCert`,
/// `clientCert`, `clientKey`) said as this command's flags.
fn with_flags(error: &rewire_components::tls::TlsError) -> String {
    error
        .to_string()
        .replace(
            "metadata fields `clientCert` and `clientKey`",
            "--tls-cert and --tls-key",
        )
        .replace("metadata field `caCert`", "--tls-ca")
        .replace("metadata field `clientCert`", "--tls-cert")
        .replace("metadata field `clientKey`", "--tls-key")
        .replace("set `caCert`", "set --tls-ca")
}

#[cfg(test)]
mod tests {
    use super::*;
    use testkit::certs::TestCa;

    fn flags(ca: Option<&std::path::Path>, pair: Option<(&PathBuf, &PathBuf)>) -> ClientTlsArgs {
        ClientTlsArgs {
            tls_ca: ca.map(PathBuf::from),
            tls_cert: pair.map(|(cert, _)| cert.clone()),
            tls_key: pair.map(|(_, key)| key.clone()),
        }
    }

    /// `--tls-ca` naming a private key (no certificate in it) is refused
    /// before connecting, naming the flag, by `apply` (tonic) as by
    /// `status` (rustls). Before: tonic took it, and `apply` connected.
    #[test]
    fn a_ca_file_without_a_certificate_is_refused_naming_the_flag() {
        let ca = TestCa::new("cli-ca-key");
        let server = ca.server("sidecar");
        let args = flags(Some(&server.key_path), None);
        let tonic = args.tonic().map(|_| ()).expect_err("a key as the CA");
        assert!(tonic.starts_with("--tls-ca"), "{tonic}");
        assert!(!tonic.contains("PRIVATE KEY"), "{tonic}");
        let rustls = args.rustls().map(|_| ()).expect_err("a key as the CA");
        assert_eq!(tonic, rustls);
    }

    /// A certificate and another's key are refused before connecting,
    /// naming both flags (not the metadata fields), by both clients.
    /// Before: `apply` said only `transport error` at the handshake.
    #[test]
    fn a_certificate_and_a_key_that_do_not_match_are_refused_naming_both_flags() {
        let ca = TestCa::new("cli-mismatch");
        let (one, other) = (ca.client("one"), ca.client("other"));
        let args = flags(Some(&ca.ca_path), Some((&one.cert_path, &other.key_path)));
        let tonic = args.tonic().map(|_| ()).expect_err("mismatched pair");
        assert!(
            tonic.starts_with("--tls-cert and --tls-key do not make an identity"),
            "{tonic}"
        );
        assert!(!tonic.contains("metadata"), "{tonic}");
        let rustls = args.rustls().map(|_| ()).expect_err("mismatched pair");
        assert_eq!(tonic, rustls);
        let good = flags(Some(&ca.ca_path), Some((&one.cert_path, &one.key_path)));
        assert!(good.tonic().is_ok_and(|c| c.is_some()));
    }
}
