//! The service layer in front of both servers: it counts each request in
//! its connection's [`InFlight`] from the call until its response body
//! ends, and charges its body to the listener's [`BodyBudget`] as it is
//! read (an HTTP upload's [`BodyCharge`] in the request's extensions, for
//! its reader that streams it on; a gRPC request stream, Layotto's
//! `PutFile` among them, by its messages' wire framing; other bodies hold
//! their charge inline, so an ordinary request allocates nothing here).
//! A response of known size is charged to its connection's and listener's
//! reply budgets until the server takes its bytes ([`Replying`]), and a
//! gRPC read's answer of unknown size (tonic's codec) as it is produced
//! ([`ChargedAsSent`]). Only the
//! answer of a read the client can repeat without effect (a state value,
//! a secret, configuration, metadata: [`CountedBody::refusable`]) is
//! refused in its place when it would pass either; any other answer (a
//! lock taken, an id spent, a subscription opened) is charged and sent,
//! since refusing it would hide a change already made. A configuration
//! subscription's stream is charged as it is produced too, each change
//! refusable past its own connection's limit
//! ([`CountedBody::counted_subscription`]).
//! The same for both servers, which differ in how a request finds
//! its connection (axum makes a service per connection, which holds the
//! count; tonic's requests carry their connection's [`PeerInfo`]) and in
//! their body type.
//!
//! [`PeerInfo`]: crate::tls::PeerInfo

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http_body::Body as _;
use tonic::codegen::http::{Method, Request, Response};

use super::replying::ChargedAsSent;
use super::{BodyBudget, BodyCharge, Budgeted, ReplyCharge, Replying};
use crate::in_flight::{Counted, InFlight, RequestGuard};
use crate::reply_budget::ReplyRefused;

/// A server's body type (requests' and responses' alike), which can carry
/// a request's guard or be charged to a budget.
pub trait CountedBody: Sized {
    /// `self`, keeping `guard` until it ends.
    fn counted(self, guard: RequestGuard) -> Self;

    /// A response's size, when known before it is sent.
    fn reply_size(&self) -> Option<u64>;

    /// `self`, keeping `guard` until it ends and `charge` until the server
    /// takes its bytes.
    fn counted_replying(self, guard: RequestGuard, charge: ReplyCharge) -> Self;

    /// `self` (the answer of unknown size to a repeatable read), keeping
    /// `guard` until it ends and charged to its reply budgets as it is
    /// produced, where the server lets a client move a read off the path
    /// that builds answers whole.
    fn counted_charged_as_sent(self, guard: RequestGuard) -> Self;

    /// `self` (a configuration subscription's stream), keeping `guard`
    /// until it ends and charged to its reply budgets as it is produced,
    /// each change refused past them (which drops the subscriber).
    fn counted_subscription(self, guard: RequestGuard) -> Self;

    /// Whether the answer to this request is a configuration
    /// subscription's stream.
    fn subscription(method: &Method, path: &str) -> bool;

    /// The answer in place of a reply the budgets cannot hold.
    fn refusal(refused: ReplyRefused) -> Response<Self>;

    /// Whether the answer to this request may be refused when the reply
    /// budgets are full: a read the client can repeat without effect.
    fn refusable(method: &Method, path: &str) -> bool;

    /// How a request of this server has its body read.
    fn read_as(method: &Method, path: &str) -> BodyRead;

    /// `self`, charged to `budget` as it is read, and (for an upload) the
    /// handle on its charge.
    fn budgeted(self, budget: &Arc<BodyBudget>, read: BodyRead) -> (Self, Option<BodyCharge>);
}

/// How a request body is read, which decides what its charge holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyRead {
    /// Read whole, then dropped: charged until dropped.
    Whole,
    /// A file upload, whose reader streams it on and tells its charge
    /// what it took.
    Upload,
    /// A gRPC request stream as long as its call (a subscription's
    /// requests and acknowledgements, a `PutFile`'s chunks): charged for
    /// the message being read, each whole one let go of by its length
    /// prefix once decoded (not by its decoded size, which drops unknown
    /// fields and would leave their bytes charged).
    Messages,
}

