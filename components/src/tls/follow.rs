//! Following a component's TLS files: every second the files are read
//! again, as a component's start reads them (each on a thread of its own,
//! never a runtime worker, within [`FILE_READ_DEADLINE`]); when their
//! content differs from the material in force, the component builds a
//! new client with it, checks that it works and swaps it in. New material
//! that cannot be read or used (half-written, corrupt, a key that does
//! not match, a server that refuses it) leaves the client in force
//! serving, with one warning per refused content. Content that failed
//! is not tried again (a new connection and handshake) at every read
//! while the files still hold it: first after [`FIRST_RETRY`], then after
//! twice as long each time it fails again, up to [`REFUSED_RETRY`]. A
//! failure that passes (a server restarting, unreachable for a moment)
//! holds good files back seconds, not a minute; a server that learns to
//! trust refused files later gets them; files that change are tried at
//! the next read. A read that hangs (an NFS or FUSE mount that stopped
//! answering) is given up at the deadline with one warning per hung
//! file, and while it has not returned the file is not read again (each
//! turn is refused at once; tried again only after minutes, growing to an
//! hour, see [`crate::component_file`]): a hung mount pins a few threads
//! per file, not one more a second, and the material in force stays. PEM
//! text never reaches a log: errors name fields and paths.
//!
//! [`follow`] runs the loop for any [`Followed`] component (the Redis
//! state store and pub/sub); [`follow_files`] for a client built from
//! [`ClientTlsFields`] (Apollo, etcd).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::client::{ClientTls, ClientTlsFields};
use super::pem::TlsError;
use super::read_within::{read_pem_file, ReadFile, FILE_READ_DEADLINE};

/// How often the files are read again.
pub const RECHECK_EVERY: Duration = Duration::from_secs(1);

/// How soon content the files still hold is tried again after it failed
/// the first time: not at the next read, which would be a new connection
/// and TLS handshake a second for as long as refused files stay.
pub const FIRST_RETRY: Duration = Duration::from_secs(5);

/// The longest content the files still hold waits to be tried again: the
/// wait after each failure of the same content doubles from
/// [`FIRST_RETRY`] up to this.
pub const REFUSED_RETRY: Duration = Duration::from_secs(60);

/// The reading of the files: off the async workers and bounded in time
/// ([`ClientTlsFields::load_within`]).
pub type ReadFiles<T> = Pin<Box<dyn Future<Output = Result<T, Unread>> + Send>>;

/// Why a turn's reading gave no content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unread {
    /// What went wrong, naming fields and paths, never PEM text.
    pub message: String,
    /// A file's read hung ([`TlsError::is_hung`]): warned about once for
    /// as long as the hang lasts, not at every turn.
    pub hung: bool,
}

impl From<TlsError> for Unread {
    fn from(err: TlsError) -> Self {
        Self {
            hung: err.is_hung(),
            message: err.to_string(),
        }
    }
}

/// What a follower does in one turn.
pub enum Turn<T> {
    /// Reads the files with this.
    Read(ReadFiles<T>),
    /// Nothing to read now (no file named at the moment, or closed).
    Skip,
    /// The component is gone: the follower ends.
    End,
}

/// How new content was applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// A client with it is in force.
    InForce,
    /// Something else replaced the client meanwhile (a metadata change, a
    /// failover): nothing was put in force, nothing refused; the files
    /// are compared again with what is in force at the next turn.
    Superseded,
}

/// A component whose TLS files are followed.
pub trait Followed: Send + 'static {
    /// What the files hold, as the component uses it.
    type Content: PartialEq + Clone + Send + 'static;
    /// This turn's reading of the files.
    fn turn(&mut self) -> Turn<Self::Content>;
    /// Whether `content` is what the component uses now (as of the last
    /// [`turn`](Self::turn)).
    fn in_force(&self, content: &Self::Content) -> bool;
    /// Builds a client with `content`, checks it and puts it in force; or
    /// why not (an error naming fields, never PEM text).
    fn apply(
        &mut self,
        content: Self::Content,
    ) -> impl Future<Output = Result<Applied, String>> + Send;
}

/// What a follower did, for tests to count turns instead of waiting out
/// time.
#[derive(Debug, Default)]
pub struct FollowCounts {
    turns: AtomicU64,
    attempts: AtomicU64,
    superseded: AtomicU64,
    warnings: AtomicU64,
}

