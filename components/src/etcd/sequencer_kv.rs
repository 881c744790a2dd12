//! What the `etcd` sequencer needs of etcd, and nothing more: read a
//! counter with its revision, and write it only if that revision is still
//! the key's (a transaction). The one file that knows the etcd client.

use rewire_etcd::pb::compare::{CompareResult, CompareTarget, TargetUnion};
use rewire_etcd::pb::{request_op, Compare, PutRequest, RequestOp, TxnRequest};
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

    /// The counter's value (0 when absent) and its `mod_revision` (0 when
    /// absent).
    pub async fn read(&self, key: &str) -> Result<(i64, i64), String> {
        let reply = self
            .client
            .get(key)
            .await
            .map_err(|err| self.settings.scrub(&err.to_string()))?;
        let Some(kv) = reply.kvs.first() else {
            return Ok((0, 0));
        };
        let text = std::str::from_utf8(&kv.value)
            .map_err(|_| format!("counter `{key}` does not hold text"))?;
        let value = text
            .parse::<i64>()
            .map_err(|_| format!("counter `{key}` holds `{text}`, not a number"))?;
        Ok((value, kv.mod_revision))
    }

    /// Writes `value` if the key's `mod_revision` is still `revision`;
    /// whether it did.
    pub async fn swap(&self, key: &str, revision: i64, value: i64) -> Result<bool, String> {
        let request = TxnRequest {
            compare: vec![Compare {
                result: CompareResult::Equal as i32,
                target: CompareTarget::Mod as i32,
                key: key.as_bytes().to_vec(),
                range_end: Vec::new(),
                target_union: Some(TargetUnion::ModRevision(revision)),
            }],
            success: vec![RequestOp {
                request: Some(request_op::Request::RequestPut(PutRequest {
                    key: key.as_bytes().to_vec(),
                    value: value.to_string().into_bytes(),
                    ..PutRequest::default()
                })),
            }],
            failure: Vec::new(),
        };
        let reply = self
            .client
            .txn(request)
            .await
            .map_err(|err| self.settings.scrub(&err.to_string()))?;
        Ok(reply.succeeded)
    }
}

/// The client's TLS options for `tls`.
fn tls_options(tls: &ClientTls) -> TlsOptions {
    TlsOptions {
        ca_pem: tls.ca_pem.clone(),
        identity: tls.identity.clone(),
        domain: None,
    }
}
