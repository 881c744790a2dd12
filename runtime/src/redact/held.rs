//! Which remembered forms are still in force: each counts the guards
//! ([`HeldSecrets`]) holding it; one no guard holds any more is forgotten
//! once released for longer than a grace (a retired component's close and
//! the tasks it left may still print it meanwhile).

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::Shared;

/// How long a form no one holds any more is still scrubbed: long past a
/// retired component's close (bounded by seconds) and the tasks it left.
pub(super) const FORGET_AFTER: Duration = Duration::from_secs(10 * 60);
/// How often forms are forgotten at most, unless their room is needed: a
/// form is scrubbed up to this much past its grace.
pub(super) const FORGET_EVERY: Duration = Duration::from_secs(60);

/// The forms remembered, held or within their grace.
#[derive(Debug, Default)]
pub(super) struct HeldForms {
    entries: HashMap<Arc<str>, Entry>,
    /// The bytes of the forms in `entries`.
    bytes: usize,
    /// Forms as their last holder let go, oldest first: those past the
    /// grace are found without going through every entry. A form held
    /// again and let go later has a later line here too; the earlier one
    /// no longer matches its entry and is skipped.
    released: VecDeque<(Instant, Arc<str>)>,
    /// When forms were last forgotten.
    forgot_at: Option<Instant>,
}

#[derive(Debug, Default)]
struct Entry {
    holders: usize,
    /// When the last holder let go; `None` while held.
    released_at: Option<Instant>,
}

impl HeldForms {
    /// How many forms are remembered (held or within their grace).
    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Their bytes.
    pub(super) fn bytes(&self) -> usize {
        self.bytes
    }

    pub(super) fn contains(&self, form: &str) -> bool {
        self.entries.contains_key(form)
    }

    /// Every form remembered.
    pub(super) fn forms(&self) -> impl Iterator<Item = &Arc<str>> {
        self.entries.keys()
    }

    /// Takes one more hold on `form`, remembered from now on if it was
    /// not (as `new`, if given, else copied); the form as kept, for the
    /// guard to let go of.
    pub(super) fn hold(&mut self, form: &str, new: Option<Arc<str>>) -> Arc<str> {
        if let Some((kept, _)) = self.entries.get_key_value(form) {
            let kept = kept.clone();
            if let Some(entry) = self.entries.get_mut(form) {
                entry.holders += 1;
                entry.released_at = None;
            }
            return kept;
        }
        let kept: Arc<str> = new.unwrap_or_else(|| Arc::from(form));
        self.bytes += kept.len();
        let entry = Entry {
            holders: 1,
            released_at: None,
        };
        self.entries.insert(kept.clone(), entry);
        kept
    }

    /// Lets go of one hold on `form`, at `now`.
    pub(super) fn release(&mut self, form: &Arc<str>, now: Instant) {
        let Some(entry) = self.entries.get_mut(form) else {
            return;
        };
        entry.holders = entry.holders.saturating_sub(1);
        if entry.holders == 0 {
            entry.released_at = Some(now);
            self.released.push_back((now, form.clone()));
        }
    }

    /// Forgets the forms no one has held for `grace` by `now`, unless
    /// forms were forgotten less than `every` ago (forgetting rebuilds the
    /// matcher: forms expiring one by one, each followed by a value
    /// remembered, would rebuild it each time); whether any was.
    pub(super) fn forget_released(
        &mut self,
        now: Instant,
        grace: Duration,
        every: Duration,
    ) -> bool {
        if let Some(at) = self.forgot_at {
            if now.saturating_duration_since(at) < every {
                return false;
            }
        }
        let mut forgot = false;
        while let Some((at, _)) = self.released.front() {
            if now.saturating_duration_since(*at) < grace {
                break;
            }
            let Some((at, form)) = self.released.pop_front() else {
                break;
            };
            let expired = self
                .entries
                .get(&form)
                .is_some_and(|entry| entry.holders == 0 && entry.released_at == Some(at));
            if expired {
                self.entries.remove(&form);
                self.bytes -= form.len();
                forgot = true;
            }
        }
        if forgot {
            self.forgot_at = Some(now);
        }
        forgot
    }

    /// How many forms some guard holds (those within their grace not
    /// counted).
    #[cfg(test)]
    pub(super) fn held(&self) -> usize {
        self.entries.values().filter(|e| e.holders > 0).count()
    }
}

/// Holds the forms of the secret values remembered by one or more calls
/// of [`Redactor::try_remember_all`](super::Redactor::try_remember_all):
/// they are scrubbed at least as long as a clone of it lives, and for a
/// grace after (`FORGET_AFTER`). Kept with the metadata the values were
/// resolved into, so a component holds its values while it runs, and a
/// value kept across a reload (held by both instances' metadata) is never
/// let go.
#[derive(Clone, Default)]
pub struct HeldSecrets {
    holds: Vec<Arc<Hold>>,
}

/// One call's forms, let go of when the last clone drops.
struct Hold {
    shared: Arc<Shared>,
    forms: Vec<Arc<str>>,
}

impl HeldSecrets {
    pub(super) fn new(shared: Arc<Shared>, forms: Vec<Arc<str>>) -> Self {
        if forms.is_empty() {
            return Self::default();
        }
        Self {
            holds: vec![Arc::new(Hold { shared, forms })],
        }
    }

    /// Holds `other`'s forms too.
    pub fn join(&mut self, other: HeldSecrets) {
        self.holds.extend(other.holds);
    }

    /// Never lets go: for values no component holds.
    #[cfg(test)]
    pub(crate) fn keep_for_good(self) {
        std::mem::forget(self);
    }
}

/// How many holds, never a value.
impl fmt::Debug for HeldSecrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let forms: usize = self.holds.iter().map(|hold| hold.forms.len()).sum();
        write!(f, "HeldSecrets({forms} forms)")
    }
}

/// Queued for the next writer to count (`Shared::released`): a drop never
/// waits for a finder being built.
impl Drop for Hold {
    fn drop(&mut self) {
        let forms = std::mem::take(&mut self.forms);
        let mut released = self
            .shared
            .released
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        // Stamped under the lock: the queue stays oldest first.
        released.push((Instant::now(), forms));
    }
}

#[cfg(test)]
mod tests;
