//! [`Reads`]: the reads of every store sharing one connection, made
//! together.
//!
//! A read is queued; one task takes everything queued, makes the distinct
//! ranges in one transaction per 128 of them, and answers each read with
//! its ranges. A transaction whose answer is too large to receive is made
//! again in halves, so that large values read together fail no read, and
//! a range too large on its own fails only the reads asking for it. Reads asked while a transaction is on its way wait for the
//! next one, so every answer is at least as new as etcd was when the read
//! was asked — as if each store had made its own request — while a
//! thousand stores re-reading the same key after a change cost etcd one
//! request, not a thousand.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use rewire_etcd::pb::{
    request_op, response_op, RangeRequest, RangeResponse, RequestOp, TxnRequest,
};
use rewire_etcd::Client;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::debug;

/// etcd's default limit on operations in one transaction (`--max-txn-ops`).
pub(crate) const MAX_TXN_OPS: usize = 128;
/// Most reads answered by one round of transactions.
const MAX_BATCH: usize = 4096;

/// The ranges of one read, in the order asked, or why one of them could
/// not be read (shared by every read that asked for it).
pub(crate) type ReadResult = Result<Vec<RangeResponse>, Arc<rewire_etcd::Error>>;

/// One range's answer, or why it could not be read.
type RangeAnswer = Result<RangeResponse, Arc<rewire_etcd::Error>>;

/// One queued read.
struct Queued {
    ranges: Vec<RangeRequest>,
    answer: oneshot::Sender<ReadResult>,
}

/// The queue of the task making the reads; cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct Reads {
    queue: mpsc::UnboundedSender<Queued>,
}

impl Reads {
    /// Starts the task reading through `client`; it ends when `stop` is
    /// cancelled.
    pub(crate) fn start(client: Client, stop: CancellationToken) -> (Self, JoinHandle<()>) {
        let (queue, queued) = mpsc::unbounded_channel();
        let task = tokio::spawn(run(client, queued, stop));
        (Self { queue }, task)
    }

    /// Reads `ranges` in the next round; `None` when the task has ended
    /// (the shared connection was closed): read directly then.
    pub(crate) async fn read(&self, ranges: Vec<RangeRequest>) -> Option<ReadResult> {
        let (answer, answered) = oneshot::channel();
        self.queue.send(Queued { ranges, answer }).ok()?;
        answered.await.ok()
    }
}

async fn run(client: Client, mut queued: mpsc::UnboundedReceiver<Queued>, stop: CancellationToken) {
    loop {
        let first = tokio::select! {
            () = stop.cancelled() => break,
            next = queued.recv() => match next {
                Some(first) => first,
                None => break,
            },
        };
        let mut round = vec![first];
        while round.len() < MAX_BATCH {
            match queued.try_recv() {
                Ok(more) => round.push(more),
                Err(_) => break,
            }
        }
        tokio::select! {
            () = stop.cancelled() => break,
            () = answer_round(&client, round) => {}
        }
    }
}

/// What tells two ranges apart, as the store asks them.
type RangeId = (Vec<u8>, Vec<u8>, i64, bool, bool);

fn id_of(range: &RangeRequest) -> RangeId {
    (
        range.key.clone(),
        range.range_end.clone(),
        range.limit,
        range.keys_only,
        range.count_only,
    )
}

/// Reads the distinct ranges of `round` and answers each read. Reads
/// whose callers gave up while queued (a bounded get, a closed store) are
/// left out: nobody would take their answers.
async fn answer_round(client: &Client, mut round: Vec<Queued>) {
    round.retain(|queued| !queued.answer.is_closed());
    if round.is_empty() {
        return;
    }
    let mut distinct: Vec<RangeRequest> = Vec::new();
    let mut index: HashMap<RangeId, usize> = HashMap::new();
    let wanted: Vec<Vec<usize>> = round
        .iter()
        .map(|queued| {
            queued
                .ranges
                .iter()
                .map(|range| {
                    *index.entry(id_of(range)).or_insert_with(|| {
                        distinct.push(range.clone());
                        distinct.len() - 1
                    })
                })
                .collect()
        })
        .collect();
    let answers = read_each(client, &distinct).await;
    for (queued, wanted) in round.into_iter().zip(wanted) {
        let mine: ReadResult = wanted
            .iter()
            .filter_map(|&i| answers.get(i).cloned())
            .collect();
        let _ = queued.answer.send(mine);
    }
}

