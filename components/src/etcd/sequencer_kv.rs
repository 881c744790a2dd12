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

/// Why a counter gave no id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CounterError {
    /// Its next id would pass `i64::MAX`: the sequence is exhausted.
    RunOut(String),
    /// etcd failed, or the counter is not as rewire keeps it.
    Failed(String),
}

impl From<String> for CounterError {
    fn from(message: String) -> Self {
        Self::Failed(message)
    }
}

impl std::fmt::Display for CounterError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::RunOut(message) | Self::Failed(message) => f.write_str(message),
        }
    }
}

/// The channels [`EtcdCounters::replace_tls`] swapped in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NewChannels {
    /// Their generation (see [`EtcdCounters::channels`]).
    pub generation: u64,
    /// The id of the cluster that answered on them (0: not told).
    pub cluster: u64,
}

/// The counters of a sequencer in etcd.
pub struct EtcdCounters {
    client: Client,
    settings: EtcdSettings,
    /// The cluster's id, as its members answer it (0: not told).
    cluster: u64,
    /// One lift at a time per counter (striped by key): concurrent first
    /// requests after a restart wait for the first one's lift rather than
    /// each putting the counter past the floor (ids skipped, and puts, by
    /// the number of callers).
    lifts: [tokio::sync::Mutex<()>; LIFT_STRIPES],
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
        if let Some(tls) = &settings.tls {
            tls.preload_system_roots()
                .await
                .map_err(|err| err.to_string())?;
        }
        let urls = settings.urls();
        let connect = Client::connect(&urls, connect_options(settings));
        let client = match tokio::time::timeout(settings.connect_limit(), connect).await {
            Ok(Ok(client)) => client,
            Ok(Err(err)) => return Err(settings.scrub(&err.to_string())),
            Err(_) => return Err(settings.connect_timed_out()),
        };
        // Under the prefix: a user whose role covers only `keyPrefix` may
        // read it.
        let probe = format!("{}sequencer-probe", settings.key_prefix);
        let answer = client
            .get(probe)
            .await
            .map_err(|err| settings.scrub(&err.to_string()))?;
        let cluster = answer.header.map_or(0, |header| header.cluster_id);
        let counters = Self {
            client,
            settings: settings.clone(),
            cluster,
            lifts: std::array::from_fn(|_| tokio::sync::Mutex::new(())),
        };
        Ok(counters)
    }

    /// The id of the cluster the counters are on (0: not told).
    pub fn cluster(&self) -> u64 {
        self.cluster
    }

    /// Connects anew with `tls` (a member must answer `Status` there), then
    /// makes every later call use the new channels; calls in flight finish
    /// on the old ones. On an error the channels in force stay. Which
    /// channels are now in force, and the cluster that answered on them.
    pub async fn replace_tls(&self, tls: &ClientTls) -> Result<NewChannels, String> {
        let status = self
            .client
            .replace_tls(Some(tls_options(tls)))
            .await
            .map_err(|err| {
                let endpoints = self.settings.endpoints_text();
                self.settings.scrub(&format!("etcd at {endpoints}: {err}"))
            })?;
        Ok(NewChannels {
            // Read before anything is awaited: the sequencer swaps one set
            // at a time, so these are the channels just swapped in.
            generation: self.client.channels_generation(),
            cluster: status.header.map_or(0, |header| header.cluster_id),
        })
    }

    /// Which channels calls go to now (see
    /// [`Client::channels_generation`]).
    pub fn channels(&self) -> u64 {
        self.client.channels_generation()
    }

    /// Whether counter `keys` has rewire's record beside it: rewire has
    /// handed out ids from it (the record is written before its first id),
    /// so the counters of the earlier layout were read then and are not
    /// read again (other clients may write those keys: a config store's
    /// `SaveConfiguration` without a key prefix writes `sequencer|||…`).
    pub async fn has_record(&self, keys: &CounterKeys) -> Result<bool, String> {
        let reply = self
            .client
            .get(keys.offset.as_str())
            .await
            .map_err(|err| self.settings.scrub(&err.to_string()))?;
        Ok(!reply.kvs.is_empty())
    }

    /// What a counter of rewire's earlier layout holds: its decimal value,
    /// `None` when absent or empty (Layotto's counters hold nothing). A
    /// key the user may not read counts as absent: the earlier layout's
    /// writer, with these credentials, could not have written it either.
    /// A value that is no decimal counts as absent too, with a warning:
    /// another client wrote it (a config store's item), and nothing there
    /// fails a request. (`quiet`: a key only looked at in case, not warned
    /// about.)
    pub async fn read_old(&self, key: &str, quiet: bool) -> Result<Option<i64>, String> {
        let reply = match self.client.get(key).await {
            Ok(reply) => reply,
            Err(err) if err.to_string().contains("permission denied") => {
                if quiet {
                    tracing::debug!(
                        key,
                        "An earlier-layout counter the sequencer may not read is taken as absent."
                    );
                } else {
                    tracing::warn!(key, "The sequencer may not read this earlier-layout counter; it is taken as absent (ids go on from the new counter and `biggerThan`).");
                }
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
        Ok(old_decimal(key, &kv.value, quiet))
    }

    /// Takes over an earlier-layout decimal at the counter's own key (with
    /// `keyPrefixPath: /ids/` and `keyPrefix: none` the counter key
    /// `/ids/sequencer|||orders` is the earlier key): in one transaction,
    /// only while rewire's record is absent and the key is as read, the
    /// decimal is replaced by an empty value (as Layotto's counter) and the
    /// record is written going on above it and above `earlier`, the
    /// highest value the earlier layout's other keys held (an offset such
    /// that that put's id is the higher of the two; none when the version
    /// is past it already). Called once those keys were read: once the
    /// record stands no request reads them again, so it must cover them
    /// (a request failing after the take-over, or one that finds the
    /// record while another is still reading them, goes on above them).
    /// A later reader so finds either the decimal or the record, never
    /// neither: a request that fails after the decimal is gone, or one
    /// that reads the key just after another request emptied it, still
    /// goes on above it. The decimal (the floor it sets), `None` when the
    /// record stands or the key holds no decimal (a value that is no
    /// number is taken as absent, with a warning).
    pub async fn take_over_counter_key(
        &self,
        keys: &CounterKeys,
        earlier: Option<i64>,
    ) -> Result<Option<i64>, String> {
        let key = &keys.counter;
        for _ in 0..MAX_JUMPS {
            let request = TxnRequest {
                compare: Vec::new(),
                success: vec![read_op(key), read_op(&keys.offset)],
                failure: Vec::new(),
            };
            let reply = self
                .client
                .txn(request)
                .await
                .map_err(|err| self.settings.scrub(&err.to_string()))?;
            let read = |at: usize| {
                reply.responses.get(at).and_then(|op| match &op.response {
                    Some(response_op::Response::ResponseRange(range)) => range.kvs.first(),
                    _ => None,
                })
            };
            if read(1).is_some() {
                // Rewire's record stands: it holds whatever was there.
                return Ok(None);
            }
            let Some(kv) = read(0).filter(|kv| !kv.value.is_empty()) else {
                return Ok(None);
            };
            let Some(value) = old_decimal(key, &kv.value, false) else {
                return Ok(None);
            };
            let above = earlier.map_or(value, |earlier| earlier.max(value));
            // The put below makes the version one more; its id is then
            // `above` (never handed out: the next one is above it).
            let offset = above.saturating_sub(kv.version.saturating_add(1)).max(0);
            let record = format!("{offset}@{}", kv.create_revision);
            let request = TxnRequest {
                compare: vec![
                    unchanged(
                        &keys.offset,
                        CompareTarget::Mod,
                        TargetUnion::ModRevision(0),
                    ),
                    unchanged(
                        key,
                        CompareTarget::Mod,
                        TargetUnion::ModRevision(kv.mod_revision),
                    ),
                ],
                success: vec![
                    put_op(key, Vec::new()),
                    put_op(&keys.offset, record.into_bytes()),
                ],
                failure: Vec::new(),
            };
            let reply = self
                .client
                .txn(request)
                .await
                .map_err(|err| self.settings.scrub(&err.to_string()))?;
            if reply.succeeded {
                if offset > 0 {
                    tracing::warn!(
                        counter = %key,
                        to = above.saturating_add(1),
                        "The sequencer's counter took over the earlier layout's value at its key and jumped above it: its ids are now an offset kept in `{}` plus the key's version, which Layotto's sidecars do not read; they must not share this counter any more.",
                        keys.offset
                    );
                }
                return Ok(Some(value));
            }
            // Another request took it over, or another client wrote the
            // key meanwhile: read again.
        }
        Err(format!(
            "counter `{key}`: the earlier layout's value there was not taken over after \
             {MAX_JUMPS} tries (other clients kept changing it)"
        ))
    }

    async fn bumped(&self, keys: &CounterKeys) -> Result<Counter, String> {
        bump(&self.client, keys)
            .await
            .map_err(|err| self.settings.scrub(&err))
    }

    /// The next id of counter `keys` above `floor`. A counter behind
    /// `floor` (a `biggerThan`, the reservation of a `highWaterFile` after
    /// a restart, ids handed out on another cluster, a counter of the
    /// earlier layout, a counter deleted and made again) is put until it
    /// passes it when that takes fewer than [`MAX_LIFT_PUTS`] puts, so
    /// Layotto's sidecars can go on sharing it; further behind, it jumps in
    /// one write: its offset is set so that the next id is `floor + 1` (if
    /// no other client changed the offset meanwhile, else it is read again;
    /// at most [`MAX_JUMPS`] times), with a warning that Layotto's sidecars,
    /// which read only the version, must not share it any more.
    ///
    /// Also which channels made every write of it (see
    /// [`channels`](Self::channels)); `None` when new ones were swapped in
    /// meanwhile: the id may then come from either set (after a TLS swap
    /// the new channels may reach another cluster).
    ///
    /// [`CounterError::RunOut`] when the next id would pass `i64::MAX`
    /// (`floor` is `i64::MAX`, or the counter's offset plus its version
    /// overflows).
    pub async fn next_above(
        &self,
        keys: &CounterKeys,
        floor: i64,
    ) -> Result<(i64, Option<u64>), CounterError> {
        let before = self.channels();
        let id = self.next_above_on_any(keys, floor).await?;
        let after = self.channels();
        Ok((id, (before == after).then_some(before)))
    }

    /// [`next_above`](Self::next_above) on whatever channels are in force
    /// at each write.
    async fn next_above_on_any(&self, keys: &CounterKeys, floor: i64) -> Result<i64, CounterError> {
        let key = &keys.counter;
        if floor == i64::MAX {
            // No id lies above it: not a put, nor a jump past the end.
            return Err(run_out(key));
        }
        let mut counter = self.bumped(keys).await?;
        let mut lifting = None;
        for _ in 0..MAX_JUMPS {
            let floor = floor.max(counter.recreated_floor(keys)?);
            if floor == i64::MAX {
                return Err(run_out(key));
            }
            let id = counter.id(key)?;
            if id <= floor {
                if lifting.is_none() {
                    let stripe = &self.lifts[lift_stripe(key)];
                    match stripe.try_lock() {
                        Ok(guard) => lifting = Some(guard),
                        Err(_) => {
                            // Another request lifts it: the counter is
                            // read again (bumped) once it is done, without
                            // holding the lock (waiters do not then take
                            // their ids one at a time).
                            drop(stripe.lock().await);
                            counter = self.bumped(keys).await?;
                            continue;
                        }
                    }
                }
                let behind = u64::try_from(floor - id).unwrap_or(u64::MAX);
                if behind < MAX_LIFT_PUTS {
                    counter = match self.put_past(keys, floor, counter).await? {
                        Some(lifted) => lifted,
                        // The counter was made again meanwhile: its floor
                        // is worked out anew.
                        None => self.bumped(keys).await?,
                    };
                    continue;
                }
                counter = self.jump(keys, counter, floor, id).await?;
                continue;
            }
            if counter.created_at.is_none() {
                // The counter's birth is marked before any id of it is
                // handed out, so that a deletion and a new counter at its
                // key are noticed (above); a counter made again meanwhile
                // (or marked by another client) is bumped again.
                let marked = mark(&self.client, keys, counter)
                    .await
                    .map_err(|err| self.settings.scrub(&err))?;
                if !marked {
                    counter = self.bumped(keys).await?;
                    continue;
                }
            }
            return Ok(id);
        }
        Err(CounterError::Failed(format!(
            "counter `{key}`: no id above {floor} after {MAX_JUMPS} tries (other clients \
             kept changing it)"
        )))
    }

    /// Makes counter `keys`, read as `counter` at `id`, jump to `floor + 1`
    /// (see [`EtcdCounters::next_above`]); the counter it leaves, or as
    /// read again when another client changed its record or made it again.
    async fn jump(
        &self,
        keys: &CounterKeys,
        counter: Counter,
        floor: i64,
        id: i64,
    ) -> Result<Counter, String> {
        let key = &keys.counter;
        // The jump's own put makes the version one more: its id is
        // offset + version + 1 = floor + 1.
        let offset = floor
            .checked_sub(counter.version)
            .ok_or_else(|| format!("counter `{key}` cannot jump to {floor}"))?;
        match jump(&self.client, keys, counter, offset).await {
            Ok(Some(jumped)) => {
                tracing::warn!(
                    counter = %key,
                    from = id,
                    to = floor + 1,
                    "The sequencer's counter jumped to go on above the ids already handed out (or biggerThan): its ids are now an offset kept in `{}` plus the key's version, which Layotto's sidecars do not read; they must not share this counter any more.",
                    keys.offset
                );
                Ok(jumped)
            }
            Ok(None) => self.bumped(keys).await,
            Err(err) => Err(self.settings.scrub(&err)),
        }
    }

    /// Puts counter `keys` (read as `from`) until its id passes `floor`,
    /// up to [`LIFT_PARALLEL`] puts at once; ids passed on the way are
    /// skipped, never handed out. The put with the lowest id above `floor`
    /// (and above its own counter's [`Counter::recreated_floor`]); `None`
    /// when the counter was deleted and made again meanwhile.
    async fn put_past(
        &self,
        keys: &CounterKeys,
        floor: i64,
        from: Counter,
    ) -> Result<Option<Counter>, CounterError> {
        let mut id = from.id(&keys.counter)?;
        let mut puts = 0u64;
        while id <= floor {
            if puts > MAX_LIFT_PUTS {
                return Err(CounterError::Failed(format!(
                    "counter `{}` is at {id} after {puts} puts: other clients keep it \
                     below {floor}",
                    keys.counter
                )));
            }
            let batch = u64::try_from(floor - id + 1)
                .unwrap_or(1)
                .min(LIFT_PARALLEL);
            let mut writes = tokio::task::JoinSet::new();
            for _ in 0..batch {
                let (client, keys) = (self.client.clone(), keys.clone());
                writes.spawn(async move { bump(&client, &keys).await });
            }
            puts += batch;
            let mut best: Option<Counter> = None;
            let mut made_again = false;
            while let Some(done) = writes.join_next().await {
                let counter = done
                    .map_err(|err| CounterError::Failed(err.to_string()))?
                    .map_err(|err| self.settings.scrub(&err))?;
                made_again |= counter.created != from.created;
                let got = counter.id(&keys.counter)?;
                id = id.max(got);
                let lowest = best.is_none_or(|best| best.version > counter.version);
                if got > floor && lowest {
                    best = Some(counter);
                }
            }
            if made_again {
                return Ok(None);
            }
            if let Some(best) = best {
                return Ok(Some(best));
            }
        }
        Ok(Some(from))
    }
}

/// Most puts [`EtcdCounters::next_above`] makes to lift a counter (more
/// behind than that, it jumps): a restart with a `highWaterFile` (whose
/// reservation runs up to about 2,000 ids ahead) lifts by puts.
pub const MAX_LIFT_PUTS: u64 = 4_096;

/// Most puts [`EtcdCounters::next_above`] has in flight at once.
pub const LIFT_PARALLEL: u64 = 64;

/// How many locks the lifts of a sequencer's counters share (a counter's
/// is picked by its key's hash).
const LIFT_STRIPES: usize = 32;

/// The lift lock of counter `key`.
fn lift_stripe(key: &str) -> usize {
    use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
    let hash = BuildHasherDefault::<DefaultHasher>::default().hash_one(key);
    usize::try_from(hash % LIFT_STRIPES as u64).unwrap_or(0)
}

/// Most times [`EtcdCounters::next_above`] tries to make a counter jump.
pub const MAX_JUMPS: usize = 16;

/// Where a counter lives: Layotto's key, and beside it the key of
/// rewire's record of it (`{offset}@{created}`: the offset its ids start
/// from, and the revision at which the counter it belongs to was made),
/// under a name Layotto's sidecars never write (theirs start
/// `sequencer|||`).
#[derive(Debug, Clone)]
pub struct CounterKeys {
    /// Layotto's counter key.
    pub counter: String,
    /// The key of rewire's record of it.
    pub offset: String,
}

impl CounterKeys {
    /// The keys of the counter at `path` + `modified` (Layotto's modified
    /// key, `sequencer|||…`).
    pub fn new(path: &str, modified: &str) -> Self {
        let rest = modified.strip_prefix("sequencer").unwrap_or(modified);
        Self {
            counter: format!("{path}{modified}"),
            offset: format!("{path}sequencer-offset{rest}"),
        }
    }
}

/// A counter as a write left it.
#[derive(Debug, Clone, Copy)]
struct Counter {
    /// What ids start from: the offset in rewire's record (none: 0).
    offset: i64,
    /// The key's version: one more each put.
    version: i64,
    /// The revision at which the counter key was made.
    created: i64,
    /// The revision rewire's record was made for (`None`: no record).
    created_at: Option<i64>,
    /// The record's modification revision (0: absent), for a jump to check
    /// it is still the one read.
    offset_revision: i64,
}

impl Counter {
    fn id(self, key: &str) -> Result<i64, CounterError> {
        self.offset
            .checked_add(self.version)
            .ok_or_else(|| run_out(key))
    }

    /// When the counter key was deleted and made again since rewire's
    /// record: the highest id it can have given before (a version counts
    /// puts, one a revision at most, so it never passes the revisions gone
    /// by since the record's counter was made); 0 otherwise. A record made
    /// after the counter it sits beside comes from another history (keys
    /// copied from another cluster): refused, as its ids cannot be bounded.
    fn recreated_floor(self, keys: &CounterKeys) -> Result<i64, String> {
        let Some(recorded) = self.created_at else {
            return Ok(0);
        };
        if recorded == self.created {
            return Ok(0);
        }
        if recorded > self.created {
            return Err(format!(
                "the record of counter `{}` (`{}`) says it was made at revision {recorded}, \
                 after the counter itself ({}): it comes from another cluster or history; \
                 set `biggerThan` of the key above the ids handed out there and delete the record",
                keys.counter, keys.offset, self.created
            ));
        }
        Ok(self
            .offset
            .saturating_add(self.created.saturating_sub(recorded)))
    }
}

/// The decimal an earlier-layout counter `key` holds in `value`; `None`
/// (with a warning, or quietly) when it is no number.
fn old_decimal(key: &str, value: &[u8], quiet: bool) -> Option<i64> {
    let text = String::from_utf8_lossy(value);
    let decimal = text.parse::<i64>().ok();
    if decimal.is_none() {
        let shown = cut_short(&text, SHOWN_VALUE_CHARS);
        if quiet {
            tracing::debug!(key, value = %shown, "An earlier-layout counter that holds no number is taken as absent.");
        } else {
            tracing::warn!(key, value = %shown, "An earlier-layout counter holds no number (another client wrote it); it is taken as absent.");
        }
    }
    decimal
}

/// The error of counter `key` whose next id would pass `i64::MAX`.
fn run_out(key: &str) -> CounterError {
    CounterError::RunOut(format!("counter `{key}` has run out of ids"))
}

/// A put of the counter (an empty value, as Layotto's), and the counter
/// it leaves with rewire's record, in one transaction.
async fn bump(client: &Client, keys: &CounterKeys) -> Result<Counter, String> {
    let request = TxnRequest {
        compare: Vec::new(),
        success: vec![
            put_op(&keys.counter, Vec::new()),
            read_op(&keys.counter),
            read_op(&keys.offset),
        ],
        failure: Vec::new(),
    };
    let reply = client.txn(request).await.map_err(|err| err.to_string())?;
    counter_of(keys, &reply.responses)
}

/// A comparison of one field of `key` with `value`.
fn unchanged(key: &str, target: CompareTarget, value: TargetUnion) -> Compare {
    Compare {
        result: CompareResult::Equal as i32,
        target: target as i32,
        key: key.as_bytes().to_vec(),
        range_end: Vec::new(),
        target_union: Some(value),
    }
}

/// Puts the counter and sets its offset to `offset`, if neither the
/// record nor the counter's birth changed since `read` (other puts may
/// have come between: any later version only makes the next id higher);
/// the counter it leaves (`None`: another client changed them first).
async fn jump(
    client: &Client,
    keys: &CounterKeys,
    read: Counter,
    offset: i64,
) -> Result<Option<Counter>, String> {
    let record = format!("{offset}@{}", read.created);
    let request = TxnRequest {
        compare: vec![
            unchanged(
                &keys.offset,
                CompareTarget::Mod,
                TargetUnion::ModRevision(read.offset_revision),
            ),
            unchanged(
                &keys.counter,
                CompareTarget::Create,
                TargetUnion::CreateRevision(read.created),
            ),
        ],
        success: vec![
            put_op(&keys.counter, Vec::new()),
            read_op(&keys.counter),
            read_op(&keys.offset),
            put_op(&keys.offset, record.into_bytes()),
        ],
        failure: Vec::new(),
    };
    let reply = client.txn(request).await.map_err(|err| err.to_string())?;
    if !reply.succeeded {
        return Ok(None);
    }
    let counter = counter_of(keys, &reply.responses)?;
    // The record read in the transaction is the old one: the new one
    // stands from now on, written at the transaction's revision.
    Ok(Some(Counter {
        offset,
        created_at: Some(read.created),
        offset_revision: reply.header.map_or(0, |header| header.revision),
        ..counter
    }))
}

/// Writes rewire's record of a counter that has none (offset 0), if it
/// still has none and is still the one `read` found; whether it did.
async fn mark(client: &Client, keys: &CounterKeys, read: Counter) -> Result<bool, String> {
    let request = TxnRequest {
        compare: vec![
            unchanged(
                &keys.offset,
                CompareTarget::Mod,
                TargetUnion::ModRevision(0),
            ),
            unchanged(
                &keys.counter,
                CompareTarget::Create,
                TargetUnion::CreateRevision(read.created),
            ),
        ],
        success: vec![put_op(
            &keys.offset,
            format!("{}@{}", read.offset, read.created).into_bytes(),
        )],
        failure: Vec::new(),
    };
    let reply = client.txn(request).await.map_err(|err| err.to_string())?;
    Ok(reply.succeeded)
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
/// response 1, rewire's record at response 2).
fn counter_of(
    keys: &CounterKeys,
    responses: &[rewire_etcd::pb::ResponseOp],
) -> Result<Counter, String> {
    let read = |at: usize| {
        responses.get(at).and_then(|op| match &op.response {
            Some(response_op::Response::ResponseRange(range)) => range.kvs.first(),
            _ => None,
        })
    };
    let key = &keys.counter;
    let kv = read(1).ok_or_else(|| format!("counter `{key}`: the transaction replied no key"))?;
    let (offset, created_at, offset_revision) = match read(2) {
        None => (0, None, 0),
        Some(record) => {
            let (offset, created_at) = parse_record(&record.value).ok_or_else(|| {
                format!(
                    "the record of counter `{key}` (`{}`) is not `offset@revision`",
                    keys.offset
                )
            })?;
            (offset, Some(created_at), record.mod_revision)
        }
    };
    Ok(Counter {
        offset,
        version: kv.version,
        created: kv.create_revision,
        created_at,
        offset_revision,
    })
}

/// `{offset}@{created}`, both decimals, the offset not negative.
fn parse_record(value: &[u8]) -> Option<(i64, i64)> {
    let text = std::str::from_utf8(value).ok()?;
    let (offset, created) = text.split_once('@')?;
    let offset = offset.parse::<i64>().ok().filter(|offset| *offset >= 0)?;
    let created = created.parse::<i64>().ok().filter(|created| *created > 0)?;
    Some((offset, created))
}

/// Largest answer the sequencer's client accepts: it reads only empty
/// counters, offset records and earlier-layout decimals (etcd's default
/// request limit is 1.5 MiB, so a value past that is not a counter).
pub const MAX_ANSWER_BYTES: usize = 4 * 1024 * 1024;

/// Characters of a value quoted in an error.
const SHOWN_VALUE_CHARS: usize = 64;

/// The sequencer's client options for `settings`: `dialTimeout` for
/// connecting and for each call, the store's credentials and TLS, and
/// answers of at most [`MAX_ANSWER_BYTES`].
fn connect_options(settings: &EtcdSettings) -> ConnectOptions {
    ConnectOptions {
        connect_timeout: settings.dial,
        timeout: settings.dial,
        keep_alive: None,
        user: settings
            .credentials
            .as_ref()
            .map(|c| (c.username.clone(), c.password.clone())),
        tls: settings.tls.as_ref().map(tls_options),
        max_response_size: MAX_ANSWER_BYTES,
        max_response_size_setting: None,
    }
}

/// The first `chars` characters of `text`, `…` marking a cut (with the
/// whole length in bytes).
fn cut_short(text: &str, chars: usize) -> String {
    match text.char_indices().nth(chars) {
        Some((cut, _)) => format!("{}… ({} bytes)", &text[..cut], text.len()),
        None => text.to_string(),
    }
}

/// The client's TLS options for `tls`.
fn tls_options(tls: &ClientTls) -> TlsOptions {
    TlsOptions {
        ca_pem: tls.roots_pem(),
        identity: tls.identity.clone(),
        domain: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sequencer's client takes answers of at most 4 MiB (it reads
    /// empty counters and short records), not the config store's
    /// `maxResponseBytes`.
    #[test]
    fn answers_are_bounded_to_a_few_mib() {
        let settings = EtcdSettings {
            endpoints: vec!["127.0.0.1:2379".into()],
            key_prefix: "/layotto/".into(),
            credentials: None,
            dial: std::time::Duration::from_secs(5),
            watch_retry: std::time::Duration::from_secs(1),
            tls: None,
            tls_fields: None,
            max_response_bytes: 1 << 30,
        };
        let options = connect_options(&settings);
        assert_eq!(options.max_response_size, 4 * 1024 * 1024);
    }

    /// A long value is quoted by its first characters (cut on a character
    /// boundary) and its length.
    #[test]
    fn long_values_are_cut_short() {
        let long = "é".repeat(1000);
        let shown = cut_short(&long, 64);
        assert_eq!(shown, format!("{}… (2000 bytes)", "é".repeat(64)));
        assert_eq!(cut_short("short", 64), "short");
    }
}
