//! CloudEvents 1.0 envelopes as Dapr builds them: on publish
//! ([`envelope`]) and, for a subscriber, the event a delivered message
//! reads as ([`TopicEvent::of`]).

use std::collections::hash_map::RandomState;
use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use rewire_runtime::config::SubscriptionRoutes;
use serde::de::DeserializeSeed as _;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::json_text::{normalised_raw, CheckedKind, JsonCheck, JsonKind, NormalisedJson, Wanted};
pub(super) use super::pubsub_bulk_event::bulk_event_bytes;

/// The `type` of events Dapr publishes.
pub const EVENT_TYPE: &str = "com.dapr.event.sent";
/// The content type of an envelope.
pub const CLOUD_EVENT_CONTENT_TYPE: &str = "application/cloudevents+json";

/// What goes into an envelope besides the payload.
#[derive(Debug, Clone, Default)]
pub struct EnvelopeContext<'a> {
    /// The publishing app (`source`).
    pub app_id: &'a str,
    /// The pub/sub component.
    pub pubsub_name: &'a str,
    /// The topic.
    pub topic: &'a str,
    /// W3C trace context of the publish, passed through.
    pub traceparent: Option<&'a str>,
    /// W3C trace state, passed through.
    pub tracestate: Option<&'a str>,
    /// The publish request's metadata: `cloudevent.id`,
    /// `cloudevent.source` and `cloudevent.type` replace the envelope's
    /// `id`, `source` and `type` (not for a payload that is itself a
    /// CloudEvent), and `ttlInSeconds` adds `expiration` (to any), as
    /// Dapr does.
    pub metadata: Option<&'a HashMap<String, String>>,
}

/// Whether `content_type` is JSON (`application/json`, `…+json`).
pub fn is_json(content_type: &str) -> bool {
    let essence = content_type.split(';').next().unwrap_or("").trim();
    essence.eq_ignore_ascii_case("application/json") || essence.ends_with("+json")
}

/// Whether `content_type` is `application/octet-stream`, the one type
/// Dapr puts in `data_base64`.
fn is_binary(content_type: &str) -> bool {
    let essence = content_type.split(';').next().unwrap_or("").trim();
    essence.eq_ignore_ascii_case("application/octet-stream")
}

/// Why a payload sent as a CloudEvent (`application/cloudevents+json`)
/// cannot be published: it does not begin with a JSON object.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct NotACloudEvent(pub String);

/// A CloudEvent as published, or as delivered: its members, written in
/// the order of their keys (as a `serde_json::Map` writes them). JSON data
/// and a CloudEvent's members are their text as sent, not a parsed tree
/// (which would hold up to ~90 times the text): a member is parsed only
/// where it is read ([`Self::text`], [`Self::parsed`], the parts of it a
/// route reads).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
#[serde(transparent)]
pub struct Envelope(BTreeMap<String, Member>);

impl Envelope {
    /// Whether the CloudEvent has the member `key`.
    pub fn contains_key(&self, key: &str) -> bool {
        self.0.contains_key(key)
    }

    /// The member `key`'s text, when it is a JSON string.
    pub fn text(&self, key: &str) -> Option<String> {
        self.0.get(key).and_then(member_text)
    }

    /// The members named by `keys` that it has, each parsed (for small
    /// members: `expiration`, an extension).
    pub fn parsed(&self, keys: &[&str]) -> Map<String, Value> {
        keys.iter()
            .filter_map(|key| Some((key.to_string(), self.0.get(*key)?.value()?)))
            .collect()
    }

    /// The parts of the members `wanted` names (see [`Wanted`]): a member
    /// named whole parsed, of another only what is named of it.
    fn wanted(&self, wanted: &Wanted) -> Map<String, Value> {
        if wanted.whole {
            return self
                .0
                .iter()
                .filter_map(|(key, member)| Some((key.clone(), member.value()?)))
                .collect();
        }
        wanted
            .members
            .iter()
            .filter_map(|(key, wanted)| Some((key.clone(), self.0.get(key)?.wanted(wanted)?)))
            .collect()
    }
}

/// A member of an [`Envelope`].
#[derive(Debug, Clone)]
enum Member {
    /// A string, escaped only as the envelope is written (so a text
    /// payload is held once, not also escaped).
    Text(String),
    /// JSON text as sent.
    Json(Box<RawValue>),
}

impl PartialEq for Member {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::Text(a), Self::Text(b)) => a == b,
            (Self::Json(a), Self::Json(b)) => a.get() == b.get(),
            _ => false,
        }
    }
}

impl Member {
    /// The member parsed (a string member as its string); `None` when it
    /// does not parse (none does: each was checked as JSON).
    fn value(&self) -> Option<Value> {
        match self {
            Self::Text(text) => Some(Value::String(text.clone())),
            Self::Json(raw) => {
                #[cfg(test)]
                tests::parsed_whole(raw.get());
                serde_json::from_str(raw.get()).ok()
            }
        }
    }

    /// Its kind, read without building it.
    fn kind(&self) -> Option<JsonKind> {
        match self {
            Self::Text(_) => Some(JsonKind::String),
            Self::Json(raw) => {
                let mut deserializer = serde_json::Deserializer::from_str(raw.get());
                JsonCheck::TOP.deserialize(&mut deserializer).ok()
            }
        }
    }

    /// The parts of it `wanted` names (see [`Wanted::read_from`]).
    fn wanted(&self, wanted: &Wanted) -> Option<Value> {
        match self {
            _ if wanted.whole => self.value(),
            Self::Text(_) => Some(Value::Null),
            Self::Json(_) if wanted.is_presence() => Some(Value::Null),
            Self::Json(raw) => wanted.read_from(raw.get()),
        }
    }

    /// The member as JSON text as a `Value` of it writes itself (compact,
    /// members by key, a repeated key's last value), written without
    /// building it.
    fn normalised(&self) -> Option<Vec<u8>> {
        match self {
            Self::Text(text) => serde_json::to_vec(text).ok(),
            Self::Json(raw) => {
                let mut out = Vec::with_capacity(raw.get().len());
                let mut deserializer = serde_json::Deserializer::from_str(raw.get());
                NormalisedJson { out: &mut out }
                    .deserialize(&mut deserializer)
                    .ok()?;
                Some(out)
            }
        }
    }

    /// Its text, when it is a JSON string (parsed as one string only).
    fn string(&self) -> Option<String> {
        member_text(self)
    }
}

impl serde::Serialize for Member {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Text(text) => serializer.serialize_str(text),
            Self::Json(raw) => raw.serialize(serializer),
        }
    }
}

/// A string member.
fn text_member(text: &str) -> Member {
    Member::Text(text.to_string())
}

/// A member's text, when it is a JSON string.
fn member_text(member: &Member) -> Option<String> {
    match member {
        Member::Text(text) => Some(text.clone()),
        Member::Json(raw) => serde_json::from_str(raw.get()).ok(),
    }
}

/// The CloudEvent Dapr publishes for `data` of `content_type` (default
/// `text/plain`, as Dapr's): JSON data is embedded as JSON (its text as
/// sent, checked as `serde_json::Value` reads it, see [`json_data`]),
/// `application/octet-stream` as `data_base64`, anything else as a string
/// (as Dapr; bytes that are not UTF-8, which Dapr would mangle, go to
/// `data_base64` instead). A payload that is itself a
/// CloudEvent (`application/cloudevents+json`, read as Dapr's
/// `IsCloudEventContentType`) keeps its fields, but for `topic` and
/// `pubsubname`, which name where it is published (as Dapr sets them); the
/// missing ones are filled in. Such a payload that does not begin with a
/// JSON object (malformed, an array, `null`, empty) is refused, as Dapr's
/// `FromCloudEvent` refuses it.
pub fn envelope(
    data: &[u8],
    content_type: Option<&str>,
    cx: &EnvelopeContext<'_>,
) -> Result<Envelope, NotACloudEvent> {
    let content_type = content_type.filter(|c| !c.is_empty());
    let given = match content_type {
        Some(c) if is_cloud_event_content_type(c) => Some(given_cloud_event(data)?),
        _ => None,
    };
    Ok(build_envelope(data, content_type, given, cx))
}

