//! W3C trace context in and out: `traceparent` / `tracestate` of an
//! incoming HTTP or gRPC call continue the caller's trace; the context of
//! the current span goes out with published events.

use axum::http::{HeaderMap, HeaderName};
use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::{SpanContext, TraceContextExt};
use opentelemetry::Context;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tonic::metadata::MetadataMap;
use tracing::field::Empty;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use super::calls_traced;

const TRACE_HEADERS: [&str; 2] = ["traceparent", "tracestate"];

/// The W3C trace headers, named once (a name given as text is parsed on
/// every lookup).
static TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
static TRACESTATE: HeaderName = HeaderName::from_static("tracestate");

/// The caller's trace context in `headers`, when tracing is on and the
/// call carries one valid `traceparent` ([`context_in_http`]).
pub fn caller_of_http(headers: &HeaderMap) -> Option<Context> {
    calls_traced().then(|| context_in_http(headers)).flatten()
}

/// The caller's trace context in gRPC `metadata` (as [`caller_of_http`]).
pub fn caller_of_grpc(metadata: &MetadataMap) -> Option<Context> {
    calls_traced().then(|| context_in_grpc(metadata)).flatten()
}

/// The trace context in `headers` ([`remote`]): their `traceparent` when
/// given once, their `tracestate` headers joined.
fn context_in_http(headers: &HeaderMap) -> Option<Context> {
    let (traceparent, tracestate) = trace_headers(headers);
    remote(traceparent, tracestate.as_deref())
}

/// The trace context in gRPC `metadata`, as [`context_in_http`].
fn context_in_grpc(metadata: &MetadataMap) -> Option<Context> {
    context_in_http(metadata.as_ref())
}

/// The W3C trace headers of a call (HTTP headers, or gRPC metadata's),
/// as text, read as W3C asks and as [`caller_of_http`] reads them: the
/// `traceparent` only when given once ([`only_one`]), the `tracestate`
/// headers joined and cut to whole members within 512 bytes and 32
/// members ([`joined`]). What a published event's trace is made from
/// ([`event_trace`]), so the event and the call's span agree.
pub fn trace_headers(headers: &HeaderMap) -> (Option<&str>, Option<String>) {
    let values = |name| headers.get_all(name).iter().map(|v| v.to_str().ok());
    let traceparent = only_one(values(&TRACEPARENT));
    (traceparent, joined(values(&TRACESTATE)))
}

/// The value of a header given once, as text; none when it is given more
/// than once (W3C: a `traceparent` given twice is not a trace context) or
/// is not text.
fn only_one<'a>(mut values: impl Iterator<Item = Option<&'a str>>) -> Option<&'a str> {
    let first = values.next()??;
    values.next().is_none().then_some(first)
}

/// The values of a header given any number of times joined with `,`, as
/// W3C says of several `tracestate` headers, cut as
/// [`bounded_tracestate`] while they are read: once a member does not fit,
/// nothing more is copied (a caller's hundred headers are not joined
/// whole to keep 512 bytes). None when one is not text, or no member is
/// left.
fn joined<'a>(values: impl Iterator<Item = Option<&'a str>>) -> Option<String> {
    let mut kept = BoundedMembers::default();
    for value in values {
        kept.push_all(value?);
    }
    kept.finish()
}

/// The trace context of `traceparent` when it is W3C's ([`w3c_shaped`])
/// and names a valid context, with `tracestate` cut as a published
/// event's: the parent-based sampler copies it onto every child span, and
/// a caller's 16 KB on each would swell export batches past what
/// collectors take.
fn remote(traceparent: Option<&str>, tracestate: Option<&str>) -> Option<Context> {
    let traceparent = traceparent.map(str::trim).filter(|t| w3c_shaped(t))?;
    let state = tracestate.and_then(bounded_tracestate);
    let given = Given(Some(traceparent), state.as_deref());
    let cx = TraceContextPropagator::new().extract(&given);
    cx.span().span_context().is_valid().then_some(cx)
}

