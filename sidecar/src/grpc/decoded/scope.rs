//! Each call's charge for what its request holds decoded: a task-local
//! scope around the call, which the codec and the hot path consult before
//! they decode.

use std::any::TypeId;
use std::cell::Cell;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::future::Either;
use tonic::codegen::http::{Method, Request};
use tonic::codegen::Service;
use tonic::Status;

use super::estimate::decoded_bytes;
use super::schema::{MessageId, Schemas};
use crate::connection::{BodyBudget, BodyRead, CountedBody};

tokio::task_local! {
    /// The call being served, while its future runs.
    static CALL: CallCharge;
}

/// What a call's decoded requests hold of the listener's budget.
pub(in crate::grpc) struct CallCharge {
    /// The method's request message.
    request: MessageId,
    budget: Arc<BodyBudget>,
    /// A request stream's messages are checked against what is free as
    /// they are decoded, and not held: its reader handles each and drops
    /// it before it reads the next (holding the latest would let a stream
    /// that goes quiet pin its charge for its life).
    stream: bool,
    /// What the call's request holds decoded (a unary call holds one).
    held: Cell<usize>,
    /// The type the call's requests decode as, bound by the first decoded:
    /// anything else decoded in the call (an answer to a call its handler
    /// made to the app) is not its request, and is not measured.
    decodes: Cell<Option<TypeId>>,
}

impl CallCharge {
    fn new(request: MessageId, budget: Arc<BodyBudget>, stream: bool) -> Self {
        Self {
            request,
            budget,
            stream,
            held: Cell::new(0),
            decodes: Cell::new(None),
        }
    }

    /// Charges what `message`, to be decoded as `decoded_as`, holds
    /// decoded, or says why it may not be; `still_read`: its bytes are
    /// still charged as a body being read (tonic's codec decodes before
    /// it lets go of the body), so they count toward what could fit.
    fn admit(&self, message: &[u8], decoded_as: TypeId, still_read: bool) -> Result<(), Status> {
        match self.decodes.get() {
            None => self.decodes.set(Some(decoded_as)),
            Some(request) if request != decoded_as => return Ok(()),
            Some(_) => {}
        }
        let schemas = Schemas::embedded();
        // Not protobuf prost decodes: prost refuses it and says why.
        let Ok(decoded) = decoded_bytes(schemas, self.request, message) else {
            return Ok(());
        };
        let decoded = usize::try_from(decoded).unwrap_or(usize::MAX);
        let limit = self.budget.limit();
        let read = if still_read { message.len() } else { 0 };
        if decoded.saturating_add(read) > limit {
            return Err(Status::resource_exhausted(format!(
                "the request message of {} bytes would hold about {decoded} bytes once \
                 decoded, more than the {limit} bytes of requests the sidecar holds at once \
                 (max_request_bytes_in_flight)",
                message.len()
            )));
        }
        // A unary call holds one request: the latest measured (a message
        // handed back to tonic's codec is measured again, not twice).
        self.budget.let_go(self.held.replace(0));
        if !self.budget.hold_decoded(decoded) {
            return Err(Status::resource_exhausted(format!(
                "the sidecar holds as many request bytes as it can at once ({limit} bytes \
                 across its connections): try again shortly"
            )));
        }
        if self.stream {
            self.budget.let_go(decoded);
        } else {
            self.held.set(decoded);
        }
        Ok(())
    }
}

impl Drop for CallCharge {
    fn drop(&mut self) {
        self.budget.let_go(self.held.get());
    }
}

/// Charges what `message` (one request message of the call being served,
/// without its prefix, to be decoded as `M`) holds decoded, before it is
/// decoded; outside a call, nothing is measured. `still_read`: the
/// message's bytes are still charged as a body being read.
pub(in crate::grpc) fn admit<M: 'static>(message: &[u8], still_read: bool) -> Result<(), Status> {
    CALL.try_with(|call| call.admit(message, TypeId::of::<M>(), still_read))
        .unwrap_or(Ok(()))
}

