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
//! The bound counts from the instant the request head arrived (the clock
//! read once per bounded call, not at all for an upload). The Lifecycle
//! pushes, whose handlers reckon their deadline themselves
//! (`lifecycle_wait`), are stamped with that instant ([`Arrived`]): a push
//! whose handler runs only once the body is in and decoded reckons its
//! deadline from the arrival too, as the bound and tonic's `grpc-timeout`
//! do. No other call is stamped: none reads it.

use std::task::{Context, Poll};
use std::time::Duration;

use tonic::body::Body;
use tonic::codegen::http::{Request, Response};
use tonic::codegen::{BoxFuture, Service};
use tonic::Status;

/// When a call's request head arrived, in its extensions (put there by
/// [`CallBound`] for the calls in [`STAMPED`]): the caller's `grpc-timeout`
/// and the server's bound count from it, not from when the handler runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Arrived(pub(crate) tokio::time::Instant);

/// Layotto's client-streaming upload, bounded by inactivity instead.
const PUT_FILE: &str = "/spec.proto.runtime.v1.Runtime/PutFile";

/// The calls stamped with [`Arrived`]: those whose handlers read it
/// (`lifecycle_wait::CallerClock`), rewire's Lifecycle pushes and Layotto's
/// `ApplyConfiguration`. `GetStatus` does not wait on a reload.
const STAMPED: [&str; 5] = [
    "/rewire.lifecycle.v1.Lifecycle/ApplyConfiguration",
    "/rewire.lifecycle.v1.Lifecycle/AmendConfiguration",
    "/rewire.lifecycle.v1.Lifecycle/RemoveComponent",
    "/rewire.lifecycle.v1.Lifecycle/ReleaseComponent",
    "/spec.proto.runtime.v1.Lifecycle/ApplyConfiguration",
];

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

/// Whether a call to `path` is stamped with its arrival.
fn stamped(path: &str) -> bool {
    STAMPED.contains(&path)
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
        let path = request.uri().path();
        if !bounded(path) {
            return Box::pin(self.inner.call(request));
        }
        let arrived = tokio::time::Instant::now();
        if stamped(path) {
            request.extensions_mut().insert(Arrived(arrived));
        }
        let limit = self.limit;
        // A bound past what the clock can tell is no bound.
        let Some(due) = arrived.checked_add(limit) else {
            return Box::pin(self.inner.call(request));
        };
        let answer = self.inner.call(request);
        Box::pin(async move {
            match tokio::time::timeout_at(due, answer).await {
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
    use std::sync::{Arc, Mutex};

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

    /// A service answering every call at once, noting whether it was
    /// stamped with its arrival.
    #[derive(Clone, Default)]
    struct Notes(Arc<Mutex<Vec<Option<Arrived>>>>);

    impl Service<Request<Body>> for Notes {
        type Response = Response<Body>;
        type Error = std::convert::Infallible;
        type Future = std::future::Ready<Result<Response<Body>, Self::Error>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, request: Request<Body>) -> Self::Future {
            let stamp = request.extensions().get::<Arrived>().copied();
            self.0.lock().unwrap_or_else(|p| p.into_inner()).push(stamp);
            std::future::ready(Ok(Response::new(Body::empty())))
        }
    }

    /// The stamp a call to `path` carries to its handler.
    async fn stamp_of(path: &str) -> Option<Arrived> {
        let notes = Notes::default();
        let mut bounded =
            tower_layer::Layer::layer(&CallBoundLayer::new(Duration::from_secs(45)), notes.clone());
        let request = Request::builder()
            .uri(path)
            .body(Body::empty())
            .expect("request");
        bounded.call(request).await.expect("an answer");
        let seen = notes.0.lock().unwrap_or_else(|p| p.into_inner()).clone();
        assert_eq!(seen.len(), 1, "{path} reached the service once");
        seen[0]
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

    /// The bound counts from the call's arrival, not from when its answer
    /// is first awaited: a call first polled 30 s late is cut 15 s later.
    #[tokio::test(start_paused = true)]
    async fn the_bound_counts_from_the_calls_arrival() {
        let answer = call("/dapr.proto.runtime.v1.Dapr/GetState");
        tokio::time::advance(Duration::from_secs(30)).await;
        let cut = tokio::time::timeout(Duration::from_secs(16), answer)
            .await
            .expect("cut 45 s after arrival")
            .expect("an answer");
        let status = Status::from_header_map(cut.headers()).expect("a status");
        assert_eq!(status.code(), tonic::Code::DeadlineExceeded);
    }

    /// Only the calls whose handlers read the arrival carry it: the
    /// Lifecycle pushes, stamped with the instant the call came in; not
    /// `GetState` (the hot path), `GetStatus` or an upload.
    #[tokio::test(start_paused = true)]
    async fn only_lifecycle_pushes_are_stamped_with_their_arrival() {
        for path in [
            "/dapr.proto.runtime.v1.Dapr/GetState",
            "/rewire.lifecycle.v1.Lifecycle/GetStatus",
            "/spec.proto.runtime.v1.Runtime/GetFile",
            PUT_FILE,
        ] {
            assert_eq!(stamp_of(path).await, None, "{path} is not stamped");
        }
        for path in STAMPED {
            let now = tokio::time::Instant::now();
            assert_eq!(
                stamp_of(path).await,
                Some(Arrived(now)),
                "{path} is stamped"
            );
        }
        assert!(stamped("/rewire.lifecycle.v1.Lifecycle/ApplyConfiguration"));
        assert!(stamped(
            "/spec.proto.runtime.v1.Lifecycle/ApplyConfiguration"
        ));
    }

    #[test]
    fn only_uploads_are_left_to_their_own_bound() {
        assert!(!bounded(PUT_FILE));
        assert!(bounded("/spec.proto.runtime.v1.Runtime/GetFile"));
        assert!(bounded("/dapr.proto.runtime.v1.Dapr/GetState"));
        assert!(bounded("/rewire.lifecycle.v1.Lifecycle/ApplyConfiguration"));
    }
}
