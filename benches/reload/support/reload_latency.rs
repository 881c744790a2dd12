//! Measurement 2, reload latency: a change applied in place, a change that
//! rebuilds a component, and validating the same configuration as the
//! baseline.

use std::time::{Duration, Instant};

use rewire::config::validate;
use rewire::{Action, Outcome, Registry, Runtime, RuntimeOptions};

use super::timing::{human, per_op, Mode};
use super::{on_worker, parsed, print_table, valid};

/// A memory state store (takes metadata in place), a lock, and a no-op
/// node using the lock whose `shape` change it refuses (so it is rebuilt).
/// Either change impacts one component: nothing depends on either.
fn config(ttl: u64, shape: u64) -> String {
    serde_json::json!({
        "appId": "bench",
        "components": {
            "state": {"orders": {"type": "memory", "metadata": {"defaultTtlInSeconds": ttl}}},
            "lock": {"locks": {"type": "memory"}},
            "bench": {"probe": {"type": "bench.node", "metadata": {"epoch": 0, "shape": shape},
                                "componentRef": [{"type": "lock", "name": "locks"}]}}
        }
    })
    .to_string()
}

/// Measures and prints the reload latency table.
pub fn run(rt: &tokio::runtime::Runtime, mode: Mode) {
    println!("## 2. Reload latency (3 components; each reload = parse + `Runtime::apply`)\n");
    let registry = Registry::collected();
    let ops = mode.ops(500);
    let runtime = rt
        .block_on(Runtime::start(
            valid(&config(0, 0), &registry),
            registry.clone(),
            RuntimeOptions::default(),
        ))
        .expect("start failed");
    // The three are measured back to back in every run. Each alternates
    // between two configurations, so every reload is a change; `ttl` and
    // `shape` track what the runtime runs.
    let (mut ttl, mut shape) = (0, 0);
    let times = mode.plan().interleaved(3, |variant| {
        let texts: Vec<String> = (0..ops)
            .map(|i| match variant {
                0 => config(i % 2, 0),
                1 => {
                    ttl = 1 - ttl;
                    config(ttl, shape)
                }
                _ => {
                    shape = 1 - shape;
                    config(ttl, shape)
                }
            })
            .collect();
        let runtime = runtime.clone();
        match variant {
            0 => {
                // Baseline: parse + validate of the texts a reload applies.
                let started = Instant::now();
                for text in &texts {
                    std::hint::black_box(validate(parsed(text), &registry).ok());
                }
                per_op(started.elapsed(), ops)
            }
            1 => rt.block_on(on_worker(async move {
                timed_applies(&runtime, &texts, "state/orders", Action::UpdatedInPlace).await
            })),
            _ => rt.block_on(on_worker(async move {
                timed_applies(&runtime, &texts, "bench/probe", Action::Rebuilt).await
            })),
        }
    });
    rt.block_on(runtime.shutdown());

    let rows = vec![
        vec![
            "validate only: parse + validate (baseline)".into(),
            human(times.median(0)),
            "1.00×".into(),
            "—".into(),
        ],
        vec![
            "in place: `state/orders` metadata".into(),
            human(times.median(1)),
            times.ratio(1, 0),
            "1.00×".into(),
        ],
        vec![
            "rebuild: `bench/probe` refuses its change".into(),
            human(times.median(2)),
            times.ratio(2, 0),
            times.ratio(2, 1),
        ],
    ];
    print_table(
        &["reload", "latency", "vs validate only", "vs in place"],
        &rows,
    );
}

/// Applies `texts` one after the other; time per reload. Each reload must
/// apply with `expected` for `component`.
async fn timed_applies(
    runtime: &Runtime,
    texts: &[String],
    component: &str,
    expected: Action,
) -> Duration {
    let mut total = Duration::ZERO;
    for text in texts {
        let started = Instant::now();
        let record = runtime.apply(parsed(text)).await.expect("reload failed");
        total += started.elapsed();
        assert_eq!(
            record.outcome,
            Outcome::Applied,
            "bench reload did not apply"
        );
        assert_eq!(
            record.actions.get(component),
            Some(&expected),
            "bench reload took another path: {:?}",
            record.actions
        );
    }
    per_op(total, texts.len() as u64)
}
