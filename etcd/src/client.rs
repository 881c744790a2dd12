//! [`Client`]: a channel to etcd, the auth token, and one method per call
//! rewire makes.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use tonic::metadata::AsciiMetadataValue;
use tonic::service::interceptor::InterceptedService;
use tonic::service::Interceptor;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::error::{Error, ResponseLimit, PERMISSION_DENIED};
use crate::pb::{
    auth_client::AuthClient, kv_client::KvClient, maintenance_client::MaintenanceClient,
    watch_client::WatchClient, AuthDisableRequest, AuthEnableRequest, AuthRoleAddRequest,
    AuthRoleGrantPermissionRequest, AuthUserAddRequest, AuthUserGrantRoleRequest,
    AuthUserRevokeRoleRequest, AuthenticateRequest, CompactionRequest, DeleteRangeRequest,
    DeleteRangeResponse, PutRequest, PutResponse, RangeRequest, RangeResponse, StatusRequest,
    StatusResponse, TxnRequest, TxnResponse,
};

/// The channel with the auth token attached to every request.
pub(crate) type Service = InterceptedService<Channel, TokenInterceptor>;

/// How to connect: limits, keep-alive, credentials, TLS. Its `Debug`
/// shows the user name but never the password.
#[derive(Clone)]
pub struct ConnectOptions {
    /// Limit on opening a connection: on the TCP connect, and again on
    /// the TLS handshake.
    pub connect_timeout: Duration,
    /// Limit on each call on one member, the logins it waits for or makes
    /// included (for a watch: on opening the stream); after a login that
    /// succeeded the call keeps at least half of it, up to 1.5 × it on the
    /// member in all (see [`Client`]).
    pub timeout: Duration,
    /// HTTP/2 ping interval and the wait for its answer, if any.
    pub keep_alive: Option<(Duration, Duration)>,
    /// `(user, password)` to log in with, if any.
    pub user: Option<(String, String)>,
    /// TLS settings for `https://` endpoints (default: the system's roots).
    pub tls: Option<TlsOptions>,
    /// The largest answer accepted, in bytes (default
    /// [`DEFAULT_MAX_RESPONSE_SIZE`]); a larger one fails its call with
    /// [`Error::TooLarge`] before any of it is buffered.
    pub max_response_size: usize,
    /// The setting that raises `max_response_size` (a metadata field),
    /// named in [`Error::TooLarge`]; none: the error names no setting.
    pub max_response_size_setting: Option<&'static str>,
}

/// The default [`ConnectOptions::max_response_size`]: 64 MiB.
///
/// The gRPC decoder reserves the length an answer announces before it
/// reads it, so this bound is what one stream may make the client
/// allocate on the word of the server — or of anyone in between on a
/// plain `http://` connection: `i32::MAX` (what etcd's Go client accepts)
/// would let each announce 2 GiB. Not gRPC's 4 MiB default either: etcd
/// caps each request (1.5 MiB by default), not the answers, so a range
/// over a prefix, or a watch response catching up on many revisions, is
/// as large as the values it holds; 64 MiB reads a config prefix of
/// dozens of values at etcd's largest. A client for more raises it.
pub const DEFAULT_MAX_RESPONSE_SIZE: usize = 64 * 1024 * 1024;

/// TLS for `https://` endpoints, as PEM bytes.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct TlsOptions {
    /// The CA bundle that signs the servers' certificates; none: the
    /// system's roots.
    pub ca_pem: Option<Vec<u8>>,
    /// `(certificate chain, key)` for etcd's `--client-cert-auth`.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
    /// The name to verify in the servers' certificates, when not the
    /// endpoint's host.
    pub domain: Option<String>,
}

impl std::fmt::Debug for TlsOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsOptions")
            .field("ca", &self.ca_pem.as_ref().map(|_| "<PEM>"))
            .field("identity", &self.identity.as_ref().map(|_| "<PEM>"))
            .field("domain", &self.domain)
            .finish()
    }
}

impl TlsOptions {
    /// The tonic configuration, its handshake bounded by `handshake`.
    ///
    /// tonic's `connect_timeout` covers the TCP connect only: without this
    /// bound a peer that accepts the connection and then says nothing (a
    /// host dead mid-handshake, a proxy holding the socket) keeps the
    /// channel connecting for ever, never dialling again — every call on
    /// that member would time out until the channels are rebuilt.
    fn tonic(&self, handshake: Duration) -> ClientTlsConfig {
        let mut config = ClientTlsConfig::new().timeout(handshake);
        config = match &self.ca_pem {
            Some(ca) => config.ca_certificate(Certificate::from_pem(ca)),
            // The system's roots (tonic's `tls-native-roots`; without
            // that feature `with_enabled_roots` would trust nothing).
            None => config.with_native_roots(),
        };
        if let Some((cert, key)) = &self.identity {
            config = config.identity(Identity::from_pem(cert, key));
        }
        if let Some(domain) = &self.domain {
            config = config.domain_name(domain);
        }
        config
    }
}

impl std::fmt::Debug for ConnectOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let user = self
            .user
            .as_ref()
            .map(|(name, _)| (name.as_str(), "[redacted]"));
        f.debug_struct("ConnectOptions")
            .field("connect_timeout", &self.connect_timeout)
            .field("timeout", &self.timeout)
            .field("keep_alive", &self.keep_alive)
            .field("user", &user)
            .field("tls", &self.tls)
            .field("max_response_size", &self.max_response_size)
            .field("max_response_size_setting", &self.max_response_size_setting)
            .finish()
    }
}

