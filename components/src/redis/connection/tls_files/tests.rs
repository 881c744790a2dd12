//! The Redis state store's TLS file follower against a real TLS
//! `redis-server`, some through a [`Relay`] that holds the follower's
//! handshake as long as a test needs.

use super::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rewire_runtime::{ComponentKey, Metadata};
use serde_json::{json, Value};
use testkit::certs::{replace_file, TestCa};
use testkit::redis::{RedisServer, RedisTls};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

/// How long a test waits for what should come at once.
const PATIENCE: Duration = Duration::from_secs(20);

/// Waits until `done`, failing with `what` after [`PATIENCE`].
async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !done() {
        assert!(tokio::time::Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `fields` as the component's metadata.
fn decoded(fields: &Value) -> RedisMetadata {
    Metadata::from(fields.as_object().cloned().unwrap_or_default())
        .decode::<RedisMetadata>()
        .unwrap_or_else(|e| panic!("{e}"))
}

/// A state store connected with `fields`, following its files.
async fn connected(fields: &Value) -> RedisConnection {
    let mut connection = RedisConnection::new(decoded(fields));
    connection
        .init(&ComponentKey::new("state", "test"), None)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    connection
}

/// The server's `connected_clients` (the asking connection included).
async fn connected_clients(server: &RedisServer) -> usize {
    let info = server
        .query(&["INFO", "clients"])
        .await
        .expect("INFO clients")
        .concat();
    info.lines()
        .find_map(|line| line.strip_prefix("connected_clients:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no connected_clients in {info}"))
}

/// Waits until the server counts `want` clients (the asking one
/// included), failing with `what` after [`PATIENCE`].
async fn until_clients(server: &RedisServer, want: usize, what: &str) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let now = connected_clients(server).await;
        if now == want {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: {now} clients, expected {want}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A TCP relay in front of a server: the connection it accepts after
/// [`hold_next`](Self::hold_next) is handed to the test instead of being
/// relayed, so the handshake of whoever made it waits as long as the test
/// wants (TLS is end to end: the relay sees bytes only).
struct Relay {
    addr: String,
    upstream: String,
    hold: Arc<AtomicBool>,
    held: mpsc::UnboundedReceiver<TcpStream>,
}

impl Relay {
    /// A relay to `upstream` on a loopback port.
    async fn start(upstream: String) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("relay port");
        let addr = listener.local_addr().expect("relay address").to_string();
        let hold = Arc::new(AtomicBool::new(false));
        let (hand, held) = mpsc::unbounded_channel();
        let (holding, to) = (hold.clone(), upstream.clone());
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                if holding.swap(false, Ordering::SeqCst) {
                    let _ = hand.send(stream);
                } else {
                    tokio::spawn(relay(stream, to.clone()));
                }
            }
        });
        Self {
            addr,
            upstream,
            hold,
            held,
        }
    }

    /// Holds the next connection.
    fn hold_next(&self) {
        self.hold.store(true, Ordering::SeqCst);
    }

    /// The connection held, once made.
    async fn held(&mut self) -> TcpStream {
        tokio::time::timeout(PATIENCE, self.held.recv())
            .await
            .expect("no connection to hold")
            .expect("the relay ended")
    }

    /// Relays `held` from now on: its handshake goes on.
    fn let_through(&self, held: TcpStream) {
        tokio::spawn(relay(held, self.upstream.clone()));
    }
}

/// Relays `client` to `upstream` until either side closes.
async fn relay(mut client: TcpStream, upstream: String) {
    if let Ok(mut server) = TcpStream::connect(&upstream).await {
        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
    }
}

/// The metadata of a store reaching `host` with the CA at `ca_file` and
/// the client pair of [`TestCa::client`] installed in `dir`; a long
/// `dialTimeout`, so that a handshake held by a [`Relay`] is not cut.
fn files_fields(
    host: &str,
    ca_file: &std::path::Path,
    dir: &std::path::Path,
    ca: &TestCa,
) -> Value {
    let (cert, key) = ca.client("app-1").installed_in(dir);
    json!({
        "redisHost": host, "enableTLS": true, "dialTimeout": "60s",
        "caCert": ca_file, "clientCert": cert, "clientKey": key,
    })
}