/// What [`envelope`] refuses of `data` of `content_type`, checked without
/// building anything: a payload sent as a CloudEvent that does not begin
/// with a JSON object.
pub fn check_cloud_event(data: &[u8], content_type: Option<&str>) -> Result<(), NotACloudEvent> {
    match content_type {
        Some(c) if !c.is_empty() && is_cloud_event_content_type(c) => {
            first_object_end(data).map(drop)
        }
        _ => Ok(()),
    }
}

/// Whether `content_type` is `application/cloudevents+json`, as Dapr's
/// `IsCloudEventContentType`: the whole type, or what precedes its first
/// `;`, in any case (no spaces trimmed).
pub(super) fn is_cloud_event_content_type(content_type: &str) -> bool {
    is_content_type(content_type, CLOUD_EVENT_CONTENT_TYPE)
}

/// Dapr's `isContentType`: `content_type` lowercased is `expected`, or
/// what precedes its first `;` is.
pub(super) fn is_content_type(content_type: &str, expected: &str) -> bool {
    let essence = content_type.split(';').next().unwrap_or_default();
    essence.eq_ignore_ascii_case(expected)
}

/// The fields of a payload sent as a CloudEvent: the first JSON value of
/// `data`, which must be an object (as Go's decoder, what follows it is
/// not read); each field is its JSON text as sent (no tree is built).
fn given_cloud_event(data: &[u8]) -> Result<BTreeMap<String, Box<RawValue>>, NotACloudEvent> {
    let end = first_object_end(data)?;
    // Checked as a `Value` reads it: its members read.
    serde_json::from_slice(&data[..end]).map_err(|err| NotACloudEvent(err.to_string()))
}

/// Where the first JSON value of `data` ends, when it is an object read
/// as a `Value` would be (the same errors otherwise), checked without
/// building it.
fn first_object_end(data: &[u8]) -> Result<usize, NotACloudEvent> {
    let mut values = serde_json::Deserializer::from_slice(data).into_iter::<CheckedKind>();
    match values.next() {
        Some(Ok(CheckedKind(JsonKind::Object))) => Ok(values.byte_offset()),
        Some(Ok(CheckedKind(other))) => Err(NotACloudEvent(format!(
            "a CloudEvent must be a JSON object, not {}",
            other.described()
        ))),
        Some(Err(err)) => Err(NotACloudEvent(err.to_string())),
        None => Err(NotACloudEvent("the CloudEvent is empty".into())),
    }
}

/// The envelope around `data`, or around the `given` CloudEvent's fields.
fn build_envelope(
    data: &[u8],
    content_type: Option<&str>,
    given: Option<BTreeMap<String, Box<RawValue>>>,
    cx: &EnvelopeContext<'_>,
) -> Envelope {
    let mut event = BTreeMap::new();
    let content_type = match given {
        Some(fields) => {
            // Each member as `Value` wrote it (a repeated key inside
            // `data` read once by every reader).
            event = fields
                .into_iter()
                .map(|(key, raw)| {
                    let member = normalised_raw(raw.get().as_bytes()).unwrap_or(raw);
                    (key, Member::Json(member))
                })
                .collect();
            event
                .get("datacontenttype")
                .and_then(member_text)
                .unwrap_or_else(|| "application/json".to_string())
        }
        None => {
            let content_type = content_type.unwrap_or("text/plain").to_string();
            put_data(&mut event, data, &content_type);
            if let Some(metadata) = cx.metadata {
                apply_overrides(&mut event, metadata);
            }
            content_type
        }
    };
    // As Dapr's ApplyMetadata: the TTL holds for a given CloudEvent too.
    if let Some(metadata) = cx.metadata {
        apply_ttl(&mut event, metadata);
    }
    let mut fill = |key: &str, value: &str| {
        event
            .entry(key.to_string())
            .or_insert_with(|| text_member(value));
    };
    fill("id", &new_event_id());
    fill("source", cx.app_id);
    fill("type", EVENT_TYPE);
    fill("specversion", "1.0");
    fill("datacontenttype", &content_type);
    fill("time", &rfc3339_now());
    if let Some(traceparent) = cx.traceparent {
        fill("traceid", traceparent);
        fill("traceparent", traceparent);
    }
    if let Some(tracestate) = cx.tracestate {
        fill("tracestate", tracestate);
    }
    event.insert("topic".into(), text_member(cx.topic));
    event.insert("pubsubname".into(), text_member(cx.pubsub_name));
    Envelope(event)
}

fn put_data(event: &mut BTreeMap<String, Member>, data: &[u8], content_type: &str) {
    if is_json(content_type) {
        if let Some(json) = json_data(data) {
            event.insert("data".into(), Member::Json(json));
            return;
        }
    }
    match std::str::from_utf8(data) {
        Ok(text) if !is_binary(content_type) => {
            event.insert("data".into(), text_member(text));
        }
        _ => {
            let encoded = base64::engine::general_purpose::STANDARD.encode(data);
            event.insert("data_base64".into(), Member::Text(encoded));
        }
    }
}

/// JSON data as embedded in an envelope, when `serde_json::Value` reads
/// it: written as `Value` wrote it (compact, members by key, a repeated
/// key's last value), as Dapr writes the value it decoded, so HTTP and
/// gRPC subscribers and route rules read one value; written without
/// building a tree, so it takes about its own size, not up to ~90 times.
fn json_data(data: &[u8]) -> Option<Box<RawValue>> {
    normalised_raw(data)
}

/// Go's `base64.StdEncoding` for decoding: padded, other bits of the last
/// symbol ignored.
pub(super) const GO_STD_BASE64: base64::engine::GeneralPurpose =
    base64::engine::GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        base64::engine::GeneralPurposeConfig::new()
            .with_decode_allow_trailing_bits(true)
            .with_decode_padding_mode(base64::engine::DecodePaddingMode::RequireCanonical),
    );

/// The most `ttlInSeconds` taken (Dapr's limit, a 32-bit count).
const MAX_TTL_SECONDS: u64 = 2_147_483_647;

/// Dapr's envelope overrides from publish metadata, for an envelope it
/// builds (not a given CloudEvent): `cloudevent.id`, `cloudevent.source`,
/// `cloudevent.type` (non-empty ones).
fn apply_overrides(event: &mut BTreeMap<String, Member>, metadata: &HashMap<String, String>) {
    for (key, field) in [
        ("cloudevent.id", "id"),
        ("cloudevent.source", "source"),
        ("cloudevent.type", "type"),
    ] {
        if let Some(value) = metadata.get(key).filter(|v| !v.is_empty()) {
            event.insert(field.into(), text_member(value));
        }
    }
}

/// `expiration` (now + `ttlInSeconds`, RFC 3339 UTC) for a positive
/// `ttlInSeconds`, on any envelope (as Dapr's `ApplyMetadata`); a
/// `ttlInSeconds` that is not one is ignored, as Dapr ignores it here.
fn apply_ttl(event: &mut BTreeMap<String, Member>, metadata: &HashMap<String, String>) {
    let ttl = metadata
        .get("ttlInSeconds")
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|ttl| (1..=MAX_TTL_SECONDS).contains(ttl));
    if let Some(ttl) = ttl {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        event.insert(
            "expiration".into(),
            text_member(&rewire_runtime::rfc3339_utc(now.saturating_add(ttl))),
        );
    }
}