/// Length of a version `00` `traceparent`: `vv-` 32 hex `-` 16 hex `-ff`.
const TRACEPARENT_LEN: usize = 55;

/// Whether `traceparent` has W3C's shape, which the SDK's parser does not
/// check whole (it reads each field as a number: `0-1-1-1`, a `+` sign, a
/// trace id of 41 digits, flags of one digit passed): lowercase hex fields
/// of 2, 32, 16 and 2 digits joined by `-`, a version other than `ff`;
/// version `00` exactly 55 bytes, a later one either 55 or followed by
/// `-` (its further fields, which are not read).
fn w3c_shaped(traceparent: &str) -> bool {
    let bytes = traceparent.as_bytes();
    if bytes.len() < TRACEPARENT_LEN {
        return false;
    }
    let hex = |from: usize, to: usize| {
        bytes[from..to]
            .iter()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
    };
    let fields = hex(0, 2) && hex(3, 35) && hex(36, 52) && hex(53, 55);
    let dashes = bytes[2] == b'-' && bytes[35] == b'-' && bytes[52] == b'-';
    let end = match &bytes[..2] {
        b"00" => bytes.len() == TRACEPARENT_LEN,
        b"ff" => false,
        _ => bytes.len() == TRACEPARENT_LEN || bytes[TRACEPARENT_LEN] == b'-',
    };
    fields && dashes && end
}

/// The span of one API call: `api` is `http` or `grpc`, `method` the
/// operation (Dapr's or Layotto's name); a child of `caller` when given.
/// The component it uses, and the generation that served it, are recorded
/// by [`record_component`]; how it ended by [`record_grpc_status`] or
/// [`record_http_status`].
pub fn api_span(api: &'static str, method: &'static str, caller: Option<Context>) -> Span {
    let span = tracing::info_span!(
        "rewire.api",
        otel.name = method,
        otel.kind = "server",
        rpc.system = api,
        rpc.method = method,
        rewire.component = Empty,
        rewire.component_type = Empty,
        rewire.generation = Empty,
        rpc.grpc.status_code = Empty,
        http.response.status_code = Empty,
        otel.status_code = Empty,
        otel.status_description = Empty,
    );
    if let Some(caller) = caller {
        // Only fails once the span has started, which it has not.
        let _ = span.set_parent(caller);
    }
    span
}

/// Records on the current span the component `key` (`kind/name`) of type
/// `type_name` that the call uses, and the number of the `generation` it
/// was found in (during a reload, which set served the call). Nothing is
/// recorded, or formatted, when the span is disabled.
pub fn record_component(key: &dyn std::fmt::Display, type_name: &str, generation: u64) {
    let span = Span::current();
    if !span.is_disabled() {
        span.record("rewire.component", tracing::field::display(key));
        span.record("rewire.component_type", type_name);
        span.record("rewire.generation", generation);
    }
}

/// Records on `span`, an [`api_span`], the gRPC `code` the call ended
/// with (`rpc.grpc.status_code`, its number) and, when OpenTelemetry counts
/// the code as a server's error ([`is_grpc_server_error`]), the span's
/// status `ERROR` described by `message` (the answer's, scrubbed of secret
/// values and bounded: what the caller was sent). Otherwise the status is
/// left unset, as OpenTelemetry asks of servers.
pub fn record_grpc_status(span: &Span, code: tonic::Code, message: &str) {
    if span.is_disabled() {
        return;
    }
    span.record("rpc.grpc.status_code", i64::from(code as i32));
    if is_grpc_server_error(code) {
        span.record("otel.status_code", "ERROR");
        span.record("otel.status_description", message);
    }
}