impl Default for ConnectOptions {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(5),
            timeout: Duration::from_secs(5),
            keep_alive: None,
            user: None,
            tls: None,
            max_response_size: DEFAULT_MAX_RESPONSE_SIZE,
            max_response_size_setting: None,
        }
    }
}

/// When a call on one member must end (tokio's clock: paused in tests).
type Deadline = tokio::time::Instant;

/// Adds the current auth token (if any) to each request as `token`.
#[derive(Clone, Default)]
pub(crate) struct TokenInterceptor {
    token: Arc<RwLock<Option<AsciiMetadataValue>>>,
    /// Set when the server refused the token in a place where the call
    /// cannot log in again by itself (a watch canceled in its stream): the
    /// next call logs in first.
    stale: Arc<AtomicBool>,
    /// Counts the logins that succeeded: a call refused for its token logs
    /// in again only if no login succeeded since it read this.
    generation: Arc<AtomicU64>,
    /// Counts the login attempts that finished, succeeded or failed: a
    /// call refused for its token takes the outcome of one finished since
    /// it read this rather than try again itself.
    attempts: Arc<AtomicU64>,
    /// Held while logging in, so that the calls refused together log in
    /// once (each login is a bcrypt check and a raft proposal in etcd);
    /// holds the failure of the last attempt, if it failed.
    login_turn: Arc<tokio::sync::Mutex<Option<LoginFailure>>>,
    /// Set while the last login found authentication off, so that it is
    /// logged once each time it turns off, not at every login.
    auth_off: Arc<AtomicBool>,
    /// The last refusal of a watch's token or permissions that asked for a
    /// login, while the streak goes on: see
    /// [`refused_watch`](Self::refused_watch).
    refused: Arc<std::sync::Mutex<Option<RefusedWatch>>>,
}

/// A watch refused for its token or permissions, which asked for a login.
#[derive(Debug, Clone, Copy)]
struct RefusedWatch {
    /// The login generation of the refused token.
    generation: u64,
    /// When the login was asked for.
    at: Instant,
}

/// How long a streak of watches refused with `permission denied` despite a
/// fresh token goes without asking for another login: etcd's default
/// token TTL. Older etcd releases say `permission denied` for an expired token
/// too (a JWT's lifetime, unlike a simple token's, does not grow with
/// use), so one login per this long, not none, keeps such a token from
/// being kept for ever.
const REFUSED_WATCH_RELOGIN: Duration = Duration::from_secs(5 * 60);

/// A login attempt that failed: the member it ran on, and the error its
/// call returned.
#[derive(Debug, Clone)]
struct LoginFailure {
    member: usize,
    error: Error,
}

/// Why a call logs in, which decides what a login that runs out means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LoginCause {
    /// A watch found the token refused, so the call logs in before it is
    /// made: its member has not answered it, and one that does not answer
    /// the login either (hung, cut off from the leader) is left for the
    /// next one — [`Error::Timeout`].
    Stale,
    /// The member just refused the call's token: it answers, so a login
    /// that runs out is slow, not gone — [`Error::LoginTimeout`], and the
    /// client stays on it.
    Refused,
}

impl LoginCause {
    /// A login's failure `err` as a call logging in for this cause takes
    /// it.
    fn failure(self, err: Error) -> Error {
        match (self, err) {
            (Self::Refused, Error::Timeout(limit)) => Error::LoginTimeout(limit),
            (_, other) => other,
        }
    }
}

/// Where the logins stood when a call read its token: see
/// [`Client::login_once`].
#[derive(Debug, Clone, Copy)]
struct LoginMark {
    generation: u64,
    attempts: u64,
}

impl std::fmt::Debug for TokenInterceptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let set = self.token.read().is_ok_and(|t| t.is_some());
        f.debug_struct("TokenInterceptor")
            .field("token", &if set { "[redacted]" } else { "none" })
            .field("stale", &self.stale)
            .finish()
    }
}

impl TokenInterceptor {
    /// Asks for a fresh login before the next call.
    pub(crate) fn mark_stale(&self) {
        self.stale.store(true, Ordering::Release);
    }

    /// A watch opened with the token of login `generation` was canceled
    /// for `reason` (an auth reason, see `is_auth_cancel`): asks for a
    /// fresh login unless it would not help.
    ///
    /// `permission denied` is ambiguous: older etcd releases say it for a token
    /// unknown or expired as well as for a user whose roles do not cover
    /// the keys. So it asks for a login unless the token is one logged in
    /// for after an earlier refusal of the streak (of either kind): then
    /// the roles are at fault, and a login per retry — a bcrypt check and
    /// a raft proposal each, for as long as the watch is retried — would
    /// only load the server. The streak ends once a watch is created, or
    /// fails otherwise ([`watch_went_on`](Self::watch_went_on)); meanwhile
    /// it asks again at most once per [`REFUSED_WATCH_RELOGIN`]. Any other
    /// auth reason (`invalid auth token`, …) asks every time: the token is
    /// at fault.
    pub(crate) fn refused_watch(&self, generation: u64, reason: &str) {
        let mut refused = self.refused.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(streak) = *refused {
            let fresh = generation > streak.generation;
            if reason.contains(PERMISSION_DENIED)
                && fresh
                && streak.at.elapsed() < REFUSED_WATCH_RELOGIN
            {
                return;
            }
        }
        let generation = refused.map_or(generation, |streak| streak.generation.max(generation));
        *refused = Some(RefusedWatch {
            generation,
            at: Instant::now(),
        });
        self.mark_stale();
    }

