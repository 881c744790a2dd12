//! The hand-over between the subscriptions of one pub/sub and topic (a
//! *lineage*: the one that runs and those it replaced, still retiring;
//! see [`TopicDelivery`](crate::dapr::TopicDelivery)). A replaced one is
//! *retired* ([`Retire`]) rather than stopped: it delivers what its broker
//! holds for it, and ends once it reaches an event a later one of its
//! lineage took ([`Delivered`], matched by [`event_key`]: the CloudEvent's
//! bytes, not its `id` alone, which publishers reuse).
//!
//! While one of a lineage retires, each event is *claimed* before it is
//! sent: an event another one of the lineage has in flight waits for that
//! one's answer (delivered: it is not sent again; handed back: it is sent
//! here), so the running one and those retiring (however many reloads
//! took the topic over in a row, A → B → C or A → B → A) send each event
//! to the app once, and only a failure has it come again. An event one
//! sets aside (no route of it takes it) is not delivered for the others:
//! each decides by its own routes. Claims still in flight when the
//! hand-over ends are kept until answered.

use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{watch, Notify};
use tokio_util::sync::CancellationToken;

/// Events a lineage remembers, at most, while one of it retires (the
/// longest delivered forgotten first for a new one).
const HANDOVER_MEMORY: usize = 65_536;
/// How long an event waits, at most, for another subscription of its
/// lineage to answer it before it is sent all the same (that one retries
/// without limit, say).
const CLAIM_WAIT: Duration = Duration::from_secs(120);

/// The subscriptions of one pub/sub and topic, as they hand over: what
/// each has in flight and what each delivered (acknowledged or dropped).
/// Remembers only while [`Lineage::remember`] is on (one of it retires),
/// and at most [`HANDOVER_MEMORY`] events; once turned off it keeps the
/// claims still in flight until each is answered (so an event another
/// has at the app is not sent meanwhile); then, off (no hand-over in
/// progress, the usual case), a delivery neither keys its event nor
/// takes the lock.
#[derive(Debug, Default)]
pub struct Lineage {
    /// Whether deliveries key their events and look at `claims`.
    remembering: AtomicBool,
    claims: Mutex<Option<Claims>>,
    /// Told when a claim is answered or given up, and when remembering
    /// stops.
    answered: Notify,
    /// The subscriptions started in it so far.
    started: AtomicU64,
}

/// What a lineage remembers.
#[derive(Debug, Default)]
struct Claims {
    by_event: HashMap<u64, Claim>,
    /// The events delivered, oldest first: forgotten first when full.
    delivered: VecDeque<u64>,
    /// Remembering was turned off: nothing more is claimed, and the
    /// claims still in flight are let go as they are answered.
    stopping: bool,
}

impl Claims {
    /// Whether another event can be claimed: below [`HANDOVER_MEMORY`],
    /// once the longest delivered are forgotten if need be (those in
    /// flight never are).
    fn has_room(&mut self) -> bool {
        while self.by_event.len() >= HANDOVER_MEMORY {
            let Some(oldest) = self.delivered.pop_front() else {
                return false;
            };
            self.by_event.remove(&oldest);
        }
        true
    }
}

/// Who took an event, and its answer ([`PENDING`] while in flight).
#[derive(Debug, Clone)]
struct Claim {
    by: u64,
    answer: Arc<AtomicU8>,
}

/// A claim's answer: still in flight.
const PENDING: u8 = 0;
/// A claim's answer: delivered (acknowledged or dropped by the app).
const DELIVERED: u8 = 1;
/// A claim's answer: given up, for another to send.
const GIVEN_UP: u8 = 2;

impl Claim {
    fn answer(&self) -> u8 {
        self.answer.load(Ordering::Acquire)
    }
}

impl Lineage {
    /// Starts (or stops, and forgets) remembering; starting again while on
    /// keeps what it remembers. Stopping forgets what was delivered at
    /// once, and each claim still in flight once it is answered (until
    /// then, another subscription reading that event waits for it).
    pub fn remember(&self, on: bool) {
        let mut claims = self.claims.lock().unwrap_or_else(|p| p.into_inner());
        match (claims.as_mut(), on) {
            (None, true) => {
                *claims = Some(Claims::default());
                self.remembering.store(true, Ordering::Release);
            }
            (Some(kept), true) => kept.stopping = false,
            (Some(kept), false) if !kept.stopping => {
                kept.stopping = true;
                kept.by_event.retain(|_, claim| claim.answer() == PENDING);
                kept.delivered.clear();
                if kept.by_event.is_empty() {
                    *claims = None;
                    self.remembering.store(false, Ordering::Release);
                }
            }
            (_, false) => return,
        }
        drop(claims);
        self.answered.notify_waiters();
    }

