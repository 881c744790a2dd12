//! The service layer in front of both servers: it counts each request in
//! its connection's [`InFlight`] from the call until its response body
//! ends, and charges its body to the listener's [`BodyBudget`] as it is
//! read (the body's [`BodyCharge`] in the request's extensions, for a
//! reader that streams it on). The same for both servers, which differ in how a request finds
//! its connection (axum makes a service per connection, which holds the
//! count; tonic's requests carry their connection's [`PeerInfo`]) and in
//! their body type.
//!
//! [`PeerInfo`]: crate::tls::PeerInfo

use std::convert::Infallible;
use std::future::{ready, Future, Ready};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http_body::Body as _;
use tonic::codegen::http::{Request, Response};

use super::{Accepted, BodyBudget, BodyCharge, Budgeted};
use crate::in_flight::{Counted, InFlight, RequestGuard};

/// A server's body type (requests' and responses' alike), which can carry
/// a request's guard or be charged to a budget.
pub trait CountedBody: Sized {
    /// `self`, keeping `guard` until it ends.
    fn counted(self, guard: RequestGuard) -> Self;

    /// `self`, charged to `budget` as it is read, and the handle on its
    /// charge (none for a body left as it is).
    fn budgeted(self, budget: &Arc<BodyBudget>) -> (Self, Option<BodyCharge>);
}

impl CountedBody for tonic::body::Body {
    fn counted(self, guard: RequestGuard) -> Self {
        Self::new(Counted::new(self, guard))
    }

    /// Always wrapped: a gRPC request carries a message, and asking h2
    /// whether a stream has ended costs a lock.
    fn budgeted(self, budget: &Arc<BodyBudget>) -> (Self, Option<BodyCharge>) {
        let body = Budgeted::new(self, Arc::clone(budget));
        let charge = body.charge();
        (Self::new(body), Some(charge))
    }
}

impl CountedBody for axum::body::Body {
    fn counted(self, guard: RequestGuard) -> Self {
        Self::new(Counted::new(self, guard))
    }

    /// An empty body (a GET's) as it is.
    fn budgeted(self, budget: &Arc<BodyBudget>) -> (Self, Option<BodyCharge>) {
        if self.is_end_stream() {
            return (self, None);
        }
        let body = Budgeted::new(self, Arc::clone(budget));
        let charge = body.charge();
        (Self::new(body), Some(charge))
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

/// Makes, for each connection axum serves, a [`CountRequests`] around a
/// clone of `inner` holding the connection's count.
#[derive(Clone)]
pub struct CountRequestsPerConnection<S> {
    inner: S,
    budget: Arc<BodyBudget>,
}

impl<S> CountRequestsPerConnection<S> {
    /// `inner` for each connection, bodies charged to `budget`.
    pub fn new(inner: S, budget: Arc<BodyBudget>) -> Self {
        Self { inner, budget }
    }
}

impl<S: Clone> tower_service::Service<axum::serve::IncomingStream<'_, Accepted>>
    for CountRequestsPerConnection<S>
{
    type Response = CountRequests<S>;
    type Error = Infallible;
    type Future = Ready<Result<CountRequests<S>, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, connection: axum::serve::IncomingStream<'_, Accepted>) -> Self::Future {
        ready(Ok(CountRequests {
            inner: self.inner.clone(),
            counter: Counter::Connection(connection.io().in_flight().clone()),
            budget: Arc::clone(&self.budget),
        }))
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
        let (body, charge) = body.budgeted(&self.budget);
        if let Some(charge) = charge {
            parts.extensions.insert(charge);
        }
        let request = Request::from_parts(parts, body);
        CountedAnswer {
            answer: self.inner.call(request),
            guard,
        }
    }
}

/// The answer of a counted request: the guard goes with its body.
pub struct CountedAnswer<F> {
    answer: F,
    guard: Option<RequestGuard>,
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
        Poll::Ready(Ok(match self.guard.take() {
            Some(guard) => response.map(|body| body.counted(guard)),
            None => response,
        }))
    }
}
