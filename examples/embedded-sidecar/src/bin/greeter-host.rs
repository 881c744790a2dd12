//! A program hosting rewire as a library, with `rewire` as its only
//! dependency: starts the components of the file given as its argument,
//! follows the file, and prints the greeting of `greeter/hi` (reached as its
//! own type) at start and after every reload, until Ctrl-C or SIGTERM;
//! exits 1 if a component's close was abandoned at shutdown.
//! From this example's directory, where `greeter.json` is:
//!
//! ```sh
//! cargo run --bin greeter-host -- greeter.json
//! ```

use std::process::ExitCode;

use greeter_sidecar::Greeter;
use rewire::tokio::sync::broadcast::error::RecvError;
use rewire::{ComponentKey, Host};

#[rewire::tokio::main(crate = "rewire::tokio")]
async fn main() -> ExitCode {
    rewire::init_logging();
    let Some(path) = std::env::args_os().nth(1) else {
        eprintln!("usage: greeter-host CONFIG");
        return ExitCode::from(2);
    };
    let host = match Host::start(&path).await {
        Ok(host) => host,
        Err(err) => {
            eprintln!("error: {err}");
            return ExitCode::FAILURE;
        }
    };
    match host.component::<Greeter>("greeter", "hi") {
        Ok(greeter) => println!("greeting: {}", greeter.greeting()),
        Err(err) => println!("no greeter: {err}"),
    }
    // Every reload: the handle resolves in the new generation.
    let greeter = host.runtime().component(ComponentKey::new("greeter", "hi"));
    let mut reloads = host.reload_events();
    rewire::tokio::spawn(async move {
        loop {
            let record = match reloads.recv().await {
                Ok(record) => record,
                // Fallen behind (the channel keeps the last records): the
                // ones missed are gone, the next is the oldest kept.
                Err(RecvError::Lagged(missed)) => {
                    println!("{missed} reload record(s) missed");
                    continue;
                }
                Err(RecvError::Closed) => break,
            };
            match greeter.load_as::<Greeter>() {
                Ok(g) => println!(
                    "generation {}: greeting: {}",
                    record.generation,
                    g.greeting()
                ),
                Err(err) => println!("generation {}: no greeter: {err}", record.generation),
            }
        }
    });
    // Non-zero when a close was abandoned (timed out, panicked, or cut
    // short by a second signal): what it held may not have been released.
    match host.run_until_stopped().await {
        0 => ExitCode::SUCCESS,
        _abandoned => ExitCode::FAILURE,
    }
}
