//! The server's backstop on every call but uploads: a call whose answer
//! (for a stream: its head) is not ready within the bound is answered
//! `DEADLINE_EXCEEDED`. Each method bounds itself more tightly where it
//! can (unary calls by `request_timeout`, Lifecycle pushes before the
//! Lifecycle timeout or the caller's deadline); this catches whatever
//! does not.
//!
//! Layotto's `PutFile` is not bounded here: an upload that keeps sending
//! may take as long as it needs (the store bounds its size), and is cut
//! when no chunk arrives for `request_timeout` (`layotto_file`). The
//! client's own `grpc-timeout` still bounds every call, uploads included
//! (tonic reads it on every call).
//!
//! Every call (an upload too) is stamped with the instant its request head
//! arrived ([`Arrived`]), as the bound and tonic's `grpc-timeout` count
//! from it: a handler that runs only once the body is in and decoded
//! reckons its deadline from there too.

use std::task::{Context, Poll};
use std::time::Duration;

use tonic::body::Body;
use tonic::codegen::http::{Request, Response};
use tonic::codegen::{BoxFuture, Service};
use tonic::Status;

/// When a call's request head arrived, in its extensions (put there by
/// [`CallBound`] for every call): the caller's `grpc-timeout` and the
/// server's bound count from it, not from when the handler runs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Arrived(pub(crate) tokio::time::Instant);

/// Layotto's client-streaming upload, bounded by inactivity instead.
const PUT_FILE: &str = "/spec.proto.runtime.v1.Runtime/PutFile";

/// Puts [`CallBound`] in front of the gRPC services.
#[derive(Clone, Copy)]
pub(super) struct CallBoundLayer {
    limit: Duration,
}

impl CallBoundLayer {
    /// Every call but an upload answered within `limit`.
    pub(super) fn new(limit: Duration) -> Self {
        Self { limit }
    }
}

impl<S> tower_layer::Layer<S> for CallBoundLayer {
    type Service = CallBound<S>;

    fn layer(&self, inner: S) -> CallBound<S> {
        CallBound {
            inner,
            limit: self.limit,
        }
    }
}

/// The gRPC services, each call but an upload cut after `limit`.
#[derive(Clone)]
pub(super) struct CallBound<S> {
    inner: S,
    limit: Duration,
}

/// Whether a call to `path` is bounded by the backstop.
fn bounded(path: &str) -> bool {
    path != PUT_FILE
}

impl<S> Service<Request<Body>> for CallBound<S>
where
    S: Service<Request<Body>, Response = Response<Body>>,
    S::Future: Send + 'static,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<Response<Body>, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<Body>) -> Self::Future {
        request
            .extensions_mut()
            .insert(Arrived(tokio::time::Instant::now()));
        if !bounded(request.uri().path()) {
            return Box::pin(self.inner.call(request));
        }
        let limit = self.limit;
        let answer = self.inner.call(request);
        Box::pin(async move {
            match tokio::time::timeout(limit, answer).await {
                Ok(answered) => answered,
                Err(_) => Ok(Status::deadline_exceeded(format!(
                    "the call did not complete within {limit:?} (the server's bound on every \
                     call but uploads: the longer of request_timeout and the Lifecycle timeout)"
                ))
                .into_http()),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A service whose every call hangs.
    #[derive(Clone)]
    struct Hangs;

    impl Service<Request<Body>> for Hangs {
        type Response = Response<Body>;
        type Error = std::convert::Infallible;
        type Future = std::future::Pending<Result<Response<Body>, Self::Error>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: Request<Body>) -> Self::Future {
            std::future::pending()
        }
    }

    fn call(path: &str) -> BoxFuture<Response<Body>, std::convert::Infallible> {
        let mut bounded =
            tower_layer::Layer::layer(&CallBoundLayer::new(Duration::from_secs(45)), Hangs);
        let request = Request::builder()
            .uri(path)
            .body(Body::empty())
            .expect("request");
        bounded.call(request)
    }

    #[tokio::test(start_paused = true)]
    async fn a_unary_call_that_hangs_is_cut_and_an_upload_is_not() {
        let answer = tokio::time::timeout(
            Duration::from_secs(46),
            call("/dapr.proto.runtime.v1.Dapr/GetState"),
        )
        .await
        .expect("cut by the bound")
        .expect("an answer");
        let status = Status::from_header_map(answer.headers()).expect("a status");
        assert_eq!(status.code(), tonic::Code::DeadlineExceeded);
        assert!(status.message().contains("45s"), "{}", status.message());
        let upload = tokio::time::timeout(Duration::from_secs(3600), call(PUT_FILE)).await;
        assert!(upload.is_err(), "an upload is left to its idle bound");
    }

    #[test]
    fn only_uploads_are_left_to_their_own_bound() {
        assert!(!bounded(PUT_FILE));
        assert!(bounded("/spec.proto.runtime.v1.Runtime/GetFile"));
        assert!(bounded("/dapr.proto.runtime.v1.Dapr/GetState"));
        assert!(bounded("/rewire.lifecycle.v1.Lifecycle/ApplyConfiguration"));
    }
}
