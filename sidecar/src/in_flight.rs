//! The requests in flight on one connection, so that a connection with
//! none is closed after the idle timeout whatever bytes still move: the
//! server's own HTTP/2 keepalive pings (and their answers), or a request
//! head trickled in a byte at a time, would otherwise keep a connection —
//! and its slot under the cap — for ever.
//!
//! Both servers count a request from the moment it reaches the service
//! until its response body ends or is dropped ([`Counted`]): a streamed
//! subscription counts for as long as it is open.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use http_body::{Body, Frame, SizeHint};
use tokio::time::Instant;

/// One connection's count, shared by the connection and its requests.
#[derive(Clone, Debug)]
pub struct InFlight(Arc<Counts>);

#[derive(Debug)]
struct Counts {
    open: AtomicUsize,
    /// When `open` last fell to zero (or the connection came), in
    /// nanoseconds since `base`.
    idle_from: AtomicU64,
    base: Instant,
}

impl InFlight {
    /// A connection that arrived now, with no request yet.
    pub fn new() -> Self {
        Self(Arc::new(Counts {
            open: AtomicUsize::new(0),
            idle_from: AtomicU64::new(0),
            base: Instant::now(),
        }))
    }

    /// Counts a request until the guard is dropped.
    pub fn start(&self) -> RequestGuard {
        self.0.open.fetch_add(1, Ordering::AcqRel);
        RequestGuard(self.clone())
    }

    /// Since when the connection has had no request in flight; `None`
    /// while one is.
    pub(crate) fn idle_since(&self) -> Option<Instant> {
        if self.0.open.load(Ordering::Acquire) > 0 {
            return None;
        }
        let since =
            self.0.base + std::time::Duration::from_nanos(self.0.idle_from.load(Ordering::Acquire));
        // A request that started meanwhile wins.
        (self.0.open.load(Ordering::Acquire) == 0).then_some(since)
    }
}

impl Default for InFlight {
    fn default() -> Self {
        Self::new()
    }
}

/// One request in flight.
#[derive(Debug)]
pub struct RequestGuard(InFlight);

impl Drop for RequestGuard {
    fn drop(&mut self) {
        let counts = &self.0 .0;
        // The time first, then the count (every request's end, so two
        // ending at once cannot leave an older time): a reader seeing no
        // request sees when the last one ended.
        let nanos = u64::try_from(counts.base.elapsed().as_nanos()).unwrap_or(u64::MAX);
        counts.idle_from.fetch_max(nanos, Ordering::AcqRel);
        counts.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A response body that keeps its request counted until it ends or is
/// dropped.
pub struct Counted<B> {
    body: B,
    guard: Option<RequestGuard>,
}

impl<B> Counted<B> {
    /// `body`, counted by `guard`.
    pub fn new(body: B, guard: RequestGuard) -> Self {
        Self {
            body,
            guard: Some(guard),
        }
    }
}

impl<B: Body + Unpin> Body for Counted<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        if matches!(polled, Poll::Ready(None)) {
            self.guard = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn idle_counts_from_the_last_request_that_ended() {
        let in_flight = InFlight::new();
        let came = Instant::now();
        assert_eq!(in_flight.idle_since(), Some(came));
        tokio::time::advance(Duration::from_secs(5)).await;
        let first = in_flight.start();
        let second = in_flight.start();
        assert_eq!(in_flight.idle_since(), None);
        drop(first);
        assert_eq!(in_flight.idle_since(), None, "one is still in flight");
        tokio::time::advance(Duration::from_secs(5)).await;
        drop(second);
        assert_eq!(in_flight.idle_since(), Some(came + Duration::from_secs(10)));
    }
}