/// `future`, which reads the requests of the call being served from
/// another task (a request stream's reader), charged as the call is.
pub(in crate::grpc) fn carried<F: Future>(future: F) -> impl Future<Output = F::Output> {
    let charge = CALL
        .try_with(|call| {
            let charge = CallCharge::new(call.request, Arc::clone(&call.budget), true);
            charge.decodes.set(call.decodes.get());
            charge
        })
        .ok();
    match charge {
        Some(charge) => Either::Left(CALL.scope(charge, future)),
        None => Either::Right(future),
    }
}

/// Puts each call to a method of the protos in a charge of its own.
#[derive(Clone)]
pub(in crate::grpc) struct HoldDecodedLayer {
    budget: Arc<BodyBudget>,
}

impl HoldDecodedLayer {
    /// Calls' decoded requests charged to `budget`.
    pub(in crate::grpc) fn new(budget: Arc<BodyBudget>) -> Self {
        // Read the schemas now, not in the first call.
        Schemas::embedded();
        Self { budget }
    }
}

impl<S> tower_layer::Layer<S> for HoldDecodedLayer {
    type Service = HoldDecoded<S>;

    fn layer(&self, inner: S) -> HoldDecoded<S> {
        HoldDecoded {
            inner,
            budget: Arc::clone(&self.budget),
        }
    }
}

/// The gRPC services, each call in its charge.
#[derive(Clone)]
pub(in crate::grpc) struct HoldDecoded<S> {
    inner: S,
    budget: Arc<BodyBudget>,
}

impl<S> Service<Request<tonic::body::Body>> for HoldDecoded<S>
where
    S: Service<Request<tonic::body::Body>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Either<tokio::task::futures::TaskLocalFuture<CallCharge, S::Future>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<tonic::body::Body>) -> Self::Future {
        let path = request.uri().path();
        let Some(message) = Schemas::embedded().request_of(path) else {
            return Either::Right(self.inner.call(request));
        };
        let stream =
            <tonic::body::Body as CountedBody>::read_as(&Method::POST, path) == BodyRead::Messages;
        let charge = CallCharge::new(message, Arc::clone(&self.budget), stream);
        Either::Left(CALL.scope(charge, self.inner.call(request)))
    }
}

#[cfg(test)]
mod tests {
    use prost::Message as _;
    use tonic::Code;

    use super::*;
    use crate::grpc::proto::dapr::proto::common::v1 as common;
    use crate::grpc::proto::dapr::proto::runtime::v1 as dapr;

    const KIB: usize = 1024;

    fn save_request() -> MessageId {
        Schemas::embedded()
            .request_of("/dapr.proto.runtime.v1.Dapr/SaveState")
            .expect("served")
    }

    /// A save of one value of `bytes` bytes, encoded.
    fn save_of(bytes: usize) -> Vec<u8> {
        dapr::SaveStateRequest {
            store_name: "orders".into(),
            states: vec![common::StateItem {
                key: "k".into(),
                value: vec![7; bytes],
                ..Default::default()
            }],
        }
        .encode_to_vec()
    }

    /// 100,000 empty items: ~200 KB on the wire, ~10 MB decoded.
    fn empty_items() -> Vec<u8> {
        dapr::SaveStateRequest {
            store_name: "orders".into(),
            states: vec![common::StateItem::default(); 100_000],
        }
        .encode_to_vec()
    }

    fn save(message: &[u8]) -> Result<(), Status> {
        admit::<dapr::SaveStateRequest>(message, false)
    }

    #[tokio::test]
    async fn a_unary_call_holds_its_request_decoded_until_it_ends() {
        let budget = BodyBudget::new(1024 * KIB);
        let charge = CallCharge::new(save_request(), Arc::clone(&budget), false);
        CALL.scope(charge, async {
            save(&save_of(100 * KIB)).expect("fits");
            let one = budget.in_use();
            assert!((100 * KIB..160 * KIB).contains(&one), "{one}");
            // Measured again (handed back to tonic's codec): held once.
            save(&save_of(100 * KIB)).expect("fits");
            assert_eq!(budget.in_use(), one);
        })
        .await;
        assert_eq!(budget.in_use(), 0, "let go when the call ended");
    }

