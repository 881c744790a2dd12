//! Load for the failover stories: tasks writing unique keys through a state
//! store handle and reading them back, counting failed calls and keeping
//! every acknowledged write so it can be found afterwards.
#![allow(dead_code)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use rewire_runtime::{GetRequest, SetRequest, StateStoreHandle};

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

/// Running load; stop it with [`Load::finish`].
pub struct Load {
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Seen>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// Starts `tasks` loops on `handle`; keys are `{prefix}{task}-{n}`.
pub fn start_load(handle: StateStoreHandle, tasks: usize, prefix: &str) -> Load {
    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Mutex::new(Seen::default()));
    let tasks = (0..tasks)
        .map(|task| {
            let (handle, stop, seen, prefix) = (
                handle.clone(),
                stop.clone(),
                seen.clone(),
                prefix.to_string(),
            );
            tokio::spawn(async move {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let (key, value) = (format!("{prefix}{task}-{n}"), n.to_string());
                    let store = match handle.load() {
                        Ok(store) => store,
                        Err(err) => {
                            record(&seen, |s| s.failed.push(err.to_string()));
                            continue;
                        }
                    };
                    let set = SetRequest {
                        key: key.clone(),
                        value: value.clone().into_bytes(),
                        ..SetRequest::default()
                    };
                    if let Err(err) = store.set(set).await {
                        record(&seen, |s| s.failed.push(err.to_string()));
                        continue;
                    }
                    record(&seen, |s| s.acked.push((key.clone(), value.clone())));
                    match store
                        .get(GetRequest {
                            key,
                            ..GetRequest::default()
                        })
                        .await
                    {
                        Ok(Some(entry)) if entry.data == value.as_bytes() => {}
                        Ok(_) => record(&seen, |s| s.missed += 1),
                        Err(err) => record(&seen, |s| s.failed.push(err.to_string())),
                    }
                }
            })
        })
        .collect();
    Load { stop, seen, tasks }
}

fn record(seen: &Mutex<Seen>, f: impl FnOnce(&mut Seen)) {
    f(&mut seen.lock().unwrap_or_else(|p| p.into_inner()));
}

impl Load {
    /// Stops the tasks and returns what they saw.
    pub async fn finish(self) -> Seen {
        self.stop.store(true, Ordering::Relaxed);
        for task in self.tasks {
            let _ = task.await;
        }
        std::mem::take(&mut *self.seen.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// The `data` field of the Dapr-layout hash `key` on the server at `url`.
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

/// Acknowledged writes found on neither server.
pub async fn lost_writes(
    acked: &[(String, String)],
    servers: &[redis::Client],
) -> Vec<(String, String)> {
    let mut lost = Vec::new();
    'writes: for (key, value) in acked {
        for server in servers {
            if stored_value(server, key).await.as_deref() == Some(value.as_str()) {
                continue 'writes;
            }
        }
        lost.push((key.clone(), value.clone()));
    }
    lost
}
