//! The `rewire` binary: the sidecar and its command-line tools.

mod cli;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let args = cli::Cli::parse();
    cli::init_tracing();
    // The registry must see the community components: reference the crate.
    rewire::components::link();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("error: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    let code = runtime.block_on(cli::dispatch(args));
    // A blocking task still running (a read that never returns) must not
    // keep the process alive once the command is done.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    code
}
