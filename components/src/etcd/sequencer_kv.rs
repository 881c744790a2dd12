//! What the `etcd` sequencer needs of etcd, and nothing more: Layotto's
//! counter (a put of an empty value, the id is the key's `version`), plus
//! rewire's offset for a counter that had to jump far (a decimal in a key
//! of its own, which Layotto never writes: the id is then offset +
//! version), and a read of a counter in rewire's earlier layout (a decimal
//! value). The one file that knows the etcd client.

use rewire_etcd::pb::compare::{CompareResult, CompareTarget, TargetUnion};
use rewire_etcd::pb::{
    request_op, response_op, Compare, PutRequest, RangeRequest, RequestOp, TxnRequest,
};
use rewire_etcd::{Client, ConnectOptions, TlsOptions};

use super::metadata::EtcdSettings;
use crate::tls::ClientTls;

/// The counters of a sequencer in etcd.
pub struct EtcdCounters {
    client: Client,
    settings: EtcdSettings,
}

impl std::fmt::Debug for EtcdCounters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdCounters")
            .field("endpoints", &self.settings.endpoints)
            .finish_non_exhaustive()
    }
}

impl EtcdCounters {
    /// Connects (logging in, when a user is set) within `dialTimeout` per
    /// member (see [`EtcdSettings::connect_limit`]); `dialTimeout` is also
    /// the limit on each request. With the store's credentials and TLS
    /// settings.
    pub async fn connect(settings: &EtcdSettings) -> Result<Self, String> {
        let options = ConnectOptions {
            connect_timeout: settings.dial,
            timeout: settings.dial,
            keep_alive: None,
            user: settings
                .credentials
                .as_ref()
                .map(|c| (c.username.clone(), c.password.clone())),
            tls: settings.tls.as_ref().map(tls_options),
        };
        let urls = settings.urls();
        let connect = Client::connect(&urls, options);
        let client = match tokio::time::timeout(settings.connect_limit(), connect).await {
            Ok(Ok(client)) => client,
            Ok(Err(err)) => return Err(settings.scrub(&err.to_string())),
            Err(_) => return Err(settings.connect_timed_out()),
        };
        let counters = Self {
            client,
            settings: settings.clone(),
        };
        // Under the prefix: a user whose role covers only `keyPrefix` may
        // read it.
        let probe = format!("{}sequencer-probe", settings.key_prefix);
        counters
            .client
            .get(probe)
            .await
            .map_err(|err| counters.settings.scrub(&err.to_string()))?;
        Ok(counters)
    }

    /// Connects anew with `tls` (a member must answer `Status` there), then
    /// makes every later call use the new channels; calls in flight finish
    /// on the old ones. On an error the channels in force stay.
    pub async fn replace_tls(&self, tls: &ClientTls) -> Result<(), String> {
        self.client
            .replace_tls(Some(tls_options(tls)))
            .await
            .map_err(|err| {
                let endpoints = self.settings.endpoints_text();
                self.settings.scrub(&format!("etcd at {endpoints}: {err}"))
            })
    }

    /// What a counter of rewire's earlier layout holds: its decimal value,
    /// `None` when absent or empty (Layotto's counters hold nothing). A
    /// key the user may not read counts as absent: the earlier layout's
    /// writer, with these credentials, could not have written it either.
    pub async fn read_old(&self, key: &str) -> Result<Option<i64>, String> {
        let reply = match self.client.get(key).await {
            Ok(reply) => reply,
            Err(err) if err.to_string().contains("permission denied") => {
                tracing::warn!(key, "The sequencer may not read this earlier-layout counter; it is taken as absent (ids go on from the new counter and `biggerThan`).");
                return Ok(None);
            }
            Err(err) => return Err(self.settings.scrub(&err.to_string())),
        };
        let Some(kv) = reply.kvs.first() else {
            return Ok(None);
        };
        if kv.value.is_empty() {
            return Ok(None);
        }
        let text = std::str::from_utf8(&kv.value)
            .map_err(|_| format!("counter `{key}` does not hold text"))?;
        text.parse::<i64>()
            .map(Some)
            .map_err(|_| format!("counter `{key}` holds `{text}`, not a number"))
    }

    async fn bumped(&self, key: &str) -> Result<Counter, String> {
        bump(&self.client, key)
            .await
            .map_err(|err| self.settings.scrub(&err))
    }

