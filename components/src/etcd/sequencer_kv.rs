//! What the `etcd` sequencer needs of etcd, and nothing more: read a
//! counter with its revision, and write it only if that revision is still
//! the key's (a transaction). The one file that knows the etcd client.

use etcd_client::{Client, Compare, CompareOp, ConnectOptions, Txn, TxnOp};

use super::metadata::EtcdSettings;

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
    /// Connects within `dialTimeout` (also the limit on each request).
    pub async fn connect(settings: &EtcdSettings) -> Result<Self, String> {
        let mut options = ConnectOptions::new()
            .with_timeout(settings.dial)
            .with_connect_timeout(settings.dial);
        if let Some(credentials) = &settings.credentials {
            options = options
                .with_user(&credentials.username, &credentials.password)
                .with_auto_token_refresh(true);
        }
        let connect = Client::connect(settings.urls(), Some(options));
        let client = match tokio::time::timeout(settings.dial, connect).await {
            Ok(Ok(client)) => client,
            Ok(Err(err)) => return Err(settings.scrub(&err.to_string())),
            Err(_) => return Err(format!("no answer within {:?}", settings.dial)),
        };
        let counters = Self {
            client,
            settings: settings.clone(),
        };
        counters.read("sequencer-probe").await?;
        Ok(counters)
    }

    /// The counter's value (0 when absent) and its `mod_revision` (0 when
    /// absent).
    pub async fn read(&self, key: &str) -> Result<(i64, i64), String> {
        let reply = self
            .client
            .kv_client()
            .get(key, None)
            .await
            .map_err(|err| self.settings.scrub(&err.to_string()))?;
        let Some(kv) = reply.kvs().first() else {
            return Ok((0, 0));
        };
        let text = kv.value_str().map_err(|err| err.to_string())?;
        let value = text
            .parse::<i64>()
            .map_err(|_| format!("counter `{key}` holds `{text}`, not a number"))?;
        Ok((value, kv.mod_revision()))
    }

    /// Writes `value` if the key's `mod_revision` is still `revision`;
    /// whether it did.
    pub async fn swap(&self, key: &str, revision: i64, value: i64) -> Result<bool, String> {
        let txn = Txn::new()
            .when([Compare::mod_revision(key, CompareOp::Equal, revision)])
            .and_then([TxnOp::put(key, value.to_string(), None)]);
        let reply = self
            .client
            .kv_client()
            .txn(txn)
            .await
            .map_err(|err| self.settings.scrub(&err.to_string()))?;
        Ok(reply.succeeded())
    }
}
