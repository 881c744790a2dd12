//! Distributed tracing: `tracing` spans named `rewire.*` (API calls,
//! backend calls, reloads) exported over OTLP.
//!
//! * [`layer`]: the `tracing` layer to install with the process's
//!   subscriber; it records nothing until tracing is configured.
//! * [`apply`] / [`follow`]: the settings in force — the `OTEL_*`
//!   variables and the config file's `tracing` section, re-read after every
//!   reload (endpoint and sampling change without a restart); the export
//!   TLS files are also re-read every few seconds, so a rotated
//!   certificate or a CA mounted late is taken up (a bad new file keeps
//!   the exporter in force; new settings meanwhile are applied with the
//!   last good files). Each read runs on a thread of its own and is given
//!   up after 5 s ([`tls_reads`]): a hung mount holds neither start-up
//!   nor the follower, and counts as a bad file until the read returns.
//! * [`propagation`]: W3C `traceparent` in (HTTP and gRPC) and out
//!   (CloudEvents), and the span of an API call.
//!
//! A finished span goes to a bounded queue without waiting ([`export`]);
//! when the collector is slow or gone, spans are dropped and counted
//! ([`TraceStats`], in `/metrics`). Span attributes are names, kinds and
//! types only, never metadata values.

mod export;
#[cfg(test)]
mod export_task_tests;
mod grpc_channel;
#[cfg(test)]
mod grpc_channel_tests;
#[cfg(test)]
mod hung_tls_tests;
#[cfg(test)]
mod live_tls_tests;
pub mod propagation;
mod sampler;
mod settings;
mod stats;
mod tls;
mod tls_reads;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::SdkTracerProvider;
use rewire_runtime::config::OtelProtocol;
use rewire_runtime::Runtime;
use tokio::sync::{broadcast, mpsc, oneshot, watch};
use tracing::subscriber::Interest;
use tracing::{Metadata, Subscriber};
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::{Context, Filter, Layer};
use tracing_subscriber::registry::LookupSpan;

pub use settings::{ParentBasedRoot, SamplerChoice, TraceSettings};
pub use stats::TraceStats;
pub use tls::ExportTlsFiles;

use export::{Exporter, QueueProcessor, Receivers, ReceiversHome, TakenReceivers};
use sampler::LiveSampler;
use tls::{ExportTls, TlsContents, TlsFingerprint};
use tls_reads::TlsReads;

/// How often the export TLS files are read again while they are
/// configured (besides after every reload).
const RECHECK_TLS_EVERY: Duration = Duration::from_secs(5);

/// The process's tracing pipeline: one tracer provider for the process,
/// its sampler and exporter swapped as the settings change.
struct Telemetry {
    enabled: AtomicBool,
    /// Whether calls may be sampled at all (tracing on and the sampler not
    /// `always_off`): when not, only a reload's spans are made.
    calls: AtomicBool,
    sampler: LiveSampler,
    provider: SdkTracerProvider,
    exporter: watch::Sender<Option<Arc<Exporter>>>,
    /// The queue's and the flush requests' receiving ends while no export
    /// task holds them (one that ends puts them back).
    receivers: ReceiversHome,
    /// Flush requests to the export task.
    flushes: mpsc::Sender<oneshot::Sender<()>>,
    /// The export task, spawned again once it has ended (its runtime was
    /// dropped).
    export_task: Mutex<Option<tokio::task::JoinHandle<()>>>,
    applied: Mutex<Option<Applied>>,
    /// Reads the export TLS files, bounded in time, outside `applied`'s
    /// lock.
    tls_reads: TlsReads,
    /// The number of the next apply: an apply whose files were read
    /// before a later one was put in force is not (its settings are
    /// older).
    next_apply: AtomicU64,
    /// The number of the last apply put in force (under `applied`'s lock).
    last_applied: AtomicU64,
    /// The last apply found no exporter for want of the system's roots
    /// (their read timed out or failed): they are read again every
    /// [`RECHECK_TLS_EVERY`] until an exporter is built, rather than
    /// tracing staying off until the next reload.
    roots_unread: AtomicBool,
    stats: Arc<TraceStats>,
}

/// The settings in force and the TLS files they were last applied with.
struct Applied {
    settings: TraceSettings,
    /// The files the exporter in force was built from (`None`: none).
    built_from: Option<BuiltFrom>,
    /// The files (or the read error) last refused: logged once, and tried
    /// again only once they change.
    refused: Option<Result<TlsFingerprint, String>>,
}

