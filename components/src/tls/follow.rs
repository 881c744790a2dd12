//! Following a component's TLS files: every second the files named by
//! its `caCert`, `clientCert` and `clientKey` are read again; when their
//! content differs from the material in force, the component's `apply`
//! builds a new client with the new material, checks that it works and
//! swaps it in. New material that cannot be read or used (half-written,
//! corrupt, a key that does not match, a server that refuses it) leaves
//! the client in force serving, with one warning per refused content; it
//! is tried again each second, so a server that learns to trust it later
//! gets it then. PEM text never reaches a log: errors name fields and
//! paths.

use std::future::Future;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::client::{ClientTls, ClientTlsFields};

/// How often the files are read again.
pub const RECHECK_EVERY: Duration = Duration::from_secs(1);

/// Follows the files of `fields` (nothing to do when they name none):
/// `in_force` is the material the component's client uses now; `apply`
/// gets new material and answers once a client built with it is checked
/// and in force, or with why not. `label` (the component) and `backend`
/// name the client in logs. Ends when `stop` is cancelled.
pub fn follow_files<F, Fut>(
    label: String,
    backend: &'static str,
    fields: ClientTlsFields,
    in_force: ClientTls,
    stop: CancellationToken,
    mut apply: F,
) where
    F: FnMut(ClientTls) -> Fut + Send + 'static,
    Fut: Future<Output = Result<(), String>> + Send,
{
    if fields.files().is_empty() {
        return;
    }
    tokio::spawn(async move {
        let mut in_force = in_force;
        // The content (or the read error) last refused, warned about once.
        let mut refused: Option<Result<ClientTls, String>> = None;
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(RECHECK_EVERY) => {}
            }
            // Read off the runtime (a file on a slow volume holds a
            // blocking thread, never a worker).
            let reading = fields.clone();
            let loaded = tokio::select! {
                () = stop.cancelled() => return,
                loaded = tokio::task::spawn_blocking(move || reading.load()) => match loaded {
                    Ok(loaded) => loaded.map_err(|err| err.to_string()),
                    Err(err) => Err(format!("reading the TLS files failed: {err}")),
                },
            };
            let outcome = match &loaded {
                Ok(material) if *material == in_force => {
                    refused = None;
                    continue;
                }
                Ok(material) => {
                    let applied = tokio::select! {
                        () = stop.cancelled() => return,
                        applied = apply(material.clone()) => applied,
                    };
                    applied.map(|()| material.clone())
                }
                Err(err) => Err(err.clone()),
            };
            match outcome {
                Ok(material) => {
                    in_force = material;
                    refused = None;
                    info!(component = %label, "{backend} TLS files changed; a new client with them is in force.");
                }
                Err(error) => {
                    if refused.as_ref() != Some(&loaded) {
                        warn!(component = %label, error = %error, "New {backend} TLS files refused; the client in force keeps serving.");
                        refused = Some(loaded);
                    } else {
                        debug!(component = %label, error = %error, "New {backend} TLS files still refused.");
                    }
                }
            }
        }
    });
}
