//! A reply of known size (a state value, a bulk answer: its body's exact
//! size hint), charged to its connection's and listener's
//! [reply budgets](crate::reply_budget) when it is produced and let go of
//! as the server passes its bytes on. hyper asks for a body's next chunk
//! once it has passed the last one on (HTTP/1: into its bounded write
//! buffer; HTTP/2: to h2, once the client grants the stream some window),
//! so a chunk is let go of when the next is asked for, or the body
//! dropped: what stays charged is what a client that does not read makes
//! the sidecar hold, the chunk hyper holds waiting for window included.
//!
//! A reply is handed on in slices of at most [`SLICE`] bytes: hyper takes
//! a chunk whatever window the client grants, and h2 takes all of it for
//! a window of one byte, so one large chunk would leave the budget at once
//! and sit in the server's buffers instead. Slices of a larger frame are
//! copies, its whole length charged until the last is handed on
//! ([`slices`]): a slice sharing the frame's allocation would keep all of
//! it while charged for a slice.
//! Streamed replies (file downloads, topic subscriptions) have no exact
//! size and are not charged: their own pumps bound what they queue.
//!
//! A gRPC read the hot path declines (a `grpc-encoding` it does not take,
//! a body of more than one message) is answered by tonic's codec, whose
//! answer has no exact size: [`ChargedAsSent`] charges it frame by frame
//! as it is produced, so a client cannot leave the budget by choosing how
//! it asks. A configuration subscription's stream is charged the same way
//! ([`ChargedAsSent::subscription`]): its queue bounds what waits to be
//! taken, the budgets what tonic has taken and the server not yet sent, and
//! h2 is handed one slice at a time.

use std::pin::Pin;
use std::task::{Context, Poll};

use http_body::{Body, Frame, SizeHint};
use tonic::codegen::http::{header, HeaderMap};
use tonic::codegen::Bytes;

use crate::in_flight::InFlight;
use crate::reply_budget::ReplyRefused;

mod slices;

use slices::Slices;

/// The largest piece of a reply handed to the server at once: HTTP/2's
/// default frame size.
pub const SLICE: usize = 16 * 1024;

/// What one reply holds of its connection's and listener's budgets.
#[derive(Debug)]
pub struct ReplyCharge {
    in_flight: InFlight,
    held: usize,
}

impl ReplyCharge {
    /// `bytes` charged to `in_flight`'s connection and listener, unless
    /// either would pass its limit.
    pub fn take(in_flight: &InFlight, bytes: usize) -> Result<Self, ReplyRefused> {
        in_flight.replies().charge(bytes)?;
        Ok(Self {
            in_flight: in_flight.clone(),
            held: bytes,
        })
    }

    /// `bytes` charged to `in_flight`'s connection and listener, unless
    /// the connection would pass its own limit (see
    /// [`ConnectionReplies::charge_within_own`](crate::reply_budget::ConnectionReplies::charge_within_own)).
    pub fn within_connection(in_flight: &InFlight, bytes: usize) -> Result<Self, ReplyRefused> {
        in_flight.replies().charge_within_own(bytes)?;
        Ok(Self {
            in_flight: in_flight.clone(),
            held: bytes,
        })
    }

    /// `bytes` charged to `in_flight`'s connection and listener whatever
    /// they hold: the answer of a call that changed state, always sent.
    pub fn anyway(in_flight: &InFlight, bytes: usize) -> Self {
        in_flight.replies().charge_anyway(bytes);
        Self {
            in_flight: in_flight.clone(),
            held: bytes,
        }
    }

    /// `bytes` were handed to the server: let them go (at most what is
    /// held).
    fn taken(&mut self, bytes: usize) {
        let bytes = bytes.min(self.held);
        if bytes > 0 {
            self.held -= bytes;
            self.in_flight.replies().release(bytes);
        }
    }
}

impl Drop for ReplyCharge {
    fn drop(&mut self) {
        self.taken(self.held);
    }
}

/// A reply body holding its [`ReplyCharge`] until the server takes its
/// bytes, handed on in slices of at most [`SLICE`].
pub struct Replying<B> {
    body: B,
    slices: Slices,
    charge: ReplyCharge,
    /// Whether the server may see the body's exact size (HTTP: its
    /// `content-length`); a gRPC answer goes out without one, as before.
    reveal_size: bool,
}

impl<B> Replying<B> {
    /// `body`, holding `charge`.
    pub fn new(body: B, charge: ReplyCharge, reveal_size: bool) -> Self {
        Self {
            body,
            slices: Slices::default(),
            charge,
            reveal_size,
        }
    }
}

