//! Following the TLS files of a `redis` component (`caCert`, `clientCert`,
//! `clientKey` given as paths) with [`crate::tls::follow`]: every second
//! the files are read again (off the runtime); when their content
//! changed, a new connection is made with it and verified, then swapped
//! in over the session it was made for (a metadata change or a failover
//! installed meanwhile wins, and the files are compared with it at the
//! next read). The new connection is made without holding the lock of
//! metadata changes and failover swaps: a password rotation or a new
//! master never waits behind a handshake of the follower. Content that
//! failed is not tried again while the files still hold it for a wait
//! growing from [`crate::tls::FIRST_RETRY`] to
//! [`crate::tls::REFUSED_RETRY`].

use std::sync::{Arc, Weak};

use tokio_util::sync::CancellationToken;

use super::{Link, RedisConnection, Session, Shared, StrongSlot};
use crate::redis::connect::open;
use crate::redis::metadata::{ConnectionSettings, RedisMetadata};
use crate::tls::{Applied, Followed, PemSource, Turn};

/// Whether `metadata` names any TLS file.
pub(in crate::redis) fn names_files(metadata: &RedisMetadata) -> bool {
    metadata.enable_tls
        && [
            &metadata.ca_cert,
            &metadata.client_cert,
            &metadata.client_key,
        ]
        .into_iter()
        .any(|v| matches!(PemSource::parse(v), Some(PemSource::File(_))))
}

/// The reading of the files `metadata` names, for a follower's turn.
pub(in crate::redis) fn read_settings(metadata: Arc<RedisMetadata>) -> Turn<ConnectionSettings> {
    Turn::Read(Box::new(move || {
        metadata
            .connection_settings()
            .map_err(|err| err.to_string())
    }))
}

/// The component's files, as the follower sees them.
struct SessionFiles {
    shared: Weak<Shared>,
    /// The session in force at the last turn: new content is swapped in
    /// over it only.
    seen: Option<Arc<Session>>,
}

impl Followed for SessionFiles {
    type Content = ConnectionSettings;

    fn turn(&mut self) -> Turn<ConnectionSettings> {
        let Some(shared) = self.shared.upgrade() else {
            return Turn::End;
        };
        let session = shared.session.load_full();
        if session.link.is_none() || !names_files(&session.metadata) {
            self.seen = None;
            return Turn::Skip;
        }
        let metadata = session.metadata.clone();
        self.seen = Some(session);
        read_settings(metadata)
    }

    fn in_force(&self, content: &ConnectionSettings) -> bool {
        self.seen
            .as_ref()
            .and_then(|seen| seen.link.as_ref())
            .is_some_and(|link| link.settings == *content)
    }

    async fn apply(&mut self, content: ConnectionSettings) -> Result<Applied, String> {
        let (Some(seen), Some(shared)) = (self.seen.take(), self.shared.upgrade()) else {
            return Ok(Applied::Superseded);
        };
        let opened = open(&content)
            .await
            .map_err(|err| content.scrub(&err.to_string()))?;
        let next = Arc::new(Session {
            metadata: seen.metadata.clone(),
            link: Some(Link {
                connection: opened.connection,
                settings: content,
                server: opened.server,
            }),
            strong: StrongSlot::default(),
        });
        let was = shared.session.compare_and_swap(&seen, next);
        Ok(match Arc::ptr_eq(&*was, &seen) {
            true => Applied::InForce,
            false => Applied::Superseded,
        })
    }
}

impl RedisConnection {
    /// Starts following the TLS files, for as long as the component lives.
    pub(super) fn follow_tls_files(&self) {
        let followed = SessionFiles {
            shared: Arc::downgrade(&self.shared),
            seen: None,
        };
        crate::tls::follow(
            self.shared.label().to_string(),
            "Redis",
            CancellationToken::new(),
            followed,
            self.shared.tls_follow.clone(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rewire_runtime::{ComponentKey, Metadata};
    use serde_json::json;
    use testkit::certs::TestCa;
    use testkit::redis::{RedisServer, RedisTls};

    /// Waits until `done`, failing with `what` after 20 s.
    async fn until(what: &str, mut done: impl FnMut() -> bool) {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
        while !done() {
            assert!(tokio::time::Instant::now() < deadline, "{what}");
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
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
        let metadata = Metadata::from(
            json!({
                "redisHost": server.addr(), "enableTLS": true,
                "caCert": ca.ca_path, "clientCert": cert, "clientKey": key,
            })
            .as_object()
            .cloned()
            .unwrap_or_default(),
        )
        .decode::<RedisMetadata>()
        .unwrap_or_else(|e| panic!("{e}"));
        let mut connection = RedisConnection::new(metadata);
        connection
            .init(&ComponentKey::new("state", "test"), None)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
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
}