/// The gRPC calls whose requests are a stream for the life of the call;
/// an upload's messages are decoded only as the store takes them.
const REQUEST_STREAMS: [&str; 4] = [
    "/dapr.proto.runtime.v1.Dapr/SubscribeTopicEventsAlpha1",
    "/spec.proto.runtime.v1.Runtime/SubscribeTopicEvents",
    "/spec.proto.runtime.v1.Runtime/SubscribeConfiguration",
    "/spec.proto.runtime.v1.Runtime/PutFile",
];

/// The gRPC configuration subscriptions, whose streams are charged to the
/// reply budgets as they are produced: tonic takes each change off its
/// queue at once and the server holds it until the client makes room.
const GRPC_SUBSCRIPTIONS: [&str; 3] = [
    "/dapr.proto.runtime.v1.Dapr/SubscribeConfigurationAlpha1",
    "/dapr.proto.runtime.v1.Dapr/SubscribeConfiguration",
    "/spec.proto.runtime.v1.Runtime/SubscribeConfiguration",
];

/// The gRPC reads a client can repeat without effect: only their answers
/// are refused past the reply budgets. An answer the hot path builds whole
/// is charged when built; one tonic's codec encodes (the hot path declined
/// the call, or never takes it: Layotto's secrets and `GetConfiguration`)
/// is charged as it is produced. Other calls (saves, locks, publishing,
/// Layotto's `GetNextId`) change state before answering.
const GRPC_REPEATABLE_READS: [&str; 12] = [
    "/dapr.proto.runtime.v1.Dapr/GetState",
    "/dapr.proto.runtime.v1.Dapr/GetBulkState",
    "/dapr.proto.runtime.v1.Dapr/GetSecret",
    "/dapr.proto.runtime.v1.Dapr/GetBulkSecret",
    "/dapr.proto.runtime.v1.Dapr/GetConfigurationAlpha1",
    "/dapr.proto.runtime.v1.Dapr/GetConfiguration",
    "/dapr.proto.runtime.v1.Dapr/GetMetadata",
    "/spec.proto.runtime.v1.Runtime/GetState",
    "/spec.proto.runtime.v1.Runtime/GetBulkState",
    "/spec.proto.runtime.v1.Runtime/GetSecret",
    "/spec.proto.runtime.v1.Runtime/GetBulkSecret",
    "/spec.proto.runtime.v1.Runtime/GetConfiguration",
];

/// The HTTP reads a client can repeat without effect, by method and
/// route (`*` is one path segment, a final `**` one or more): only their
/// answers are refused past the reply budgets. Not the `GET`s that change
/// state: the sequencer's next id, configuration (un)subscribe.
const HTTP_REPEATABLE_READS: [(Method, &str); 9] = [
    (Method::GET, "/v1.0/state/*/*"),
    (Method::POST, "/v1.0/state/*/bulk"),
    (Method::PUT, "/v1.0/state/*/bulk"),
    (Method::GET, "/v1.0/secrets/*/*"),
    (Method::GET, "/v1.0/configuration/*"),
    (Method::GET, "/v1.0-alpha1/configuration/*"),
    (Method::GET, "/v1.0/metadata"),
    (Method::GET, "/v1.0/rewire/file/*"),
    (Method::GET, "/v1.0/rewire/file/*/**"),
];

/// Whether `path` (a clean one) is `route`'s (see
/// [`HTTP_REPEATABLE_READS`]).
fn route_matches(route: &str, path: &str) -> bool {
    let mut segments = path.split('/');
    for wanted in route.split('/') {
        let Some(segment) = segments.next() else {
            return false;
        };
        match wanted {
            "**" => return !segment.is_empty(),
            "*" if !segment.is_empty() => {}
            _ if wanted == segment => {}
            _ => return false,
        }
    }
    segments.next().is_none()
}