    /// Whether deliveries are claimed now.
    pub fn is_remembering(&self) -> bool {
        self.remembering.load(Ordering::Acquire)
    }

    /// A new subscription of the lineage, later than all before it.
    pub fn member(self: &Arc<Self>) -> Arc<Delivered> {
        let order = self.started.fetch_add(1, Ordering::Relaxed);
        Arc::new(Delivered {
            lineage: self.clone(),
            order,
        })
    }
}

/// One subscription of a [`Lineage`]: how it claims the events it sends.
#[derive(Debug)]
pub struct Delivered {
    lineage: Arc<Lineage>,
    /// Its place in the lineage: a later one subscribed after it.
    order: u64,
}

impl Default for Delivered {
    /// A subscription alone in its lineage (never handed over).
    fn default() -> Self {
        Self {
            lineage: Arc::default(),
            order: 0,
        }
    }
}

/// What a subscription does with an event it read.
pub(crate) enum Taken {
    /// It sends it; the claim (none when nothing is remembered, or the
    /// event has no key) is answered with the outcome.
    Send(Option<Claimed>),
    /// Another subscription of the lineage delivered it: not sent again.
    /// `later`: that one subscribed after this one, so what this one holds
    /// from here on is that one's too (a retiring one has caught up).
    DeliveredBy { later: bool },
}

impl Delivered {
    /// Claims `message` for sending, waiting while another subscription of
    /// the lineage has it in flight (within [`CLAIM_WAIT`]); None when
    /// `stop` is cancelled meanwhile.
    pub(crate) async fn take(
        &self,
        message: &rewire_runtime::Message,
        stop: &CancellationToken,
    ) -> Option<Taken> {
        if !self.lineage.is_remembering() {
            return Some(Taken::Send(None));
        }
        let Some(key) = event_key(message) else {
            return Some(Taken::Send(None));
        };
        let deadline = tokio::time::Instant::now() + CLAIM_WAIT;
        // The claim of another that has the event in flight: its answer
        // is read here, also once the lineage forgot it.
        let mut waiting_on: Option<Claim> = None;
        loop {
            let answered = self.lineage.answered.notified();
            tokio::pin!(answered);
            answered.as_mut().enable();
            if let Some(claim) = &waiting_on {
                match claim.answer() {
                    DELIVERED => {
                        return Some(Taken::DeliveredBy {
                            later: claim.by > self.order,
                        })
                    }
                    PENDING => {}
                    _ => waiting_on = None,
                }
            }
            if waiting_on.is_none() {
                match self.try_take(key) {
                    Ok(taken) => return Some(taken),
                    Err(claim) => waiting_on = Some(claim),
                }
            }
            tokio::select! {
                () = answered => {}
                () = stop.cancelled() => return None,
                () = tokio::time::sleep_until(deadline) => return Some(Taken::Send(None)),
            }
        }
    }

    /// The event's fate now; the other's claim while it has it in flight.
    fn try_take(&self, key: u64) -> Result<Taken, Claim> {
        let mut claims = self
            .lineage
            .claims
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let Some(claims) = claims.as_mut() else {
            return Ok(Taken::Send(None));
        };
        match claims.by_event.get(&key) {
            Some(claim) if claim.answer() == DELIVERED => {
                return Ok(Taken::DeliveredBy {
                    later: claim.by > self.order,
                })
            }
            // Its own, read again while in flight: sent again, unclaimed.
            Some(claim) if claim.by == self.order => return Ok(Taken::Send(None)),
            Some(claim) => return Err(claim.clone()),
            None => {}
        }
        if claims.stopping || !claims.has_room() {
            return Ok(Taken::Send(None));
        }
        let claim = Claim {
            by: self.order,
            answer: Arc::new(AtomicU8::new(PENDING)),
        };
        claims.by_event.insert(key, claim.clone());
        Ok(Taken::Send(Some(Claimed {
            lineage: self.lineage.clone(),
            key,
            claim,
            delivered: false,
        })))
    }
}

/// An event a subscription claimed: given up (for another to send) unless
/// answered delivered.
pub(crate) struct Claimed {
    lineage: Arc<Lineage>,
    key: u64,
    claim: Claim,
    delivered: bool,
}

impl Claimed {
    /// Answers the claim: `delivered` (acknowledged or dropped by the
    /// subscriber), else given up.
    pub(crate) fn answer(mut self, delivered: bool) {
        self.delivered = delivered;
    }
}

