//! `rewire run`: start, wait for Ctrl-C or SIGTERM, close in reverse order.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use rewire::sidecar::{ApiOptions, ApiServer};
use rewire::{Registry, Runtime};
use tokio_util::sync::CancellationToken;

use super::config_source::{self, DaprSourceArgs, Source};
use super::default_config::{default_home, DataFiles};
use super::stop_signals::{start_unless_stopped, StopSignals};
use crate::host::SPAN_FLUSH;

/// How much longer than the shutdown grace the servers may take to stop.
const STOP_MARGIN: Duration = Duration::from_secs(5);

/// How often the configuration file is re-read even without a change event.
const CONFIG_RESYNC: Duration = Duration::from_secs(30);
/// How long the shutdown may take to cut short a reload in progress and
/// close every component: each level closes within its share of it, so
/// the stores are closed too (see [`Runtime::shutdown_by`]); the same as
/// a library host's.
use crate::host::CLOSE_BOUND;

/// Arguments of `rewire run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Configuration file (default: ./rewire.json if present, else the built-in default).
    #[arg(long, short)]
    config: Option<PathBuf>,
    #[command(flatten)]
    dapr: DaprSourceArgs,
    /// gRPC listen address of the sidecar APIs.
    #[arg(long, default_value = rewire::sidecar::DEFAULT_GRPC_ADDR)]
    grpc_addr: SocketAddr,
    /// HTTP listen address of the sidecar APIs.
    #[arg(long, default_value = rewire::sidecar::DEFAULT_HTTP_ADDR)]
    http_addr: SocketAddr,
    #[command(flatten)]
    tls: super::serve_tls::ServeTlsArgs,
    /// Port the app listens on (loopback): pub/sub events are delivered to
    /// it (its `GET /dapr/subscribe`), once it listens.
    #[arg(long)]
    app_port: Option<u16>,
    /// How the app is called on `--app-port`.
    #[arg(long, value_enum, default_value_t = AppProtocol::Http, requires = "app_port")]
    app_protocol: AppProtocol,
}

/// `--app-protocol`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum AppProtocol {
    /// Dapr's HTTP app callback: `GET /dapr/subscribe`, `POST` per event.
    Http,
    /// Dapr's gRPC `AppCallback`: `ListTopicSubscriptions`, `OnTopicEvent`.
    Grpc,
}

