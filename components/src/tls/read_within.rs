//! Reading a component's TLS files (`caCert`, `clientCert`, `clientKey`)
//! off the async workers, within a deadline.
//!
//! Read in `init` on a runtime worker, a file on a hung NFS or FUSE mount
//! (a `stat`, `open` or `read` that never returns) stalled that worker for
//! good: with `--workers 1`, the whole sidecar (health, every API). So each
//! file is read on a thread of its own, through the per-path reader of
//! [`crate::component_file`] (a path whose read was given up pins one
//! thread however often the component retries), and the files of one load
//! share [`FILE_READ_DEADLINE`] (each file gets at least
//! [`FILE_READ_FLOOR`] of its own): a read not finished by then fails the
//! load with an error naming the field, the file and the time it had.
//! Each file is still read once: the bytes checked are the bytes kept.

use std::path::Path;
use std::time::Duration;

use rewire_runtime::FileReadError;
use tokio::time::Instant;

use super::client::{ClientTls, ClientTlsFields, ReadFields};
use super::pem::{read_error_reason, shown_path, PemSource, TlsError, MAX_PEM_BYTES};

/// How long the reads of one load's TLS files may take in all: as long as
/// the system's roots get, well under the init timeout (30 s).
pub const FILE_READ_DEADLINE: Duration = Duration::from_secs(10);

/// The least time one file's read gets, however little of the load's
/// deadline the files before it left (but never more than the deadline):
/// a slow `caCert` does not leave `clientCert` to be given up, and blamed
/// for a hang, with no time of its own. The three files of a load take at
/// most [`FILE_READ_DEADLINE`] and twice this.
const FILE_READ_FLOOR: Duration = Duration::from_secs(1);

/// Reads one PEM file, blocking: [`rewire_runtime::read_bounded`] but in
/// tests.
pub(super) type ReadFile = fn(&Path) -> Result<Vec<u8>, FileReadError>;

pub(super) fn read_pem_file(path: &Path) -> Result<Vec<u8>, FileReadError> {
    rewire_runtime::read_bounded(path, MAX_PEM_BYTES)
}

impl ClientTlsFields {
    /// [`load`](Self::load) with the files read off the async workers, all
    /// within `deadline`: call it in a component's async start. A file
    /// whose read does not finish in time fails the load ("reading it timed
    /// out after 10 s") instead of blocking the caller.
    pub async fn load_within(&self, deadline: Duration) -> Result<ClientTls, TlsError> {
        self.load_with(deadline, read_pem_file).await
    }

    pub(super) async fn load_with(
        &self,
        deadline: Duration,
        read: ReadFile,
    ) -> Result<ClientTls, TlsError> {
        let until = Instant::now() + deadline;
        let field = |source, name| read_field(source, name, deadline, until, read);
        let read = ReadFields {
            ca: field(&self.ca_cert, "caCert").await?,
            cert: field(&self.client_cert, "clientCert").await?,
            key: field(&self.client_key, "clientKey").await?,
        };
        self.checked(read)
    }
}

/// The bytes of `source` (field `field`), a file read on a thread of its
/// own until `until` (`deadline` after the load began), or for
/// [`FILE_READ_FLOOR`] (at most `deadline`) if that is later.
async fn read_field(
    source: &Option<PemSource>,
    field: &'static str,
    deadline: Duration,
    until: Instant,
    read: ReadFile,
) -> Result<Option<Vec<u8>>, TlsError> {
    let path = match source {
        None => return Ok(None),
        Some(PemSource::File(path)) => path,
        Some(inline) => return inline.read(field).map(Some),
    };
    let failed = |reason| TlsError::Read {
        field,
        path: shown_path(path),
        reason,
    };
    let hung = |reason| TlsError::Hung {
        field,
        path: shown_path(path),
        reason,
    };
    let left = until.saturating_duration_since(Instant::now());
    let bound = left.max(FILE_READ_FLOOR.min(deadline));
    let owned = path.clone();
    let call = move || Ok(read(&owned));
    match crate::component_file::on_path_within(path, bound, call).await {
        Ok(Ok(bytes)) => Ok(Some(bytes)),
        Ok(Err(err)) => Err(failed(read_error_reason(&err))),
        // The time this file had, to the millisecond: `0.3 s`, `10 s`.
        Err(err) if err.kind() == std::io::ErrorKind::TimedOut => Err(hung(format!(
            "reading it timed out after {} s (a hung mount?)",
            (bound.as_secs_f64() * 1000.0).round() / 1000.0
        ))),
        // Not started: an earlier read of the file, given up, is stuck.
        Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => Err(hung(STILL_READING.into())),
        // No thread could start, or the read panicked: nothing hangs.
        Err(err) => Err(failed(err.to_string())),
    }
}

