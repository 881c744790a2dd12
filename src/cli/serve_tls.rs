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
        if let Some(warning) = plaintext_beside_mutual_tls(&settings) {
            tracing::warn!("{warning}");
        }
        Ok(settings)
    }
}

/// The warning for mutual TLS (`--tls-client-ca`) on one listener while
/// the other serves plain text, where no client certificate is asked for;
/// `None` otherwise. Documented behaviour (the client CA applies to the
/// TLS listeners), so a warning, not a refusal.
fn plaintext_beside_mutual_tls(settings: &TlsSettings) -> Option<String> {
    let mutual = |tls: &Option<ListenerTls>| tls.as_ref().map(|t| t.client_ca.is_some());
    let (tls_on, plain) = match (mutual(&settings.grpc), mutual(&settings.http)) {
        (Some(true), None) => ("gRPC", "HTTP"),
        (None, Some(true)) => ("HTTP", "gRPC"),
        _ => return None,
    };
    Some(format!(
        "--tls-client-ca: mutual TLS on the {tls_on} listener only; the {plain} listener serves plain text and asks no client certificate (give it TLS with --tls-cert/--tls-key or --{}-tls-cert/--{}-tls-key)",
        plain.to_lowercase(),
        plain.to_lowercase()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        tls: ServeTlsArgs,
    }

    fn warning(args: &[&str]) -> Option<String> {
        let cli = Cli::try_parse_from(std::iter::once("rewire").chain(args.iter().copied()))
            .expect("arguments");
        plaintext_beside_mutual_tls(&cli.tls.settings().expect("settings"))
    }

    #[test]
    fn a_client_ca_with_tls_on_one_listener_names_the_plaintext_one() {
        let grpc_only = [
            "--grpc-tls-cert",
            "g.crt",
            "--grpc-tls-key",
            "g.key",
            "--tls-client-ca",
            "ca.pem",
        ];
        let said = warning(&grpc_only).expect("a warning");
        assert!(
            said.contains("the HTTP listener serves plain text"),
            "{said}"
        );
        let http_only = [
            "--http-tls-cert",
            "h.crt",
            "--http-tls-key",
            "h.key",
            "--tls-client-ca",
            "ca.pem",
        ];
        let said = warning(&http_only).expect("a warning");
        assert!(
            said.contains("the gRPC listener serves plain text"),
            "{said}"
        );
        let both = [
            "--tls-cert",
            "t.crt",
            "--tls-key",
            "t.key",
            "--tls-client-ca",
            "ca.pem",
        ];
        assert_eq!(warning(&both), None);
        assert_eq!(
            warning(&["--grpc-tls-cert", "g.crt", "--grpc-tls-key", "g.key"]),
            None
        );
    }
}
