//! Measurement 3, scaling: how validation (of everything, and of a
//! one-component change), the graph, the diff, a one-component reload and
//! start-up grow with the number of components.

use std::hint::black_box;
use std::time::{Duration, Instant};

use rewire::config::{validate, ComponentRef, ComponentSpec, ConfigDiff, ValidConfig};
use rewire::{Action, ComponentKey, Config, Outcome, Registry, Runtime, RuntimeOptions};

use super::timing::{human, per_op, Mode};
use super::{on_worker, parsed, print_table};

/// Components per level: node `i` references node `i - width`.
/// `REWIRE_BENCH_WIDTH` overrides it (to see what the number of levels
/// costs at a given size).
fn width() -> usize {
    std::env::var("REWIRE_BENCH_WIDTH")
        .ok()
        .and_then(|w| w.parse().ok())
        .filter(|w| *w > 0)
        .unwrap_or(100)
}

/// The numbers of components measured; `REWIRE_BENCH_SIZES=10000` (a
/// comma-separated list) measures those alone, as for a profile of one size.
fn sizes(mode: Mode) -> Vec<usize> {
    let chosen: Vec<usize> = std::env::var("REWIRE_BENCH_SIZES")
        .unwrap_or_default()
        .split(',')
        .filter_map(|n| n.trim().parse().ok())
        .filter(|n| *n > 0)
        .collect();
    match mode {
        _ if !chosen.is_empty() => chosen,
        Mode::Smoke => vec![10, 100],
        Mode::Quick | Mode::Full => vec![10, 100, 1_000, 10_000],
    }
}

/// `n` no-op nodes in levels of `width`, each referencing the node one
/// level up; the last node's `epoch` is `leaf_epoch` (an in-place change).
fn config(n: usize, width: usize, leaf_epoch: u64) -> Config {
    let nodes: serde_json::Map<String, serde_json::Value> = (0..n)
        .map(|i| {
            let epoch = if i + 1 == n { leaf_epoch } else { 0 };
            let mut node =
                serde_json::json!({"type": "bench.node", "metadata": {"epoch": epoch, "shape": 0}});
            if i >= width {
                node["componentRef"] =
                    serde_json::json!([{"type": "bench", "name": name(i - width)}]);
            }
            (name(i), node)
        })
        .collect();
    parsed(&serde_json::json!({"appId": "bench", "components": {"bench": nodes}}).to_string())
}

fn name(i: usize) -> String {
    format!("n{i:05}")
}

/// A copy of `config` with every declaration copied too, key names
/// included, as a reload gets from a freshly read file (a `clone` shares
/// the declarations, and a key's clone its name).
fn fresh_copy(config: &Config) -> Config {
    let fresh_key = |key: &ComponentKey| ComponentKey::new(key.kind.clone(), &*key.name);
    let copy = |spec: &ComponentSpec, key: &ComponentKey| ComponentSpec {
        key: key.clone(),
        component_refs: spec
            .component_refs
            .iter()
            .map(|r| ComponentRef {
                key: fresh_key(&r.key),
            })
            .collect(),
        ..ComponentSpec::clone(spec)
    };
    Config {
        app_id: config.app_id.clone(),
        components: config
            .components
            .iter()
            .map(|(key, spec)| {
                let key = fresh_key(key);
                let spec = copy(spec, &key);
                (key, spec)
            })
            .collect(),
        overlay: config.overlay.clone(),
        sections: config.sections.clone(),
        base_dir: config.base_dir.clone(),
    }
}

/// [`fresh_copy`] of a validated configuration, as start-up gets it.
fn fresh_valid_copy(valid: &ValidConfig) -> ValidConfig {
    ValidConfig {
        config: fresh_copy(&valid.config),
        graph: valid.graph.clone(),
    }
}

/// One row of measurements.
struct Row {
    n: usize,
    levels: usize,
    floor: Duration,
    validate: Duration,
    validate_change: Duration,
    graph_levels: Duration,
    diff: Duration,
    apply: Duration,
    start: Duration,
}

