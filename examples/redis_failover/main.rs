//! The user story rewire started from: an operator switches the Redis host
//! to the disaster-recovery server, or rotates the Redis password, and the
//! traffic follows without a restart and without a failed request.
//!
//! See `examples/redis_failover/README.md` for the steps.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rewire::{
    ComponentKey, GetRequest, Registry, Runtime, RuntimeOptions, SetRequest, ValidConfig,
};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt().with_env_filter("info").init();
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/redis_failover");
    std::env::set_current_dir(&dir)?;
    let config = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "rewire.json".into());
    let registry = Registry::collected();
    let valid = ValidConfig::from_path(&dir.join(&config), &registry).map_err(|p| p.to_string())?;
    let options = RuntimeOptions {
        secret_poll_interval: Duration::from_secs(1),
        ..RuntimeOptions::default()
    };
    let runtime = Runtime::start(valid, registry, options).await?;
    let _watch = runtime.watch_config_file(dir.join(&config), Duration::from_secs(30));

    let (ok, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    for worker in 0..4 {
        let (orders, ok, failed) = (runtime.state_store("orders"), ok.clone(), failed.clone());
        tokio::spawn(async move {
            for n in 0u64.. {
                let key = format!("order-{worker}-{}", n % 1000);
                let result = async {
                    let store = orders.load().map_err(|e| e.to_string())?;
                    let set = SetRequest {
                        key: key.clone(),
                        value: n.to_string().into_bytes(),
                        ..SetRequest::default()
                    };
                    store.set(set).await.map_err(|e| e.to_string())?;
                    store
                        .get(GetRequest {
                            key,
                            ..GetRequest::default()
                        })
                        .await
                        .map_err(|e| e.to_string())
                }
                .await;
                match result {
                    Ok(_) => ok.fetch_add(1, Ordering::Relaxed),
                    Err(err) => {
                        tracing::warn!(error = %err, "Request failed.");
                        failed.fetch_add(1, Ordering::Relaxed)
                    }
                };
            }
        });
    }
    let orders = ComponentKey::new("state", "orders");
    let mut ticks = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => break,
            _ = ticks.tick() => {
                let status = runtime.status().await;
                let host = status
                    .components
                    .iter()
                    .find(|c| orders.kind == c.kind.as_str() && *c.name == *orders.name)
                    .and_then(|c| c.metadata.get("redisHost").cloned())
                    .unwrap_or_default();
                println!(
                    "generation {}  redisHost {host}  ok {}  failed {}",
                    status.generation,
                    ok.swap(0, Ordering::Relaxed),
                    failed.swap(0, Ordering::Relaxed)
                );
            }
        }
    }
    runtime.shutdown().await;
    Ok(())
}
