//! Files named by component metadata (`local.file`'s `secretsFile`, the
//! `file` config store's `path`) are read bounded: a FIFO, `/dev/zero`, or a
//! watched file swapped for a symlink to one is refused with an error naming
//! the field and the file, never read forever nor waited on forever; the
//! watchers keep the last good content and recover when a good file is
//! written back.

use crate::common;
use crate::support::apollo_server::harness::eventually;
use crate::support::logs;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rewire_runtime::{ConfigQuery, Instance};
use serde_json::json;

/// Far under the 30 s init timeout: a refused file is refused at once.
const PROMPTLY: Duration = Duration::from_secs(10);

fn mkfifo(path: &Path) {
    let status = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .unwrap();
    assert!(status.success(), "mkfifo {}", path.display());
}

/// Replaces `path` atomically with a symlink to `target`.
fn swap_for_symlink(path: &Path, target: &Path) {
    let staged = path.with_extension("staged");
    let _ = std::fs::remove_file(&staged);
    std::os::unix::fs::symlink(target, &staged).unwrap();
    std::fs::rename(&staged, path).unwrap();
}

/// Replaces `path` atomically with a fresh FIFO.
fn swap_for_fifo(path: &Path) {
    let staged = path.with_extension("fifo");
    let _ = std::fs::remove_file(&staged);
    mkfifo(&staged);
    std::fs::rename(&staged, path).unwrap();
}

/// Replaces `path` atomically with a regular file holding `text`.
fn swap_for_text(path: &Path, text: &str) {
    let staged = path.with_extension("tmp");
    std::fs::write(&staged, text).unwrap();
    std::fs::rename(&staged, path).unwrap();
}

/// The files no component may read: a FIFO, a device, a symlink to one.
fn hostile_files(dir: &Path) -> Vec<PathBuf> {
    let fifo = dir.join("fifo.json");
    mkfifo(&fifo);
    let link = dir.join("zero.json");
    std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
    vec![fifo, PathBuf::from("/dev/zero"), link]
}

#[tokio::test]
async fn init_refuses_fifos_devices_and_symlinks_to_them_naming_field_and_file() {
    let dir = tempfile::tempdir().unwrap();
    let stores = [
        ("secret_store", "local.file", "secretsFile"),
        ("config_store", "file", "path"),
    ];
    for path in hostile_files(dir.path()) {
        for (kind, type_name, field) in stores {
            let started = common::start(kind, type_name, json!({ field: path }));
            let outcome = tokio::time::timeout(PROMPTLY, started).await;
            let err = match outcome {
                Err(_) => panic!("{type_name} on {} hung", path.display()),
                Ok(Ok(_)) => panic!("{type_name} read {}", path.display()),
                Ok(Err(err)) => err,
            };
            let shown = path.display().to_string();
            assert!(
                err.contains(&format!("`{field}`"))
                    && err.contains(&shown)
                    && err.contains("not a regular file"),
                "{type_name} on {shown}: {err}"
            );
        }
    }
}

/// Waits until `n` warnings mention `path` and `needle`.
async fn warned(path: &Path, needle: &str, n: usize) {
    let shown = path.display().to_string();
    eventually(&format!("{n} warnings about {shown}"), || {
        logs::lines()
            .iter()
            .filter(|l| l.starts_with("WARN") && l.contains(&shown) && l.contains(needle))
            .count()
            >= n
    })
    .await;
}

#[tokio::test]
async fn the_secrets_watcher_keeps_the_last_good_file_and_recovers() {
    logs::capture();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rotating-secrets.json");
    std::fs::write(&path, r#"{"token": "v1"}"#).unwrap();
    let store =
        match common::start("secret_store", "local.file", json!({"secretsFile": path})).await {
            Ok(Instance::SecretStore(store)) => store,
            other => panic!("{:?}", other.map(|_| ())),
        };
    let token = || async {
        let secret = store.get_secret("token", &HashMap::new()).await.unwrap();
        secret.get("token").map(|v| v.expose().to_string())
    };
    swap_for_symlink(&path, Path::new("/dev/zero"));
    warned(&path, "not a regular file", 1).await;
    assert_eq!(token().await.as_deref(), Some("v1"));

    swap_for_text(&path, r#"{"token": "v2"}"#);
    let deadline = tokio::time::Instant::now() + PROMPTLY;
    while token().await.as_deref() != Some("v2") {
        assert!(tokio::time::Instant::now() < deadline, "never recovered");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A problem is logged once until it clears: the FIFO warns again.
    swap_for_fifo(&path);
    warned(&path, "not a regular file", 2).await;
    assert_eq!(token().await.as_deref(), Some("v2"));
    swap_for_text(&path, r#"{"token": "v3"}"#);
    while token().await.as_deref() != Some("v3") {
        assert!(tokio::time::Instant::now() < deadline, "never recovered");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn the_config_file_watcher_keeps_the_last_good_file_and_recovers() {
    logs::capture();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("watched-config.json");
    std::fs::write(&path, r#"{"k": "v1"}"#).unwrap();
    let store = match common::start("config_store", "file", json!({"path": path})).await {
        Ok(Instance::ConfigStore(store)) => store,
        other => panic!("{:?}", other.map(|_| ())),
    };
    let value = || async {
        let items = store.get(&ConfigQuery::keys(["k"])).await.unwrap();
        items.into_iter().next().map(|i| i.value)
    };
    swap_for_symlink(&path, Path::new("/dev/zero"));
    warned(&path, "not a regular file", 1).await;
    assert_eq!(value().await.as_deref(), Some("v1"));

    swap_for_text(&path, r#"{"k": "v2"}"#);
    let deadline = tokio::time::Instant::now() + PROMPTLY;
    while value().await.as_deref() != Some("v2") {
        assert!(tokio::time::Instant::now() < deadline, "never recovered");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A problem is logged once until it clears: the FIFO warns again.
    swap_for_fifo(&path);
    warned(&path, "not a regular file", 2).await;
    assert_eq!(value().await.as_deref(), Some("v2"));
    swap_for_text(&path, r#"{"k": "v3"}"#);
    while value().await.as_deref() != Some("v3") {
        assert!(tokio::time::Instant::now() < deadline, "never recovered");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
