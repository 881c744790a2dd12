//! The requests in flight on one connection, so that a connection with
//! none is closed after the idle timeout whatever bytes still move: the
//! server's own HTTP/2 keepalive pings (and their answers), or a request
//! head trickled in a byte at a time, would otherwise keep a connection —
//! and its slot under the cap — for ever.
//!
//! Both servers count a request from the moment it reaches the service
//! until its response body ends or is dropped ([`Counted`]): a streamed
//! subscription counts for as long as it is open.
//!
//! A request in flight keeps its connection open only while its answer
//! moves: a response that has handed the server a chunk and is not asked
//! for the next one is *waiting for the client* (a client that grants no
//! flow-control window, or reads nothing, leaves it so for ever while the
//! server's keepalive pings and their answers still move bytes). The
//! connection ends once a response has waited for the idle timeout,
//! whatever bytes move ([`InFlight::stalled`]). A quiet subscription
//! (polled, nothing to send) is not waiting.
//!
//! Waiting responses are counted, not timed: each goes into the count of
//! the connection's current *epoch* (one of two); the connection, when its
//! timer fires, opens the next epoch once the older count is empty, and a
//! response still counted in the older epoch an idle timeout after the
//! newer one opened has waited at least that long. A chunk costs two
//! atomic additions and a load, no clock read, no allocation.
//!
//! The connection's budget of reply bytes not yet taken by the client
//! ([`crate::reply_budget`]) is kept here too, where each request finds
//! it.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use http_body::{Body, Frame, SizeHint};
use tokio::time::Instant;

use crate::reply_budget::{ConnectionReplies, ReplyLimits};

/// `wait` after `from`, or far in the future when the clock cannot hold
/// that instant: a timing option of `Duration::MAX` means never, in effect,
/// not a panic in a connection's task.
pub(crate) use rewire_runtime::deadline_from as deadline_after;

/// One connection's count, shared by the connection and its requests.
#[derive(Clone, Debug)]
pub struct InFlight(Arc<Counts>);

#[derive(Debug)]
struct Counts {
    open: AtomicUsize,
    /// Whether a request has ever started (a connection that never starts
    /// one is closed sooner than an idle one).
    started: AtomicBool,
    /// Responses waiting for the client, by the epoch they began waiting
    /// in.
    waiting: [AtomicUsize; 2],
    /// The current epoch (0 or 1), which new waits are counted in.
    epoch: AtomicUsize,
    /// When `open` last fell to zero (or the connection came), in
    /// nanoseconds since `base`.
    idle_from: AtomicU64,
    base: Instant,
    /// Reply bytes held for the connection, and its listener's.
    replies: ConnectionReplies,
}

impl InFlight {
    /// A connection that arrived now, with no request yet and no bound
    /// on the replies it holds.
    pub fn new() -> Self {
        Self::with_replies(&ReplyLimits::unbounded())
    }

    /// A connection that arrived now, its replies bounded by `limits`.
    pub fn with_replies(limits: &ReplyLimits) -> Self {
        Self(Arc::new(Counts {
            open: AtomicUsize::new(0),
            started: AtomicBool::new(false),
            waiting: [AtomicUsize::new(0), AtomicUsize::new(0)],
            epoch: AtomicUsize::new(0),
            idle_from: AtomicU64::new(0),
            base: Instant::now(),
            replies: limits.for_connection(),
        }))
    }

    /// The connection's reply budget (and its listener's).
    pub fn replies(&self) -> &ConnectionReplies {
        &self.0.replies
    }

    /// Counts a request until the guard is dropped.
    pub fn start(&self) -> RequestGuard {
        // Before the count: a reader seeing a request open sees it started.
        // A load first, so later requests write nothing more.
        if !self.0.started.load(Ordering::Relaxed) {
            self.0.started.store(true, Ordering::Release);
        }
        self.0.open.fetch_add(1, Ordering::AcqRel);
        RequestGuard {
            in_flight: self.clone(),
            waiting_in: None,
        }
    }

    /// When the responses waiting for the client will have waited
    /// `idle_timeout` at least (at or before `now`: they have), given
    /// `epoch`, the connection's record of its epochs (see the module
    /// doc); `None` while none waits. Called when the connection's timer
    /// fires.
    pub(crate) fn waited_out_at(
        &self,
        epoch: &mut Epoch,
        now: Instant,
        idle_timeout: std::time::Duration,
    ) -> Option<Instant> {
        let current = self.0.epoch.load(Ordering::Acquire);
        let older = 1 - current;
        if self.0.waiting[older].load(Ordering::Acquire) > 0 {
            // Each has waited since before the current epoch opened.
            return Some(deadline_after(epoch.opened, idle_timeout));
        }
        if self.0.waiting[current].load(Ordering::Acquire) == 0 {
            return None;
        }
        // The older epoch is empty: the current one becomes the older,
        // new waits count in the next.
        self.0.epoch.store(older, Ordering::Release);
        epoch.opened = now;
        Some(deadline_after(now, idle_timeout))
    }

