//! TLS material for the backends' clients (Redis, Apollo, etcd): one loader
//! and one rustls configuration with the ring provider, so every component
//! reads certificates the same way and none pulls in OpenSSL.
//!
//! A certificate field (`caCert`, `clientCert`, `clientKey`) holds either
//! PEM text (a value holding `-----BEGIN` or a line break, typically
//! injected with a `secretRef`) or the path of a PEM file (relative paths resolve against
//! the configuration file's folder). Values are never logged nor put in an
//! error: errors name the component's field and, for a file, its path.
//!
//! * `pem`: [`PemSource`], a field's value, and reading it.
//! * `client`: [`ClientTlsFields`] (the fields as a component declares
//!   them) → [`ClientTls`] (the material read) → rustls / tonic
//!   configurations.
//! * `read_within`: [`ClientTlsFields::load_within`], the files read off
//!   the async workers within [`FILE_READ_DEADLINE`] (a component's
//!   start reads them so: a hung mount fails it, never stalls a worker).
//! * `follow`: [`follow`] and [`follow_files`], re-reading the files of a
//!   running component (read as `read_within` reads them: a hung file is
//!   given up, and not read again until that read returns, but for a
//!   try now and then after minutes) and swapping
//!   in a client built with new material (content that failed waits
//!   [`FIRST_RETRY`], doubled at each failure up to [`REFUSED_RETRY`],
//!   unless it changes).
//! * [`system_roots`]: the system's root certificates, read off the async
//!   workers once for every client that trusts them.

mod client;
mod follow;
mod pem;
mod read_within;
pub mod system_roots;

pub use client::{http_config, ClientTls, ClientTlsFields};
pub use follow::{
    follow, follow_files, Applied, FollowCounts, Followed, ReadFiles, Turn, Unread, FIRST_RETRY,
    RECHECK_EVERY, REFUSED_RETRY,
};
pub use pem::{pem_error_reason, shown_path, PemSource, TlsError, MAX_PEM_BYTES};
pub use read_within::FILE_READ_DEADLINE;

/// Installs rustls's ring provider as the process default, once (later
/// calls are no-ops). Libraries that build rustls configurations without
/// naming a provider (reqwest built without its own) need one.
pub fn install_ring_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
