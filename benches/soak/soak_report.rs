//! What the soak measures besides requests: the resident set size (from
//! `/proc/self/status`), the machine's load average, percentiles, and the
//! Markdown tables it prints.

use std::time::Duration;

/// The resident set size in KiB (`VmRSS` in `/proc/self/status`), where
/// the system tells it.
pub fn rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// `kib` as MiB with one decimal.
pub fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

/// The 1, 5 and 15 minute load averages.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|text| {
            text.split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_else(|| "unknown".into())
}

/// RSS samples taken after the warm-up: (seconds since warm-up, KiB).
#[derive(Debug, Default)]
pub struct RssTrend {
    samples: Vec<(f64, u64)>,
}

impl RssTrend {
    /// Adds a sample.
    pub fn push(&mut self, seconds: f64, kib: u64) {
        self.samples.push((seconds, kib));
    }

    /// Least-squares slope in KiB per minute, with two samples or more.
    pub fn slope_kib_per_min(&self) -> Option<f64> {
        let n = self.samples.len() as f64;
        if self.samples.len() < 2 {
            return None;
        }
        let mean_t = self.samples.iter().map(|(t, _)| t).sum::<f64>() / n;
        let mean_r = self.samples.iter().map(|(_, r)| *r as f64).sum::<f64>() / n;
        let (mut cov, mut var) = (0.0, 0.0);
        for (t, r) in &self.samples {
            cov += (t - mean_t) * (*r as f64 - mean_r);
            var += (t - mean_t) * (t - mean_t);
        }
        (var > 0.0).then(|| cov / var * 60.0)
    }

    /// The highest sample.
    pub fn peak(&self) -> Option<u64> {
        self.samples.iter().map(|(_, r)| *r).max()
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.samples.len()
    }
}

/// A duration with a unit that keeps three significant figures.
pub fn human(d: Duration) -> String {
    let ns = d.as_secs_f64() * 1e9;
    if ns < 1e3 {
        format!("{ns:.0} ns")
    } else if ns < 1e6 {
        format!("{:.1} µs", ns / 1e3)
    } else if ns < 1e9 {
        format!("{:.2} ms", ns / 1e6)
    } else {
        format!("{:.2} s", ns / 1e9)
    }
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