/// The TLS material the exporter in force was built from: kept so that a
/// reload changing the settings while a file is bad rebuilds the exporter
/// with it rather than turning tracing off.
#[derive(Clone)]
struct BuiltFrom {
    fingerprint: TlsFingerprint,
    tls: Arc<ExportTls>,
}

fn telemetry() -> &'static Telemetry {
    static TELEMETRY: OnceLock<Telemetry> = OnceLock::new();
    TELEMETRY.get_or_init(|| Telemetry::new(stats()))
}

impl Telemetry {
    fn new(stats: Arc<TraceStats>) -> Self {
        Self::with_tls_reads(stats, TlsReads::default())
    }

    /// A pipeline reading its export TLS files with `tls_reads`.
    fn with_tls_reads(stats: Arc<TraceStats>, tls_reads: TlsReads) -> Self {
        let capacity = env_number("OTEL_BSP_MAX_QUEUE_SIZE")
            .map_or(export::DEFAULT_QUEUE, |n| n.clamp(1, 65_536) as usize);
        let (processor, queue) = QueueProcessor::new(capacity, stats.clone());
        let sampler = LiveSampler::new();
        let (flushes, flush_requests) = mpsc::channel(4);
        let provider = SdkTracerProvider::builder()
            .with_sampler(sampler.clone())
            .with_span_processor(processor)
            .build();
        Telemetry {
            enabled: AtomicBool::new(false),
            calls: AtomicBool::new(false),
            sampler,
            provider,
            exporter: watch::Sender::new(None),
            receivers: Arc::new(Mutex::new(Some(Receivers {
                spans: queue,
                flushes: flush_requests,
            }))),
            flushes,
            export_task: Mutex::new(None),
            applied: Mutex::new(None),
            tls_reads,
            next_apply: AtomicU64::new(1),
            last_applied: AtomicU64::new(0),
            roots_unread: AtomicBool::new(false),
            stats,
        }
    }
}

