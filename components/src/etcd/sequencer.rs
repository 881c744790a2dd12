//! The `etcd` sequencer, as Layotto's: a counter per key at
//! `{keyPrefixPath}` (default `/layotto/`) followed by the key as
//! Layotto's `GetModifiedSeqKey` makes it (`sequencer|||{appId}||{key}`
//! by default; `keyPrefix` picks the strategy, see [`layotto_key`]). An
//! id is the key's `version` after a put of an empty value, so ids are
//! strictly increasing for every client of the cluster, Layotto's
//! sidecars included. Segments are not handed out (as Layotto's): one put
//! makes one id.
//!
//! A new cluster's counter may be behind the old one's: every id lies
//! above the floor of [`crate::high_water`] (the largest id handed out,
//! `biggerThan`), and with `highWaterFile` a rebuilt sequencer — every
//! metadata change rebuilds it — starts above every id handed out. A
//! counter below the floor is put past it when that takes fewer than
//! [`MAX_LIFT_PUTS`] puts; further behind it jumps in one write: rewire
//! keeps an offset in a record of its own beside the counter
//! ([`CounterKeys`]) and an id is the offset plus the version. Layotto's
//! sidecars do not read the offset: a counter that had to jump is
//! rewire's alone (see docs/components.md). The record also notes when the
//! counter key was made, so a counter deleted and made again goes on
//! above the ids it gave.
//!
//! Counters of rewire's earlier layout (`{keyPrefix}sequencer|||{key}`,
//! `keyPrefix` literal, the id as a decimal value) go on: the first
//! request for a key (per instance) reads the decimal value there — and
//! at `{keyPrefixPath}sequencer|||{key}` when `keyPrefixPath` is set, and
//! last at the counter's own key, taken over in one write with a record
//! that goes on above every value read
//! ([`EtcdCounters::take_over_counter_key`]) — and ids go on above it.
//! Only while the
//! counter has no record of rewire's yet (no id of it handed out): other
//! clients may write those keys (a config store's `SaveConfiguration`
//! without a key prefix), so a counter in use never follows them; a value
//! there that is no number is taken as absent, with a warning.
//!
//! TLS: the config store's `caCert`, `clientCert` and `clientKey` (or an
//! `https://` endpoint). Files among them are followed while the
//! sequencer runs ([`crate::tls::follow_files`]): new material is tried on
//! new channels (`Status` must answer) and swapped into the client; a bad
//! file keeps the channels in force. The new channels may reach another
//! cluster (`endpoints` a DNS name moved to a DR cluster, while calls in
//! flight finish on the old one), so their ids are another source's
//! ([`ChannelSources`]): accepted only above every id handed out before
//! their first use, while a late answer on the old channels is refused and
//! asked again.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, LazyLock, Mutex, Weak};

use rewire_runtime::{
    Component, ComponentError, IdRange, InitContext, NextIdRequest, SegmentRequest, Sequencer,
    SequencerError,
};
use serde::Deserialize;
use tokio_util::sync::DropGuard;

use super::metadata::{EtcdMetadata, EtcdSettings};
use super::sequencer_kv::{CounterError, CounterKeys, EtcdCounters, NewChannels, MAX_LIFT_PUTS};
use crate::high_water::{
    check_key_prefix, check_request, layotto_key, old_rewire_key, retry_floor, HighWater, Verdict,
    MAX_KEYS,
};
use crate::redacted::redacted;
use crate::redis::duration::{deserialize_timeout, Timeout};

/// Most ids one request takes from etcd before it fails (each one
/// refused by the high-water marks).
const MAX_ATTEMPTS: usize = 16;

/// Layotto's `keyPrefixPath` when none is given.
pub const DEFAULT_KEY_PREFIX_PATH: &str = "/layotto/";

