//! The `redis` lock, as Dapr's `lock.redis`: a lock is a string key holding
//! its owner, taken with `SET key owner NX PX expiry` and released by a
//! Lua script only when the owner matches.
//!
//! Keys are Dapr's: `lock||{appId}||{resourceId}` by default, so locks never
//! share a key with the state store's `{appId}||{key}` or the
//! sequencer's `sequencer|||{key}` on the same server. `keyPrefix` picks
//! the middle part as Dapr's lock key strategies do (see [`key_base`]); a
//! resource id containing `||` is refused, so no two resources (and no
//! strategy) make the same key.

use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use rewire_runtime::{
    echoed, Component, ComponentError, InPlace, InPlaceUpdate, InitContext, Lock, LockError,
    Metadata, PendingInPlace, Readiness, StagedInPlace, TryLockRequest, UnlockRequest,
    UnlockStatus,
};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::time_limits::check_ttl;

use super::connection::{RedisConnection, Session};
use super::duration::Timeout;
use super::lua_script::LuaScript;
use super::metadata::RedisMetadata;
use super::scripts;

/// What separates a lock key's parts: refused in resource ids and in a
/// literal `keyPrefix`, as Dapr does.
pub const KEY_SEPARATOR: &str = super::metadata::KEY_SEPARATOR;

/// The part of every lock key before the resource id, as Dapr builds it
/// from the lock store's `keyPrefix` (case-insensitive, as Dapr lowercases
/// it):
///
/// * empty or `appid` (the default): `lock||{appId}||` — `lock||` when the
///   app has no id;
/// * `name`: `lock||{store name}||`;
/// * `none`: `lock||`;
/// * anything else, lowercased: `lock||{keyPrefix}||`.
///
/// That is `lock||` in front of the state store's
/// [`strategy_base`](super::metadata::strategy_base).
pub fn key_base(key_prefix: &str, app_id: &str, store: &str) -> String {
    format!(
        "lock{KEY_SEPARATOR}{}",
        super::metadata::strategy_base(key_prefix, app_id, store)
    )
}

/// How long the previous namespace is still consulted after a change of
/// server, database or key prefix (see [`RedisLock`]), however short the
/// locks this process granted: other sidecars (or this one before a
/// restart) may hold locks there for that long.
pub const MAX_GRACE: Duration = Duration::from_secs(60);

/// Longest wait for one look-up in the previous namespace (less when its
/// `dialTimeout` is shorter): it only adds to a request on the new one.
pub const PREVIOUS_LIMIT: Duration = Duration::from_millis(500);

/// The app id and the store's name, known at init, that Dapr's key
/// strategies put in the keys.
#[derive(Debug, Clone, Default)]
struct Naming {
    app_id: String,
    store: String,
}

impl Naming {
    /// The key base of `session`'s locks under this naming.
    fn namespace(&self, session: Arc<Session>) -> Namespace {
        let base = key_base(&session.metadata().key_prefix, &self.app_id, &self.store);
        Namespace { session, base }
    }
}

/// Where locks live: a server (and database), and the key base of the
/// locks there (which the app id and store name of the instance that
/// took them went into, not only `keyPrefix`).
#[derive(Debug, Clone)]
struct Namespace {
    session: Arc<Session>,
    base: String,
}

impl Namespace {
    /// The key of the lock on `resource_id` here.
    fn key(&self, resource_id: &str) -> String {
        format!("{}{resource_id}", self.base)
    }

    /// Whether the two hold their locks at the same keys of one server.
    fn same(&self, other: &Namespace) -> bool {
        self.session.same_server(&other.session) && self.base == other.base
    }
}

