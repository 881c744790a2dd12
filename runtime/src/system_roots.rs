//! The system's root certificates (what `rustls-native-certs` finds:
//! `SSL_CERT_FILE`, `SSL_CERT_DIR`, the platform's bundle), read off the
//! async workers and kept for the process: one read shared by the
//! components' clients, the trace exporter and the command-line tools.
//!
//! Reading them can block a thread for good: a bundle on a hung network
//! mount, a FIFO named by `SSL_CERT_FILE`. Read where a client is built,
//! that thread was a runtime worker (an Apollo store's `init`, the Redis
//! client at every reconnection, the trace exporter's TLS under its
//! lock): on one worker, the whole sidecar stalled. So code that trusts
//! the system's roots first calls [`preload`] (async, on a thread of its
//! own, within [`READ_DEADLINE`]) or [`preload_blocking`] (from sync
//! code, waiting at most the deadline given); concurrent callers share
//! one read, at most one thread is stuck for the process, and a read
//! given up by its caller still lands here when it ends. The client
//! configurations built after it take the roots from here ([`now`],
//! [`cached`]). A read older than [`FRESH_FOR`] is made again at the next
//! preload, so an updated bundle reaches clients built after it.
//!
//! Clients that only speak plain `http://` need none of this: they are
//! built trusting no root at all, so nothing is read.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use base64::Engine;
use rustls_pki_types::CertificateDer;

use crate::DetachedReader;

/// How long one read of the system's roots may take.
pub const READ_DEADLINE: Duration = Duration::from_secs(10);

/// How long a read is used before a preload reads again.
pub const FRESH_FOR: Duration = Duration::from_secs(300);

/// The system's root certificates, as read once.
pub struct SystemRoots {
    /// Each certificate, DER.
    pub certificates: Vec<CertificateDer<'static>>,
    /// The same as one PEM bundle (for clients that take PEM: the Redis
    /// client, tonic).
    pub pem: Vec<u8>,
    read_at: Instant,
}

impl std::fmt::Debug for SystemRoots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SystemRoots")
            .field("certificates", &self.certificates.len())
            .finish()
    }
}

impl SystemRoots {
    fn of(certificates: Vec<CertificateDer<'static>>) -> Self {
        let mut pem = Vec::new();
        for certificate in &certificates {
            let text = base64::engine::general_purpose::STANDARD.encode(certificate.as_ref());
            pem.extend_from_slice(b"-----BEGIN CERTIFICATE-----\n");
            for line in text.as_bytes().chunks(64) {
                pem.extend_from_slice(line);
                pem.push(b'\n');
            }
            pem.extend_from_slice(b"-----END CERTIFICATE-----\n");
        }
        Self {
            certificates,
            pem,
            read_at: Instant::now(),
        }
    }

    fn fresh(&self) -> bool {
        self.read_at.elapsed() < FRESH_FOR
    }
}

/// Why the system's roots are not known: no read ever succeeded, and the
/// last one did not finish in time (or could not start). Callers add
/// what to set instead (a component's `caCert`, `--tls-ca`,
/// `OTEL_EXPORTER_OTLP_CERTIFICATE`).
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "the system's root certificates (`SSL_CERT_FILE`, `SSL_CERT_DIR`, the system's bundle) \
     could not be read: the read {why}"
)]
pub struct SystemRootsError {
    why: String,
}

/// Reads the system's roots (blocking).
type Load = fn() -> Vec<CertificateDer<'static>>;

fn load_native() -> Vec<CertificateDer<'static>> {
    rustls_native_certs::load_native_certs().certs
}

/// The last read, the reader (one thread at a time), and the turn that
/// makes concurrent callers share one read.
struct Cache {
    /// Stored by the reading thread itself: a read its caller gave up on
    /// still serves the next callers once it ends.
    last: Arc<ArcSwapOption<SystemRoots>>,
    /// Whether a preload ever ran: from then on, [`Cache::now`] never
    /// reads (a read given up may still block).
    preloaded: AtomicBool,
    reader: DetachedReader,
    turn: tokio::sync::Mutex<()>,
    load: Load,
    deadline: Duration,
}