impl FollowCounts {
    /// How many times the files were read.
    pub fn turns(&self) -> u64 {
        self.turns.load(Ordering::SeqCst)
    }

    /// How many times new content was applied (a new client tried).
    pub fn attempts(&self) -> u64 {
        self.attempts.load(Ordering::SeqCst)
    }

    /// How many of those attempts found the client replaced meanwhile
    /// ([`Applied::Superseded`]).
    pub fn superseded(&self) -> u64 {
        self.superseded.load(Ordering::SeqCst)
    }

    /// How many warnings the follower logged (one per refused content,
    /// read error or hang).
    pub fn warnings(&self) -> u64 {
        self.warnings.load(Ordering::SeqCst)
    }
}

/// Follows the files of `followed` until `stop` is cancelled or the
/// component is gone, counting in `counts`. `label` (the component) and
/// `backend` name the client in logs.
pub fn follow<F: Followed>(
    label: String,
    backend: &'static str,
    stop: CancellationToken,
    followed: F,
    counts: Arc<FollowCounts>,
) {
    tokio::spawn(async move {
        let mut followed = followed;
        let mut refusals = Refusals::default();
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(RECHECK_EVERY) => {}
            }
            let read = match followed.turn() {
                Turn::Read(read) => read,
                Turn::Skip => continue,
                Turn::End => return,
            };
            let loaded = tokio::select! {
                () = stop.cancelled() => return,
                loaded = read => loaded,
            };
            counts.turns.fetch_add(1, Ordering::SeqCst);
            let content = match loaded {
                Ok(content) if followed.in_force(&content) => {
                    refusals = Refusals::default();
                    continue;
                }
                Ok(content) if refusals.holds_back(&content) => continue,
                Ok(content) => content,
                Err(unread) => {
                    let refused = match unread.hung {
                        true => Refused::Hung(hung_file(&unread.message).to_owned()),
                        false => Refused::Unread(unread.message.clone()),
                    };
                    refusals.note(&label, backend, refused, &unread.message, &counts);
                    continue;
                }
            };
            counts.attempts.fetch_add(1, Ordering::SeqCst);
            let applied = tokio::select! {
                () = stop.cancelled() => return,
                applied = followed.apply(content.clone()) => applied,
            };
            match applied {
                Ok(Applied::InForce) => {
                    refusals = Refusals::default();
                    info!(component = %label, "{backend} TLS files changed; a new client with them is in force.");
                }
                Ok(Applied::Superseded) => {
                    counts.superseded.fetch_add(1, Ordering::SeqCst);
                }
                Err(error) => {
                    refusals.hold(&content);
                    let refused = Refused::Content(content);
                    refusals.note(&label, backend, refused, &error, &counts);
                }
            }
        }
    });
}

/// What a follower remembers of refusals.
struct Refusals<T> {
    /// What was last refused, warned about once.
    warned: Option<Refused<T>>,
    /// The content last refused when tried: not tried again before
    /// `until` while the files still hold it; `wait` is how long it was
    /// held back after its last failure.
    held: Option<Held<T>>,
}

/// What a turn refused.
#[derive(PartialEq)]
enum Refused<T> {
    /// New content, which failed when applied.
    Content(T),
    /// The files, which could not be read or used (this error).
    Unread(String),
    /// A file whose read hung (given up, or still not returned): its
    /// field and path, as the error names them ([`hung_file`]), so a hang
    /// of another file is warned about too.
    Hung(String),
}

/// The field and file a [`TlsError::Hung`]'s message names: the message
/// up to its last ": " ("metadata field `caCert`: cannot read `ca.pem`"),
/// the same whether the read timed out or is not started while it hangs
/// (the reasons of a hang hold no ": ").
fn hung_file(message: &str) -> &str {
    message.rsplit_once(": ").map_or(message, |(file, _)| file)
}

/// Content held back after it failed.
struct Held<T> {
    content: T,
    until: Instant,
    wait: Duration,
}

impl<T> Default for Refusals<T> {
    fn default() -> Self {
        Self {
            warned: None,
            held: None,
        }
    }
}

impl<T: PartialEq + Clone> Refusals<T> {
    /// Whether `content` failed and its wait has not passed.
    fn holds_back(&self, content: &T) -> bool {
        self.held
            .as_ref()
            .is_some_and(|held| held.content == *content && Instant::now() < held.until)
    }

