//! The request bytes a listener holds while reading bodies, bounded across
//! all its connections. `max_request_bytes` bounds one body; without this,
//! clients could park a body each on every stream of every connection
//! (sending all but its last byte) and hold connections × streams × 4 MiB.
//! Each body is charged as its bytes are read and let go of when it is
//! dropped (read whole and decoded, or abandoned); a body that would pass
//! the budget fails with `RESOURCE_EXHAUSTED`, and the client may retry.
//!
//! A streamed body (a file upload, of any size up to the store's bound) is
//! charged the same way, but its reader hands back what it has passed on
//! ([`BodyCharge::taken`], found in the request's extensions): such a body
//! holds only the bytes read and not yet taken by the store, so an upload
//! larger than the budget passes, and a slow one does not starve the
//! listener's other requests.
//!
//! A gRPC request stream (a streamed subscription's acknowledgements, a
//! Layotto configuration subscription) lives as long as its call: it holds
//! only the message being read ([`Budgeted::messages`]), not every message
//! it has carried.

use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use http_body::{Body, Frame, SizeHint};
use tonic::codegen::Bytes;
use tonic::Status;

use super::grpc_framing::GrpcFraming;

/// Errors a body wrapper passes on: the inner body's, or the budget's.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Bytes of request bodies being read on one listener, and its limit.
#[derive(Debug)]
pub struct BodyBudget {
    in_use: AtomicUsize,
    limit: usize,
}

impl BodyBudget {
    /// A budget of `limit` bytes.
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(Self {
            in_use: AtomicUsize::new(0),
            limit,
        })
    }

    /// Takes `bytes`, unless that would pass the limit.
    /// (Checked before it is added: a refused charge never shows, so it
    /// cannot make a concurrent one fail.)
    fn charge(&self, bytes: usize) -> bool {
        self.in_use
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |in_use| {
                in_use
                    .checked_add(bytes)
                    .filter(|after| *after <= self.limit)
            })
            .is_ok()
    }

    fn release(&self, bytes: usize) {
        self.in_use.fetch_sub(bytes, Ordering::AcqRel);
    }

    /// Takes `bytes` that a decoded request holds (not a body being read),
    /// unless that would pass the limit; [`Self::let_go`] gives them back.
    pub(crate) fn hold_decoded(&self, bytes: usize) -> bool {
        self.charge(bytes)
    }

    /// Gives back `bytes` taken by [`Self::hold_decoded`].
    pub(crate) fn let_go(&self, bytes: usize) {
        self.release(bytes);
    }

    /// The most this budget holds at once.
    pub(crate) fn limit(&self) -> usize {
        self.limit
    }

    /// Bytes held now.
    pub fn in_use(&self) -> usize {
        self.in_use.load(Ordering::Acquire)
    }
}

/// What one body holds of a [`BodyBudget`].
#[derive(Debug)]
struct Charge {
    budget: Arc<BodyBudget>,
    charged: AtomicUsize,
}

/// A handle on the charge of one request body, put in the request's
/// extensions: the reader of a streamed body tells it what it has passed
/// on, which stops counting against the budget.
#[derive(Debug, Clone)]
pub struct BodyCharge(Arc<Charge>);

impl BodyCharge {
    /// `bytes` of the body were taken by their consumer: let them go (at
    /// most what is charged).
    pub fn taken(&self, bytes: usize) {
        let Charge { budget, charged } = &*self.0;
        if let Ok(before) = charged.fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
            Some(held.saturating_sub(bytes))
        }) {
            budget.release(before.min(bytes));
        }
    }

    /// Bytes of this body held now.
    pub fn held(&self) -> usize {
        self.0.charged.load(Ordering::Acquire)
    }
}

/// What a [`Budgeted`] body holds: inline for a body read whole (no
/// allocation per request), shared with a [`BodyCharge`] for a streamed
/// one.
enum Held {
    Inline {
        budget: Arc<BodyBudget>,
        charged: usize,
    },
    Shared(Arc<Charge>),
    /// A gRPC request stream: the charge is the message being read.
    Messages {
        budget: Arc<BodyBudget>,
        charged: usize,
        framing: GrpcFraming,
    },
}

/// A request body charged to a [`BodyBudget`] as it is read.
pub struct Budgeted<B> {
    body: B,
    held: Held,
}

