//! A component written with `#[derive(Component)]`, declared in JSON with
//! all three kinds of reference, that subscribes to its own key in the
//! injected config store and logs every change.
//!
//! Run it from the repository root:
//!
//! ```text
//! cargo run --example custom_component
//! ```
//!
//! then edit `examples/custom_component/config.json` (change
//! `greeter.greeting`) and watch the log. Ctrl-C stops it.

use std::path::PathBuf;

use rewire::prelude::*;
use rewire::{ConfigQuery, Registry, Runtime, RuntimeOptions, ValidConfig};
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
        let store = self
            .config
            .load()
            .map_err(|e| ComponentError::new(e.to_string()))?;
        let query = ConfigQuery::keys(["greeter.greeting"]);
        let current = store
            .get(&query)
            .await
            .map_err(|e| ComponentError::new(e.to_string()))?;
        let greeting = current
            .first()
            .map(|i| i.value.clone())
            .unwrap_or_else(|| "Hello".into());
        for _ in 0..self.meta.repeat {
            tracing::info!(
                component = %cx.key,
                token_length = self.meta.api_token.len(),
                "{greeting}, {}!",
                self.meta.audience
            );
        }
        let mut subscription = store
            .subscribe(query)
            .await
            .map_err(|e| ComponentError::new(e.to_string()))?;
        let (key, audience, shutdown) = (
            cx.key.clone(),
            self.meta.audience.clone(),
            cx.shutdown.clone(),
        );
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    change = subscription.changes.recv() => match change {
                        Some(change) => for item in change.items {
                            tracing::info!(component = %key, version = %item.version, "Greeting changed: {}, {audience}!", item.value);
                        },
                        None => break,
                    },
                }
            }
        });
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt().with_env_filter("info").init();
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/custom_component");
    // Paths in the example's rewire.json are relative to its folder.
    std::env::set_current_dir(&dir)?;
    let registry = Registry::collected();
    let config = ValidConfig::from_path(&dir.join("rewire.json"), &registry);
    let config = config.map_err(|problems| problems.to_string())?;
    let runtime = Runtime::start(config, registry, RuntimeOptions::default()).await?;
    tracing::info!(
        "Edit examples/custom_component/config.json to change the greeting; Ctrl-C to stop."
    );
    tokio::signal::ctrl_c().await?;
    runtime.shutdown().await;
    Ok(())
}
