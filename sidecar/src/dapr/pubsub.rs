//! Dapr's publish operations: one event (`PublishEvent`,
//! `POST /v1.0/publish`) and bulk (`BulkPublishEventAlpha1`), each wrapped
//! in a CloudEvent unless `metadata.rawPayload` is `true`, with Dapr's
//! validation messages.
//!
//! *Acknowledged publish*: the operation answers success only after the
//! broker took the message (memory: queued for every subscription of the
//! topic; redis: `XADD` succeeded). A broker replaced by a reload while the
//! publish was on its way refuses it as retired; the publish is then sent
//! to the broker now serving, so a reload never fails a publish.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use rewire_runtime::{echoed, Instance, Kind, PubSub, PubSubError, PublishRequest};

use super::call::Call;
use super::pubsub_event::{
    bulk_event_bytes, check_cloud_event, envelope, EnvelopeContext, NotACloudEvent,
    CLOUD_EVENT_CONTENT_TYPE,
};
use super::request_limits::{check_item_count, check_request_metadata, RequestLimitError};
use super::retry_rule;

mod bulk;

/// How many times a publish follows a broker replaced under it.
const RETIRED_RETRIES: usize = 3;

/// Why [`follow_retired`] published nothing.
pub(super) enum NotPublished {
    /// The pub/sub is no longer in the generation serving.
    Gone,
    /// The broker refused the publish (`Retired` past [`RETIRED_RETRIES`]).
    Refused(PubSubError),
}

/// Publishes with `publish` on `broker`; a broker replaced by a reload
/// meanwhile refuses it as retired, and it is published again on the one
/// `serving` gives now, up to [`RETIRED_RETRIES`] times: every publish of
/// the sidecar (an app's, a dead letter) survives a reload.
pub(super) async fn follow_retired<P, Fut>(
    mut broker: Arc<dyn PubSub>,
    serving: impl Fn() -> Option<Arc<dyn PubSub>>,
    publish: P,
) -> Result<(), NotPublished>
where
    P: Fn(Arc<dyn PubSub>) -> Fut,
    Fut: std::future::Future<Output = Result<(), PubSubError>>,
{
    let mut followed = 0;
    loop {
        match publish(broker).await {
            Err(PubSubError::Retired) if followed < RETIRED_RETRIES => {
                followed += 1;
                broker = serving().ok_or(NotPublished::Gone)?;
            }
            published => return published.map_err(NotPublished::Refused),
        }
    }
}

/// What Dapr's bulk publish says of an empty or repeated `entryId`.
pub(super) const ENTRY_ID_PROBLEM: &str = "entryId is duplicated or not present for entry";

/// Why a publish failed (messages in Dapr's wording).
#[derive(Debug, thiserror::Error)]
pub enum PubSubOpError {
    /// No pub/sub name given.
    #[error("pubsub name is empty")]
    NameEmpty,
    /// No pub/sub with that name in the call's generation (Dapr's
    /// wording since its standardized errors; the name as [`echoed`]).
    #[error("pubsub {0} is not found")]
    NotFound(String),
    /// No topic given.
    #[error("topic is empty in pubsub {0}")]
    TopicEmpty(String),
    /// A bulk entry's `entryId` is empty or repeats another's (Dapr's
    /// `MarshalEvents` message).
    #[error("error marshaling events to bytes for topic {topic} pubsub {pubsub}. error: {ENTRY_ID_PROBLEM}")]
    EntryId {
        /// The pub/sub.
        pubsub: String,
        /// The topic.
        topic: String,
        /// The publishing app (Dapr's details name it).
        app_id: String,
    },
    /// A payload sent as a CloudEvent (`application/cloudevents+json`)
    /// that is not a JSON object: Dapr's exact message (the reason is
    /// kept for the error's details).
    #[error("cannot create cloudevent")]
    CloudEvent {
        /// The pub/sub.
        pubsub: String,
        /// The publishing app (Dapr's details name it).
        app_id: String,
        /// Why the payload is not a CloudEvent.
        reason: String,
    },
    /// A bulk entry's `event` that does not fit its `contentType` (HTTP
    /// bulk publish, as Dapr's `ConvertEventToBytes`).
    #[error(
        "error when marshalling cloud event envelope for topic {topic} pubsub {pubsub}: {reason}"
    )]
    EventConversion {
        /// The pub/sub.
        pubsub: String,
        /// The publishing app (Dapr's details name it).
        app_id: String,
        /// The topic.
        topic: String,
        /// Dapr's reason (`error: mismatch between contentType and
        /// event`, ...).
        reason: String,
    },
    /// The request is over one of the sidecar's bounds.
    #[error(transparent)]
    Limit(#[from] RequestLimitError),
    /// Request metadata Dapr refuses (`rawPayload` that is not a Go
    /// boolean), in Dapr's `DeserializeError` wording.
    #[error("failed deserializing metadata. Error: {reason}")]
    Metadata {
        /// The pub/sub.
        pubsub: String,
        /// What is wrong.
        reason: String,
        /// The metadata refused (Dapr's details carry it).
        metadata: HashMap<String, String>,
    },
    /// The broker is full (publishes wait, then give up).
    #[error("error when publishing to topic {topic} in pubsub {pubsub}: {source}")]
    Busy {
        /// The pub/sub.
        pubsub: String,
        /// The topic.
        topic: String,
        /// Why (scrubbed).
        source: PubSubError,
    },
    /// The broker failed.
    #[error("error when publishing to topic {topic} in pubsub {pubsub}: {source}")]
    Publish {
        /// The pub/sub.
        pubsub: String,
        /// The topic.
        topic: String,
        /// Why (scrubbed).
        source: PubSubError,
    },
    /// The broker refused a subscription, or did not answer it in time.
    #[error("error when subscribing to topic {topic} in pubsub {pubsub}: {source}")]
    Subscribe {
        /// The pub/sub.
        pubsub: String,
        /// The topic.
        topic: String,
        /// Why (scrubbed).
        source: PubSubError,
    },
}