    /// A watch was created, or failed other than for its token or
    /// permissions: a later refusal starts a new streak.
    pub(crate) fn watch_went_on(&self) {
        *self.refused.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// Whether a fresh login was asked for.
    fn is_stale(&self) -> bool {
        self.stale.load(Ordering::Acquire)
    }

    /// How many logins succeeded so far.
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Where the logins stand now.
    fn mark(&self) -> LoginMark {
        LoginMark {
            generation: self.generation(),
            attempts: self.attempts.load(Ordering::Acquire),
        }
    }

    /// Keeps the token of a login that succeeded, or none when the login
    /// found authentication off on `member` (etcd refuses a token then).
    fn logged_in(&self, token: Option<AsciiMetadataValue>, member: &str) {
        let auth_off = token.is_none();
        *self.token.write().unwrap_or_else(|p| p.into_inner()) = token;
        self.generation.fetch_add(1, Ordering::AcqRel);
        if auth_off && !self.auth_off.swap(true, Ordering::AcqRel) {
            tracing::info!(
                member,
                "etcd has authentication off: calls go without a token until it is on again"
            );
        } else if !auth_off {
            self.auth_off.store(false, Ordering::Release);
        }
    }
}

/// Clears the request for a fresh login while one is made, and asks again
/// when dropped before [`disarm`](Self::disarm): a login that failed, or
/// whose caller gave up on it (a readiness probe's bound), leaves it asked.
struct StaleUntilLoggedIn<'a> {
    token: &'a TokenInterceptor,
    was_stale: bool,
}

impl<'a> StaleUntilLoggedIn<'a> {
    fn take(token: &'a TokenInterceptor) -> Self {
        let was_stale = token.stale.swap(false, Ordering::AcqRel);
        Self { token, was_stale }
    }

    fn disarm(mut self) {
        self.was_stale = false;
    }
}

impl Drop for StaleUntilLoggedIn<'_> {
    fn drop(&mut self) {
        if self.was_stale {
            self.token.mark_stale();
        }
    }
}

impl Interceptor for TokenInterceptor {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        let token = self.token.read().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some(token) = token {
            request.metadata_mut().insert("token", token);
        }
        Ok(request)
    }
}

/// One channel per member, and the member calls go to.
pub(crate) struct Members {
    /// `(url, channel)` of each endpoint, in the order given.
    channels: Vec<(String, Service)>,
    /// The same channels without a token, to log in on: etcd checks the
    /// token of an `Authenticate` request too, so one the server no longer
    /// knows (a member restarted, the token's TTL lapsed) would make the
    /// login itself fail with "invalid auth token".
    logins: Vec<Service>,
    /// Index into `channels` of the member in use.
    current: AtomicUsize,
    /// Which channels these are (see [`Client::channels_generation`]).
    generation: u64,
}

impl std::fmt::Debug for Members {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let urls: Vec<&str> = self.channels.iter().map(|(url, _)| url.as_str()).collect();
        f.debug_struct("Members")
            .field("urls", &urls)
            .field("current", &self.current)
            .finish()
    }
}

impl Members {
    /// A lazily connected channel to each of `endpoints`, calls going to
    /// `current` first; `generation` tells them apart.
    fn new(
        endpoints: &[String],
        options: &ConnectOptions,
        token: &TokenInterceptor,
        current: usize,
        generation: u64,
    ) -> Result<Self, Error> {
        let mut channels = Vec::with_capacity(endpoints.len());
        let mut logins = Vec::with_capacity(endpoints.len());
        for url in endpoints {
            let channel = endpoint(url, options)?.connect_lazy();
            let no_token = TokenInterceptor::default();
            logins.push(InterceptedService::new(channel.clone(), no_token));
            channels.push((url.clone(), InterceptedService::new(channel, token.clone())));
        }
        Ok(Self {
            channels,
            logins,
            current: AtomicUsize::new(current % endpoints.len().max(1)),
            generation,
        })
    }

    /// The member in use: its index and channel.
    pub(crate) fn current(&self) -> (usize, Service) {
        let index = self.current.load(Ordering::Acquire) % self.channels.len();
        (index, self.channels[index].1.clone())
    }

    /// Moves on from member `index` to the next one, unless another call
    /// already did.
    pub(crate) fn skip(&self, index: usize) {
        let next = (index + 1) % self.channels.len();
        let _ = self
            .current
            .compare_exchange(index, next, Ordering::AcqRel, Ordering::Acquire);
    }

    /// Member `index`'s channel without the token, for logging in.
    fn login_channel(&self, index: usize) -> Service {
        self.logins[index % self.logins.len()].clone()
    }

    fn len(&self) -> usize {
        self.channels.len()
    }

    fn url(&self, index: usize) -> &str {
        self.channels.get(index).map_or("", |(url, _)| url.as_str())
    }
}

