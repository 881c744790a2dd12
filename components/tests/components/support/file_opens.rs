//! Counting the times a file is opened (inotify, through `notify`): how a
//! test sees that a component has read its files again, instead of
//! sleeping and hoping it did.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use notify::event::AccessKind;
use notify::{EventKind, RecommendedWatcher, RecursiveMode, Watcher};
use testkit::certs::replace_file;

/// The opens of one file, counted while this lives.
pub struct FileOpens {
    path: PathBuf,
    opened: Arc<AtomicUsize>,
    _watcher: RecommendedWatcher,
}

impl FileOpens {
    /// Starts counting the opens of `path`. Its folder is watched, so a
    /// file replaced by a rename over it is still counted.
    pub fn of(path: &Path) -> Self {
        let opened = Arc::new(AtomicUsize::new(0));
        let (counted, file) = (Arc::clone(&opened), path.to_path_buf());
        let mut watcher =
            notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
                let Ok(event) = event else { return };
                if matches!(event.kind, EventKind::Access(AccessKind::Open(_)))
                    && event.paths.contains(&file)
                {
                    counted.fetch_add(1, Ordering::SeqCst);
                }
            })
            .expect("an inotify watcher");
        let folder = path.parent().expect("a file in a folder");
        watcher
            .watch(folder, RecursiveMode::NonRecursive)
            .expect("watching the folder");
        Self {
            path: path.to_path_buf(),
            opened,
            _watcher: watcher,
        }
    }

    /// How many times the file was opened so far.
    pub fn count(&self) -> usize {
        self.opened.load(Ordering::SeqCst)
    }

    /// Waits until the file is opened `more` times after now; panics after
    /// `within`.
    pub async fn wait_for_more(&self, more: usize, within: Duration) {
        let target = self.count() + more;
        let deadline = tokio::time::Instant::now() + within;
        while self.count() < target {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{} opened {} of {more} more times within {within:?}",
                self.path.display(),
                self.count() + more - target,
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Waits until `condition` holds; panics after `within`, naming `what`.
pub async fn until(what: &str, within: Duration, mut condition: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + within;
    while !condition() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not within {within:?}: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Writes `text` at `path` (a file a component follows), waits until
/// `warnings` shows it refused, then for three more reads of it; returns
/// the warnings then, so that a test can check the refusal was warned
/// about once however often it was read.
pub async fn warnings_over_rereads(
    path: &Path,
    text: &str,
    within: Duration,
    warnings: impl Fn() -> Vec<String>,
) -> Vec<String> {
    let opens = FileOpens::of(path);
    replace_file(path, text);
    until("the new file is refused", within, || !warnings().is_empty()).await;
    opens.wait_for_more(3, within).await;
    warnings()
}