impl Call {
    /// The pub/sub `name` of the call's generation.
    pub fn pubsub(&self, name: &str) -> Result<PubSubOps, PubSubOpError> {
        if name.is_empty() {
            return Err(PubSubOpError::NameEmpty);
        }
        match self.instance(Kind::PubSub, name) {
            Some(Instance::PubSub(broker)) => Ok(PubSubOps {
                name: name.to_string(),
                broker: broker.clone(),
                call: self.clone(),
            }),
            _ => Err(PubSubOpError::NotFound(echoed(name).into_owned())),
        }
    }
}

/// One event to publish.
#[derive(Debug, Clone, Default)]
pub struct PublishEvent {
    /// The payload.
    pub data: Vec<u8>,
    /// Its content type (`data_content_type`, the HTTP `Content-Type`).
    pub content_type: Option<String>,
    /// Request metadata (`rawPayload`, ...).
    pub metadata: HashMap<String, String>,
    /// W3C `traceparent` of the request, if any.
    pub traceparent: Option<String>,
    /// W3C `tracestate` of the request, if any.
    pub tracestate: Option<String>,
}

impl PublishEvent {
    /// The payload of an HTTP bulk entry's JSON `event`, by its
    /// `contentType`, as Dapr's `ConvertEventToBytes`; Dapr's reason when
    /// the two do not fit.
    pub fn bulk_entry_data(
        event: serde_json::Value,
        content_type: &str,
    ) -> Result<Vec<u8>, String> {
        bulk_event_bytes(event, content_type)
    }
}

/// Dapr's publish operations on one pub/sub of a call's generation.
pub struct PubSubOps {
    name: String,
    broker: Arc<dyn PubSub>,
    call: Call,
}

impl PubSubOps {
    /// The pub/sub's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Publishes `event` to `topic`.
    pub async fn publish(&self, topic: &str, event: PublishEvent) -> Result<(), PubSubOpError> {
        let request = self.prepare(topic, event)?;
        self.publish_following(request).await
    }

    /// The broker's request for `event`: wrapped in a CloudEvent unless
    /// `rawPayload`.
    fn prepare(&self, topic: &str, event: PublishEvent) -> Result<PublishRequest, PubSubOpError> {
        if topic.is_empty() {
            return Err(PubSubOpError::TopicEmpty(self.name.clone()));
        }
        let raw = self.raw_payload(&event.metadata)?;
        let (data, content_type) = if raw {
            (event.data, event.content_type)
        } else {
            let cx = EnvelopeContext {
                app_id: self.call.generation().app_id(),
                pubsub_name: &self.name,
                topic,
                traceparent: event.traceparent.as_deref(),
                tracestate: event.tracestate.as_deref(),
                metadata: Some(&event.metadata),
            };
            let envelope = envelope(&event.data, event.content_type.as_deref(), &cx).map_err(
                |NotACloudEvent(reason)| PubSubOpError::CloudEvent {
                    pubsub: self.name.clone(),
                    app_id: cx.app_id.to_string(),
                    reason,
                },
            )?;
            (
                serde_json::to_vec(&envelope).unwrap_or_default(),
                Some(CLOUD_EVENT_CONTENT_TYPE.to_string()),
            )
        };
        Ok(PublishRequest {
            topic: topic.to_string(),
            data,
            content_type,
            metadata: event.metadata,
        })
    }