/// Measures and prints the scaling table.
pub fn run(rt: &tokio::runtime::Runtime, mode: Mode) {
    let width = width();
    println!(
        "## 3. Scaling with the number of components (levels of {width}, one componentRef each)\n"
    );
    let sizes = sizes(mode);
    let registry = Registry::collected();
    let plan = mode.plan();
    let mut rows: Vec<Row> = Vec::new();
    for &n in &sizes {
        let budget = |per_component: u64| mode.ops((per_component / n as u64).max(1));
        let a = config(n, width, 0);
        let b = config(n, width, 1);

        let ops = budget(20_000);
        // The floor under validation: one tight pass that reads a byte of
        // every heap block of every component, on a fresh copy as
        // validation gets. Its growth is the memory hierarchy's.
        let floor_time = plan.median(|| {
            let mut total = Duration::ZERO;
            for _ in 0..ops {
                let candidate = fresh_copy(&a);
                let started = Instant::now();
                black_box(touch_every_block(&candidate));
                total += started.elapsed();
                drop(candidate);
            }
            per_op(total, ops)
        });
        let validate_time = plan.median(|| {
            let mut total = Duration::ZERO;
            for _ in 0..ops {
                let candidate = fresh_copy(&a);
                let started = Instant::now();
                let valid = black_box(validate(candidate, &registry).ok());
                total += started.elapsed();
                // Its caller keeps the result (it becomes the running
                // configuration): freeing it is not validation's cost.
                drop(valid);
            }
            per_op(total, ops)
        });
        let valid_a = validate(a.clone(), &registry).expect("invalid");
        let levels = valid_a.graph.levels().len();
        // A reload's validation: `b` changes one leaf's metadata, and what
        // is declared as in `a` passed already (the diff by digests included).
        let change_time = plan.median(|| {
            let mut total = Duration::ZERO;
            for _ in 0..ops {
                let candidate = fresh_copy(&b);
                let started = Instant::now();
                let valid = black_box(valid_a.validate_next(candidate, &registry).ok());
                total += started.elapsed();
                drop(valid);
            }
            per_op(total, ops)
        });

        let ops = budget(200_000);
        let levels_time = plan.median(|| {
            let started = Instant::now();
            for _ in 0..ops {
                black_box(valid_a.graph.levels());
            }
            per_op(started.elapsed(), ops)
        });
        let diff_time = plan.median(|| {
            let started = Instant::now();
            for _ in 0..ops {
                let diff = ConfigDiff::between(black_box(&a), black_box(&b));
                black_box(diff);
            }
            per_op(started.elapsed(), ops)
        });

        let ops = budget(20_000);
        let runtime = rt
            .block_on(Runtime::start(
                valid_a.clone(),
                registry.clone(),
                RuntimeOptions::default(),
            ))
            .expect("start failed");
        let mut flip = false;
        let apply_time = rt.block_on(plan.median_async(|| {
            let candidates: Vec<Config> = (0..ops)
                .map(|_| {
                    flip = !flip;
                    fresh_copy(if flip { &b } else { &a })
                })
                .collect();
            let runtime = runtime.clone();
            on_worker(async move { timed_applies(&runtime, candidates).await })
        }));
        rt.block_on(runtime.shutdown());

        // Five starts per sample at 10,000 components (one was too few for
        // a steady median: the growth swung between ×11 and ×22).
        let ops = budget(50_000);
        let start_time = rt.block_on(plan.median_async(|| {
            let valid_a = valid_a.clone();
            let registry = registry.clone();
            on_worker(async move {
                let mut total = Duration::ZERO;
                for _ in 0..ops {
                    let (config, registry) = (fresh_valid_copy(&valid_a), registry.clone());
                    let started = Instant::now();
                    let runtime = Runtime::start(config, registry, RuntimeOptions::default())
                        .await
                        .expect("start failed");
                    total += started.elapsed();
                    runtime.shutdown().await;
                }
                per_op(total, ops)
            })
        }));
        rows.push(Row {
            n,
            levels,
            floor: floor_time,
            validate: validate_time,
            validate_change: change_time,
            graph_levels: levels_time,
            diff: diff_time,
            apply: apply_time,
            start: start_time,
        });
    }
    print_rows(&rows);
}

/// Reads the first byte of every heap block the components of `config`
/// own: name, type, metadata node and field names, references.
fn touch_every_block(config: &Config) -> usize {
    let first = |text: &str| text.bytes().next().map_or(0, usize::from);
    config
        .components
        .iter()
        .map(|(key, spec)| {
            let metadata: usize = spec.metadata.keys().map(|field| first(field)).sum();
            let refs: usize = spec.component_refs.iter().map(|r| first(&r.key.name)).sum();
            first(&key.name) + first(&spec.key.name) + first(&spec.type_name) + metadata + refs
        })
        .sum()
}

/// Applies each candidate (each changes one leaf's metadata in place).
async fn timed_applies(runtime: &Runtime, candidates: Vec<Config>) -> Duration {
    let count = candidates.len() as u64;
    let mut total = Duration::ZERO;
    for candidate in candidates {
        let started = Instant::now();
        let record = runtime.apply(candidate).await.expect("reload failed");
        total += started.elapsed();
        assert_eq!(
            record.outcome,
            Outcome::Applied,
            "bench reload did not apply"
        );
        let in_place = record
            .actions
            .values()
            .filter(|a| **a == Action::UpdatedInPlace)
            .count();
        let changed = record
            .actions
            .values()
            .filter(|a| **a != Action::Unchanged)
            .count();
        assert_eq!(
            (in_place, changed),
            (1, 1),
            "one component should change, in place"
        );
    }
    per_op(total, count)
}

fn print_rows(rows: &[Row]) {
    let cell = |row: &Row, prev: Option<&Row>, pick: fn(&Row) -> Duration| match prev {
        Some(prev) => format!(
            "{} (×{:.1})",
            human(pick(row)),
            pick(row).as_secs_f64() / pick(prev).as_secs_f64()
        ),
        None => human(pick(row)),
    };
    let table: Vec<Vec<String>> = rows
        .iter()
        .enumerate()
        .map(|(i, row)| {
            let prev = i.checked_sub(1).map(|p| &rows[p]);
            vec![
                row.n.to_string(),
                row.levels.to_string(),
                cell(row, prev, |r| r.floor),
                cell(row, prev, |r| r.validate),
                cell(row, prev, |r| r.validate_change),
                cell(row, prev, |r| r.graph_levels),
                cell(row, prev, |r| r.diff),
                cell(row, prev, |r| r.apply),
                cell(row, prev, |r| r.start),
            ]
        })
        .collect();
    print_table(
        &[
            "components",
            "levels",
            "floor: read every block",
            "validate all",
            "validate a change",
            "graph levels",
            "diff",
            "apply 1 change",
            "start",
        ],
        &table,
    );
    println!("(×g) = growth against the row above (10× the components); ×10 is linear. `validate all` is start-up's (every component, as `validate`); `validate a change` is a reload's (`ValidConfig::validate_next`, one leaf's metadata changed). The floor reads a byte of every heap block of every component in one tight pass: its growth past ×10 is the memory hierarchy's, not the code's.\n");
}