/// The HTTP file route's prefix (`PUT` on it is an upload).
const HTTP_FILES: &str = "/v1.0/rewire/file/";

impl CountedBody for tonic::body::Body {
    fn counted(self, guard: RequestGuard) -> Self {
        Self::new(Counted::new(self, guard))
    }

    /// Known for the hot path's answers (`unary_body`); tonic's codec
    /// encodes its answers only as they are sent.
    fn reply_size(&self) -> Option<u64> {
        self.size_hint().exact()
    }

    /// Its size kept from hyper, which would send it as `content-length`
    /// (gRPC answers have gone without one).
    fn counted_replying(self, guard: RequestGuard, charge: ReplyCharge) -> Self {
        Self::new(Counted::new(Replying::new(self, charge, false), guard))
    }

    /// A read the hot path declined (a `grpc-encoding`, a second
    /// message), answered by tonic's codec.
    fn counted_charged_as_sent(self, guard: RequestGuard) -> Self {
        let in_flight = guard.in_flight().clone();
        Self::new(Counted::new(ChargedAsSent::new(self, in_flight), guard))
    }

    fn counted_subscription(self, guard: RequestGuard) -> Self {
        let in_flight = guard.in_flight().clone();
        Self::new(Counted::new(
            ChargedAsSent::subscription(self, in_flight),
            guard,
        ))
    }

    fn subscription(_: &Method, path: &str) -> bool {
        GRPC_SUBSCRIPTIONS.contains(&path)
    }

    fn refusal(refused: ReplyRefused) -> Response<Self> {
        tonic::Status::resource_exhausted(refused.to_string()).into_http()
    }

    fn refusable(_: &Method, path: &str) -> bool {
        GRPC_REPEATABLE_READS.contains(&path)
    }

    fn read_as(_: &Method, path: &str) -> BodyRead {
        if REQUEST_STREAMS.contains(&path) {
            BodyRead::Messages
        } else {
            BodyRead::Whole
        }
    }

    /// Always wrapped: a gRPC request carries a message, and asking h2
    /// whether a stream has ended costs a lock.
    fn budgeted(self, budget: &Arc<BodyBudget>, read: BodyRead) -> (Self, Option<BodyCharge>) {
        match read {
            BodyRead::Upload => {
                let (body, charge) = Budgeted::streamed(self, Arc::clone(budget));
                (Self::new(body), Some(charge))
            }
            BodyRead::Messages => (
                Self::new(Budgeted::messages(self, Arc::clone(budget))),
                None,
            ),
            BodyRead::Whole => (Self::new(Budgeted::new(self, Arc::clone(budget))), None),
        }
    }
}

impl CountedBody for axum::body::Body {
    fn counted(self, guard: RequestGuard) -> Self {
        Self::new(Counted::new(self, guard))
    }

    fn reply_size(&self) -> Option<u64> {
        self.size_hint().exact()
    }

    fn counted_replying(self, guard: RequestGuard, charge: ReplyCharge) -> Self {
        Self::new(Counted::new(Replying::new(self, charge, true), guard))
    }

    /// Streamed answers (file downloads) bound what they queue by their
    /// own pumps.
    fn counted_charged_as_sent(self, guard: RequestGuard) -> Self {
        self.counted(guard)
    }

    /// HTTP's configuration subscriptions post to the app: none streams.
    fn counted_subscription(self, guard: RequestGuard) -> Self {
        self.counted(guard)
    }

    fn subscription(_: &Method, _: &str) -> bool {
        false
    }

    /// Dapr's error shape, as the request body budget refuses.
    fn refusal(refused: ReplyRefused) -> Response<Self> {
        let body = serde_json::json!({
            "errorCode": "ERR_TOO_MANY_REQUESTS",
            "message": refused.to_string(),
        });
        let mut response = Response::new(Self::from(body.to_string()));
        *response.status_mut() = tonic::codegen::http::StatusCode::TOO_MANY_REQUESTS;
        response.headers_mut().insert(
            tonic::codegen::http::header::CONTENT_TYPE,
            tonic::codegen::http::HeaderValue::from_static("application/json"),
        );
        response
    }