    /// Publishes on the call's broker; one replaced meanwhile refuses it as
    /// retired, and the publish goes to the one serving now. A topic the
    /// broker never takes ([`PubSub::check_topic`]: the redis pub/sub's
    /// holding `||`) is refused before the guarded call: decided with no
    /// contact with the backend, it is no verdict on it, and a half-open
    /// circuit breaker's trial is not spent (nor the breaker closed) on it.
    async fn publish_following(&self, request: PublishRequest) -> Result<(), PubSubOpError> {
        let runtime = self.call.runtime();
        let key = rewire_runtime::ComponentKey::new(Kind::PubSub, &self.name);
        let serving = || match runtime.generation().get(&key) {
            Some(Instance::PubSub(now)) => Some(now.clone()),
            _ => None,
        };
        let published = follow_retired(self.broker.clone(), serving, |broker| {
            let request = request.clone();
            async move {
                broker.check_topic(&request.topic)?;
                self.call
                    .guarded(
                        (Kind::PubSub, &self.name),
                        retry_rule::NEVER,
                        request,
                        |r| broker.publish(r),
                        PubSubError::Backend,
                    )
                    .await
            }
        })
        .await;
        match published {
            Ok(()) => Ok(()),
            Err(NotPublished::Gone) => Err(PubSubOpError::NotFound(self.name.clone())),
            Err(NotPublished::Refused(err @ PubSubError::Busy(_))) => Err(PubSubOpError::Busy {
                pubsub: self.name.clone(),
                topic: request.topic,
                source: self.scrubbed(err),
            }),
            Err(NotPublished::Refused(err)) => Err(PubSubOpError::Publish {
                pubsub: self.name.clone(),
                topic: request.topic,
                source: self.scrubbed(err),
            }),
        }
    }

    /// Checks a request's metadata against the sidecar's bounds.
    pub fn check_metadata(&self, metadata: &HashMap<String, String>) -> Result<(), PubSubOpError> {
        Ok(check_request_metadata(("pubsub", &self.name), metadata)?)
    }

    /// Checks the number of entries of a bulk publish against the
    /// sidecar's bound, before any is converted.
    pub fn check_entry_count(&self, count: usize) -> Result<(), PubSubOpError> {
        Ok(check_item_count(("pubsub", &self.name), count)?)
    }

    /// Publishes each of `entries` (`(entry_id, event)`), each with
    /// `request_metadata` under its own; the ids of the failed ones with
    /// their errors. No answer deadline of its own: a transport should
    /// give its call's `request_timeout` to [`bulk_publish_within`].
    ///
    /// [`bulk_publish_within`]: Self::bulk_publish_within
    pub async fn bulk_publish(
        &self,
        topic: &str,
        request_metadata: &HashMap<String, String>,
        entries: Vec<(String, PublishEvent)>,
    ) -> Result<Vec<(String, String)>, PubSubOpError> {
        self.bulk_publish_by(topic, request_metadata, entries, None)
            .await
    }

    /// Publishes each of `entries` (`(entry_id, event)`), each with
    /// `request_metadata` under its own; the ids of the failed ones with
    /// their errors. An empty or repeated `entryId`, or an entry sent as a
    /// CloudEvent that is not one, refuses the whole request before
    /// anything is published, as Dapr does: every entry is checked first,
    /// reading the metadata where it is, no copy made. Then the entries
    /// are published side by side, at most [`bulk::BULK_CONCURRENCY`] at
    /// once, each merged with `request_metadata` and enveloped when its
    /// publish starts (no more merged copies held than that). It answers
    /// a little before `request_timeout` (the call's bound) whatever the
    /// broker does, every entry not settled by then failed (see
    /// [`bulk`]), so the caller learns which entries went through.
    pub async fn bulk_publish_within(
        &self,
        topic: &str,
        request_metadata: &HashMap<String, String>,
        entries: Vec<(String, PublishEvent)>,
        request_timeout: Duration,
    ) -> Result<Vec<(String, String)>, PubSubOpError> {
        let answer_by = bulk::answer_by(tokio::time::Instant::now(), request_timeout);
        self.bulk_publish_by(topic, request_metadata, entries, answer_by)
            .await
    }

    /// [`bulk_publish_within`](Self::bulk_publish_within), answering by
    /// `answer_by` if given.
    async fn bulk_publish_by(
        &self,
        topic: &str,
        request_metadata: &HashMap<String, String>,
        entries: Vec<(String, PublishEvent)>,
        answer_by: Option<tokio::time::Instant>,
    ) -> Result<Vec<(String, String)>, PubSubOpError> {
        if topic.is_empty() {
            return Err(PubSubOpError::TopicEmpty(self.name.clone()));
        }
        self.check_entry_count(entries.len())?;
        self.check_metadata(request_metadata)?;
        self.raw_payload(request_metadata)?;
        if Self::first_bad_entry_id(entries.iter().map(|(id, _)| id.as_str())).is_some() {
            return Err(PubSubOpError::EntryId {
                pubsub: self.name.clone(),
                topic: topic.to_string(),
                app_id: self.call.generation().app_id().to_string(),
            });
        }
        self.check_entries(request_metadata, &entries)?;
        // A topic the broker never takes is the request's fault, refused
        // whole as a single publish is (not every entry failed).
        self.broker
            .check_topic(topic)
            .map_err(|source| PubSubOpError::Publish {
                pubsub: self.name.clone(),
                topic: topic.to_string(),
                source: self.scrubbed(source),
            })?;
        Ok(self
            .publish_entries(topic, request_metadata, entries, answer_by)
            .await)
    }