/// A distributed lock on Redis: locks expire, and only their owner can
/// release them.
///
/// The keys are `{key_base}{resource id}`, [`key_base`] made of the
/// `keyPrefix` in force and the app id and store name given at init.
///
/// Every metadata change applies in place, staged: a new server is
/// connected and verified while the reload prepares, and swapped in only
/// when it commits (a rollback drops it). Locks live in Redis, so a change
/// of namespace — server, database or key prefix — leaves the held ones
/// behind; for a grace of [`MAX_GRACE`] after it, whoever took them (this
/// store, another sidecar, this one before a restart), the previous
/// namespace is still consulted: an unlock or keep-alive that finds no
/// lock on the new one acts on the old one (a keep-alive moves the lock
/// over), and a try-lock of a resource still held there is refused. A
/// request that read the namespace just before a change committed follows
/// it: a try-lock granted on the old one takes the lock on the new one
/// too, or gives it up when held there (so one owner at most wins, see
/// `follow_changes`); an unlock or keep-alive that misses the
/// lock looks again on the namespace in force, where a concurrent request
/// of the same owner may have moved it. Each
/// look-up there waits at most [`PREVIOUS_LIMIT`] (its `dialTimeout` when
/// shorter), and the first that finds the old server gone (connection
/// refused, reset or dropped) ends the grace: its locks are no longer consulted, and requests no
/// longer wait for it. An old server that is slow to answer (a save, a
/// stall) may still hold its locks: the request fails with a backend
/// error, to retry, instead of taking them as not held.
///
/// A rebuilt store (a change that could not apply in place, or failed
/// while staging) starts the same grace: at init it looks at what the live
/// instances of the same component in the same runtime left in the
/// runtime's handover area ([`InitContext::left_by_predecessors`]) and,
/// when one of them is on another namespace (or still in the grace of
/// one), consults that one for [`MAX_GRACE`]; namespaces compare by
/// server, database and whole key base, so an app id change moves them
/// too, and old keys are built with the naming that made them. Once the
/// successor has served its first request (not at init: the reload may
/// still roll back, and one that does changes nothing), the replaced
/// instance, still serving requests in flight, treats the successor's
/// namespace as the one in force (a try-lock granted on its own follows
/// there), and a successor that served and is closed before it leaves it
/// its namespace to consult, with any grace it was in. Another runtime in the
/// process, even of the same app, folder and component name, has an area
/// of its own: its lock server is never consulted.
#[derive(rewire_runtime::Component, Debug)]
#[component(
    kind = "lock",
    type = "redis",
    example = r#"{"redisHost": "127.0.0.1:6379", "redisPassword": "", "dialTimeout": "5s"}"#
)]
pub struct RedisLock {
    #[metadata]
    connection: RedisConnection,
    naming: OnceLock<Naming>,
    grace: Arc<Grace>,
}

/// What a change of namespace leaves behind, and how long to look at it;
/// and, between the instances of one component in one runtime, which of
/// them is in force.
#[derive(Debug, Default)]
struct Grace {
    /// The namespace in force before the last change, while its locks may
    /// still be held.
    previous: ArcSwapOption<Previous>,
    /// The store's connection and naming (set at init, before the grace is
    /// left for a successor).
    own: OnceLock<Own>,
    /// The newest rebuilt instance of the component that has served: while
    /// it serves, its namespace is the one in force, also for the requests
    /// this one still serves (see `follow_changes`). Weak: a successor
    /// dropped without a close is no longer followed.
    successor: ArcSwapOption<Weak<Grace>>,
    /// The instances this one succeeded: a close before theirs leaves them
    /// this one's namespace to consult, where their requests may have
    /// moved locks.
    predecessors: OnceLock<Vec<Weak<Grace>>>,
    /// Set by this store's first request, before it reaches Redis: only
    /// then does it become its predecessors' successor. Not at init: the
    /// reload that built it may still roll back (the old instance serving
    /// meanwhile), and one that does must leave the old instance's locks
    /// where they were.
    registered: OnceLock<()>,
}

#[derive(Debug)]
struct Own {
    connection: RedisConnection,
    naming: Naming,
}

#[derive(Debug)]
struct Previous {
    namespace: Namespace,
    until: Instant,
    /// Limit on each look-up in it.
    limit: Duration,
    /// A grace this one did not end: consulted too while it lasts (the
    /// grace an in-place change found in force, of an earlier change or
    /// adopted by a rebuilt store; or, for a closed successor's namespace
    /// handed back, the grace its predecessor was still in).
    earlier: Option<Arc<Previous>>,
}

impl Previous {
    /// `namespace`, consulted for [`MAX_GRACE`] from now (with `earlier`
    /// and the graces it keeps, each while it lasts).
    ///
    /// Only the graces of `earlier` that still last are kept (at most
    /// [`MAX_SUCCESSORS`] in all, as [`Previous::chain`] looks at): changes
    /// coming quicker than the grace, one after another, would otherwise
    /// keep every namespace ever left, and its connection, reachable.
    fn for_grace(namespace: Namespace, earlier: Option<Arc<Previous>>) -> Arc<Self> {
        let live: Vec<Arc<Previous>> = earlier.iter().flat_map(Previous::chain).collect();
        let kept = live
            .iter()
            .take(MAX_SUCCESSORS - 1)
            .rev()
            .fold(None, |kept, grace| {
                Some(Arc::new(Self {
                    namespace: grace.namespace.clone(),
                    until: grace.until,
                    limit: grace.limit,
                    earlier: kept,
                }))
            });
        Arc::new(Self {
            limit: previous_limit(namespace.session.metadata()),
            namespace,
            until: Instant::now() + MAX_GRACE,
            earlier: kept,
        })
    }

    fn live(&self) -> bool {
        Instant::now() < self.until
    }

    /// This grace and the earlier ones it keeps that still last.
    fn chain(self: &Arc<Self>) -> Vec<Arc<Self>> {
        let mut chain = vec![self.clone()];
        let mut next = self.earlier.clone();
        while let Some(earlier) = next.filter(|_| chain.len() < MAX_SUCCESSORS) {
            next = earlier.earlier.clone();
            if earlier.live() {
                chain.push(earlier);
            }
        }
        chain
    }
}

/// Bound on the successors followed (each reload adds at most one).
const MAX_SUCCESSORS: usize = 16;

