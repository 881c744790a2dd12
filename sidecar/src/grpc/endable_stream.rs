//! A server stream the server can end early with a status: what a client
//! that stopped reading (or answering) is told when it reads again,
//! ahead of anything still queued, which such a client would never take.
//! The task feeding the stream can then stop instead of waiting on the
//! client for ever. Every status it yields is fitted to the trailers
//! (see [`fitted_to_trailers`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::Stream;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tonic::Status;

use super::observe::fitted_to_trailers;

/// The feeding side's way to end the stream. Cancelling `closed` without
/// a status ends nothing: the stream then ends with its queue.
#[derive(Clone, Default)]
pub(super) struct StreamEnd {
    closed: CancellationToken,
    status: Arc<Mutex<Option<Status>>>,
}

impl StreamEnd {
    /// Ends the stream with `status` (the first status given wins).
    pub(super) fn end(&self, status: Status) {
        self.status
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert(status);
        self.closed.cancel();
    }

    /// Marks the stream closed without a status (the client left).
    pub(super) fn close(&self) {
        self.closed.cancel();
    }

    pub(super) fn is_closed(&self) -> bool {
        self.closed.is_cancelled()
    }

    /// Resolves once the stream is closed or ended.
    pub(super) async fn closed(&self) {
        self.closed.cancelled().await;
    }
}

/// What the client reads: the queued messages, or the status the stream
/// was ended with.
pub(super) struct EndableStream<T> {
    queued: ReceiverStream<Result<T, Status>>,
    closed: Pin<Box<WaitForCancellationFutureOwned>>,
    status: Arc<Mutex<Option<Status>>>,
    done: bool,
}

impl<T> EndableStream<T> {
    /// The messages of `queued`, until `end` ends the stream.
    pub(super) fn new(queued: mpsc::Receiver<Result<T, Status>>, end: &StreamEnd) -> Self {
        Self {
            queued: ReceiverStream::new(queued),
            closed: Box::pin(end.closed.clone().cancelled_owned()),
            status: Arc::clone(&end.status),
            done: false,
        }
    }
}

impl<T> Stream for EndableStream<T> {
    type Item = Result<T, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.done {
            return Poll::Ready(None);
        }
        if self.closed.as_mut().poll(cx).is_ready() {
            let ended = self.status.lock().unwrap_or_else(|p| p.into_inner()).take();
            if let Some(status) = ended {
                self.done = true;
                return Poll::Ready(Some(Err(fitted_to_trailers(status))));
            }
        }
        Pin::new(&mut self.queued)
            .poll_next(cx)
            .map(|next| next.map(|item| item.map_err(fitted_to_trailers)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_stream::StreamExt;

    #[tokio::test]
    async fn an_ended_stream_says_why_before_what_is_queued_and_then_ends() {
        let (out, queued) = mpsc::channel(4);
        let end = StreamEnd::default();
        let mut stream = EndableStream::new(queued, &end);
        out.try_send(Ok(1)).expect("room");
        assert_eq!(stream.next().await.map(|m| m.ok()), Some(Some(1)));
        out.try_send(Ok(2)).expect("room");
        end.end(Status::deadline_exceeded("stopped reading"));
        end.end(Status::internal("a later reason"));
        let Some(Err(status)) = stream.next().await else {
            panic!("the status comes first");
        };
        assert_eq!(status.message(), "stopped reading");
        assert!(stream.next().await.is_none());
    }

    #[tokio::test]
    async fn a_status_too_long_for_trailers_is_cut_queued_or_ending() {
        let (out, queued) = mpsc::channel(4);
        let end = StreamEnd::default();
        let mut stream = EndableStream::<u8>::new(queued, &end);
        let long = "x".repeat(1024 * 1024);
        out.try_send(Err(Status::internal(long.clone())))
            .expect("room");
        let Some(Err(queued)) = stream.next().await else {
            panic!("the queued status");
        };
        assert!(queued.message().len() < 2048, "{}", queued.message().len());
        end.end(Status::deadline_exceeded(long));
        let Some(Err(ending)) = stream.next().await else {
            panic!("the ending status");
        };
        assert_eq!(ending.code(), tonic::Code::DeadlineExceeded);
        assert!(ending.message().len() < 2048, "{}", ending.message().len());
    }

    #[tokio::test]
    async fn a_stream_closed_without_a_status_ends_with_its_queue() {
        let (out, queued) = mpsc::channel(4);
        let end = StreamEnd::default();
        let mut stream = EndableStream::new(queued, &end);
        out.try_send(Ok(1)).expect("room");
        end.close();
        drop(out);
        assert_eq!(stream.next().await.map(|m| m.ok()), Some(Some(1)));
        assert!(stream.next().await.is_none());
    }
}
