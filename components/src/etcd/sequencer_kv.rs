//! What the `etcd` sequencer needs of etcd, and nothing more: Layotto's
//! counter (a put, the id is the key's `version`) with rewire's offset (a
//! decimal value, when a counter had to jump: the id is then offset +
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
            Err(err) if err.to_string().contains("permission denied") => return Ok(None),
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

    /// A put of the counter `key` that keeps its value (see [`Counter`]).
    async fn bumped(&self, key: &str) -> Result<Counter, String> {
        bump(&self.client, key)
            .await
            .map_err(|err| self.settings.scrub(&err))
    }

    /// The next id of `key` above `floor`. A counter behind `floor` (a
    /// `biggerThan`, ids handed out on another cluster, a counter of the
    /// earlier layout) jumps in one write: its offset is set so that the
    /// next id is `floor + 1`, if no other client bumped it meanwhile (else
    /// it is read again; at most [`MAX_JUMPS`] times).
    pub async fn next_above(&self, key: &str, floor: i64) -> Result<i64, String> {
        let mut counter = self.bumped(key).await?;
        for _ in 0..MAX_JUMPS {
            let id = counter.id(key).map_err(|err| self.settings.scrub(&err))?;
            if id > floor {
                return Ok(id);
            }
            // The jump's own put makes the version one more: its id is
            // offset + version + 1 = floor + 1.
            let offset = floor
                .checked_sub(counter.version)
                .ok_or_else(|| format!("counter `{key}` cannot jump to {floor}"))?;
            counter = match jump(&self.client, key, counter.version, offset).await {
                Ok(Some(jumped)) => jumped,
                Ok(None) => self.bumped(key).await?,
                Err(err) => return Err(self.settings.scrub(&err)),
            };
        }
        Err(format!(
            "counter `{key}`: no id above {floor} after {MAX_JUMPS} tries (other clients \
             bumped it between each read and jump)"
        ))
    }
}

/// Most times [`EtcdCounters::next_above`] tries to make a counter jump.
pub const MAX_JUMPS: usize = 16;

/// A counter as a write left it.
#[derive(Debug, Clone, Copy)]
struct Counter {
    /// What ids start from: its value as a decimal (empty, as Layotto
    /// writes it: 0).
    offset: i64,
    /// The key's version: one more each write.
    version: i64,
}

impl Counter {
    fn id(self, key: &str) -> Result<i64, String> {
        self.offset
            .checked_add(self.version)
            .ok_or_else(|| format!("counter `{key}` has run out of ids"))
    }
}

/// A put of `key` that keeps its value (an empty value for a new key, as
/// Layotto's), and the counter it leaves, in one transaction.
async fn bump(client: &Client, key: &str) -> Result<Counter, String> {
    let exists = Compare {
        result: CompareResult::Greater as i32,
        target: CompareTarget::Version as i32,
        key: key.as_bytes().to_vec(),
        range_end: Vec::new(),
        target_union: Some(TargetUnion::Version(0)),
    };
    let keep = PutRequest {
        key: key.as_bytes().to_vec(),
        ignore_value: true,
        ..PutRequest::default()
    };
    let create = PutRequest {
        key: key.as_bytes().to_vec(),
        ..PutRequest::default()
    };
    let request = TxnRequest {
        compare: vec![exists],
        success: vec![put_op(keep), read_op(key)],
        failure: vec![put_op(create), read_op(key)],
    };
    let reply = client.txn(request).await.map_err(|err| err.to_string())?;
    counter_of(key, &reply.responses)
}

/// Sets `key`'s offset to `offset` with a put, if its version is still
/// `version`; the counter it leaves (`None`: another client wrote first).
async fn jump(
    client: &Client,
    key: &str,
    version: i64,
    offset: i64,
) -> Result<Option<Counter>, String> {
    let unchanged = Compare {
        result: CompareResult::Equal as i32,
        target: CompareTarget::Version as i32,
        key: key.as_bytes().to_vec(),
        range_end: Vec::new(),
        target_union: Some(TargetUnion::Version(version)),
    };
    let put = PutRequest {
        key: key.as_bytes().to_vec(),
        value: offset.to_string().into_bytes(),
        ..PutRequest::default()
    };
    let request = TxnRequest {
        compare: vec![unchanged],
        success: vec![put_op(put), read_op(key)],
        failure: Vec::new(),
    };
    let reply = client.txn(request).await.map_err(|err| err.to_string())?;
    if !reply.succeeded {
        return Ok(None);
    }
    counter_of(key, &reply.responses).map(Some)
}

fn put_op(put: PutRequest) -> RequestOp {
    RequestOp {
        request: Some(request_op::Request::RequestPut(put)),
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

/// The counter the read after a transaction's put found.
fn counter_of(key: &str, responses: &[rewire_etcd::pb::ResponseOp]) -> Result<Counter, String> {
    let kv = responses.get(1).and_then(|op| match &op.response {
        Some(response_op::Response::ResponseRange(range)) => range.kvs.first(),
        _ => None,
    });
    let kv = kv.ok_or_else(|| format!("counter `{key}`: the transaction replied no key"))?;
    let offset = if kv.value.is_empty() {
        0
    } else {
        std::str::from_utf8(&kv.value)
            .ok()
            .and_then(|text| text.parse::<i64>().ok())
            .filter(|offset| *offset >= 0)
            .ok_or_else(|| {
                format!("counter `{key}` holds something other than an offset (a decimal number)")
            })?
    };
    Ok(Counter {
        offset,
        version: kv.version,
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