/// Records on `span`, an [`api_span`], the HTTP `status` the call was
/// answered with (`http.response.status_code`) and, for a 5xx, the span's
/// status `ERROR`. A 4xx is the caller's error, not the server's: the
/// status is left unset, as OpenTelemetry asks of servers.
pub fn record_http_status(span: &Span, status: u16) {
    if span.is_disabled() {
        return;
    }
    span.record("http.response.status_code", i64::from(status));
    if status >= 500 {
        span.record("otel.status_code", "ERROR");
    }
}

/// Whether a gRPC server's span ending with `code` is an error, as
/// OpenTelemetry's conventions for gRPC servers list them: the codes that
/// are the server's fault, not the caller's (`NOT_FOUND`,
/// `INVALID_ARGUMENT`... are not).
fn is_grpc_server_error(code: tonic::Code) -> bool {
    use tonic::Code;
    matches!(
        code,
        Code::Unknown
            | Code::DeadlineExceeded
            | Code::Unimplemented
            | Code::Internal
            | Code::Unavailable
            | Code::DataLoss
    )
}

/// Most bytes of a `tracestate` a published event carries (what W3C asks
/// vendors to pass on at least).
const MAX_EVENT_TRACESTATE_BYTES: usize = 512;

/// Most members of a `tracestate` (W3C's limit).
const MAX_TRACESTATE_MEMBERS: usize = 32;

/// Both trace headers, given as text.
struct Given<'a>(Option<&'a str>, Option<&'a str>);

impl Extractor for Given<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        match key {
            "traceparent" => self.0,
            "tracestate" => self.1,
            _ => None,
        }
    }

    fn keys(&self) -> Vec<&str> {
        TRACE_HEADERS.to_vec()
    }
}

/// The trace headers a published event carries, from the publisher's
/// `traceparent` and `tracestate`: with calls traced, the context of the
/// current span (the call's `PublishEvent` span, a child of the caller's),
/// so a subscriber's span is a child of rewire's, as Dapr's is; else the
/// caller's when its `traceparent` is valid W3C, written as version `00`.
/// A `tracestate` only with a valid `traceparent`: the current span's
/// when traced (the caller's as the span took it), else the caller's; cut
/// to whole members within 512 bytes and 32 members. Both read from the
/// call as [`trace_headers`] reads them. Text that is not a trace
/// context is not copied into every event of a bulk publish and on to
/// every subscriber; nor is a later version's tail, which W3C lets run on
/// without bound (55 bytes are written, whatever was given).
pub fn event_trace(
    traceparent: Option<&str>,
    tracestate: Option<&str>,
) -> (Option<String>, Option<String>) {
    event_trace_under(current_context(), traceparent, tracestate)
}

/// [`event_trace`] under the current span's `own` context (`None`: calls
/// are not traced). Under rewire's own span the `tracestate` is that
/// span's (the caller's as the span took it: joined, bounded, parsed),
/// not the caller's text.
fn event_trace_under(
    own: Option<SpanContext>,
    traceparent: Option<&str>,
    tracestate: Option<&str>,
) -> (Option<String>, Option<String>) {
    let Some(given) = valid_context(traceparent) else {
        return (own.as_ref().map(w3c_traceparent), None);
    };
    match own {
        Some(own) => {
            let state = own.trace_state().header();
            (Some(w3c_traceparent(&own)), bounded_tracestate(&state))
        }
        None => (
            Some(w3c_traceparent(&given)),
            tracestate.and_then(bounded_tracestate),
        ),
    }
}

/// The span context `traceparent` gives, when it is valid W3C
/// ([`w3c_shaped`]).
fn valid_context(traceparent: Option<&str>) -> Option<SpanContext> {
    let cx = remote(traceparent, None)?;
    let context = cx.span().span_context().clone();
    Some(context)
}

/// `state` cut as W3C asks: whole members kept from the left (the most
/// recent vendors first) while they fit 512 bytes and 32 members; empty
/// members (`a=1,,b=2`) dropped. `None` when nothing is left.
fn bounded_tracestate(state: &str) -> Option<String> {
    let mut kept = BoundedMembers::default();
    kept.push_all(state);
    kept.finish()
}

