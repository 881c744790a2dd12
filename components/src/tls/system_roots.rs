//! The system's root certificates (what `rustls-native-certs` finds:
//! `SSL_CERT_FILE`, `SSL_CERT_DIR`, the platform's bundle), read off the
//! async workers and kept for the process.
//!
//! Reading them can block a thread for good: a bundle on a hung network
//! mount, a FIFO named by `SSL_CERT_FILE`. Read where a client is built,
//! that thread was a runtime worker (an Apollo store's `init`, the Redis
//! client at every reconnection): on one worker, the whole sidecar stalled.
//! So a component that trusts the system's roots first calls [`preload`]
//! in its async start (on a thread of its own, within [`READ_DEADLINE`];
//! concurrent callers share one read; at most one stuck thread for the
//! process), and the client configurations built after it take the roots
//! from here ([`now`]). A read older than [`FRESH_FOR`] is made again at
//! the next [`preload`], so an updated bundle reaches components started
//! or reconnected after it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use base64::Engine;
use rewire_runtime::DetachedReader;
use rustls::pki_types::CertificateDer;

use super::pem::TlsError;

/// How long one read of the system's roots may take.
pub const READ_DEADLINE: Duration = Duration::from_secs(10);

/// How long a read is used before [`preload`] reads again.
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

/// Reads the system's roots (blocking).
type Load = fn() -> Vec<CertificateDer<'static>>;

fn load_native() -> Vec<CertificateDer<'static>> {
    rustls_native_certs::load_native_certs().certs
}

/// The last read, the reader (one thread at a time), and the turn that
/// makes concurrent callers share one read.
struct Cache {
    last: ArcSwapOption<SystemRoots>,
    /// Whether [`Cache::preload`] ever ran: from then on, [`Cache::now`]
    /// never reads (a read given up may still block).
    preloaded: AtomicBool,
    reader: DetachedReader,
    turn: tokio::sync::Mutex<()>,
    load: Load,
    deadline: Duration,
}

impl Cache {
    fn new(load: Load, deadline: Duration) -> Self {
        Self {
            last: ArcSwapOption::empty(),
            preloaded: AtomicBool::new(false),
            reader: DetachedReader::default(),
            turn: tokio::sync::Mutex::new(()),
            load,
            deadline,
        }
    }

    async fn preload(&self) -> Result<Arc<SystemRoots>, TlsError> {
        self.preloaded.store(true, Ordering::Release);
        if let Some(roots) = self.last.load_full().filter(|roots| roots.fresh()) {
            return Ok(roots);
        }
        // One read at a time: a caller that waited finds the one before
        // it answered (or given up, when an older read still serves). The
        // wait for the turn and the read share one deadline.
        let until = tokio::time::Instant::now() + self.deadline;
        let turn = tokio::time::timeout_at(until, self.turn.lock()).await;
        let _turn = match turn {
            Ok(turn) => turn,
            Err(_) => return self.older(format!("did not finish within {:?}", self.deadline)),
        };
        if let Some(roots) = self.last.load_full().filter(|roots| roots.fresh()) {
            return Ok(roots);
        }
        let load = self.load;
        let left = until.saturating_duration_since(tokio::time::Instant::now());
        match self.reader.read_within(left, load).await {
            Ok(certificates) => {
                let roots = Arc::new(SystemRoots::of(certificates));
                self.last.store(Some(roots.clone()));
                Ok(roots)
            }
            Err(abandoned) => self.older(abandoned.to_string()),
        }
    }

    /// The read before, else the error of a read that `why`.
    fn older(&self, why: String) -> Result<Arc<SystemRoots>, TlsError> {
        self.last.load_full().ok_or_else(|| {
            TlsError::Config(format!(
                "the system's root certificates (`SSL_CERT_FILE`, `SSL_CERT_DIR`, the \
                 system's bundle) could not be read: the read {why}; set `caCert`"
            ))
        })
    }

    fn now(&self) -> Arc<SystemRoots> {
        if let Some(roots) = self.last.load_full() {
            return roots;
        }
        if self.preloaded.load(Ordering::Acquire) {
            // Every read so far failed or is stuck: none (the caller
            // trusts nothing, or asks for `caCert`), rather than a read
            // that may block this thread too.
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
/// not finish leaves the one before in use; with none, an error saying to
/// set `caCert`. Call it in the async start of a component that trusts
/// the system's roots, before building its client.
pub async fn preload() -> Result<Arc<SystemRoots>, TlsError> {
    SYSTEM.preload().await
}

/// The system's roots as last read, for a client being built: a
/// component's start read them first ([`preload`]). When no read ever
/// succeeded: none if [`preload`] was called (its read failed or hangs);
/// otherwise (a command-line tool, a test) they are read here, blocking.
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
            tokio::spawn(async move { cache.preload().await })
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
        let err = cache.preload().await.expect_err("no roots");
        assert!(err.to_string().contains("set `caCert`"), "{err}");
        assert!(started.elapsed() < Duration::from_secs(5));
        // The stuck read is not started again: the next caller is answered
        // at once.
        let again = Instant::now();
        let err = cache.preload().await.expect_err("no roots");
        assert!(err.to_string().contains("not started"), "{err}");
        assert!(again.elapsed() < Duration::from_millis(150));
        // A client built meanwhile trusts nothing rather than reading.
        assert!(cache.now().certificates.is_empty());
    }
}
