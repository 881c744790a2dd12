//! A small etcd v3 client: the KV, Watch, Auth and Maintenance calls rewire
//! uses, over etcd's own protos compiled with protox at build time (no
//! system `protoc`, nothing beyond `cargo`).
//!
//! * [`Client::connect`] opens a channel to each of one or more endpoints
//!   (`http://host:port` or `https://host:port` with [`ConnectOptions::tls`]),
//!   logs in when given a user, and bounds what a call does on each
//!   member, logins included, by [`ConnectOptions::timeout`] — up to 1.5 ×
//!   it when a login that succeeded left the call less than half of it.
//! * Calls go to one member; one that is unreachable (refused, reset, no
//!   answer in time, no leader) is left for the next endpoint, and the
//!   call made there — each member at most once per call. Watches require
//!   a leader, so a member cut off from the cluster ends them.
//! * An expired auth token (etcd's simple tokens expire after 5 idle
//!   minutes) is renewed by logging in again, and the call retried once;
//!   the calls refused together log in once, not once each.
//! * Answers up to [`ConnectOptions::max_response_size`] are accepted
//!   (default [`DEFAULT_MAX_RESPONSE_SIZE`], 64 MiB: not gRPC's 4 MiB, so
//!   a prefix holding large values stays readable, nor the 2 GiB a server
//!   could make the client reserve per stream); a larger one fails its
//!   call with [`Error::TooLarge`], naming the limit and the setting that
//!   raises it.
//! * [`pb`] holds the generated messages, for requests the helpers here do
//!   not cover.

mod client;
mod error;
pub mod pb;
mod watch;

pub use client::{prefix_range, Client, ConnectOptions, TlsOptions, DEFAULT_MAX_RESPONSE_SIZE};
pub use error::Error;
pub use watch::WatchStream;