fn env_number(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

/// Whether spans are being recorded and exported now.
pub fn is_enabled() -> bool {
    telemetry().enabled.load(Ordering::Relaxed)
}

/// Whether calls are traced now: tracing is on and the sampler may sample
/// one (under `always_off` only reloads are traced, and a call costs no
/// span and no header parsing).
pub fn calls_traced() -> bool {
    telemetry().calls.load(Ordering::Relaxed)
}

/// The counters of exported and dropped spans (of the whole process).
pub fn stats() -> Arc<TraceStats> {
    static STATS: OnceLock<Arc<TraceStats>> = OnceLock::new();
    STATS.get_or_init(Arc::default).clone()
}

/// Whether `metadata` is one of rewire's trace spans (`rewire.*`): what
/// the tracing layer takes, and what the log output leaves out.
pub fn is_trace_span(metadata: &Metadata<'_>) -> bool {
    metadata.is_span() && metadata.name().starts_with("rewire.")
}

/// The tracing layer: rewire's spans, to OTLP once [`apply`] turns it on.
pub fn layer<S>() -> impl Layer<S> + Send + Sync
where
    S: Subscriber + for<'a> LookupSpan<'a> + Send + Sync,
{
    let tracer = telemetry().provider.tracer("rewire");
    tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_location(false)
        .with_threads(false)
        .with_filter(WhenTracing)
}

/// Passes rewire's spans while tracing is on.
///
/// The answer is cached at each callsite (`always` or `never`) and the
/// caches are rebuilt when tracing is switched ([`apply`]). A `sometimes`
/// would be asked on every span, and would not keep the span from being
/// made: with per-layer filters, only an interest of `never` from every
/// layer stops the registry from creating it. A span no layer records
/// then cost every API call and every Redis command a registry entry.
struct WhenTracing;

impl<S> Filter<S> for WhenTracing {
    fn enabled(&self, metadata: &Metadata<'_>, _cx: &Context<'_, S>) -> bool {
        span_wanted(metadata, is_enabled(), calls_traced())
    }

    fn callsite_enabled(&self, metadata: &'static Metadata<'static>) -> Interest {
        if span_wanted(metadata, is_enabled(), calls_traced()) {
            Interest::always()
        } else {
            Interest::never()
        }
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(LevelFilter::INFO)
    }
}

/// Whether a span of `metadata` is made: rewire's spans while tracing is
/// `on`; with calls not traced (`always_off`), a reload's only.
fn span_wanted(metadata: &Metadata<'_>, on: bool, calls: bool) -> bool {
    const RELOAD_SPANS: [&str; 2] = ["rewire.reload", "rewire.component"];
    is_trace_span(metadata) && on && (calls || RELOAD_SPANS.contains(&metadata.name()))
}

/// Puts `settings` in force (a no-op when they already are and their TLS
/// files did not change). Must run inside a Tokio runtime: the export task
/// is spawned on first use. Reads the TLS files on a thread of their own,
/// waiting at most 5 s for them (a hung mount: the settings are applied
/// as if the files were unreadable, and they are read again once that
/// read returns).
pub fn apply(settings: &TraceSettings) {
    telemetry().apply(settings);
}

impl Telemetry {
    /// [`apply`]: waits here (at most the read deadline) for the files.
    fn apply(&self, settings: &TraceSettings) {
        let number = self.next_apply.fetch_add(1, Ordering::Relaxed);
        let read = exports(settings).then(|| {
            self.tls_reads
                .read_blocking(&settings.tls, dials_tls(settings))
        });
        self.apply_read(number, settings, read);
    }

    /// [`apply`] without holding the async worker while the files are read.
    async fn apply_off_workers(&self, settings: &TraceSettings) {
        let number = self.next_apply.fetch_add(1, Ordering::Relaxed);
        let read = if exports(settings) {
            Some(
                self.tls_reads
                    .read(&settings.tls, dials_tls(settings))
                    .await,
            )
        } else {
            None
        };
        self.apply_read(number, settings, read);
    }

    /// Puts `settings` in force with their TLS files as `read` (`None`:
    /// not read, as nothing is exported); `number`: the apply's, older
    /// than one in force already: nothing is done. No file is read here.
    fn apply_read(
        &self,
        number: u64,
        settings: &TraceSettings,
        read: Option<Result<TlsContents, String>>,
    ) {
        let mut applied = self.applied.lock().unwrap_or_else(|p| p.into_inner());
        if self.last_applied.fetch_max(number, Ordering::Relaxed) > number {
            return;
        }
        // A task spawned anew (the last one ended with its runtime) needs
        // an exporter built anew: the last one's connections lived on
        // that runtime too.
        let respawned = self.start_export_task();
        let unchanged = !respawned && applied.as_ref().is_some_and(|a| a.settings == *settings);
        let was_on = applied.as_ref().is_some_and(|a| a.settings.enabled());
        let Some(endpoint) = settings.endpoint.as_deref().filter(|_| settings.enabled()) else {
            if !unchanged {
                self.install(None, settings, was_on);
                *applied = Some(Applied {
                    settings: settings.clone(),
                    built_from: None,
                    refused: None,
                });
            }
            return;
        };
        let shown = shown_endpoint(endpoint);
        let read = read.unwrap_or_else(|| Err("the TLS files were not read".to_string()));
        let roots_failed = read.as_ref().is_ok_and(TlsContents::system_roots_failed);
        self.roots_unread.store(roots_failed, Ordering::Relaxed);
        let seen = read
            .as_ref()
            .map(TlsContents::fingerprint)
            .map_err(Clone::clone);
        if let Some(previous) = applied.as_mut().filter(|_| unchanged) {
            if previous.built_from.as_ref().map(|b| Ok(b.fingerprint)) == Some(seen.clone()) {
                self.roots_unread.store(false, Ordering::Relaxed);
                if previous.refused.take().is_some() {
                    tracing::info!(endpoint = %shown, "Tracing: the TLS files are back as they were; the exporter in force stays.");
                }
                return;
            }
            if previous.refused.as_ref() == Some(&seen) {
                return;
            }
        }
        let checked = read.and_then(|contents| {
            let fingerprint = contents.fingerprint();
            contents.check().map(|tls| (fingerprint, tls))
        });
        let (tls, refused) = match checked {
            Ok((fingerprint, tls)) => {
                let tls = Arc::new(tls);
                (BuiltFrom { fingerprint, tls }, None)
            }
            Err(error) => {
                // New settings while a file is bad: the exporter in force
                // is rebuilt for them from the material it was built from,
                // when they name the same files (a file caught mid-write).
                // Files named anew that are bad (a typo, a late mount) are
                // refused: the old trust or identity must not stand in for
                // the ones the operator named.
                let last_good = applied
                    .as_ref()
                    .filter(|a| !unchanged && a.settings.tls == settings.tls);
                let Some(last_good) = last_good.and_then(|a| a.built_from.clone()) else {
                    self.refuse(&mut applied, settings, unchanged, was_on, seen, &error);
                    return;
                };
                tracing::warn!(endpoint = %shown, %error, "Tracing: the TLS files are refused; the new settings are applied with the last good ones.");
                (last_good, Some(seen.clone()))
            }
        };
        match export::build_exporter(settings, endpoint, &tls.tls) {
            Ok(exporter) => {
                self.roots_unread.store(false, Ordering::Relaxed);
                if unchanged {
                    tracing::info!(endpoint = %shown, "Tracing: the TLS files changed; the exporter is rebuilt with them.");
                }
                self.install(Some(Arc::new(exporter)), settings, was_on);
                *applied = Some(Applied {
                    settings: settings.clone(),
                    built_from: Some(tls),
                    refused,
                });
            }
            Err(error) => self.refuse(&mut applied, settings, unchanged, was_on, seen, &error),
        }
    }

    /// No exporter can be built for `settings` (`error`, from the TLS
    /// files `seen`): under unchanged settings the exporter in force stays
    /// and `seen` is not tried again until it changes; under new ones
    /// tracing is off until they are applied again with better files.
    fn refuse(
        &self,
        applied: &mut Option<Applied>,
        settings: &TraceSettings,
        unchanged: bool,
        was_on: bool,
        seen: Result<TlsFingerprint, String>,
        error: &str,
    ) {
        let shown = shown_endpoint(settings.endpoint.as_deref().unwrap_or_default());
        if unchanged && self.exporter.borrow().is_some() {
            tracing::warn!(endpoint = %shown, %error, "Tracing: the TLS files are refused; the exporter in force stays.");
        } else {
            tracing::warn!(endpoint = %shown, %error, "Cannot export spans; tracing stays off.");
        }
        match applied.as_mut().filter(|_| unchanged) {
            Some(previous) => previous.refused = Some(seen),
            None => {
                self.install(None, settings, was_on);
                *applied = Some(Applied {
                    settings: settings.clone(),
                    built_from: None,
                    refused: Some(seen),
                });
            }
        }
    }

    /// Spawns the export task on the current runtime unless one runs
    /// already (one that ended with its runtime is replaced); whether one
    /// was spawned. Outside a runtime, none is.
    fn start_export_task(&self) -> bool {
        let mut task = self.export_task.lock().unwrap_or_else(|p| p.into_inner());
        if task.as_ref().is_some_and(|running| !running.is_finished()) {
            return false;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return false;
        };
        let Some(taken) = TakenReceivers::take(&self.receivers) else {
            return false;
        };
        let delay = env_number("OTEL_BSP_SCHEDULE_DELAY")
            .map_or(export::DEFAULT_DELAY, |ms| Duration::from_millis(ms.max(1)));
        *task = Some(runtime.spawn(export::export_loop(
            taken,
            self.exporter.subscribe(),
            delay,
            self.stats.clone(),
        )));
        true
    }

    /// Swaps `exporter` in (the queued spans stay queued for it) with
    /// `settings`' sampler; `was_on`: whether the settings replaced had
    /// tracing on.
    fn install(&self, exporter: Option<Arc<Exporter>>, settings: &TraceSettings, was_on: bool) {
        let on = exporter.is_some();
        self.sampler.set(settings.sampler);
        self.exporter.send_replace(exporter);
        let calls = on && settings.traces_calls();
        let switched = self.enabled.swap(on, Ordering::Relaxed) != on;
        if self.calls.swap(calls, Ordering::Relaxed) != calls || switched {
            // Every callsite asks `WhenTracing` again.
            tracing::callsite::rebuild_interest_cache();
        }
        if on {
            let endpoint = settings.endpoint.as_deref().unwrap_or_default();
            tracing::info!(
                endpoint = %shown_endpoint(endpoint),
                protocol = ?settings.protocol,
                sampler = ?settings.sampler,
                service = %settings.service_name,
                "Tracing: exporting spans over OTLP."
            );
        } else if was_on {
            tracing::info!("Tracing: off.");
        }
    }
}

/// `endpoint` as logged: without the credentials of its URL, as
/// [`rewire_runtime::without_credentials`] finds them. An endpoint is one
/// address, so one given without a scheme keeps no userinfo at all:
/// everything before its last `@` is hidden (a lone token
/// `tok@collector:4317`, which free text could not tell from an e-mail
/// address, and a `user:password` whose password holds a quote), the
/// user name kept only when its part before the first `:` holds nothing
/// that could end a word.
pub(super) fn shown_endpoint(endpoint: &str) -> String {
    if endpoint.contains("://") {
        return rewire_runtime::without_credentials(endpoint).into_owned();
    }
    let Some((userinfo, host)) = endpoint.rsplit_once('@') else {
        return endpoint.to_owned();
    };
    match userinfo.split_once(':') {
        Some((user, _)) if !user.is_empty() && user.chars().all(plain_user_char) => {
            format!("{user}:{REDACTED}@{host}")
        }
        _ => format!("{REDACTED}@{host}"),
    }
}

/// Whether `c` may stand in a user name shown before a hidden password.
fn plain_user_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')
}