/// A `tracestate` kept as [`bounded_tracestate`] cuts it, built member by
/// member.
#[derive(Default)]
struct BoundedMembers {
    kept: String,
    members: usize,
    /// A member did not fit, or the members are at W3C's limit: no later
    /// one is kept.
    full: bool,
}

impl BoundedMembers {
    /// Keeps the members of `state` (`,`-separated) that fit, from the
    /// left, while none has failed to: none is read once full.
    fn push_all(&mut self, state: &str) {
        let members = state.split(',').map(str::trim).filter(|m| !m.is_empty());
        for member in members {
            if self.full {
                break;
            }
            let separator = usize::from(!self.kept.is_empty());
            if self.members == MAX_TRACESTATE_MEMBERS
                || self.kept.len() + separator + member.len() > MAX_EVENT_TRACESTATE_BYTES
            {
                self.full = true;
                break;
            }
            if separator == 1 {
                self.kept.push(',');
            }
            self.kept.push_str(member);
            self.members += 1;
        }
    }

    /// What was kept; `None` when nothing was.
    fn finish(self) -> Option<String> {
        (!self.kept.is_empty()).then_some(self.kept)
    }
}

/// The span of one attempt at delivering an event of `topic` on `pubsub`
/// to its subscriber, as Dapr's: a child of the trace the event carries
/// when its `traceparent` is valid W3C, else the root of a new trace.
/// Disabled, and nothing parsed, when calls are not traced.
pub fn delivery_span(
    pubsub: &str,
    topic: &str,
    traceparent: Option<&str>,
    tracestate: Option<&str>,
) -> Span {
    if !calls_traced() {
        return Span::none();
    }
    let name = format!("pubsub/{topic}");
    let span = tracing::info_span!(
        "rewire.delivery",
        otel.name = name.as_str(),
        otel.kind = "consumer",
        messaging.destination.name = topic,
        rewire.component = pubsub,
    );
    if let Some(parent) = remote(traceparent, tracestate) {
        // Only fails once the span has started, which it has not.
        let _ = span.set_parent(parent);
    }
    span
}

/// The trace headers an event delivered to a subscriber carries, from
/// the CloudEvent's `traceparent` and `tracestate` as read from the broker
/// (which any writer of the topic may have filled): with calls traced, the
/// context of the current span (the [`delivery_span`], a child of the
/// event's trace); else the event's `traceparent` when it is valid W3C,
/// written as version `00`. Its `tracestate` only with a valid
/// `traceparent`, cut as a published one ([`event_trace`]). Text that is no
/// trace context is not sent: an app refusing the header would have the
/// event retried to its dead letter.
pub fn delivered_trace(
    traceparent: Option<&str>,
    tracestate: Option<&str>,
) -> (Option<String>, Option<String>) {
    let Some(given) = valid_context(traceparent) else {
        return (current_traceparent(), None);
    };
    let traceparent = current_traceparent().unwrap_or_else(|| w3c_traceparent(&given));
    (Some(traceparent), tracestate.and_then(bounded_tracestate))
}

/// The W3C `traceparent` of the current span, when calls are traced and the
/// span is part of a trace.
pub fn current_traceparent() -> Option<String> {
    current_context().as_ref().map(w3c_traceparent)
}

/// The context of the current span, when calls are traced and the span is
/// part of a trace.
fn current_context() -> Option<SpanContext> {
    if !calls_traced() {
        return None;
    }
    let cx = Span::current().context();
    let span = cx.span();
    let context = span.span_context();
    context.is_valid().then(|| context.clone())
}