impl Grace {
    /// The previous namespace, while its grace lasts.
    fn previous(&self) -> Option<Arc<Previous>> {
        let previous = self.previous.load_full()?;
        if previous.live() {
            return Some(previous);
        }
        // Over: let its connection go (unless a newer change replaced it).
        let _ = self
            .previous
            .compare_and_swap(&Some(previous), None::<Arc<Previous>>);
        None
    }

    /// Ends the grace of `previous` early (unless a newer change replaced
    /// it; the earlier graces it kept go on); whether this call ended it.
    fn forget(&self, previous: &Arc<Previous>) -> bool {
        let kept = previous.earlier.clone().filter(|earlier| earlier.live());
        let swapped = self
            .previous
            .compare_and_swap(&Some(previous.clone()), kept);
        swapped
            .as_ref()
            .is_some_and(|was| Arc::ptr_eq(was, previous))
    }

    /// The store's namespace now, while it serves (not closed).
    fn serving(&self) -> Option<Namespace> {
        let own = self.own.get()?;
        let session = own.connection.session();
        session
            .is_connected()
            .then(|| own.naming.namespace(session))
    }

    /// The grace of the instance in force: the newest successor that
    /// serves, else this one.
    fn in_force(self: &Arc<Self>) -> Arc<Grace> {
        let mut grace = self.clone();
        for _ in 0..MAX_SUCCESSORS {
            let next = grace.successor.load_full().and_then(|next| next.upgrade());
            match next {
                Some(next) if next.serving().is_some() => grace = next,
                _ => break,
            }
        }
        grace
    }

    /// Leaves `namespace` (this store's, as it stops serving) for the
    /// predecessors that still serve and had this one as their successor
    /// (it served, and is closed before them): their requests may have
    /// followed locks here. Stored before this one stops serving, so a
    /// request that finds it no longer in force finds the grace. A grace
    /// they are still in, of another namespace, is kept along with it
    /// (replaced, locks other sidecars hold there would be granted).
    fn hand_back(&self, namespace: &Namespace) {
        for predecessor in self.predecessors.get().into_iter().flatten() {
            let Some(predecessor) = predecessor.upgrade() else {
                continue;
            };
            let succeeded_by_this = predecessor
                .successor
                .load()
                .as_ref()
                .is_some_and(|next| std::ptr::eq(next.as_ptr(), self));
            let theirs = predecessor.serving();
            if succeeded_by_this && theirs.is_some_and(|theirs| !theirs.same(namespace)) {
                let kept = match predecessor.previous() {
                    Some(same) if same.namespace.same(namespace) => same.earlier.clone(),
                    other => other,
                };
                predecessor
                    .previous
                    .store(Some(Previous::for_grace(namespace.clone(), kept)));
            }
        }
    }
}

impl Drop for Grace {
    /// A successor dropped without a close (its start abandoned) hands its
    /// namespace back as a close does.
    fn drop(&mut self) {
        if let Some(namespace) = self.serving() {
            self.hand_back(&namespace);
        }
    }
}

/// The limit on a look-up in the previous namespace: [`PREVIOUS_LIMIT`],
/// or its `dialTimeout` when shorter.
fn previous_limit(metadata: &RedisMetadata) -> Duration {
    match metadata.dial_timeout {
        Some(Timeout::After(dial)) if !dial.is_zero() => dial.min(PREVIOUS_LIMIT),
        _ => PREVIOUS_LIMIT,
    }
}

/// Whether `err` says the server is gone (connection refused, reset or
/// dropped), rather than slow (a timeout: it may still hold its locks) or
/// answering with an error.
fn gone(err: &redis::RedisError) -> bool {
    err.is_connection_dropped() || err.is_connection_refusal()
}

impl RedisLock {
    /// A lock store for `metadata`, not connected until `init`.
    pub fn new(metadata: RedisMetadata) -> Self {
        Self {
            connection: RedisConnection::new(metadata),
            naming: OnceLock::new(),
            grace: Arc::default(),
        }
    }

    /// `session`'s namespace under this store's naming.
    fn namespace_of(&self, session: Arc<Session>) -> Namespace {
        self.naming
            .get()
            .cloned()
            .unwrap_or_default()
            .namespace(session)
    }

    /// This store's namespace now.
    fn namespace(&self) -> Namespace {
        self.namespace_of(self.connection.session())
    }

    /// The namespace in force for the component, and the grace it is in:
    /// this store's, or its newest rebuilt successor's while that serves.
    fn in_force(&self) -> (Namespace, Arc<Grace>) {
        let grace = self.grace.in_force();
        if !Arc::ptr_eq(&grace, &self.grace) {
            if let Some(namespace) = grace.serving() {
                return (namespace, grace);
            }
        }
        (self.namespace(), self.grace.clone())
    }