/// Starts the runtime and waits for a stop signal.
pub async fn run(args: RunArgs) -> ExitCode {
    let mut stop = StopSignals::listen();
    let tls = match args.tls.settings() {
        Ok(tls) => tls,
        Err(err) => {
            eprintln!("error: {err}");
            return ExitCode::FAILURE;
        }
    };
    // The tokens: one set but unreadable must not leave its API open.
    let env_options = match ApiOptions::from_env() {
        Ok(options) => options,
        Err(err) => {
            eprintln!("error: {err}");
            return ExitCode::FAILURE;
        }
    };
    let registry = Registry::collected();
    let source = config_source::choose(args.config.clone(), args.dapr.clone());
    match &source {
        Source::Json(None) => tracing::info!(
            home = %default_home().display(),
            "No configuration given: using the built-in default, its data files in home (`rewire init` writes it as files to edit)."
        ),
        _ => {
            tracing::info!(config = %config_source::shown_source(&source), "Loading configuration.")
        }
    }
    let Some(valid) = config_source::load_source(&source, &registry, DataFiles::Create) else {
        return ExitCode::FAILURE;
    };
    let options = env_options.runtime_options();
    let runtime = match start_unless_stopped(valid, registry, options, &mut stop).await {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    let generation = runtime.generation();
    tracing::info!(
        generation = generation.number,
        components = generation.len(),
        workers = tokio::runtime::Handle::current().metrics().num_workers(),
        "Runtime started."
    );
    drop(generation);
    // Tracing as the environment and the file's `tracing` section say,
    // re-read after every reload.
    let tracing_follower = rewire::sidecar::telemetry::follow(&runtime);
    // Edits of the file or of a manifest (ConfigMap updates included)
    // reload the runtime.
    let _watches = match source {
        Source::Json(path) => path
            .map(|path| runtime.watch_config_file(path, CONFIG_RESYNC))
            .into_iter()
            .collect(),
        Source::Sources(sources) => runtime.watch_config_sources(sources, CONFIG_RESYNC),
    };
    let options = ApiOptions { tls, ..env_options };
    serve_until_stopped(runtime, &args, options, stop, tracing_follower).await
}

/// Serves the sidecar APIs with `options` (and the app channel `args`
/// gives) until a stop signal; then stops accepting, lets in-flight calls
/// finish (up to the shutdown grace, then every connection is cut), and
/// closes components users-first.
async fn serve_until_stopped(
    runtime: Runtime,
    args: &RunArgs,
    options: ApiOptions,
    mut stop: StopSignals,
    tracing_follower: rewire::sidecar::telemetry::Following,
) -> ExitCode {
    let stop_serving = CancellationToken::new();
    let app_channel = args.app_port.map(|port| {
        let protocol = match args.app_protocol {
            AppProtocol::Http => rewire::sidecar::app::AppProtocol::Http,
            AppProtocol::Grpc => rewire::sidecar::app::AppProtocol::Grpc,
        };
        // Dapr's `APP_API_TOKEN` (read with the other token variables)
        // goes on every call to the app.
        rewire::sidecar::app::AppChannel::local(port)
            .with_protocol(protocol)
            .with_app_token(options.app_api_token.clone())
    });
    let options = ApiOptions {
        app_channel: app_channel.clone(),
        ..options
    };
    // Connections are cut after the grace; this bounds the rest.
    let serving_bound = options.shutdown_grace + STOP_MARGIN;
    let server = match ApiServer::bind(
        runtime.clone(),
        options,
        args.grpc_addr,
        args.http_addr,
        stop_serving.clone(),
    )
    .await
    {
        Ok(server) => server,
        Err(err) => {
            eprintln!("error: {err}");
            // Closing what started may take up to CLOSE_BOUND: a signal
            // is the user giving up on it, as during any shutdown.
            let closing = super::shutdown::shut_down_within(&runtime, CLOSE_BOUND);
            if let Err(signal) = unless_stopped(closing, stop.wait()).await {
                tracing::error!(
                    signal,
                    "Clean-up cut short by a signal: exiting at once; components still closing may not have released what they hold."
                );
            }
            return ExitCode::FAILURE;
        }
    };
    let _app = app_channel.map(|channel| {
        rewire::sidecar::app::serve_app(runtime.clone(), channel, Vec::new(), stop_serving.clone())
    });
    if args.app_port.is_none() && !runtime.generation().sections().subscriptions.0.is_empty() {
        tracing::warn!("The configuration declares subscriptions but no --app-port is given: their events are not delivered.");
    }
    let signal = stop.wait().await;
    tracing::info!(signal, "Stopping (a later signal exits at once).");
    let shutdown = shut_down(
        &runtime,
        server,
        &stop_serving,
        serving_bound,
        tracing_follower,
    );
    // The shutdown may take over a minute (the serving bound, every
    // close's bound, the span flush): a second signal is the user giving
    // up on it, as during start-up.
    tokio::select! {
        code = shutdown => code,
        again = stop.wait() => {
            tracing::error!(
                signal = again,
                "Shutdown cut short by a second signal: exiting at once; components still closing may not have released what they hold."
            );
            ExitCode::FAILURE
        }
    }
}

/// After the stop signal: stops serving (within `serving_bound`), closes
/// every component (within [`CLOSE_BOUND`]) and flushes the spans; the
/// exit code says whether everything stopped and closed in time.
async fn shut_down(
    runtime: &Runtime,
    server: ApiServer,
    stop_serving: &CancellationToken,
    serving_bound: Duration,
    tracing_follower: rewire::sidecar::telemetry::Following,
) -> ExitCode {
    // Before the servers stop: a push whose reload is in progress is
    // answered UNAVAILABLE (cut short) while its connection is still up,
    // not held for the grace and then cut, nothing in force.
    runtime.stop_reloads();
    stop_serving.cancel();
    let served = match tokio::time::timeout(serving_bound, server.stopped()).await {
        Ok(Ok(())) => Served::Stopped,
        Ok(Err(err)) => Served::Failed(err),
        Err(_) => {
            tracing::warn!(waited = ?serving_bound, "The APIs did not stop in time; closing components anyway.");
            Served::TimedOut
        }
    };
    // Stop following first: the closed runtime reads as "no tracing", and
    // a follower that saw it would turn the exporter off before the flush.
    drop(tracing_follower);
    let abandoned = super::shutdown::shut_down_within(runtime, CLOSE_BOUND).await;
    // The last calls' and the shutdown's spans, exported within a bound.
    if !rewire::sidecar::telemetry::flush(SPAN_FLUSH).await {
        tracing::warn!(waited = ?SPAN_FLUSH, "Spans still queued at shutdown were not exported in time.");
    }
    exit_code(served, abandoned)
}

/// `work`'s output, unless `stop` (a stop signal) resolves first: then the
/// signal, `work` dropped (what it spawned goes on in the background).
async fn unless_stopped<T>(
    work: impl std::future::Future<Output = T>,
    stop: impl std::future::Future<Output = &'static str>,
) -> Result<T, &'static str> {
    tokio::select! {
        done = work => Ok(done),
        signal = stop => Err(signal),
    }
}