/// A password rotation installed while the follower's connection with
/// renewed files is in its handshake (held by the relay): the rotation
/// does not wait for it, and wins; the follower's connection, made for
/// the session the rotation replaced, is not swapped in over it
/// (`Applied::Superseded`), even while a command running on that session
/// keeps it alive. The session in force carries the new
/// password and the renewed files (the rotation read them), and the next
/// reads find them in force: nothing undone, nothing tried again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_rotation_during_the_followers_handshake_wins_with_the_new_files() {
    let ca = TestCa::new("state-ca");
    let server = RedisServer::start_tls(RedisTls::from_ca(&ca), Some("first")).await;
    // Both passwords valid while clients move to the second.
    server
        .query(&["ACL", "SETUSER", "default", ">second"])
        .await
        .expect("a second password");
    let mut relay = Relay::start(server.addr()).await;
    let live = tempfile::tempdir().expect("temp dir");
    let ca_file = live.path().join("ca.pem");
    replace_file(&ca_file, &ca.ca_pem);
    let mut fields = files_fields(&relay.addr, &ca_file, live.path(), &ca);
    fields["redisPassword"] = json!("first");
    let connection = connected(&fields).await;
    let counts = connection.shared.tls_follow.clone();

    // The CA file renewed as a bundle (one file, replaced whole): the
    // follower's new connection is the next one, held in its handshake.
    relay.hold_next();
    let bundle = format!("{}{}", ca.ca_pem, TestCa::new("state-next-ca").ca_pem);
    replace_file(&ca_file, &bundle);
    let handshake = relay.held().await;
    let turns = counts.turns();
    // A command still running on the session the follower started from
    // keeps it alive through the swap.
    let running = connection.session();
    fields["redisPassword"] = json!("second");
    tokio::time::timeout(PATIENCE, connection.apply(decoded(&fields)))
        .await
        .expect("the rotation waited for the follower's handshake")
        .unwrap_or_else(|e| panic!("{e}"));
    let rotated = connection.session();
    relay.let_through(handshake);
    until("the follower's attempt never ended", || {
        counts.turns() > turns
    })
    .await;
    assert_eq!(
        counts.superseded(),
        1,
        "the follower's connection did not meet the rotation"
    );
    let in_force = connection.session();
    assert!(
        Arc::ptr_eq(&in_force, &rotated),
        "the follower's connection replaced the rotation"
    );
    assert_eq!(in_force.metadata().redis_password, "second");
    drop(running);
    let files = in_force
        .metadata()
        .connection_settings()
        .unwrap_or_else(|e| panic!("{e}"));
    let link = in_force.link.as_ref().expect("connected");
    assert!(
        link.settings == files,
        "the session in force does not carry the renewed files"
    );
    assert_eq!(
        link.settings
            .tls
            .as_ref()
            .and_then(|tls| tls.ca_pem.clone()),
        Some(bundle.into_bytes()),
        "the session in force does not carry the renewed CA file"
    );

    // The next reads find the files in force: nothing tried, nothing
    // swapped.
    let (attempts, turns) = (counts.attempts(), counts.turns());
    until("the files are not read", || counts.turns() >= turns + 3).await;
    assert_eq!(counts.attempts(), attempts, "the files were tried again");
    assert!(Arc::ptr_eq(&connection.session(), &rotated));
    let mut conn = in_force.connection().expect("connected");
    let pong: String = redis::cmd("PING")
        .query_async(&mut conn)
        .await
        .expect("PING on the connection in force");
    assert_eq!(pong, "PONG");
}

/// `close()` while the follower's connection with renewed files is in its
/// handshake (held by the relay): the store's connections (the shared one
/// and the strong writes' one) close at once, the follower keeping
/// nothing of the closed session alive (it kept the whole session until
/// its attempt ended: indefinitely, with a handshake or a read of the
/// files that hangs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_lets_go_of_the_connections_while_the_follower_is_in_a_handshake() {
    let ca = TestCa::new("state-ca");
    let server = RedisServer::start_tls(RedisTls::from_ca(&ca), None).await;
    let without_the_store = connected_clients(&server).await;
    let mut relay = Relay::start(server.addr()).await;
    let live = tempfile::tempdir().expect("temp dir");
    let ca_file = live.path().join("ca.pem");
    replace_file(&ca_file, &ca.ca_pem);
    let connection = connected(&files_fields(&relay.addr, &ca_file, live.path(), &ca)).await;
    let session = connection.session();
    session
        .exclusive(Duration::ZERO)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .keep();
    drop(session);
    until_clients(
        &server,
        without_the_store + 2,
        "the store's two connections are not counted",
    )
    .await;

    relay.hold_next();
    let bundle = format!("{}{}", ca.ca_pem, TestCa::new("state-next-ca").ca_pem);
    replace_file(&ca_file, &bundle);
    let _handshake = relay.held().await;
    connection.close();
    until_clients(
        &server,
        without_the_store,
        "the closed store's connections stay open",
    )
    .await;
}

