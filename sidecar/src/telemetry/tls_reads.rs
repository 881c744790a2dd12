//! The export TLS files read bounded in time, on a thread of their own: a
//! hung mount (NFS, FUSE, a CSI volume) under `OTEL_EXPORTER_OTLP_*`
//! must neither hold start-up nor the follower (and with it every later
//! reload's trace settings), nor pin an async worker.
//!
//! Each read runs on a detached thread and is given up after its deadline.
//! While a read given up has not returned, the next ones are refused at
//! once with the same words (so a refusal is logged once, not every
//! turn): one thread stuck per pipeline, not one per turn. Once it
//! returns, the files are read again. A read stuck for good (a mount
//! lazily unmounted and mounted again, where a fresh read would answer)
//! must not freeze the files for good: after [`TRY_AGAIN_AFTER`] they are
//! read again on a new thread, then after twice as long each time up to
//! [`LONGEST_WAIT`] (the listeners' schedule). Reads that were not given
//! up may run side by side (two applies at once). While
//! [`MAX_STUCK_READS`] reads have not returned (given up or still within
//! their deadline), no other starts until one does: reads started side by
//! side on a mount that hangs cannot pin more threads.
//!
//! Without `OTEL_EXPORTER_OTLP_CERTIFICATE`, the system's roots are read
//! with the files ([`rewire_runtime::system_roots`]: off the async
//! workers, one read shared by the process, within [`READ_DEADLINE`]
//! here): an `https://` collector is then trusted through them, and a
//! bundle that does not answer (`SSL_CERT_FILE` a FIFO, a hung mount)
//! fails the exporter with an error instead of holding the apply, its
//! lock, and start-up.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::tls::{ExportTlsFiles, TlsContents};

/// How long one read of the export TLS files may take: 5 s (as the
/// listeners' TLS files).
pub(super) const READ_DEADLINE: Duration = Duration::from_secs(5);

/// How long a read given up stays the only one before the files are read
/// again on a new thread beside it, the first time: 5 min.
pub(super) const TRY_AGAIN_AFTER: Duration = Duration::from_secs(300);

/// The longest wait between two tries while reads stay stuck: the wait
/// doubles from [`TRY_AGAIN_AFTER`] up to this.
const LONGEST_WAIT: Duration = Duration::from_secs(3600);

/// How many reads may have not returned at once, given up or not: no
/// other is started until one returns (a mount hung for good pins at most
/// these threads).
pub(super) const MAX_STUCK_READS: usize = 8;

/// What reads the files: [`ExportTlsFiles::read`] but in tests.
pub(super) type ReadTls = Arc<dyn Fn(&ExportTlsFiles) -> Result<TlsContents, String> + Send + Sync>;

/// One pipeline's reads of its export TLS files.
pub(super) struct TlsReads {
    read: ReadTls,
    deadline: Duration,
    /// The first wait before a stuck read is tried again on a new thread.
    try_again_after: Duration,
    given_up: Mutex<GivenUp>,
}

/// The reads given up.
#[derive(Default)]
struct GivenUp {
    /// The flag of the last read, if it was given up (`true` once it has
    /// returned): while it has not, no other read starts unless due.
    last: Option<Arc<AtomicBool>>,
    /// The flags of every read started, given up or not, that had not
    /// returned when last looked at (for [`MAX_STUCK_READS`]).
    reading: Vec<Arc<AtomicBool>>,
    /// When the files may be read again on a new thread, and the wait
    /// that led there.
    try_again: Option<(Instant, Duration)>,
}

/// Sets its flag when dropped: the read returned (or panicked).
struct Returned(Arc<AtomicBool>);

impl Drop for Returned {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

impl Default for TlsReads {
    fn default() -> Self {
        Self::new(Arc::new(ExportTlsFiles::read), READ_DEADLINE)
    }
}

impl TlsReads {
    /// Reads with `read`, each given up after `deadline`.
    pub(super) fn new(read: ReadTls, deadline: Duration) -> Self {
        Self {
            read,
            deadline,
            try_again_after: TRY_AGAIN_AFTER,
            given_up: Mutex::default(),
        }
    }

    /// The files' contents, waiting at most the deadline on this thread
    /// (an async worker too: the wait is bounded). No thread is started
    /// for the files when none is named. Without a CA, the system's roots
    /// are waited for too, as long at most (a fresh read is taken as is),
    /// only when `tls` (the collector is dialled over TLS: an `http://`
    /// one never needs them, and must not wait on them).
    pub(super) fn read_blocking(
        &self,
        files: &ExportTlsFiles,
        tls: bool,
    ) -> Result<TlsContents, String> {
        let contents = self.read_files_blocking(files)?;
        if !tls || !contents.wants_system_roots() {
            return Ok(contents);
        }
        let roots = rewire_runtime::system_roots::preload_blocking(self.deadline);
        Ok(contents.with_system_roots(roots.map_err(|e| e.to_string())))
    }

    /// The files' contents alone, as [`TlsReads::read_blocking`] waits
    /// for them.
    fn read_files_blocking(&self, files: &ExportTlsFiles) -> Result<TlsContents, String> {
        if *files == ExportTlsFiles::default() {
            return (self.read)(files);
        }
        let (answer, answered) = std::sync::mpsc::sync_channel(1);
        let returned = self.start(files, move |read| {
            let _ = answer.send(read);
        })?;
        match answered.recv_timeout(self.deadline) {
            Ok(read) => read,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Err(self.give_up(files, returned)),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => Err(ended_unanswered(files)),
        }
    }

