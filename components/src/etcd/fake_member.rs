//! A fake etcd member for tests of the watch task: it serves `Watch` and
//! `Range` as a test scripts them, on a loopback port, and records what
//! it was asked. Messages are written and read by hand (this crate has no
//! protobuf codec): only the fields the watch task uses.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, Notify};
use tonic::codegen::tokio_stream::wrappers::ReceiverStream;
use tonic::codegen::tokio_stream::StreamExt;
use tonic::codegen::{http, BoxFuture, Bytes, Context, Poll, Service};
use tonic::server::NamedService;
use tonic::transport::server::TcpIncoming;

/// A key-value as the fake sends it: path, value, `mod_revision`.
pub(crate) type Kv = (&'static str, &'static str, i64);

/// What the fake does with one `Watch` call.
#[derive(Default)]
pub(crate) struct WatchPlan {
    /// Waited for before `responses` are sent, if set (progress requests
    /// are answered meanwhile).
    pub(crate) gate: Option<Arc<Notify>>,
    /// The responses sent once the create request arrived.
    pub(crate) responses: Vec<Vec<u8>>,
    /// Whether progress requests get an answer (at `answer_revision`).
    pub(crate) answers_progress: bool,
    /// The revision in those answers.
    pub(crate) answer_revision: i64,
    /// Whether a progress request is left unanswered while the watch's
    /// start revision is past `answer_revision` (etcd 3.6.2+,
    /// etcd-io/etcd#20229).
    pub(crate) defers_progress_before_start: bool,
    /// At most this many progress requests of the member are answered
    /// (none: all), then it goes silent (its apply loop stuck).
    pub(crate) answers_at_most: Option<usize>,
    /// Sent after the first answer to a progress request.
    pub(crate) after_progress: Vec<Vec<u8>>,
    /// Whether the stream ends once `responses` are sent.
    pub(crate) ends: bool,
}

/// Answers a `Range` at a revision (0: the current one) with the header
/// revision and the key-values.
pub(crate) type RangeAnswer = Box<dyn Fn(i64) -> (i64, Vec<Kv>) + Send + Sync>;

/// The fake member: its script and what it was asked.
pub(crate) struct FakeMember {
    /// One plan per `Watch` call, in order; once they are used up, a
    /// watch gets `created` at revision 1 and then silence.
    plans: Mutex<VecDeque<WatchPlan>>,
    range: RangeAnswer,
    /// The `start_revision` of each watch created.
    pub(crate) watches: Mutex<Vec<i64>>,
    /// The revision asked by each `Range` (0: the current one).
    pub(crate) ranges: Mutex<Vec<i64>>,
    /// Progress requests received.
    pub(crate) progress_requests: AtomicUsize,
    /// Progress requests answered.
    pub(crate) progress_answers: AtomicUsize,
    /// Watches created with `fragment` asked for.
    pub(crate) fragmented_watches: AtomicUsize,
}

impl FakeMember {
    /// A member following `plans`, answering ranges with `range`.
    pub(crate) fn new(plans: Vec<WatchPlan>, range: RangeAnswer) -> Arc<Self> {
        Arc::new(Self {
            plans: Mutex::new(plans.into()),
            range,
            watches: Mutex::default(),
            ranges: Mutex::default(),
            progress_requests: AtomicUsize::new(0),
            progress_answers: AtomicUsize::new(0),
            fragmented_watches: AtomicUsize::new(0),
        })
    }

    /// Serves the member on a free loopback port; returns its URL.
    pub(crate) fn serve(self: &Arc<Self>) -> String {
        let incoming = TcpIncoming::bind("127.0.0.1:0".parse().expect("address")).expect("bind");
        let address = incoming.local_addr().expect("local address");
        let router = tonic::transport::Server::builder()
            .add_service(Api::<false>(Arc::clone(self)))
            .add_service(Api::<true>(Arc::clone(self)));
        tokio::spawn(router.serve_with_incoming(incoming));
        format!("http://{address}")
    }

    fn next_plan(&self) -> WatchPlan {
        let mut plans = self.plans.lock().unwrap_or_else(|p| p.into_inner());
        plans.pop_front().unwrap_or_else(|| WatchPlan {
            responses: vec![created(1)],
            ..WatchPlan::default()
        })
    }