/// A connection to an etcd cluster; cheap to clone (clones share the
/// channels, the member in use and the token).
///
/// Calls go to one member at a time (the first endpoint to begin with).
/// When that member is unreachable — refused, reset, no answer within the
/// time limit, or it reports no leader — the client moves on to the next
/// endpoint and makes the call there, trying each member at most once per
/// call; later calls stay on the member that answered. Everything a call
/// does on one member — waiting for another call's login, logging in,
/// the call, and after a refused token the login and the call once more —
/// shares one `timeout`, except that after a login that succeeded the
/// call keeps at least half of `timeout` from then on (a slow login must
/// not fail a healthy member's call), up to 1.5 × `timeout` on the member
/// in all; so a call takes at most 1.5 × `timeout` × the number of
/// endpoints (and so does [`connect`](Self::connect)). A write that timed
/// out may have been applied before it is made again on the next member:
/// puts and deletes are idempotent, and a transaction guarded by a compare
/// (as rewire's are) fails its compare rather than apply twice.
///
/// [`replace_tls`](Self::replace_tls) connects anew with other TLS
/// material and, once a member answers on the new channels, makes every
/// clone use them; calls (and watches) in flight finish on the old ones.
#[derive(Clone)]
pub struct Client {
    /// The channels in force: replaced as a whole by `replace_tls`.
    members: Arc<RwLock<Arc<Members>>>,
    token: TokenInterceptor,
    user: Option<Arc<(String, String)>>,
    timeout: Duration,
    /// The largest answer accepted, and the setting that raises it.
    limit: ResponseLimit,
    /// What the channels were made from, to make them again.
    endpoints: Arc<Vec<String>>,
    options: Arc<RwLock<ConnectOptions>>,
    /// Counts the replacements of the channels.
    replaced: Arc<watch::Sender<u64>>,
    /// The last generation given to channels made for this client.
    generations: Arc<AtomicU64>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("member", &self.member())
            .field("user", &self.user.as_ref().map(|u| u.0.as_str()))
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// A client of the servers at `endpoints` (URLs: `http://host:port`,
    /// `https://host:port`); logs in first when `options.user` is set.
    /// Connections open lazily: an unreachable server shows in the first
    /// call.
    pub async fn connect(endpoints: &[String], options: ConnectOptions) -> Result<Self, Error> {
        if endpoints.is_empty() {
            return Err(Error::NoEndpoint);
        }
        let token = TokenInterceptor::default();
        let members = Members::new(endpoints, &options, &token, 0, 0)?;
        let client = Self {
            members: Arc::new(RwLock::new(Arc::new(members))),
            token,
            user: options.user.clone().map(Arc::new),
            timeout: options.timeout,
            limit: ResponseLimit {
                bytes: options.max_response_size,
                setting: options.max_response_size_setting,
            },
            endpoints: Arc::new(endpoints.to_vec()),
            options: Arc::new(RwLock::new(options)),
            replaced: Arc::new(watch::Sender::new(0)),
            generations: Arc::new(AtomicU64::new(0)),
        };
        if client.user.is_some() {
            client
                .failover(|index, _| client.login(index, client.deadline()))
                .await?;
        }
        Ok(client)
    }

    /// The URL of the member calls go to now.
    pub fn member(&self) -> String {
        let members = self.members();
        let (index, _) = members.current();
        members.url(index).to_string()
    }