/// A delivered message as its subscriber sees it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TopicEvent {
    /// The whole CloudEvent's members, each its JSON text (the message's,
    /// or the envelope's made around a payload): no tree is built of it
    /// on delivery (of a 4 MiB `[{"":0},…]` payload, ~380 MB), a member is
    /// parsed where it is read (`expiration`, the extensions, what the
    /// routes read: [`Self::routed_members`]).
    pub cloud_event: Envelope,
    /// `id`.
    pub id: String,
    /// `datacontenttype`.
    pub data_content_type: String,
    /// The payload bytes, as daprd fills a gRPC `TopicEventRequest`'s:
    /// `data_base64` decoded when the event has one; else `data` of a JSON
    /// content type (`application/json`, `…+json`, a CloudEvent's) as JSON
    /// text (a string too, quoted: its content type says the bytes are
    /// JSON), any other string as its bytes, other JSON as JSON text.
    pub data: Vec<u8>,
    /// Why the payload could not be read (a `data_base64` that is not
    /// base64, or not a string); `data` is then empty. Such an event is
    /// not sent over gRPC: it is retried, and dead-lettered once its
    /// retries run out, as daprd answers it with a retriable error. (An
    /// HTTP subscriber gets the CloudEvent as it is.)
    pub data_unreadable: Option<String>,
    /// The CloudEvent as an HTTP subscriber is sent it: the message's own
    /// bytes when it is one, as daprd posts them (re-serialised, a number
    /// past 64 bits would lose digits and a duplicate key be dropped);
    /// else the envelope made around the payload.
    pub body: Vec<u8>,
    /// The broker message's metadata, which daprd passes to the app as
    /// HTTP headers or gRPC metadata.
    pub metadata: HashMap<String, String>,
    /// The pub/sub of the subscription it is delivered on (not what the
    /// event's own text says: a dead-lettered event still names the topic
    /// it was first published to).
    pub pubsub_name: String,
    /// The topic of the subscription it is delivered on.
    pub topic: String,
    /// What its routes read of it, parsed once for all its rules and
    /// attempts ([`Self::routed_members`]).
    pub routed: RoutedMembers,
}

/// The members a subscription's routes read of an event, parsed (only the
/// parts they name), with what was read: kept for the delivery's later
/// attempts, read again only when the routes (reloaded) read other
/// fields. A cache: events compare equal whatever it holds.
#[derive(Default)]
pub struct RoutedMembers(Mutex<Option<RoutedRead>>);

/// What routes read of an event ([`RoutedMembers`]): the fields named, and
/// the members parsed with only those.
type RoutedRead = (Wanted, Arc<Map<String, Value>>);

impl RoutedMembers {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<RoutedRead>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Clone for RoutedMembers {
    fn clone(&self) -> Self {
        Self(Mutex::new(self.lock().clone()))
    }
}

impl PartialEq for RoutedMembers {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl std::fmt::Debug for RoutedMembers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RoutedMembers")
    }
}

impl TopicEvent {
    /// The event of a message delivered on a `rawPayload` subscription to
    /// `topic` of `pubsub_name`: whatever the message holds (a CloudEvent
    /// too) wrapped as Dapr's `FromRawPayload` wraps it: a new `id`,
    /// `source` `Dapr`, Dapr's `type`, `datacontenttype`
    /// `application/octet-stream`, the payload in `data_base64`.
    pub fn of_raw_payload(
        message: &rewire_runtime::Message,
        pubsub_name: &str,
        topic: &str,
    ) -> Self {
        let encoded = base64::engine::general_purpose::STANDARD.encode(&message.data);
        let cloud_event = Envelope(BTreeMap::from_iter([
            (
                "id".to_string(),
                Member::Text(delivered_event_id(message, pubsub_name)),
            ),
            ("specversion".to_string(), text_member("1.0")),
            (
                "datacontenttype".to_string(),
                text_member("application/octet-stream"),
            ),
            ("source".to_string(), text_member("Dapr")),
            ("type".to_string(), text_member(EVENT_TYPE)),
            ("topic".to_string(), text_member(&message.topic)),
            ("pubsubname".to_string(), text_member(pubsub_name)),
            ("data_base64".to_string(), Member::Text(encoded)),
        ]));
        let body = serde_json::to_vec(&cloud_event).unwrap_or_default();
        Self::of_cloud_event(cloud_event, body, message, pubsub_name, topic)
    }

    /// The event of a message delivered on the subscription to `topic` of
    /// `pubsub_name`: its CloudEvent, or (a raw payload) one made around
    /// it, as Dapr does for `rawPayload`. The message's members are read
    /// as text, and each checked as a `Value` reads it (on its own: a
    /// member as deep as the JSON limit, which an envelope around such
    /// data has, is read too); none is parsed into a tree here.
    pub fn of(message: &rewire_runtime::Message, pubsub_name: &str, topic: &str) -> Self {
        let parsed = serde_json::from_slice::<BTreeMap<String, Box<RawValue>>>(&message.data)
            .ok()
            .filter(|e| e.contains_key("specversion") && e.contains_key("id"))
            .and_then(checked_members);
        let (cloud_event, body) = match parsed {
            Some(event) => (event, message.data.clone()),
            None => {
                let cx = EnvelopeContext {
                    pubsub_name,
                    topic: &message.topic,
                    ..EnvelopeContext::default()
                };
                let content_type = message
                    .content_type
                    .as_deref()
                    .unwrap_or("application/octet-stream");
                // A raw payload that claims to be a CloudEvent but is not
                // one is delivered as data of its content type.
                let given = Some(content_type)
                    .filter(|c| is_cloud_event_content_type(c))
                    .and_then(|_| given_cloud_event(&message.data).ok());
                let given_id = given.as_ref().is_some_and(|g| g.contains_key("id"));
                let mut envelope = build_envelope(&message.data, Some(content_type), given, &cx);
                if !given_id {
                    // Each redelivery of the message carries the same id,
                    // so an app can tell it from a new message.
                    let id = delivered_event_id(message, pubsub_name);
                    envelope.0.insert("id".into(), Member::Text(id));
                }
                let body = serde_json::to_vec(&envelope).unwrap_or_default();
                (envelope, body)
            }
        };
        Self::of_cloud_event(cloud_event, body, message, pubsub_name, topic)
    }

    fn of_cloud_event(
        cloud_event: Envelope,
        body: Vec<u8>,
        message: &rewire_runtime::Message,
        pubsub_name: &str,
        topic: &str,
    ) -> Self {
        let text = |key: &str| cloud_event.text(key).unwrap_or_default();
        let data_content_type = text("datacontenttype");
        let (data, data_unreadable) = match payload_of(&cloud_event, &data_content_type) {
            Ok(data) => (data, None),
            Err(why) => (Vec::new(), Some(why)),
        };
        Self {
            id: text("id"),
            data_content_type,
            data,
            data_unreadable,
            body,
            metadata: message.metadata.clone(),
            cloud_event,
            pubsub_name: pubsub_name.to_string(),
            topic: topic.to_string(),
            routed: RoutedMembers::default(),
        }
    }

    /// The members `routes` read of the event, parsed: of each field a
    /// rule reads, its value, of one read by `has`, that it is there, and
    /// nothing else (a rule on `event.data.x` builds `x`, not `data`; one
    /// on `event.data` or `event` itself builds what it names, as it
    /// compares it). Read once for all the rules, and kept for the later
    /// attempts while the routes read the same fields. What routes
    /// choose ([`SubscriptionRoutes::path_for`]) from these members is
    /// what they choose from the whole event.
    pub fn routed_members(&self, routes: &SubscriptionRoutes) -> Arc<Map<String, Value>> {
        let mut wanted = Wanted::default();
        for matcher in routes.rules.iter().filter_map(|rule| rule.matcher.as_ref()) {
            for (path, whole) in matcher.fields_read() {
                wanted.add(path, whole);
            }
        }
        let mut routed = self.routed.lock();
        if let Some((read, members)) = routed.as_ref() {
            if *read == wanted {
                return members.clone();
            }
        }
        let members = Arc::new(self.cloud_event.wanted(&wanted));
        *routed = Some((wanted, members.clone()));
        members
    }