impl<B> Budgeted<B> {
    /// `body`, charged to `budget`, held until it is dropped.
    pub fn new(body: B, budget: Arc<BodyBudget>) -> Self {
        Self {
            body,
            held: Held::Inline { budget, charged: 0 },
        }
    }

    /// A gRPC request stream `body`, charged to `budget` for the message
    /// being read: when the stream's decoder asks for more bytes, it has
    /// taken every whole message, so only the unfinished one's bytes stay
    /// charged (a partial message parked on the stream still counts).
    pub fn messages(body: B, budget: Arc<BodyBudget>) -> Self {
        Self {
            body,
            held: Held::Messages {
                budget,
                charged: 0,
                framing: GrpcFraming::default(),
            },
        }
    }

    /// `body`, charged to `budget`, and the handle through which its
    /// streaming reader lets go of what it took (one allocation: only
    /// uploads are read this way).
    pub fn streamed(body: B, budget: Arc<BodyBudget>) -> (Self, BodyCharge) {
        let charge = Arc::new(Charge {
            budget,
            charged: AtomicUsize::new(0),
        });
        let handle = BodyCharge(Arc::clone(&charge));
        (
            Self {
                body,
                held: Held::Shared(charge),
            },
            handle,
        )
    }
}

impl<B> Drop for Budgeted<B> {
    fn drop(&mut self) {
        match &self.held {
            Held::Inline { budget, charged }
            | Held::Messages {
                budget, charged, ..
            } => budget.release(*charged),
            Held::Shared(charge) => {
                let held = charge.charged.swap(0, Ordering::AcqRel);
                charge.budget.release(held);
            }
        }
    }
}

