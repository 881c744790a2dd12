//! A subscriber's queue, bounded in bytes as well as in messages: what is
//! queued for a client that does not read is counted when queued and
//! uncounted once the client has taken it, so a slow client on a store of
//! large values is dropped long before it can grow the sidecar. Every queue
//! also counts into a total shared by all subscribers ([`QueuedBytes`]), so
//! many slow clients together are bounded too.
//!
//! A message the reader takes stays counted (its queue's and the total)
//! until the reader asks for the next one, or goes: tonic hands it to the
//! server, which holds it until the client makes room for it and only then
//! asks for more, so a client granting no window holds it counted, and is
//! the laggard it looks like. It is not behind for it (the subscriber's own
//! limit counts what is queued unread); a subscriber dropped lets go of it
//! with its queue, what the server still holds of it being charged to the
//! connection's reply budget (`connection::replying`).
//!
//! When the total is full, the subscriber holding the most bytes (the
//! laggard) is dropped to make room, not the one whose message did not fit:
//! a client that reads promptly is never crowded out by one that does not.
//! The laggard is looked for only then, so queueing stays one lock and two
//! atomic additions.
//!
//! A dropped subscriber's unread messages are discarded at once (their
//! bytes leave the total) and its stream ends with the reason.
//!
//! A change larger than one message may be is cut into several
//! ([`pieces`]), queued together: the first within the subscriber's own
//! limits, the rest within the total only, so a client that was not behind
//! gets all of it (a reload's catch-up included).

use std::collections::{HashMap, VecDeque};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use tokio_stream::Stream;
use tokio_util::sync::CancellationToken;
use tonic::Status;

use super::proto::dapr::proto::runtime::v1::SubscribeConfigurationResponse;

mod pieces;

pub(crate) use pieces::{pieces, ItemTooLarge, Piece};

/// One message of a subscription stream.
pub(crate) type Message<T> = Result<T, Status>;

/// Messages queued for a subscriber at most, whatever their size.
const MAX_MESSAGES: usize = 64;

/// All subscribers together may have this many times the per-subscriber
/// limit queued.
const TOTAL_PER_SUBSCRIBER_LIMIT: usize = 16;

/// Laggards dropped at most to queue one message (each drop frees the
/// largest queue, so one is almost always enough).
const MAX_EVICTIONS: usize = 8;

/// Why a message was not queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// The client left, or its subscription ended.
    Closed,
    /// The client is too far behind: messages or bytes queued at the limit.
    Behind,
    /// The message alone is larger than the byte limit.
    TooLarge,
    /// All subscribers together hold the total limit, and this one holds
    /// the most of it.
    Crowded,
}

/// The bytes queued for all subscribers together, their limit, and the
/// queues counting into them.
#[derive(Clone)]
pub(crate) struct QueuedBytes {
    inner: Arc<Total>,
}

struct Total {
    queued: AtomicUsize,
    limit: usize,
    next: AtomicU64,
    queues: Mutex<HashMap<u64, Arc<dyn Evictable>>>,
}

/// A queue as the total sees it, whatever its message type.
trait Evictable: Send + Sync {
    /// Bytes queued unread.
    fn queued(&self) -> usize;
    /// Drops the subscriber: its messages discarded, `reason` last.
    fn evict(&self, reason: Status);
    /// What the queue is for (`subscription \`id\``).
    fn label(&self) -> &str;
}