    /// The channels in force.
    pub(crate) fn members(&self) -> Arc<Members> {
        Arc::clone(&self.members.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// Which channels calls go to now: 0 for those
    /// [`connect`](Self::connect) made, another number (never used
    /// before by this client or its clones) for each set
    /// [`replace_tls`](Self::replace_tls) swaps in. A call uses the
    /// channels in force when it starts throughout, so a call started and
    /// finished with the same generation read before and after it ran on
    /// that generation's channels (a set swapped out never comes back).
    pub fn channels_generation(&self) -> u64 {
        self.members().generation
    }

    /// Connects anew to the same endpoints with `tls` (same limits, user
    /// and auth token), checks that a member answers `Status` there, then
    /// makes this client and every clone of it use the new channels. Calls
    /// in flight finish on the old channels, and a watch opened before
    /// keeps its stream: [`replacements`](Self::replacements) tells its
    /// owner to watch again. On an error nothing changes. The `Status` a
    /// member answered on the new channels (its header names the cluster
    /// they reached).
    pub async fn replace_tls(&self, tls: Option<TlsOptions>) -> Result<StatusResponse, Error> {
        let mut options = self
            .options
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        options.tls = tls;
        let current = self.members().current.load(Ordering::Acquire);
        let generation = self.generations.fetch_add(1, Ordering::AcqRel) + 1;
        let members = Members::new(&self.endpoints, &options, &self.token, current, generation)?;
        let trial = Self {
            members: Arc::new(RwLock::new(Arc::new(members))),
            ..self.clone()
        };
        let status = trial.status().await?;
        let members = trial.members();
        *self.options.write().unwrap_or_else(|p| p.into_inner()) = options;
        *self.members.write().unwrap_or_else(|p| p.into_inner()) = members;
        self.replaced.send_modify(|n| *n += 1);
        Ok(status)
    }

    /// Changes (its value counts them) each time
    /// [`replace_tls`](Self::replace_tls) swaps the channels in.
    pub fn replacements(&self) -> watch::Receiver<u64> {
        self.replaced.subscribe()
    }

    /// The limit on an answer, and the setting that raises it.
    pub(crate) fn limit(&self) -> ResponseLimit {
        self.limit
    }

    pub(crate) fn token(&self) -> &TokenInterceptor {
        &self.token
    }

    /// Logs in on member `index` with the client's user (sending no
    /// token) and keeps the token for later calls. On an etcd with
    /// authentication off (it refuses the login) calls go without a token:
    /// a user configured for a cluster that has none, or one turned off
    /// under the client, is no error. Bounded by `deadline`.
    async fn login(&self, index: usize, deadline: Deadline) -> Result<(), Error> {
        let Some(user) = &self.user else {
            return Ok(());
        };
        let request = AuthenticateRequest {
            name: user.0.clone(),
            password: user.1.clone(),
        };
        let members = self.members();
        let mut auth = self.auth(members.login_channel(index));
        let response = match self
            .bounded_until(deadline, auth.authenticate(request))
            .await
        {
            Ok(response) => response,
            // As etcd's Go client does: no token, and calls carry on.
            Err(err) if err.is_auth_not_enabled() => {
                self.token.logged_in(None, members.url(index));
                return Ok(());
            }
            Err(err) => return Err(err),
        };
        let token = AsciiMetadataValue::try_from(response.token.as_str()).map_err(|_| {
            Error::Status(tonic::Status::internal(
                "the server sent an auth token that is not ASCII",
            ))
        })?;
        self.token.logged_in(Some(token), members.url(index));
        Ok(())
    }

    /// Logs in on member `index` unless another call did since this one
    /// read `seen` (and no fresh login was asked for since): the calls
    /// refused together — hundreds after a restart or a change of users —
    /// make one login, not one each. A login attempt of another call that
    /// finished since and failed fails this call too, with its error: one
    /// failed login per round, not one per waiting call, one after
    /// another. One login at a time; the wait for a turn and the login
    /// are bounded by `deadline`, the call's on this member.
    ///
    /// What a login that runs out means depends on `cause`: before the
    /// call ([`LoginCause::Stale`]) the member has not answered, and it is
    /// [`Error::Timeout`], so the call moves on to the next member (else a
    /// hung member would keep the client, every call logging in on it
    /// again); after the member refused the token ([`LoginCause::Refused`])
    /// it is [`Error::LoginTimeout`], which does not move the client: a
    /// slow login (bcrypt and a raft proposal in etcd, queued behind
    /// others) is no sign of a member gone, and every waiter moving on
    /// would walk the client round the cluster. A wait for another call's
    /// login that runs out is `LoginTimeout` too.
    ///
    /// Another attempt's failure on this call's member is this call's, as
    /// `cause` takes it (after one that ran out before its call moved the
    /// client on, a waiter logging in first follows). On another member,
    /// a failure saying that member is unreachable is no sign about this
    /// one: this call logs in itself, on its own member.
    async fn login_once(
        &self,
        index: usize,
        seen: LoginMark,
        cause: LoginCause,
        deadline: Deadline,
    ) -> Result<(), Error> {
        if self.user.is_none() {
            return Ok(());
        }
        let mut last_failure = tokio::time::timeout_at(deadline, self.token.login_turn.lock())
            .await
            .map_err(|_| Error::LoginTimeout(self.timeout))?;
        if self.token.generation() != seen.generation && !self.token.is_stale() {
            return Ok(());
        }
        if self.token.attempts.load(Ordering::Acquire) != seen.attempts {
            match last_failure.as_ref() {
                Some(failure) if failure.member != index && failure.error.is_unreachable() => {}
                Some(failure) => return Err(cause.failure(failure.error.clone())),
                None => {}
            }
        }
        let stale = StaleUntilLoggedIn::take(&self.token);
        let login = self
            .login(index, deadline)
            .await
            .map_err(|err| cause.failure(err));
        *last_failure = login.as_ref().err().map(|error| LoginFailure {
            member: index,
            error: error.clone(),
        });
        self.token.attempts.fetch_add(1, Ordering::AcqRel);
        login?;
        stale.disarm();
        Ok(())
    }

    /// When a call starting now on one member must end: after the time
    /// limit.
    fn deadline(&self) -> Deadline {
        Deadline::now() + self.timeout
    }

    /// Runs `call` until `deadline` ([`Error::Timeout`] then), in a trace
    /// span named after the request (`etcd Range`); an answer over the
    /// size limit is [`Error::TooLarge`].
    pub(crate) async fn bounded_until<R>(
        &self,
        deadline: Deadline,
        call: impl Future<Output = Result<tonic::Response<R>, tonic::Status>>,
    ) -> Result<R, Error> {
        use tracing::Instrument;
        let operation = operation_of::<R>();
        let span = tracing::info_span!(
            "rewire.etcd",
            otel.name = tracing::field::Empty,
            otel.kind = "client",
            db.system = "etcd",
            db.operation = operation,
        );
        if !span.is_disabled() {
            span.record("otel.name", format!("etcd {operation}"));
        }
        match tokio::time::timeout_at(deadline, call.instrument(span)).await {
            Ok(Ok(response)) => Ok(response.into_inner()),
            Ok(Err(status)) => Err(self.limit.error(status)),
            Err(_) => Err(Error::Timeout(self.timeout)),
        }
    }

    /// Runs `attempt` on the member in use; while it finds the member
    /// unreachable, moves on to the next one and runs it there (each
    /// member at most once).
    /// `attempt` gets the member's index and channel.
    pub(crate) async fn failover<R, F, Fut>(&self, attempt: F) -> Result<R, Error>
    where
        F: Fn(usize, Service) -> Fut,
        Fut: Future<Output = Result<R, Error>>,
    {
        let members = self.members();
        let mut tries = members.len();
        loop {
            let (index, service) = members.current();
            match attempt(index, service).await {
                Err(err) if err.is_unreachable() => {
                    members.skip(index);
                    tries -= 1;
                    if tries == 0 {
                        return Err(err);
                    }
                }
                other => return other,
            }
        }
    }

    /// Runs `call` within the time limit, failing over between members;
    /// on an expired or unknown token, logs in again and runs it once
    /// more. Logs in first when a watch found the token refused (see
    /// [`WatchStream::message`](crate::WatchStream::message)). All of it
    /// on one member ends within the time limit: see [`Client`].
    pub(crate) async fn call<R, F, Fut>(&self, call: F) -> Result<R, Error>
    where
        F: Fn(Service) -> Fut,
        Fut: Future<Output = Result<tonic::Response<R>, tonic::Status>>,
    {
        self.call_on(|_, service| call(service)).await
    }

    /// [`call`](Self::call), `call` getting the index of the member it
    /// runs on as well: the one [`failover`](Self::failover) chose, not
    /// whatever member is in use by the time `call` reads it (another
    /// call may have moved on meanwhile).
    pub(crate) async fn call_on<R, F, Fut>(&self, call: F) -> Result<R, Error>
    where
        F: Fn(usize, Service) -> Fut,
        Fut: Future<Output = Result<tonic::Response<R>, tonic::Status>>,
    {
        let call = &call;
        self.failover(move |index, service| async move {
            let mut deadline = self.deadline();
            let hard = deadline + self.timeout / 2;
            let seen = self.token.mark();
            let logged_in_first = self.user.is_some() && self.token.is_stale();
            if logged_in_first {
                self.login_once(index, seen, LoginCause::Stale, deadline)
                    .await?;
                deadline = self.after_login(deadline, hard);
            }
            let seen = self.token.mark();
            match self
                .bounded_until(deadline, call(index, service.clone()))
                .await
            {
                Err(err) if err.is_invalid_token() && self.user.is_some() => {
                    self.login_once(index, seen, LoginCause::Refused, deadline)
                        .await?;
                    let deadline = self.after_login(deadline, hard);
                    // The member answered the call and the login: out of
                    // time now, the time went into logging in, as when
                    // the login runs out — no sign of a member gone.
                    self.bounded_until(deadline, call(index, service))
                        .await
                        .map_err(|err| LoginCause::Refused.failure(err))
                }
                // The member just answered the login: the time went into
                // it (a slow login on a degraded cluster), no sign of a
                // member gone — failover must not skip it.
                Err(err) if logged_in_first => Err(LoginCause::Refused.failure(err)),
                other => other,
            }
        })
        .await
    }

    /// The deadline of what a call still does on a member after a login
    /// that succeeded there, given the one it had (`deadline`): at least
    /// half the limit from now — a slow login
    /// (each about 0.6 × the limit on a degraded but healthy cluster)
    /// leaves the call the time it needs — but never past `hard`, 1.5 ×
    /// the limit after the call began on the member.
    fn after_login(&self, deadline: Deadline, hard: Deadline) -> Deadline {
        deadline.max(Deadline::now() + self.timeout / 2).min(hard)
    }

    /// The KV API on `service`, accepting answers up to the limit.
    fn kv(&self, service: Service) -> KvClient<Service> {
        KvClient::new(service).max_decoding_message_size(self.limit.bytes)
    }

    /// The Auth API on `service`, accepting answers up to the limit.
    fn auth(&self, service: Service) -> AuthClient<Service> {
        AuthClient::new(service).max_decoding_message_size(self.limit.bytes)
    }

    /// The Maintenance API on `service`, accepting answers up to the limit.
    fn maintenance(&self, service: Service) -> MaintenanceClient<Service> {
        MaintenanceClient::new(service).max_decoding_message_size(self.limit.bytes)
    }

    /// The Watch API on `service`, accepting responses up to the limit.
    pub(crate) fn watch_api(&self, service: Service) -> WatchClient<Service> {
        WatchClient::new(service).max_decoding_message_size(self.limit.bytes)
    }

    /// `Range`, as given.
    pub async fn range(&self, request: RangeRequest) -> Result<RangeResponse, Error> {
        self.call(|s| {
            let mut api = self.kv(s);
            let request = request.clone();
            async move { api.range(request).await }
        })
        .await
    }

    /// The value of `key`, if any.
    pub async fn get(&self, key: impl Into<Vec<u8>>) -> Result<RangeResponse, Error> {
        self.range(RangeRequest {
            key: key.into(),
            ..RangeRequest::default()
        })
        .await
    }

    /// Every key starting with `prefix`.
    pub async fn get_prefix(&self, prefix: impl Into<Vec<u8>>) -> Result<RangeResponse, Error> {
        let (key, range_end) = prefix_range(prefix.into());
        self.range(RangeRequest {
            key,
            range_end,
            ..RangeRequest::default()
        })
        .await
    }

    /// Puts `key` = `value`.
    pub async fn put(
        &self,
        key: impl Into<Vec<u8>>,
        value: impl Into<Vec<u8>>,
    ) -> Result<PutResponse, Error> {
        let request = PutRequest {
            key: key.into(),
            value: value.into(),
            ..PutRequest::default()
        };
        self.call(|s| {
            let mut api = self.kv(s);
            let request = request.clone();
            async move { api.put(request).await }
        })
        .await
    }

    /// Deletes `key`.
    pub async fn delete(&self, key: impl Into<Vec<u8>>) -> Result<DeleteRangeResponse, Error> {
        let request = DeleteRangeRequest {
            key: key.into(),
            ..DeleteRangeRequest::default()
        };
        self.call(|s| {
            let mut api = self.kv(s);
            let request = request.clone();
            async move { api.delete_range(request).await }
        })
        .await
    }

    /// `Txn`, as given.
    pub async fn txn(&self, request: TxnRequest) -> Result<TxnResponse, Error> {
        self.call(|s| {
            let mut api = self.kv(s);
            let request = request.clone();
            async move { api.txn(request).await }
        })
        .await
    }

    /// Compacts the history up to `revision` (`physical`: wait until it is
    /// removed from disk).
    pub async fn compact(&self, revision: i64, physical: bool) -> Result<(), Error> {
        let request = CompactionRequest { revision, physical };
        self.call(|s| {
            let mut kv = self.kv(s);
            async move { kv.compact(request).await }
        })
        .await
        .map(drop)
    }

    /// The status of the member answering.
    pub async fn status(&self) -> Result<StatusResponse, Error> {
        self.call(|s| {
            let mut maintenance = self.maintenance(s);
            async move { maintenance.status(StatusRequest {}).await }
        })
        .await
    }

    /// Adds user `name` with `password`.
    pub async fn user_add(&self, name: &str, password: &str) -> Result<(), Error> {
        let request = AuthUserAddRequest {
            name: name.into(),
            password: password.into(),
            ..AuthUserAddRequest::default()
        };
        self.call(|s| {
            let mut api = self.auth(s);
            let request = request.clone();
            async move { api.user_add(request).await }
        })
        .await
        .map(drop)
    }

    /// Grants `role` to `user`.
    pub async fn user_grant_role(&self, user: &str, role: &str) -> Result<(), Error> {
        let request = AuthUserGrantRoleRequest {
            user: user.into(),
            role: role.into(),
        };
        self.call(|s| {
            let mut api = self.auth(s);
            let request = request.clone();
            async move { api.user_grant_role(request).await }
        })
        .await
        .map(drop)
    }

    /// Adds role `name`, with no permission.
    pub async fn role_add(&self, name: &str) -> Result<(), Error> {
        let request = AuthRoleAddRequest { name: name.into() };
        self.call(|s| {
            let mut api = self.auth(s);
            let request = request.clone();
            async move { api.role_add(request).await }
        })
        .await
        .map(drop)
    }

    /// Revokes `role` from `user`.
    pub async fn user_revoke_role(&self, user: &str, role: &str) -> Result<(), Error> {
        let request = AuthUserRevokeRoleRequest {
            name: user.into(),
            role: role.into(),
        };
        self.call(|s| {
            let mut api = self.auth(s);
            let request = request.clone();
            async move { api.user_revoke_role(request).await }
        })
        .await
        .map(drop)
    }

    /// Lets `role` read and write the keys starting with `prefix`.
    pub async fn role_grant_prefix(&self, role: &str, prefix: &str) -> Result<(), Error> {
        let (key, range_end) = prefix_range(prefix.as_bytes().to_vec());
        let request = AuthRoleGrantPermissionRequest {
            name: role.into(),
            perm: Some(crate::pb::authpb::Permission {
                perm_type: crate::pb::authpb::permission::Type::Readwrite as i32,
                key,
                range_end,
            }),
        };
        self.call(|s| {
            let mut api = self.auth(s);
            let request = request.clone();
            async move { api.role_grant_permission(request).await }
        })
        .await
        .map(drop)
    }

    /// Turns authentication off (etcd forgets the simple tokens it issued).
    pub async fn auth_disable(&self) -> Result<(), Error> {
        self.call(|s| {
            let mut auth = self.auth(s);
            async move { auth.auth_disable(AuthDisableRequest {}).await }
        })
        .await
        .map(drop)
    }

    /// Turns authentication on.
    pub async fn auth_enable(&self) -> Result<(), Error> {
        self.call(|s| {
            let mut auth = self.auth(s);
            async move { auth.auth_enable(AuthEnableRequest {}).await }
        })
        .await
        .map(drop)
    }
}

/// Idle time before TCP keep-alive probes start. Set whatever
/// `keep_alive` says: without HTTP/2 pings, a connection whose peer
/// vanished without a FIN or RST (conntrack dropped the flow, the host
/// died) would otherwise stay open, and waited on, until the kernel's
/// two-hour default; with the probes below it ends within about a minute.
const TCP_KEEPALIVE: Duration = Duration::from_secs(30);
/// Interval between unanswered probes.
const TCP_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
/// Unanswered probes before the connection is given up.
const TCP_KEEPALIVE_RETRIES: u32 = 3;

/// Whether HTTP/2 pings go out while no call or watch is open on the
/// connection: no. etcd's gRPC server (grpc-go, enforcement policy with
/// `PermitWithoutStream: false`, `MinTime` 5 s by default) counts every
/// ping on a connection without a stream as a strike and, past two,
/// closes it with GOAWAY `too_many_pings`: an idle connection would be
/// dropped and dialled again every few intervals. With a call or watch
/// open, pings go out and find a dead connection; a connection that died
/// while idle is found by the next call's own time limit.
const KEEP_ALIVE_WHILE_IDLE: bool = false;

/// The endpoint for `url`, with the limits, keep-alive and TLS of `options`.
/// Opening a connection may take `connect_timeout` for TCP and as long
/// again for the TLS handshake.
fn endpoint(url: &str, options: &ConnectOptions) -> Result<Endpoint, Error> {
    let invalid = |reason: String| Error::Endpoint {
        endpoint: url.to_string(),
        reason,
    };
    let mut endpoint = Endpoint::from_shared(url.to_string())
        .map_err(|e| invalid(e.to_string()))?
        .connect_timeout(options.connect_timeout)
        .tcp_keepalive(Some(TCP_KEEPALIVE))
        .tcp_keepalive_interval(Some(TCP_KEEPALIVE_INTERVAL))
        .tcp_keepalive_retries(Some(TCP_KEEPALIVE_RETRIES));
    if let Some((interval, wait)) = options.keep_alive {
        endpoint = endpoint
            .http2_keep_alive_interval(interval)
            .keep_alive_timeout(wait)
            .keep_alive_while_idle(KEEP_ALIVE_WHILE_IDLE);
    }
    if url.starts_with("https://") {
        let tls = options
            .tls
            .clone()
            .unwrap_or_default()
            .tonic(options.connect_timeout);
        endpoint = endpoint
            .tls_config(tls)
            .map_err(|e| invalid(e.to_string()))?;
    }
    Ok(endpoint)
}

/// `(key, range_end)` of the range of keys starting with `prefix`, as
/// `Range` and `Watch` want them (`\0`..`\0`, every key, for an empty one).
pub fn prefix_range(prefix: Vec<u8>) -> (Vec<u8>, Vec<u8>) {
    if prefix.is_empty() {
        return (vec![0], vec![0]);
    }
    let end = prefix_end(&prefix);
    (prefix, end)
}

/// The end of the range of keys starting with `prefix`: the prefix with its
/// last byte below 0xff incremented (`\0`, every key, if there is none).
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// The etcd operation whose answer is `R` (`RangeResponse` → `Range`).
fn operation_of<R>() -> &'static str {
    let name = std::any::type_name::<R>();
    let name = name.rsplit("::").next().unwrap_or(name);
    name.strip_suffix("Response").unwrap_or(name)
}

#[cfg(test)]
mod limits_tests;
#[cfg(test)]
mod login_tests;

#[cfg(test)]
mod tests {
    use super::{
        prefix_end, prefix_range, Client, ConnectOptions, StaleUntilLoggedIn, TokenInterceptor,
    };

