//! The `etcd` config store: configuration items kept in etcd v3, with
//! change subscriptions fed by a watch that never misses nor repeats a
//! change; and the `etcd` sequencer ([`sequencer`]).
//!
//! # Key mapping
//!
//! An item `(group, key, label)` is the etcd key
//!
//! ```text
//! {keyPrefix}[{group}/]{key}[@{label}]
//! ```
//!
//! so with `keyPrefix` `/config/`: key `timeout` → `/config/timeout`; group
//! `db`, key `host` → `/config/db/host`; label `prod` →
//! `/config/db/host@prod`. An item's `version` is the key's
//! `mod_revision`.
//!
//! Read back (listings, watch events), the path after `keyPrefix` is split
//! at its first `/` into group and key, and the key's last `@` starts the
//! label; paths that do not fit are not items and are left out. So that
//! every item reads back as written, a key may not contain `@`, nor `/`
//! without a group; a group may not contain `/`; a label neither `/` nor
//! `@`. An empty group or label counts as none. Give a leading `/` in
//! `keyPrefix` (`/config/`), not in keys: with an empty `keyPrefix`, the
//! path `/a` would have an empty group and is not an item.
//!
//! # Operations
//!
//! * `get` with keys reads exactly those paths; with no keys it lists
//!   `{keyPrefix}` (every group) or, with a group, `{keyPrefix}{group}/`,
//!   keeping the items that match the query's label (no label: every
//!   label). Reads go to etcd (see *Sharing* for how they are made
//!   together); when no member answers, or no login finishes within
//!   `dialTimeout`, from the watch's copy.
//! * `set` puts each item; `delete` deletes each key of the query (keys are
//!   required). Each call is one etcd transaction: all its writes are made,
//!   or none (a value etcd refuses as too large leaves the other items of
//!   the `set` unwritten, and nothing is published). A call of more than
//!   128 distinct keys (etcd's `--max-txn-ops` default) is refused as
//!   invalid, naming the limit: split it.
//! * `subscribe` registers with the store's subscribers: each gets the
//!   changes of one prefix watch on `keyPrefix` that `get` of its query
//!   returns — with keys, the items of exactly its group and label (a query
//!   without group or label gets `timeout`, never `timeout@canary` nor
//!   `db/timeout`); without keys, those of its group (any, if none) that
//!   match its label (any, if none). A delete arrives with an empty value.
//!
//! # Sharing
//!
//! A process has one connection and one prefix watch for each distinct set
//! of settings — `endpoints`, `keyPrefix`, `username` and `password`, the
//! TLS material, `dialTimeout`, `watchRetryMs`, `maxResponseBytes` — shared by every store
//! with those settings (a thousand runtimes in one process watching one
//! key cost etcd one watch). The first store to start connects, reads the
//! prefix and starts the watch; the others join it (checking that etcd
//! answers, as connecting would). Each store keeps its own subscribers:
//! every batch of the shared watch is published to each store's.
//!
//! Reads are made together: a store's `get` joins the next round of the
//! shared read queue, which makes the distinct ranges of every read queued
//! in one transaction (per 128). A round begins after the reads it answers
//! were asked, so a read sees every write made before it — by this store
//! or any other client — as with a request of its own. Writes go to etcd
//! at once.
//!
//! A store leaves in `close`, when dropped, or when its runtime's shutdown
//! token is cancelled; when the last one leaves, the watch stops and the
//! connection is dropped with the last store instance. A rebuilt store
//! joins before the old instance closes, so a reload keeps the watch.
//!
//! # Watching
//!
//! At init the first store with its settings connects, reads the whole
//! prefix and starts one watch task from the revision after that read. A dropped stream is watched
//! again, with exponential backoff from `watchRetryMs` (at most 30 s), from
//! the revision after the last one seen: no change is lost or published
//! twice, etcd restarts included. If that revision was compacted away, the
//! task re-reads the prefix, publishes what changed meanwhile (deleted keys
//! with an empty value) and watches on from the re-read. The task stops
//! when the last store sharing it leaves (`close`, or its runtime's
//! shutdown token).
//!
//! # Clusters
//!
//! List every member in `endpoints`. Requests and the watch go to one
//! member (the first to begin with); when it is unreachable — connection
//! refused or reset, no answer within `dialTimeout`, or no leader — the
//! request is made at once on the next member (each at most once per
//! request, so a request takes at most `dialTimeout` × members), and later
//! ones stay there. The watch requires a leader: a member cut off from the
//! cluster ends it instead of going silent, and a member that hangs is
//! found out by the connection's keep-alive ping (every 10 s, answer
//! within `dialTimeout`); one that keeps the stream open and answers pings
//! but sends nothing (its apply loop stuck) is asked for its progress
//! after 30 s of silence, and left when no answer comes within
//! `dialTimeout` + 5 s (the watch reported failing meanwhile). The watch
//! then resumes on the next member from the last revision seen + 1, as
//! above; a next member that has not applied that revision yet (normal
//! after a leader loss) serves it as it catches up, without a re-read.
//! Starting, too, moves past a member that does not answer: init (logging
//! in, the first read) may take `dialTimeout` × (members + 1), so a first
//! listed member that hangs does not use up the time the next one needs.
//!
//! When no member answers, the store keeps the last values: reads that
//! find no member (or whose login runs out) are answered from the
//! watch's copy of the prefix,
//! subscribers keep what they have, readiness is `Degraded` ("serving the
//! last values seen"), and the watch retries with its backoff until a
//! member answers.
//!
//! # Metadata
//!
//! `endpoints` (`host:port`, comma-separated, required; `https://host:port`
//! for TLS), `caCert`, `clientCert`, `clientKey` (TLS: PEM text or file
//! paths; any of them turns TLS on; files are re-read every second and new
//! content is tried on new channels, which must answer `Status`, then swapped
//! into the shared connection — the watch resumes on them from the last
//! revision seen + 1; a file that cannot be used is refused with one
//! warning and the connection in force serves on), `keyPrefix`,
//! `username` and `password` (etcd authentication; the password never
//! appears in logs or errors), `dialTimeout` (`"5s"`, `"500ms"` or
//! milliseconds; default 5 s; also the limit on each request),
//! `watchRetryMs` (default 500). Readiness is a one-key read answered
//! within 800 ms (else `Degraded`, see above). Any metadata change
//! rebuilds the store.

mod cache;
#[cfg(test)]
mod fake_member;
mod fanout;
mod keys;
pub mod metadata;
mod reads;
pub mod sequencer;
mod sequencer_kv;
mod shared;
mod sharing;
mod store;
mod subscribers;
mod watch;
mod writes;

pub use keys::KeyError;
pub use metadata::{EtcdMetadata, EtcdMetadataError, EtcdSettings};
pub use sequencer::EtcdSequencer;
pub use store::EtcdConfigStore;
