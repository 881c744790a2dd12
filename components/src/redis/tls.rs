//! TLS for the `redis` components: the metadata fields (`enableTLS`,
//! `caCert`, `clientCert`, `clientKey`, `insecureSkipVerify`) read into
//! [`ClientTls`], and the addresses and certificates the redis client
//! wants from it.

use redis::{ConnectionAddr, TlsCertificates, TlsMode};

use super::metadata::RedisMetadata;
use crate::tls::{ClientTls, ClientTlsFields, PemSource, TlsError};

/// The TLS material of `metadata`, read; `None` without `enableTLS`.
/// Certificate fields without `enableTLS` are an error rather than
/// silently plain text.
pub fn load(metadata: &RedisMetadata) -> Result<Option<ClientTls>, TlsError> {
    let fields = [
        ("caCert", &metadata.ca_cert),
        ("clientCert", &metadata.client_cert),
        ("clientKey", &metadata.client_key),
    ];
    if !metadata.enable_tls {
        if let Some((name, _)) = fields.iter().find(|(_, v)| !v.trim().is_empty()) {
            return Err(TlsError::Config(format!(
                "metadata field `{name}` is set but `enableTLS` is not true"
            )));
        }
        if metadata.insecure_skip_verify {
            return Err(TlsError::Config(
                "metadata field `insecureSkipVerify` is set but `enableTLS` is not true".into(),
            ));
        }
        return Ok(None);
    }
    let declared = ClientTlsFields {
        ca_cert: PemSource::parse(&metadata.ca_cert),
        client_cert: PemSource::parse(&metadata.client_cert),
        client_key: PemSource::parse(&metadata.client_key),
        insecure_skip_verify: metadata.insecure_skip_verify,
    };
    declared.load().map(Some)
}

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

/// The certificates as the redis client takes them.
pub fn certificates(tls: &ClientTls) -> TlsCertificates {
    TlsCertificates {
        client_tls: tls
            .identity
            .as_ref()
            .map(|(cert, key)| redis::ClientTlsConfig {
                client_cert: cert.clone(),
                client_key: key.clone(),
            }),
        root_cert: tls.ca_pem.clone(),
    }
}

/// A certificate field for `Debug`: a path as is, PEM text hidden.
pub fn shown(value: &str) -> String {
    match PemSource::parse(value) {
        None => String::new(),
        Some(PemSource::Inline(_)) => "<PEM>".into(),
        Some(PemSource::File(path)) => path.display().to_string(),
    }
}