    /// Whether the connection has never had a request (its first request
    /// head, or HTTP/2 preface and first HEADERS, not yet complete).
    pub(crate) fn never_started(&self) -> bool {
        !self.0.started.load(Ordering::Acquire)
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

/// When a connection's current epoch of waiting responses opened (kept by
/// the connection, the only one to open epochs).
#[derive(Debug)]
pub(crate) struct Epoch {
    opened: Instant,
}

impl Epoch {
    /// The first epoch, opened `now`.
    pub(crate) fn new(now: Instant) -> Self {
        Self { opened: now }
    }
}

/// One request in flight.
#[derive(Debug)]
pub struct RequestGuard {
    in_flight: InFlight,
    /// The epoch its response began waiting for the client in, while it
    /// does.
    waiting_in: Option<usize>,
}

impl RequestGuard {
    /// The connection it counts in.
    pub fn in_flight(&self) -> &InFlight {
        &self.in_flight
    }

    /// Its response handed the server a chunk: it waits for the client
    /// until it is polled again.
    #[inline]
    fn waits(&mut self) {
        if self.waiting_in.is_none() {
            let counts = &self.in_flight.0;
            let epoch = counts.epoch.load(Ordering::Acquire);
            counts.waiting[epoch].fetch_add(1, Ordering::AcqRel);
            self.waiting_in = Some(epoch);
        }
    }

    /// Its response is polled again: no longer waiting.
    #[inline]
    fn moves(&mut self) {
        if let Some(epoch) = self.waiting_in.take() {
            self.in_flight.0.waiting[epoch].fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.moves();
        let counts = &self.in_flight.0;
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
        let this = &mut *self;
        if let Some(guard) = &mut this.guard {
            guard.moves();
        }
        let polled = Pin::new(&mut this.body).poll_frame(cx);
        match &polled {
            Poll::Ready(None) => this.guard = None,
            // The server holds the chunk until the client makes room for
            // it, and asks for the next only then.
            Poll::Ready(Some(Ok(frame))) if frame.is_data() => {
                if let Some(guard) = &mut this.guard {
                    guard.waits();
                }
            }
            _ => {}
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

    /// A body answering its scripted polls in turn (`None`: pending).
    struct Scripted(std::collections::VecDeque<Option<&'static str>>);

    impl Body for Scripted {
        type Data = tonic::codegen::Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
            match self.0.pop_front() {
                Some(Some(chunk)) => Poll::Ready(Some(Ok(Frame::data(chunk.into())))),
                Some(None) => Poll::Pending,
                None => Poll::Ready(None),
            }
        }
    }

    fn poll<B: Body + Unpin>(body: &mut Counted<B>) {
        let _ = Pin::new(body).poll_frame(&mut Context::from_waker(std::task::Waker::noop()));
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_not_asked_for_its_next_chunk_waits_out_the_idle_timeout() {
        let idle = Duration::from_secs(10);
        let in_flight = InFlight::new();
        let mut epoch = Epoch::new(Instant::now());
        // A subscription: a message, then quiet (polled, pending).
        let mut quiet = Counted::new(
            Scripted([Some("event"), None, None].into()),
            in_flight.start(),
        );
        // A download whose client makes no room after its first chunk.
        let mut stalled = Counted::new(
            Scripted([Some("chunk"), Some("chunk")].into()),
            in_flight.start(),
        );
        assert_eq!(
            in_flight.waited_out_at(&mut epoch, Instant::now(), idle),
            None
        );
        poll(&mut quiet);
        poll(&mut stalled);
        poll(&mut quiet);
        // The first look opens an epoch: the download waits from then.
        let first = Instant::now();
        assert_eq!(
            in_flight.waited_out_at(&mut epoch, first, idle),
            Some(first + idle)
        );
        tokio::time::advance(idle / 2).await;
        poll(&mut quiet);
        assert_eq!(
            in_flight.waited_out_at(&mut epoch, Instant::now(), idle),
            Some(first + idle),
            "still waiting, from the epoch's opening"
        );
        // Asked for its next chunk: no longer waiting; then one more chunk.
        poll(&mut stalled);
        let second = Instant::now();
        assert_eq!(
            in_flight.waited_out_at(&mut epoch, second, idle),
            Some(second + idle),
            "a new wait counts from a new epoch"
        );
        drop(stalled);
        tokio::time::advance(idle).await;
        assert_eq!(
            in_flight.waited_out_at(&mut epoch, Instant::now(), idle),
            None,
            "a dropped answer waits no more; a quiet subscription never does"
        );
        drop(quiet);
    }
}
