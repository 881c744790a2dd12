//! What the `etcd` sequencer needs of etcd, and nothing more: Layotto's
//! counter (put an empty value, the id is the key's `version`), and a read
//! of a counter in rewire's earlier layout (a decimal value). The one file
//! that knows the etcd client.

use rewire_etcd::pb::{request_op, response_op, PutRequest, RangeRequest, RequestOp, TxnRequest};
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

    /// Layotto's next id of the counter `key`: puts an empty value and
    /// replies the key's `version` (each put adds one), in one
    /// transaction.
    pub async fn bump(&self, key: &str) -> Result<i64, String> {
        bump(&self.client, key)
            .await
            .map_err(|err| self.settings.scrub(&err))
    }

    /// The next id of `key` above `floor`: bumps the counter until its
    /// version passes `floor` (versions passed on the way are skipped,
    /// never handed out), up to [`LIFT_PARALLEL`] puts at once and at most
    /// `max_puts` in all.
    pub async fn next_above(&self, key: &str, floor: i64, max_puts: u64) -> Result<i64, String> {
        let mut version = self.bump(key).await?;
        let mut puts = 1u64;
        while version <= floor {
            if puts >= max_puts {
                return Err(format!(
                    "counter `{key}` is at {version}: ids must go on above {floor} (`biggerThan`, \
                     ids handed out, or the counter in the earlier layout), which takes more than \
                     {max_puts} writes (an etcd counter's id is its key's version, one write \
                     each); see docs/components.md, \"etcd sequencer\""
                ));
            }
            let batch = u64::try_from(floor - version + 1)
                .unwrap_or(1)
                .min(LIFT_PARALLEL)
                .min(max_puts - puts);
            let mut writes = tokio::task::JoinSet::new();
            for _ in 0..batch {
                let (client, key) = (self.client.clone(), key.to_string());
                writes.spawn(async move { bump(&client, &key).await });
            }
            puts += batch;
            let mut best: Option<i64> = None;
            let mut highest = version;
            while let Some(done) = writes.join_next().await {
                let got = done
                    .map_err(|err| err.to_string())?
                    .map_err(|err| self.settings.scrub(&err))?;
                highest = highest.max(got);
                if got > floor {
                    best = Some(best.map_or(got, |best| best.min(got)));
                }
            }
            version = best.unwrap_or(highest);
        }
        Ok(version)
    }
}

/// Most puts [`EtcdCounters::next_above`] has in flight at once.
pub const LIFT_PARALLEL: u64 = 64;

/// Puts an empty `key` and reads it back in one transaction, as Layotto's
/// `GetNextId`: the key's version.
async fn bump(client: &Client, key: &str) -> Result<i64, String> {
    let request = TxnRequest {
        compare: Vec::new(),
        success: vec![
            RequestOp {
                request: Some(request_op::Request::RequestPut(PutRequest {
                    key: key.as_bytes().to_vec(),
                    ..PutRequest::default()
                })),
            },
            RequestOp {
                request: Some(request_op::Request::RequestRange(RangeRequest {
                    key: key.as_bytes().to_vec(),
                    ..RangeRequest::default()
                })),
            },
        ],
        failure: Vec::new(),
    };
    let reply = client.txn(request).await.map_err(|err| err.to_string())?;
    let version = reply.responses.get(1).and_then(|op| match &op.response {
        Some(response_op::Response::ResponseRange(range)) => range.kvs.first().map(|kv| kv.version),
        _ => None,
    });
    version.ok_or_else(|| format!("counter `{key}`: the transaction replied no key"))
}

/// The client's TLS options for `tls`.
fn tls_options(tls: &ClientTls) -> TlsOptions {
    TlsOptions {
        ca_pem: tls.ca_pem.clone(),
        identity: tls.identity.clone(),
        domain: None,
    }
}