/// Metadata of the `etcd` sequencer: the config store's connection fields,
/// and the sequencer's own.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EtcdSequencerMetadata {
    /// The servers, `host:port` comma-separated.
    pub endpoints: String,
    /// Layotto's key prefix strategy: empty or `appid` (the default):
    /// `{appId}||{key}`; `name`: `{component name}||{key}`; `none`:
    /// `{key}`; anything else (lowercased, without `||`): `{keyPrefix}||{key}`.
    #[serde(default)]
    pub key_prefix: String,
    /// Layotto's `keyPrefixPath`: the path in front of every counter's
    /// key, with a `/` added at either end if missing; default
    /// `/layotto/`.
    #[serde(default)]
    pub key_prefix_path: Option<String>,
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
            .field("key_prefix_path", &self.key_prefix_path)
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
    /// `keyPrefixPath` as Layotto uses it: `/` at either end.
    pub fn path(&self) -> String {
        match self.key_prefix_path.as_deref() {
            None | Some("") => DEFAULT_KEY_PREFIX_PATH.to_string(),
            Some(path) => {
                let mut path = path.to_string();
                if !path.starts_with('/') {
                    path.insert(0, '/');
                }
                if !path.ends_with('/') {
                    path.push('/');
                }
                path
            }
        }
    }

    fn connection(&self) -> EtcdMetadata {
        let mut metadata = EtcdMetadata::new(self.endpoints.clone());
        // The start-up probe reads under it.
        metadata.key_prefix = self.path();
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
    example = r#"{"endpoints": "127.0.0.1:2379", "keyPrefixPath": "/ids/", "highWaterFile": "sequencer-marks.json"}"#
)]
pub struct EtcdSequencer {
    #[metadata]
    metadata: EtcdSequencerMetadata,
    running: Option<(Arc<EtcdCounters>, HighWater, Arc<ChannelSources>)>,
    /// The app id and the component's name (for the `appid` and `name`
    /// key prefix strategies), set at `init`.
    names: (String, String),
    /// The keys whose counters in rewire's earlier layout were read.
    migrated: Mutex<HashSet<String>>,
    /// Stops following the TLS files when the sequencer goes.
    _follow: Option<DropGuard>,
}

impl EtcdSequencer {
    async fn next_id(&self, key: &str) -> Result<i64, SequencerError> {
        check_request(key, 1)?;
        let (counters, marks, sources) = self
            .running
            .as_ref()
            .ok_or_else(|| SequencerError::Backend("the sequencer is not initialised".into()))?;
        let (app_id, component) = &self.names;
        let path = self.metadata.path();
        let modified = layotto_key(&self.metadata.key_prefix, app_id, component, key);
        let keys = CounterKeys::new(&path, &modified);
        // Before the first put: a key refused afterwards would leave a
        // counter.
        marks.has_room(key).await?;
        let mut floor = marks.floor(key).await?;
        let mut migrate = !self.lock_migrated().contains(key);
        if migrate
            && counters
                .has_record(&keys)
                .await
                .map_err(SequencerError::Backend)?
        {
            // Rewire's record stands: written only once every earlier
            // key was read (before rewire's first id of the counter, or by
            // the take-over of its own key, which holds the highest value
            // read). Read again, a key another client wrote there since (a
            // config item) would lift, or jump, the counter.
            self.remember_migrated(key);
            migrate = false;
        }
        if migrate {
            // The earlier layout's other keys this configuration names (a
            // key the user may not read is warned about)...
            let mut named = vec![old_rewire_key(&self.metadata.key_prefix, key)];
            if self.metadata.key_prefix_path.is_some() {
                named.push(old_rewire_key(&path, key));
            }
            // ...and the earlier default (no `keyPrefix`), which a
            // strategy word (`none`, `appid`, `name`), read literally
            // above, did not mean then: read quietly, it only ever lifts.
            let default = old_rewire_key("", key);
            let quiet = !named.contains(&default);
            named.sort();
            named.dedup();
            let old = named
                .into_iter()
                .map(|old| (old, false))
                .chain(quiet.then_some((default, true)))
                .filter(|(old, _)| *old != keys.counter);
            let mut earlier = None;
            for (old, quiet) in old {
                if let Some(value) = counters
                    .read_old(&old, quiet)
                    .await
                    .map_err(SequencerError::Backend)?
                {
                    earlier = earlier.max(Some(value));
                }
            }
            // Last, a decimal at the counter's own key (an earlier key
            // itself with `keyPrefix: none`) is taken over, in one write,
            // with the record that goes on above it and every value read
            // above: once the record stands no old key is read again (the
            // bump below empties that key), so it must cover them all.
            if let Some(value) = counters
                .take_over_counter_key(&keys, earlier)
                .await
                .map_err(SequencerError::Backend)?
            {
                earlier = earlier.max(Some(value));
            }
            if let Some(value) = earlier {
                floor = floor.max(value);
            }
        }
        for refused in 0..MAX_ATTEMPTS {
            let (id, channels) =
                counters
                    .next_above(&keys, floor)
                    .await
                    .map_err(|err| match err {
                        CounterError::RunOut(_) => SequencerError::Exhausted(key.to_string()),
                        CounterError::Failed(message) => SequencerError::Backend(message),
                    })?;
            if migrate {
                self.remember_migrated(key);
            }
            match sources.judge(marks, key, id, channels).await? {
                Verdict::Accept => return Ok(id),
                Verdict::Retry { floor: above } => {
                    // A lead short of a jump at first (the counter stays
                    // Layotto's); later, whatever it takes to pass a
                    // faster counter of the same component.
                    let lead = i64::try_from(MAX_LIFT_PUTS / 2).unwrap_or(i64::MAX);
                    let ahead = retry_floor(above, refused as u32 + 1);
                    floor = if refused < 8 {
                        ahead.min(above.saturating_add(lead))
                    } else {
                        ahead
                    };
                }
            }
        }
        Err(SequencerError::Backend(format!(
            "no id for `{key}` after {MAX_ATTEMPTS} attempts (ids below the high-water mark)"
        )))
    }

