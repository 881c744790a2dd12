//! The service layer in front of both servers: it counts each request in
//! its connection's [`InFlight`] from the call until its response body
//! ends, and charges its body to the listener's [`BodyBudget`] as it is
//! read. The same for both servers, which differ only in where a request
//! finds its connection and in their body type.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http_body::Body as _;
use tonic::codegen::http::{Extensions, Request, Response};

use super::{BodyBudget, Budgeted, Counted, InFlight, RequestGuard};

/// A server's body type (requests' and responses' alike), which can carry
/// a request's guard or be charged to a budget.
pub trait CountedBody: Sized {
    /// `self`, keeping `guard` until it ends.
    fn counted(self, guard: RequestGuard) -> Self;

    /// `self`, charged to `budget` as it is read (an empty body as it is).
    fn budgeted(self, budget: &Arc<BodyBudget>) -> Self;
}

impl CountedBody for tonic::body::Body {
    fn counted(self, guard: RequestGuard) -> Self {
        Self::new(Counted::new(self, guard))
    }

    fn budgeted(self, budget: &Arc<BodyBudget>) -> Self {
        match self.is_end_stream() {
            true => self,
            false => Self::new(Budgeted::new(self, Arc::clone(budget))),
        }
    }
}

impl CountedBody for axum::body::Body {
    fn counted(self, guard: RequestGuard) -> Self {
        Self::new(Counted::new(self, guard))
    }

    fn budgeted(self, budget: &Arc<BodyBudget>) -> Self {
        match self.is_end_stream() {
            true => self,
            false => Self::new(Budgeted::new(self, Arc::clone(budget))),
        }
    }
}

/// Where a request finds its connection's count.
pub type FindInFlight = fn(&Extensions) -> Option<&InFlight>;

/// Counts each request of `inner` and charges its body (see the module
/// doc).
#[derive(Clone)]
pub struct CountRequests<S> {
    inner: S,
    find: FindInFlight,
    budget: Arc<BodyBudget>,
}

impl<S> CountRequests<S> {
    /// `inner`, counting requests in the count `find` gives and charging
    /// their bodies to `budget`.
    pub fn new(inner: S, find: FindInFlight, budget: Arc<BodyBudget>) -> Self {
        Self {
            inner,
            find,
            budget,
        }
    }
}

/// [`CountRequests`] as a layer (for tonic's server builder).
#[derive(Clone)]
pub struct CountRequestsLayer {
    /// Where a request finds its connection's count.
    pub find: FindInFlight,
    /// What the listener's request bodies are charged to.
    pub budget: Arc<BodyBudget>,
}

impl<S> tower_layer::Layer<S> for CountRequestsLayer {
    type Service = CountRequests<S>;

    fn layer(&self, inner: S) -> CountRequests<S> {
        CountRequests::new(inner, self.find, Arc::clone(&self.budget))
    }
}

impl<S, RequestBody, ResponseBody> tower_service::Service<Request<RequestBody>> for CountRequests<S>
where
    S: tower_service::Service<Request<RequestBody>, Response = Response<ResponseBody>>,
    S::Future: Send + 'static,
    RequestBody: CountedBody,
    ResponseBody: CountedBody + 'static,
{
    type Response = Response<ResponseBody>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<RequestBody>) -> Self::Future {
        let guard = (self.find)(request.extensions()).map(InFlight::start);
        let request = request.map(|body| body.budgeted(&self.budget));
        let answer = self.inner.call(request);
        Box::pin(async move {
            let response = answer.await?;
            Ok(match guard {
                Some(guard) => response.map(|body| body.counted(guard)),
                None => response,
            })
        })
    }
}
