//! Every Rust block of `docs/components.md`, in order, as one program the
//! test command compiles (`tests/cli/docs_compile.rs` checks that each block
//! of the guide appears here, or in another compiled example, line for
//! line). Edit the two together.
//!
//! ```sh
//! cargo run --example guide   # with a rewire.json declaring cache/front
//! ```

use rewire::components::LiveMetadata;
use rewire::prelude::*;
use serde::Deserialize;

/// Typed metadata: decoded from the component's resolved `metadata`.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct CacheMetadata {
    redis_host: String,
    #[serde(default)]
    max_entries: u32,
}

/// A cache in front of the `orders` state store. (Shown by `rewire components`.)
#[derive(rewire::Component)]
#[component(
    kind = "cache",
    type = "lru",
    example = r#"{"redisHost": "127.0.0.1:6379"}"#,
    in_place
)]
struct LruCache {
    /// Or plain `CacheMetadata`, without in-place updates.
    #[metadata]
    meta: LiveMetadata<CacheMetadata>,
    /// Required: start fails if no componentRef gives one.
    #[inject]
    orders: StateStoreHandle,
    /// Optional, and only the component named `settings`.
    #[inject(name = "settings")]
    settings: Option<ConfigStoreHandle>,
    /// Any other field starts as `Default::default()`.
    entries: std::sync::Mutex<Vec<String>>,
}

#[async_trait]
impl Component for LruCache {
    async fn init(&mut self, cx: &InitContext) -> Result<(), ComponentError> {
        // self.meta is decoded, injected handles are bound, and
        // cx.metadata holds the resolved metadata (secrets included).
        self.follow(cx).await // subscribe to its own keys: see below
    }
    // readiness() and close() have defaults; override as needed.
}

impl LruCache {
    /// §2: using an injected store.
    async fn lookup(&self) -> Result<Option<StateEntry>, ComponentError> {
        let orders = self.orders.load()?; // Arc<dyn StateStore>, the current instance
        let entry = orders
            .get(GetRequest {
                key: "k".into(),
                ..Default::default()
            })
            .await?;
        let _ = (
            &self.entries,
            self.meta.load().redis_host.len(),
            self.meta.load().max_entries,
        );
        Ok(entry)
    }

    /// §2: following one's own keys.
    async fn follow(&self, cx: &InitContext) -> Result<(), ComponentError> {
        let Some(settings) = &self.settings else {
            return Ok(());
        };
        let mut subscription = settings
            .subscribe(ConfigQuery::keys(["cache.maxEntries"]))
            .await?;
        let shutdown = cx.shutdown.clone();
        rewire::tokio::spawn(async move {
            loop {
                rewire::tokio::select! {
                    _ = shutdown.cancelled() => break,
                    change = subscription.changes.recv() => match change {
                        Some(change) => rewire::tracing::info!(changed = change.items.len(), "settings changed"),
                        None => break, // the store was removed, or the runtime stopped
                    },
                }
            }
        });
        Ok(())
    }
}

#[async_trait]
impl InPlaceUpdate for LruCache {
    async fn update_in_place(&self, metadata: &Metadata) -> Result<InPlace, ComponentError> {
        let new: CacheMetadata = metadata.decode()?; // all of it or nothing: decode first
        self.meta.replace(new);
        Ok(InPlace::Applied) // or InPlace::NeedsRebuild, to be rebuilt instead
    }
}

#[rewire::tokio::main(crate = "rewire::tokio")]
async fn main() -> Result<std::process::ExitCode, Box<dyn std::error::Error>> {
    rewire::init_logging();
    // Starts every component of the file, and follows the file: each edit is a reload.
    let host = rewire::Host::start("rewire.json").await?;
    // Your own component, as its own type, in the current generation.
    let cache = host.component::<LruCache>("cache", "front")?;
    println!("{:?}", cache.lookup().await?);
    drop(cache); // never keep it: a reload may replace the instance
    let abandoned = host.run_until_stopped().await;
    // Non-zero when a close was abandoned: what it held may not have been released.
    Ok(match abandoned {
        0 => std::process::ExitCode::SUCCESS,
        _ => std::process::ExitCode::FAILURE,
    })
}

/// The in-place update staged until the commit (the guide's §4).
mod staged;