/// Reads `ranges`, answers in the same order; fails with the first range
/// that could not be read.
pub(crate) async fn read_ranges(client: &Client, ranges: &[RangeRequest]) -> ReadResult {
    read_each(client, ranges).await.into_iter().collect()
}

/// Reads `ranges` in one transaction per [`MAX_TXN_OPS`] and answers each
/// range, in the same order.
///
/// A transaction whose answer is too large to receive (over the client's
/// `max_response_size`, or what the server sends) is made again as two
/// halves, down to single ranges: ranges whose answers add up past the
/// limit are still read, and a range too large on its own fails alone.
/// Any other error (no member answers, permission denied) fails every
/// range not read yet, without trying the rest: the next ones would fail
/// the same way, after as long a wait.
async fn read_each(client: &Client, ranges: &[RangeRequest]) -> Vec<RangeAnswer> {
    let mut answers: Vec<RangeAnswer> = vec![Ok(RangeResponse::default()); ranges.len()];
    // Spans still to read, the next one last.
    let mut spans: Vec<Range<usize>> = (0..ranges.len())
        .step_by(MAX_TXN_OPS)
        .map(|start| start..(start + MAX_TXN_OPS).min(ranges.len()))
        .rev()
        .collect();
    while let Some(span) = spans.pop() {
        match read_together(client, &ranges[span.clone()]).await {
            Ok(responses) => {
                for (answer, response) in answers[span].iter_mut().zip(responses) {
                    *answer = Ok(response);
                }
            }
            Err(err) if err.is_too_large() && span.len() > 1 => {
                let middle = span.start + span.len() / 2;
                debug!(ranges = span.len(), error = %err, "etcd read too large at once; reading it in halves.");
                spans.push(middle..span.end);
                spans.push(span.start..middle);
            }
            Err(err) if err.is_too_large() => answers[span.start] = Err(Arc::new(err)),
            Err(err) => {
                let err = Arc::new(err);
                for span in std::iter::once(span).chain(spans.drain(..)) {
                    for answer in &mut answers[span] {
                        *answer = Err(Arc::clone(&err));
                    }
                }
            }
        }
    }
    answers
}

/// Reads `ranges` in one request: a `Range` for one, a `Txn` for several
/// (at most [`MAX_TXN_OPS`]); answers in the same order.
async fn read_together(
    client: &Client,
    ranges: &[RangeRequest],
) -> Result<Vec<RangeResponse>, rewire_etcd::Error> {
    if let [range] = ranges {
        return Ok(vec![client.range(range.clone()).await?]);
    }
    let success = ranges
        .iter()
        .map(|range| RequestOp {
            request: Some(request_op::Request::RequestRange(range.clone())),
        })
        .collect();
    let request = TxnRequest {
        success,
        ..TxnRequest::default()
    };
    let response = client.txn(request).await?;
    let mut responses: Vec<RangeResponse> = response
        .responses
        .into_iter()
        .map(|op| match op.response {
            Some(response_op::Response::ResponseRange(got)) => got,
            _ => RangeResponse::default(),
        })
        .collect();
    responses.resize(ranges.len(), RangeResponse::default());
    Ok(responses)
}

#[cfg(test)]
mod tests {
    use super::{RangeRequest, Reads};
    use rewire_etcd::{Client, ConnectOptions};
    use testkit::etcd::EtcdServer;
    use tokio_util::sync::CancellationToken;

    /// The client's limit on an answer, in bytes.
    const LIMIT: usize = 1 << 20;