impl<B> Body for Budgeted<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if let Held::Messages {
            budget,
            charged,
            framing,
        } = &mut self.held
        {
            // Asked for more: the whole messages read so far are taken.
            let taken = *charged - framing.partial();
            budget.release(taken);
            *charged -= taken;
        }
        let frame = match Pin::new(&mut self.body).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => frame,
            Poll::Ready(Some(Err(error))) => return Poll::Ready(Some(Err(error.into()))),
            Poll::Ready(None) => return Poll::Ready(None),
            Poll::Pending => return Poll::Pending,
        };
        let bytes = frame.data_ref().map_or(0, Bytes::len);
        let budget = match &self.held {
            Held::Inline { budget, .. } | Held::Messages { budget, .. } => budget,
            Held::Shared(charge) => &charge.budget,
        };
        if !budget.charge(bytes) {
            let limit = budget.limit;
            return Poll::Ready(Some(Err(Box::new(Status::resource_exhausted(format!(
                "the sidecar is reading as many request bytes as it holds at once \
                 ({limit} bytes across its connections): try again shortly"
            ))))));
        }
        match &mut self.held {
            Held::Inline { charged, .. } => *charged += bytes,
            Held::Messages {
                charged, framing, ..
            } => {
                *charged += bytes;
                if let Some(data) = frame.data_ref() {
                    framing.advance(data);
                }
            }
            Held::Shared(charge) => {
                charge.charged.fetch_add(bytes, Ordering::AcqRel);
            }
        }
        Poll::Ready(Some(Ok(frame)))
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

    /// A body of `chunks`, one data frame each.
    struct Chunks(Vec<Bytes>);

    impl Body for Chunks {
        type Data = Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            Poll::Ready((!self.0.is_empty()).then(|| Ok(Frame::data(self.0.remove(0)))))
        }
    }

    async fn next(body: &mut Budgeted<Chunks>) -> Option<Result<Frame<Bytes>, BoxError>> {
        std::future::poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx)).await
    }

    fn chunks(sizes: &[usize]) -> Chunks {
        Chunks(sizes.iter().map(|n| Bytes::from(vec![7; *n])).collect())
    }

    #[test]
    fn a_refused_charge_never_makes_a_concurrent_one_fail() {
        let budget = BodyBudget::new(1000);
        assert!(budget.charge(1));
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let refusing = {
            let (budget, done) = (Arc::clone(&budget), Arc::clone(&done));
            std::thread::spawn(move || {
                while !done.load(Ordering::Relaxed) {
                    assert!(!budget.hold_decoded(1000), "past the limit");
                }
            })
        };
        let refused = (0..2_000_000)
            .filter(|_| {
                let charged = budget.charge(1);
                if charged {
                    budget.release(1);
                }
                !charged
            })
            .count();
        done.store(true, Ordering::Relaxed);
        refusing.join().unwrap();
        assert_eq!(refused, 0, "a charge of 1 beside 1 of 1,000 was refused");
        assert_eq!(budget.in_use(), 1);
    }

    #[tokio::test]
    async fn bodies_are_charged_as_read_refused_past_the_limit_and_let_go_when_dropped() {
        let budget = BodyBudget::new(100);
        let mut parked = Budgeted::new(chunks(&[60, 1]), Arc::clone(&budget));
        assert!(matches!(next(&mut parked).await, Some(Ok(_))));
        assert_eq!(budget.in_use(), 60);

        // A second body fits until it would pass the limit.
        let mut second = Budgeted::new(chunks(&[30, 30]), Arc::clone(&budget));
        assert!(matches!(next(&mut second).await, Some(Ok(_))));
        let Some(Err(error)) = next(&mut second).await else {
            panic!("the budget was passed");
        };
        let status = error.downcast::<Status>().expect("a status");
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
        assert!(
            status.message().contains("100 bytes"),
            "{}",
            status.message()
        );
        drop(second);
        assert_eq!(budget.in_use(), 60, "the refused body let go of its 30");

        drop(parked);
        assert_eq!(budget.in_use(), 0);
        let mut third = Budgeted::new(chunks(&[90]), Arc::clone(&budget));
        assert!(matches!(next(&mut third).await, Some(Ok(_))));
    }

    /// `n` gRPC messages of `len` bytes each, prefixes included.
    fn grpc_messages(n: usize, len: usize) -> Vec<u8> {
        let one = [
            &[0][..],
            &u32::try_from(len).expect("small").to_be_bytes(),
            &vec![7; len],
        ]
        .concat();
        one.repeat(n)
    }

    #[tokio::test]
    async fn a_request_stream_holds_only_the_message_being_read() {
        let budget = BodyBudget::new(1_000);
        // 100,000 acknowledgements of 45 bytes (4.5 MB) through a budget
        // of 1,000 bytes, in frames that split messages anywhere.
        let bytes = grpc_messages(100_000, 40);
        let frames: Vec<Bytes> = bytes.chunks(333).map(Bytes::copy_from_slice).collect();
        let mut stream = Budgeted::messages(Chunks(frames), Arc::clone(&budget));
        let mut frames_read = 0;
        while let Some(frame) = next(&mut stream).await {
            frame.expect("within the budget");
            frames_read += 1;
            assert!(budget.in_use() <= 333 + 45, "{}", budget.in_use());
        }
        assert_eq!(frames_read, bytes.len().div_ceil(333));
        // A message parked half-read keeps its bytes charged.
        let mut parked_bytes = grpc_messages(1, 900);
        parked_bytes.truncate(600);
        let halves = vec![
            Bytes::copy_from_slice(&parked_bytes[..300]),
            Bytes::copy_from_slice(&parked_bytes[300..]),
        ];
        let mut parked = Budgeted::messages(Chunks(halves), Arc::clone(&budget));
        assert!(matches!(next(&mut parked).await, Some(Ok(_))));
        assert!(matches!(next(&mut parked).await, Some(Ok(_))));
        assert_eq!(budget.in_use(), 600);
        drop(parked);
        drop(stream);
        assert_eq!(budget.in_use(), 0);
    }

    #[tokio::test]
    async fn a_streamed_body_holds_only_what_its_reader_has_not_taken() {
        let budget = BodyBudget::new(100);
        // 300 bytes through a budget of 100, each frame taken as read.
        let (mut streamed, charge) =
            Budgeted::streamed(chunks(&[60, 60, 60, 60, 60]), Arc::clone(&budget));
        while let Some(frame) = next(&mut streamed).await {
            let frame = frame.expect("within the budget");
            assert_eq!(budget.in_use(), 60);
            charge.taken(frame.data_ref().map_or(0, Bytes::len));
            assert_eq!((budget.in_use(), charge.held()), (0, 0));
        }
        // Letting go of more than is held lets go of what is held only.
        let (mut other, other_charge) = Budgeted::streamed(chunks(&[40]), Arc::clone(&budget));
        assert!(matches!(next(&mut other).await, Some(Ok(_))));
        charge.taken(1_000);
        assert_eq!(budget.in_use(), 40);
        other_charge.taken(10);
        assert_eq!(budget.in_use(), 30);
        drop(other);
        drop(streamed);
        assert_eq!(budget.in_use(), 0);
    }
}