impl QueuedBytes {
    /// Nothing queued yet; at most `limit` bytes for all subscribers.
    pub(crate) fn new(limit: usize) -> Self {
        Self {
            inner: Arc::new(Total {
                queued: AtomicUsize::new(0),
                limit,
                next: AtomicU64::new(0),
                queues: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// Nothing queued yet; all subscribers together may have
    /// [`TOTAL_PER_SUBSCRIBER_LIMIT`] times `per_subscriber` bytes queued.
    pub(crate) fn for_subscribers(per_subscriber: usize) -> Self {
        Self::new(per_subscriber.saturating_mul(TOTAL_PER_SUBSCRIBER_LIMIT))
    }

    /// The total limit.
    pub(crate) fn limit(&self) -> usize {
        self.inner.limit
    }

    /// Counts `size` more bytes, unless that passes the limit.
    fn reserve(&self, size: usize) -> bool {
        let total = self.inner.queued.fetch_add(size, Ordering::AcqRel);
        if total.saturating_add(size) > self.inner.limit {
            self.inner.queued.fetch_sub(size, Ordering::AcqRel);
            return false;
        }
        true
    }

    fn release(&self, size: usize) {
        self.inner.queued.fetch_sub(size, Ordering::AcqRel);
    }

    fn queues(&self) -> MutexGuard<'_, HashMap<u64, Arc<dyn Evictable>>> {
        self.inner.queues.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Drops the queue holding the most bytes, if another than `own` holds
    /// more than it; true when one was dropped.
    fn evict_laggard(&self, own: u64) -> bool {
        let laggard = {
            let queues = self.queues();
            let own_bytes = queues.get(&own).map_or(0, |q| q.queued());
            queues
                .iter()
                .filter(|(id, _)| **id != own)
                .map(|(_, queue)| (queue.queued(), queue))
                .filter(|(bytes, _)| *bytes > own_bytes)
                .max_by_key(|(bytes, _)| *bytes)
                .map(|(bytes, queue)| (bytes, Arc::clone(queue)))
        };
        let Some((bytes, laggard)) = laggard else {
            return false;
        };
        let why = format!(
            "it had the most bytes queued unread ({bytes}) when the sidecar's subscribers \
             together reached their limit of {} bytes (16 x max_response_bytes); its unread \
             changes are discarded",
            self.inner.limit
        );
        tracing::warn!(subscriber = laggard.label(), reason = %why, "Configuration subscriber dropped.");
        let reason = Status::resource_exhausted(format!("{} dropped: {why}", laggard.label()));
        laggard.evict(reason);
        true
    }
}

struct Shared<T> {
    id: u64,
    label: String,
    limit: usize,
    /// `State::held`, readable without the lock (by the laggard search).
    bytes: AtomicUsize,
    state: Mutex<State<T>>,
    /// Cancelled when the reader leaves or the queue is ended.
    done: CancellationToken,
    total: QueuedBytes,
}

struct State<T> {
    messages: VecDeque<(Message<T>, usize)>,
    /// Bytes queued unread.
    bytes: usize,
    /// Bytes of the message the reader took last, counted until it asks
    /// for the next (or goes).
    handed: usize,
    /// Nothing more is queued (a reason may be the last message).
    ended: bool,
    /// Dropped to make room for another subscriber.
    evicted: bool,
    senders: usize,
    reader: Option<Waker>,
}

impl<T> State<T> {
    /// Bytes counted for this subscriber: queued unread, and the message
    /// the reader took last.
    fn held(&self) -> usize {
        self.bytes + self.handed
    }
}

impl<T> Shared<T> {
    fn lock(&self) -> MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Lets go of everything counted for this subscriber (its total's
    /// share included).
    fn release_all(&self, state: &mut State<T>) {
        self.total.release(state.held());
        state.bytes = 0;
        state.handed = 0;
        self.bytes.store(0, Ordering::Release);
    }

    /// Ends the queue with `reason` last; its unread messages discarded
    /// first when `discard`.
    fn end(&self, reason: Status, discard: bool, evicted: bool) {
        let mut state = self.lock();
        if discard {
            state.messages.clear();
            self.release_all(&mut state);
        }
        if !state.ended {
            state.messages.push_back((Err(reason), 0));
            state.ended = true;
        }
        state.evicted |= evicted;
        let reader = state.reader.take();
        drop(state);
        self.done.cancel();
        if let Some(reader) = reader {
            reader.wake();
        }
    }
}

impl<T: Send> Evictable for Shared<T> {
    fn queued(&self) -> usize {
        self.bytes.load(Ordering::Acquire)
    }

    fn evict(&self, reason: Status) {
        self.end(reason, true, true);
    }

    fn label(&self) -> &str {
        &self.label
    }
}

/// The forwarding side of a subscriber's queue (several forwarders may
/// share one queue: clone it).
pub(crate) struct QueueSender<T = SubscribeConfigurationResponse> {
    shared: Arc<Shared<T>>,
}

/// The stream a subscriber reads.
pub struct SubscriptionStream<T = SubscribeConfigurationResponse> {
    shared: Arc<Shared<T>>,
}

/// A queue for `label` (`subscription \`id\``) holding at most `limit`
/// bytes (and [`MAX_MESSAGES`] messages), counting into `total`.
pub(crate) fn queue<T: Send + 'static>(
    label: String,
    limit: usize,
    total: QueuedBytes,
) -> (QueueSender<T>, SubscriptionStream<T>) {
    let id = total.inner.next.fetch_add(1, Ordering::Relaxed);
    let shared = Arc::new(Shared {
        id,
        label,
        limit,
        bytes: AtomicUsize::new(0),
        state: Mutex::new(State {
            messages: VecDeque::new(),
            bytes: 0,
            handed: 0,
            ended: false,
            evicted: false,
            senders: 1,
            reader: None,
        }),
        done: CancellationToken::new(),
        total: total.clone(),
    });
    total
        .queues()
        .insert(id, Arc::clone(&shared) as Arc<dyn Evictable>);
    let sender = QueueSender {
        shared: Arc::clone(&shared),
    };
    (sender, SubscriptionStream { shared })
}

impl<T> QueueSender<T> {
    /// Queues `message` of `size` bytes without waiting; when all
    /// subscribers together are at their limit, the one holding the most
    /// is dropped to make room, unless that is this one.
    pub(crate) fn try_send(&self, message: Message<T>, size: usize) -> Result<(), Refused> {
        self.try_queue(message, size, true)
    }

    /// Queues the messages of one change (each with its size, at most the
    /// byte limit: see [`pieces`]) without waiting, in order: the first as
    /// [`Self::try_send`] does, the others whatever this subscriber holds
    /// already (it was not behind when the change came), within the total
    /// only. Stops at the first refused.
    pub(crate) fn try_send_change(
        &self,
        messages: impl IntoIterator<Item = (Message<T>, usize)>,
    ) -> Result<(), Refused> {
        let mut first = true;
        for (message, size) in messages {
            self.try_queue(message, size, std::mem::take(&mut first))?;
        }
        Ok(())
    }

    /// Queues `message`, within this subscriber's own limits (bytes and
    /// messages) when `own_limits`, and always within the total.
    fn try_queue(
        &self,
        mut message: Message<T>,
        size: usize,
        own_limits: bool,
    ) -> Result<(), Refused> {
        if size > self.shared.limit {
            return Err(Refused::TooLarge);
        }
        for _ in 0..MAX_EVICTIONS {
            match self.try_push(message, size, own_limits) {
                Ok(()) => return Ok(()),
                Err((Refused::Crowded, back)) => {
                    if !self.shared.total.evict_laggard(self.shared.id) {
                        return Err(Refused::Crowded);
                    }
                    message = back;
                }
                Err((refused, _)) => return Err(refused),
            }
        }
        Err(Refused::Crowded)
    }

    fn try_push(
        &self,
        message: Message<T>,
        size: usize,
        own_limits: bool,
    ) -> Result<(), (Refused, Message<T>)> {
        let mut state = self.shared.lock();
        if state.ended || self.shared.done.is_cancelled() {
            return Err((Refused::Closed, message));
        }
        let behind = state.messages.len() >= MAX_MESSAGES
            || state.bytes.saturating_add(size) > self.shared.limit;
        if own_limits && behind {
            return Err((Refused::Behind, message));
        }
        if !self.shared.total.reserve(size) {
            return Err((Refused::Crowded, message));
        }
        state.bytes += size;
        self.shared.bytes.store(state.held(), Ordering::Release);
        state.messages.push_back((message, size));
        let reader = state.reader.take();
        drop(state);
        if let Some(reader) = reader {
            reader.wake();
        }
        Ok(())
    }

    /// Ends the stream after what is queued, with `status` last.
    pub(crate) fn end(&self, status: Status) {
        self.shared.end(status, false, false);
    }

    /// Drops the subscriber: what is queued unread is discarded (its bytes
    /// leave the total) and `status` is its last message.
    pub(crate) fn drop_with(&self, status: Status) {
        self.shared.end(status, true, false);
    }

    /// Resolves once the client has left or the queue has ended (dropped
    /// to make room for another subscriber, see [`Self::evicted`]).
    pub(crate) async fn closed(&self) {
        self.shared.done.cancelled().await;
    }

    /// Whether the subscriber was dropped to make room for another.
    pub(crate) fn evicted(&self) -> bool {
        self.shared.lock().evicted
    }

    /// The byte limit.
    pub(crate) fn limit(&self) -> usize {
        self.shared.limit
    }

    /// The total byte limit of all subscribers.
    pub(crate) fn total_limit(&self) -> usize {
        self.shared.total.limit()
    }
}

impl<T> Clone for QueueSender<T> {
    fn clone(&self) -> Self {
        self.shared.lock().senders += 1;
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

/// The stream ends (after what is queued) once every sender is gone.
impl<T> Drop for QueueSender<T> {
    fn drop(&mut self) {
        let mut state = self.shared.lock();
        state.senders -= 1;
        let reader = (state.senders == 0).then(|| state.reader.take()).flatten();
        drop(state);
        if let Some(reader) = reader {
            reader.wake();
        }
    }
}

impl<T> Stream for SubscriptionStream<T> {
    type Item = Message<T>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Message<T>>> {
        let shared = &self.shared;
        let mut state = shared.lock();
        // Asked for the next: the last taken has left the sidecar's hands.
        shared.total.release(std::mem::take(&mut state.handed));
        let next = state.messages.pop_front().map(|(message, size)| {
            state.bytes -= size;
            state.handed = size;
            message
        });
        shared.bytes.store(state.held(), Ordering::Release);
        if let Some(message) = next {
            return Poll::Ready(Some(message));
        }
        if state.ended || state.senders == 0 {
            return Poll::Ready(None);
        }
        state.reader = Some(cx.waker().clone());
        Poll::Pending
    }
}

/// A stream dropped unread gives its bytes back to the total, and its
/// senders learn that the client left.
impl<T> Drop for SubscriptionStream<T> {
    fn drop(&mut self) {
        let shared = &self.shared;
        shared.done.cancel();
        let mut state = shared.lock();
        state.ended = true;
        let messages = std::mem::take(&mut state.messages);
        shared.release_all(&mut state);
        drop(state);
        drop(messages);
        shared.total.queues().remove(&shared.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_stream::StreamExt;

    fn message() -> Message<SubscribeConfigurationResponse> {
        Ok(SubscribeConfigurationResponse::default())
    }

    fn open(limit: usize, total: &QueuedBytes) -> (QueueSender, SubscriptionStream) {
        queue("subscription `s`".into(), limit, total.clone())
    }

    /// Asks `stream` for its next message once, as the server does once
    /// it has passed the last one on, whatever the answer.
    async fn ask_next(stream: &mut SubscriptionStream) {
        std::future::poll_fn(|cx| {
            let _ = Pin::new(&mut *stream).poll_next(cx);
            Poll::Ready(())
        })
        .await;
    }

    fn queued(total: &QueuedBytes) -> usize {
        total.inner.queued.load(Ordering::Acquire)
    }

    /// A message the reader took stays counted until it asks for the next
    /// (tonic takes it at once, and the server holds it until the client
    /// makes room), or goes (failed before the fix: uncounted as soon as
    /// taken, so a client granting no window held it outside every bound).
    #[tokio::test]
    async fn a_message_taken_stays_counted_until_the_next_is_asked_for() {
        let total = QueuedBytes::new(1000);
        let (sender, mut stream) = open(100, &total);
        assert_eq!(sender.try_send(message(), 60), Ok(()));
        assert!(stream.next().await.is_some());
        assert_eq!(queued(&total), 60, "held by the server");
        // Not behind for it: the subscriber's own limit is what is unread.
        assert_eq!(sender.try_send(message(), 60), Ok(()));
        assert_eq!(queued(&total), 120);
        assert!(stream.next().await.is_some());
        assert_eq!(queued(&total), 60, "the first let go of");
        ask_next(&mut stream).await;
        assert_eq!(queued(&total), 0, "nothing queued, nothing held");
        assert_eq!(sender.try_send(message(), 30), Ok(()));
        assert!(stream.next().await.is_some());
        drop(stream);
        assert_eq!(queued(&total), 0, "a stream that goes lets go of it");
    }

    /// A subscriber whose client took a message and never asks for more
    /// holds it: the laggard when the total is full, dropped to make room
    /// for one that reads, and what it held let go of (failed before the
    /// fix: it looked empty, and the reader was refused).
    #[tokio::test]
    async fn a_client_holding_a_message_taken_is_the_laggard() {
        let total = QueuedBytes::new(100);
        let (stalled, mut stalled_stream) =
            queue("subscription `stalled`".into(), 80, total.clone());
        let (reader, mut reader_stream) = open(80, &total);
        assert_eq!(stalled.try_send(message(), 70), Ok(()));
        assert!(stalled_stream.next().await.is_some(), "taken, never sent");
        assert_eq!(reader.try_send(message(), 40), Ok(()));
        assert!(reader_stream.next().await.is_some());
        ask_next(&mut reader_stream).await;
        assert_eq!(reader.try_send(message(), 40), Ok(()));
        assert!(stalled.evicted(), "the stalled client is the laggard");
        assert!(!reader.evicted());
        assert_eq!(queued(&total), 40, "what the laggard held let go of");
    }

    #[tokio::test]
    async fn bytes_are_counted_until_the_client_reads_them() {
        let (sender, mut stream) = open(100, &QueuedBytes::new(1000));
        assert_eq!(sender.try_send(message(), 60), Ok(()));
        assert_eq!(sender.try_send(message(), 60), Err(Refused::Behind));
        assert_eq!(sender.try_send(message(), 101), Err(Refused::TooLarge));
        assert!(stream.next().await.is_some());
        assert_eq!(sender.try_send(message(), 60), Ok(()));
        drop(stream);
        assert_eq!(sender.try_send(message(), 1), Err(Refused::Closed));
    }

    /// The messages of one change past the first are queued whatever the
    /// subscriber holds, within the total only; the next change is held
    /// to the subscriber's own limit again.
    #[tokio::test]
    async fn the_messages_of_one_change_are_queued_together_within_the_total() {
        let total = QueuedBytes::new(250);
        let (sender, mut stream) = open(100, &total);
        let change = |n: usize| (0..n).map(|_| (message(), 60));
        assert_eq!(sender.try_send_change(change(3)), Ok(()));
        assert_eq!(total.inner.queued.load(Ordering::Acquire), 180);
        assert_eq!(sender.try_send_change(change(1)), Err(Refused::Behind));
        for _ in 0..3 {
            assert!(stream.next().await.is_some());
        }
        // Past the total, the change is refused where it stops fitting.
        assert_eq!(sender.try_send_change(change(5)), Err(Refused::Crowded));
        assert!(!sender.evicted(), "nobody else to drop");
    }

    #[tokio::test]
    async fn small_messages_are_bounded_in_number() {
        let (sender, _stream) = open(usize::MAX, &QueuedBytes::new(usize::MAX));
        for _ in 0..MAX_MESSAGES {
            assert_eq!(sender.try_send(message(), 1), Ok(()));
        }
        assert_eq!(sender.try_send(message(), 1), Err(Refused::Behind));
    }

    #[tokio::test]
    async fn a_full_total_drops_the_subscriber_holding_the_most_not_the_sender() {
        let total = QueuedBytes::new(100);
        let (laggard, mut laggard_stream) = queue("subscription `lag`".into(), 80, total.clone());
        let (reader, mut reader_stream) = open(80, &total);
        assert_eq!(laggard.try_send(message(), 70), Ok(()));
        assert_eq!(reader.try_send(message(), 20), Ok(()));
        assert!(reader_stream.next().await.is_some());
        // 70 + 40 > 100: the laggard (70 unread) goes, not the reader.
        assert_eq!(reader.try_send(message(), 40), Ok(()));
        assert!(laggard.evicted());
        assert_eq!(laggard.try_send(message(), 1), Err(Refused::Closed));
        let reason = laggard_stream
            .next()
            .await
            .expect("a reason")
            .expect_err("dropped");
        assert_eq!(reason.code(), tonic::Code::ResourceExhausted);
        assert!(
            reason.message().contains("subscription `lag` dropped")
                && reason
                    .message()
                    .contains("the most bytes queued unread (70)")
                && reason.message().contains("limit of 100 bytes"),
            "{}",
            reason.message()
        );
        assert!(
            laggard_stream.next().await.is_none(),
            "its change was discarded"
        );
        assert!(reader_stream.next().await.is_some());
        assert!(!reader.evicted());
    }

    #[tokio::test]
    async fn the_sender_is_refused_when_it_holds_the_most() {
        let total = QueuedBytes::new(100);
        let (first, mut first_stream) = open(80, &total);
        let (second, _second_stream) = open(80, &total);
        assert_eq!(first.try_send(message(), 60), Ok(()));
        assert_eq!(second.try_send(message(), 30), Ok(()));
        // 90 queued; the first holds the most and its own message does not fit.
        assert_eq!(first.try_send(message(), 20), Err(Refused::Crowded));
        assert!(!second.evicted());
        assert!(first_stream.next().await.is_some());
        ask_next(&mut first_stream).await;
        assert_eq!(first.try_send(message(), 60), Ok(()));
    }

    #[tokio::test]
    async fn a_stream_dropped_unread_gives_its_bytes_back() {
        let total = QueuedBytes::new(100);
        let (first, _first_stream) = open(80, &total);
        let (second, second_stream) = open(80, &total);
        assert_eq!(second.try_send(message(), 60), Ok(()));
        drop(second_stream);
        assert_eq!(first.try_send(message(), 60), Ok(()));
        assert_eq!(total.inner.queued.load(Ordering::Acquire), 60);
        assert_eq!(total.queues().len(), 1);
    }
}