impl<B> Body for Replying<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = &mut *self;
        if let Some(slice) = this.slices.next(&mut this.charge) {
            return Poll::Ready(Some(Ok(slice)));
        }
        match Pin::new(&mut this.body).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                Ok(data) => Poll::Ready(Some(Ok(this.slices.first(data, &mut this.charge)))),
                Err(other) => Poll::Ready(Some(Ok(other))),
            },
            polled => polled,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.slices.rest_len() == 0 && self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        if !self.reveal_size {
            return SizeHint::default();
        }
        let inner = self.body.size_hint();
        let rest = self.slices.rest_len() as u64;
        let mut hint = SizeHint::new();
        hint.set_lower(inner.lower().saturating_add(rest));
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper.saturating_add(rest));
        }
        hint
    }
}

/// A gRPC answer of unknown size to a repeatable read (tonic's codec
/// encodes it only as it is sent), charged as [`Replying`] charges one of
/// known size, but frame by frame: each data frame is charged when the
/// inner body yields it and handed on in slices, let go of once the
/// server asks for the one after its last. Only the first data frame may
/// be refused (nothing of the answer sent yet): the answer then ends at
/// once with trailers `grpc-status: 8`, valid gRPC after headers sent
/// without a status. Later frames of an answer begun are charged whatever
/// the budgets hold. A subscription's stream is refused the other way
/// round ([`Refusing`]).
pub struct ChargedAsSent<B> {
    body: B,
    in_flight: InFlight,
    refusing: Refusing,
    slices: Slices,
    /// What the frame being handed on holds.
    charge: Option<ReplyCharge>,
    /// Whether a data frame was charged already.
    begun: bool,
    /// Whether the answer ended with a refusal.
    refused: bool,
}

/// Which data frames of a [`ChargedAsSent`] answer its budgets may refuse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusing {
    /// A repeatable read's answer: its first (nothing of it sent yet).
    First,
    /// A configuration subscription's stream: all but its first (Dapr's
    /// carries the subscription's id: the subscription is made, as a call
    /// that changed state is answered; Layotto's, its first change), and
    /// only past its own connection's limit: a change refused ends the
    /// stream with its reason, as a subscriber dropped for not reading
    /// (the client holds as many bytes unread on its connection as it
    /// may, unless the connection holds nothing). Other clients filling
    /// the listener's budget never drop it (a lost change is not retried
    /// as a refused read is), and a subscriber that stops reading is held
    /// to its connection's bound even once its queue has dropped it.
    AfterFirstWithinConnection,
}

impl<B> ChargedAsSent<B> {
    /// `body`, charged to `in_flight`'s connection and listener.
    pub fn new(body: B, in_flight: InFlight) -> Self {
        Self::refusing(body, in_flight, Refusing::First)
    }

    /// A configuration subscription's stream `body`, charged to
    /// `in_flight`'s connection and listener, its changes refusable past
    /// the connection's own limit (see
    /// [`Refusing::AfterFirstWithinConnection`]).
    pub fn subscription(body: B, in_flight: InFlight) -> Self {
        Self::refusing(body, in_flight, Refusing::AfterFirstWithinConnection)
    }

    fn refusing(body: B, in_flight: InFlight, refusing: Refusing) -> Self {
        Self {
            body,
            in_flight,
            refusing,
            slices: Slices::default(),
            charge: None,
            begun: false,
            refused: false,
        }
    }

    /// `bytes` charged: refused past the budgets when the frame is one
    /// [`Refusing`] says may be.
    fn charge(&mut self, bytes: usize) -> Result<ReplyCharge, ReplyRefused> {
        let first = !std::mem::replace(&mut self.begun, true);
        match self.refusing {
            Refusing::First if first => ReplyCharge::take(&self.in_flight, bytes),
            Refusing::AfterFirstWithinConnection if !first => {
                ReplyCharge::within_connection(&self.in_flight, bytes)
            }
            _ => Ok(ReplyCharge::anyway(&self.in_flight, bytes)),
        }
    }
}

/// The trailers ending an answer refused for `refused`: its status and
/// message as tonic writes them (the hot path's refusal's words; a
/// subscription's say it is dropped).
fn refusal_trailers(refused: ReplyRefused, refusing: Refusing) -> HeaderMap {
    let message = match refusing {
        Refusing::First => refused.to_string(),
        Refusing::AfterFirstWithinConnection => {
            format!("configuration subscription dropped, a change not sent: {refused}")
        }
    };
    let status = tonic::Status::resource_exhausted(message);
    let mut trailers = status.into_http::<()>().into_parts().0.headers;
    trailers.remove(header::CONTENT_TYPE);
    trailers
}

