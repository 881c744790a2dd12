//! Logins of the calls refused together for their token, against a fake
//! etcd (only `Range` and `Authenticate`) whose logins are slow or refused
//! at will, as a real one's are not: its first login (the client's
//! connect) is answered at once, then it forgets every token it issued
//! (as after a restart) and answers later logins as the test asks.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tonic::codegen::{http, BoxFuture, Context, Poll, Service};
use tonic::server::{Grpc, NamedService, UnaryService};
use tonic::transport::server::TcpIncoming;

use super::{Client, ConnectOptions};
use crate::error::Error;
use crate::pb::{AuthenticateRequest, AuthenticateResponse, RangeRequest, RangeResponse};

/// The limit on each call of the client under test.
const LIMIT: Duration = Duration::from_millis(300);
/// Calls refused together.
const HERD: usize = 16;

/// How the fake answers the logins after the first.
#[derive(Clone, Copy)]
enum LaterLogins {
    /// After this long (past [`LIMIT`]), with a token.
    Slow(Duration),
    /// At once, refusing the password.
    Refused,
}

struct Fake {
    /// The token `Range` accepts; none: every one is refused.
    valid: Mutex<Option<String>>,
    /// Whether `Range` accepts any token (a member the client may move to).
    accepts_any: bool,
    /// Whether `Range` refuses every token, even a fresh one.
    accepts_none: bool,
    /// `Authenticate` requests received.
    logins: AtomicUsize,
    later: LaterLogins,
    /// How long `Range` takes to answer when it accepts the token.
    range_takes: Duration,
}

impl Fake {
    fn authenticate(
        self: Arc<Self>,
    ) -> BoxFuture<tonic::Response<AuthenticateResponse>, tonic::Status> {
        Box::pin(async move {
            let n = self.logins.fetch_add(1, Ordering::AcqRel);
            if n > 0 {
                match self.later {
                    LaterLogins::Slow(wait) => tokio::time::sleep(wait).await,
                    LaterLogins::Refused => {
                        return Err(tonic::Status::invalid_argument(
                            "etcdserver: authentication failed, invalid user ID or password",
                        ))
                    }
                }
            }
            let token = format!("token-{n}");
            *self.valid.lock().unwrap_or_else(|p| p.into_inner()) = Some(token.clone());
            Ok(tonic::Response::new(AuthenticateResponse {
                token,
                ..AuthenticateResponse::default()
            }))
        })
    }

    fn range(
        &self,
        request: &tonic::Request<RangeRequest>,
    ) -> Result<RangeResponse, tonic::Status> {
        let sent = request
            .metadata()
            .get("token")
            .and_then(|t| t.to_str().ok());
        let valid = self.valid.lock().unwrap_or_else(|p| p.into_inner());
        let fresh = sent.is_some() && sent == valid.as_deref();
        if self.accepts_any || (fresh && !self.accepts_none) {
            Ok(RangeResponse::default())
        } else {
            Err(tonic::Status::unauthenticated(
                "etcdserver: invalid auth token",
            ))
        }
    }
}

struct RangeCall(Arc<Fake>);

impl UnaryService<RangeRequest> for RangeCall {
    type Response = RangeResponse;
    type Future = BoxFuture<tonic::Response<RangeResponse>, tonic::Status>;
    fn call(&mut self, request: tonic::Request<RangeRequest>) -> Self::Future {
        let answer = self.0.range(&request).map(tonic::Response::new);
        let takes = self.0.range_takes;
        Box::pin(async move {
            if answer.is_ok() {
                tokio::time::sleep(takes).await;
            }
            answer
        })
    }
}

struct AuthenticateCall(Arc<Fake>);

impl UnaryService<AuthenticateRequest> for AuthenticateCall {
    type Response = AuthenticateResponse;
    type Future = BoxFuture<tonic::Response<AuthenticateResponse>, tonic::Status>;
    fn call(&mut self, _: tonic::Request<AuthenticateRequest>) -> Self::Future {
        Arc::clone(&self.0).authenticate()
    }
}

/// The fake as gRPC service `NAME` (`KV` when not `AUTH`).
#[derive(Clone)]
struct Api<const AUTH: bool>(Arc<Fake>);

impl NamedService for Api<false> {
    const NAME: &'static str = "etcdserverpb.KV";
}

impl NamedService for Api<true> {
    const NAME: &'static str = "etcdserverpb.Auth";
}

impl<const AUTH: bool> Service<http::Request<tonic::body::Body>> for Api<AUTH> {
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let fake = Arc::clone(&self.0);
        Box::pin(async move {
            Ok(match request.uri().path() {
                "/etcdserverpb.KV/Range" => {
                    Grpc::new(tonic_prost::ProstCodec::default())
                        .unary(RangeCall(fake), request)
                        .await
                }
                "/etcdserverpb.Auth/Authenticate" => {
                    Grpc::new(tonic_prost::ProstCodec::default())
                        .unary(AuthenticateCall(fake), request)
                        .await
                }
                path => panic!("the fake etcd does not serve {path}"),
            })
        })
    }
}

