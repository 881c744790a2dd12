//! The command line: `rewire run|validate|graph|components|apply|status`,
//! embeddable in a user's own binary through [`main`].

mod address;
mod apply;
mod client_tls;
mod components;
mod config_source;
mod default_config;
mod graph;
mod remote;
mod run;
mod serve_tls;
mod shutdown;
mod status;
mod stop_signals;
mod validate;
mod workers;

use std::path::PathBuf;
use std::process::ExitCode;

use crate::Problems;
use clap::{Parser, Subcommand, ValueEnum};

/// rewire: a component runtime with dependency injection and lossless hot reload.
#[derive(Debug, Parser)]
#[command(name = "rewire", version, about)]
struct Cli {
    /// Threads serving requests, reloads and components (default: REWIRE_WORKERS, else TOKIO_WORKER_THREADS, else one per CPU available).
    #[arg(long, global = true, value_name = "N", value_parser = workers::parse)]
    workers: Option<usize>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Start every component and keep them running until Ctrl-C or SIGTERM.
    Run(run::RunArgs),
    /// Write the built-in default as files to edit: DIR/rewire.json and its stores' data files.
    Init {
        /// Where to write them (default: the current directory).
        #[arg(default_value = ".")]
        dir: PathBuf,
    },
    /// Check a configuration: prints every problem, one per line, and exits 1 if any.
    Validate {
        /// The configuration file (default: ./rewire.json if present, else the built-in default).
        #[arg(long, short)]
        config: Option<PathBuf>,
        #[command(flatten)]
        dapr: config_source::DaprSourceArgs,
    },
    /// Print the dependency graph of a configuration (stores before their users).
    Graph {
        /// The configuration file (default: ./rewire.json if present, else the built-in default).
        #[arg(long, short)]
        config: Option<PathBuf>,
        #[command(flatten)]
        dapr: config_source::DaprSourceArgs,
        /// Output format.
        #[arg(long, value_enum, default_value_t = Format::Dot)]
        format: Format,
    },
    /// List the registered component kinds and types.
    Components,
    /// Change one component of a running sidecar (Lifecycle API): the metadata fields given
    /// replace those; every other field, secretRef, configurationRef and componentRef is kept
    /// (`--replace`, or a `--type` other than the one in force: the push is the whole
    /// declaration).
    #[command(
        after_help = "Example: `rewire apply --kind state --name orders -m redisHost=dr:6379` \
        moves the store to another host and keeps its other fields (redisDB, keyPrefix, ...) and \
        its secretRef for the password; with `--replace`, they would be gone. A component the \
        sidecar does not have is added from the fields given. A type change (`--type` other than \
        the type in force) declares the component whole: the fields given are all it has. A \
        sidecar older than this CLI cannot amend: apply then applies nothing and exits 1 (use \
        `--replace`).\n\n\
        Exit status: 0 applied (or nothing to change); 1 rejected or rolled back \
        (nothing changed), refused unprocessed (invalid, unauthenticated, not permitted, cut \
        short by the sidecar's shutdown, ...), or the sidecar could not be connected to; 2 bad \
        arguments; 3 queued: the sidecar answered before the reload was done, and will still \
        apply or reject the push (follow it with `rewire status`; pushing again is not needed); \
        4 outcome unknown: sent, but no answer came, or a status that does not say it was not \
        processed (DEADLINE_EXCEEDED, INTERNAL, a proxy's UNAVAILABLE, ...): it may be in force: \
        check `rewire status` before pushing again; 5 busy: the sidecar's backlog of pending \
        pushes is full (`RESOURCE_EXHAUSTED`), nothing applied: push again later; 6 applied, but \
        a component's update failed after the commit: not wholly in force."
    )]
    Apply(apply::ApplyArgs),
    /// Show the running sidecar's generation, components and last reloads.
    Status {
        /// HTTP address of the sidecar, `host:port` (an IP address or a DNS name; over TLS, the name its certificate is checked against).
        #[arg(long, default_value = rewire::sidecar::DEFAULT_HTTP_ADDR, value_parser = address::parse)]
        http_addr: String,
        /// Print the sidecar's status JSON as is (for scripts).
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        tls: client_tls::ClientTlsArgs,
    },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Format {
    Dot,
    Mermaid,
}

/// The `rewire` command line, in the calling binary: parses the arguments,
/// sets up logging, and runs the command with every component type linked
/// into the binary (the community components and the caller's own).
/// Returns the process's exit code.
///
/// It builds and runs its own tokio runtime. Called where a tokio runtime
/// is current (`#[tokio::main] async fn main`, a `spawn_blocking` task, a
/// `Runtime::enter` guard), it runs on a thread of its own, outside that
/// runtime, and the calling thread waits for it: a `#[tokio::main]`
/// runtime's thread is blocked while the sidecar runs (a program that
/// needs its own tasks beside the sidecar uses [`crate::Host`]).
pub fn main() -> ExitCode {
    match outside_a_tokio_runtime(main_here) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: cannot start a thread to run rewire outside the caller's tokio runtime: {error}");
            ExitCode::FAILURE
        }
    }
}

