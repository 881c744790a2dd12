//! Following the TLS files of a `redis` component (`caCert`, `clientCert`,
//! `clientKey` given as paths): every second the files are read again;
//! when their content changed, a new connection is made with it, verified,
//! and swapped in — the path a password change takes. A file that cannot
//! be used (half-written, corrupt, a key that does not match) is refused
//! with a warning and the connection in force keeps serving; the next
//! change is tried again.

use std::sync::{Arc, Weak};
use std::time::Duration;

use tracing::{info, warn};

use super::{RedisConnection, Shared};
use crate::redis::metadata::RedisMetadata;
use crate::tls::PemSource;

/// How often the files are read again.
const RECHECK_EVERY: Duration = Duration::from_secs(1);

/// Whether `metadata` names any TLS file.
fn names_files(metadata: &RedisMetadata) -> bool {
    metadata.enable_tls
        && [
            &metadata.ca_cert,
            &metadata.client_cert,
            &metadata.client_key,
        ]
        .into_iter()
        .any(|v| matches!(PemSource::parse(v), Some(PemSource::File(_))))
}

impl RedisConnection {
    /// Starts following the TLS files, for as long as the component lives.
    pub(super) fn follow_tls_files(&self) {
        let shared: Weak<Shared> = Arc::downgrade(&self.shared);
        tokio::spawn(async move {
            let mut refused: Option<String> = None;
            loop {
                tokio::time::sleep(RECHECK_EVERY).await;
                let Some(shared) = shared.upgrade() else {
                    return;
                };
                let connection = RedisConnection { shared };
                let session = connection.session();
                if !names_files(&session.metadata) {
                    continue;
                }
                let settings = session.metadata.connection_settings();
                let changed = match (&settings, &session.link) {
                    (Ok(settings), Some(link)) => *settings != link.settings,
                    (Err(_), _) => true,
                    (Ok(_), None) => false,
                };
                if !changed {
                    refused = None;
                    continue;
                }
                let label = connection.shared.label().to_string();
                match connection.apply((*session.metadata).clone()).await {
                    Ok(_) => {
                        refused = None;
                        info!(component = %label, "Redis TLS files changed; a new connection with them is in force.");
                    }
                    Err(err) => {
                        let text = err.to_string();
                        if refused.as_deref() != Some(text.as_str()) {
                            warn!(component = %label, error = %text, "New Redis TLS files refused; the connection in force keeps serving.");
                            refused = Some(text);
                        }
                    }
                }
            }
        });
    }
}
