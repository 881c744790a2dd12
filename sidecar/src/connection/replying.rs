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
//! and sit in the server's buffers instead.
//! Streamed replies (file downloads, subscriptions) have no exact size and
//! are not charged: their own pumps bound what they queue.
//!
//! A gRPC read the hot path declines (a `grpc-encoding` it does not take,
//! a body of more than one message) is answered by tonic's codec, whose
//! answer has no exact size: [`ChargedAsSent`] charges it frame by frame
//! as it is produced, so a client cannot leave the budget by choosing how
//! it asks.

use std::pin::Pin;
use std::task::{Context, Poll};

use http_body::{Body, Frame, SizeHint};
use tonic::codegen::http::{header, HeaderMap};
use tonic::codegen::Bytes;

use crate::in_flight::InFlight;
use crate::reply_budget::ReplyRefused;

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
    /// The rest of a data frame larger than a slice.
    rest: Bytes,
    /// Bytes of the last slice, held by the server until it asks for the
    /// next.
    handed: usize,
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
            rest: Bytes::new(),
            handed: 0,
            charge,
            reveal_size,
        }
    }

    /// The first slice of `data` (the rest kept for the next poll), its
    /// bytes let go of when the next is asked for.
    fn slice(&mut self, mut data: Bytes) -> Frame<Bytes> {
        if data.len() > SLICE {
            self.rest = data.split_off(SLICE);
        }
        self.handed = data.len();
        Frame::data(data)
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
        // Asked for more: the server has passed the last slice on.
        this.charge.taken(std::mem::take(&mut this.handed));
        if !this.rest.is_empty() {
            let rest = std::mem::take(&mut this.rest);
            return Poll::Ready(Some(Ok(this.slice(rest))));
        }
        match Pin::new(&mut this.body).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                Ok(data) => Poll::Ready(Some(Ok(this.slice(data)))),
                Err(other) => Poll::Ready(Some(Ok(other))),
            },
            polled => polled,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_empty() && self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        if !self.reveal_size {
            return SizeHint::default();
        }
        let inner = self.body.size_hint();
        let rest = self.rest.len() as u64;
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
/// inner body yields it and handed on in slices, let go of as the server
/// asks for the next. Only the first data frame may be refused (nothing of
/// the answer sent yet): the answer then ends at once with trailers
/// `grpc-status: 8`, valid gRPC after headers sent without a status. Later
/// frames of an answer begun are charged whatever the budgets hold.
pub struct ChargedAsSent<B> {
    body: B,
    in_flight: InFlight,
    /// The rest of a data frame larger than a slice.
    rest: Bytes,
    /// Bytes of the last slice, held by the server until it asks for the
    /// next.
    handed: usize,
    /// What the frame being handed on holds.
    charge: Option<ReplyCharge>,
    /// Whether a data frame was charged already.
    begun: bool,
    /// Whether the answer ended with a refusal.
    refused: bool,
}

impl<B> ChargedAsSent<B> {
    /// `body`, charged to `in_flight`'s connection and listener.
    pub fn new(body: B, in_flight: InFlight) -> Self {
        Self {
            body,
            in_flight,
            rest: Bytes::new(),
            handed: 0,
            charge: None,
            begun: false,
            refused: false,
        }
    }

    /// `bytes` charged: refusable for the answer's first data frame.
    fn charge(&mut self, bytes: usize) -> Result<ReplyCharge, ReplyRefused> {
        if std::mem::replace(&mut self.begun, true) {
            return Ok(ReplyCharge::anyway(&self.in_flight, bytes));
        }
        ReplyCharge::take(&self.in_flight, bytes)
    }

    /// The first slice of `data` (the rest kept for the next poll).
    fn slice(&mut self, mut data: Bytes) -> Frame<Bytes> {
        if data.len() > SLICE {
            self.rest = data.split_off(SLICE);
        }
        self.handed = data.len();
        Frame::data(data)
    }
}

/// The trailers ending an answer refused for `refused`: its status and
/// message as tonic writes them (the hot path's refusal's words).
fn refusal_trailers(refused: ReplyRefused) -> HeaderMap {
    let status = tonic::Status::resource_exhausted(refused.to_string());
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
        // Asked for more: the server has passed the last slice on.
        let handed = std::mem::take(&mut this.handed);
        if let Some(charge) = &mut this.charge {
            charge.taken(handed);
        }
        if !this.rest.is_empty() {
            let rest = std::mem::take(&mut this.rest);
            return Poll::Ready(Some(Ok(this.slice(rest))));
        }
        this.charge = None;
        if this.refused {
            return Poll::Ready(None);
        }
        match Pin::new(&mut this.body).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                Ok(data) if data.is_empty() => Poll::Ready(Some(Ok(Frame::data(data)))),
                Ok(data) => match this.charge(data.len()) {
                    Ok(charge) => {
                        this.charge = Some(charge);
                        Poll::Ready(Some(Ok(this.slice(data))))
                    }
                    Err(refused) => {
                        this.refused = true;
                        Poll::Ready(Some(Ok(Frame::trailers(refusal_trailers(refused)))))
                    }
                },
                Err(other) => Poll::Ready(Some(Ok(other))),
            },
            polled => polled,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_empty() && (self.refused || self.body.is_end_stream())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reply_budget::ReplyLimits;

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
        // The slice handed on is held until the next is asked for.
        assert_eq!(limits.listener().held(), len);
        assert_eq!(next(&mut reply).await, Some(SLICE));
        assert_eq!(limits.listener().held(), len - SLICE);
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
}
