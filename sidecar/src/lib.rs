//! rewire's sidecar: the Dapr-compatible gRPC and HTTP APIs, the Lifecycle
//! API, health, metrics and status, served over a [`rewire_runtime`]
//! runtime. Every call reaches components through the runtime's handles, so
//! a reload never fails a request.
//!
//! * [`dapr`]: one transport-neutral implementation per Dapr operation
//!   (typed store lookup, secret scrubbing, metadata from the generation).
//! * [`grpc`] and [`http`]: thin adapters from the wire to [`dapr`] and
//!   back (`tonic::Status`, Dapr's JSON errors).
//! * [`connection`]: both listeners' connections, capped, idle-timed and
//!   cut after the shutdown grace; accept errors backed off.
//! * [`reply_budget`]: the reply bytes held for clients that have not
//!   taken them, bounded per connection and per listener.
//! * [`tls`]: TLS on the listeners, mutual TLS, the Lifecycle API's
//!   client CA, certificates followed live.
//! * [`telemetry`]: distributed tracing (W3C trace context, OTLP export).
//! * [`ApiServer`]: both servers, bound and serving.

pub mod app;
pub mod auth;
mod clean_path;
pub mod connection;
mod crypto;
pub mod dapr;
pub mod grpc;
pub mod http;
pub mod in_flight;
pub mod metrics;
mod options;
mod pem_reason;
pub mod plain_http;
pub mod reply_budget;
pub mod result_code;
mod server;
pub mod slots;
pub mod telemetry;
pub mod tls;
pub mod upload_slots;

pub use auth::ApiToken;
pub use metrics::ApiMetrics;
pub use options::{ApiOptions, DEFAULT_GRPC_ADDR, DEFAULT_HTTP_ADDR, DRAIN_MARGIN};
pub use server::{ApiError, ApiServer, ApiState};