    /// The next id of `key` above `floor`. A counter behind `floor` (a
    /// `biggerThan`, the reservation of a `highWaterFile` after a restart,
    /// ids handed out on another cluster, a counter of the earlier layout)
    /// is put until it passes it when that takes at most [`MAX_LIFT_PUTS`]
    /// puts, so Layotto's sidecars can go on sharing it; further behind,
    /// it jumps in one write: its offset is set so that the next id is
    /// `floor + 1` (if no other client wrote meanwhile, else it is read
    /// again; at most [`MAX_JUMPS`] times), with a warning that Layotto's
    /// sidecars, which read only the version, must not share it any more.
    pub async fn next_above(&self, key: &str, floor: i64) -> Result<i64, String> {
        let mut counter = self.bumped(key).await?;
        for _ in 0..MAX_JUMPS {
            let id = counter.id(key).map_err(|err| self.settings.scrub(&err))?;
            if id > floor {
                return Ok(id);
            }
            let behind = u64::try_from(floor - id).unwrap_or(u64::MAX);
            if behind < MAX_LIFT_PUTS {
                return self.put_past(key, floor, id).await;
            }
            // The jump's own put makes the version one more: its id is
            // offset + version + 1 = floor + 1.
            let offset = floor
                .checked_sub(counter.version)
                .ok_or_else(|| format!("counter `{key}` cannot jump to {floor}"))?;
            counter = match jump(&self.client, key, counter, offset).await {
                Ok(Some(jumped)) => {
                    tracing::warn!(
                        counter = key,
                        from = id,
                        to = floor + 1,
                        "The sequencer's counter jumped to go on above the ids already handed out (or biggerThan): its ids are now an offset kept in `{}` plus the key's version, which Layotto's sidecars do not read; they must not share this counter any more.",
                        offset_key(key)
                    );
                    jumped
                }
                Ok(None) => self.bumped(key).await?,
                Err(err) => return Err(self.settings.scrub(&err)),
            };
        }
        Err(format!(
            "counter `{key}`: no id above {floor} after {MAX_JUMPS} tries (other clients \
             wrote it between each read and jump)"
        ))
    }

    /// Puts `key` until its id passes `floor` (it is at `id`), up to
    /// [`LIFT_PARALLEL`] puts at once; ids passed on the way are skipped,
    /// never handed out. The lowest id above `floor` it got.
    async fn put_past(&self, key: &str, floor: i64, mut id: i64) -> Result<i64, String> {
        let mut puts = 0u64;
        while id <= floor {
            if puts > MAX_LIFT_PUTS {
                return Err(format!(
                    "counter `{key}` is at {id} after {puts} puts: other clients keep it \
                     below {floor}"
                ));
            }
            let batch = u64::try_from(floor - id + 1)
                .unwrap_or(1)
                .min(LIFT_PARALLEL);
            let mut writes = tokio::task::JoinSet::new();
            for _ in 0..batch {
                let (client, key) = (self.client.clone(), key.to_string());
                writes.spawn(async move { bump(&client, &key).await });
            }
            puts += batch;
            let mut best: Option<i64> = None;
            let mut highest = id;
            while let Some(done) = writes.join_next().await {
                let counter = done
                    .map_err(|err| err.to_string())?
                    .map_err(|err| self.settings.scrub(&err))?;
                let got = counter.id(key)?;
                highest = highest.max(got);
                if got > floor {
                    best = Some(best.map_or(got, |best| best.min(got)));
                }
            }
            id = best.unwrap_or(highest);
        }
        Ok(id)
    }
}

/// Most puts [`EtcdCounters::next_above`] makes to lift a counter (more
/// behind than that, it jumps): a restart with a `highWaterFile` (whose
/// reservation runs up to 1,000 ids ahead) lifts by puts.
pub const MAX_LIFT_PUTS: u64 = 4_096;

/// Most puts [`EtcdCounters::next_above`] has in flight at once.
pub const LIFT_PARALLEL: u64 = 64;

/// Most times [`EtcdCounters::next_above`] tries to make a counter jump.
pub const MAX_JUMPS: usize = 16;

/// The key of counter `key`'s offset: beside it, under a name Layotto's
/// sidecars never write (theirs start `sequencer|||`).
fn offset_key(key: &str) -> String {
    match key.rfind("sequencer|||") {
        Some(at) => format!(
            "{}sequencer-offset{}",
            &key[..at],
            &key[at + "sequencer".len()..]
        ),
        None => format!("{key}|||offset"),
    }
}

