//! A component written with `#[derive(Component)]`, declared in JSON with
//! all three kinds of reference, that subscribes to its own key in the
//! injected config store and logs every change.
//!
//! Run it from the repository root:
//!
//! ```sh
//! cargo run --example custom_component [-- path/to/rewire.json]
//! ```
//!
//! then edit `examples/custom_component/config.json` (change
//! `greeter.greeting`) and watch the log. Ctrl-C stops it.

use rewire::prelude::*;
use serde::Deserialize;

/// The greeter's typed metadata.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct GreeterMetadata {
    /// Who is greeted; injected from the config store (`configurationRef`).
    audience: String,
    /// An API token; injected from the secret store (`secretRef`).
    api_token: String,
    /// How many times to greet at start.
    #[serde(default = "one")]
    repeat: u32,
}

fn one() -> u32 {
    1
}

/// Greets its audience, and follows its greeting in the config store.
#[derive(rewire::Component)]
#[component(kind = "greeter", type = "greeter", example = r#"{"repeat": 1}"#)]
struct Greeter {
    #[metadata]
    meta: GreeterMetadata,
    /// Injected by `componentRef`.
    #[inject]
    config: ConfigStoreHandle,
}

#[async_trait]
impl Component for Greeter {
    async fn init(&mut self, cx: &InitContext) -> Result<(), ComponentError> {
        let query = ConfigQuery::keys(["greeter.greeting"]);
        // Load once per operation; never keep the instance.
        let current = self.config.load()?.get(&query).await?;
        let greeting = current
            .first()
            .map(|i| i.value.clone())
            .unwrap_or_else(|| "Hello".into());
        for _ in 0..self.meta.repeat {
            rewire::tracing::info!(
                component = %cx.key,
                token_length = self.meta.api_token.len(),
                "{greeting}, {}!",
                self.meta.audience
            );
        }
        // Subscribe through the handle, not the loaded instance: when a
        // reload rebuilds the store, the subscription follows the new one.
        let mut subscription = self.config.subscribe(query).await?;
        let (key, audience, shutdown) = (
            cx.key.clone(),
            self.meta.audience.clone(),
            cx.shutdown.clone(),
        );
        rewire::tokio::spawn(async move {
            loop {
                rewire::tokio::select! {
                    _ = shutdown.cancelled() => break,
                    change = subscription.changes.recv() => match change {
                        Some(change) => for item in change.items {
                            rewire::tracing::info!(component = %key, version = %item.version, "Greeting changed: {}, {audience}!", item.value);
                        },
                        None => break,
                    },
                }
            }
        });
        Ok(())
    }
}

#[rewire::tokio::main(crate = "rewire::tokio")]
async fn main() -> Result<std::process::ExitCode, rewire::StartError> {
    rewire::init_logging();
    // The example's own rewire.json, or the file given as argument. Paths
    // in it are relative to its folder; edits of it reload.
    let config = std::env::args_os().nth(1).map_or_else(
        || {
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("examples/custom_component/rewire.json")
        },
        Into::into,
    );
    let host = rewire::Host::start(config).await?;
    rewire::tracing::info!(
        "Edit examples/custom_component/config.json to change the greeting; Ctrl-C to stop."
    );
    // Non-zero when a close was abandoned (timed out, panicked, or cut
    // short by a second signal): what it held may not have been released.
    let abandoned = host.run_until_stopped().await;
    Ok(match abandoned {
        0 => std::process::ExitCode::SUCCESS,
        _ => std::process::ExitCode::FAILURE,
    })
}