impl<B> Body for ChargedAsSent<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = &mut *self;
        if let Some(charge) = &mut this.charge {
            if let Some(slice) = this.slices.next(charge) {
                return Poll::Ready(Some(Ok(slice)));
            }
        }
        this.charge = None;
        if this.refused {
            return Poll::Ready(None);
        }
        match Pin::new(&mut this.body).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                Ok(data) if data.is_empty() => Poll::Ready(Some(Ok(Frame::data(data)))),
                Ok(data) => match this.charge(data.len()) {
                    Ok(mut charge) => {
                        let slice = this.slices.first(data, &mut charge);
                        this.charge = Some(charge);
                        Poll::Ready(Some(Ok(slice)))
                    }
                    Err(refused) => {
                        this.refused = true;
                        let trailers = refusal_trailers(refused, this.refusing);
                        Poll::Ready(Some(Ok(Frame::trailers(trailers))))
                    }
                },
                Err(other) => Poll::Ready(Some(Ok(other))),
            },
            polled => polled,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.slices.rest_len() == 0 && (self.refused || self.body.is_end_stream())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reply_budget::ReplyLimits;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    /// A body of one data frame of `len` bytes.
    fn one_frame(len: usize) -> axum::body::Body {
        axum::body::Body::from(Bytes::from(vec![7; len]))
    }

    async fn next(body: &mut Replying<axum::body::Body>) -> Option<usize> {
        let frame = std::future::poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx)).await?;
        frame
            .expect("a frame")
            .into_data()
            .ok()
            .map(|data| data.len())
    }

    #[tokio::test]
    async fn a_reply_is_handed_on_in_slices_each_let_go_of_when_the_next_is_asked_for() {
        let limits = ReplyLimits::new(1 << 20, 1 << 20);
        let in_flight = InFlight::with_replies(&limits);
        let len = 2 * SLICE + 10;
        let charge = ReplyCharge::take(&in_flight, len).expect("charged");
        let mut reply = Replying::new(one_frame(len), charge, true);
        assert_eq!(reply.size_hint().exact(), Some(len as u64));
        assert_eq!(next(&mut reply).await, Some(SLICE));
        assert_eq!(reply.size_hint().exact(), Some((len - SLICE) as u64));
        // The frame is held whole until its last slice is handed on, which
        // is held until the next is asked for.
        assert_eq!(limits.listener().held(), len);
        assert_eq!(next(&mut reply).await, Some(SLICE));
        assert_eq!(limits.listener().held(), len);
        assert_eq!(next(&mut reply).await, Some(10));
        assert_eq!(in_flight.replies().held(), 10);
        assert_eq!(next(&mut reply).await, None);
        assert_eq!(in_flight.replies().held(), 0);
        // A gRPC answer keeps its size to itself; dropped unread, it lets
        // go of all it held.
        let charge = ReplyCharge::take(&in_flight, len).expect("charged");
        let unread = Replying::new(one_frame(len), charge, false);
        assert_eq!(unread.size_hint().exact(), None);
        assert_eq!(limits.listener().held(), len);
        drop(unread);
        assert_eq!(limits.listener().held(), 0);
    }

    async fn next_frame(body: &mut ChargedAsSent<axum::body::Body>) -> Option<Frame<Bytes>> {
        let frame = std::future::poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx)).await?;
        Some(frame.expect("a frame"))
    }

    #[tokio::test]
    async fn an_answer_of_unknown_size_is_charged_as_produced_or_ends_refused() {
        let limits = ReplyLimits::new(SLICE, 1 << 20);
        let in_flight = InFlight::with_replies(&limits);
        let len = SLICE + 10;
        let mut answer = ChargedAsSent::new(one_frame(len), in_flight.clone());
        assert_eq!(in_flight.replies().held(), 0, "nothing charged unproduced");
        let first = next_frame(&mut answer).await.expect("a slice");
        assert_eq!(first.data_ref().map(Bytes::len), Some(SLICE));
        // Holding nothing before, the frame past the budget passes.
        assert_eq!(in_flight.replies().held(), len);
        // Another answer's first frame is refused while this one holds.
        let mut refused = ChargedAsSent::new(one_frame(1), in_flight.clone());
        let trailers = next_frame(&mut refused).await.expect("the refusal");
        let trailers = trailers.into_trailers().expect("trailers");
        assert_eq!(trailers["grpc-status"], "8");
        let message = trailers["grpc-message"].to_str().expect("text");
        assert!(
            message.contains("max_response_bytes_in_flight_per_connection"),
            "{message}"
        );
        assert!(refused.is_end_stream());
        assert!(next_frame(&mut refused).await.is_none());
        assert_eq!(in_flight.replies().held(), len, "the refused frame let go");
        let rest = next_frame(&mut answer).await.expect("the rest");
        assert_eq!(rest.data_ref().map(Bytes::len), Some(10));
        assert_eq!(in_flight.replies().held(), 10);
        assert!(next_frame(&mut answer).await.is_none());
        assert_eq!(limits.listener().held(), 0);
    }

    /// A frame's bytes, telling when they are dropped.
    struct Owned {
        bytes: Vec<u8>,
        dropped: Arc<AtomicBool>,
    }

    impl AsRef<[u8]> for Owned {
        fn as_ref(&self) -> &[u8] {
            &self.bytes
        }
    }

    impl Drop for Owned {
        fn drop(&mut self) {
            self.dropped.store(true, Ordering::SeqCst);
        }
    }

    /// A frame of `len` bytes, and whether its allocation was dropped.
    fn owned_frame(len: usize) -> (Bytes, Arc<AtomicBool>) {
        let dropped = Arc::new(AtomicBool::new(false));
        let bytes = vec![7; len];
        let frame = Bytes::from_owner(Owned {
            bytes,
            dropped: Arc::clone(&dropped),
        });
        (frame, dropped)
    }

    async fn next_data<B: Body<Data = Bytes> + Unpin>(body: &mut B) -> Option<Bytes> {
        let frame = std::future::poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx)).await?;
        let frame = frame.map_err(|_| "an error").expect("a frame");
        Some(frame.into_data().expect("data"))
    }

    /// Hands every slice of `body` (one frame of `len` bytes, whose
    /// allocation tells when it is dropped) on, keeping the last as h2
    /// does waiting for window: while any of the frame's allocation is
    /// held, all of it stays charged; the slices are copies, so it is
    /// dropped once the last is handed on.
    async fn all_of_a_large_frame_held_stays_charged<B>(
        mut body: B,
        len: usize,
        dropped: &AtomicBool,
        in_flight: &InFlight,
    ) where
        B: Body<Data = Bytes> + Unpin,
    {
        let mut handed = 0;
        let mut held_by_server = None;
        while let Some(slice) = next_data(&mut body).await {
            assert!(slice.len() <= SLICE);
            handed += slice.len();
            held_by_server = Some(slice);
            let held = in_flight.replies().held();
            assert!(
                dropped.load(Ordering::SeqCst) || held >= len,
                "{held} bytes charged for a {len}-byte allocation, {handed} handed on"
            );
        }
        assert_eq!(handed, len);
        assert!(
            dropped.load(Ordering::SeqCst),
            "the last slice held keeps the whole frame"
        );
        assert_eq!(in_flight.replies().held(), 0);
        drop(held_by_server);
        drop(body);
        assert_eq!(in_flight.replies().held(), 0);
    }

    #[tokio::test]
    async fn a_large_frame_stays_charged_whole_while_any_of_its_allocation_is_held() {
        let limits = ReplyLimits::new(4 << 20, 4 << 20);
        let in_flight = InFlight::with_replies(&limits);
        let len = 1 << 20;
        let (frame, dropped) = owned_frame(len);
        let charge = ReplyCharge::take(&in_flight, len).expect("charged");
        let reply = Replying::new(axum::body::Body::from(frame), charge, false);
        all_of_a_large_frame_held_stays_charged(reply, len, &dropped, &in_flight).await;

        let (frame, dropped) = owned_frame(len);
        let answer = ChargedAsSent::new(axum::body::Body::from(frame), in_flight.clone());
        all_of_a_large_frame_held_stays_charged(answer, len, &dropped, &in_flight).await;
        assert_eq!(limits.listener().held(), 0);
    }

    /// A frame of one slice (the hot path's usual answer) is handed on as
    /// it is, not copied.
    #[tokio::test]
    async fn a_frame_of_one_slice_is_handed_on_uncopied() {
        let limits = ReplyLimits::new(1 << 20, 1 << 20);
        let in_flight = InFlight::with_replies(&limits);
        let frame = Bytes::from(vec![7; SLICE]);
        let charge = ReplyCharge::take(&in_flight, SLICE).expect("charged");
        let mut reply = Replying::new(axum::body::Body::from(frame.clone()), charge, false);
        let handed = next_data(&mut reply).await.expect("the frame");
        assert_eq!(handed.as_ptr(), frame.as_ptr());
        assert_eq!(in_flight.replies().held(), SLICE);
        assert!(next_data(&mut reply).await.is_none());
        assert_eq!(in_flight.replies().held(), 0);
    }
}