    /// Runs one `Watch` call: reads the requests from `requests`, answers
    /// on `responses` as the next plan says, until the client ends it.
    async fn watch(
        self: Arc<Self>,
        requests: tonic::body::Body,
        responses: mpsc::Sender<Result<Bytes, Infallible>>,
    ) {
        let plan = self.next_plan();
        let mut requests = GrpcMessages::new(requests);
        let Some(create) = requests.next().await else {
            return;
        };
        let create = field_bytes(&create, 1).unwrap_or_default();
        let start = field_varint(&create, 3).unwrap_or_default();
        self.watches
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(i64::try_from(start).unwrap_or_default());
        if field_varint(&create, 8) == Some(1) {
            self.fragmented_watches.fetch_add(1, Ordering::AcqRel);
        }
        let mut after_progress = plan.after_progress.clone();
        if let Some(gate) = &plan.gate {
            let opened = gate.notified();
            tokio::pin!(opened);
            loop {
                tokio::select! {
                    () = &mut opened => break,
                    request = requests.next() => {
                        let Some(request) = request else { return };
                        if !self.progress(&plan, &request, &mut after_progress, &responses).await {
                            return;
                        }
                    }
                }
            }
        }
        if !send(&responses, &plan.responses).await || plan.ends {
            return;
        }
        while let Some(request) = requests.next().await {
            if !self
                .progress(&plan, &request, &mut after_progress, &responses)
                .await
            {
                return;
            }
        }
    }

    /// Counts and answers `request` if it asks for progress (then sends
    /// `after_progress`, once); false once the client is gone.
    async fn progress(
        &self,
        plan: &WatchPlan,
        request: &[u8],
        after_progress: &mut Vec<Vec<u8>>,
        responses: &mpsc::Sender<Result<Bytes, Infallible>>,
    ) -> bool {
        if field_bytes(request, 3).is_none() {
            return true;
        }
        self.progress_requests.fetch_add(1, Ordering::AcqRel);
        if !plan.answers_progress {
            return true;
        }
        if let Some(most) = plan.answers_at_most {
            if self.progress_answers.load(Ordering::Acquire) >= most {
                return true;
            }
        }
        if plan.defers_progress_before_start {
            let start = self.watches.lock().unwrap().last().copied().unwrap_or(0);
            if start > plan.answer_revision {
                return true;
            }
        }
        self.progress_answers.fetch_add(1, Ordering::AcqRel);
        let answer = watch_response(plan.answer_revision, -1, false, &[]);
        send(responses, &[answer]).await && send(responses, &std::mem::take(after_progress)).await
    }

    /// Answers one `Range` request.
    fn range(&self, request: &[u8]) -> Vec<u8> {
        let revision = i64::try_from(field_varint(request, 4).unwrap_or_default()).unwrap_or(0);
        self.ranges
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(revision);
        let (header_revision, kvs) = (self.range)(revision);
        let mut out = Vec::new();
        put_bytes(&mut out, 1, &header(header_revision));
        for kv in &kvs {
            put_bytes(&mut out, 2, &key_value(kv));
        }
        put_varint(&mut out, 4, kvs.len() as u64);
        out
    }
}

/// The fake as gRPC service `etcdserverpb.Watch` (`WATCH`) or
/// `etcdserverpb.KV`.
#[derive(Clone)]
struct Api<const WATCH: bool>(Arc<FakeMember>);

impl NamedService for Api<false> {
    const NAME: &'static str = "etcdserverpb.KV";
}

impl NamedService for Api<true> {
    const NAME: &'static str = "etcdserverpb.Watch";
}

impl<const WATCH: bool> Service<http::Request<tonic::body::Body>> for Api<WATCH> {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let fake = Arc::clone(&self.0);
        Box::pin(async move {
            let path = request.uri().path().to_string();
            let (sender, receiver) = mpsc::channel(16);
            match path.as_str() {
                "/etcdserverpb.Watch/Watch" => {
                    tokio::spawn(fake.watch(request.into_body(), sender));
                }
                "/etcdserverpb.KV/Range" => {
                    let mut requests = GrpcMessages::new(request.into_body());
                    let range = requests.next().await.unwrap_or_default();
                    let _ = sender.send(Ok(frame(&fake.range(&range)))).await;
                }
                other => panic!("the fake etcd member does not serve {other}"),
            }
            let body = axum::body::Body::from_stream(ReceiverStream::new(receiver));
            // `grpc-status` in the headers: the client wants no trailers.
            Ok(http::Response::builder()
                .status(200)
                .header("content-type", "application/grpc")
                .header("grpc-status", "0")
                .body(tonic::body::Body::new(body))
                .expect("response"))
        })
    }
}

/// The messages of a gRPC request body.
struct GrpcMessages {
    data: axum::body::BodyDataStream,
    buffer: Vec<u8>,
}

impl GrpcMessages {
    fn new(body: tonic::body::Body) -> Self {
        Self {
            data: axum::body::Body::new(body).into_data_stream(),
            buffer: Vec::new(),
        }
    }