    /// The files' contents, waiting at most the deadline without holding
    /// the async worker (and, without a CA, the system's roots as well
    /// when `tls`, as [`TlsReads::read_blocking`]).
    pub(super) async fn read(
        &self,
        files: &ExportTlsFiles,
        tls: bool,
    ) -> Result<TlsContents, String> {
        let contents = self.read_files(files).await?;
        if !tls || !contents.wants_system_roots() {
            return Ok(contents);
        }
        let roots = rewire_runtime::system_roots::preload_within(self.deadline).await;
        Ok(contents.with_system_roots(roots.map_err(|e| e.to_string())))
    }

    /// The files' contents alone, as [`TlsReads::read`] waits for them.
    async fn read_files(&self, files: &ExportTlsFiles) -> Result<TlsContents, String> {
        if *files == ExportTlsFiles::default() {
            return (self.read)(files);
        }
        let (answer, answered) = tokio::sync::oneshot::channel();
        let returned = self.start(files, move |read| {
            let _ = answer.send(read);
        })?;
        match tokio::time::timeout(self.deadline, answered).await {
            Ok(Ok(read)) => read,
            Ok(Err(_)) => Err(ended_unanswered(files)),
            Err(_) => Err(self.give_up(files, returned)),
        }
    }

    /// Starts a read of `files` on a thread of its own, handing its outcome
    /// to `answer`; its flag is set once it returns. Refused while the
    /// last read given up has not returned, unless a try on a new thread
    /// is due; and while [`MAX_STUCK_READS`] reads have not returned,
    /// given up or not (those started side by side count before their
    /// deadline).
    fn start(
        &self,
        files: &ExportTlsFiles,
        answer: impl FnOnce(Result<TlsContents, String>) + Send + 'static,
    ) -> Result<Arc<AtomicBool>, String> {
        let returned = {
            let mut given_up = self.given_up.lock().unwrap_or_else(|p| p.into_inner());
            let returned = |flag: &Arc<AtomicBool>| flag.load(Ordering::Acquire);
            given_up.reading.retain(|flag| !returned(flag));
            let last_stuck = given_up.last.as_ref().is_some_and(|flag| !returned(flag));
            let now = Instant::now();
            let due = given_up.try_again.filter(|(at, _)| now >= *at);
            if last_stuck && due.is_none() {
                return Err(self.stuck(files));
            }
            if given_up.reading.len() >= MAX_STUCK_READS {
                return Err(at_ceiling(files));
            }
            if let Some((_, wait)) = due.filter(|_| last_stuck) {
                let wait = (wait * 2).min(LONGEST_WAIT);
                given_up.try_again = Some((now + wait, wait));
                tracing::info!(files = %shown(files), "Tracing: the TLS files are read again on a new thread; an earlier read is still stuck.");
            } else {
                given_up.try_again = None;
            }
            given_up.last = None;
            let returned = Arc::new(AtomicBool::new(false));
            given_up.reading.push(Arc::clone(&returned));
            returned
        };
        let guard = Returned(Arc::clone(&returned));
        let (read, files_read) = (Arc::clone(&self.read), files.clone());
        std::thread::Builder::new()
            .name("rewire-otlp-tls-read".into())
            .spawn(move || {
                let outcome = {
                    let _returned = guard;
                    read(&files_read)
                };
                answer(outcome);
            })
            .map_err(|e| format!("{}: cannot start a reading thread: {e}", shown(files)))?;
        Ok(returned)
    }

    /// The read of `files` whose flag is `returned` is given up: the next
    /// reads are refused until it returns. The words of the refusal.
    fn give_up(&self, files: &ExportTlsFiles, returned: Arc<AtomicBool>) -> String {
        let mut given_up = self.given_up.lock().unwrap_or_else(|p| p.into_inner());
        if !returned.load(Ordering::Acquire) {
            given_up.last = Some(returned);
            if given_up.try_again.is_none() {
                let wait = self.try_again_after;
                given_up.try_again = Some((Instant::now() + wait, wait));
            }
        }
        self.stuck(files)
    }

    /// Why `files` are not read: a read of them did not answer in time.
    /// The same words while it stays stuck (a refusal is logged once).
    fn stuck(&self, files: &ExportTlsFiles) -> String {
        format!(
            "{}: a read did not finish within {:?} (a hung mount?); the files are read again once it returns, or on a new thread after {:?}, then at doubling intervals",
            shown(files),
            self.deadline, self.try_again_after
        )
    }
}

/// Why `files` are not read: [`MAX_STUCK_READS`] reads of them have not
/// returned (the same words while so: logged once).
fn at_ceiling(files: &ExportTlsFiles) -> String {
    format!(
        "{}: {MAX_STUCK_READS} reads have not returned (a hung mount?); no other starts until one does",
        shown(files)
    )
}

/// Why `files` are not read: the reading thread ended (panicked) without
/// an answer.
fn ended_unanswered(files: &ExportTlsFiles) -> String {
    format!(
        "{}: the reading thread ended without an answer",
        shown(files)
    )
}

/// The variables and files `files` name, for messages (never contents).
pub(super) fn shown(files: &ExportTlsFiles) -> String {
    let named = [
        ("OTEL_EXPORTER_OTLP_CERTIFICATE", &files.ca),
        ("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", &files.client_cert),
        ("OTEL_EXPORTER_OTLP_CLIENT_KEY", &files.client_key),
    ];
    named
        .iter()
        .filter_map(|(variable, path)| {
            path.as_ref()
                .map(|path| match super::tls::holds_no_path(path) {
                    true => format!("{variable} (not a file path; not shown)"),
                    false => format!("{variable} ({})", super::tls::shown_path(path)),
                })
        })
        .collect::<Vec<_>>()
        .join(", ")
}