/// What stands for hidden userinfo in a shown endpoint (as
/// [`rewire_runtime::without_credentials`] writes a hidden password).
const REDACTED: &str = "[redacted]";

/// Whether `settings` export spans (their TLS files are then read).
fn exports(settings: &TraceSettings) -> bool {
    settings.enabled() && settings.endpoint.is_some()
}

/// Whether the collector of `settings` may be dialled over TLS, so that
/// without a CA the system's roots are read for it: an `https://` URL;
/// for gRPC an endpoint without a scheme too (`OTEL_EXPORTER_OTLP_INSECURE`
/// decides when the channel is built). An `http://` collector never
/// waits on the system's roots (a bundle on a hung mount, a FIFO).
fn dials_tls(settings: &TraceSettings) -> bool {
    let Some(endpoint) = settings.endpoint.as_deref() else {
        return false;
    };
    match settings.protocol {
        OtelProtocol::Http => tls::is_https(endpoint),
        OtelProtocol::Grpc => tls::is_https(&grpc_channel::with_scheme(endpoint.trim(), false)),
    }
}

impl Telemetry {
    /// Whether the follower applies `settings` (the last applied) again
    /// every [`RECHECK_TLS_EVERY`]: they name TLS files, or their exporter
    /// was refused for want of the system's roots (a read that timed out
    /// at start-up would otherwise keep tracing off until a reload).
    fn rechecks(&self, settings: &TraceSettings) -> bool {
        follows_tls_files(settings)
            || (exports(settings) && self.roots_unread.load(Ordering::Relaxed))
    }
}

