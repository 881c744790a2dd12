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
//! laggard) is dropped to make room, not the one whose message did not fit,
//! if it holds more than that one would with its message (or change): a
//! client that reads promptly is never crowded out by one that does not,
//! nor by another's change arriving after its own.
//! The laggard is looked for only then, so queueing stays one lock and two
//! atomic additions.
//!
//! A dropped subscriber's unread messages are discarded at once (their
//! bytes leave the total) and its stream ends with the reason.
//!
//! A change larger than one message may be is cut into several
//! ([`pieces`]), queued all together or not at all (a client never applies
//! part of an etcd transaction or an Apollo release): refused whole when it
//! is larger than the total itself ([`Refused::ChangeTooLarge`]), else its
//! bytes reserved in the total at once and its messages queued under one
//! lock. Every change, of one message or several, is held to one rule: it
//! is refused ([`Refused::Behind`]) only when the subscriber already holds
//! a full queue of its own (its own bytes at the limit, or
//! [`MAX_MESSAGES`]); its first message counts as the subscriber's own up to
//! the room it has left, the rest is the sidecar's allowance (what it chose
//! to queue over the limit to deliver the change whole), counted in the
//! total only and let go of as read, so a client reading promptly is not
//! taken for behind by the next change, however the burst is cut. A client
//! that does not read is still bounded: each change adds one message and
//! some of the room to its own.
//!
//! A change that does not fit beside what the others hold, when this
//! subscriber holds less than another, is refused as [`Refused::NoRoom`]:
//! the subscriber is not the laggard, the change is too large for the room
//! left (a change over half the total reaches one subscriber at a time).
//!
//! Every forwarder sharing a queue (the subscriptions of one Layotto
//! stream, each a clone of its sender) is held to the own limit apart: a
//! reload's catch-up reaching them all at once is no client behind.

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
    /// The change (all its messages) is larger than all subscribers
    /// together may have queued: nothing of it was queued.
    ChangeTooLarge {
        /// The bytes of all its messages.
        bytes: usize,
    },
    /// All subscribers together hold the total limit, and this one holds
    /// the most of it.
    Crowded,
    /// The change does not fit beside what the other subscribers hold,
    /// and none of them holds more than this one would with it, though one
    /// holds more than this one does: crowded out by the change's size,
    /// not for holding the most.
    NoRoom {
        /// The bytes of all its messages.
        bytes: usize,
        /// The bytes all subscribers together had queued.
        queued: usize,
    },
}

/// The bytes queued for all subscribers together, their limit, and the
/// queues counting into them.
#[derive(Clone)]
pub(crate) struct QueuedBytes {
    inner: Arc<Total>,
}

struct Total {
    queued: Counter,
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
                queued: Counter::default(),
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

    /// Counts `size` more bytes, unless that passes the limit: one
    /// compare-and-swap, so a reservation refused never shows in the total
    /// (another's send seeing it full would evict someone for nothing).
    fn reserve(&self, size: usize) -> bool {
        let limit = self.inner.limit;
        self.inner
            .queued
            .fetch_update(|queued| queued.checked_add(size).filter(|sum| *sum <= limit))
    }

    fn release(&self, size: usize) {
        self.inner.queued.fetch_sub(size);
    }

    fn queues(&self) -> MutexGuard<'_, HashMap<u64, Arc<dyn Evictable>>> {
        self.inner.queues.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Drops the queue holding the most bytes, if another than `own` holds
    /// more than `own` would with the `incoming` bytes it could not queue.
    fn evict_laggard(&self, own: u64, incoming: usize) -> Eviction {
        let (largest, own_held) = {
            let queues = self.queues();
            let own_held = queues.get(&own).map_or(0, |q| q.queued());
            let largest = queues
                .iter()
                .filter(|(id, _)| **id != own)
                .map(|(_, queue)| (queue.queued(), Arc::clone(queue)))
                .max_by_key(|(bytes, _)| *bytes);
            (largest, own_held)
        };
        let (bytes, laggard) = match largest {
            Some((bytes, laggard)) if bytes > own_held.saturating_add(incoming) => (bytes, laggard),
            Some((bytes, _)) if bytes > own_held => return Eviction::NoRoom,
            _ => return Eviction::HoldsTheMost,
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
        Eviction::Evicted
    }

    /// The bytes all subscribers together have queued.
    fn queued(&self) -> usize {
        self.inner.queued.load()
    }
}

/// What [`QueuedBytes::evict_laggard`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Eviction {
    /// Dropped the laggard: there may be room now.
    Evicted,
    /// Nobody else holds more than the sender does: it is the laggard.
    HoldsTheMost,
    /// Another holds more than the sender, but not more than the sender
    /// would with its change: the change is too large for the room left.
    NoRoom,
}