    /// Runs the unlock or keep-alive `script` in `namespace`.
    async fn owner_script(
        &self,
        namespace: &Namespace,
        script: &LuaScript,
        req: &UnlockRequest,
        expiry_ms: Option<u64>,
    ) -> Result<UnlockStatus, LockError> {
        let session = &namespace.session;
        let mut conn = session
            .connection()
            .map_err(|err| LockError::Backend(err.to_string()))?;
        let mut invocation = script.key(namespace.key(&req.resource_id));
        invocation.arg(&req.lock_owner);
        if let Some(expiry_ms) = expiry_ms {
            invocation.arg(expiry_ms);
        }
        let reply: i64 = invocation
            .invoke_async(&mut conn)
            .await
            .map_err(|err| LockError::Backend(self.connection.describe(session, &err)))?;
        status_of(reply, "unlock or keep-alive")
    }

    /// `call`'s answer, made in the previous namespace of `grace`, within
    /// its limit. `None` when the old server is gone (connection refused,
    /// reset or dropped): it holds nothing we can see, and the first
    /// look-up that finds it so ends its grace (logged once), so that
    /// later requests do not wait for it. Slow (no answer within the
    /// limit) or answering an error, it may still hold its locks: the
    /// request fails (a backend error, to retry) rather than taking them
    /// as not held.
    async fn on_previous<T>(
        &self,
        grace: &Grace,
        previous: &Arc<Previous>,
        call: impl std::future::Future<Output = redis::RedisResult<T>>,
    ) -> Result<Option<T>, LockError> {
        let session = &previous.namespace.session;
        let answer = match tokio::time::timeout(previous.limit, call).await {
            Ok(answer) => answer,
            Err(_) => Err(redis::RedisError::from(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no answer within {:?}", previous.limit),
            ))),
        };
        match answer {
            Ok(value) => Ok(Some(value)),
            Err(err) if gone(&err) => {
                if grace.forget(previous) {
                    warn!(component = %self.connection.label(), error = %self.connection.describe(session, &err), "The previous Redis namespace of the lock is unreachable; its locks are no longer consulted.");
                }
                Ok(None)
            }
            Err(err) => {
                let err = self.connection.describe(session, &err);
                warn!(component = %self.connection.label(), error = %err, "The previous Redis namespace of the lock could not be read.");
                Err(LockError::Backend(format!(
                    "the previous namespace of the lock, still consulted after a change, could not be read (retry): {err}"
                )))
            }
        }
    }

    /// Whether the lock on `resource_id` is still held in `grace`'s
    /// previous namespace (an unreachable old server holds nothing we can
    /// see).
    async fn held_before(
        &self,
        grace: &Grace,
        previous: &Arc<Previous>,
        resource_id: &str,
    ) -> Result<bool, LockError> {
        let Ok(mut conn) = previous.namespace.session.connection() else {
            return Ok(false);
        };
        let key = previous.namespace.key(resource_id);
        let exists = self
            .on_previous(grace, previous, async {
                redis::cmd("EXISTS")
                    .arg(&key)
                    .query_async::<i64>(&mut conn)
                    .await
            })
            .await?;
        Ok(exists.is_some_and(|n| n > 0))
    }

    /// Runs the unlock or keep-alive `script` in the previous namespace;
    /// `LockDoesNotExist` when it did not answer.
    async fn owner_script_before(
        &self,
        previous: &Arc<Previous>,
        script: &LuaScript,
        req: &UnlockRequest,
        expiry_ms: Option<u64>,
    ) -> Result<UnlockStatus, LockError> {
        let Ok(mut conn) = previous.namespace.session.connection() else {
            return Ok(UnlockStatus::LockDoesNotExist);
        };
        let mut invocation = script.key(previous.namespace.key(&req.resource_id));
        invocation.arg(&req.lock_owner);
        if let Some(expiry_ms) = expiry_ms {
            invocation.arg(expiry_ms);
        }
        let reply = self
            .on_previous(
                &self.grace,
                previous,
                invocation.invoke_async::<i64>(&mut conn),
            )
            .await?;
        match reply {
            Some(reply) => status_of(reply, "unlock or keep-alive"),
            None => Ok(UnlockStatus::LockDoesNotExist),
        }
    }

    /// Takes over from `predecessors` (the live earlier instances of this
    /// component in this runtime, newest first): when one of them is on
    /// another namespace (a rebuild after a change — of server, database,
    /// `keyPrefix`, or of the app id or anything else its key base holds),
    /// or still consults one, this store consults it for [`MAX_GRACE`] (and
    /// the one it consults, while that grace lasts), so that a lock held
    /// there is not taken here. It becomes their
    /// successor (see `follow_changes`) only when it first serves (see
    /// [`RedisLock::register`]).
    fn adopt(&self, predecessors: &[Arc<Grace>]) {
        let current = self.namespace();
        let mut found = None;
        for predecessor in predecessors {
            if let Some(theirs) = predecessor.serving() {
                if !theirs.same(&current) {
                    // With the grace of an in-place change it is still in:
                    // locks held where it was before count as well.
                    // One in the namespace now in force is not consulted,
                    // but those before it are.
                    let earlier = match predecessor.previous() {
                        Some(same) if same.namespace.same(&current) => same.earlier.clone(),
                        other => other,
                    };
                    found = Some(Previous::for_grace(theirs, earlier));
                    break;
                }
            }
            // A grace in the namespace now in force is not consulted, but
            // those before it are.
            let inherited = match predecessor.previous() {
                Some(same) if same.namespace.same(&current) => same.earlier.clone(),
                other => other,
            };
            if let Some(previous) = inherited {
                found = Some(previous);
                break;
            }
        }
        if let Some(previous) = found {
            info!(component = %self.connection.label(), grace = ?previous.until.saturating_duration_since(Instant::now()), "Lock rebuilt on another namespace; the previous one is still consulted for its held locks.");
            self.grace.previous.store(Some(previous));
        }
        let _ = self
            .grace
            .predecessors
            .set(predecessors.iter().map(Arc::downgrade).collect());
    }

    /// Once, at this store's first request and before it reaches Redis:
    /// becomes the successor of the predecessors it adopted, whose
    /// requests then follow it (the namespace in force). Its grace was
    /// stored at init, before: a request of a predecessor that follows it
    /// here finds it. Concurrent first requests wait for the one that
    /// registers.
    fn register(&self) {
        self.grace.registered.get_or_init(|| {
            // The predecessors granted locks on the namespace this store
            // consults until now (the reload may have waited long for
            // readiness since init): its grace runs from here, stored
            // before they follow this store. Unless a newer change
            // replaced it meanwhile.
            if let Some(adopted) = self.grace.previous.load_full() {
                let renewed =
                    Previous::for_grace(adopted.namespace.clone(), adopted.earlier.clone());
                self.grace
                    .previous
                    .compare_and_swap(&Some(adopted), Some(renewed));
            }
            let this = Arc::new(Arc::downgrade(&self.grace));
            for predecessor in self.grace.predecessors.get().into_iter().flatten() {
                if let Some(predecessor) = predecessor.upgrade() {
                    predecessor.successor.store(Some(this.clone()));
                }
            }
        });
    }

    /// The metadata in force.
    pub fn metadata(&self) -> RedisMetadata {
        self.connection.session().metadata().clone()
    }
}