/// [`main`]'s body, on a thread where no tokio runtime is current.
fn main_here() -> ExitCode {
    // Every TLS client and server here is rustls with ring; libraries that
    // build a configuration without naming a provider find it installed.
    rewire_components::tls::install_ring_provider();
    let args = Cli::parse();
    crate::init_logging();
    // The registry must see the community components: reference the crate.
    crate::components::link();
    let workers = match workers::worker_threads(args.workers) {
        Ok(workers) => workers,
        Err(err) => {
            eprintln!("error: {err}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("error: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    let code = runtime.block_on(dispatch(args));
    // A blocking task still running (a read that never returns) must not
    // keep the process alive once the command is done.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    code
}

/// The stack of the thread [`main`] runs on inside a tokio runtime: a
/// process's main thread has 8 MiB on Linux, a spawned one 2 MiB.
const MAIN_THREAD_STACK: usize = 8 * 1024 * 1024;

/// Runs `body` where no tokio runtime is current, and returns its result:
/// on the calling thread when none is, else on a scoped thread of its own
/// (a thread starts without tokio's context), joined here; a panic in it
/// goes on here. `body` builds and blocks on a runtime of its own, which
/// tokio refuses (a panic) on a thread inside another's `block_on` or on
/// its workers. Fails only when the thread cannot be started.
fn outside_a_tokio_runtime<T: Send>(body: impl FnOnce() -> T + Send) -> std::io::Result<T> {
    if tokio::runtime::Handle::try_current().is_err() {
        return Ok(body());
    }
    std::thread::scope(|scope| {
        let thread = std::thread::Builder::new()
            .name("rewire-main".to_owned())
            .stack_size(MAIN_THREAD_STACK)
            .spawn_scoped(scope, body)?;
        match thread.join() {
            Ok(result) => Ok(result),
            Err(panic) => std::panic::resume_unwind(panic),
        }
    })
}

/// Runs the chosen command.
async fn dispatch(cli: Cli) -> ExitCode {
    match cli.command {
        Command::Run(args) => run::run(args).await,
        Command::Init { dir } => init_command(&dir),
        Command::Validate { config, dapr } => validate::validate_command(config, dapr),
        Command::Graph {
            config,
            dapr,
            format,
        } => graph::graph_command(config, dapr, format),
        Command::Components => components::components_command(),
        Command::Status {
            http_addr,
            json,
            tls,
        } => status::status_command(&http_addr, json, &tls).await,
        Command::Apply(args) => apply::apply_command(args).await,
    }
}

/// `rewire init`: writes the built-in default into `dir`.
fn init_command(dir: &std::path::Path) -> ExitCode {
    match default_config::init(dir) {
        Ok(config) => {
            print_stdout(&format!(
                "wrote {} (run it with `rewire run --config {}`)\n",
                config.display(),
                config.display()
            ));
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}

/// Prints every problem on its own line to stderr.
fn print_problems(problems: &Problems) {
    for problem in problems.iter() {
        eprintln!("{problem}");
    }
}

/// Prints `value` as indented JSON on stdout.
fn print_json(value: &serde_json::Value) {
    let text = serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string());
    print_stdout(&format!("{text}\n"));
}

/// Writes `text` to stdout. A stdout its reader closed (`| head -1`:
/// EPIPE) is not the command's failure: what it was asked to do is done,
/// and its exit status says how; `print!` would panic (exit 101). Any
/// other write error is said on stderr.
fn print_stdout(text: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if let Err(err) = out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        if err.kind() != std::io::ErrorKind::BrokenPipe {
            eprintln!("error: cannot write to stdout: {err}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Asserts that no tokio runtime is current here and that what `main`'s
    /// body does works here: building a runtime and blocking on it.
    /// Returns the thread it ran on.
    fn no_runtime_current_and_one_can_be_run() -> std::thread::ThreadId {
        assert!(
            tokio::runtime::Handle::try_current().is_err(),
            "a tokio runtime is current where main's body runs"
        );
        let own = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime of its own");
        own.block_on(async { tokio::task::yield_now().await });
        std::thread::current().id()
    }

    /// `rewire::main()` from a plain `fn main` runs on the calling thread.
    #[test]
    fn outside_any_runtime_main_runs_on_the_calling_thread() {
        let ran_on = outside_a_tokio_runtime(no_runtime_current_and_one_can_be_run).unwrap();
        assert_eq!(ran_on, std::thread::current().id());
    }

    /// `rewire::main()` inside a tokio runtime (`#[tokio::main] async fn
    /// main() -> ExitCode { rewire::main() }`) runs on a thread of its own,
    /// outside it, and returns its result. Before: refused with exit 2
    /// (and before that, the runtime it builds panicked, "Cannot start a
    /// runtime from within a runtime").
    #[tokio::test]
    async fn inside_a_tokio_runtime_main_runs_on_its_own_thread_outside_it() {
        let ran_on = outside_a_tokio_runtime(no_runtime_current_and_one_can_be_run).unwrap();
        assert_ne!(ran_on, std::thread::current().id());
    }

    /// `spawn_blocking(|| rewire::main())`, where a runtime's handle is
    /// current but building and blocking on another works: it runs (on a
    /// thread of its own). Before: refused with exit 2, though it had
    /// worked.
    #[tokio::test]
    async fn under_spawn_blocking_main_runs_outside_the_runtime() {
        let (caller, ran_on) = tokio::task::spawn_blocking(|| {
            let ran_on = outside_a_tokio_runtime(no_runtime_current_and_one_can_be_run);
            (std::thread::current().id(), ran_on.unwrap())
        })
        .await
        .unwrap();
        assert_ne!(ran_on, caller);
    }

    /// A panic in `main`'s body, run on its own thread, goes on in the
    /// caller, as it would have on the caller's thread.
    #[tokio::test]
    async fn a_panic_on_mains_own_thread_goes_on_in_the_caller() {
        let caught = std::panic::catch_unwind(|| {
            outside_a_tokio_runtime(|| -> () { std::panic::panic_any("the body's panic") })
        })
        .unwrap_err();
        assert_eq!(caught.downcast_ref::<&str>(), Some(&"the body's panic"));
    }
}