    fn range(key: &str) -> RangeRequest {
        RangeRequest {
            key: key.as_bytes().to_vec(),
            ..RangeRequest::default()
        }
    }

    #[tokio::test]
    async fn answers_too_large_together_are_read_in_parts_and_only_a_range_too_large_alone_fails() {
        let server = EtcdServer::start().await;
        // Three values that fit the limit one by one, not together, and
        // one over it.
        let small = "s".repeat(LIMIT / 2 + 1);
        for key in ["a", "b", "c"] {
            server.put(key, &small).await;
        }
        server.put("big", &"b".repeat(LIMIT + 1)).await;
        let options = ConnectOptions {
            max_response_size: LIMIT,
            ..ConnectOptions::default()
        };
        let client = Client::connect(&[server.url()], options)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let stop = CancellationToken::new();
        let (reads, _task) = Reads::start(client, stop.clone());

        // Asked together: one round.
        let (a, b, c, big, a_and_big) = tokio::join!(
            reads.read(vec![range("a")]),
            reads.read(vec![range("b")]),
            reads.read(vec![range("c")]),
            reads.read(vec![range("big")]),
            reads.read(vec![range("a"), range("big")]),
        );
        for (key, answer) in [("a", a), ("b", b), ("c", c)] {
            let responses = answer
                .expect("the read task runs")
                .unwrap_or_else(|e| panic!("read of {key}: {e}"));
            let kv = responses.first().and_then(|r| r.kvs.first());
            assert_eq!(kv.map(|kv| kv.value.len()), Some(small.len()), "{key}");
        }
        for (what, answer) in [("big", big), ("a and big", a_and_big)] {
            match answer.expect("the read task runs") {
                Err(err) => assert!(err.is_too_large(), "{what}: {err}"),
                Ok(_) => panic!("{what}: read over the limit"),
            }
        }
        stop.cancel();
    }

    /// The `Range` and `Txn` requests `server` has answered.
    async fn requests(server: &EtcdServer) -> (u64, u64) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let endpoint = server.endpoint();
        let mut stream = tokio::net::TcpStream::connect(&endpoint)
            .await
            .unwrap_or_else(|e| panic!("connect {endpoint}: {e}"));
        let request = format!("GET /metrics HTTP/1.0\r\nHost: {endpoint}\r\n\r\n");
        stream.write_all(request.as_bytes()).await.expect("write");
        let mut text = String::new();
        stream.read_to_string(&mut text).await.expect("read");
        let handled = |method: &str| {
            let method = format!("grpc_method=\"{method}\"");
            text.lines()
                .filter(|line| line.starts_with("grpc_server_handled_total{"))
                .filter(|line| line.contains(&method))
                .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
                .sum::<f64>() as u64
        };
        (handled("Range"), handled("Txn"))
    }

    #[tokio::test]
    async fn reads_given_up_while_queued_are_not_asked_for() {
        let server = EtcdServer::start().await;
        let client = Client::connect(&[server.url()], ConnectOptions::default())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let stop = CancellationToken::new();
        let (reads, _task) = Reads::start(client, stop.clone());
        let (ranges_before, txns_before) = requests(&server).await;

        // Queued, then dropped before the read task runs (this test's
        // runtime has one thread, and nothing here yields to it).
        for key in ["gone-1", "gone-2"] {
            let read = reads.read(vec![range(key)]);
            tokio::select! {
                biased;
                _ = read => panic!("{key}: answered before the read task ran"),
                () = std::future::ready(()) => {}
            }
        }
        reads
            .read(vec![range("live")])
            .await
            .expect("the read task runs")
            .unwrap_or_else(|e| panic!("read of live: {e}"));

        let (ranges, txns) = requests(&server).await;
        assert_eq!(
            (ranges - ranges_before, txns - txns_before),
            (1, 0),
            "(Range, Txn) requests for one read still wanted"
        );
        stop.cancel();
    }
}