/// The lock has no use for the state store's default TTL; a literal
/// `keyPrefix` cannot hold the key separator.
fn check_lock_metadata(metadata: &RedisMetadata) -> Result<(), ComponentError> {
    super::sequencer::refuse_sequencer_fields(metadata)?;
    if metadata.key_prefix.contains(KEY_SEPARATOR) {
        return Err(ComponentError::new(format!(
            "metadata field `keyPrefix` of a lock cannot contain `{KEY_SEPARATOR}`, \
             which separates a lock key's parts"
        )));
    }
    match metadata.ttl_in_seconds {
        Some(_) => Err(ComponentError::new(
            "metadata field `ttlInSeconds` belongs to the redis state store; \
             a lock's expiry comes with each try-lock request",
        )),
        None => Ok(()),
    }
}

fn require(what: &str, value: &str) -> Result<(), LockError> {
    if value.is_empty() {
        Err(LockError::Invalid(format!("{what} is empty")))
    } else {
        Ok(())
    }
}

/// A resource id and an owner are required; the resource id cannot hold
/// the key separator.
fn check_request(resource_id: &str, lock_owner: &str) -> Result<(), LockError> {
    require("resource id", resource_id)?;
    require("lock owner", lock_owner)?;
    if resource_id.contains(KEY_SEPARATOR) {
        return Err(LockError::Invalid(format!(
            "resource id `{}` contains `{KEY_SEPARATOR}`, which separates a lock key's parts",
            echoed(resource_id)
        )));
    }
    Ok(())
}

#[rewire_runtime::prelude::async_trait]
impl Component for RedisLock {
    async fn init(&mut self, cx: &InitContext) -> Result<(), ComponentError> {
        check_lock_metadata(self.connection.session().metadata())?;
        let _ = self.naming.set(Naming {
            app_id: cx.app_id.clone(),
            store: cx.key.name.to_string(),
        });
        self.connection
            .init(&cx.key, cx.config_dir.as_deref())
            .await?;
        let _ = self.grace.own.set(Own {
            connection: self.connection.handle(),
            naming: self.naming.get().cloned().unwrap_or_default(),
        });
        // Only this runtime's earlier instances of this component: never
        // another runtime's, of the same app and name or not.
        self.adopt(&cx.left_by_predecessors::<Grace>());
        cx.leave_for_successor(&self.grace);
        Ok(())
    }

    async fn readiness(&self) -> Readiness {
        self.connection.readiness().await
    }

    async fn close(&self) -> Result<(), ComponentError> {
        if let Some(namespace) = self.grace.serving() {
            self.grace.hand_back(&namespace);
        }
        self.grace.previous.store(None);
        self.connection.close();
        Ok(())
    }