    #[tokio::test]
    async fn a_call_is_given_the_member_it_runs_on_though_another_call_moves_on_meanwhile() {
        // Lazy channels: nothing is dialled.
        let endpoints = [
            "http://127.0.0.1:1".to_string(),
            "http://127.0.0.1:2".to_string(),
        ];
        let client = Client::connect(&endpoints, ConnectOptions::default())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let ran_on = client
            .call_on(|member, _| {
                // Another call finds member 0 gone and moves on, after
                // this one was sent to member 0 but before it reads which
                // member it runs on.
                let members = client.members();
                members.skip(0);
                let read_now = members.current().0;
                async move { Ok(tonic::Response::new((member, read_now))) }
            })
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        // What the watch read itself before (the member in use by now) is
        // not the member the call ran on; what it is given is.
        assert_eq!(ran_on, (0, 1));
        // So a failure of that stream skips member 0 (done already: no-op),
        // never member 1 that the other call moved to.
        client.members().skip(ran_on.0);
        assert_eq!(client.members().current().0, 1);
    }

    /// The channels `connect` made are generation 0; a swap that fails
    /// (no member answers `Status` on the new channels) keeps them.
    #[tokio::test]
    async fn a_failed_swap_keeps_the_channels_and_their_generation() {
        let endpoints = ["http://127.0.0.1:1".to_string()];
        let options = ConnectOptions {
            connect_timeout: std::time::Duration::from_millis(500),
            timeout: std::time::Duration::from_millis(500),
            ..ConnectOptions::default()
        };
        let client = Client::connect(&endpoints, options)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(client.channels_generation(), 0);
        assert!(client.replace_tls(None).await.is_err());
        assert_eq!(client.channels_generation(), 0);
    }

