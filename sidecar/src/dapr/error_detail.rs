//! Dapr's rich error details (dapr/kit `errors`): a `google.rpc.ErrorInfo`
//! (domain `dapr.io`, a reason such as `DAPR_STATE_NOT_FOUND`), with a
//! `google.rpc.ResourceInfo` naming the component, a `google.rpc.Help`
//! link and a `google.rpc.BadRequest` for a refused key where Dapr adds
//! them. The transports attach them, gRPC as the status's details, HTTP
//! as the error body's `details` array, in the order Dapr's builders add
//! them: `BadRequest`, `Help`, `ResourceInfo`, then `ErrorInfo` (dapr/kit
//! keeps call order; Dapr's `build()` adds the last two). Only errors
//! Dapr details carry one.

use std::collections::HashMap;

use rewire_runtime::echoed;

use super::pubsub::{PubSubOpError, ENTRY_ID_PROBLEM};
use super::state::StateOpError;

/// The `ErrorInfo` domain of every Dapr error.
pub const DAPR_DOMAIN: &str = "dapr.io";

/// The details of one error, as Dapr attaches them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorDetail {
    /// The `ErrorInfo` reason (`DAPR_STATE_ILLEGAL_KEY`...).
    pub reason: &'static str,
    /// The `ErrorInfo` metadata (empty: none).
    pub metadata: HashMap<String, String>,
    /// The `ResourceInfo`, when Dapr names the component.
    pub resource: Option<ResourceDetail>,
    /// The `BadRequest` field violation, when a field is refused.
    pub field_violation: Option<FieldViolation>,
    /// The `Help` link, where Dapr points to its documentation.
    pub help: Option<HelpLink>,
}

/// One `google.rpc.Help` link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HelpLink {
    /// What the link is for.
    pub description: &'static str,
    /// The address.
    pub url: &'static str,
}

/// A `google.rpc.ResourceInfo` (its owner is always empty, as Dapr's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceDetail {
    /// `state`, `pubsub`.
    pub resource_type: &'static str,
    /// The component's name.
    pub resource_name: String,
    /// Dapr leaves it empty for state stores and repeats the message for
    /// pub/subs.
    pub description: String,
}

/// One `google.rpc.BadRequest` field violation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldViolation {
    /// The refused field (for a key: the key, as [`echoed`]).
    pub field: String,
    /// Why.
    pub description: String,
}

impl ErrorDetail {
    fn new(reason: &'static str) -> Self {
        Self {
            reason,
            metadata: HashMap::new(),
            resource: None,
            field_violation: None,
            help: None,
        }
    }

    fn resource(mut self, resource_type: &'static str, name: &str, description: String) -> Self {
        self.resource = Some(ResourceDetail {
            resource_type,
            resource_name: name.to_string(),
            description,
        });
        self
    }

    fn metadata<const N: usize>(mut self, pairs: [(&str, String); N]) -> Self {
        self.metadata = pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        self
    }

    /// `{"appID": app_id}` as Dapr's `StateStoreError` metadata: none
    /// without an app id.
    fn app_id(self, app_id: &str) -> Self {
        if app_id.is_empty() {
            return self;
        }
        self.metadata([("appID", app_id.to_string())])
    }

    /// Dapr's `DAPR_STATE_NOT_FOUND` (no `ResourceInfo`; the sidecar's
    /// `appID`, as Dapr's `StateStoreError::NotFound`).
    pub fn state_store_not_found(app_id: &str) -> Self {
        Self::new("DAPR_STATE_NOT_FOUND").app_id(app_id)
    }

    /// Dapr's `DAPR_STATE_NOT_CONFIGURED` (no `ResourceInfo`; the
    /// sidecar's `appID`, as Dapr's `StateStoreError::NotConfigured`).
    pub fn state_stores_not_configured(app_id: &str) -> Self {
        Self::new("DAPR_STATE_NOT_CONFIGURED").app_id(app_id)
    }
}

/// The link Dapr's `TransactionsNotSupported` carries.
const STATE_STORE_FEATURES: HelpLink = HelpLink {
    description: "Check the list of state stores and the features they support",
    url: "https://docs.dapr.io/reference/components-reference/supported-state-stores/",
};

