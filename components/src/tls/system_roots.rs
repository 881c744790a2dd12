//! The system's root certificates, as the components' clients trust
//! them: [`rewire_runtime::system_roots`] (read off the async workers,
//! once for the process, shared with the sidecar and the command-line
//! tools), with a read that failed said as a component's error: set
//! `caCert`.

use std::sync::Arc;

pub use rewire_runtime::system_roots::{cached, now, SystemRoots, FRESH_FOR, READ_DEADLINE};

use super::pem::TlsError;

/// [`rewire_runtime::system_roots::preload`]: the system's roots, read
/// again on a thread of its own (within [`READ_DEADLINE`]) unless the
/// last read is fresh. Call it in the async start of a component that
/// trusts the system's roots, before building its client. A read that
/// does not finish leaves the one before in use; with none, an error
/// saying to set `caCert`.
pub async fn preload() -> Result<Arc<SystemRoots>, TlsError> {
    rewire_runtime::system_roots::preload()
        .await
        .map_err(|err| TlsError::Config(format!("{err}; set `caCert`")))
}