    /// By the path the router will see (cleaned as the hot path cleans
    /// it: `//v1.0/rewire/sequencer/…` is no state read).
    fn refusable(method: &Method, path: &str) -> bool {
        if !HTTP_REPEATABLE_READS.iter().any(|(read, _)| read == method) {
            return false;
        }
        let cleaned = crate::clean_path::cleaned(path);
        let routed = cleaned.as_deref().unwrap_or(path);
        HTTP_REPEATABLE_READS
            .iter()
            .any(|(read, route)| read == method && route_matches(route, routed))
    }

    /// By the path the router will see: cleaned as the hot path cleans
    /// it, so `//v1.0/rewire/file/…` is served as an upload and charged as
    /// one (else it would be charged whole and fail past the budget).
    fn read_as(method: &Method, path: &str) -> BodyRead {
        if method != Method::PUT {
            return BodyRead::Whole;
        }
        let cleaned = crate::clean_path::cleaned(path);
        let routed = cleaned.as_deref().unwrap_or(path);
        if routed.as_bytes().starts_with(HTTP_FILES.as_bytes()) {
            BodyRead::Upload
        } else {
            BodyRead::Whole
        }
    }

    /// An empty body (a GET's) as it is.
    fn budgeted(self, budget: &Arc<BodyBudget>, read: BodyRead) -> (Self, Option<BodyCharge>) {
        if self.is_end_stream() {
            return (self, None);
        }
        if read == BodyRead::Upload {
            let (body, charge) = Budgeted::streamed(self, Arc::clone(budget));
            return (Self::new(body), Some(charge));
        }
        (Self::new(Budgeted::new(self, Arc::clone(budget))), None)
    }
}

/// Where a request's count is.
#[derive(Clone)]
enum Counter {
    /// The connection's own (a service made per connection).
    Connection(InFlight),
    /// In the request's `PeerInfo` (tonic's connect info).
    PeerInfo,
}

/// Counts each request of `inner` and charges its body (see the module
/// doc).
#[derive(Clone)]
pub struct CountRequests<S> {
    inner: S,
    counter: Counter,
    budget: Arc<BodyBudget>,
}

/// [`CountRequests`] as a layer for tonic's server builder: requests find
/// their count in their `PeerInfo`.
#[derive(Clone)]
pub struct CountRequestsLayer(pub Arc<BodyBudget>);

impl<S> tower_layer::Layer<S> for CountRequestsLayer {
    type Service = CountRequests<S>;

    fn layer(&self, inner: S) -> CountRequests<S> {
        CountRequests {
            inner,
            counter: Counter::PeerInfo,
            budget: Arc::clone(&self.0),
        }
    }
}

impl<S> CountRequests<S> {
    /// `inner` for one connection's requests, counted in its `in_flight`
    /// (held here: no per-request look-up, nothing added to a request's
    /// extensions), bodies charged to `budget`.
    pub fn for_connection(inner: S, in_flight: InFlight, budget: Arc<BodyBudget>) -> Self {
        Self {
            inner,
            counter: Counter::Connection(in_flight),
            budget,
        }
    }
}

