//! The configuration sources' reads, run on demand: a control-plane change
//! first has what was saved to the file before it read and queued (the
//! watch settles events for 100 ms before reading), so the change is laid
//! over the file's newer content, not under it.

use std::sync::Mutex;

use tokio_util::sync::CancellationToken;

use crate::fs_watch::OnChange;

/// The reads of the watches running (one per runtime).
#[derive(Default)]
pub(crate) struct SourceReads {
    /// Each watch's read, until its watch stops.
    reads: Mutex<Vec<(CancellationToken, OnChange)>>,
}

impl SourceReads {
    /// Adds the read of a watch that ends when `stop` is cancelled.
    pub(crate) fn register(&self, stop: CancellationToken, read: OnChange) {
        let mut reads = self.reads.lock().unwrap_or_else(|p| p.into_inner());
        reads.retain(|(stop, _)| !stop.is_cancelled());
        reads.push((stop, read));
    }

    /// Runs every running watch's read now, one after the other (each is
    /// bounded in time as a watch's own read is, and waits for one in
    /// progress), sending what changed to the reload queue.
    pub(crate) async fn read_now(&self) {
        let reads: Vec<OnChange> = {
            let mut reads = self.reads.lock().unwrap_or_else(|p| p.into_inner());
            reads.retain(|(stop, _)| !stop.is_cancelled());
            reads.iter().map(|(_, read)| read.clone()).collect()
        };
        for read in reads {
            read().await;
        }
    }
}
