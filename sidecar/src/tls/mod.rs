//! TLS on the sidecar's own listeners: server certificates, optional
//! mutual TLS, a client CA for the Lifecycle API, all followed live.
//!
//! * `settings`: [`ListenerTls`] and [`TlsSettings`], what the command
//!   line asks for.
//! * `material`: reading the PEM files into a rustls server configuration
//!   (ring provider) and client verifiers.
//! * `live`: [`LiveTls`], the configuration in force (loaded at start-up
//!   without holding an async worker: [`ServingTls::start_off_workers`]),
//!   re-read when a file changes: the next handshake uses the new
//!   certificate, connections already open keep theirs, and a bad new file
//!   is refused (the old configuration stays) and shown in status.
//! * `follow_reads`: the follower's reads, bounded in time: a hung mount
//!   is given up after 5 s and read again on a new thread at growing
//!   intervals, never more than one thread per listener between tries, and
//!   never more than 8 reads of one file alive at once in the process
//!   (start-up reads included); at that ceiling the file is not read until
//!   one returns, and the certificate in force serves on.
//! * `offered_cert`: the gRPC listener's client verifier with only a
//!   Lifecycle CA: any certificate offered, within 4 intermediates and
//!   16 KiB, is taken at the handshake (its key proven), the Lifecycle
//!   API checks it per call.
//! * `peer`: what a handshake proved about the client, for the Lifecycle
//!   API's certificate check (its verdict kept per connection for 1 s).

mod follow_reads;
mod live;
mod material;
mod offered_cert;
mod peer;
mod settings;

pub use live::{LiveTls, ServingTls, TlsStatus};
pub use peer::{PeerInfo, RequireClientCert};
pub use settings::{ListenerTls, TlsSettings};

pub use crate::crypto::install_ring_provider;