/// Serves `fake` on a free loopback port; returns its URL.
fn serve(fake: &Arc<Fake>) -> String {
    let incoming = TcpIncoming::bind("127.0.0.1:0".parse().expect("address")).expect("bind");
    let address = incoming.local_addr().expect("local address");
    let router = tonic::transport::Server::builder()
        .add_service(Api::<false>(Arc::clone(fake)))
        .add_service(Api::<true>(Arc::clone(fake)));
    tokio::spawn(router.serve_with_incoming(incoming));
    format!("http://{address}")
}

/// A client logged in (connect) to a fake member answering later logins
/// as `later` asks, and the fake; the next member is a fake accepting any
/// token: a call that moves there succeeds, and the client stays there.
async fn client_of_two_members(later: LaterLogins) -> (Client, Arc<Fake>) {
    let fake = |accepts_any| {
        Arc::new(Fake {
            valid: Mutex::new(None),
            accepts_any,
            accepts_none: false,
            logins: AtomicUsize::new(0),
            later,
            range_takes: Duration::ZERO,
        })
    };
    let (fake, next) = (fake(false), fake(true));
    let (url, next_url) = (serve(&fake), serve(&next));
    let options = ConnectOptions {
        connect_timeout: Duration::from_secs(2),
        timeout: LIMIT,
        user: Some(("root".into(), "secret".into())),
        ..ConnectOptions::default()
    };
    let client = Client::connect(&[url, next_url], options)
        .await
        .unwrap_or_else(|e| panic!("connect: {e}"));
    client
        .get("k")
        .await
        .unwrap_or_else(|e| panic!("first read: {e}"));
    (client, fake)
}

/// A client logged in to a fake, whose tokens the fake then forgets;
/// `HERD` reads made at once on it; returns the client, the logins the
/// reads made and their errors (see [`client_of_two_members`]).
async fn herd_refused_together(later: LaterLogins) -> (Client, usize, Vec<Error>) {
    let (client, fake) = client_of_two_members(later).await;
    *fake.valid.lock().unwrap_or_else(|p| p.into_inner()) = None;
    let before = fake.logins.load(Ordering::Acquire);
    let mut reads = tokio::task::JoinSet::new();
    for _ in 0..HERD {
        let client = client.clone();
        reads.spawn(async move { client.get("k").await.map(drop) });
    }
    let mut errors = Vec::new();
    while let Some(read) = reads.join_next().await {
        if let Err(err) = read.expect("read task") {
            errors.push(err);
        }
    }
    let made = fake.logins.load(Ordering::Acquire) - before;
    (client, made, errors)
}

#[tokio::test]
async fn calls_waiting_on_a_slow_login_neither_move_on_nor_log_in_again() {
    let (client, made, errors) = herd_refused_together(LaterLogins::Slow(LIMIT * 3)).await;
    assert_eq!(
        client.members().current().0,
        0,
        "a slow login moved the client off a member that answers: {errors:?}"
    );
    assert!(
        made <= 2,
        "{HERD} calls refused together made {made} logins"
    );
    assert_eq!(errors.len(), HERD, "every read waits on the one login");
    for err in &errors {
        assert!(
            matches!(err, Error::LoginTimeout(_)) && !err.is_unreachable(),
            "{err:?}"
        );
    }
}

#[tokio::test]
async fn a_refused_login_fails_the_calls_waiting_on_it() {
    let (client, made, errors) = herd_refused_together(LaterLogins::Refused).await;
    assert!(
        made <= 2,
        "{HERD} calls refused together made {made} logins, one after another"
    );
    assert_eq!(errors.len(), HERD);
    for err in &errors {
        assert!(err.to_string().contains("authentication failed"), "{err}");
    }
    assert_eq!(client.members().current().0, 0);
}

/// A login that never finishes: a member that hangs, or is cut off from
/// the leader and holds the login's raft proposal past the limit.
const HUNG: LaterLogins = LaterLogins::Slow(Duration::from_secs(3600));

#[tokio::test]
async fn calls_logging_in_first_move_off_a_member_that_does_not_answer_the_login() {
    let (client, fake) = client_of_two_members(HUNG).await;
    // A watch found the token refused: the next call logs in first, on a
    // member that has not answered it yet.
    client.token().mark_stale();
    for read in 0..3 {
        let answered = client.get("k").await;
        assert!(
            answered.is_ok(),
            "read {read} failed while member 1 answers: {answered:?}"
        );
        assert_eq!(client.members().current().0, 1, "read {read}");
    }
    assert_eq!(
        fake.logins.load(Ordering::Acquire),
        2,
        "the connect's login and one that never finished"
    );
}

#[tokio::test]
async fn a_call_waiting_on_a_login_on_another_member_logs_in_on_its_own() {
    let (client, _fake) = client_of_two_members(HUNG).await;
    client.token().mark_stale();
    // The first read logs in on member 0, which never answers.
    let first = tokio::spawn({
        let client = client.clone();
        async move { client.get("k").await.map(drop) }
    });
    tokio::time::sleep(LIMIT / 3).await;
    // Meanwhile another call found member 0 gone, and the watch found the
    // token refused again: the next read runs on member 1, logging in
    // first, and waits for the first one's login to end.
    client.members().skip(0);
    client.token().mark_stale();
    let second = client.get("k").await.map(drop);
    assert!(
        second.is_ok(),
        "member 0 not answering failed a read on member 1: {second:?}"
    );
    let first = first.await.expect("first read task");
    assert!(first.is_ok(), "{first:?}");
    assert_eq!(
        client.members().current().0,
        1,
        "a failure on member 0 moved the client off member 1"
    );
}