    /// The path `routes` choose for the event (see
    /// [`Self::routed_members`]).
    pub fn routed_path<'r>(&self, routes: &'r SubscriptionRoutes) -> Option<&'r str> {
        routes.path_for(&self.routed_members(routes))
    }

    /// `RETRY`, with a warning naming the event, when its payload cannot
    /// be read ([`Self::data_unreadable`]): what a gRPC subscriber's sink
    /// answers instead of sending it.
    pub fn unreadable_over_grpc(&self) -> Option<rewire_runtime::DeliveryOutcome> {
        let why = self.data_unreadable.as_deref()?;
        tracing::warn!(
            id = %super::logged(&self.id),
            pubsub = %super::logged(&self.pubsub_name),
            topic = %super::logged(&self.topic),
            reason = why,
            "The event's payload cannot be read: it is not sent to the gRPC subscriber, \
             and is retried (then dead-lettered, as Dapr)."
        );
        Some(rewire_runtime::DeliveryOutcome::Retry)
    }

    /// A field of the CloudEvent, as text.
    pub fn field(&self, key: &str) -> String {
        self.cloud_event.text(key).unwrap_or_default()
    }

    /// The CloudEvent's `expiration`, when it is a string: read as one
    /// string only, so one that is no string (an array of megabytes) is
    /// refused at its first byte, not built.
    pub fn expiration(&self) -> Option<String> {
        self.cloud_event.text("expiration")
    }

    /// The CloudEvent's fields other than those a gRPC `TopicEventRequest`
    /// has its own for (`id`, `source`, `type`, `specversion`,
    /// `datacontenttype`, `data`, `data_base64`): its `extensions`, as
    /// Dapr fills them (`traceparent`, `traceid`, `tracestate`, `topic`,
    /// `pubsubname`, the publisher's own fields).
    pub fn extensions(&self) -> prost_types::Struct {
        const OWN_FIELDS: [&str; 7] = [
            "id",
            "source",
            "type",
            "specversion",
            "datacontenttype",
            "data",
            "data_base64",
        ];
        let fields = self
            .cloud_event
            .0
            .iter()
            .filter(|(key, _)| !OWN_FIELDS.contains(&key.as_str()))
            .filter_map(|(key, member)| Some((key.clone(), protobuf_value(&member.value()?))))
            .collect();
        prost_types::Struct { fields }
    }
}

/// A CloudEvent's `members` as their text, when each is JSON a `Value`
/// reads (checked on its own, as it was parsed on its own); `None` when
/// one is not.
fn checked_members(members: BTreeMap<String, Box<RawValue>>) -> Option<Envelope> {
    members
        .into_iter()
        .map(|(key, raw)| {
            let mut deserializer = serde_json::Deserializer::from_str(raw.get());
            JsonCheck::TOP.deserialize(&mut deserializer).ok()?;
            deserializer.end().ok()?;
            Some((key, Member::Json(raw)))
        })
        .collect::<Option<_>>()
        .map(Envelope)
}

/// The payload of `event` (see [`TopicEvent::data`]), as daprd's
/// `GRPCEnvelopeFromSubscriptionMessage` reads it; why not, when its
/// `data_base64` cannot be read. JSON data is written as a `Value` of it
/// writes itself, without building one.
fn payload_of(event: &Envelope, content_type: &str) -> Result<Vec<u8>, String> {
    let kind = |key: &str| event.0.get(key).map(|m| (m, m.kind()));
    match (kind("data_base64"), kind("data")) {
        (Some((encoded, Some(JsonKind::String))), _) => {
            let encoded = encoded.string().unwrap_or_default();
            // Go's decoder skips line breaks.
            let encoded = encoded.replace(['\r', '\n'], "");
            GO_STD_BASE64
                .decode(encoded)
                .map_err(|err| format!("its `data_base64` is not base64 ({err})"))
        }
        (Some((_, Some(JsonKind::Null))) | None, None | Some((_, Some(JsonKind::Null)))) => {
            Ok(Vec::new())
        }
        (Some((_, Some(JsonKind::Null))) | None, Some((text, Some(JsonKind::String))))
            if !is_json(content_type) && !is_cloud_event_content_type(content_type) =>
        {
            Ok(text.string().unwrap_or_default().into_bytes())
        }
        (Some((_, Some(JsonKind::Null))) | None, Some((json, _))) => {
            Ok(json.normalised().unwrap_or_default())
        }
        (Some((_, kind)), _) => Err(format!(
            "its `data_base64` is {}, not a string",
            kind.map_or("not JSON", JsonKind::described)
        )),
    }
}

/// A JSON value as a protobuf `Value` (as deep as the JSON, which the
/// parser bounds).
fn protobuf_value(value: &Value) -> prost_types::Value {
    use prost_types::value::Kind;
    let kind = match value {
        Value::Null => Kind::NullValue(0),
        Value::Bool(b) => Kind::BoolValue(*b),
        Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or_default()),
        Value::String(s) => Kind::StringValue(s.clone()),
        Value::Array(items) => Kind::ListValue(prost_types::ListValue {
            values: items.iter().map(protobuf_value).collect(),
        }),
        Value::Object(fields) => Kind::StructValue(prost_types::Struct {
            fields: fields
                .iter()
                .map(|(key, value)| (key.clone(), protobuf_value(value)))
                .collect(),
        }),
    };
    prost_types::Value { kind: Some(kind) }
}

/// A new random id in the form of a UUID.
pub fn new_event_id() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let state = RandomState::new();
    let mut words = [0u64; 2];
    for (i, word) in words.iter_mut().enumerate() {
        let mut hasher = state.build_hasher();
        hasher.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
        hasher.write_usize(i);
        hasher.write_u128(
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        *word = hasher.finish();
    }
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&words[0].to_be_bytes());
    bytes[8..].copy_from_slice(&words[1].to_be_bytes());
    uuid_form(&bytes, '4')
}

/// The id of the envelope made around a delivered `message` that is not
/// a CloudEvent (or is delivered as a raw payload): the same at every
/// redelivery of the message, unlike Dapr's new id each time, so an app
/// de-duplicating by id sees a redelivery for what it is. Made from the
/// pub/sub, the topic, the broker's message id and the payload (a broker
/// switched to another server may reuse an id for another message), in
/// the form of a name-based UUID; a message without a broker id gets a
/// new random one.
fn delivered_event_id(message: &rewire_runtime::Message, pubsub_name: &str) -> String {
    if message.id.is_empty() {
        return new_event_id();
    }
    let mut digest = ring::digest::Context::new(&ring::digest::SHA256);
    for part in [
        pubsub_name.as_bytes(),
        message.topic.as_bytes(),
        message.id.as_bytes(),
        message.content_type.as_deref().unwrap_or("").as_bytes(),
        &message.data,
    ] {
        digest.update(&(part.len() as u64).to_be_bytes());
        digest.update(part);
    }
    let hash = digest.finish();
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&hash.as_ref()[..16]);
    uuid_form(&bytes, '5')
}

/// `bytes` in the form of a UUID of `version` (`'4'` random, `'5'`
/// name-based): lowercase hex in groups of 8-4-4-4-12, the version digit
/// in place of the 13th hex digit and `a` (the RFC 4122 variant) in place
/// of the 17th.
fn uuid_form(bytes: &[u8; 16], version: char) -> String {
    let hex: String = bytes.iter().map(|byte| format!("{byte:02x}")).collect();
    format!(
        "{}-{}-{version}{}-a{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[13..16],
        &hex[17..20],
        &hex[20..32]
    )
}

