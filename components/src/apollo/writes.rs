//! Multi-item writes through the Open API that leave nothing behind when
//! they fail.
//!
//! The Open API edits one item per request, into the namespace's draft;
//! a release publishes the whole draft. A write that failed half-way would
//! leave its first items in the draft, where the next release (ours or
//! anyone's, from the portal) publishes them. So every key is checked
//! before the first request, and when a request fails the edits not
//! released are put back as the store last read them from the release (an
//! item the release did not have is deleted), last edited first, before
//! the error is returned.
//!
//! * **Refused or unknown.** A request the portal answered with a 4xx
//!   status was refused: nothing of it was done, and the edits before it
//!   are undone. A request without answer (no connection, timeout) or
//!   answered with a 5xx (a gateway's 502/503/504, or a portal's 500
//!   after the release or edit went through) may have been done: it is
//!   not undone — undoing a release that went through would revert it in
//!   the draft, and an edit still in flight at the portal could land
//!   after its undo. The error then says the outcome is unknown and names
//!   the keys (a namespace whose release is in doubt is read back, so
//!   reads show what happened); the edits known not to be released are
//!   still undone.
//! * **Reading back.** A released namespace is read back in the write's
//!   turn, all read-backs of a write within `requestTimeoutMs` in total
//!   (one left over is the long poll's to catch up). Their backup files
//!   are left to the store's backup writer, so a hung backup folder holds
//!   no write.
//! * **Undo failing too.** If putting one back fails (the portal went down
//!   mid-write), the error names the keys that may be left edited in the
//!   draft: they stay unreleased until someone releases or reverts the
//!   namespace. After an undo without answer the rest is not tried (each
//!   would wait out the timeout too).
//! * **One write at a time.** The component runs its writes one after
//!   the other (the caller's deadline bounds the wait), each in a task of
//!   its own, so that neither another write's edits nor a caller giving up
//!   half-way splits one: otherwise writer A's undo could put back a key
//!   writer B had set and been told was written, or A's edits left in the
//!   draft be published by B's release. The turn is the component's, not
//!   one instance's: an instance rebuilt by a metadata change (a rotated
//!   `open_api_token`) waits for its predecessor's write, and `close`
//!   waits (bounded) for the write in flight, so shutting down does not
//!   cut one between an edit and its release or undo.
//! * **Known limit.** Nothing orders these writes with those of another
//!   process (another sidecar, a user of the portal) on the same
//!   namespace: Apollo's Open API has no compare-and-set. A release
//!   publishes whatever the draft holds, their unreleased edits included,
//!   and an undo puts back the value of the release this store last read
//!   (older still if reading it back after a write failed and the long
//!   poll has not caught up), over an edit they made meanwhile.

use std::time::Duration;

use rewire_runtime::ConfigError;
use tokio::time::Instant;
use tracing::warn;

use super::error::ApolloError;
use super::namespaces::LiveNamespaces;
use super::open_api::OpenApiClient;
use super::refresh::Refresher;

/// One item edit: `value` `None` deletes `key` of `namespace`.
#[derive(Debug, Clone)]
pub(crate) struct Edit {
    pub namespace: String,
    pub key: String,
    pub value: Option<String>,
}

/// Refuses an item no Apollo takes, before anything is written. A value
/// longer than the portal's `item.value.length.limit` (20,000 UTF-16
/// units by default, raised by some admins) is left for the portal to
/// refuse: the edits made before it are then undone.
pub(crate) fn check_item(key: &str) -> Result<(), ConfigError> {
    if key.is_empty() {
        return Err(ConfigError::Invalid("an item has an empty key".into()));
    }
    Ok(())
}