/// How the APIs' servers ended at shutdown.
#[derive(Debug)]
enum Served {
    /// Within the serving bound.
    Stopped,
    /// Not within the serving bound: calls may have been cut unanswered,
    /// and the servers were left behind.
    TimedOut,
    /// With an error.
    Failed(rewire::sidecar::ApiError),
}

/// The exit code of a shutdown whose servers ended as `served` and in
/// which `abandoned` component closes were abandoned: 0 only when the APIs
/// stopped in time and every component closed, so a supervisor learns
/// that something may not have been released or answered.
fn exit_code(served: Served, abandoned: usize) -> ExitCode {
    match served {
        Served::Failed(err) => {
            eprintln!("error: {err}");
            ExitCode::FAILURE
        }
        Served::TimedOut => {
            tracing::error!(
                abandoned,
                "Stopped, but the APIs did not stop in time (calls may have been cut unanswered)."
            );
            ExitCode::FAILURE
        }
        Served::Stopped if abandoned > 0 => {
            // Each was logged with its component.
            tracing::error!(
                abandoned,
                "Stopped, but component close(s) were abandoned (timed out or panicked)."
            );
            ExitCode::FAILURE
        }
        Served::Stopped => {
            tracing::info!("Stopped.");
            ExitCode::SUCCESS
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// APIs that did not stop within the serving bound are a failure, as
    /// abandoned closes are. Before: exit 0.
    /// A signal during the clean-up after a failed bind cuts it short.
    /// Before: the clean-up ignored signals until every close was done
    /// (up to a minute).
    #[tokio::test]
    async fn a_signal_during_a_clean_up_cuts_it_short() {
        let cut = unless_stopped(std::future::pending::<usize>(), async { "SIGTERM" }).await;
        assert_eq!(cut, Err("SIGTERM"));
        let done = unless_stopped(async { 0_usize }, std::future::pending()).await;
        assert_eq!(done, Ok(0));
    }

    #[test]
    fn apis_not_stopped_in_time_exit_non_zero() {
        assert_eq!(exit_code(Served::TimedOut, 0), ExitCode::FAILURE);
        assert_eq!(exit_code(Served::Stopped, 1), ExitCode::FAILURE);
        assert_eq!(exit_code(Served::Stopped, 0), ExitCode::SUCCESS);
    }
}