    fn as_in_place(&self) -> Option<&dyn InPlaceUpdate> {
        Some(self)
    }
}

/// Deferred: the new connection is made and verified while staging, and
/// swapped in at commit; a change of namespace keeps the previous one for
/// the grace (see [`RedisLock`]).
#[rewire_runtime::prelude::async_trait]
impl InPlaceUpdate for RedisLock {
    async fn update_in_place(&self, metadata: &Metadata) -> Result<InPlace, ComponentError> {
        let StagedInPlace::Deferred(pending) = self.stage_in_place(metadata).await? else {
            return Ok(InPlace::NeedsRebuild);
        };
        pending.apply();
        Ok(InPlace::Applied)
    }

    async fn stage_in_place(&self, metadata: &Metadata) -> Result<StagedInPlace, ComponentError> {
        let new = metadata
            .decode::<RedisMetadata>()
            .map_err(|err| ComponentError::new(format!("new metadata rejected: {err}")))?;
        check_lock_metadata(&new)?;
        let prepared = self.connection.prepare(new).await?;
        let connection = self.connection.handle();
        let grace = self.grace.clone();
        let naming = self.naming.get().cloned().unwrap_or_default();
        let new = naming.namespace(prepared.clone());
        Ok(StagedInPlace::Deferred(PendingInPlace::new(move || {
            // Changes commit one at a time: the session in force now is
            // the one `install` replaces.
            let old = connection.session();
            let moved = !naming.namespace(old.clone()).same(&new);
            // Whoever holds locks there (another sidecar, this one before a
            // restart), for as long as they may: not only what this store
            // granted. Stored before the new session is installed, and
            // requests load the session first: one that sees the new
            // namespace sees the old one's grace too (in the other order,
            // a try-lock in between took on the new namespace a lock held
            // on the old one).
            let consulted = moved && old.is_connected();
            // The grace in force before (an earlier change's, or one a
            // rebuilt store adopted) goes on with it: a lock another
            // sidecar holds two namespaces back still counts while that
            // grace lasts. Read once, before the store below replaces it.
            // Back to the namespace just left: that grace is not
            // consulted, but those before it are.
            let earlier = match grace.previous() {
                Some(same) if same.namespace.same(&new) => same.earlier.clone(),
                other => other,
            };
            let consult = |session: Arc<Session>| {
                let namespace = naming.namespace(session);
                grace
                    .previous
                    .store(Some(Previous::for_grace(namespace, earlier.clone())));
            };
            if consulted {
                consult(old.clone());
            }
            let replaced = connection.install(prepared);
            if consulted {
                // A failover (or the TLS file follower) swapped the session
                // meanwhile: the same namespace, on the connection in force.
                if !Arc::ptr_eq(&replaced, &old) && replaced.is_connected() {
                    consult(replaced);
                }
                info!(component = %connection.label(), grace = ?MAX_GRACE, "Lock namespace changed; the previous one is still consulted for its held locks.");
            }
        })))
    }
}

#[rewire_runtime::prelude::async_trait]
impl Lock for RedisLock {
    async fn try_lock(&self, req: TryLockRequest) -> Result<bool, LockError> {
        check_request(&req.resource_id, &req.lock_owner)?;
        let expiry_ms = expiry_ms(&req)?;
        self.register();
        // The session first, then the grace (stored before a new session
        // is installed): a request on the new namespace sees the old one.
        let namespace = self.namespace();
        let seen = self.grace.previous();
        for previous in seen.iter().flat_map(Previous::chain) {
            if self
                .held_before(&self.grace, &previous, &req.resource_id)
                .await?
            {
                debug!(resource = %echoed(&req.resource_id), "Lock still held in the previous namespace.");
                return Ok(false);
            }
        }
        let taken = self.take_if_free(&namespace, &req, expiry_ms).await?
            && self
                .follow_changes(namespace, seen, &req, expiry_ms)
                .await?;
        debug!(resource = %echoed(&req.resource_id), owner = %echoed(&req.lock_owner), expiry_ms, taken, "Lock requested.");
        Ok(taken)
    }

    async fn unlock(&self, req: UnlockRequest) -> Result<UnlockStatus, LockError> {
        check_request(&req.resource_id, &req.lock_owner)?;
        self.register();
        let status = self.by_owner(&req, None).await?;
        debug!(resource = %echoed(&req.resource_id), owner = %echoed(&req.lock_owner), ?status, "Unlock requested.");
        Ok(status)
    }

    async fn keep_alive(&self, req: TryLockRequest) -> Result<UnlockStatus, LockError> {
        check_request(&req.resource_id, &req.lock_owner)?;
        let expiry_ms = expiry_ms(&req)?;
        self.register();
        let status = self.by_owner(&owned(&req), Some(expiry_ms)).await?;
        debug!(resource = %echoed(&req.resource_id), owner = %echoed(&req.lock_owner), expiry_ms, ?status, "Lock renewal requested.");
        Ok(status)
    }
}

