//! [`Stall`]: Open API requests that wait before or after they are done,
//! to play a slow portal (a write racing another) or one whose answer is
//! lost after it acted (the client times out on a done request).

use super::{AppState, Shared};

/// An Open API request made to wait until [`Shared::stall`] lifts it (or
/// the server stops).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stall {
    /// Edits (put, delete) of this item wait before they are made.
    ItemBefore(String),
    /// Edits of this item are made, then the answer waits.
    ItemAfter(String),
    /// Releases are made, then the answer waits.
    ReleaseAfter,
}

impl Shared {
    /// Stalls the Open API requests `stall` names; `None` lifts it.
    pub fn stall(&self, stall: Option<Stall>) {
        self.stall.send_replace(stall);
    }

    /// Open API requests waiting in a stall right now.
    pub fn stalled(&self) -> usize {
        *self.stalled.borrow()
    }
}

/// Waits while `this` is the stall in force (or until the server stops).
pub(super) async fn wait_out(app: &AppState, this: Stall) {
    let mut stall = app.shared.stall.subscribe();
    if stall.borrow().as_ref() != Some(&this) {
        return;
    }
    app.shared.stalled.send_modify(|n| *n += 1);
    tokio::select! {
        _ = stall.wait_for(|s| s.as_ref() != Some(&this)) => {}
        () = app.stop.cancelled() => {}
    }
    app.shared.stalled.send_modify(|n| *n -= 1);
}