/// The total's counter of bytes queued. Tests also see the most it ever
/// held (a reservation refused must never show in it).
#[derive(Default)]
struct Counter {
    value: AtomicUsize,
    #[cfg(test)]
    peak: AtomicUsize,
}

impl Counter {
    fn load(&self) -> usize {
        self.value.load(Ordering::Acquire)
    }

    fn fetch_sub(&self, size: usize) {
        self.value.fetch_sub(size, Ordering::AcqRel);
    }

    /// Sets the counter to what `next` makes of it, unless that is `None`;
    /// whether it was set.
    fn fetch_update(&self, next: impl FnMut(usize) -> Option<usize>) -> bool {
        let updated = self
            .value
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, next);
        #[cfg(test)]
        if updated.is_ok() {
            self.peak.fetch_max(self.load(), Ordering::AcqRel);
        }
        updated.is_ok()
    }

    /// The most it ever held.
    #[cfg(test)]
    fn peak(&self) -> usize {
        self.peak.load(Ordering::Acquire)
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
    messages: VecDeque<Queued<T>>,
    /// Bytes queued unread (the forwarders' own and the allowance alike).
    bytes: usize,
    /// What each forwarder (sender) has queued unread of its own, by the
    /// sender's number.
    owners: HashMap<u64, Own>,
    /// The number the next sender cloned gets.
    next_owner: u64,
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

/// One message queued unread.
struct Queued<T> {
    message: Message<T>,
    /// Its bytes, all counted in the queue's and the total.
    size: usize,
    /// The sender that queued it.
    owner: u64,
    /// The part of `size` counted as the sender's own (the rest is the
    /// sidecar's allowance for a change cut into several messages).
    own: usize,
    /// Whether it counts among the sender's own messages.
    counted: bool,
}

/// What one sender has queued unread of its own.
#[derive(Debug, Default, Clone, Copy)]
struct Own {
    bytes: usize,
    messages: usize,
}

impl<T> State<T> {
    /// Takes the message queued first, no longer counted unread.
    fn pop(&mut self) -> Option<(Message<T>, usize)> {
        let queued = self.messages.pop_front()?;
        self.bytes -= queued.size;
        if let Some(own) = self.owners.get_mut(&queued.owner) {
            own.bytes -= queued.own;
            own.messages -= usize::from(queued.counted);
        }
        Some((queued.message, queued.size))
    }

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
        state
            .owners
            .values_mut()
            .for_each(|own| *own = Own::default());
        self.bytes.store(0, Ordering::Release);
    }

    /// Ends the queue with `reason` last; its unread messages discarded
    /// first when `discard`.
    fn end(&self, reason: Status, discard: bool, evicted: bool) {
        let mut state = self.lock();
        // Discarding an ended queue's unread messages discards its reason
        // too: `reason` takes its place, or the stream would end OK.
        let discarded = discard && !state.messages.is_empty();
        if discard {
            state.messages.clear();
            self.release_all(&mut state);
        }
        if !state.ended || discarded {
            state.messages.push_back(Queued {
                message: Err(reason),
                size: 0,
                owner: u64::MAX,
                own: 0,
                counted: false,
            });
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
    /// This sender's number, under which its own messages are counted.
    owner: u64,
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
            owners: HashMap::from([(0, Own::default())]),
            next_owner: 1,
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
        owner: 0,
    };
    (sender, SubscriptionStream { shared })
}

impl<T> QueueSender<T> {
    /// Queues `message` of `size` bytes without waiting, within this
    /// sender's own limits; when all subscribers together are at their
    /// limit, the one holding the most (counting `size` to this one) is
    /// dropped to make room, unless that is this one.
    pub(crate) fn try_send(&self, message: Message<T>, size: usize) -> Result<(), Refused> {
        self.try_send_change(vec![(message, size)])
    }

    /// Queues the messages of one change (each with its size, at most the
    /// byte limit: see [`pieces`]) without waiting, in order, all or none
    /// (see the module doc): unless this sender holds a full queue of its
    /// own already, only the first counted as its own, up to the room it
    /// has left.
    pub(crate) fn try_send_change(
        &self,
        messages: Vec<(Message<T>, usize)>,
    ) -> Result<(), Refused> {
        if messages.is_empty() {
            return Ok(());
        }
        if messages.iter().any(|(_, size)| *size > self.shared.limit) {
            return Err(Refused::TooLarge);
        }
        let bytes = messages
            .iter()
            .fold(0usize, |sum, (_, size)| sum.saturating_add(*size));
        if bytes > self.shared.total.limit() {
            return Err(Refused::ChangeTooLarge { bytes });
        }
        let mut messages = messages;
        for _ in 0..MAX_EVICTIONS {
            match self.try_push(messages, bytes) {
                Ok(()) => return Ok(()),
                Err((Refused::Crowded, back)) => {
                    match self.shared.total.evict_laggard(self.shared.id, bytes) {
                        Eviction::Evicted => messages = back,
                        Eviction::HoldsTheMost => return Err(Refused::Crowded),
                        Eviction::NoRoom => {
                            let queued = self.shared.total.queued();
                            return Err(Refused::NoRoom { bytes, queued });
                        }
                    }
                }
                Err((refused, _)) => return Err(refused),
            }
        }
        Err(Refused::Crowded)
    }

    /// Queues `messages` (`bytes` together) under one lock, or none.
    #[allow(clippy::type_complexity)]
    fn try_push(
        &self,
        messages: Vec<(Message<T>, usize)>,
        bytes: usize,
    ) -> Result<(), (Refused, Vec<(Message<T>, usize)>)> {
        let mut state = self.shared.lock();
        if state.ended || self.shared.done.is_cancelled() {
            return Err((Refused::Closed, messages));
        }
        let own = state.owners.get(&self.owner).copied().unwrap_or_default();
        let limit = self.shared.limit;
        // One rule for every change (see the module doc).
        if own.messages >= MAX_MESSAGES || own.bytes >= limit {
            return Err((Refused::Behind, messages));
        }
        if !self.shared.total.reserve(bytes) {
            return Err((Refused::Crowded, messages));
        }
        let room = limit - own.bytes;
        let mut first = true;
        for (message, size) in messages {
            let counted = std::mem::take(&mut first);
            let own = if counted { size.min(room) } else { 0 };
            if let Some(owned) = state.owners.get_mut(&self.owner) {
                owned.bytes += own;
                owned.messages += usize::from(counted);
            }
            state.messages.push_back(Queued {
                message,
                size,
                owner: self.owner,
                own,
                counted,
            });
        }
        state.bytes += bytes;
        self.shared.bytes.store(state.held(), Ordering::Release);
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

/// A clone is another forwarder on the queue, held to the own limits
/// apart.
impl<T> Clone for QueueSender<T> {
    fn clone(&self) -> Self {
        let mut state = self.shared.lock();
        state.senders += 1;
        let owner = state.next_owner;
        state.next_owner += 1;
        state.owners.insert(owner, Own::default());
        drop(state);
        Self {
            shared: Arc::clone(&self.shared),
            owner,
        }
    }
}

/// The stream ends (after what is queued) once every sender is gone.
impl<T> Drop for QueueSender<T> {
    fn drop(&mut self) {
        let mut state = self.shared.lock();
        state.senders -= 1;
        state.owners.remove(&self.owner);
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
        let next = state.pop().map(|(message, size)| {
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
        total.queued()
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
        // Counted as its own up to the room left (40): full.
        assert_eq!(sender.try_send(message(), 60), Ok(()));
        assert_eq!(sender.try_send(message(), 1), Err(Refused::Behind));
        assert_eq!(sender.try_send(message(), 101), Err(Refused::TooLarge));
        assert!(stream.next().await.is_some());
        assert_eq!(sender.try_send(message(), 60), Ok(()));
        drop(stream);
        assert_eq!(sender.try_send(message(), 1), Err(Refused::Closed));
    }

    /// A change of `n` messages of `size` bytes each.
    fn change(n: usize, size: usize) -> Vec<(Message<SubscribeConfigurationResponse>, usize)> {
        (0..n).map(|_| (message(), size)).collect()
    }

    /// Whether `stream` has a message ready, without waiting.
    fn ready(stream: &mut SubscriptionStream) -> bool {
        let mut cx = Context::from_waker(Waker::noop());
        Pin::new(stream).poll_next(&mut cx).is_ready()
    }

    /// The messages of a change cut into several are queued whatever the
    /// subscriber holds unread of its own (short of a full queue), the
    /// first counted as its own up to the room left, the rest as the
    /// sidecar's allowance: a client that has not read the id yet gets a
    /// change whose first message is the whole limit, and the next change
    /// after one cut in two (failed before the fix: `Behind` both times,
    /// the overflow the sidecar queued taken for the client's backlog).
    #[tokio::test]
    async fn the_overflow_of_a_change_cut_in_several_is_not_the_client_being_behind() {
        let total = QueuedBytes::new(1000);
        let (sender, mut stream) = open(100, &total);
        assert_eq!(sender.try_send(message(), 10), Ok(()), "the id, unread");
        assert_eq!(sender.try_send_change(change(2, 100)), Ok(()));
        // Own: 10 + 90 (the first message, up to the room left): full.
        assert_eq!(sender.try_send(message(), 1), Err(Refused::Behind));
        assert_eq!(sender.try_send_change(change(2, 10)), Err(Refused::Behind));
        for _ in 0..2 {
            assert!(stream.next().await.is_some());
        }
        // The id and the first message read: the allowance left is no
        // backlog of the client's.
        assert_eq!(sender.try_send_change(change(2, 60)), Ok(()));
        assert_eq!(sender.try_send(message(), 40), Ok(()));
        assert_eq!(
            queued(&total),
            100 + 100 + 120 + 40,
            "all counted in the total"
        );
        for _ in 0..4 {
            assert!(stream.next().await.is_some());
        }
        ask_next(&mut stream).await;
        assert_eq!(queued(&total), 0, "the allowance let go of as read");
        // A change that fits one message is held to the same rule.
        assert_eq!(sender.try_send(message(), 60), Ok(()));
        assert_eq!(sender.try_send(message(), 60), Ok(()));
        assert_eq!(sender.try_send(message(), 1), Err(Refused::Behind));
    }

    /// A change of one message is held to the same rule as one cut in
    /// several: refused only when the subscriber's own bytes are at the
    /// limit already, counted as its own up to the room left (failed
    /// before the fix: `Behind` when its own bytes and the message passed
    /// the limit, so a prompt reader was dropped in a burst, and a change
    /// fitting one message was refused where a larger one was taken).
    #[tokio::test]
    async fn a_change_of_one_message_past_the_room_left_is_queued() {
        let total = QueuedBytes::new(100_000);
        let (sender, _stream) = open(100, &total);
        assert_eq!(sender.try_send(message(), 10), Ok(()), "the id, unread");
        assert_eq!(sender.try_send(message(), 100), Ok(()));
        assert_eq!(sender.try_send(message(), 1), Err(Refused::Behind));
        // The burst: the id, a change of 2 x 9_000 cut in two, then a
        // change of 2_000, none read yet (tonic has not polled).
        let (sender, _stream) = open(10_000, &total);
        assert_eq!(sender.try_send(message(), 41), Ok(()));
        assert_eq!(sender.try_send_change(change(2, 9_053)), Ok(()));
        assert_eq!(sender.try_send(message(), 2_056), Ok(()));
        assert_eq!(sender.try_send(message(), 1), Err(Refused::Behind));
    }

    /// A reservation refused never shows in the total, not even for a
    /// moment, so another's send never sees it full for it and evicts
    /// someone needlessly (failed before the fix: added, checked, then
    /// taken back, the total holding 160 of 100 in between).
    #[tokio::test]
    async fn a_reservation_refused_never_shows_in_the_total() {
        let total = QueuedBytes::new(100);
        let (other, _other_stream) = queue("subscription `other`".into(), 100, total.clone());
        let (sender, _stream) = open(100, &total);
        assert_eq!(other.try_send(message(), 60), Ok(()));
        assert!(!total.reserve(100));
        assert!(matches!(
            sender.try_send_change(change(2, 50)),
            Err(Refused::NoRoom { .. })
        ));
        assert_eq!(queued(&total), 60);
        assert_eq!(total.inner.queued.peak(), 60, "never more than held");
        assert!(total.reserve(40), "what fits is reserved");
        assert_eq!(total.inner.queued.peak(), 100);
    }

    /// A queue ended with a reason (its store removed) and then dropped
    /// to make room still ends with a reason, never OK (failed before the
    /// fix: the eviction discarded the queued reason and, the queue being
    /// ended already, pushed none).
    #[tokio::test]
    async fn a_queue_evicted_after_its_end_still_ends_with_a_reason() {
        let total = QueuedBytes::new(100);
        let (ended, mut ended_stream) = queue("subscription `ended`".into(), 100, total.clone());
        let (reader, _reader_stream) = open(100, &total);
        assert_eq!(ended.try_send(message(), 60), Ok(()));
        ended.end(Status::unavailable("store `s` is no longer running"));
        assert_eq!(reader.try_send(message(), 50), Ok(()));
        assert!(ended.evicted(), "the laggard");
        let reason = ended_stream
            .next()
            .await
            .expect("a reason")
            .expect_err("an error, not OK");
        assert_eq!(reason.code(), tonic::Code::ResourceExhausted);
        assert!(ended_stream.next().await.is_none());
    }

    /// Two forwarders on one queue (the subscriptions of one Layotto
    /// stream) are held to the own limit apart: a reload's catch-up
    /// reaching both at once, unread, refuses neither (failed before the
    /// fix: the second was `Behind`, and the stream dropped).
    #[tokio::test]
    async fn forwarders_sharing_a_queue_are_held_to_the_own_limit_apart() {
        let total = QueuedBytes::new(1000);
        let (first, _stream) = open(100, &total);
        let second = first.clone();
        assert_eq!(first.try_send_change(change(2, 100)), Ok(()));
        assert_eq!(second.try_send(message(), 90), Ok(()));
        assert_eq!(first.try_send(message(), 1), Err(Refused::Behind));
        assert_eq!(second.try_send(message(), 20), Ok(()));
        assert_eq!(second.try_send(message(), 1), Err(Refused::Behind));
    }

    /// A change is queued whole or not at all: larger than the total
    /// itself, it is refused with its own reason and nothing of it is
    /// readable (failed before the fix: four of its five messages queued
    /// and readable, then `Crowded`).
    #[tokio::test]
    async fn a_change_larger_than_the_total_is_refused_whole() {
        let total = QueuedBytes::new(250);
        let (sender, mut stream) = open(100, &total);
        assert_eq!(
            sender.try_send_change(change(5, 60)),
            Err(Refused::ChangeTooLarge { bytes: 300 })
        );
        assert_eq!(queued(&total), 0);
        assert!(!ready(&mut stream), "nothing of it queued");
        assert!(!sender.evicted(), "nobody else to drop");
    }

    /// A change that fits the total but not beside what another holds is
    /// refused whole, and the other (a prompt reader whose own change came
    /// first, holding no more than this one would) is not dropped for it
    /// (failed before the fix: the first message queued, then the other
    /// dropped as "holding the most" and its change discarded). The refusal
    /// says there was no room for the change, not that this subscriber
    /// holds the most (rv10 4: it was `Crowded`).
    #[tokio::test]
    async fn a_change_crowded_out_is_refused_whole_and_drops_no_smaller_subscriber() {
        let total = QueuedBytes::new(300);
        let (other, _other_stream) = queue("subscription `other`".into(), 100, total.clone());
        let (sender, mut stream) = open(100, &total);
        assert_eq!(other.try_send_change(change(2, 100)), Ok(()));
        assert_eq!(
            sender.try_send_change(change(2, 100)),
            Err(Refused::NoRoom {
                bytes: 200,
                queued: 200
            })
        );
        assert!(!other.evicted(), "it holds no more than the change");
        assert_eq!(queued(&total), 200);
        assert!(!ready(&mut stream), "nothing of it queued");
        // A change that fits beside it is queued.
        assert_eq!(sender.try_send_change(change(2, 50)), Ok(()));
        assert!(ready(&mut stream));
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
        assert_eq!(queued(&total), 60);
        assert_eq!(total.queues().len(), 1);
    }
}