    /// Notes that the earlier layout's counters of `key` were read (or
    /// need not be): not read again by this instance.
    fn remember_migrated(&self, key: &str) {
        let mut migrated = self.lock_migrated();
        if migrated.len() >= MAX_KEYS {
            // Reading again costs a read, no more: forget, not grow.
            migrated.clear();
        }
        migrated.insert(key.to_string());
    }

    fn lock_migrated(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.migrated
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[rewire_runtime::prelude::async_trait]
impl Component for EtcdSequencer {
    async fn init(&mut self, cx: &InitContext) -> Result<(), ComponentError> {
        check_key_prefix(&self.metadata.key_prefix).map_err(ComponentError::new)?;
        self.names = (cx.app_id.clone(), cx.key.name.to_string());
        let settings = self
            .metadata
            .connection()
            .read_settings_in(cx.config_dir.as_deref())
            .await?;
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
        let sources = Arc::new(ChannelSources::new(
            SourceNames {
                endpoints: settings.endpoints.clone(),
                path: self.metadata.path(),
                key_prefix: self.metadata.key_prefix.clone(),
                names: self.names.clone(),
            },
            counters.channels(),
            counters.cluster(),
        ));
        let counters = Arc::new(counters);
        self._follow = follow_tls_files(
            cx,
            &settings,
            Arc::downgrade(&counters),
            Arc::downgrade(&sources),
        );
        self.running = Some((counters, marks, sources));
        Ok(())
    }
}

/// Where a sequencer's ids come from, for the high-water marks: the same
/// for every instance whose counters are the same keys reached at the
/// same endpoints of the same etcd cluster (an instance and its rebuilt
/// successor, while both serve, or two runtimes of one app), so that their
/// ids, unique among themselves, are not refused as a switch of backend;
/// another for anything else.
///
/// The cluster's id alone does not tell clusters apart: etcd derives it
/// from the peer URLs and `--initial-cluster-token`, so every default
/// single-node etcd has the same one, and a disaster-recovery cluster
/// restored from the same manifests has the primary's. Two such clusters
/// taken as one source let a rebuilt instance on the one behind hand out
/// an id its predecessor, still serving, had just taken on the other.
/// Endpoints listed differently (another order or case aside) are another
/// source: at worst a counter is lifted past ids it need not skip.
#[derive(Debug)]
pub(crate) struct CounterSource;

impl CounterSource {
    /// The source of counters on `cluster`, reached at `endpoints`, under
    /// `path` with `key_prefix` for `(app id, component)`; a source of its
    /// own when the cluster did not say its id.
    fn of(
        cluster: u64,
        endpoints: &[String],
        path: &str,
        key_prefix: &str,
        names: &(String, String),
    ) -> Arc<Self> {
        Self::registered(cluster, endpoints, path, key_prefix, names, true)
    }

    /// A new source for the counters [`of`](Self::of) names, reached on
    /// channels just swapped in (maybe to another cluster behind the same
    /// names): never one in use before; instances built from now on with
    /// the same names share it (they reach whatever the names reach now).
    fn renewed(
        cluster: u64,
        endpoints: &[String],
        path: &str,
        key_prefix: &str,
        names: &(String, String),
    ) -> Arc<Self> {
        Self::registered(cluster, endpoints, path, key_prefix, names, false)
    }

    /// [`of`](Self::of) (`reuse`: the live source of the same names, if
    /// any) or [`renewed`](Self::renewed).
    fn registered(
        cluster: u64,
        endpoints: &[String],
        path: &str,
        key_prefix: &str,
        names: &(String, String),
        reuse: bool,
    ) -> Arc<Self> {
        type Sources = HashMap<String, Weak<CounterSource>>;
        static SOURCES: LazyLock<std::sync::Mutex<Sources>> = LazyLock::new(Default::default);
        if cluster == 0 {
            return Arc::new(Self);
        }
        let mut members: Vec<String> = endpoints.iter().map(|e| e.to_lowercase()).collect();
        members.sort();
        members.dedup();
        let (app_id, component) = names;
        let id = format!(
            "{cluster}\u{0}{}\u{0}{path}\u{0}{}\u{0}{app_id}\u{0}{component}",
            members.join(","),
            key_prefix.to_lowercase()
        );
        let mut sources = SOURCES.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(source) = sources.get(&id).and_then(Weak::upgrade).filter(|_| reuse) {
            return source;
        }
        sources.retain(|_, source| source.strong_count() > 0);
        let source = Arc::new(Self);
        sources.insert(id, Arc::downgrade(&source));
        source
    }
}

/// What names a sequencer's counters, but for the cluster (see
/// [`CounterSource::of`]).
#[derive(Debug)]
struct SourceNames {
    /// `endpoints`, as listed.
    endpoints: Vec<String>,
    /// `keyPrefixPath`, as the counters' keys use it.
    path: String,
    /// `keyPrefix`.
    key_prefix: String,
    /// `(app id, component)`.
    names: (String, String),
}

/// The source of the ids each set of the counters' channels hands out
/// (see [`EtcdCounters::channels`]): the set in force and its source, a
/// new one each time new channels are swapped in, since they may reach
/// another cluster behind the same `endpoints` (a DNS name moved to a DR
/// cluster that is behind). An id from the new channels is then accepted
/// only above every id handed out before their first use, and one from
/// the old channels (a call in flight across the swap) is refused and
/// asked again: under one source, two counters could give the same id.
#[derive(Debug)]
pub(crate) struct ChannelSources {
    names: SourceNames,
    /// The channels in force and their source.
    current: Mutex<(u64, Arc<CounterSource>)>,
}

impl ChannelSources {
    /// The sources of counters named by `names`, channels `generation` in
    /// force on `cluster`.
    fn new(names: SourceNames, generation: u64, cluster: u64) -> Self {
        let source = CounterSource::of(
            cluster,
            &names.endpoints,
            &names.path,
            &names.key_prefix,
            &names.names,
        );
        Self {
            names,
            current: Mutex::new((generation, source)),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (u64, Arc<CounterSource>)> {
        self.current.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// New channels are in force: their ids get a source of their own.
    fn swapped_in(&self, channels: NewChannels) {
        let names = &self.names;
        let source = CounterSource::renewed(
            channels.cluster,
            &names.endpoints,
            &names.path,
            &names.key_prefix,
            &names.names,
        );
        *self.lock() = (channels.generation, source);
    }

    /// The source of ids made on `channels` while they are in force
    /// (`None`: not known, or not in force).
    fn of_channels(&self, channels: Option<u64>) -> Option<Arc<CounterSource>> {
        let current = self.lock();
        (Some(current.0) == channels).then(|| current.1.clone())
    }

    /// Whether `source` is that of the channels in force.
    fn in_force(&self, source: &Arc<CounterSource>) -> bool {
        Arc::ptr_eq(&self.lock().1, source)
    }

    /// Whether `id`, made on `channels` (`None`: on either side of a
    /// swap), may be handed out for `key`: only while those channels are
    /// in force, and (the marks see to it) above every id handed out
    /// before their first id.
    async fn judge(
        &self,
        marks: &HighWater,
        key: &str,
        id: i64,
        channels: Option<u64>,
    ) -> Result<Verdict, SequencerError> {
        let range = IdRange { from: id, to: id };
        match self.of_channels(channels) {
            Some(source) => {
                let in_force = || self.in_force(&source);
                marks.accept(key, range, &source, in_force).await
            }
            // Refused: the floor to ask again above.
            None => {
                let source = self.lock().1.clone();
                marks.accept(key, range, &source, || false).await
            }
        }
    }
}

/// Follows the TLS files of `settings` (if it names any) until the
/// sequencer is closed or dropped: new material is tried on new channels
/// and swapped into the counters' client (calls in flight finish on the
/// old ones); their ids are a new source's (see [`ChannelSources`]).
fn follow_tls_files(
    cx: &InitContext,
    settings: &EtcdSettings,
    counters: Weak<EtcdCounters>,
    sources: Weak<ChannelSources>,
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
            let (counters, sources) = (counters.clone(), sources.clone());
            async move {
                let gone = || "the sequencer is gone".to_string();
                let counters = counters.upgrade().ok_or_else(gone)?;
                let sources = sources.upgrade().ok_or_else(gone)?;
                let channels = counters.replace_tls(&material).await?;
                // Before anything is awaited: until then ids from the new
                // channels are refused (asked again), not taken for the
                // old channels' (the window is a few instructions).
                sources.swapped_in(channels);
                Ok(())
            }
        },
    );
    Some(stop.drop_guard())
}

#[rewire_runtime::prelude::async_trait]
impl Sequencer for EtcdSequencer {
    async fn get_next_id(&self, req: NextIdRequest) -> Result<i64, SequencerError> {
        self.next_id(&req.key).await
    }

    /// Not handed out, as Layotto's: an id is one put, so a range of ids
    /// is not one step.
    async fn get_segment(&self, req: SegmentRequest) -> Result<Option<IdRange>, SequencerError> {
        check_request(&req.key, req.size)?;
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Instances on the same counters of one cluster, reached at the same
    /// endpoints, share a source (so an instance and its rebuilt successor
    /// serving together never refuse each other's ids as a backend switch,
    /// which pushed counters to jump); another cluster, endpoint list,
    /// path, prefix or component is another source, and an unknown
    /// cluster one of its own.
    #[test]
    fn instances_on_the_same_counters_share_a_source() {
        let names = ("app".to_string(), "ids".to_string());
        let at = |list: &[&str]| list.iter().map(|e| e.to_string()).collect::<Vec<_>>();
        let a = at(&["a:2379", "b:2379"]);
        let one = CounterSource::of(7, &a, "/layotto/", "appid", &names);
        assert!(Arc::ptr_eq(
            &one,
            &CounterSource::of(7, &at(&["B:2379", "a:2379"]), "/layotto/", "AppId", &names)
        ));
        for other in [
            CounterSource::of(8, &a, "/layotto/", "appid", &names),
            // Same cluster id, other servers: default single-node etcds,
            // or a restored disaster-recovery cluster, share ids.
            CounterSource::of(7, &at(&["c:2379"]), "/layotto/", "appid", &names),
            CounterSource::of(7, &at(&["a:2379"]), "/layotto/", "appid", &names),
            CounterSource::of(7, &a, "/other/", "appid", &names),
            CounterSource::of(7, &a, "/layotto/", "none", &names),
            CounterSource::of(7, &a, "/layotto/", "appid", &("app".into(), "other".into())),
            CounterSource::of(0, &a, "/layotto/", "appid", &names),
        ] {
            assert!(!Arc::ptr_eq(&one, &other));
        }
        assert!(!Arc::ptr_eq(
            &CounterSource::of(0, &a, "/layotto/", "appid", &names),
            &CounterSource::of(0, &a, "/layotto/", "appid", &names)
        ));
    }

    /// A TLS swap whose new channels reach a DR cluster that is behind
    /// (`endpoints` a DNS name moved there; restored from the primary's
    /// manifests, so the same cluster id): 100 was handed out; R1 takes
    /// 101 on the primary over the old channels, R2 takes 101 on the DR
    /// cluster over the new ones. Whatever the order of the swap and the
    /// two answers, 101 is handed out once: a late answer of the old
    /// channels is refused, and the new channels' first id must lie above
    /// every id handed out before. Before: one source for both, whose
    /// marks' floor lay far below, and both were handed 101.
    #[tokio::test]
    async fn ids_from_channels_swapped_in_never_repeat_the_old_channels_ids() {
        #[derive(Debug, Clone, Copy)]
        enum Step {
            AnswerR1,
            Swap,
            AnswerR2,
        }
        use Step::*;
        let orders = [
            [AnswerR1, Swap, AnswerR2],
            [Swap, AnswerR1, AnswerR2],
            [Swap, AnswerR2, AnswerR1],
        ];
        for (case, order) in orders.into_iter().enumerate() {
            let names = SourceNames {
                endpoints: vec!["etcd.example:2379".into()],
                path: "/layotto/".into(),
                key_prefix: String::new(),
                names: ("app".into(), format!("swap-{case}")),
            };
            let sources = ChannelSources::new(names, 0, 7);
            let key = rewire_runtime::ComponentKey::new("sequencer", "ids");
            let cx = InitContext::new(key, "app", rewire_runtime::Metadata::default());
            let marks = HighWater::adopt(&cx, None, &BTreeMap::new()).await.unwrap();
            let first = sources.judge(&marks, "orders", 100, Some(0)).await;
            assert!(matches!(first, Ok(Verdict::Accept)), "{case}: {first:?}");
            let mut handed = Vec::new();
            for step in order {
                let answer = match step {
                    Swap => {
                        let channels = NewChannels {
                            generation: 1,
                            cluster: 7,
                        };
                        sources.swapped_in(channels);
                        continue;
                    }
                    AnswerR1 => sources.judge(&marks, "orders", 101, Some(0)).await,
                    AnswerR2 => sources.judge(&marks, "orders", 101, Some(1)).await,
                };
                match answer.unwrap() {
                    Verdict::Accept => handed.push((step, 101)),
                    Verdict::Retry { floor } => {
                        assert!(floor >= 100, "{case}: {step:?} asked again above {floor}")
                    }
                }
            }
            assert_eq!(handed.len(), 1, "{order:?}: 101 handed out {handed:?}");
            // The new channels go on; the old ones stay refused.
            let next = sources.judge(&marks, "orders", 102, Some(1)).await;
            assert!(matches!(next, Ok(Verdict::Accept)), "{case}: {next:?}");
            let late = sources.judge(&marks, "orders", 103, Some(0)).await;
            assert!(
                matches!(late, Ok(Verdict::Retry { .. })),
                "{case}: {late:?}"
            );
        }
    }

    /// An id whose writes straddled a swap (made on either set of
    /// channels) is refused and asked again above the floor.
    #[tokio::test]
    async fn an_id_made_across_a_swap_is_asked_again() {
        let names = SourceNames {
            endpoints: vec!["etcd.example:2379".into()],
            path: "/layotto/".into(),
            key_prefix: String::new(),
            names: ("app".into(), "across".into()),
        };
        let sources = ChannelSources::new(names, 0, 7);
        let key = rewire_runtime::ComponentKey::new("sequencer", "ids");
        let cx = InitContext::new(key, "app", rewire_runtime::Metadata::default());
        let marks = HighWater::adopt(&cx, None, &BTreeMap::new()).await.unwrap();
        let first = sources.judge(&marks, "orders", 100, Some(0)).await;
        assert!(matches!(first, Ok(Verdict::Accept)), "{first:?}");
        let across = sources.judge(&marks, "orders", 101, None).await;
        assert!(
            matches!(across, Ok(Verdict::Retry { floor: 100 })),
            "{across:?}"
        );
    }

    /// A swap makes a new source, even on the same cluster and names, and
    /// an instance built after it shares it (not the old channels' one).
    #[test]
    fn a_swap_makes_a_new_source_that_later_instances_share() {
        let names = || SourceNames {
            endpoints: vec!["etcd.example:2379".into()],
            path: "/layotto/".into(),
            key_prefix: String::new(),
            names: ("app".into(), "renewed".into()),
        };
        let old = ChannelSources::new(names(), 0, 7);
        let before = old.lock().1.clone();
        old.swapped_in(NewChannels {
            generation: 1,
            cluster: 7,
        });
        let after = old.lock().1.clone();
        assert!(!Arc::ptr_eq(&before, &after));
        let later = ChannelSources::new(names(), 0, 7);
        assert!(Arc::ptr_eq(&later.lock().1, &after));
    }
}
