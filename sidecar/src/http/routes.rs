//! The paths served, Dapr's where Dapr has the route.

/// Readiness of every component.
pub const HEALTHZ: &str = "/v1.0/healthz";
/// Whether the sidecar can serve outbound calls (the Dapr SDKs poll it).
pub const HEALTHZ_OUTBOUND: &str = "/v1.0/healthz/outbound";
/// Save state (a JSON array of items).
pub const STATE: &str = "/v1.0/state/{store}";
/// Get or delete one key.
pub const STATE_KEY: &str = "/v1.0/state/{store}/{key}";
/// Get several keys (`POST`, `PUT`; a `GET` or `DELETE` here is the key
/// `bulk`'s, as in Dapr).
pub const STATE_BULK: &str = "/v1.0/state/{store}/bulk";
/// Run a state transaction (`POST`, `PUT`; a `GET` or `DELETE` here is the
/// key `transaction`'s, as in Dapr).
pub const STATE_TRANSACTION: &str = "/v1.0/state/{store}/transaction";
/// Dapr's state query (alpha; served for `POST` and `PUT`).
pub const STATE_QUERY_ALPHA1: &str = "/v1.0-alpha1/state/{store}/query";
/// Take a lock.
pub const LOCK: &str = "/v1.0-alpha1/lock/{store}";
/// Release a lock.
pub const UNLOCK: &str = "/v1.0-alpha1/unlock/{store}";
/// Get one secret.
pub const SECRET: &str = "/v1.0/secrets/{store}/{name}";
/// Get every secret of a store.
pub const SECRETS_BULK: &str = "/v1.0/secrets/{store}/bulk";
/// Get configuration items.
pub const CONFIGURATION: &str = "/v1.0/configuration/{store}";
/// Get configuration items (the path of Dapr's alpha API).
pub const CONFIGURATION_ALPHA1: &str = "/v1.0-alpha1/configuration/{store}";
/// Subscribe to configuration changes, posted to the app.
pub const CONFIGURATION_SUBSCRIBE: &str = "/v1.0/configuration/{store}/subscribe";
/// Subscribe to configuration changes (Dapr's alpha path).
pub const CONFIGURATION_SUBSCRIBE_ALPHA1: &str = "/v1.0-alpha1/configuration/{store}/subscribe";
/// End a configuration subscription.
pub const CONFIGURATION_UNSUBSCRIBE: &str = "/v1.0/configuration/{store}/{id}/unsubscribe";
/// End a configuration subscription (Dapr's alpha path).
pub const CONFIGURATION_UNSUBSCRIBE_ALPHA1: &str =
    "/v1.0-alpha1/configuration/{store}/{id}/unsubscribe";
/// Publish one event.
pub const PUBLISH: &str = "/v1.0/publish/{pubsub}/{*topic}";
/// Publish several events (Dapr's alpha path).
pub const PUBLISH_BULK: &str = "/v1.0-alpha1/publish/bulk/{pubsub}/{*topic}";
/// Publish several events (beats `PUBLISH`: never a pub/sub named `bulk`).
pub const PUBLISH_BULK_V1: &str = "/v1.0/publish/bulk/{pubsub}/{*topic}";
/// The sidecar's metadata.
pub const METADATA: &str = "/v1.0/metadata";
/// Set one entry of the sidecar's extended metadata.
pub const METADATA_KEY: &str = "/v1.0/metadata/{key}";
/// Prometheus metrics.
pub const METRICS: &str = "/metrics";
/// rewire's status: generation, components, reloads.
pub const STATUS: &str = "/v1.0/rewire/status";
/// The next id of a sequencer's key (rewire's own route).
pub const SEQUENCER: &str = "/v1.0/rewire/sequencer/{store}/{key}";
/// List a file store (rewire's own route).
pub const FILES: &str = "/v1.0/rewire/file/{store}";
/// Put, get, stat (HEAD) or delete one file (rewire's own route).
pub const FILE: &str = "/v1.0/rewire/file/{store}/{*name}";

/// The routes served without the app token (health probes).
pub const UNAUTHENTICATED: [&str; 2] = [HEALTHZ, HEALTHZ_OUTBOUND];

/// The routes serving admin data: they need the admin token (else the app
/// token), as the Lifecycle API does.
pub const ADMIN: [&str; 2] = [STATUS, METRICS];

/// Whether `route` is one of rewire's own (`/v1.0/rewire/…`), not Dapr's:
/// its path parameters keep a `+` as written, where Dapr's read a space.
pub fn is_rewires_own(route: &str) -> bool {
    route.starts_with("/v1.0/rewire/")
}
