//! [`Reads`]: the reads of every store sharing one connection, made
//! together.
//!
//! A read is queued; one task takes everything queued, makes the distinct
//! ranges in one transaction per 128 of them, and answers each read with
//! its ranges. Reads asked while a transaction is on its way wait for the
//! next one, so every answer is at least as new as etcd was when the read
//! was asked — as if each store had made its own request — while a
//! thousand stores re-reading the same key after a change cost etcd one
//! request, not a thousand.

use std::collections::HashMap;
use std::sync::Arc;

use rewire_etcd::pb::{
    request_op, response_op, RangeRequest, RangeResponse, RequestOp, TxnRequest,
};
use rewire_etcd::Client;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// etcd's default limit on operations in one transaction (`--max-txn-ops`).
pub(crate) const MAX_TXN_OPS: usize = 128;
/// Most reads answered by one round of transactions.
const MAX_BATCH: usize = 4096;

/// The ranges of one read, in the order asked, or why they could not be
/// read (shared by every read of the failed round).
pub(crate) type ReadResult = Result<Vec<RangeResponse>, Arc<rewire_etcd::Error>>;

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

/// Reads the distinct ranges of `round` and answers each read.
async fn answer_round(client: &Client, round: Vec<Queued>) {
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
    match read_ranges(client, &distinct).await {
        Ok(responses) => {
            for (queued, wanted) in round.into_iter().zip(wanted) {
                let mine = wanted
                    .iter()
                    .filter_map(|&i| responses.get(i).cloned())
                    .collect();
                let _ = queued.answer.send(Ok(mine));
            }
        }
        Err(err) => {
            let err = Arc::new(err);
            for queued in round {
                let _ = queued.answer.send(Err(Arc::clone(&err)));
            }
        }
    }
}

/// Reads `ranges` (in one transaction per [`MAX_TXN_OPS`]), answers in
/// the same order.
pub(crate) async fn read_ranges(
    client: &Client,
    ranges: &[RangeRequest],
) -> Result<Vec<RangeResponse>, rewire_etcd::Error> {
    if let [range] = ranges {
        return Ok(vec![client.range(range.clone()).await?]);
    }
    let mut responses = Vec::with_capacity(ranges.len());
    for chunk in ranges.chunks(MAX_TXN_OPS) {
        let success = chunk
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
        responses.extend(response.responses.into_iter().map(|op| match op.response {
            Some(response_op::Response::ResponseRange(got)) => got,
            _ => RangeResponse::default(),
        }));
    }
    Ok(responses)
}