    /// Holds `content`, which failed, back: [`FIRST_RETRY`] the first
    /// time, twice its last wait (up to [`REFUSED_RETRY`]) when it failed
    /// before.
    fn hold(&mut self, content: &T) {
        let wait = match &self.held {
            Some(held) if held.content == *content => (held.wait * 2).min(REFUSED_RETRY),
            _ => FIRST_RETRY,
        };
        self.held = Some(Held {
            content: content.clone(),
            until: Instant::now() + wait,
            wait,
        });
    }

    /// Logs the refusal of `refused` for `error`: a warning the first
    /// time (counted in `counts`), then at debug level.
    fn note(
        &mut self,
        label: &str,
        backend: &str,
        refused: Refused<T>,
        error: &str,
        counts: &FollowCounts,
    ) {
        if self.warned.as_ref() == Some(&refused) {
            debug!(component = %label, error = %error, "New {backend} TLS files still refused.");
            return;
        }
        if let Refused::Hung(_) = refused {
            warn!(component = %label, error = %error, "Reading the {backend} TLS files hung; the client in force keeps serving, and the file is not read again while that read hangs.");
        } else {
            warn!(component = %label, error = %error, "New {backend} TLS files refused; the client in force keeps serving.");
        }
        counts.warnings.fetch_add(1, Ordering::SeqCst);
        self.warned = Some(refused);
    }
}

/// Follows the files of `fields` (nothing to do when they name none):
/// `in_force` is the material the component's client uses now; `apply`
/// gets new material and answers once a client built with it is checked
/// and in force, or with why not. `label` (the component) and `backend`
/// name the client in logs. Ends when `stop` is cancelled. What the
/// follower did, counted.
pub fn follow_files<F, Fut>(
    label: String,
    backend: &'static str,
    fields: ClientTlsFields,
    in_force: ClientTls,
    stop: CancellationToken,
    apply: F,
) -> Arc<FollowCounts>
where
    F: FnMut(ClientTls) -> Fut + Send + 'static,
    Fut: Future<Output = Result<(), String>> + Send,
{
    let followed = FieldFiles {
        fields,
        in_force,
        apply,
        deadline: FILE_READ_DEADLINE,
        read: read_pem_file,
    };
    follow_field_files(label, backend, stop, followed)
}

/// [`follow_files`] of `followed` (its read and deadline chosen).
fn follow_field_files<F, Fut>(
    label: String,
    backend: &'static str,
    stop: CancellationToken,
    followed: FieldFiles<F>,
) -> Arc<FollowCounts>
where
    F: FnMut(ClientTls) -> Fut + Send + 'static,
    Fut: Future<Output = Result<(), String>> + Send,
{
    let counts = Arc::new(FollowCounts::default());
    if !followed.fields.files().is_empty() {
        follow(label, backend, stop, followed, counts.clone());
    }
    counts
}

/// The files of [`ClientTlsFields`] and what applies their material.
struct FieldFiles<F> {
    fields: ClientTlsFields,
    in_force: ClientTls,
    apply: F,
    /// The bound of one turn's reads ([`FILE_READ_DEADLINE`]).
    deadline: Duration,
    /// How a file is read ([`read_pem_file`] but in tests).
    read: ReadFile,
}

impl<F, Fut> Followed for FieldFiles<F>
where
    F: FnMut(ClientTls) -> Fut + Send + 'static,
    Fut: Future<Output = Result<(), String>> + Send,
{
    type Content = ClientTls;

    fn turn(&mut self) -> Turn<ClientTls> {
        let (fields, deadline, read) = (self.fields.clone(), self.deadline, self.read);
        Turn::Read(Box::pin(async move {
            let loaded = fields.load_with(deadline, read).await;
            loaded.map_err(Unread::from)
        }))
    }

    fn in_force(&self, content: &ClientTls) -> bool {
        *content == self.in_force
    }

    async fn apply(&mut self, content: ClientTls) -> Result<Applied, String> {
        (self.apply)(content.clone()).await?;
        self.in_force = content;
        Ok(Applied::InForce)
    }
}