impl StateOpError {
    /// Dapr's details for this error, where Dapr attaches some.
    pub fn detail(&self) -> Option<ErrorDetail> {
        match self {
            Self::NotFound { app_id, .. } => Some(ErrorDetail::state_store_not_found(app_id)),
            Self::NotConfigured { app_id, .. } => {
                Some(ErrorDetail::state_stores_not_configured(app_id))
            }
            // Dapr's illegal key is its separator; an empty key is no
            // `ILLEGAL_KEY` there.
            Self::InvalidKey { store, key, .. } if !key.is_empty() => {
                let mut detail = ErrorDetail::new("DAPR_STATE_ILLEGAL_KEY").resource(
                    "state",
                    store,
                    String::new(),
                );
                // Cut again, whoever made the error: a status's details
                // travel in its trailers.
                detail.field_violation = Some(FieldViolation {
                    field: echoed(key).into_owned(),
                    description: self.to_string(),
                });
                Some(detail)
            }
            Self::TransactionsNotSupported(store) => {
                let mut detail = ErrorDetail::new("DAPR_STATE_TRANSACTIONS_NOT_SUPPORTED")
                    .resource("state", store, String::new());
                detail.help = Some(STATE_STORE_FEATURES);
                Some(detail)
            }
            Self::TooManyOperations { store, count, max } => Some(
                ErrorDetail::new("DAPR_STATE_TOO_MANY_TRANSACTIONS")
                    .metadata([
                        ("currentOpsTransaction", count.to_string()),
                        ("maxOpsPerTransaction", max.to_string()),
                    ])
                    .resource("state", store, String::new()),
            ),
            _ => None,
        }
    }
}