impl<S, RequestBody, ResponseBody> tower_service::Service<Request<RequestBody>> for CountRequests<S>
where
    S: tower_service::Service<Request<RequestBody>, Response = Response<ResponseBody>>,
    S::Future: Unpin,
    RequestBody: CountedBody,
    ResponseBody: CountedBody,
{
    type Response = Response<ResponseBody>;
    type Error = S::Error;
    type Future = CountedAnswer<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<RequestBody>) -> Self::Future {
        let guard = match &self.counter {
            Counter::Connection(in_flight) => Some(in_flight.start()),
            Counter::PeerInfo => request
                .extensions()
                .get::<crate::tls::PeerInfo>()
                .map(|peer| peer.in_flight.start()),
        };
        let (mut parts, body) = request.into_parts();
        let read = RequestBody::read_as(&parts.method, parts.uri.path());
        // Classified only if its answer needs it (unknown size, or past a
        // budget): a clone of each here costs less than the route match.
        let asked = guard
            .is_some()
            .then(|| (parts.method.clone(), parts.uri.clone()));
        let (body, charge) = body.budgeted(&self.budget, read);
        if let Some(charge) = charge {
            parts.extensions.insert(charge);
        }
        let request = Request::from_parts(parts, body);
        CountedAnswer {
            answer: self.inner.call(request),
            guard,
            asked,
        }
    }
}

/// The answer of a counted request: the guard goes with its body.
pub struct CountedAnswer<F> {
    answer: F,
    guard: Option<RequestGuard>,
    /// The request's method and target, which say whether its answer may
    /// be refused past the reply budgets (a repeatable read's).
    asked: Option<(Method, tonic::codegen::http::Uri)>,
}

impl<F, ResponseBody, E> Future for CountedAnswer<F>
where
    F: Future<Output = Result<Response<ResponseBody>, E>> + Unpin,
    ResponseBody: CountedBody,
{
    type Output = Result<Response<ResponseBody>, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let response = match Pin::new(&mut self.answer).poll(cx) {
            Poll::Ready(Ok(response)) => response,
            other => return other,
        };
        let Some(guard) = self.guard.take() else {
            return Poll::Ready(Ok(response));
        };
        let asked = self.asked.as_ref();
        let refusable =
            || asked.is_some_and(|(method, uri)| ResponseBody::refusable(method, uri.path()));
        let subscription =
            || asked.is_some_and(|(method, uri)| ResponseBody::subscription(method, uri.path()));
        Poll::Ready(Ok(replying(response, guard, refusable, subscription)))
    }
}

