//! The service layer that counts each request in its connection's
//! [`InFlight`] from the call until its response body ends: the same for
//! both servers, which differ only in where a request finds its
//! connection and in their body type.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tonic::codegen::http::{Extensions, Request, Response};

use super::{Counted, InFlight, RequestGuard};

/// A server's response body, which can carry a request's guard.
pub trait CountedBody: Sized {
    /// `self`, keeping `guard` until it ends.
    fn counted(self, guard: RequestGuard) -> Self;
}

impl CountedBody for tonic::body::Body {
    fn counted(self, guard: RequestGuard) -> Self {
        Self::new(Counted::new(self, guard))
    }
}

impl CountedBody for axum::body::Body {
    fn counted(self, guard: RequestGuard) -> Self {
        Self::new(Counted::new(self, guard))
    }
}

/// Where a request finds its connection's count.
pub type FindInFlight = fn(&Extensions) -> Option<&InFlight>;

/// Counts each request of `inner` (see the module doc).
#[derive(Clone)]
pub struct CountRequests<S> {
    inner: S,
    find: FindInFlight,
}

impl<S> CountRequests<S> {
    /// `inner`, counting requests in the count `find` gives.
    pub fn new(inner: S, find: FindInFlight) -> Self {
        Self { inner, find }
    }
}

/// [`CountRequests`] as a layer (for tonic's server builder).
#[derive(Clone)]
pub struct CountRequestsLayer(pub FindInFlight);

impl<S> tower_layer::Layer<S> for CountRequestsLayer {
    type Service = CountRequests<S>;

    fn layer(&self, inner: S) -> CountRequests<S> {
        CountRequests::new(inner, self.0)
    }
}

impl<S, RequestBody, ResponseBody> tower_service::Service<Request<RequestBody>> for CountRequests<S>
where
    S: tower_service::Service<Request<RequestBody>, Response = Response<ResponseBody>>,
    S::Future: Send + 'static,
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
