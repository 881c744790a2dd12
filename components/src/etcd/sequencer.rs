//! The `etcd` sequencer: a counter per key at
//! `{keyPrefix}sequencer|||{key}`, advanced by a transaction on its
//! revision (read, then write only if nobody wrote in between), so ids are
//! strictly increasing for every client of the cluster.
//!
//! A new cluster's counter may be behind the old one's: every new value
//! lies above the floor of [`crate::high_water`] (the largest id handed
//! out), and with `highWaterFile` a rebuilt sequencer — every metadata
//! change rebuilds it — starts above every id handed out.
//!
//! TLS: the config store's `caCert`, `clientCert` and `clientKey` (or an
//! `https://` endpoint). Files among them are followed while the
//! sequencer runs ([`crate::tls::follow_files`]): new material is tried on
//! new channels (`Status` must answer) and swapped into the client; a bad
//! file keeps the channels in force.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Weak};

use rewire_runtime::{
    Component, ComponentError, IdRange, InitContext, NextIdRequest, SegmentRequest, Sequencer,
    SequencerError,
};
use serde::Deserialize;
use tokio_util::sync::DropGuard;

use super::metadata::{EtcdMetadata, EtcdSettings};
use super::sequencer_kv::EtcdCounters;
use crate::high_water::{check_request, retry_floor, HighWater, Verdict, KEY_SEPARATOR};
use crate::redacted::redacted;
use crate::redis::duration::{deserialize_timeout, Timeout};

/// Most transactions one request tries before it fails (each failed one
/// lost to another client's write).
const MAX_ATTEMPTS: usize = 1_000;

/// Metadata of the `etcd` sequencer: the config store's connection fields,
/// and the sequencer's own.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EtcdSequencerMetadata {
    /// The servers, `host:port` comma-separated.
    pub endpoints: String,
    /// Prepended to every counter's key; default none.
    #[serde(default)]
    pub key_prefix: String,
    /// User name for etcd's authentication; empty: none.
    #[serde(default)]
    pub username: String,
    /// Password of `username`.
    #[serde(default)]
    pub password: String,
    /// How long connecting, and each request, may take; default 5 s.
    #[serde(default, deserialize_with = "deserialize_timeout")]
    pub dial_timeout: Option<Timeout>,
    /// TLS: the CA bundle that signs the servers' certificates (PEM text or
    /// a file path, relative to the configuration's folder); default: the
    /// system's roots. Implies TLS.
    #[serde(default)]
    pub ca_cert: String,
    /// TLS: a client certificate chain for etcd's `--client-cert-auth`
    /// (PEM text or a file path). Implies TLS.
    #[serde(default)]
    pub client_cert: String,
    /// TLS: the client certificate's private key (PEM text or file path).
    #[serde(default)]
    pub client_key: String,
    /// The file keeping the high-water marks (see [`crate::high_water`]).
    #[serde(default)]
    pub high_water_file: Option<String>,
    /// Per key, the value ids must start above (Layotto's `biggerThan`).
    #[serde(default)]
    pub bigger_than: BTreeMap<String, i64>,
}

impl fmt::Debug for EtcdSequencerMetadata {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdSequencerMetadata")
            .field(
                "endpoints",
                &crate::redacted::shown_addresses(&self.endpoints),
            )
            .field("key_prefix", &self.key_prefix)
            .field("username", &self.username)
            .field("password", &redacted(&self.password))
            .field("ca_cert", &crate::tls::PemSource::shown(&self.ca_cert))
            .field(
                "client_cert",
                &crate::tls::PemSource::shown(&self.client_cert),
            )
            .field(
                "client_key",
                &crate::tls::PemSource::shown(&self.client_key),
            )
            .field("high_water_file", &self.high_water_file)
            .finish_non_exhaustive()
    }
}

impl EtcdSequencerMetadata {
    fn connection(&self) -> EtcdMetadata {
        let mut metadata = EtcdMetadata::new(self.endpoints.clone());
        metadata.key_prefix = self.key_prefix.clone();
        metadata.username = self.username.clone();
        metadata.password = self.password.clone();
        metadata.dial_timeout = self.dial_timeout;
        metadata.ca_cert = self.ca_cert.clone();
        metadata.client_cert = self.client_cert.clone();
        metadata.client_key = self.client_key.clone();
        metadata
    }
}

