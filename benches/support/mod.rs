//! The pieces of the `reload` bench: its components, its timing loop, and
//! one module per measurement.

pub mod components;
pub mod failed_requests;
pub mod handle_load;
pub mod reload_latency;
pub mod scaling;
pub mod timing;

use rewire::config::{parse, validate};
use rewire::{Config, Registry, ValidConfig};

/// Runs `future` as a task on the tokio workers, as a reload triggered
/// inside a service runs (not on the thread blocked on the runtime).
pub async fn on_worker<T: Send + 'static>(
    future: impl std::future::Future<Output = T> + Send + 'static,
) -> T {
    tokio::spawn(future)
        .await
        .unwrap_or_else(|e| panic!("bench task failed: {e}"))
}

/// Parses a configuration the bench wrote (a parse error is a bench bug).
pub fn parsed(text: &str) -> Config {
    parse(text.as_bytes()).unwrap_or_else(|p| panic!("bench config does not parse:\n{p}"))
}

/// Parses and validates a configuration the bench wrote.
pub fn valid(text: &str, registry: &Registry) -> ValidConfig {
    validate(parsed(text), registry).unwrap_or_else(|p| panic!("bench config is invalid:\n{p}"))
}

/// Prints a Markdown table: a header row and aligned rows.
pub fn print_table(header: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c}{}", " ".repeat(w - c.chars().count())))
            .collect();
        println!("| {} |", padded.join(" | "));
    };
    line(header.iter().map(ToString::to_string).collect());
    line(widths.iter().map(|w| "-".repeat(*w)).collect());
    for row in rows {
        line(row.clone());
    }
    println!();
}