/// `context` as a version `00` W3C `traceparent`.
fn w3c_traceparent(context: &SpanContext) -> String {
    format!(
        "00-{}-{}-{:02x}",
        context.trace_id(),
        context.span_id(),
        context.trace_flags().to_u8()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

    /// A gRPC call's span is an error only for a code that is the server's
    /// fault (OpenTelemetry's list for servers), not the caller's.
    #[test]
    fn only_the_servers_grpc_codes_make_an_error_span() {
        use tonic::Code;
        let servers = [
            Code::Unknown,
            Code::DeadlineExceeded,
            Code::Unimplemented,
            Code::Internal,
            Code::Unavailable,
            Code::DataLoss,
        ];
        for code in servers {
            assert!(is_grpc_server_error(code), "{code:?}");
        }
        let callers = [
            Code::Ok,
            Code::Cancelled,
            Code::InvalidArgument,
            Code::NotFound,
            Code::AlreadyExists,
            Code::PermissionDenied,
            Code::ResourceExhausted,
            Code::FailedPrecondition,
            Code::Aborted,
            Code::OutOfRange,
            Code::Unauthenticated,
        ];
        for code in callers {
            assert!(!is_grpc_server_error(code), "{code:?}");
        }
    }

    #[test]
    fn a_published_event_carries_only_a_valid_trace_context() {
        assert_eq!(
            event_trace(Some(VALID), Some("vendor=abc")),
            (Some(VALID.to_string()), Some("vendor=abc".to_string()))
        );
        // Not a trace context: neither header is copied (no span here).
        for bad in [
            "xyz",
            "00-00000000000000000000000000000000-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
            "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        ] {
            assert_eq!(
                event_trace(Some(bad), Some("vendor=abc")),
                (None, None),
                "{bad}"
            );
        }
        // A tracestate past W3C's bounds is cut to whole members from the
        // left; a single member too long for them is left out.
        let long = format!("vendor={}", "a".repeat(600));
        assert_eq!(
            event_trace(Some(VALID), Some(&long)),
            (Some(VALID.to_string()), None)
        );
        let members = |n| {
            (0..n)
                .map(|n| format!("v{n}=x"))
                .collect::<Vec<_>>()
                .join(",")
        };
        assert_eq!(
            event_trace(Some(VALID), Some(&members(40))).1,
            Some(members(32))
        );
        let big = format!("a=1,b={},c=3", "x".repeat(510));
        assert_eq!(
            event_trace(Some(VALID), Some(&big)).1,
            Some("a=1".to_string())
        );
    }

    /// A caller's `tracestate` is cut before its context parents the
    /// call's span (and, through the sampler, every span under it).
    #[test]
    fn a_callers_tracestate_is_bounded() {
        let member = |n: usize| format!("k{n:02}{}={}", "a".repeat(245), "v".repeat(251));
        let state = (0..32).map(member).collect::<Vec<_>>().join(",");
        assert_eq!(member(0).len(), 500);
        let mut headers = HeaderMap::new();
        headers.insert("traceparent", VALID.parse().unwrap());
        headers.insert("tracestate", state.parse().unwrap());
        let cx = context_in_http(&headers).expect("a valid traceparent");
        let kept = cx.span().span_context().trace_state().header();
        assert_eq!(kept, member(0));
        assert!(kept.len() <= MAX_EVENT_TRACESTATE_BYTES, "{}", kept.len());
    }

    /// A later version's `traceparent` may carry any tail after the flags;
    /// a bulk publish would copy it into each of its events (twice per
    /// CloudEvent). What is carried is the context as read, version `00`.
    #[test]
    fn a_published_event_carries_the_trace_context_not_its_text() {
        let future = format!(
            "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-{}",
            "x".repeat(20_000)
        );
        assert_eq!(
            event_trace(Some(&future), Some("vendor=abc")),
            (Some(VALID.to_string()), Some("vendor=abc".to_string()))
        );
        assert_eq!(
            event_trace(Some(&format!("{VALID}\n")), None).0,
            Some(VALID.to_string())
        );
    }

    /// What another writer of a topic put in an event's trace fields does
    /// not reach the app as is: a `traceparent` that is no W3C trace
    /// context is left out (with its `tracestate`), a `tracestate` past
    /// W3C's bounds is cut, a future version's tail is not sent on.
    #[test]
    fn a_delivered_event_sends_on_only_a_valid_bounded_trace_context() {
        assert_eq!(
            delivered_trace(Some(VALID), Some("vendor=abc")),
            (Some(VALID.to_string()), Some("vendor=abc".to_string()))
        );
        let (upper, huge_text) = (VALID.to_uppercase(), "0".repeat(20_000));
        for bad in ["", "not-a-trace", &upper, &huge_text] {
            assert_eq!(
                delivered_trace(Some(bad), Some("vendor=abc")),
                (None, None),
                "{bad:?}"
            );
        }
        assert_eq!(delivered_trace(None, Some("vendor=abc")), (None, None));
        let huge = (0..2_000)
            .map(|n| format!("v{n}=x"))
            .collect::<Vec<_>>()
            .join(",");
        let (_, state) = delivered_trace(Some(VALID), Some(&huge));
        let state = state.expect("the first members kept");
        assert!(state.len() <= MAX_EVENT_TRACESTATE_BYTES, "{}", state.len());
        assert_eq!(state.split(',').count(), MAX_TRACESTATE_MEMBERS);
        // What is sent is the context as read: no line break around it,
        // nor a later version's extra fields.
        assert_eq!(
            delivered_trace(Some(&format!("{VALID}\n")), None).0,
            Some(VALID.to_string())
        );
        let future = format!(
            "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-{}",
            "x".repeat(20_000)
        );
        assert_eq!(
            delivered_trace(Some(&future), None).0,
            Some(VALID.to_string())
        );
    }

    /// A `traceparent` is taken only in W3C's exact shape: the SDK's
    /// parser read each field as a number and took `0-1-1-1`, a `+` sign,
    /// a 41-digit trace id and one-digit flags. A later version's further
    /// fields follow a `-`.
    #[test]
    fn only_a_w3c_shaped_traceparent_is_a_trace_context() {
        let long_trace_id = format!("00-000000000{}-b7ad6b7169203331-01", &VALID[3..35]);
        let later = |tail: &str| format!("cc{}{tail}", &VALID[2..]);
        let refused = [
            "0-1-1-1".to_string(),
            "00-+af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".to_string(),
            long_trace_id,
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-1".to_string(),
            "00-0af7651916cd43dd8448eb211c80319c-+7ad6b7169203331-01".to_string(),
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-+1".to_string(),
            format!("{VALID}-extra"),
            format!("{VALID}0"),
            later("x"),
            format!("ff{}", &VALID[2..]),
            VALID.to_uppercase(),
        ];
        for bad in &refused {
            assert!(remote(Some(bad), None).is_none(), "{bad:?}");
            assert_eq!(
                event_trace(Some(bad), Some("vendor=abc")),
                (None, None),
                "{bad:?}"
            );
        }
        for good in [
            VALID.to_string(),
            format!(" {VALID}\n"),
            later(""),
            later("-whatever-follows"),
        ] {
            let cx = remote(Some(&good), None).unwrap_or_else(|| panic!("{good:?} refused"));
            assert_eq!(w3c_traceparent(cx.span().span_context()), VALID, "{good:?}");
        }
    }

    /// A `traceparent` given twice is no trace context (W3C); several
    /// `tracestate` headers are one list, joined with `,`. Over HTTP and
    /// gRPC alike.
    #[test]
    fn a_repeated_traceparent_is_none_and_tracestates_are_joined() {
        let mut headers = HeaderMap::new();
        headers.append("traceparent", VALID.parse().unwrap());
        headers.append("tracestate", "a=1".parse().unwrap());
        headers.append("tracestate", "b=2".parse().unwrap());
        let cx = context_in_http(&headers).expect("one traceparent");
        assert_eq!(cx.span().span_context().trace_state().header(), "a=1,b=2");
        let metadata = MetadataMap::from_headers(headers.clone());
        let cx = context_in_grpc(&metadata).expect("one traceparent");
        assert_eq!(cx.span().span_context().trace_state().header(), "a=1,b=2");

        headers.append("traceparent", VALID.parse().unwrap());
        assert!(context_in_http(&headers).is_none());
        assert!(context_in_grpc(&MetadataMap::from_headers(headers)).is_none());
    }

    /// The span context of `traceparent` with `tracestate`.
    fn span_context(traceparent: &str, tracestate: &str) -> SpanContext {
        let cx = remote(Some(traceparent), Some(tracestate)).expect("a valid context");
        let context = cx.span().span_context().clone();
        context
    }

    /// With calls traced, a published event carries rewire's own span
    /// (the `PublishEvent` span, a child of the caller's) and its
    /// `tracestate` (the caller's as the span took it), not the caller's
    /// span id nor its raw text; untraced, the caller's context. Before,
    /// the caller's span id went out even when rewire's span was there.
    #[test]
    fn a_published_event_carries_rewires_own_span_when_traced() {
        let own = "00-0af7651916cd43dd8448eb211c80319c-1111111111111111-01";
        let own_context = || Some(span_context(own, "vendor=abc,other=1"));
        assert_eq!(
            event_trace_under(own_context(), Some(VALID), Some("vendor=raw")),
            (
                Some(own.to_string()),
                Some("vendor=abc,other=1".to_string())
            )
        );
        assert_eq!(
            event_trace_under(own_context(), Some("xyz"), Some("vendor=abc")),
            (Some(own.to_string()), None)
        );
        assert_eq!(
            event_trace_under(None, Some(VALID), Some("vendor=abc")),
            (Some(VALID.to_string()), Some("vendor=abc".to_string()))
        );
    }

    /// A publish's trace headers are read as a call's: a `traceparent`
    /// given twice is none (so the event carries none, outside a traced
    /// span), and several `tracestate` headers are joined. Before, the
    /// first of each was taken.
    #[test]
    fn a_published_events_trace_headers_are_read_as_w3c_asks() {
        let mut headers = HeaderMap::new();
        headers.append("traceparent", VALID.parse().unwrap());
        headers.append("tracestate", "a=1".parse().unwrap());
        headers.append("tracestate", "b=2".parse().unwrap());
        let (traceparent, tracestate) = trace_headers(&headers);
        assert_eq!(
            event_trace_under(None, traceparent, tracestate.as_deref()),
            (Some(VALID.to_string()), Some("a=1,b=2".to_string()))
        );
        headers.append("traceparent", VALID.parse().unwrap());
        let (traceparent, tracestate) = trace_headers(&headers);
        assert_eq!(traceparent, None);
        assert_eq!(
            event_trace_under(None, traceparent, tracestate.as_deref()),
            (None, None)
        );
    }

    /// Many `tracestate` headers are joined only as far as the bound:
    /// whole members within 512 bytes and 32 members, as one header of
    /// them all would be cut; a header that is not text still voids them.
    #[test]
    fn many_tracestate_headers_are_joined_only_to_the_bound() {
        let values: Vec<String> = (0..100)
            .map(|n| format!("k{n:02}={}", "v".repeat(40)))
            .collect();
        let whole = values.join(",");
        let cut = joined(values.iter().map(|v| Some(v.as_str())));
        assert_eq!(cut, bounded_tracestate(&whole));
        assert!(cut.as_ref().is_some_and(|j| j.len() <= 512));
        let short: Vec<String> = (0..40).map(|n| format!("k{n}=1")).collect();
        let joined_short = joined_members(&short);
        assert_eq!(joined_short.split(',').count(), MAX_TRACESTATE_MEMBERS);
        assert_eq!(Some(joined_short), bounded_tracestate(&short.join(",")));
        assert_eq!(joined([Some("a=1"), None].into_iter()), None);
    }

    /// `values` joined as several headers.
    fn joined_members(values: &[String]) -> String {
        joined(values.iter().map(|v| Some(v.as_str()))).expect("members kept")
    }
}