/// Makes `edits` (checked), then releases each namespace they touch and
/// reads it back through `read_back`. A failure is answered as the module
/// docs say. The caller runs one at a time.
pub(crate) async fn write(
    open_api: &OpenApiClient,
    read_back: &mut ReadBack<'_>,
    edits: &[Edit],
) -> Result<(), ConfigError> {
    apply(open_api, &read_back.refresher.live, edits).await?;
    let touched = namespaces_of(edits);
    for (index, namespace) in touched.iter().enumerate() {
        if let Err(err) = open_api.release(namespace).await {
            let failed = FailedRelease {
                touched: &touched,
                index,
                err: &err,
            };
            return Err(failed.answer(open_api, read_back, edits).await);
        }
        read_back.namespace(namespace).await;
    }
    Ok(())
}

/// Whether the portal refused `err`'s request (so did nothing of it),
/// rather than gave no answer or a server error (so may have done it).
fn refused(err: &ApolloError) -> bool {
    match err {
        ApolloError::Unauthorized { .. } => true,
        ApolloError::Status { status, .. } => *status < 500,
        _ => false,
    }
}

/// The namespaces `edits` touch, in their order.
fn namespaces_of(edits: &[Edit]) -> Vec<&str> {
    let mut touched: Vec<&str> = Vec::new();
    for edit in edits {
        if !touched.contains(&edit.namespace.as_str()) {
            touched.push(&edit.namespace);
        }
    }
    touched
}

/// The read-backs of one write: bounded together by `budget` (counted
/// from the first); each namespace read back once.
pub(crate) struct ReadBack<'r> {
    refresher: &'r Refresher,
    budget: Duration,
    deadline: Option<Instant>,
    read: Vec<String>,
}

impl<'r> ReadBack<'r> {
    /// Read-backs through `refresher`, `budget` for them all.
    pub(crate) fn new(refresher: &'r Refresher, budget: Duration) -> Self {
        Self {
            refresher,
            budget,
            deadline: None,
            read: Vec::new(),
        }
    }

    /// Reads `namespace` back, if the budget allows; a failed or cut
    /// read-back is left to the long poll.
    async fn namespace(&mut self, namespace: &str) {
        if self.read.iter().any(|n| n == namespace) {
            return;
        }
        let deadline = *self
            .deadline
            .get_or_insert_with(|| Instant::now() + self.budget);
        let fetched = tokio::time::timeout_at(deadline, self.refresher.refresh(namespace));
        let err = match fetched.await {
            Ok(Ok(_)) => return self.read.push(namespace.to_string()),
            Ok(Err(err)) => err.to_string(),
            Err(_) => format!(
                "no answer within requestTimeoutMs ({:?}) for the write's read-backs",
                self.budget
            ),
        };
        warn!(component = %self.refresher.key, namespace, error = %err, "Released, but reading the namespace back failed; the long poll will catch up.");
    }
}

/// Makes `edits` in order; on a failure, undoes the ones made (see the
/// module docs) and returns the error.
async fn apply(
    open_api: &OpenApiClient,
    live: &LiveNamespaces,
    edits: &[Edit],
) -> Result<(), ConfigError> {
    let mut made: Vec<(&Edit, Option<String>)> = Vec::with_capacity(edits.len());
    for edit in edits {
        let before = live.value(&edit.namespace, &edit.key);
        if let Err(err) = make(open_api, edit).await {
            let mut outcome = vec![err.to_string()];
            if !refused(&err) {
                outcome.push(format!(
                    "whether this edit of `{}` was made is unknown (no answer, or a server error): it may be in namespace `{}`'s draft, where a later release publishes it",
                    edit.key, edit.namespace
                ));
            }
            outcome.extend(undo(open_api, &made).await.describe("made before it"));
            return Err(ConfigError::Backend(outcome.join("; ")));
        }
        made.push((edit, before));
    }
    Ok(())
}

/// The release of `touched[index]` failed with `err`.
struct FailedRelease<'a> {
    touched: &'a [&'a str],
    index: usize,
    err: &'a ApolloError,
}