    #[test]
    fn a_fresh_login_stays_asked_for_until_one_succeeds() {
        let token = TokenInterceptor::default();
        token.mark_stale();
        // The login failed, or its caller gave up on it (dropped).
        drop(StaleUntilLoggedIn::take(&token));
        assert!(token.is_stale());
        let login = StaleUntilLoggedIn::take(&token);
        assert!(!token.is_stale(), "cleared while logging in");
        login.disarm();
        assert!(!token.is_stale());
    }

    /// Whether a login was asked for; if so, one that succeeded.
    fn logged_in_anew(token: &TokenInterceptor) -> bool {
        let login = StaleUntilLoggedIn::take(token);
        let asked = login.was_stale;
        login.disarm();
        asked
    }

    #[test]
    fn a_watch_denied_again_with_a_fresh_token_asks_for_no_more_logins() {
        let token = TokenInterceptor::default();
        let denied = "etcdserver: permission denied";
        let invalid = "etcdserver: invalid auth token";
        // Refused with the token of the connect's login (generation 1):
        // perhaps expired (older etcd releases say so for it too): a login.
        token.refused_watch(1, denied);
        assert!(logged_in_anew(&token));
        // Refused again with the token of that login: the roles.
        for _ in 0..3 {
            token.refused_watch(2, denied);
            assert!(!token.is_stale(), "a login per retry");
        }
        // An invalid token still asks each time...
        token.refused_watch(2, invalid);
        assert!(logged_in_anew(&token));
        token.refused_watch(3, invalid);
        assert!(logged_in_anew(&token));
        // ... and the token it brings is fresh too.
        token.refused_watch(4, denied);
        assert!(!token.is_stale());
        // A watch created ends the streak.
        token.watch_went_on();
        token.refused_watch(4, denied);
        assert!(logged_in_anew(&token));
        token.refused_watch(5, denied);
        assert!(!token.is_stale());
    }

    #[test]
    fn connect_options_debug_hides_the_password() {
        let options = ConnectOptions {
            user: Some(("root".into(), "hunter2".into())),
            ..ConnectOptions::default()
        };
        let shown = format!("{options:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("\"root\""), "{shown}");
        assert!(shown.contains("[redacted]"), "{shown}");
    }

    #[test]
    fn prefix_end_increments_the_last_byte_below_0xff() {
        assert_eq!(prefix_end(b"/a/"), b"/a0".to_vec());
        assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
        assert_eq!(prefix_end(b""), vec![0]);
        assert_eq!(prefix_end(b"\xff\xff"), vec![0]);
        assert_eq!(prefix_range(Vec::new()), (vec![0], vec![0]));
    }
}