    #[tokio::test]
    async fn a_request_streams_messages_are_checked_and_not_held() {
        let budget = BodyBudget::new(1024 * KIB);
        let charge = CallCharge::new(save_request(), Arc::clone(&budget), true);
        CALL.scope(charge, async {
            for _ in 0..20 {
                save(&save_of(100 * KIB)).expect("fits");
            }
            assert_eq!(budget.in_use(), 0, "a quiet stream pins nothing");
            assert!(budget.hold_decoded(1000 * KIB));
            let refused = save(&save_of(100 * KIB)).expect_err("not free now");
            assert!(refused.message().contains("try again"), "{refused:?}");
            budget.let_go(1000 * KIB);
            let refused = save(&empty_items()).expect_err("could never fit");
            assert!(refused.message().contains("once decoded"), "{refused:?}");
        })
        .await;
        assert_eq!(budget.in_use(), 0);
    }

    #[tokio::test]
    async fn an_answer_decoded_in_the_call_is_not_taken_for_its_request() {
        let budget = BodyBudget::new(1024 * KIB);
        let charge = CallCharge::new(save_request(), Arc::clone(&budget), false);
        CALL.scope(charge, async {
            save(&save_of(KIB)).expect("fits");
            let held = budget.in_use();
            // An app's answer to a call the handler made, of another type,
            // which read as a save would hold more than the budget.
            admit::<dapr::GetStateResponse>(&empty_items(), false).expect("not measured");
            assert_eq!(budget.in_use(), held);
        })
        .await;
    }

    #[tokio::test]
    async fn a_message_that_could_never_fit_is_refused_naming_its_decoded_size() {
        let budget = BodyBudget::new(1024 * KIB);
        let empty_items = empty_items();
        assert!(empty_items.len() < 256 * KIB);
        let charge = CallCharge::new(save_request(), Arc::clone(&budget), false);
        let refused = CALL
            .scope(charge, async { save(&empty_items) })
            .await
            .expect_err("refused");
        assert_eq!(refused.code(), Code::ResourceExhausted);
        let message = refused.message();
        assert!(message.contains("once decoded"), "{message}");
        assert!(message.contains("max_request_bytes_in_flight"), "{message}");
        assert!(
            message.contains(&empty_items.len().to_string()),
            "{message}"
        );
        assert_eq!(budget.in_use(), 0);
    }

    #[tokio::test]
    async fn bytes_still_read_count_toward_what_could_fit() {
        // 600 KiB decoded fits 1 MiB alone, not beside its 600 KiB read.
        let budget = BodyBudget::new(1024 * KIB);
        let message = save_of(600 * KIB);
        let charge = CallCharge::new(save_request(), Arc::clone(&budget), false);
        CALL.scope(charge, async {
            save(&message).expect("its body was let go of");
            let refused = admit::<dapr::SaveStateRequest>(&message, true).expect_err("never fits");
            assert!(refused.message().contains("once decoded"), "{refused:?}");
        })
        .await;
    }

    #[tokio::test]
    async fn a_message_that_does_not_fit_now_may_be_retried() {
        let budget = BodyBudget::new(1024 * KIB);
        assert!(budget.hold_decoded(1000 * KIB));
        let charge = CallCharge::new(save_request(), Arc::clone(&budget), false);
        let refused = CALL
            .scope(charge, async { save(&save_of(100 * KIB)) })
            .await
            .expect_err("refused");
        assert_eq!(refused.code(), Code::ResourceExhausted);
        assert!(
            refused.message().contains("try again"),
            "{}",
            refused.message()
        );
        assert_eq!(budget.in_use(), 1000 * KIB);
        budget.let_go(1000 * KIB);
    }

    #[tokio::test]
    // The reader's handle is awaited outside the call.
    #[allow(clippy::async_yields_async)]
    async fn a_reader_in_another_task_is_checked_as_a_stream_of_its_call() {
        let budget = BodyBudget::new(1024 * KIB);
        let charge = CallCharge::new(save_request(), Arc::clone(&budget), false);
        let reader = CALL
            .scope(charge, async {
                tokio::spawn(carried(async {
                    let fits = save(&save_of(100 * KIB));
                    let never = save(&empty_items());
                    (fits, never)
                }))
            })
            .await;
        let (fits, never) = reader.await.expect("ran");
        fits.expect("fits");
        never.expect_err("could never fit");
        assert_eq!(budget.in_use(), 0);
        // Outside any call, nothing is measured or charged.
        save(&empty_items()).expect("not measured");
    }
}