    /// Refuses a bulk publish whose entry, enveloped (its own `rawPayload`
    /// over the request's is not true), is sent as a CloudEvent that is
    /// not one. Reads the entries in place: nothing is merged or kept. An
    /// entry whose `rawPayload` is no boolean fails alone, when published.
    fn check_entries(
        &self,
        request_metadata: &HashMap<String, String>,
        entries: &[(String, PublishEvent)],
    ) -> Result<(), PubSubOpError> {
        for (_, event) in entries {
            let raw = event
                .metadata
                .get(RAW_PAYLOAD)
                .or_else(|| request_metadata.get(RAW_PAYLOAD));
            if parse_raw_payload(raw.map(String::as_str)) != Ok(false) {
                continue;
            }
            check_cloud_event(&event.data, event.content_type.as_deref()).map_err(
                |NotACloudEvent(reason)| PubSubOpError::CloudEvent {
                    pubsub: self.name.clone(),
                    app_id: self.call.generation().app_id().to_string(),
                    reason,
                },
            )?;
        }
        Ok(())
    }

    /// The index of the first bulk entry whose `entryId` is empty or
    /// repeats an earlier one's, if any (what [`bulk_publish`]
    /// refuses).
    ///
    /// [`bulk_publish`]: Self::bulk_publish
    pub fn first_bad_entry_id<'a>(ids: impl IntoIterator<Item = &'a str>) -> Option<usize> {
        let mut seen = HashSet::new();
        ids.into_iter()
            .position(|id| id.is_empty() || !seen.insert(id))
    }

    fn scrubbed(&self, error: PubSubError) -> PubSubError {
        match error {
            PubSubError::Invalid(m) => PubSubError::Invalid(self.call.scrub(&m)),
            PubSubError::Busy(m) => PubSubError::Busy(self.call.scrub(&m)),
            PubSubError::Backend(m) => PubSubError::Backend(self.call.scrub(&m)),
            PubSubError::Retired => PubSubError::Retired,
        }
    }
}

/// The metadata key asking for the payload as-is.
const RAW_PAYLOAD: &str = "rawPayload";

impl PubSubOps {
    /// Whether `metadata` asks for the payload as-is ([`parse_raw_payload`]);
    /// Dapr's `DeserializeError`, with the metadata, if it cannot be read.
    fn raw_payload(&self, metadata: &HashMap<String, String>) -> Result<bool, PubSubOpError> {
        parse_raw_payload(metadata.get(RAW_PAYLOAD).map(String::as_str)).map_err(|reason| {
            PubSubOpError::Metadata {
                pubsub: self.name.clone(),
                reason,
                metadata: metadata.clone(),
            }
        })
    }
}

/// A `rawPayload` value read as Dapr reads it: absent or empty is no, else
/// one of Go's `strconv.ParseBool` spellings (`1 t T TRUE true True`, `0 f
/// F FALSE false False`); anything else is refused, with Dapr's reason.
pub(super) fn parse_raw_payload(value: Option<&str>) -> Result<bool, String> {
    match value {
        None | Some("") => Ok(false),
        Some("1" | "t" | "T" | "TRUE" | "true" | "True") => Ok(true),
        Some("0" | "f" | "F" | "FALSE" | "false" | "False") => Ok(false),
        Some(other) => Err(format!(
            "rawPayload value must be a valid boolean: actual is '{other}'"
        )),
    }
}

/// The longest error text a failed bulk entry carries.
const MAX_ENTRY_ERROR: usize = 1024;

/// What a failed bulk entry says: the broker's own reason, as Dapr's
/// failed entries carry the component's error (not the request's topic,
/// which one request could make megabytes long and repeat per entry), cut
/// to [`MAX_ENTRY_ERROR`] bytes.
fn entry_error(err: &PubSubOpError) -> String {
    let mut text = match err {
        PubSubOpError::Publish { source, .. } | PubSubOpError::Busy { source, .. } => {
            source.to_string()
        }
        other => other.to_string(),
    };
    if text.len() > MAX_ENTRY_ERROR {
        let mut end = MAX_ENTRY_ERROR;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_bulk;