/// The state store's files renewed with a client certificate from a
/// CA the server does not trust, while a metadata change holds the
/// lock of changes: the follower tries them without that lock (a
/// password rotation or a Sentinel swap never waits behind its
/// handshake), once, and not again at the next reads while the files
/// hold them; a good pair written then is in force at the next reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_client_certificate_files_are_tried_once_without_the_lock_of_changes() {
    let (ca, stranger) = (TestCa::new("state-ca"), TestCa::new("state-stranger"));
    let server = RedisServer::start_tls(RedisTls::from_ca(&ca), None).await;
    let live = tempfile::tempdir().expect("temp dir");
    let (cert, key) = ca.client("app-1").installed_in(live.path());
    let connection = connected(&json!({
        "redisHost": server.addr(), "enableTLS": true,
        "caCert": ca.ca_path, "clientCert": cert, "clientKey": key,
    }))
    .await;
    let counts = connection.shared.tls_follow.clone();
    let first = connection.session();

    let changing = connection.shared.changing.lock().await;
    stranger.client("app-2").install_at(&cert, &key);
    until("the refused files were not tried under the lock", || {
        server.handshakes_refused() > 0
    })
    .await;
    // One more read: the refusal is settled, the files whole. Four
    // reads in all, within `FIRST_RETRY` (5 s) of the refusal.
    let turns = counts.turns();
    until("the files are not read", || counts.turns() > turns).await;
    let (attempts, refused) = (counts.attempts(), server.handshakes_refused());
    let turns = counts.turns();
    until("the files are not read", || counts.turns() >= turns + 3).await;
    assert_eq!(
        (counts.attempts(), server.handshakes_refused()),
        (attempts, refused),
        "the refused files were tried again within three reads"
    );
    drop(changing);
    assert!(Arc::ptr_eq(&connection.session(), &first));

    ca.client("app-3").install_at(&cert, &key);
    let turns = counts.turns();
    until("the good files never came in force", || {
        !Arc::ptr_eq(&connection.session(), &first)
    })
    .await;
    assert!(
        counts.turns() <= turns + 3,
        "the good files waited {} reads",
        counts.turns() - turns
    );
    let mut conn = connection.session().connection().expect("connected");
    let pong: String = redis::cmd("PING")
        .query_async(&mut conn)
        .await
        .expect("PING on the new connection");
    assert_eq!(pong, "PONG");
}

/// The `CLIENT ID` of `session`'s shared connection.
async fn client_id(session: &Session) -> i64 {
    let mut conn = session.connection().expect("connected");
    redis::cmd("CLIENT")
        .arg("ID")
        .query_async(&mut conn)
        .await
        .expect("CLIENT ID")
}

/// A metadata-only change staged (it copies the connection in force),
/// then the CA file renewed, the follower swapping in a connection with
/// the new content before the change is installed: the installed session
/// keeps the follower's connection and content, and the next reads find
/// the files in force. Before: its settings differed from the staged
/// copy's, so the staged copy was installed, putting the old TLS material
/// (a revoked client certificate, an old CA) back in force until the
/// follower's next read made yet another connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_staged_metadata_change_installs_over_the_followers_renewed_connection() {
    let ca = TestCa::new("state-ca");
    let server = RedisServer::start_tls(RedisTls::from_ca(&ca), None).await;
    let live = tempfile::tempdir().expect("temp dir");
    let ca_file = live.path().join("ca.pem");
    replace_file(&ca_file, &ca.ca_pem);
    let mut fields = files_fields(&server.addr(), &ca_file, live.path(), &ca);
    let connection = connected(&fields).await;
    let counts = connection.shared.tls_follow.clone();
    let first = connection.session();
    fields["keyPrefix"] = json!("none");
    let staged = connection
        .prepare(decoded(&fields))
        .await
        .unwrap_or_else(|e| panic!("{e}"));

    let bundle = format!("{}{}", ca.ca_pem, TestCa::new("state-next-ca").ca_pem);
    replace_file(&ca_file, &bundle);
    until("the follower never swapped in the renewed file", || {
        !Arc::ptr_eq(&connection.session(), &first)
    })
    .await;
    drop(first);
    let renewed = connection.session();
    connection.install(staged);

    let installed = connection.session();
    assert_eq!(installed.metadata().key_prefix, "none");
    let link = installed.link.as_ref().expect("connected");
    assert_eq!(
        link.settings
            .tls
            .as_ref()
            .and_then(|tls| tls.ca_pem.clone()),
        Some(bundle.into_bytes()),
        "the installed session put the old CA back in force"
    );
    assert_eq!(
        client_id(&installed).await,
        client_id(&renewed).await,
        "the installed session is not on the follower's connection"
    );
    let (attempts, turns) = (counts.attempts(), counts.turns());
    until("the files are not read", || counts.turns() >= turns + 2).await;
    assert_eq!(counts.attempts(), attempts, "the files were tried again");
    assert!(Arc::ptr_eq(&connection.session(), &installed));
}