/// A call that logs in first (a watch found the token refused), is
/// refused its fresh token and logs in again — each login taking most of
/// the limit — ends within the limit on that member, not after each step
/// took the limit on its own.
#[tokio::test]
async fn logging_in_twice_for_one_call_ends_within_the_limit_on_the_member() {
    const SLOW: Duration = Duration::from_millis(600);
    let limit = Duration::from_secs(1);
    let fake = Arc::new(Fake {
        valid: Mutex::new(None),
        accepts_any: false,
        accepts_none: true,
        logins: AtomicUsize::new(0),
        later: LaterLogins::Slow(SLOW),
        range_takes: Duration::ZERO,
    });
    let options = ConnectOptions {
        connect_timeout: Duration::from_secs(2),
        timeout: limit,
        user: Some(("root".into(), "secret".into())),
        ..ConnectOptions::default()
    };
    let client = Client::connect(&[serve(&fake)], options)
        .await
        .unwrap_or_else(|e| panic!("connect: {e}"));
    client.token().mark_stale();
    // The login first takes 600 ms of the 1 s, leaving 400 ms for the
    // one after the refusal, which needs 600 ms: it runs out. (Each step
    // bounded on its own, both logins finish and the server's refusal of
    // the call made again comes back after 1.2 s.)
    let answered = client.get("k").await;
    assert!(
        matches!(answered, Err(Error::LoginTimeout(l)) if l == limit),
        "{answered:?}"
    );
    assert_eq!(fake.logins.load(Ordering::Acquire), 3, "connect, then two");
}

/// A client of one fake member whose logins after the connect's take
/// `login_takes` and whose reads take `range_takes`, the limit on a call
/// being `limit`; and the fake.
async fn client_of_a_slow_member(
    limit: Duration,
    login_takes: Duration,
    range_takes: Duration,
) -> (Client, Arc<Fake>) {
    let fake = Arc::new(Fake {
        valid: Mutex::new(None),
        accepts_any: false,
        accepts_none: false,
        logins: AtomicUsize::new(0),
        later: LaterLogins::Slow(login_takes),
        range_takes,
    });
    let options = ConnectOptions {
        connect_timeout: Duration::from_secs(2),
        timeout: limit,
        user: Some(("root".into(), "secret".into())),
        ..ConnectOptions::default()
    };
    let client = Client::connect(&[serve(&fake)], options)
        .await
        .unwrap_or_else(|e| panic!("connect: {e}"));
    (client, fake)
}

/// On a degraded but healthy cluster a login takes 0.7 × the limit and a
/// read 0.4 ×: the read made after the login keeps half the limit (more
/// than the 0.3 × left), so it succeeds rather than time out and count
/// the member unreachable.
const DEGRADED: (Duration, Duration, Duration) = (
    Duration::from_secs(2),
    Duration::from_millis(1400),
    Duration::from_millis(800),
);

#[tokio::test]
async fn a_slow_login_before_the_call_leaves_the_call_time_to_answer() {
    let (limit, login_takes, range_takes) = DEGRADED;
    let (client, fake) = client_of_a_slow_member(limit, login_takes, range_takes).await;
    // A watch found the token refused: the next call logs in first.
    client.token().mark_stale();
    let answered = client.get("k").await.map(drop);
    assert!(answered.is_ok(), "{answered:?}");
    assert_eq!(fake.logins.load(Ordering::Acquire), 2, "connect, then one");
}

#[tokio::test]
async fn a_slow_login_after_a_refused_token_leaves_the_call_made_again_time_to_answer() {
    let (limit, login_takes, range_takes) = DEGRADED;
    let (client, fake) = client_of_a_slow_member(limit, login_takes, range_takes).await;
    // The member forgets its tokens (a restart): the read is refused,
    // logs in, and is made again.
    *fake.valid.lock().unwrap_or_else(|p| p.into_inner()) = None;
    let answered = client.get("k").await.map(drop);
    assert!(answered.is_ok(), "{answered:?}");
    assert_eq!(fake.logins.load(Ordering::Acquire), 2, "connect, then one");
}

#[tokio::test]
async fn a_call_out_of_time_after_a_login_made_first_does_not_count_the_member_unreachable() {
    // The read takes longer than the whole limit: it runs out even with
    // its own slice, but the member answered the login just before.
    let limit = Duration::from_millis(600);
    let (client, _fake) = client_of_a_slow_member(limit, limit / 2, limit * 4).await;
    client.token().mark_stale();
    let answered = client.get("k").await.map(drop);
    assert!(
        matches!(&answered, Err(err @ Error::LoginTimeout(_)) if !err.is_unreachable()),
        "{answered:?}"
    );
}
