//! Dapr's operations, once, for every transport.
//!
//! A transport adapter ([`crate::grpc`], [`crate::http`]) decodes its wire
//! format, opens a [`Call`] (one snapshot of the generation serving), finds
//! the store the request names through it (typed: [`Call::state_store`],
//! [`Call::secret_store`], [`Call::config_store`], [`Call::lock_store`]),
//! runs the operation and maps the domain result or error back to its wire
//! format. Everything Dapr-specific that is not a wire format lives here:
//! which store kind a name means, what an operation failure says, the
//! scrubbing of secret values from component errors, and the sidecar's
//! metadata built from the generation.
//!
//! Each area has its own error enum ([`StateOpError`], [`SecretOpError`],
//! [`ConfigOpError`], [`LockOpError`]); their messages are Dapr's gRPC
//! wording, and each adapter chooses its own codes (and, for HTTP, Dapr's
//! HTTP wording).

mod budget;
mod call;
mod configuration;
mod error_detail;
mod event_expiry;
mod file;
mod file_upload;
pub mod handover;
pub(crate) mod json_text;
mod lock;
mod metadata;
mod pubsub;
pub(crate) mod pubsub_bulk_event;
mod pubsub_delivery;
/// The delivery engine's test set-up, for the app's routes' tests.
#[cfg(test)]
pub(crate) use pubsub_delivery::tests as delivery_tests;
mod pubsub_event;
mod request_limits;
mod retry_rule;
mod secrets;
mod sequencer;
mod state;
mod state_transaction;

pub use crate::upload_slots::{UploadSlot, UploadSlots};
pub use budget::{json_string_bytes, OverBudget, ResponseBudget};
pub use call::{Call, StoreLabel};
pub(crate) use configuration::config_item_bytes;
pub use configuration::{ConfigOpError, ConfigOps};
pub use error_detail::{ErrorDetail, FieldViolation, ResourceDetail, DAPR_DOMAIN};
pub use file::{http_date, FileOpError, FileOps};
pub use file_upload::UploadError;
pub use lock::{LockOpError, LockOps};
pub use metadata::{
    dapr_component_type, metadata, AppConnection, ExtendedMetadata, ExtendedMetadataError,
    ListedSubscription, ProgrammaticSubscriptions, RegisteredComponent, SidecarMetadata,
    StreamListing, StreamingSubscriptions, SubscriptionOrigin, APP_MAX_CONCURRENCY,
    MAX_EXTENDED_METADATA_ENTRIES, MAX_EXTENDED_METADATA_KEY_BYTES,
    MAX_EXTENDED_METADATA_VALUE_BYTES,
};
pub use pubsub::{PubSubOpError, PubSubOps, PublishEvent};
pub(crate) use pubsub_delivery::logged;
pub use pubsub_delivery::{EventSink, TopicDelivery, ANSWER_WITHIN, MAX_ATTEMPTS};
pub use pubsub_event::{envelope, is_json, new_event_id, EnvelopeContext, TopicEvent};
pub use request_limits::{
    check_item_count, check_item_metadata, check_metadata_copies, check_request_metadata,
    collect_request_metadata, RequestLimitError, MAX_BULK_ITEMS, MAX_REQUEST_METADATA_BYTES,
    MAX_REQUEST_METADATA_ENTRIES,
};
pub use secrets::{exposed, SecretOpError, SecretOps};
pub use sequencer::{SequencerOpError, SequencerOps};
pub use state::{StateOpError, StateOps};
pub use state_transaction::{transaction_operation, MAX_TRANSACTION_OPERATIONS};