impl Drop for Claimed {
    fn drop(&mut self) {
        let answer = if self.delivered { DELIVERED } else { GIVEN_UP };
        self.claim.answer.store(answer, Ordering::Release);
        let mut guard = self
            .lineage
            .claims
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(claims) = guard.as_mut() {
            let this = claims
                .by_event
                .get(&self.key)
                .is_some_and(|claim| Arc::ptr_eq(&claim.answer, &self.claim.answer));
            // Kept as delivered while remembering; else let go (those
            // waiting for it read its answer from their copy).
            if this && (!self.delivered || claims.stopping) {
                claims.by_event.remove(&self.key);
            } else if this {
                claims.delivered.push_back(self.key);
            }
            if claims.stopping && claims.by_event.is_empty() {
                *guard = None;
                self.lineage.remembering.store(false, Ordering::Release);
            }
        }
        drop(guard);
        self.lineage.answered.notify_waiters();
    }
}

/// The fields that make a payload a CloudEvent, borrowed from it.
#[derive(serde::Deserialize)]
struct Named<'a> {
    #[serde(borrow)]
    specversion: Option<Cow<'a, str>>,
    #[serde(borrow)]
    id: Option<Cow<'a, str>>,
}

/// The key of a message: a hash of the broker's id of it and its
/// payload's bytes, when the payload is a CloudEvent (it has a
/// `specversion` and an `id`). The subscriptions of a lineage read the
/// same pub/sub and topic, so an event comes to each with the same id and
/// bytes (the memory broker's ids are shared with its predecessors, a
/// Redis stream's are its entries'). Neither the CloudEvent's `source`
/// and `id` alone (publishers of their own CloudEvents reuse an id: an
/// order's id for its created, paid and shipped events) nor its bytes
/// alone (a publish repeated within the second the sidecar stamps, an
/// event forwarded again) name it: Dapr never de-duplicates, so each
/// publish is delivered. None for a payload that is no CloudEvent: such
/// events never mark a hand-over as caught up (its grace or limit ends
/// it).
pub(crate) fn event_key(message: &rewire_runtime::Message) -> Option<u64> {
    static KEYS: std::sync::OnceLock<std::collections::hash_map::RandomState> =
        std::sync::OnceLock::new();
    let named: Named<'_> = serde_json::from_slice(&message.data).ok()?;
    let (Some(_), Some(_)) = (named.specversion, named.id) else {
        return None;
    };
    let mut hasher = KEYS.get_or_init(Default::default).build_hasher();
    hasher.write(message.id.as_bytes());
    // The id's end, so that no id and payload run into each other.
    hasher.write_u8(0xff);
    hasher.write(&message.data);
    Some(hasher.finish())
}

/// The signal that retires a subscription.
#[derive(Debug, Clone)]
pub struct Retire(watch::Receiver<bool>);

impl Retire {
    /// A subscription that is never retired.
    pub fn never() -> Self {
        Self(watch::channel(false).1)
    }

    /// A signal, and what sends it (`true`: retired).
    pub fn channel() -> (watch::Sender<bool>, Self) {
        let (tx, rx) = watch::channel(false);
        (tx, Self(rx))
    }