/// Whether `settings` export with TLS files, which are then re-read every
/// [`RECHECK_TLS_EVERY`].
fn follows_tls_files(settings: &TraceSettings) -> bool {
    settings.enabled() && settings.endpoint.is_some() && settings.tls != ExportTlsFiles::default()
}

/// Exports every span finished so far, waiting at most `within`; whether
/// it was done in time. At shutdown, so that the last calls' and the
/// shutdown's spans are not lost. Without tracing on, returns at once.
pub async fn flush(within: Duration) -> bool {
    telemetry().flush(within).await
}

impl Telemetry {
    /// [`flush`].
    async fn flush(&self, within: Duration) -> bool {
        if !self.enabled.load(Ordering::Relaxed) {
            return true;
        }
        let (done, answered) = oneshot::channel();
        let asked = async { self.flushes.send(done).await.is_ok() && answered.await.is_ok() };
        tokio::time::timeout(within, asked).await.unwrap_or(false)
    }
}

/// The settings for `runtime`'s running configuration and this process's
/// environment.
pub fn settings_for(runtime: &Runtime) -> TraceSettings {
    let generation = runtime.generation();
    let app_id = runtime.config().config.app_id;
    TraceSettings::resolve(
        &|name| std::env::var(name).ok(),
        generation.sections().tracing.as_ref(),
        &app_id,
    )
}

/// Following a runtime's settings; dropping it stops following.
#[derive(Debug)]
pub struct Following(tokio::task::JoinHandle<()>);

impl Drop for Following {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Applies the settings for `runtime` now, after every reload and, while
/// they export with TLS files, every [`RECHECK_TLS_EVERY`] (a rotated
/// file is taken up without a reload), until the returned [`Following`]
/// is dropped. Must run inside a Tokio runtime. Waits at most 5 s for the
/// TLS files (a hung mount: tracing starts off and the files are read
/// again by the follower).
pub fn follow(runtime: &Runtime) -> Following {
    let reloads = runtime.reload_events();
    let runtime = runtime.clone();
    follow_with(
        telemetry(),
        reloads,
        move || settings_for(&runtime),
        RECHECK_TLS_EVERY,
    )
}

/// [`follow`] for `telemetry`: applies `current()` now (waiting at most
/// the read deadline for the TLS files), then after every reload event and
/// every `recheck` while TLS files are named.
fn follow_with<T: Clone + Send + 'static>(
    telemetry: &'static Telemetry,
    reloads: broadcast::Receiver<T>,
    current: impl Fn() -> TraceSettings + Send + 'static,
    recheck: Duration,
) -> Following {
    let settings = current();
    telemetry.apply(&settings);
    Following(tokio::spawn(keep_following(
        telemetry, reloads, settings, current, recheck,
    )))
}