impl Cache {
    fn new(load: Load, deadline: Duration) -> Self {
        Self {
            last: Arc::default(),
            preloaded: AtomicBool::new(false),
            reader: DetachedReader::default(),
            turn: tokio::sync::Mutex::new(()),
            load,
            deadline,
        }
    }

    fn fresh(&self) -> Option<Arc<SystemRoots>> {
        self.last.load_full().filter(|roots| roots.fresh())
    }

    /// A fresh read, else one read now, waiting at most `within` (and the
    /// cache's deadline).
    async fn preload_within(&self, within: Duration) -> Result<Arc<SystemRoots>, SystemRootsError> {
        self.preloaded.store(true, Ordering::Release);
        if let Some(roots) = self.fresh() {
            return Ok(roots);
        }
        // One read at a time: a caller that waited finds the one before
        // it answered (or given up, when an older read still serves). The
        // wait for the turn and the read share one deadline.
        let within = within.min(self.deadline);
        let until = tokio::time::Instant::now() + within;
        let turn = tokio::time::timeout_at(until, self.turn.lock()).await;
        let _turn = match turn {
            Ok(turn) => turn,
            Err(_) => return self.older(format!("did not finish within {within:?}")),
        };
        if let Some(roots) = self.fresh() {
            return Ok(roots);
        }
        let (load, last) = (self.load, Arc::clone(&self.last));
        let read = move || {
            let roots = Arc::new(SystemRoots::of(load()));
            last.store(Some(Arc::clone(&roots)));
            roots
        };
        let left = until.saturating_duration_since(tokio::time::Instant::now());
        match self.reader.read_within(left, read).await {
            Ok(roots) => Ok(roots),
            Err(abandoned) => self.older(abandoned.to_string()),
        }
    }

    /// [`Cache::preload_within`] for sync code: the read runs on a thread
    /// of its own, waited for here at most `within`.
    fn preload_blocking(
        &'static self,
        within: Duration,
    ) -> Result<Arc<SystemRoots>, SystemRootsError> {
        self.preloaded.store(true, Ordering::Release);
        if let Some(roots) = self.fresh() {
            return Ok(roots);
        }
        let (answer, answered) = std::sync::mpsc::sync_channel(1);
        let started = std::thread::Builder::new()
            .name("rewire-system-roots".into())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_time()
                    .build();
                let outcome = match runtime {
                    Ok(runtime) => runtime.block_on(self.preload_within(within)),
                    Err(err) => self.older(format!("could not start: {err}")),
                };
                let _ = answer.send(outcome);
            });
        if let Err(err) = started {
            return self.older(format!("could not start: {err}"));
        }
        match answered.recv_timeout(within) {
            Ok(outcome) => outcome,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                self.older(format!("did not finish within {within:?}"))
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                self.older("ended without an answer".into())
            }
        }
    }

    /// The read before, else the error of a read that `why`.
    fn older(&self, why: String) -> Result<Arc<SystemRoots>, SystemRootsError> {
        self.last.load_full().ok_or(SystemRootsError { why })
    }

    fn now(&self) -> Arc<SystemRoots> {
        if let Some(roots) = self.last.load_full() {
            return roots;
        }
        if self.preloaded.load(Ordering::Acquire) {
            // Every read so far failed or is stuck: none (the caller
            // trusts nothing, or asks for a CA), rather than a read that
            // may block this thread too.
            return Arc::new(SystemRoots::of(Vec::new()));
        }
        let roots = Arc::new(SystemRoots::of((self.load)()));
        self.last.store(Some(roots.clone()));
        roots
    }
}

static SYSTEM: LazyLock<Cache> = LazyLock::new(|| Cache::new(load_native, READ_DEADLINE));

/// The system's roots, read again on a thread of its own (within
/// [`READ_DEADLINE`]) unless the last read is fresh. A read that does
/// not finish leaves the one before in use; with none, an error. Call it
/// in the async start of whatever trusts the system's roots, before
/// building its client. No certificate found is not an error here: the
/// roots are then empty.
pub async fn preload() -> Result<Arc<SystemRoots>, SystemRootsError> {
    SYSTEM.preload_within(READ_DEADLINE).await
}

/// [`preload`], waiting at most `within` (capped at [`READ_DEADLINE`]):
/// the read itself goes on, and serves later callers when it ends.
pub async fn preload_within(within: Duration) -> Result<Arc<SystemRoots>, SystemRootsError> {
    SYSTEM.preload_within(within).await
}