/// A counter as a write left it.
#[derive(Debug, Clone, Copy)]
struct Counter {
    /// What ids start from: the decimal in its offset key (absent: 0).
    offset: i64,
    /// The key's version: one more each put.
    version: i64,
    /// The offset key's modification revision (0: absent), for a jump to
    /// check it is still the one read.
    offset_revision: i64,
}

impl Counter {
    fn id(self, key: &str) -> Result<i64, String> {
        self.offset
            .checked_add(self.version)
            .ok_or_else(|| format!("counter `{key}` has run out of ids"))
    }
}

/// A put of `key` (an empty value, as Layotto's), and the counter it
/// leaves with its offset, in one transaction.
async fn bump(client: &Client, key: &str) -> Result<Counter, String> {
    let request = TxnRequest {
        compare: Vec::new(),
        success: vec![
            put_op(key, Vec::new()),
            read_op(key),
            read_op(&offset_key(key)),
        ],
        failure: Vec::new(),
    };
    let reply = client.txn(request).await.map_err(|err| err.to_string())?;
    counter_of(key, &reply.responses)
}

/// Puts `key` and sets its offset to `offset`, if neither changed since
/// `read`; the counter it leaves (`None`: another client wrote first).
async fn jump(
    client: &Client,
    key: &str,
    read: Counter,
    offset: i64,
) -> Result<Option<Counter>, String> {
    let offset_key = offset_key(key);
    let unchanged = |key: &str, target: CompareTarget, value: TargetUnion| Compare {
        result: CompareResult::Equal as i32,
        target: target as i32,
        key: key.as_bytes().to_vec(),
        range_end: Vec::new(),
        target_union: Some(value),
    };
    let request = TxnRequest {
        compare: vec![
            unchanged(
                key,
                CompareTarget::Version,
                TargetUnion::Version(read.version),
            ),
            unchanged(
                &offset_key,
                CompareTarget::Mod,
                TargetUnion::ModRevision(read.offset_revision),
            ),
        ],
        success: vec![
            put_op(key, Vec::new()),
            read_op(key),
            read_op(&offset_key),
            put_op(&offset_key, offset.to_string().into_bytes()),
        ],
        failure: Vec::new(),
    };
    let reply = client.txn(request).await.map_err(|err| err.to_string())?;
    if !reply.succeeded {
        return Ok(None);
    }
    let counter = counter_of(key, &reply.responses)?;
    // The offset read in the transaction is the old one: the new one
    // stands from now on, written at the transaction's revision.
    let offset_revision = reply.header.map_or(0, |header| header.revision);
    Ok(Some(Counter {
        offset,
        offset_revision,
        ..counter
    }))
}

fn put_op(key: &str, value: Vec<u8>) -> RequestOp {
    RequestOp {
        request: Some(request_op::Request::RequestPut(PutRequest {
            key: key.as_bytes().to_vec(),
            value,
            ..PutRequest::default()
        })),
    }
}

fn read_op(key: &str) -> RequestOp {
    RequestOp {
        request: Some(request_op::Request::RequestRange(RangeRequest {
            key: key.as_bytes().to_vec(),
            ..RangeRequest::default()
        })),
    }
}

/// The counter the reads after a transaction's put found (the counter at
/// response 1, its offset key at response 2).
fn counter_of(key: &str, responses: &[rewire_etcd::pb::ResponseOp]) -> Result<Counter, String> {
    let read = |at: usize| {
        responses.get(at).and_then(|op| match &op.response {
            Some(response_op::Response::ResponseRange(range)) => Some(range.kvs.first()),
            _ => None,
        })
    };
    let kv = read(1)
        .flatten()
        .ok_or_else(|| format!("counter `{key}`: the transaction replied no key"))?;
    let (offset, offset_revision) = match read(2).flatten() {
        None => (0, 0),
        Some(kv) => {
            let offset = std::str::from_utf8(&kv.value)
                .ok()
                .and_then(|text| text.parse::<i64>().ok())
                .filter(|offset| *offset >= 0)
                .ok_or_else(|| {
                    format!(
                        "the offset of counter `{key}` (`{}`) is not a decimal number",
                        offset_key(key)
                    )
                })?;
            (offset, kv.mod_revision)
        }
    };
    Ok(Counter {
        offset,
        version: kv.version,
        offset_revision,
    })
}

/// The client's TLS options for `tls`.
fn tls_options(tls: &ClientTls) -> TlsOptions {
    TlsOptions {
        ca_pem: tls.ca_pem.clone(),
        identity: tls.identity.clone(),
        domain: None,
    }
}