/// `response`, counted by `guard` and, when its size is known, charged to
/// its connection's reply budgets; when `refusable` (a repeatable read's),
/// refused instead (its body dropped at once) when it would pass either,
/// and charged as it is produced when its size is not known, as a
/// configuration `subscription`'s stream is.
fn replying<B: CountedBody>(
    response: Response<B>,
    guard: RequestGuard,
    refusable: impl FnOnce() -> bool,
    subscription: impl FnOnce() -> bool,
) -> Response<B> {
    let Some(size) = response.body().reply_size() else {
        if refusable() {
            return response.map(|body| body.counted_charged_as_sent(guard));
        }
        if subscription() {
            return response.map(|body| body.counted_subscription(guard));
        }
        return response.map(|body| body.counted(guard));
    };
    if size == 0 {
        return response.map(|body| body.counted(guard));
    }
    let size = usize::try_from(size).unwrap_or(usize::MAX);
    match ReplyCharge::take(guard.in_flight(), size) {
        Ok(charge) => response.map(|body| body.counted_replying(guard, charge)),
        // Past a budget: only a repeatable read's answer is refused; any
        // other call has had its effect, and its answer is sent.
        Err(refused) if refusable() => {
            drop(response);
            B::refusal(refused).map(|body| body.counted(guard))
        }
        Err(_) => {
            let charge = ReplyCharge::anyway(guard.in_flight(), size);
            response.map(|body| body.counted_replying(guard, charge))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;
    use std::future::{ready, Ready};

    /// Layotto's client-streaming upload.
    const LAYOTTO_PUT_FILE: &str = "/spec.proto.runtime.v1.Runtime/PutFile";

    /// Answers whether the request it was given carried a [`BodyCharge`].
    #[derive(Clone)]
    struct SeesCharge;

    impl<B: Default> tower_service::Service<Request<B>> for SeesCharge {
        type Response = Response<B>;
        type Error = Infallible;
        type Future = Ready<Result<Response<B>, Infallible>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, request: Request<B>) -> Self::Future {
            let charged = request.extensions().get::<BodyCharge>().is_some();
            let mut response = Response::new(B::default());
            response
                .headers_mut()
                .insert("charged", charged.to_string().parse().expect("a header"));
            ready(Ok(response))
        }
    }

    async fn charged<B: CountedBody + Default>(method: Method, path: &str, body: B) -> bool {
        let mut service = CountRequests {
            inner: SeesCharge,
            counter: Counter::PeerInfo,
            budget: BodyBudget::new(1 << 20),
        };
        let request = Request::builder()
            .method(method)
            .uri(path)
            .body(body)
            .expect("a request");
        let response = tower_service::Service::call(&mut service, request)
            .await
            .expect("an answer");
        response.headers()["charged"] == "true"
    }

    /// Only HTTP uploads get a shared charge in their extensions; other
    /// requests (a GetState's) hold theirs inline, allocating nothing, and
    /// a gRPC upload is charged by its messages' framing.
    #[tokio::test]
    async fn only_uploads_carry_a_body_charge() {
        let grpc = |bytes: &'static [u8]| tonic::body::Body::new(axum::body::Body::from(bytes));
        let put_file = tonic::body::Body::read_as(&Method::POST, LAYOTTO_PUT_FILE);
        assert_eq!(put_file, BodyRead::Messages);
        assert!(!charged(Method::POST, LAYOTTO_PUT_FILE, grpc(b"x")).await);
        assert!(
            !charged(
                Method::POST,
                "/dapr.proto.runtime.v1.Dapr/GetState",
                grpc(b"x")
            )
            .await
        );
        assert!(
            !charged(
                Method::POST,
                "/spec.proto.runtime.v1.Runtime/GetFile",
                grpc(b"x")
            )
            .await
        );

        let http = |bytes: &'static [u8]| axum::body::Body::from(bytes);
        assert!(charged(Method::PUT, "/v1.0/rewire/file/files/a/b", http(b"x")).await);
        // Charged by the path the router sees, cleaned.
        assert!(charged(Method::PUT, "//v1.0/rewire/file/files/a", http(b"x")).await);
        assert!(charged(Method::PUT, "/v1.0/./rewire//file/files/a", http(b"x")).await);
        assert!(charged(Method::PUT, "/v1.0/x/../rewire/file/files/a", http(b"x")).await);
        assert!(!charged(Method::PUT, "/v1.0/rewire/file/../../state/s", http(b"x")).await);
        assert!(!charged(Method::POST, "/v1.0/state/store", http(b"x")).await);
        assert!(!charged(Method::GET, "/v1.0/rewire/file/files/a", http(b"x")).await);
        assert!(!charged(Method::PUT, "/v1.0/state/store", http(b"x")).await);
    }

    /// Only reads a client can repeat are refused past the reply budgets;
    /// the calls that change state (a lock, an id, a subscription) are
    /// answered whatever the budgets hold.
    #[test]
    fn only_repeatable_reads_may_be_refused() {
        let http = |method: Method, path: &str| axum::body::Body::refusable(&method, path);
        assert!(http(Method::GET, "/v1.0/state/orders/key"));
        assert!(http(Method::GET, "/v1.0/state/orders/bulk"));
        assert!(http(Method::POST, "/v1.0/state/orders/bulk"));
        assert!(http(Method::GET, "/v1.0/secrets/vault/bulk"));
        assert!(http(Method::GET, "/v1.0-alpha1/configuration/config"));
        assert!(http(Method::GET, "/v1.0/metadata"));
        assert!(http(Method::GET, "/v1.0/rewire/file/files/a/b"));
        assert!(http(Method::GET, "//v1.0/state/./orders/key"));
        assert!(!http(Method::POST, "/v1.0-alpha1/lock/locks"));
        assert!(!http(Method::POST, "/v1.0-alpha1/unlock/locks"));
        assert!(!http(Method::GET, "/v1.0/rewire/sequencer/ids/orders"));
        assert!(!http(
            Method::GET,
            "/v1.0/state/x/../../rewire/sequencer/ids/k"
        ));
        assert!(!http(Method::GET, "/v1.0/configuration/config/subscribe"));
        assert!(!http(
            Method::GET,
            "/v1.0/configuration/config/id/unsubscribe"
        ));
        assert!(!http(Method::POST, "/v1.0/state/orders"));
        assert!(!http(Method::POST, "/v1.0/state/orders/transaction"));
        assert!(!http(Method::DELETE, "/v1.0/state/orders/key"));
        assert!(!http(Method::POST, "/v1.0/publish/bulk/pubsub/topic"));
        assert!(!http(Method::GET, "/v1.0/state/orders/key/more"));

        let grpc = |path: &str| tonic::body::Body::refusable(&Method::POST, path);
        assert!(grpc("/dapr.proto.runtime.v1.Dapr/GetState"));
        assert!(grpc("/spec.proto.runtime.v1.Runtime/GetBulkState"));
        assert!(grpc("/spec.proto.runtime.v1.Runtime/GetSecret"));
        assert!(grpc("/spec.proto.runtime.v1.Runtime/GetBulkSecret"));
        assert!(grpc("/spec.proto.runtime.v1.Runtime/GetConfiguration"));
        assert!(!grpc("/spec.proto.runtime.v1.Runtime/SaveConfiguration"));
        assert!(!grpc(
            "/spec.proto.runtime.v1.Runtime/SubscribeConfiguration"
        ));
        assert!(!grpc("/dapr.proto.runtime.v1.Dapr/TryLockAlpha1"));
        assert!(!grpc("/dapr.proto.runtime.v1.Dapr/SaveState"));
        assert!(!grpc("/spec.proto.runtime.v1.Runtime/GetNextId"));
    }

    /// Answers a stream of two data frames of unknown size: a
    /// subscription's id (10 bytes), then a change of [`CHANGE`] bytes.
    #[derive(Clone)]
    struct Streams;

    /// The bytes of the change [`Streams`] answers.
    const CHANGE: usize = 3 * super::super::SLICE;

    impl tower_service::Service<Request<tonic::body::Body>> for Streams {
        type Response = Response<tonic::body::Body>;
        type Error = Infallible;
        type Future = Ready<Result<Self::Response, Infallible>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: Request<tonic::body::Body>) -> Self::Future {
            let frames = [vec![1; 10], vec![2; CHANGE]]
                .map(|frame| Ok::<_, Infallible>(tonic::codegen::Bytes::from(frame)));
            let body = axum::body::Body::from_stream(tokio_stream::iter(frames));
            ready(Ok(Response::new(tonic::body::Body::new(body))))
        }
    }

    /// The answer of `Streams` to a call of `path` on a connection whose
    /// budget is `budget` bytes, and the connection.
    async fn streamed(path: &str, budget: usize) -> (tonic::body::Body, InFlight) {
        let limits = crate::reply_budget::ReplyLimits::new(budget, 1 << 30);
        streamed_within(path, &limits).await
    }

    /// The answer to a call on `path` over a connection of `limits`.
    async fn streamed_within(
        path: &str,
        limits: &crate::reply_budget::ReplyLimits,
    ) -> (tonic::body::Body, InFlight) {
        let in_flight = InFlight::with_replies(limits);
        let mut service =
            CountRequests::for_connection(Streams, in_flight.clone(), BodyBudget::new(1 << 20));
        let request = Request::builder()
            .method(Method::POST)
            .uri(path)
            .body(tonic::body::Body::empty())
            .expect("a request");
        let response = tower_service::Service::call(&mut service, request)
            .await
            .expect("an answer");
        (response.into_body(), in_flight)
    }

    async fn next_frame(
        body: &mut tonic::body::Body,
    ) -> Option<http_body::Frame<tonic::codegen::Bytes>> {
        let frame = std::future::poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx)).await?;
        Some(frame.expect("a frame"))
    }

    /// A configuration subscription's stream (Dapr's, its `Alpha1` twin,
    /// Layotto's) is charged to its connection's reply budget as tonic
    /// produces it and handed on in slices, so what a client granting no
    /// window makes the sidecar hold is bounded; its id is always sent,
    /// and a change past the budget ends the stream with its reason
    /// (failed before the fix: never charged, each change handed to h2
    /// whole).
    #[tokio::test]
    async fn a_subscription_stream_is_charged_and_refused_only_past_its_connections_budget() {
        const SUBSCRIPTIONS: [&str; 3] = [
            "/dapr.proto.runtime.v1.Dapr/SubscribeConfiguration",
            "/dapr.proto.runtime.v1.Dapr/SubscribeConfigurationAlpha1",
            "/spec.proto.runtime.v1.Runtime/SubscribeConfiguration",
        ];
        for path in SUBSCRIPTIONS {
            let (mut body, in_flight) = streamed(path, 1 << 20).await;
            let id = next_frame(&mut body).await.expect("the id");
            assert_eq!(id.data_ref().map(|d| d.len()), Some(10), "{path}");
            assert_eq!(in_flight.replies().held(), 10, "{path}: the id charged");
            let slice = next_frame(&mut body).await.expect("a slice of the change");
            assert_eq!(
                slice.data_ref().map(|d| d.len()),
                Some(super::super::SLICE),
                "{path}: handed on in slices"
            );
            assert_eq!(in_flight.replies().held(), CHANGE, "{path}: charged whole");
            drop(body);
            assert_eq!(in_flight.replies().held(), 0, "{path}");
        }
        // Another answer holds the connection's budget: the id passes, the
        // change ends the stream.
        let (mut body, in_flight) = streamed(SUBSCRIPTIONS[0], 100).await;
        let held = ReplyCharge::anyway(&in_flight, 100);
        assert!(next_frame(&mut body).await.is_some_and(|f| f.is_data()));
        let end = next_frame(&mut body).await.expect("the end");
        let trailers = end.into_trailers().expect("trailers");
        assert_eq!(trailers["grpc-status"], "8");
        // Percent-encoded, as gRPC sends it.
        let message = trailers["grpc-message"].to_str().expect("text");
        let message = message.replace("%20", " ");
        assert!(
            message.contains("configuration subscription dropped")
                && message.contains("max_response_bytes_in_flight_per_connection"),
            "{message}"
        );
        assert!(next_frame(&mut body).await.is_none());
        drop(held);
        assert_eq!(in_flight.replies().held(), 0);
        // Other connections hold the listener's budget and this one holds
        // a read: the change is still sent, charged (failed with the first
        // version: other clients filling the listener dropped it).
        let limits = crate::reply_budget::ReplyLimits::new(1 << 30, 2 * CHANGE);
        let others = InFlight::with_replies(&limits);
        let filling = ReplyCharge::anyway(&others, 2 * CHANGE);
        let (mut body, in_flight) = streamed_within(SUBSCRIPTIONS[2], &limits).await;
        let read = ReplyCharge::anyway(&in_flight, 1);
        assert!(next_frame(&mut body).await.is_some_and(|f| f.is_data()));
        let slice = next_frame(&mut body).await.expect("a slice of the change");
        assert!(slice.is_data(), "{slice:?}");
        assert_eq!(in_flight.replies().held(), 1 + CHANGE);
        drop((body, read, filling));
        assert_eq!(in_flight.replies().held(), 0);
        // Other streams of unknown size are not charged here.
        let (mut body, in_flight) = streamed(
            "/dapr.proto.runtime.v1.Dapr/SubscribeTopicEventsAlpha1",
            100,
        )
        .await;
        assert!(next_frame(&mut body).await.is_some());
        assert_eq!(in_flight.replies().held(), 0);
    }
}