/// [`preload_within`] from sync code (an async worker too: the wait is
/// bounded by `within`, the read runs on a thread of its own).
pub fn preload_blocking(within: Duration) -> Result<Arc<SystemRoots>, SystemRootsError> {
    SYSTEM.preload_blocking(within)
}

/// The system's roots as last read, for a client being built: a
/// preload read them first. When no read ever succeeded: none if a
/// preload was made (its read failed or hangs); otherwise (a test) they
/// are read here, blocking.
pub fn now() -> Arc<SystemRoots> {
    SYSTEM.now()
}

/// The roots as last read, if any (never reads).
pub fn cached() -> Option<Arc<SystemRoots>> {
    SYSTEM.last.load_full()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    static READS: AtomicUsize = AtomicUsize::new(0);

    fn one_certificate() -> Vec<CertificateDer<'static>> {
        READS.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(50));
        vec![CertificateDer::from(vec![0x30, 0x03, 0x02, 0x01, 0x01])]
    }

    fn never_returns() -> Vec<CertificateDer<'static>> {
        loop {
            std::thread::park();
        }
    }

    #[tokio::test]
    async fn concurrent_callers_share_one_read_and_get_pem() {
        let cache = Arc::new(Cache::new(one_certificate, Duration::from_secs(5)));
        let before = READS.load(Ordering::SeqCst);
        let calls = (0..8).map(|_| {
            let cache = cache.clone();
            tokio::spawn(async move { cache.preload_within(READ_DEADLINE).await })
        });
        for call in calls {
            let roots = call.await.unwrap().expect("roots");
            assert_eq!(roots.certificates.len(), 1);
            assert_eq!(
                String::from_utf8(roots.pem.clone()).unwrap(),
                "-----BEGIN CERTIFICATE-----\nMAMCAQE=\n-----END CERTIFICATE-----\n"
            );
        }
        assert_eq!(READS.load(Ordering::SeqCst) - before, 1, "one read");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_read_that_never_ends_fails_at_the_deadline_without_blocking_the_caller() {
        let cache = Cache::new(never_returns, Duration::from_millis(200));
        let started = Instant::now();
        let err = cache
            .preload_within(READ_DEADLINE)
            .await
            .expect_err("no roots");
        assert!(err.to_string().contains("did not finish"), "{err}");
        assert!(started.elapsed() < Duration::from_secs(5));
        // The stuck read is not started again: the next caller is answered
        // at once.
        let again = Instant::now();
        let err = cache
            .preload_within(READ_DEADLINE)
            .await
            .expect_err("no roots");
        assert!(err.to_string().contains("not started"), "{err}");
        assert!(again.elapsed() < Duration::from_millis(150));
        // A client built meanwhile trusts nothing rather than reading.
        assert!(cache.now().certificates.is_empty());
    }

    /// Sync code (the trace exporter's start) waits at most its bound for
    /// a read that never ends, then gets an error, not a hang.
    #[test]
    fn a_blocking_preload_of_a_read_that_never_ends_fails_within_its_bound() {
        let cache: &'static Cache = Box::leak(Box::new(Cache::new(never_returns, READ_DEADLINE)));
        let err = cache
            .preload_blocking(Duration::from_millis(200))
            .expect_err("no roots");
        assert!(err.to_string().contains("did not finish"), "{err}");
        assert!(cache.now().certificates.is_empty(), "nothing read here");
    }

    /// A caller that stops waiting before the read ends does not lose it:
    /// the read lands in the cache for the next caller.
    #[tokio::test]
    async fn a_read_given_up_by_its_caller_still_serves_the_next_one() {
        fn slow() -> Vec<CertificateDer<'static>> {
            std::thread::sleep(Duration::from_millis(300));
            vec![CertificateDer::from(vec![0x30, 0x00])]
        }
        let cache = Cache::new(slow, READ_DEADLINE);
        let early = cache.preload_within(Duration::from_millis(20)).await;
        assert!(early.is_err(), "given up before the read ended");
        while cache.reader.is_reading() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let roots = cache.last.load_full().expect("stored by the read");
        assert_eq!(roots.certificates.len(), 1);
    }
}