impl PubSubOpError {
    /// Dapr's details for this error, where Dapr attaches some (the
    /// `ResourceInfo` describes the pub/sub with the message, as Dapr's).
    pub fn detail(&self) -> Option<ErrorDetail> {
        let message = self.to_string();
        let detail = match self {
            Self::NameEmpty => {
                ErrorDetail::new("DAPR_PUBSUB_NAME_EMPTY").resource("pubsub", "", message)
            }
            // Dapr's `PubSubMetadataError::NotFound` skips the ResourceInfo.
            Self::NotFound(_) => ErrorDetail::new("DAPR_PUBSUB_NOT_FOUND"),
            Self::TopicEmpty(name) => {
                ErrorDetail::new("DAPR_PUBSUB_TOPIC_NAME_EMPTY").resource("pubsub", name, message)
            }
            // Dapr's `WithMetadata(metadata).DeserializeError`: the
            // request's metadata.
            Self::Metadata {
                pubsub, metadata, ..
            } => {
                let mut detail = ErrorDetail::new("DAPR_PUBSUB_METADATA_DESERIALIZATION")
                    .resource("pubsub", pubsub, message);
                detail.metadata = metadata.clone();
                detail
            }
            Self::EntryId { pubsub, app_id, .. } => ErrorDetail::new("DAPR_PUBSUB_MARSHAL_EVENTS")
                .metadata([
                    ("appID", app_id.clone()),
                    ("error", ENTRY_ID_PROBLEM.to_string()),
                ])
                .resource("pubsub", pubsub, message),
            Self::CloudEvent {
                pubsub,
                app_id,
                reason,
            } => ErrorDetail::new("DAPR_PUBSUB_CLOUD_EVENT_CREATION")
                .metadata([("appID", app_id.clone()), ("error", reason.clone())])
                .resource("pubsub", pubsub, message),
            Self::EventConversion {
                pubsub,
                app_id,
                reason,
                ..
            } => ErrorDetail::new("DAPR_PUBSUB_MARSHAL_ENVELOPE")
                .metadata([("appID", app_id.clone()), ("error", reason.clone())])
                .resource("pubsub", pubsub, message),
            Self::Busy {
                pubsub,
                topic,
                source,
            }
            | Self::Publish {
                pubsub,
                topic,
                source,
            } => ErrorDetail::new("DAPR_PUBSUB_PUBLISH_MESSAGE")
                .metadata([("topic", topic.clone()), ("error", source.to_string())])
                .resource("pubsub", pubsub, message),
            // The rest carry none here (yet).
            _ => return None,
        };
        Some(detail)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rewire_runtime::PubSubError;

    #[test]
    fn state_errors_carry_dapr_reasons() {
        let missing = StateOpError::NotFound {
            store: "orders".into(),
            app_id: "shop".into(),
        }
        .detail()
        .expect("detailed");
        assert_eq!(missing.reason, "DAPR_STATE_NOT_FOUND");
        assert_eq!(missing.metadata["appID"], "shop");
        let unsupported = StateOpError::TransactionsNotSupported("orders".into())
            .detail()
            .expect("detailed");
        assert_eq!(unsupported.help, Some(STATE_STORE_FEATURES));
        let key = StateOpError::InvalidKey {
            store: "orders".into(),
            key: "a||b".into(),
            index: None,
            problem: "input key `a||b` can't contain `||`".into(),
        };
        let detail = key.detail().expect("an illegal key is detailed");
        assert_eq!(detail.reason, "DAPR_STATE_ILLEGAL_KEY");
        let resource = detail.resource.expect("the store");
        assert_eq!(
            (resource.resource_type, resource.resource_name.as_str()),
            ("state", "orders")
        );
        assert_eq!(
            detail.field_violation.map(|f| f.field).as_deref(),
            Some("a||b")
        );
        let too_many = StateOpError::TooManyOperations {
            store: "orders".into(),
            count: 3,
            max: 2,
        };
        let detail = too_many.detail().expect("detailed");
        assert_eq!(detail.reason, "DAPR_STATE_TOO_MANY_TRANSACTIONS");
        assert_eq!(detail.metadata["currentOpsTransaction"], "3");
        assert_eq!(detail.metadata["maxOpsPerTransaction"], "2");
        let empty = StateOpError::InvalidKey {
            store: "orders".into(),
            key: String::new(),
            index: Some(0),
            problem: "\"key\" is a required field".into(),
        };
        assert_eq!(empty.detail(), None);
    }

    #[test]
    fn pubsub_errors_carry_dapr_reasons() {
        let missing = PubSubOpError::NotFound("events".into())
            .detail()
            .expect("detailed");
        assert_eq!(missing.reason, "DAPR_PUBSUB_NOT_FOUND");
        // As Dapr's `PubSubMetadataError::NotFound`: no ResourceInfo.
        assert_eq!(missing.resource, None);
        let mismatched = PubSubOpError::EventConversion {
            pubsub: "events".into(),
            app_id: "shop".into(),
            topic: "orders".into(),
            reason: "mismatch between contentType and event".into(),
        };
        let detail = mismatched.detail().expect("detailed");
        assert_eq!(detail.reason, "DAPR_PUBSUB_MARSHAL_ENVELOPE");
        assert_eq!(detail.metadata["appID"], "shop");
        let resource = detail.resource.expect("the pub/sub");
        assert_eq!(
            (resource.resource_type, resource.resource_name.as_str()),
            ("pubsub", "events")
        );
        assert_eq!(resource.description, mismatched.to_string());
        let failed = PubSubOpError::Publish {
            pubsub: "events".into(),
            topic: "orders".into(),
            source: PubSubError::Backend("down".into()),
        };
        // Dapr's `PublishMessage` wording.
        assert_eq!(
            failed.to_string(),
            "error when publishing to topic orders in pubsub events: down"
        );
        let detail = failed.detail().expect("detailed");
        assert_eq!(detail.reason, "DAPR_PUBSUB_PUBLISH_MESSAGE");
        assert_eq!(detail.metadata["topic"], "orders");
        assert!(detail.metadata["error"].contains("down"));
        let not_an_event = PubSubOpError::CloudEvent {
            pubsub: "events".into(),
            app_id: "shop".into(),
            reason: "not a JSON object".into(),
        };
        let detail = not_an_event.detail().expect("detailed");
        assert_eq!(detail.reason, "DAPR_PUBSUB_CLOUD_EVENT_CREATION");
        assert_eq!(detail.metadata["appID"], "shop");
        assert_eq!(
            PubSubOpError::NameEmpty.detail().map(|d| d.reason),
            Some("DAPR_PUBSUB_NAME_EMPTY")
        );
        let entry_id = PubSubOpError::EntryId {
            pubsub: "events".into(),
            topic: "orders".into(),
            app_id: "shop".into(),
        };
        assert_eq!(
            entry_id.to_string(),
            "error marshaling events to bytes for topic orders pubsub events. \
             error: entryId is duplicated or not present for entry"
        );
        let detail = entry_id.detail().expect("detailed");
        assert_eq!(detail.reason, "DAPR_PUBSUB_MARSHAL_EVENTS");
        assert_eq!(
            (
                detail.metadata["appID"].as_str(),
                detail.metadata["error"].as_str()
            ),
            ("shop", ENTRY_ID_PROBLEM)
        );
        assert_eq!(
            detail.resource.map(|r| r.resource_name).as_deref(),
            Some("events")
        );
        let metadata = PubSubOpError::Metadata {
            pubsub: "events".into(),
            reason: "rawPayload value must be a valid boolean: actual is 'x'".into(),
            metadata: HashMap::from([("rawPayload".to_string(), "x".to_string())]),
        };
        assert_eq!(
            metadata.to_string(),
            "failed deserializing metadata. Error: rawPayload value must be a valid boolean: actual is 'x'"
        );
        let detail = metadata.detail().expect("detailed");
        assert_eq!(detail.reason, "DAPR_PUBSUB_METADATA_DESERIALIZATION");
        assert_eq!(detail.metadata["rawPayload"], "x");
        assert_eq!(
            detail.resource.map(|r| r.resource_name).as_deref(),
            Some("events")
        );
        assert_eq!(
            PubSubOpError::TopicEmpty("events".into())
                .detail()
                .map(|d| d.reason),
            Some("DAPR_PUBSUB_TOPIC_NAME_EMPTY")
        );
    }
}