/// A sequencer on etcd.
#[derive(rewire_runtime::Component, Debug)]
#[component(
    kind = "sequencer",
    type = "etcd",
    example = r#"{"endpoints": "127.0.0.1:2379", "keyPrefix": "/ids/", "highWaterFile": "sequencer-marks.json"}"#
)]
pub struct EtcdSequencer {
    #[metadata]
    metadata: EtcdSequencerMetadata,
    running: Option<(Arc<EtcdCounters>, HighWater)>,
    /// Stops following the TLS files when the sequencer goes.
    _follow: Option<DropGuard>,
}

impl EtcdSequencer {
    async fn next_range(&self, key: &str, size: u32) -> Result<IdRange, SequencerError> {
        check_request(key, size)?;
        let (counters, marks) = self
            .running
            .as_ref()
            .ok_or_else(|| SequencerError::Backend("the sequencer is not initialised".into()))?;
        let counter = format!("{}sequencer{KEY_SEPARATOR}{key}", self.metadata.key_prefix);
        let exhausted = || SequencerError::Exhausted(key.to_string());
        let mut floor = marks.floor(key).await?;
        let mut refused = 0;
        for _ in 0..MAX_ATTEMPTS {
            let (value, revision) = counters
                .read(&counter)
                .await
                .map_err(SequencerError::Backend)?;
            let from = value.max(floor).checked_add(1).ok_or_else(exhausted)?;
            let to = from
                .checked_add(i64::from(size) - 1)
                .ok_or_else(exhausted)?;
            let swapped = counters.swap(&counter, revision, to).await;
            if !swapped.map_err(SequencerError::Backend)? {
                continue;
            }
            let range = IdRange { from, to };
            match marks.accept(key, range, counters, || true).await? {
                Verdict::Accept => return Ok(range),
                Verdict::Retry { floor: above } => {
                    refused += 1;
                    floor = retry_floor(above, refused);
                }
            }
        }
        Err(SequencerError::Backend(format!(
            "no id for `{key}` after {MAX_ATTEMPTS} transactions (too many clients at once)"
        )))
    }
}

#[rewire_runtime::prelude::async_trait]
impl Component for EtcdSequencer {
    async fn init(&mut self, cx: &InitContext) -> Result<(), ComponentError> {
        let settings = self
            .metadata
            .connection()
            .settings_in(cx.config_dir.as_deref())?;
        let counters = EtcdCounters::connect(&settings).await.map_err(|err| {
            ComponentError::new(format!(
                "etcd at {} (`endpoints`): {err}",
                settings.endpoints_text()
            ))
        })?;
        let file = self
            .metadata
            .high_water_file
            .as_ref()
            .map(|path| cx.resolve_path(path));
        let marks = HighWater::adopt(cx, file, &self.metadata.bigger_than)
            .await
            .map_err(|err| ComponentError::new(err.to_string()))?;
        let counters = Arc::new(counters);
        self._follow = follow_tls_files(cx, &settings, Arc::downgrade(&counters));
        self.running = Some((counters, marks));
        Ok(())
    }
}

/// Follows the TLS files of `settings` (if it names any) until the
/// sequencer is closed or dropped: new material is tried on new channels
/// and swapped into the counters' client (calls in flight finish on the
/// old ones).
fn follow_tls_files(
    cx: &InitContext,
    settings: &EtcdSettings,
    counters: Weak<EtcdCounters>,
) -> Option<DropGuard> {
    let (Some(fields), Some(material)) = (&settings.tls_fields, &settings.tls) else {
        return None;
    };
    let stop = cx.shutdown.child_token();
    crate::tls::follow_files(
        cx.key.to_string(),
        "etcd",
        fields.clone(),
        material.clone(),
        stop.clone(),
        move |material| {
            let counters = counters.clone();
            async move {
                let counters = counters
                    .upgrade()
                    .ok_or_else(|| "the sequencer is gone".to_string())?;
                counters.replace_tls(&material).await
            }
        },
    );
    Some(stop.drop_guard())
}

#[rewire_runtime::prelude::async_trait]
impl Sequencer for EtcdSequencer {
    async fn get_next_id(&self, req: NextIdRequest) -> Result<i64, SequencerError> {
        Ok(self.next_range(&req.key, 1).await?.from)
    }

    async fn get_segment(&self, req: SegmentRequest) -> Result<Option<IdRange>, SequencerError> {
        self.next_range(&req.key, req.size).await.map(Some)
    }
}