/// The owner's side of `req`: what its unlock or keep-alive names.
fn owned(req: &TryLockRequest) -> UnlockRequest {
    UnlockRequest {
        resource_id: req.resource_id.clone(),
        lock_owner: req.lock_owner.clone(),
    }
}

impl RedisLock {
    /// `SET NX PX`: whether `req`'s lock was taken in `namespace`.
    async fn take_if_free(
        &self,
        namespace: &Namespace,
        req: &TryLockRequest,
        expiry_ms: u64,
    ) -> Result<bool, LockError> {
        let session = &namespace.session;
        let mut conn = session
            .connection()
            .map_err(|err| LockError::Backend(err.to_string()))?;
        let reply: Option<String> = redis::cmd("SET")
            .arg(namespace.key(&req.resource_id))
            .arg(&req.lock_owner)
            .arg("NX")
            .arg("PX")
            .arg(expiry_ms)
            .query_async(&mut conn)
            .await
            .map_err(|err| LockError::Backend(self.connection.describe(session, &err)))?;
        Ok(reply.is_some())
    }

    /// After `SET NX` took `req`'s lock in `namespace` (the grace `seen`
    /// consulted before): when another namespace came in force meanwhile
    /// (a change committed, or a rebuilt successor of this store started),
    /// the lock is taken in the one in force now too (`SET NX`) and the
    /// copy in `namespace` released; held there by someone, the copy is
    /// released and the lock not granted. A grace that came in force
    /// meanwhile (the namespace in force one change earlier, or the
    /// namespace a closed successor leaves) is consulted first: a
    /// lock held there is not granted either.
    ///
    /// Why no two owners win a resource across a change from namespace O
    /// to N: a winner's lock ends in the namespace in force at its last
    /// look, which came after its last `SET NX`. Two winners that ended in
    /// the same namespace both took the same key there with `SET NX`:
    /// Redis granted one. Say A ended in O and B in N: A's last look,
    /// after taking the key in O, came before N was put in force (for a
    /// rebuild: before the successor on N was registered, which it is
    /// before it serves). If B started on N, it loaded the grace (stored
    /// before N) after that and looked in O, where A's lock was (a move
    /// writes the new copy before it deletes the old one: a held lock is
    /// always in one of them), and B was refused. If B started on O and
    /// moved to N, both took the key in O, so B's copy was gone before A
    /// took it; B deletes it only after a look that saw N, so A's look,
    /// later, saw N too: A did not end in O. One change further (O, then
    /// N, then M): a request that follows from O to M looks in N first,
    /// after M was in force, so after any lock taken on N in its time.
    /// (Assumed, as everywhere: locks do not expire meanwhile, and the
    /// grace still covers the namespace one change back.)
    async fn follow_changes(
        &self,
        mut namespace: Namespace,
        seen: Option<Arc<Previous>>,
        req: &TryLockRequest,
        expiry_ms: u64,
    ) -> Result<bool, LockError> {
        loop {
            let (current, grace) = self.in_force();
            let unseen = grace.previous().filter(|previous| {
                !seen
                    .as_ref()
                    .is_some_and(|seen| Arc::ptr_eq(seen, previous))
            });
            let elsewhere = unseen.iter().flat_map(Previous::chain).filter(|previous| {
                !previous.namespace.same(&namespace) && !previous.namespace.same(&current)
            });
            for previous in elsewhere {
                let held = self.held_before(&grace, &previous, &req.resource_id).await;
                if !matches!(held, Ok(false)) {
                    self.release_copy(&namespace, &owned(req)).await;
                    debug!(resource = %echoed(&req.resource_id), held = ?held, "Lock taken as the namespace changed; held in the namespace in force before.");
                    return held.map(|_| false);
                }
            }
            if current.same(&namespace) {
                return Ok(true);
            }
            let taken = self.take_if_free(&current, req, expiry_ms).await;
            self.release_copy(&namespace, &owned(req)).await;
            debug!(resource = %echoed(&req.resource_id), taken = ?taken, "Lock taken as the namespace changed; followed to the new one.");
            match taken {
                Ok(true) => namespace = current,
                other => return other,
            }
        }
    }

    /// Releases `req`'s copy of the lock in `namespace`, left by a move:
    /// best effort, within its look-up limit (a copy left behind expires).
    async fn release_copy(&self, namespace: &Namespace, req: &UnlockRequest) {
        let limit = previous_limit(namespace.session.metadata());
        let release = self.owner_script(namespace, &scripts::UNLOCK, req, None);
        match tokio::time::timeout(limit, release).await {
            Ok(Ok(_)) => {}
            Ok(Err(err)) => {
                debug!(resource = %echoed(&req.resource_id), error = %err, "A moved lock's copy was not released; it expires.");
            }
            Err(_) => {
                debug!(resource = %echoed(&req.resource_id), ?limit, "A moved lock's copy was not released in time; it expires.");
            }
        }
    }