/// Why a file is not read while an earlier read of it, given up, has not
/// returned. Like every reason of [`TlsError::Hung`], without ": " (a
/// follower tells the hung file by the message before the last ": ").
const STILL_READING: &str =
    "an earlier read of it, given up, has not returned yet (a hung mount?); not read again meanwhile";

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::{mpsc, Arc};

    /// A FIFO at a fresh path in `dir`: a plain read of it blocks until a
    /// writer comes, as a read on a hung mount never returns.
    pub(in crate::tls) fn fifo(dir: &tempfile::TempDir, name: &str) -> std::path::PathBuf {
        let path = dir.path().join(name);
        let made = std::process::Command::new("mkfifo").arg(&path).status();
        assert!(made.is_ok_and(|s| s.success()), "mkfifo failed");
        path
    }

    /// A plain read, blocking (a FIFO with no writer: for ever), standing
    /// for a read on a hung mount (`read_bounded` refuses a FIFO at once).
    pub(in crate::tls) fn plain_read(path: &Path) -> Result<Vec<u8>, FileReadError> {
        std::fs::read(path).map_err(|source| FileReadError::Io {
            path: path.display().to_string(),
            source,
        })
    }

    /// Lets a blocked [`plain_read`] of `fifo` return, so its thread ends
    /// (on a thread: the write waits for the reader to open the FIFO).
    pub(in crate::tls) fn release(fifo: &Path) {
        let fifo = fifo.to_path_buf();
        std::thread::spawn(move || std::fs::write(fifo, b"released"));
    }

    #[test]
    fn a_hung_ca_file_fails_the_load_at_the_deadline_while_other_tasks_run() {
        let dir = tempfile::tempdir().expect("dir");
        let ca = fifo(&dir, "ca.pem");
        let fields = ClientTlsFields {
            ca_cert: Some(PemSource::File(ca.clone())),
            ..ClientTlsFields::default()
        };
        // One thread runs every task (as `--workers 1`); the test waits for
        // it with a deadline of its own, so a blocked runtime fails the
        // test rather than hanging it.
        let (done, outcome) = mpsc::channel();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .expect("runtime");
            runtime.block_on(async move {
                let ticks = Arc::new(AtomicU32::new(0));
                let ticking = Arc::clone(&ticks);
                let ticker = tokio::spawn(async move {
                    loop {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        ticking.fetch_add(1, Ordering::SeqCst);
                    }
                });
                let started = std::time::Instant::now();
                let deadline = Duration::from_millis(300);
                let loaded = fields.load_with(deadline, plain_read).await;
                let took = started.elapsed();
                let ticked = ticks.load(Ordering::SeqCst);
                let again = fields.load_with(deadline, plain_read).await;
                ticker.abort();
                let _ = done.send((loaded.map(drop), took, ticked, again.map(drop)));
            });
        });
        let received = outcome.recv_timeout(Duration::from_secs(10));
        release(&ca);
        let (loaded, took, ticked, again) =
            received.expect("the load blocked its runtime's only thread");
        let text = loaded.expect_err("a hung file").to_string();
        assert!(
            text.contains("`caCert`") && text.contains("ca.pem"),
            "{text}"
        );
        assert!(text.contains("timed out after 0.3 s"), "{text}");
        assert!(took < Duration::from_secs(3), "{took:?}");
        assert!(ticked >= 5, "another task ran {ticked} times meanwhile");
        // Tried again (a retried init) while the first read is stuck: refused
        // at once, no second thread stuck.
        let text = again.expect_err("still stuck").to_string();
        assert!(
            text.contains("`caCert`") && text.contains("has not returned yet"),
            "{text}"
        );
    }

    /// Reads the file, then garbles it: a second read would find garbage.
    fn read_then_garble(path: &Path) -> Result<Vec<u8>, FileReadError> {
        let bytes = read_pem_file(path)?;
        std::fs::write(path, "-----BEGIN CERTIFICATE-----\ngarbled").expect("garble");
        Ok(bytes)
    }

    #[tokio::test]
    async fn the_material_kept_is_the_bytes_read_off_the_workers() {
        let ca = testkit::certs::TestCa::new("tls-read-within-once");
        let client = ca.client("client");
        let fields = ClientTlsFields {
            ca_cert: Some(PemSource::File(ca.ca_path.clone())),
            client_cert: Some(PemSource::File(client.cert_path.clone())),
            client_key: Some(PemSource::Inline(client.key_pem.clone())),
            insecure_skip_verify: false,
        };
        let material = fields
            .load_with(FILE_READ_DEADLINE, read_then_garble)
            .await
            .expect("the bytes read are good");
        assert_eq!(material.ca_pem.as_deref(), Some(ca.ca_pem.as_bytes()));
        assert_eq!(
            material.identity,
            Some((
                client.cert_pem.clone().into_bytes(),
                client.key_pem.clone().into_bytes()
            ))
        );
        let err = fields
            .load_within(FILE_READ_DEADLINE)
            .await
            .expect_err("the garbled files themselves are refused");
        assert!(err.to_string().contains("`caCert`"), "{err}");
    }

    /// A read that panics (as would a thread that cannot start) fails the
    /// load as a read error, not as a hang: nothing is left stuck, and the
    /// file is read again at the next load.
    #[tokio::test]
    async fn a_read_that_panics_is_a_read_error_not_a_hang() {
        fn panics(_: &Path) -> Result<Vec<u8>, FileReadError> {
            panic!("a read that panics");
        }
        let fields = ClientTlsFields {
            ca_cert: Some(PemSource::File("/panics/ca.pem".into())),
            ..ClientTlsFields::default()
        };
        for _ in 0..2 {
            let err = fields
                .load_with(FILE_READ_DEADLINE, panics)
                .await
                .expect_err("a read that panics");
            assert!(!err.is_hung(), "{err}");
            let text = err.to_string();
            assert!(
                text.contains("`caCert`") && text.contains("without an answer"),
                "{text}"
            );
        }
    }

    /// Sleeps 250 ms for `ca.pem`, 100 ms for any other file, then reads
    /// it: a slow file before others.
    fn slow_ca_read(path: &Path) -> Result<Vec<u8>, FileReadError> {
        let ca = path.file_name().is_some_and(|name| name == "ca.pem");
        std::thread::sleep(Duration::from_millis(if ca { 250 } else { 100 }));
        read_pem_file(path)
    }

    /// A slow `caCert` that uses up most of the load's deadline leaves
    /// `clientCert` time of its own: not given up, nor blamed for a hang.
    #[tokio::test]
    async fn a_file_after_a_slow_one_still_gets_time_of_its_own() {
        let ca = testkit::certs::TestCa::new("tls-read-within-slow-ca");
        let client = ca.client("client");
        let dir = tempfile::tempdir().expect("dir");
        let (ca_path, cert, key) = (
            dir.path().join("ca.pem"),
            dir.path().join("client.crt"),
            dir.path().join("client.key"),
        );
        std::fs::write(&ca_path, &ca.ca_pem).expect("write the CA");
        client.install_at(&cert, &key);
        let fields = ClientTlsFields {
            ca_cert: Some(PemSource::File(ca_path)),
            client_cert: Some(PemSource::File(cert)),
            client_key: Some(PemSource::Inline(client.key_pem.clone())),
            insecure_skip_verify: false,
        };
        let deadline = Duration::from_millis(300);
        let loaded = fields.load_with(deadline, slow_ca_read).await;
        assert!(loaded.is_ok(), "{:?}", loaded.err());
    }
}