/// Applies `current()` to `telemetry` after every reload event and, while
/// `settings` (the last applied) export with TLS files, every `recheck`.
async fn keep_following<T: Clone>(
    telemetry: &'static Telemetry,
    mut reloads: broadcast::Receiver<T>,
    mut settings: TraceSettings,
    current: impl Fn() -> TraceSettings,
    recheck: Duration,
) {
    loop {
        let timer = async {
            if telemetry.rechecks(&settings) {
                tokio::time::sleep(recheck).await;
            } else {
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            // Until the runtime stops (the channel closes); a lagged
            // receiver has missed reloads, so it re-reads as well.
            event = reloads.recv() => {
                if let Err(broadcast::error::RecvError::Closed) = event {
                    return;
                }
            }
            () = timer => {}
        }
        settings = current();
        // The files are read on a thread of their own, within a deadline:
        // a hung mount holds neither this worker nor the next reload.
        telemetry.apply_off_workers(&settings).await;
    }
}

#[cfg(test)]
mod tests {
    use tracing_subscriber::layer::SubscriberExt;

    use super::*;

    /// Failed before: a gRPC endpoint without a scheme was logged with
    /// its password (credentials were found only after `://`).
    #[test]
    fn an_endpoint_is_logged_without_credentials_with_or_without_a_scheme() {
        for endpoint in [
            "user:pw-9x@collector:4317",
            "https://user:pw-9x@collector:4317",
        ] {
            let shown = shown_endpoint(endpoint);
            assert!(!shown.contains("pw-9x"), "{shown}");
            assert!(shown.contains("collector:4317"), "{shown}");
        }
        assert_eq!(shown_endpoint("collector:4317"), "collector:4317");
        // A lone token before `@`: hidden too (an endpoint has no e-mail
        // address in it). Failed before the special case's return.
        let shown = shown_endpoint("tok-9x@collector:4317");
        assert_eq!(shown, "[redacted]@collector:4317");
        // A quote in the password, an `@` in the user: none of it shown.
        let shown = shown_endpoint("u:p'x9:y@collector:4317");
        assert_eq!(shown, "u:[redacted]@collector:4317");
        let shown = shown_endpoint("alice@corp.com:pw-9x@collector:4317");
        assert_eq!(shown, "[redacted]@collector:4317");
        assert_eq!(
            shown_endpoint("http://collector:4318"),
            "http://collector:4318"
        );
    }

    #[test]
    fn no_trace_span_is_made_while_tracing_is_off() {
        let subscriber = tracing_subscriber::registry().with(layer());
        tracing::subscriber::with_default(subscriber, || {
            assert!(!is_enabled(), "no test of this crate turns tracing on");
            // With a `sometimes` interest the registry made this span (and
            // every API call paid for it) although no layer recorded it.
            assert!(tracing::info_span!("rewire.api").is_disabled());
            assert!(tracing::info_span!("rewire.redis", db.system = "redis").is_disabled());
        });
    }

    #[test]
    fn under_always_off_only_a_reloads_spans_are_made() {
        let wanted = |span: tracing::Span, on: bool, calls: bool| {
            span.metadata().is_some_and(|m| span_wanted(m, on, calls))
        };
        // Spans made under a subscriber that takes everything, to read
        // their metadata.
        let subscriber = tracing_subscriber::registry();
        tracing::subscriber::with_default(subscriber, || {
            let api = || tracing::info_span!("rewire.api");
            let reload = || tracing::info_span!("rewire.reload");
            let component = || tracing::info_span!("rewire.component");
            let other = || tracing::info_span!("some.span");
            assert!(wanted(api(), true, true));
            assert!(!wanted(api(), true, false));
            assert!(wanted(reload(), true, false));
            assert!(wanted(component(), true, false));
            assert!(!wanted(reload(), false, false));
            assert!(!wanted(other(), true, true));
        });
    }
}