    /// The owner's unlock (`renew_ms` none) or keep-alive, where the lock
    /// is: in this store's namespace; else in the previous one (a
    /// keep-alive moves it over); else in the one in force now (this
    /// store's, or its rebuilt successor's). A concurrent request of the
    /// same owner (a keep-alive, a try-lock that followed a change) may
    /// have moved the lock there while this one looked elsewhere, and a
    /// move writes the new copy before it deletes the old one: missed in
    /// the old namespace, it is in the new one.
    async fn by_owner(
        &self,
        req: &UnlockRequest,
        renew_ms: Option<u64>,
    ) -> Result<UnlockStatus, LockError> {
        let script: &LuaScript = match renew_ms {
            Some(_) => &scripts::KEEP_ALIVE,
            None => &scripts::UNLOCK,
        };
        let namespace = self.namespace();
        let status = self.owner_script(&namespace, script, req, renew_ms).await?;
        if status != UnlockStatus::LockDoesNotExist {
            return Ok(status);
        }
        let previous: Vec<_> = self
            .grace
            .previous()
            .iter()
            .flat_map(Previous::chain)
            .filter(|previous| !previous.namespace.same(&namespace))
            .collect();
        for previous in &previous {
            let status = match renew_ms {
                Some(expiry_ms) => self.move_over(previous, &namespace, req, expiry_ms).await?,
                None => {
                    self.owner_script_before(previous, script, req, None)
                        .await?
                }
            };
            if status != UnlockStatus::LockDoesNotExist {
                return Ok(status);
            }
        }
        let (current, _) = self.in_force();
        if previous.is_empty() && current.same(&namespace) {
            // No change to move it: it does not exist.
            return Ok(UnlockStatus::LockDoesNotExist);
        }
        self.owner_script(&current, script, req, renew_ms).await
    }

    /// A keep-alive of a lock held in the previous namespace: renewed
    /// there, taken in `namespace` for `expiry_ms` (renewed, when a
    /// concurrent keep-alive of the same owner moved it first), then
    /// released in the old one.
    async fn move_over(
        &self,
        previous: &Arc<Previous>,
        namespace: &Namespace,
        req: &UnlockRequest,
        expiry_ms: u64,
    ) -> Result<UnlockStatus, LockError> {
        let before = self
            .owner_script_before(previous, &scripts::KEEP_ALIVE, req, Some(expiry_ms))
            .await?;
        if before != UnlockStatus::Success {
            return Ok(before);
        }
        let moved = self
            .owner_script(namespace, &scripts::TAKE_OR_RENEW, req, Some(expiry_ms))
            .await?;
        if moved != UnlockStatus::Success {
            return Ok(moved);
        }
        // Moved: the copy left in the old namespace expires if this fails.
        let _ = self
            .owner_script_before(previous, &scripts::UNLOCK, req, None)
            .await;
        Ok(UnlockStatus::Success)
    }
}

/// The expiry in whole milliseconds, rounded up (a sub-millisecond expiry
/// still expires); zero and over-long expiries refused.
fn expiry_ms(req: &TryLockRequest) -> Result<u64, LockError> {
    if req.expiry.is_zero() {
        return Err(LockError::Invalid(format!(
            "expiry of the lock on `{}` must be positive",
            echoed(&req.resource_id)
        )));
    }
    check_ttl("expiry", req.expiry).map_err(|message| {
        LockError::Invalid(format!("lock on `{}`: {message}", echoed(&req.resource_id)))
    })?;
    Ok(u64::try_from(req.expiry.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX))
}

/// The status a reply of the unlock or keep-alive script means.
fn status_of(reply: i64, script: &str) -> Result<UnlockStatus, LockError> {
    match reply {
        scripts::UNLOCKED => Ok(UnlockStatus::Success),
        scripts::NO_LOCK => Ok(UnlockStatus::LockDoesNotExist),
        scripts::OTHER_OWNER => Ok(UnlockStatus::LockBelongsToOthers),
        other => Err(LockError::Backend(format!(
            "unexpected reply {other} from the {script} script"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lock_for(expiry: Duration) -> TryLockRequest {
        TryLockRequest {
            resource_id: "r".into(),
            lock_owner: "a".into(),
            expiry,
        }
    }

    /// Every positive expiry is at least 1 ms, rounded up. Before: one
    /// under a microsecond came out as 0 ms, which Redis refuses for
    /// `SET … PX` (the try-lock failed with a backend error).
    #[test]
    fn a_sub_microsecond_expiry_rounds_up_to_a_millisecond() {
        assert_eq!(expiry_ms(&lock_for(Duration::from_nanos(1))), Ok(1));
        assert_eq!(expiry_ms(&lock_for(Duration::from_micros(1))), Ok(1));
        assert_eq!(expiry_ms(&lock_for(Duration::from_micros(1001))), Ok(2));
        assert_eq!(expiry_ms(&lock_for(Duration::from_secs(1))), Ok(1000));
        assert!(matches!(
            expiry_ms(&lock_for(Duration::ZERO)),
            Err(LockError::Invalid(_))
        ));
    }
}