    /// The next message; `None` once the body ended or failed.
    async fn next(&mut self) -> Option<Vec<u8>> {
        loop {
            if self.buffer.len() >= 5 {
                let length = u32::from_be_bytes(self.buffer[1..5].try_into().ok()?) as usize;
                if self.buffer.len() >= 5 + length {
                    let message = self.buffer[5..5 + length].to_vec();
                    self.buffer.drain(..5 + length);
                    return Some(message);
                }
            }
            let chunk = self.data.next().await?.ok()?;
            self.buffer.extend_from_slice(&chunk);
        }
    }
}

/// Sends `messages`; false once the client is gone.
async fn send(responses: &mpsc::Sender<Result<Bytes, Infallible>>, messages: &[Vec<u8>]) -> bool {
    for message in messages {
        if responses.send(Ok(frame(message))).await.is_err() {
            return false;
        }
    }
    true
}

/// `message` framed for gRPC (not compressed).
fn frame(message: &[u8]) -> Bytes {
    let mut framed = vec![0];
    framed.extend_from_slice(&u32::try_from(message.len()).expect("size").to_be_bytes());
    framed.extend_from_slice(message);
    Bytes::from(framed)
}

/// A `WatchResponse` whose `created` is set, at `revision`.
pub(crate) fn created(revision: i64) -> Vec<u8> {
    watch_response(revision, 0, true, &[])
}

/// A `WatchResponse` at `revision` carrying a put of each of `puts`.
pub(crate) fn events(revision: i64, puts: &[Kv]) -> Vec<u8> {
    watch_response(revision, 0, false, puts)
}

/// A `WatchResponse` at `revision` carrying a put of each of `puts`, one
/// fragment of a response that more fragments complete (`fragment` set).
pub(crate) fn fragment(revision: i64, puts: &[Kv]) -> Vec<u8> {
    let mut out = watch_response(revision, 0, false, puts);
    put_varint(&mut out, 7, 1);
    out
}

fn watch_response(revision: i64, watch_id: i64, created: bool, puts: &[Kv]) -> Vec<u8> {
    let mut out = Vec::new();
    put_bytes(&mut out, 1, &header(revision));
    // Negative numbers are varints of their two's complement.
    put_varint(&mut out, 2, watch_id as u64);
    put_varint(&mut out, 3, u64::from(created));
    for kv in puts {
        let mut event = Vec::new();
        put_bytes(&mut event, 2, &key_value(kv));
        put_bytes(&mut out, 11, &event);
    }
    out
}

fn header(revision: i64) -> Vec<u8> {
    let mut out = Vec::new();
    put_varint(&mut out, 3, revision as u64);
    out
}

fn key_value((key, value, mod_revision): &Kv) -> Vec<u8> {
    let mut out = Vec::new();
    put_bytes(&mut out, 1, key.as_bytes());
    put_varint(&mut out, 3, *mod_revision as u64);
    put_bytes(&mut out, 5, value.as_bytes());
    out
}

fn varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// Field `field` as a varint, left out when 0 (as protobuf 3 does).
fn put_varint(out: &mut Vec<u8>, field: u64, value: u64) {
    if value != 0 {
        varint(out, field << 3);
        varint(out, value);
    }
}

fn put_bytes(out: &mut Vec<u8>, field: u64, bytes: &[u8]) {
    varint(out, field << 3 | 2);
    varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// The value of one field of a message.
enum Value {
    /// A varint.
    Varint(u64),
    /// The bytes of a length-delimited field.
    Bytes(Vec<u8>),
}

/// The fields of `message`, by number; `None` for one it cannot read.
fn fields(message: &[u8]) -> Option<Vec<(u64, Value)>> {
    let mut fields = Vec::new();
    let mut at = 0;
    let read_varint = |at: &mut usize| -> Option<u64> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = *message.get(*at)?;
            *at += 1;
            value |= u64::from(byte & 0x7f) << shift;
            if byte < 0x80 {
                return Some(value);
            }
        }
        None
    };
    while at < message.len() {
        let key = read_varint(&mut at)?;
        let value = match key & 7 {
            0 => Value::Varint(read_varint(&mut at)?),
            2 => {
                let length = usize::try_from(read_varint(&mut at)?).ok()?;
                let bytes = message.get(at..at + length)?.to_vec();
                at += length;
                Value::Bytes(bytes)
            }
            _ => return None,
        };
        fields.push((key >> 3, value));
    }
    Some(fields)
}

/// The varint field `field` of `message`, if present.
fn field_varint(message: &[u8], field: u64) -> Option<u64> {
    fields(message)?
        .into_iter()
        .find_map(|(number, value)| match value {
            Value::Varint(value) if number == field => Some(value),
            _ => None,
        })
}

/// The length-delimited field `field` of `message`, if present.
fn field_bytes(message: &[u8], field: u64) -> Option<Vec<u8>> {
    fields(message)?
        .into_iter()
        .find_map(|(number, value)| match value {
            Value::Bytes(bytes) if number == field => Some(bytes),
            _ => None,
        })
}
