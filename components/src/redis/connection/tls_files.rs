//! Following the TLS files of a `redis` component (`caCert`, `clientCert`,
//! `clientKey` given as paths) with [`crate::tls::follow`]: every second
//! the files are read again (off the runtime, within
//! [`crate::tls::FILE_READ_DEADLINE`]); when their content
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
use crate::tls::{Applied, Followed, PemSource, Turn, Unread};

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
    Turn::Read(Box::pin(async move {
        let read = metadata.read_connection_settings().await;
        read.map_err(|err| Unread {
            hung: err.is_hung(),
            message: err.to_string(),
        })
    }))
}

/// The component's files, as the follower sees them.
struct SessionFiles {
    shared: Weak<Shared>,
    /// The session in force at the last turn: new content is swapped in
    /// over it only. Not kept alive: a session closed or replaced lets go
    /// of its connections at once, not at the follower's next turn (a
    /// second later, never while a read of the files or a handshake
    /// hangs).
    seen: Weak<Session>,
}

impl Followed for SessionFiles {
    type Content = ConnectionSettings;

    fn turn(&mut self) -> Turn<ConnectionSettings> {
        let Some(shared) = self.shared.upgrade() else {
            return Turn::End;
        };
        let session = shared.session.load_full();
        self.seen = Weak::new();
        if session.link.is_none() || !names_files(&session.metadata) {
            return Turn::Skip;
        }
        self.seen = Arc::downgrade(&session);
        read_settings(session.metadata.clone())
    }

    fn in_force(&self, content: &ConnectionSettings) -> bool {
        self.seen
            .upgrade()
            .and_then(|seen| seen.link.as_ref().map(|link| link.settings == *content))
            .unwrap_or(false)
    }

    async fn apply(&mut self, content: ConnectionSettings) -> Result<Applied, String> {
        let seen = std::mem::take(&mut self.seen);
        // Replaced meanwhile (a change, a failover, `close`): no
        // connection to open for it.
        let metadata = match (seen.upgrade(), self.shared.upgrade()) {
            (Some(session), Some(shared)) if Arc::ptr_eq(&session, &shared.session.load()) => {
                session.metadata.clone()
            }
            _ => return Ok(Applied::Superseded),
        };
        let opened = open(&content)
            .await
            .map_err(|err| content.scrub(&err.to_string()))?;
        let (Some(seen), Some(shared)) = (seen.upgrade(), self.shared.upgrade()) else {
            return Ok(Applied::Superseded);
        };
        // Same metadata, new content: the connection it replaces is of
        // its line (a staged change that copied that one takes this one).
        let lineage = seen.link.as_ref().map(|link| link.lineage.clone());
        let next = Arc::new(Session {
            metadata,
            link: Some(Link {
                connection: opened.connection,
                settings: content,
                server: opened.server,
                lineage: lineage.unwrap_or_default(),
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
            seen: Weak::new(),
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
mod tests;