#[cfg(test)]
mod hung_read_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::PemSource;
    use std::sync::Mutex;
    use testkit::certs::TestCa;

    /// [`FieldFiles`] whose files are read in the follower's task: a read
    /// on a thread of its own is not seen by the paused clock, which would
    /// move on (seconds of held-back retries) while the read runs.
    struct ReadInPlace<F>(FieldFiles<F>);

    impl<F, Fut> Followed for ReadInPlace<F>
    where
        F: FnMut(ClientTls) -> Fut + Send + 'static,
        Fut: Future<Output = Result<(), String>> + Send,
    {
        type Content = ClientTls;

        fn turn(&mut self) -> Turn<ClientTls> {
            let loaded = self.0.fields.load().map_err(Unread::from);
            Turn::Read(Box::pin(std::future::ready(loaded)))
        }

        fn in_force(&self, content: &ClientTls) -> bool {
            self.0.in_force(content)
        }

        async fn apply(&mut self, content: ClientTls) -> Result<Applied, String> {
            self.0.apply(content).await
        }
    }

    /// Waits (on the paused clock, which moves on by itself) until `done`.
    async fn until(mut done: impl FnMut() -> bool) {
        while !done() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Material a server refuses (a client certificate from a CA it does
    /// not trust): applied once, then again after `FIRST_RETRY`, each
    /// later wait doubled up to `REFUSED_RETRY`; new files are applied at
    /// the next read. On the paused clock: a second a read, no waiting.
    #[tokio::test(start_paused = true)]
    async fn refused_material_waits_for_the_retry_time_unless_the_files_change() {
        let (ca, stranger) = (TestCa::new("follow-ca"), TestCa::new("follow-stranger"));
        let live = tempfile::tempdir().expect("temp dir");
        let (cert, key) = (
            live.path().join("client.crt"),
            live.path().join("client.key"),
        );
        ca.client("app-1").install_at(&cert, &key);
        let fields = ClientTlsFields {
            ca_cert: Some(PemSource::File(ca.ca_path.clone())),
            client_cert: Some(PemSource::File(cert.clone())),
            client_key: Some(PemSource::File(key.clone())),
            insecure_skip_verify: false,
        };
        let in_force = fields.load().expect("material");
        // What was applied, and when; the server takes only certificates
        // of `ca`'s.
        let applied = Arc::new(Mutex::new(Vec::<(ClientTls, Instant)>::new()));
        let good_client = ca.client("app-3");
        let trusted = good_client.cert_pem.clone().into_bytes();
        let followed = FieldFiles {
            fields: fields.clone(),
            in_force,
            apply: {
                let applied = applied.clone();
                move |material: ClientTls| {
                    let trusted = material
                        .identity
                        .as_ref()
                        .is_some_and(|(cert, _)| *cert == trusted);
                    applied
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push((material, Instant::now()));
                    async move { trusted.then_some(()).ok_or_else(|| "refused".to_string()) }
                }
            },
            deadline: FILE_READ_DEADLINE,
            read: read_pem_file,
        };
        let counts = Arc::new(FollowCounts::default());
        let followed = ReadInPlace(followed);
        follow(
            "test".into(),
            "Test",
            CancellationToken::new(),
            followed,
            counts.clone(),
        );
        let times_applied = |material: &ClientTls| {
            let applied = applied.lock().unwrap_or_else(|p| p.into_inner());
            applied
                .iter()
                .filter(|(m, _)| m == material)
                .map(|(_, at)| *at)
                .collect::<Vec<_>>()
        };

        stranger.client("app-2").install_at(&cert, &key);
        let refused = fields.load().expect("material");
        until(|| !times_applied(&refused).is_empty()).await;
        let turns = counts.turns();
        until(|| counts.turns() >= turns + 3).await;
        assert_eq!(
            times_applied(&refused).len(),
            1,
            "tried again within 3 reads"
        );
        // 5, 10, 20, 40, 60, 60 s between tries.
        until(|| times_applied(&refused).len() == 7).await;
        let tried = times_applied(&refused);
        let waits: Vec<u64> = tried.windows(2).map(|w| (w[1] - w[0]).as_secs()).collect();
        let expected = [5, 10, 20, 40, 60, 60];
        assert!(
            waits
                .iter()
                .zip(expected)
                .all(|(waited, at_least)| (at_least..=at_least + 1).contains(waited)),
            "waits between tries {waits:?}, expected {expected:?} (+1 s of read period)"
        );

        good_client.install_at(&cert, &key);
        let good = fields.load().expect("material");
        let turns = counts.turns();
        until(|| !times_applied(&good).is_empty()).await;
        assert!(
            counts.turns() <= turns + 2,
            "new files waited {} reads",
            counts.turns() - turns
        );
        // In force: not applied again.
        let turns = counts.turns();
        until(|| counts.turns() >= turns + 5).await;
        assert_eq!(times_applied(&good).len(), 1);
    }
}