/// Now, as RFC 3339 UTC with seconds.
fn rfc3339_now() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    rewire_runtime::rfc3339_utc(secs)
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::*;

    thread_local! {
        /// The JSON members parsed whole on this thread, as their text.
        static PARSED_WHOLE: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
    }

    /// Records that the JSON member `text` is parsed whole.
    pub(super) fn parsed_whole(text: &str) {
        PARSED_WHOLE.with(|parsed| parsed.borrow_mut().push(text.to_string()));
    }

    /// The JSON members parsed whole on this thread since the last call.
    fn taken_parsed_whole() -> Vec<String> {
        PARSED_WHOLE.with(|parsed| std::mem::take(&mut *parsed.borrow_mut()))
    }

    /// Routes of `rules` (`match`, path), with the default `/default`.
    fn routes(rules: &[(&str, &str)]) -> SubscriptionRoutes {
        SubscriptionRoutes {
            rules: rules
                .iter()
                .map(|(matcher, path)| rewire_runtime::config::RouteRule {
                    matcher: Some(
                        rewire_runtime::config::RouteMatch::parse(matcher).expect("a match"),
                    ),
                    path: path.to_string(),
                })
                .collect(),
            default: Some("/default".into()),
        }
    }

    /// A delivered event's `data` is held as its text: delivering it (its
    /// HTTP body, its gRPC fields, its extensions, its expiry, routes on
    /// other fields) parses no tree of it; a rule on `event.data.x` builds
    /// `x` only, once for all the rules and attempts.
    #[test]
    fn delivered_data_is_held_as_text_and_routes_build_only_what_they_read() {
        let objects = vec![r#"{"":0}"#; 1000].join(",");
        let data = format!(r#"{{"x":{{"tier":"gold"}},"items":[{objects}]}}"#);
        let message = rewire_runtime::Message {
            data: format!(
                r#"{{"specversion":"1.0","id":"e1","source":"s","type":"t","datacontenttype":"application/json","data":{data},"prio":3}}"#
            )
            .into_bytes(),
            ..Default::default()
        };
        taken_parsed_whole();
        let event = TopicEvent::of(&message, "pubsub", "orders");
        assert!(
            matches!(event.cloud_event.0.get("data"), Some(Member::Json(raw)) if raw.get() == data),
            "held as its text"
        );
        assert_eq!(event.body, message.data);
        let normalised = serde_json::from_str::<Value>(&data)
            .expect("JSON")
            .to_string();
        assert!(
            event.data == normalised.as_bytes(),
            "the gRPC data as before"
        );
        let _ = (
            event.extensions(),
            event.field("type"),
            event.cloud_event.parsed(&["expiration"]),
        );
        let by_type = routes(&[
            ("event.type == 'u'", "/u"),
            ("has(event.data) && event.prio > 2", "/p"),
        ]);
        assert_eq!(event.routed_path(&by_type), Some("/p"));
        assert!(
            taken_parsed_whole()
                .iter()
                .all(|text| !text.contains("items")),
            "no tree of `data` built"
        );
        assert!(
            !event.routed_members(&by_type)["data"].is_object(),
            "only that it is there"
        );

        let by_data = routes(&[
            ("event.data.x.tier == 'silver'", "/silver"),
            ("event.data.x.tier == 'gold'", "/gold"),
            ("has(event.data.items)", "/items"),
        ]);
        for _attempt in 0..3 {
            assert_eq!(event.routed_path(&by_data), Some("/gold"));
        }
        let members = event.routed_members(&by_data);
        assert_eq!(
            members["data"],
            serde_json::json!({"x": {"tier": "gold"}, "items": null}),
            "`x.tier` built, `items` only found"
        );
        assert!(
            Arc::ptr_eq(&members, &event.routed_members(&by_data)),
            "read once"
        );
        assert!(taken_parsed_whole().is_empty(), "no member parsed whole");

        // A rule on `event.data` itself compares it: it is built.
        let whole = routes(&[("event.data == event.data", "/whole")]);
        assert_eq!(event.routed_path(&whole), Some("/whole"));
        assert_eq!(taken_parsed_whole(), [data]);
    }

    /// What subscribers receive of an event (the HTTP body, the gRPC
    /// fields) is what it was when the whole event was parsed into a
    /// `Value`: checked against that, for JSON data (with whitespace,
    /// repeated keys, long numbers), text, binary, a given CloudEvent and
    /// a raw payload.
    #[test]
    fn what_subscribers_receive_is_what_the_parsed_event_gave() {
        let cloud_event = |data: &str, content_type: &str| {
            format!(
                r#"{{"specversion":"1.0","id":"e1","source":"s","type":"t","datacontenttype":"{content_type}","data":{data}, "traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01","ext":{{"b":[1, 2.50],"a":null}}}}"#
            )
        };
        let messages: Vec<(Vec<u8>, Option<&str>)> = vec![
            (cloud_event(r#"{"z": 1, "a": [1.0, 1e2], "k":1, "k":2}"#, "application/json").into_bytes(), None),
            (cloud_event(" \"quoted\" ", "application/json").into_bytes(), None),
            (cloud_event(r#""plain text""#, "text/plain").into_bytes(), None),
            (cloud_event(r#"12345678901234567890123"#, "application/json").into_bytes(), None),
            (br#"{"specversion":"1.0","id":"b","data_base64":"/wA=","datacontenttype":"application/octet-stream"}"#.to_vec(), None),
            (br#"{"specversion":"1.0","id":"n","data_base64":null,"data":{"b":1,"a":2}}"#.to_vec(), None),
            (br#"{"specversion":"1.0","id":"x","data_base64":[1]}"#.to_vec(), None),
            (br#"{"id":"mine", "data": {"z": 1, "a": [2.50]}, "ext": [ 1 ]}"#.to_vec(), Some(CLOUD_EVENT_CONTENT_TYPE)),
            (br#" {"a" : [1, 2]} "#.to_vec(), Some("application/json")),
            (b"hello".to_vec(), Some("text/plain")),
            (vec![0xff, 0], Some("application/octet-stream")),
            (b"{not json".to_vec(), Some("application/json")),
        ];
        for (data, content_type) in messages {
            let message = rewire_runtime::Message {
                topic: "orders".into(),
                data,
                content_type: content_type.map(Into::into),
                metadata: HashMap::from([("k".to_string(), "v".to_string())]),
                ..Default::default()
            };
            let label = String::from_utf8_lossy(&message.data).to_string();
            for raw_payload in [false, true] {
                let event = match raw_payload {
                    true => TopicEvent::of_raw_payload(&message, "pubsub", "orders"),
                    false => TopicEvent::of(&message, "pubsub", "orders"),
                };
                // The whole event parsed, as it was held before.
                let parsed: Map<String, Value> =
                    serde_json::from_slice(&event.body).expect("the body is JSON");
                let expected_payload = expected_payload(&parsed);
                assert_eq!(
                    (event.data.clone(), event.data_unreadable.is_some()),
                    (
                        expected_payload.clone().unwrap_or_default(),
                        expected_payload.is_none()
                    ),
                    "{label}"
                );
                let text = |key: &str| {
                    parsed
                        .get(key)
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_string()
                };
                assert_eq!(event.id, text("id"), "{label}");
                assert_eq!(event.data_content_type, text("datacontenttype"), "{label}");
                for key in ["source", "type", "specversion", "traceparent", "tracestate"] {
                    assert_eq!(event.field(key), text(key), "{label} {key}");
                }
                let mut extensions: Vec<_> = event.extensions().fields.into_iter().collect();
                extensions.sort_by(|a, b| a.0.cmp(&b.0));
                let expected: Vec<_> = parsed
                    .iter()
                    .filter(|(key, _)| {
                        ![
                            "id",
                            "source",
                            "type",
                            "specversion",
                            "datacontenttype",
                            "data",
                            "data_base64",
                        ]
                        .contains(&key.as_str())
                    })
                    .map(|(key, value)| (key.clone(), protobuf_value(value)))
                    .collect();
                assert_eq!(extensions, expected, "{label}");
                if raw_payload {
                    // Written as the parsed map of its strings was.
                    let written = serde_json::to_vec(&parsed).expect("JSON");
                    assert_eq!(event.body, written, "{label}");
                }
                if !raw_payload
                    && serde_json::from_slice::<Map<String, Value>>(&message.data)
                        .is_ok_and(|e| e.contains_key("id") && e.contains_key("specversion"))
                {
                    assert_eq!(event.body, message.data, "{label}: posted as it came");
                }
            }
        }
    }

    /// The payload as it was read from the parsed event (the code this
    /// replaced): `None` when unreadable.
    fn expected_payload(event: &Map<String, Value>) -> Option<Vec<u8>> {
        let content_type = event
            .get("datacontenttype")
            .and_then(Value::as_str)
            .unwrap_or_default();
        match (event.get("data_base64"), event.get("data")) {
            (Some(Value::String(encoded)), _) => {
                GO_STD_BASE64.decode(encoded.replace(['\r', '\n'], "")).ok()
            }
            (Some(Value::Null) | None, None | Some(Value::Null)) => Some(Vec::new()),
            (Some(Value::Null) | None, Some(Value::String(text)))
                if !is_json(content_type) && !is_cloud_event_content_type(content_type) =>
            {
                Some(text.as_bytes().to_vec())
            }
            (Some(Value::Null) | None, Some(json)) => Some(json.to_string().into_bytes()),
            (Some(_), _) => None,
        }
    }

    #[test]
    fn extensions_are_the_fields_a_topic_event_request_has_none_for() {
        let message = rewire_runtime::Message {
            data: serde_json::json!({
                "specversion": "1.0", "id": "e1", "source": "s", "type": "t",
                "datacontenttype": "application/json", "data": {"n": 1},
                "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
                "tracestate": "k=v", "priority": 3, "tags": ["a", null, {"deep": true}]
            })
            .to_string()
            .into_bytes(),
            ..Default::default()
        };
        let extensions = TopicEvent::of(&message, "pubsub", "orders").extensions();
        let mut keys: Vec<_> = extensions.fields.keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(keys, ["priority", "tags", "traceparent", "tracestate"]);
        use prost_types::value::Kind;
        assert_eq!(
            extensions.fields["traceparent"].kind,
            Some(Kind::StringValue(
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into()
            ))
        );
        assert_eq!(
            extensions.fields["priority"].kind,
            Some(Kind::NumberValue(3.0))
        );
        let Some(Kind::ListValue(tags)) = &extensions.fields["tags"].kind else {
            panic!("a list");
        };
        assert_eq!(tags.values.len(), 3);
    }

    /// The envelope [`super::envelope`] makes, as JSON (to read fields).
    fn envelope(
        data: &[u8],
        content_type: Option<&str>,
        cx: &EnvelopeContext<'_>,
    ) -> Result<Value, NotACloudEvent> {
        super::envelope(data, content_type, cx).map(|e| serde_json::to_value(e).expect("JSON"))
    }

    fn cx() -> EnvelopeContext<'static> {
        EnvelopeContext {
            app_id: "checkout",
            pubsub_name: "pubsub",
            topic: "orders",
            traceparent: Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
            tracestate: None,
            metadata: None,
        }
    }

    /// JSON data is spliced into the envelope as the text sent (checked,
    /// not parsed into a tree: a 4 MiB body of `{"":0}` objects would
    /// be ~380 MB of nodes), the envelope's own members as before, in key
    /// order; a subscriber reads the same JSON.
    #[test]
    fn json_data_is_embedded_as_sent_without_a_tree() {
        let sent = r#"{"z": [1.0, 1e2, 12345678901234567890123], "a": {"k":1,"k":2}}"#;
        let raw = json_data(format!(" {sent}\n").as_bytes()).expect("JSON data");
        let parsed: Value = serde_json::from_str(sent).expect("JSON");
        let written = parsed.to_string();
        assert_eq!(
            raw.get(),
            written,
            "as `Value` wrote it: one `k`, members by key"
        );

        let published =
            super::envelope(sent.as_bytes(), Some("application/json"), &cx()).expect("envelope");
        let bytes = serde_json::to_vec(&published).expect("JSON");
        let text = String::from_utf8_lossy(&bytes);
        let data_at = text.find(r#""data":"#).expect("data");
        assert!(
            text[data_at..].starts_with(&format!(r#""data":{written},"#)),
            "{text}"
        );
        assert!(
            text.starts_with(r#"{"data":"#),
            "members in key order: {text}"
        );
        assert!(
            text.contains(r#","datacontenttype":"application/json","#),
            "{text}"
        );

        let delivered = TopicEvent::of(
            &rewire_runtime::Message {
                data: bytes.clone(),
                ..Default::default()
            },
            "pubsub",
            "orders",
        );
        assert_eq!(delivered.body, bytes, "delivered as published");
        assert_eq!(delivered.cloud_event.parsed(&["data"])["data"], parsed);
        assert_eq!(delivered.data, parsed.to_string().into_bytes());

        // What `Value` refuses stays text, as before.
        for refused in ["1e400", r#""\ud800""#, "[1] x", "{\"a\" 1}"] {
            assert!(json_data(refused.as_bytes()).is_none(), "{refused}");
            let event =
                envelope(refused.as_bytes(), Some("application/json"), &cx()).expect("an envelope");
            assert_eq!(event["data"], refused, "{refused}");
        }
    }

    /// A given CloudEvent's members are kept as sent too.
    #[test]
    fn a_given_cloud_event_has_its_members_written_as_value_wrote_them() {
        let given = r#"{"id":"mine", "data": {"z": 1, "a": [2.50], "z": 3}, "ext": [ 1 ]}"#;
        let envelope = super::envelope(given.as_bytes(), Some(CLOUD_EVENT_CONTENT_TYPE), &cx())
            .expect("an envelope");
        let text = String::from_utf8(serde_json::to_vec(&envelope).expect("JSON")).expect("UTF-8");
        assert!(text.contains(r#""data":{"a":[2.5],"z":3},"#), "{text}");
        assert!(text.contains(r#""ext":[1],"#), "{text}");
        assert!(text.contains(r#""id":"mine","#), "{text}");
    }

    /// A repeated key inside JSON data is one value to every reader: the
    /// HTTP subscriber's body, the gRPC subscriber's data and the route
    /// rules (as sent, readers that take a key's first value read another
    /// value than those that take its last).
    #[test]
    fn a_repeated_key_in_json_data_reads_alike_for_every_subscriber() {
        for content_type in ["application/json", CLOUD_EVENT_CONTENT_TYPE] {
            let sent = match content_type {
                "application/json" => r#"{"amount":1,"amount":1000}"#.to_string(),
                _ => r#"{"id":"e","data":{"amount":1,"amount":1000}}"#.to_string(),
            };
            let published =
                super::envelope(sent.as_bytes(), Some(content_type), &cx()).expect("envelope");
            let bytes = serde_json::to_vec(&published).expect("JSON");
            let delivered = TopicEvent::of(
                &rewire_runtime::Message {
                    data: bytes,
                    ..Default::default()
                },
                "pubsub",
                "orders",
            );
            let body = String::from_utf8(delivered.body.clone()).expect("UTF-8");
            assert!(
                body.contains(r#""data":{"amount":1000}"#),
                "{content_type}: {body}"
            );
            assert_eq!(delivered.data, br#"{"amount":1000}"#, "{content_type}");
        }
    }

    /// An object opening with serde_json's raw value marker is no JSON
    /// data: a subscriber's `serde_json::Value` would read it as the JSON
    /// its string holds, every other reader as the object.
    #[test]
    fn data_opening_with_serde_jsons_raw_value_marker_is_text() {
        let sent = r#"{"$serde_json::private::RawValue":"{\"amount\":1}"}"#;
        assert!(json_data(sent.as_bytes()).is_none());
        // Anywhere: written by key, it would open the object.
        assert!(json_data(br#"{"b":1,"$serde_json::private::RawValue":"x"}"#).is_none());
        let given = br#"{"specversion":"1.0","id":"x","$serde_json::private::RawValue":"1"}"#;
        assert!(envelope(given, Some(CLOUD_EVENT_CONTENT_TYPE), &cx()).is_err());
        let event = envelope(sent.as_bytes(), Some("application/json"), &cx()).expect("envelope");
        assert_eq!(event["data"], Value::String(sent.to_string()));
    }

    /// Data as deep as serde_json reads (127 levels) makes an envelope one
    /// level deeper: its members are read one by one, so it is delivered
    /// as the CloudEvent it is (it was wrapped again, as a payload).
    #[test]
    fn an_envelope_around_data_as_deep_as_json_allows_is_delivered_as_itself() {
        let deepest = format!("{}{}", "[".repeat(127), "]".repeat(127));
        let event =
            envelope(deepest.as_bytes(), Some("application/json"), &cx()).expect("an envelope");
        assert!(event["data"].is_array(), "embedded as JSON");
        let message = rewire_runtime::Message {
            data: serde_json::to_vec(&event).expect("JSON"),
            content_type: Some(CLOUD_EVENT_CONTENT_TYPE.into()),
            ..Default::default()
        };
        let delivered = TopicEvent::of(&message, "pubsub", "orders");
        assert_eq!(delivered.id, event["id"].as_str().expect("an id"));
        assert_eq!(delivered.data, deepest.as_bytes());
    }

    #[test]
    fn json_data_is_embedded_and_the_fields_are_daprs() {
        let event = envelope(br#"{"a":1}"#, Some("application/json"), &cx()).expect("an envelope");
        assert_eq!(event["data"], serde_json::json!({"a": 1}));
        assert_eq!(event["source"], "checkout");
        assert_eq!(event["type"], EVENT_TYPE);
        assert_eq!(event["specversion"], "1.0");
        assert_eq!(event["topic"], "orders");
        assert_eq!(event["pubsubname"], "pubsub");
        assert!(event["traceparent"]
            .as_str()
            .is_some_and(|t| t.starts_with("00-")));
        assert_eq!(event["id"].as_str().map(str::len), Some(36));
        let bytes = serde_json::to_vec(&event).expect("json");
        let message = rewire_runtime::Message {
            data: bytes,
            ..Default::default()
        };
        assert_eq!(
            TopicEvent::of(&message, "pubsub", "orders").data,
            br#"{"a":1}"#
        );
    }

    /// A message that is not a CloudEvent (a publisher writing to the
    /// broker directly), delivered again: the envelope made around it
    /// keeps its id, on a plain and a raw-payload subscription, so an app
    /// de-duplicating by id sees the redelivery. Another message, or the
    /// same broker id with another payload (a switched broker reusing
    /// ids), gets another. Failed before: a new random id each delivery.
    #[test]
    fn a_redelivered_message_that_is_not_a_cloud_event_keeps_its_envelope_id() {
        let message = |id: &str, data: &[u8]| rewire_runtime::Message {
            id: id.into(),
            topic: "orders".into(),
            data: data.to_vec(),
            content_type: Some("application/json".into()),
            ..Default::default()
        };
        let first = message("1700000000000-0", br#"{"a":1}"#);
        for of in [TopicEvent::of, TopicEvent::of_raw_payload] {
            let id = of(&first, "pubsub", "orders").id;
            assert_eq!(id.len(), 36, "{id}");
            assert_eq!(of(&first.clone(), "pubsub", "orders").id, id);
            let other = message("1700000000000-1", br#"{"a":1}"#);
            assert_ne!(of(&other, "pubsub", "orders").id, id);
            let reused = message("1700000000000-0", br#"{"a":2}"#);
            assert_ne!(of(&reused, "pubsub", "orders").id, id);
            assert_ne!(of(&first, "other", "orders").id, id);
        }
        // A CloudEvent keeps its own id.
        let event = delivered(cloud_event("application/json", serde_json::json!(1)));
        assert_eq!(event.id, "e1");
    }

    /// The ids keep their form and a delivered message's id its value (an
    /// app de-duplicating by id across an upgrade of the sidecar): the
    /// value pinned here was computed apart, as the SHA-256 of the
    /// length-prefixed pub/sub, topic, broker id, content type and payload.
    #[test]
    fn the_envelope_ids_keep_their_uuid_form_and_value() {
        let message = rewire_runtime::Message {
            id: "m-1".into(),
            topic: "orders".into(),
            data: b"hello".to_vec(),
            content_type: Some("text/plain".into()),
            ..Default::default()
        };
        assert_eq!(
            delivered_event_id(&message, "pubsub"),
            "d9920701-1640-5a4c-a631-6cb1cd40b3d6"
        );
        let random = new_event_id();
        let groups: Vec<&str> = random.split('-').collect();
        assert_eq!(
            groups.iter().map(|g| g.len()).collect::<Vec<_>>(),
            [8, 4, 4, 4, 12],
            "{random}"
        );
        assert!(
            groups[2].starts_with('4') && groups[3].starts_with('a'),
            "{random}"
        );
        assert!(
            random
                .chars()
                .all(|c| c == '-' || matches!(c, '0'..='9' | 'a'..='f')),
            "{random}"
        );
    }

    /// The event a message holding the CloudEvent `fields` reads as.
    fn delivered(fields: serde_json::Value) -> TopicEvent {
        let message = rewire_runtime::Message {
            data: fields.to_string().into_bytes(),
            ..Default::default()
        };
        TopicEvent::of(&message, "pubsub", "orders")
    }

    fn cloud_event(content_type: &str, data: serde_json::Value) -> serde_json::Value {
        serde_json::json!({"specversion": "1.0", "id": "e1", "source": "s", "type": "t",
            "datacontenttype": content_type, "data": data})
    }

    #[test]
    fn string_data_of_a_json_content_type_is_its_json_text_as_daprd_sends_it() {
        for content_type in [
            "application/json",
            "application/json; charset=utf-8",
            CLOUD_EVENT_CONTENT_TYPE,
            "application/vnd.orders+json",
        ] {
            let event = delivered(cloud_event(content_type, "hello".into()));
            assert_eq!(event.data, br#""hello""#, "{content_type}");
            assert_eq!(event.data_unreadable, None);
        }
        let event = delivered(cloud_event("text/plain", "hello".into()));
        assert_eq!(event.data, b"hello", "text stays its bytes");
        let event = delivered(cloud_event("application/json", serde_json::json!([1, "a"])));
        assert_eq!(event.data, br#"[1,"a"]"#);
    }

    #[test]
    fn data_base64_is_preferred_and_one_that_is_not_base64_is_unreadable() {
        let mut fields = cloud_event("text/plain", "from data".into());
        fields["data_base64"] = "aGVs\nbG8=".into();
        let event = delivered(fields.clone());
        assert_eq!(
            event.data, b"hello",
            "data_base64 wins, line breaks skipped"
        );

        fields["data_base64"] = "not base64!".into();
        let event = delivered(fields.clone());
        assert!(event.data.is_empty());
        let why = event.data_unreadable.clone().expect("unreadable");
        assert!(why.contains("data_base64"), "{why}");
        assert_eq!(
            event.unreadable_over_grpc(),
            Some(rewire_runtime::DeliveryOutcome::Retry)
        );

        fields["data_base64"] = serde_json::json!(7);
        assert!(delivered(fields.clone()).data_unreadable.is_some());
        fields["data_base64"] = serde_json::Value::Null;
        let event = delivered(fields);
        assert_eq!(event.data, b"from data", "a null data_base64 is none");
        assert_eq!(event.unreadable_over_grpc(), None);
    }

    #[test]
    fn a_raw_payload_is_wrapped_as_daprs_from_raw_payload() {
        let message = rewire_runtime::Message {
            topic: "orders".into(),
            data: br#"{"specversion":"1.0","id":"given","data":"x"}"#.to_vec(),
            content_type: Some("application/json".into()),
            ..Default::default()
        };
        let event = TopicEvent::of_raw_payload(&message, "pubsub", "orders");
        assert_eq!(event.data, message.data);
        assert_eq!(event.data_content_type, "application/octet-stream");
        assert_eq!(event.id.len(), 36);
        assert_eq!(
            event.cloud_event.text("data_base64").unwrap_or_default(),
            base64::engine::general_purpose::STANDARD.encode(&message.data)
        );
        assert_eq!(event.field("source"), "Dapr");
        assert_eq!(event.field("topic"), "orders");
        assert!(!event.cloud_event.contains_key("data"));
    }

    #[test]
    fn text_binary_and_raw_payloads() {
        assert_eq!(
            envelope(b"hi", None, &cx()).expect("an envelope")["data"],
            "hi"
        );
        let binary =
            envelope(&[0xff, 0], Some("application/octet-stream"), &cx()).expect("an envelope");
        assert_eq!(binary["data_base64"], "/wA=");
        let raw = rewire_runtime::Message {
            topic: "orders".into(),
            data: vec![0xff, 0],
            ..Default::default()
        };
        let event = TopicEvent::of(&raw, "pubsub", "orders");
        assert_eq!(event.data, vec![0xff, 0]);
        assert_eq!(event.field("pubsubname"), "pubsub");
    }

    #[test]
    fn only_octet_stream_is_base64_as_in_dapr() {
        // curl's default form type, XML, an image type: text stays text.
        for content_type in [
            "application/x-www-form-urlencoded",
            "application/xml",
            "image/svg+xml",
            "text/plain; charset=utf-8",
        ] {
            let event = envelope(b"hello", Some(content_type), &cx()).expect("an envelope");
            assert_eq!(event["data"], "hello", "{content_type}");
            assert!(event.get("data_base64").is_none(), "{content_type}");
            assert_eq!(event["datacontenttype"], content_type);
        }
        for content_type in ["application/octet-stream", "Application/Octet-Stream; x=1"] {
            let event = envelope(b"hello", Some(content_type), &cx()).expect("an envelope");
            assert_eq!(event["data_base64"], "aGVsbG8=", "{content_type}");
            assert!(event.get("data").is_none(), "{content_type}");
        }
        // Bytes that are not UTF-8 are kept whole (Dapr would mangle them).
        let event = envelope(&[0xff, 0], Some("image/png"), &cx()).expect("an envelope");
        assert_eq!(event["data_base64"], "/wA=");
        // JSON that does not parse is its text, as Dapr's.
        let event = envelope(b"{not json", Some("application/json"), &cx()).expect("an envelope");
        assert_eq!(event["data"], "{not json");
    }

    #[test]
    fn publish_metadata_overrides_the_envelope_and_sets_expiration() {
        let metadata = HashMap::from([
            ("cloudevent.id".to_string(), "my-id".to_string()),
            ("cloudevent.source".to_string(), "my-source".to_string()),
            ("cloudevent.type".to_string(), "my.type".to_string()),
            ("ttlInSeconds".to_string(), "60".to_string()),
        ]);
        let before = rewire_runtime::rfc3339_utc(
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs())
                + 60,
        );
        let with = EnvelopeContext {
            metadata: Some(&metadata),
            ..cx()
        };
        let event = envelope(b"hi", None, &with).expect("an envelope");
        assert_eq!(
            (&event["id"], &event["source"], &event["type"]),
            (
                &Value::from("my-id"),
                &Value::from("my-source"),
                &Value::from("my.type")
            )
        );
        let expiration = event["expiration"].as_str().unwrap_or_default();
        // RFC 3339 UTC to the second sorts as time: now + 60 s, or a second on.
        assert!(expiration >= before.as_str(), "{expiration} < {before}");
        assert!(
            expiration.len() == 20 && expiration.ends_with('Z'),
            "{expiration}"
        );

        // No TTL, a TTL that is not a positive count: no expiration.
        for ttl in [
            None,
            Some("0"),
            Some("-5"),
            Some("soon"),
            Some("2147483648"),
        ] {
            let mut metadata = HashMap::new();
            if let Some(ttl) = ttl {
                metadata.insert("ttlInSeconds".to_string(), ttl.to_string());
            }
            let with = EnvelopeContext {
                metadata: Some(&metadata),
                ..cx()
            };
            let event = envelope(b"hi", None, &with).expect("an envelope");
            assert!(event.get("expiration").is_none(), "{ttl:?}");
            assert_eq!(event["source"], "checkout");
        }
    }

    /// As Dapr's `ApplyMetadata`: a given CloudEvent keeps its own `id`,
    /// `source` and `type`, but takes the TTL.
    #[test]
    fn a_given_cloud_event_takes_the_ttl_but_not_the_overrides() {
        let metadata = HashMap::from([
            ("cloudevent.id".to_string(), "my-id".to_string()),
            ("cloudevent.source".to_string(), "my-source".to_string()),
            ("cloudevent.type".to_string(), "my.type".to_string()),
            ("ttlInSeconds".to_string(), "60".to_string()),
        ]);
        let with = EnvelopeContext {
            metadata: Some(&metadata),
            ..cx()
        };
        let given = serde_json::json!({"specversion": "1.0", "id": "given-id",
            "source": "given-source", "type": "given.type", "data": "hi"});
        let event = envelope(
            given.to_string().as_bytes(),
            Some(CLOUD_EVENT_CONTENT_TYPE),
            &with,
        )
        .expect("an envelope");
        assert_eq!(
            (&event["id"], &event["source"], &event["type"]),
            (
                &Value::from("given-id"),
                &Value::from("given-source"),
                &Value::from("given.type")
            )
        );
        let expiration = event["expiration"].as_str().unwrap_or_default();
        assert!(
            expiration.len() == 20 && expiration.ends_with('Z'),
            "{expiration:?}"
        );
    }

    /// As Dapr's `FromCloudEvent`: a payload sent as a CloudEvent that
    /// does not begin with a JSON object is refused, not wrapped as text.
    #[test]
    fn a_payload_sent_as_a_cloud_event_must_be_a_json_object() {
        for (body, content_type) in [
            (&br#"{"}"#[..], CLOUD_EVENT_CONTENT_TYPE),
            (br#"{"missing_quote: invalid}"#, CLOUD_EVENT_CONTENT_TYPE),
            (b"[1, 2]", CLOUD_EVENT_CONTENT_TYPE),
            (b"null", CLOUD_EVENT_CONTENT_TYPE),
            (b"", CLOUD_EVENT_CONTENT_TYPE),
            (br#""text""#, "Application/CloudEvents+JSON; charset=utf-8"),
        ] {
            let refused = envelope(body, Some(content_type), &cx());
            assert!(
                refused.is_err(),
                "{:?} as {content_type}",
                String::from_utf8_lossy(body)
            );
        }
        // As Go's decoder: the first value is read, what follows is not.
        let event = envelope(
            br#"{"id":"mine"} more"#,
            Some(CLOUD_EVENT_CONTENT_TYPE),
            &cx(),
        )
        .expect("an envelope");
        assert_eq!(event["id"], "mine");
        // Not the CloudEvent type as Dapr reads it: the payload is data.
        let event =
            envelope(b"[1]", Some("application/cloudevents+jsonx"), &cx()).expect("an envelope");
        assert_eq!(event["data"], "[1]");
    }

    #[test]
    fn a_given_cloud_event_keeps_its_fields() {
        let given = br#"{"id":"mine","source":"s","specversion":"1.0","type":"t","data":"x"}"#;
        let event = envelope(given, Some(CLOUD_EVENT_CONTENT_TYPE), &cx()).expect("an envelope");
        assert_eq!(event["id"], "mine");
        assert_eq!(event["type"], "t");
        assert_eq!(event["topic"], "orders");
    }

    #[test]
    fn a_republished_cloud_event_names_where_it_is_published() {
        // Received on one topic, published again on another: as Dapr, the
        // envelope names the topic and pub/sub it is published to.
        let given = br#"{"id":"mine","source":"s","specversion":"1.0","type":"t","data":"x",
                         "topic":"elsewhere","pubsubname":"a\nb"}"#;
        let event = envelope(given, Some(CLOUD_EVENT_CONTENT_TYPE), &cx()).expect("an envelope");
        assert_eq!(event["id"], "mine");
        assert_eq!(
            (&event["topic"], &event["pubsubname"]),
            (&Value::from("orders"), &Value::from("pubsub"))
        );
    }

    #[test]
    fn an_expiration_that_is_no_string_is_not_built() {
        let huge = format!("[{}{{\"\":0}}]", "{\"\":0},".repeat(10_000));
        let given = format!(r#"{{"specversion":"1.0","id":"x","expiration":{huge}}}"#);
        let message = rewire_runtime::Message {
            data: given.into_bytes(),
            content_type: Some(CLOUD_EVENT_CONTENT_TYPE.into()),
            ..Default::default()
        };
        let event = TopicEvent::of(&message, "pubsub", "orders");
        taken_parsed_whole();
        assert_eq!(event.expiration(), None);
        assert!(taken_parsed_whole().is_empty(), "the expiration was built");
        let timed = rewire_runtime::Message {
            data: br#"{"specversion":"1.0","id":"y","expiration":"2026-12-06T01:00:00Z"}"#.to_vec(),
            content_type: Some(CLOUD_EVENT_CONTENT_TYPE.into()),
            ..Default::default()
        };
        let event = TopicEvent::of(&timed, "pubsub", "orders");
        assert_eq!(event.expiration().as_deref(), Some("2026-12-06T01:00:00Z"));
    }
}
