//! A subscriber's queue, bounded in bytes as well as in messages: what is
//! queued for a client that does not read is counted when queued and
//! uncounted when the client takes it, so a slow client on a store of large
//! values is dropped long before it can grow the sidecar. Every queue also
//! counts into a total shared by all subscribers ([`QueuedBytes`]), so many
//! slow clients together are bounded too.

use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::sync::mpsc;
use tokio_stream::Stream;
use tonic::Status;

use super::proto::dapr::proto::runtime::v1::SubscribeConfigurationResponse;

/// One message of a subscription stream.
type Message = Result<SubscribeConfigurationResponse, Status>;

/// Messages queued for a subscriber at most, whatever their size.
const MAX_MESSAGES: usize = 64;

/// Why a message was not queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Refused {
    /// The client left.
    Closed,
    /// The client is too far behind: messages or bytes queued at the limit.
    Behind,
    /// The message alone is larger than the byte limit.
    TooLarge,
    /// All subscribers together hold the total limit.
    Crowded,
}

/// The bytes queued for all subscribers together, and their limit.
#[derive(Debug, Clone)]
pub(super) struct QueuedBytes {
    queued: Arc<AtomicUsize>,
    limit: usize,
}

impl QueuedBytes {
    /// Nothing queued yet; at most `limit` bytes for all subscribers.
    pub(super) fn new(limit: usize) -> Self {
        Self {
            queued: Arc::new(AtomicUsize::new(0)),
            limit,
        }
    }

    /// The total limit.
    pub(super) fn limit(&self) -> usize {
        self.limit
    }
}

/// The forwarding side of a subscriber's queue.
pub(super) struct QueueSender {
    sender: mpsc::Sender<(Message, usize)>,
    queued: Arc<AtomicUsize>,
    limit: usize,
    total: QueuedBytes,
}

/// The stream a subscriber reads.
pub struct SubscriptionStream {
    receiver: mpsc::Receiver<(Message, usize)>,
    queued: Arc<AtomicUsize>,
    total: Arc<AtomicUsize>,
}

/// A queue holding at most `limit` bytes (and [`MAX_MESSAGES`] messages),
/// counting into `total`.
pub(super) fn queue(limit: usize, total: QueuedBytes) -> (QueueSender, SubscriptionStream) {
    let (sender, receiver) = mpsc::channel(MAX_MESSAGES);
    let queued = Arc::new(AtomicUsize::new(0));
    let stream = SubscriptionStream {
        receiver,
        queued: Arc::clone(&queued),
        total: Arc::clone(&total.queued),
    };
    let sender = QueueSender {
        sender,
        queued,
        limit,
        total,
    };
    (sender, stream)
}

impl QueueSender {
    /// Queues `message` of `size` bytes without waiting.
    pub(super) fn try_send(&self, message: Message, size: usize) -> Result<(), Refused> {
        if size > self.limit {
            return Err(Refused::TooLarge);
        }
        let queued = self.queued.load(Ordering::Acquire);
        if queued.saturating_add(size) > self.limit {
            return Err(Refused::Behind);
        }
        let total = self.total.queued.fetch_add(size, Ordering::AcqRel);
        if total.saturating_add(size) > self.total.limit {
            self.total.queued.fetch_sub(size, Ordering::AcqRel);
            return Err(Refused::Crowded);
        }
        self.queued.fetch_add(size, Ordering::AcqRel);
        self.sender.try_send((message, size)).map_err(|e| {
            self.queued.fetch_sub(size, Ordering::AcqRel);
            self.total.queued.fetch_sub(size, Ordering::AcqRel);
            match e {
                mpsc::error::TrySendError::Closed(_) => Refused::Closed,
                mpsc::error::TrySendError::Full(_) => Refused::Behind,
            }
        })
    }

    /// Queues `status` (a reason to end), waiting for room.
    pub(super) async fn send_reason(&self, status: Status) {
        let _ = self.sender.send((Err(status), 0)).await;
    }

    /// Resolves once the client has left.
    pub(super) async fn closed(&self) {
        self.sender.closed().await;
    }

    /// The byte limit.
    pub(super) fn limit(&self) -> usize {
        self.limit
    }

    /// The total byte limit of all subscribers.
    pub(super) fn total_limit(&self) -> usize {
        self.total.limit()
    }
}

impl Stream for SubscriptionStream {
    type Item = Message;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Message>> {
        match self.receiver.poll_recv(cx) {
            Poll::Ready(Some((message, size))) => {
                self.queued.fetch_sub(size, Ordering::AcqRel);
                self.total.fetch_sub(size, Ordering::AcqRel);
                Poll::Ready(Some(message))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// A stream dropped unread gives its bytes back to the total.
impl Drop for SubscriptionStream {
    fn drop(&mut self) {
        self.receiver.close();
        while let Ok((_, size)) = self.receiver.try_recv() {
            self.total.fetch_sub(size, Ordering::AcqRel);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_stream::StreamExt;

    fn message() -> Message {
        Ok(SubscribeConfigurationResponse::default())
    }

    #[tokio::test]
    async fn bytes_are_counted_until_the_client_reads_them() {
        let (sender, mut stream) = queue(100, QueuedBytes::new(1000));
        assert_eq!(sender.try_send(message(), 60), Ok(()));
        assert_eq!(sender.try_send(message(), 60), Err(Refused::Behind));
        assert_eq!(sender.try_send(message(), 101), Err(Refused::TooLarge));
        assert!(stream.next().await.is_some());
        assert_eq!(sender.try_send(message(), 60), Ok(()));
        drop(stream);
        assert_eq!(sender.try_send(message(), 1), Err(Refused::Closed));
    }

    #[tokio::test]
    async fn small_messages_are_bounded_in_number() {
        let (sender, _stream) = queue(usize::MAX, QueuedBytes::new(usize::MAX));
        for _ in 0..MAX_MESSAGES {
            assert_eq!(sender.try_send(message(), 1), Ok(()));
        }
        assert_eq!(sender.try_send(message(), 1), Err(Refused::Behind));
    }

    #[tokio::test]
    async fn all_subscribers_together_are_bounded() {
        let total = QueuedBytes::new(100);
        let (first, mut first_stream) = queue(80, total.clone());
        let (second, second_stream) = queue(80, total.clone());
        assert_eq!(first.try_send(message(), 60), Ok(()));
        assert_eq!(second.try_send(message(), 60), Err(Refused::Crowded));
        assert!(first_stream.next().await.is_some());
        assert_eq!(second.try_send(message(), 60), Ok(()));
        // A subscriber that leaves unread gives its bytes back.
        drop(second_stream);
        assert_eq!(first.try_send(message(), 60), Ok(()));
    }
}
