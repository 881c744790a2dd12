//! A load driver for the failover stories: tasks writing unique keys and
//! reading them back through a caller-given operation, counting failed calls
//! and keeping every acknowledged write so it can be found afterwards.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The longest one round may take: past it the round counts as failed
/// (and the load goes on), so a hung call fails the test, never hangs it.
const ROUND_WITHIN: Duration = Duration::from_secs(30);

/// What the load saw.
#[derive(Debug, Default)]
pub struct Seen {
    /// Writes acknowledged: (key, value).
    pub acked: Vec<(String, String)>,
    /// Read-backs that missed (the write landed on the old server and the
    /// read on the new one, at the switch itself).
    pub missed: u64,
    /// Calls that returned an error, with the error.
    pub failed: Vec<String>,
}

/// What one write-then-read-back did.
#[derive(Debug)]
pub enum Round {
    /// The write failed (or no store could be had).
    WriteFailed(String),
    /// The write was acknowledged; then the read-back...
    Written(ReadBack),
}

/// The read-back after an acknowledged write.
#[derive(Debug)]
pub enum ReadBack {
    /// ...found the value written.
    Same,
    /// ...found nothing or another value.
    Missed,
    /// ...failed.
    Failed(String),
}

/// Running load; stop it with [`Load::finish`].
pub struct Load {
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Seen>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    /// Starts `tasks` loops calling `round(key, value)`; keys are
    /// `{prefix}{task}-{n}`, values `n`.
    pub fn start<F, Fut>(tasks: usize, prefix: &str, round: F) -> Self
    where
        F: Fn(String, String) -> Fut + Clone + Send + 'static,
        Fut: Future<Output = Round> + Send,
    {
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Seen::default()));
        let tasks = (0..tasks)
            .map(|task| {
                let (round, stop, seen, prefix) = (
                    round.clone(),
                    stop.clone(),
                    seen.clone(),
                    prefix.to_string(),
                );
                tokio::spawn(async move {
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        n += 1;
                        let (key, value) = (format!("{prefix}{task}-{n}"), n.to_string());
                        let bounded =
                            tokio::time::timeout(ROUND_WITHIN, round(key.clone(), value.clone()));
                        let outcome = bounded.await.unwrap_or_else(|_| {
                            Round::WriteFailed(format!("{key}: no answer in {ROUND_WITHIN:?}"))
                        });
                        match outcome {
                            Round::WriteFailed(err) => record(&seen, |s| s.failed.push(err)),
                            Round::Written(read_back) => record(&seen, |s| {
                                s.acked.push((key, value));
                                match read_back {
                                    ReadBack::Same => {}
                                    ReadBack::Missed => s.missed += 1,
                                    ReadBack::Failed(err) => s.failed.push(err),
                                }
                            }),
                        }
                    }
                })
            })
            .collect();
        Self { stop, seen, tasks }
    }

    /// Stops the tasks and returns what they saw (each task ends within
    /// one bounded round).
    pub async fn finish(self) -> Seen {
        self.stop.store(true, Ordering::Relaxed);
        for task in self.tasks {
            let _ = tokio::time::timeout(ROUND_WITHIN * 2, task).await;
        }
        std::mem::take(&mut *self.seen.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

fn record(seen: &Mutex<Seen>, f: impl FnOnce(&mut Seen)) {
    f(&mut seen.lock().unwrap_or_else(|p| p.into_inner()));
}

/// The `data` field of the Dapr-layout hash `key` on the server of `client`.
pub async fn stored_value(client: &redis::Client, key: &str) -> Option<String> {
    let mut connection = client.get_multiplexed_async_connection().await.ok()?;
    redis::cmd("HGET")
        .arg(key)
        .arg("data")
        .query_async::<Option<String>>(&mut connection)
        .await
        .ok()
        .flatten()
}

/// Acknowledged writes found on none of `servers`.
pub async fn lost_writes(
    acked: &[(String, String)],
    servers: &[redis::Client],
) -> Vec<(String, String)> {
    // One connection per server for every lookup (a TLS handshake each
    // would dominate the test's time).
    let mut connections = Vec::with_capacity(servers.len());
    for server in servers {
        connections.push(server.get_multiplexed_async_connection().await.ok());
    }
    let mut lost = Vec::new();
    'writes: for (key, value) in acked {
        for connection in connections.iter_mut().flatten() {
            let stored = redis::cmd("HGET")
                .arg(key)
                .arg("data")
                .query_async::<Option<String>>(connection)
                .await
                .ok()
                .flatten();
            if stored.as_deref() == Some(value.as_str()) {
                continue 'writes;
            }
        }
        lost.push((key.clone(), value.clone()));
    }
    lost
}