    /// Resolves once retired.
    pub(crate) async fn retired(&mut self) {
        if self.0.wait_for(|retired| *retired).await.is_err() {
            // Its sender is gone without retiring it: never.
            std::future::pending::<()>().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(id: &str) -> rewire_runtime::Message {
        let event = serde_json::json!({"specversion": "1.0", "id": id, "source": "s",
            "type": "t", "data": "x"});
        rewire_runtime::Message {
            id: String::new(),
            topic: "t".into(),
            data: event.to_string().into_bytes(),
            content_type: None,
            metadata: Default::default(),
        }
    }

    async fn take(member: &Delivered, id: &str) -> Taken {
        let stop = CancellationToken::new();
        tokio::time::timeout(Duration::from_secs(1), member.take(&event(id), &stop))
            .await
            .unwrap_or_else(|_| panic!("{id} waited"))
            .unwrap_or_else(|| panic!("{id} stopped"))
    }

    fn message(payload: serde_json::Value) -> rewire_runtime::Message {
        rewire_runtime::Message {
            data: payload.to_string().into_bytes(),
            ..event("unused")
        }
    }

    /// Events that reuse a CloudEvent's `source` and `id` (an order's id
    /// for its created and paid events) are two events to the hand-over:
    /// keyed alike, the second was acknowledged unsent as delivered by the
    /// first. The same bytes are the same event; a raw payload has no key.
    #[test]
    fn events_sharing_source_and_id_but_not_their_bytes_have_distinct_keys() {
        let created = message(serde_json::json!({"specversion": "1.0", "id": "x",
            "source": "orders", "type": "created", "data": 1}));
        let paid = message(serde_json::json!({"specversion": "1.0", "id": "x",
            "source": "orders", "type": "paid", "data": 2}));
        let (created_key, paid_key) = (event_key(&created), event_key(&paid));
        assert!(
            created_key.is_some() && paid_key.is_some(),
            "CloudEvents keyed"
        );
        assert_ne!(created_key, paid_key, "two events, one key");
        assert_eq!(event_key(&created), created_key, "one event, two keys");
        let raw = rewire_runtime::Message {
            data: b"x".to_vec(),
            ..event("unused")
        };
        assert_eq!(event_key(&raw), None, "a raw payload keyed");
        // The same bytes published twice are two events.
        let again = rewire_runtime::Message {
            id: format!("{}-again", created.id),
            ..created.clone()
        };
        assert_ne!(event_key(&again), created_key, "two publishes, one key");
    }

    /// An event another subscription of the lineage has in flight waits
    /// for its answer: delivered, it is not sent again (and a retiring
    /// one has caught up when that one is later); given up (its delivery
    /// failed), it is sent here, so nothing is lost.
    #[tokio::test(start_paused = true)]
    async fn an_event_in_flight_elsewhere_waits_for_its_answer() {
        let lineage = Arc::new(Lineage::default());
        let (old, new) = (lineage.member(), lineage.member());
        lineage.remember(true);

        let Taken::Send(Some(claim)) = take(&new, "1").await else {
            panic!("claimed by the first to read it");
        };
        let waiting = tokio::spawn({
            let old = old.clone();
            async move { take(&old, "1").await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "waits while in flight");
        claim.answer(true);
        let taken = waiting.await.unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(taken, Taken::DeliveredBy { later: true }));

        let Taken::Send(Some(claim)) = take(&old, "2").await else {
            panic!("claimed");
        };
        let waiting = tokio::spawn({
            let new = new.clone();
            async move { take(&new, "2").await }
        });
        tokio::task::yield_now().await;
        claim.answer(false);
        let taken = waiting.await.unwrap_or_else(|e| panic!("{e}"));
        assert!(
            matches!(taken, Taken::Send(Some(_))),
            "sent after a failure"
        );
        // Not later: delivered by the retiring one, the running one has
        // not caught up with anything.
        let Taken::Send(Some(claim)) = take(&old, "3").await else {
            panic!("claimed");
        };
        claim.answer(true);
        assert!(matches!(
            take(&new, "3").await,
            Taken::DeliveredBy { later: false }
        ));
    }

    /// Remembering stops (the retiring subscription ended) while that one
    /// still has an event at the app: the running one reading it waits
    /// for the answer instead of sending it alongside, is told it was
    /// delivered, and the lineage lets its claims go once answered.
    #[tokio::test(start_paused = true)]
    async fn a_claim_in_flight_outlives_remembering() {
        let lineage = Arc::new(Lineage::default());
        let (old, new) = (lineage.member(), lineage.member());
        lineage.remember(true);
        let Taken::Send(Some(claim)) = take(&old, "1").await else {
            panic!("claimed");
        };
        lineage.remember(false);
        assert!(
            matches!(take(&new, "2").await, Taken::Send(None)),
            "nothing new is claimed"
        );
        let waiting = tokio::spawn({
            let new = new.clone();
            async move { take(&new, "1").await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "waits while at the app");
        claim.answer(true);
        let taken = waiting.await.unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(taken, Taken::DeliveredBy { later: false }));
        assert!(!lineage.is_remembering(), "let go once answered");
        assert!(matches!(take(&new, "1").await, Taken::Send(None)));
    }

    /// A lineage full of delivered events forgets the longest delivered
    /// for a new one, so events are still claimed (and sent once) on a
    /// busy topic; it refused every new claim.
    #[tokio::test(start_paused = true)]
    async fn a_full_lineage_forgets_its_oldest_delivered_events() {
        let lineage = Arc::new(Lineage::default());
        let (old, new) = (lineage.member(), lineage.member());
        lineage.remember(true);
        for n in 0..HANDOVER_MEMORY {
            let Taken::Send(Some(claim)) = take(&old, &n.to_string()).await else {
                panic!("{n} claimed");
            };
            claim.answer(true);
        }
        let Taken::Send(Some(claim)) = take(&old, "next").await else {
            panic!("claimed when full");
        };
        let waiting = tokio::spawn({
            let new = new.clone();
            async move { take(&new, "next").await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "waits while in flight");
        claim.answer(true);
        let taken = waiting.await.unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(taken, Taken::DeliveredBy { later: false }));
        let last = (HANDOVER_MEMORY - 1).to_string();
        assert!(matches!(take(&new, &last).await, Taken::DeliveredBy { .. }));
        assert!(
            matches!(take(&new, "0").await, Taken::Send(Some(_))),
            "the oldest forgotten"
        );
    }
}