impl FailedRelease<'_> {
    /// Undoes the edits known not to be released; the error to return.
    async fn answer(
        &self,
        open_api: &OpenApiClient,
        read_back: &mut ReadBack<'_>,
        edits: &[Edit],
    ) -> ConfigError {
        let namespace = self.touched[self.index];
        let refused = refused(self.err);
        let unreleased = match refused {
            true => &self.touched[self.index..],
            false => &self.touched[self.index + 1..],
        };
        let mut outcome = vec![self.err.to_string()];
        if self.index > 0 {
            outcome.push(format!(
                "released before it: {}",
                shown_keys(&self.touched[..self.index])
            ));
        }
        if !refused {
            read_back.namespace(namespace).await;
            let keys: Vec<&str> = edits
                .iter()
                .filter(|e| e.namespace == namespace)
                .map(|e| e.key.as_str())
                .collect();
            outcome.push(format!(
                "whether namespace `{namespace}` was released is unknown (no answer, or a server error): its edits of {} are either published or left in its draft, where a later release publishes them",
                shown_keys(&keys)
            ));
        }
        let live = &read_back.refresher.live;
        let made: Vec<(&Edit, Option<String>)> = edits
            .iter()
            .filter(|e| unreleased.contains(&e.namespace.as_str()))
            .map(|e| (e, live.value(&e.namespace, &e.key)))
            .collect();
        outcome.extend(undo(open_api, &made).await.describe("not released"));
        ConfigError::Backend(outcome.join("; "))
    }
}

async fn make(open_api: &OpenApiClient, edit: &Edit) -> Result<(), ApolloError> {
    match &edit.value {
        Some(value) => open_api.put_item(&edit.namespace, &edit.key, value).await,
        None => open_api.delete_item(&edit.namespace, &edit.key).await,
    }
}

/// What [`undo`] did.
struct Undone {
    /// Edits there were to undo.
    edits: usize,
    /// Keys that may be left edited.
    left: Vec<String>,
}

impl Undone {
    /// The outcome for the error, `which` saying which edits they were;
    /// `None` when there was nothing to undo.
    fn describe(&self, which: &str) -> Option<String> {
        match (self.edits, self.left.is_empty()) {
            (0, _) => None,
            (edits, true) => Some(format!("the {edits} item edit(s) {which} were undone")),
            _ => Some(format!(
                "undoing the edits {which} failed for {}: they may be left edited in the namespace's draft, where a later release publishes them",
                shown_keys(&self.left)
            )),
        }
    }
}

/// Puts `made` (edits and the values before them) back, last first. After
/// an undo without answer the rest is not tried: the portal is not
/// answering.
async fn undo(open_api: &OpenApiClient, made: &[(&Edit, Option<String>)]) -> Undone {
    let mut left: Vec<String> = Vec::new();
    let mut answering = true;
    for (edit, before) in made.iter().rev() {
        if edit.value.is_none() && before.is_none() {
            continue;
        }
        if answering {
            let back = Edit {
                namespace: edit.namespace.clone(),
                key: edit.key.clone(),
                value: before.clone(),
            };
            let Err(undo_err) = make(open_api, &back).await else {
                continue;
            };
            warn!(namespace = %edit.namespace, key = %edit.key, error = %undo_err, "Apollo item not put back after a failed write.");
            answering = refused(&undo_err);
        }
        if !left.contains(&edit.key) {
            left.push(edit.key.clone());
        }
    }
    Undone {
        edits: made.len(),
        left,
    }
}

/// Up to 5 keys quoted, then how many more.
fn shown_keys(keys: &[impl AsRef<str>]) -> String {
    let mut shown: Vec<String> = keys
        .iter()
        .take(5)
        .map(|k| format!("`{}`", k.as_ref()))
        .collect();
    if keys.len() > 5 {
        shown.push(format!("and {} more", keys.len() - 5));
    }
    shown.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_key_is_refused_and_a_long_value_left_to_the_portal() {
        assert!(check_item("").is_err());
        assert!(check_item("k").is_ok());
    }

    #[test]
    fn many_keys_are_cut_short() {
        let keys: Vec<String> = (0..8).map(|n| format!("k{n}")).collect();
        assert_eq!(
            shown_keys(&keys),
            "`k0`, `k1`, `k2`, `k3`, `k4`, and 3 more"
        );
    }
}
