//! [`LiveTls`]: one listener's TLS configuration in force, re-read when one
//! of its files changes.
//!
//! Every second the files are read and compared with what was loaded. On a
//! change a new configuration is built; only if every file parses and the
//! key matches the certificate is it swapped in, so a half-written
//! rotation (certificate replaced, key not yet) is refused, shown in
//! status, and retried on the next change. A certificate not valid yet is
//! refused too, but the same files are tried again every second, so it is
//! swapped in once it is valid: in a rotation, once its notBefore has
//! passed on this clock (clients on this host share it), unless the
//! certificate in force has expired or expires within
//! `material::NOT_BEFORE_SKEW` (5 minutes), the allowance a clock behind
//! the issuer's gets at start-up. A change that keeps the leaf in force
//! (a CA rotated) is not checked against its window again: the leaf
//! already serves, and expired it must not hold back a new Lifecycle CA.
//! The next handshake uses whatever is in force; open connections keep
//! the one they started with.
//!
//! A read that hangs (a hung NFS, FUSE or CSI mount) is given up after 5 s,
//! at start-up too (where [`ServingTls::start_off_workers`] awaits it
//! without holding an async worker); while it stays stuck the files are
//! read again on a new thread at growing intervals, so a remounted path's
//! renewed pair is loaded, with at most 8 reads of one file alive at once
//! (`follow_reads`). A certificate in force that has expired is shown in
//! status (beside any refusal or read error) and warned once.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::server::danger::ClientCertVerifier;
use rustls::ServerConfig;
use serde::Serialize;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use x509_parser::time::ASN1Time;

use rewire_runtime::{Abandoned, DetachedReader};

use super::follow_reads::{
    FollowerReads, Pace, ReadAlive, ReadFiles, READ_DEADLINE, TRY_AGAIN_AFTER,
};
use super::material::{Built, Files, Refused, NOT_BEFORE_SKEW};
use super::settings::{ListenerTls, TlsSettings};

/// How often the files are compared with what was loaded.
const RECHECK_EVERY: Duration = Duration::from_secs(1);

/// What status shows of one listener's TLS. No key material.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct TlsStatus {
    /// `grpc` or `http`.
    pub listener: String,
    /// The certificate file.
    pub cert_file: String,
    /// SHA-256 of the certificate in force (hex).
    pub certificate_sha256: String,
    /// How many times a configuration was loaded (1 at start).
    pub loads: u64,
    /// Whether clients must present a certificate.
    pub mutual: bool,
    /// Why the last change of the files was refused, while the files stay
    /// as they are (`None` once a good set is loaded).
    pub error: Option<String>,
}

/// One listener's TLS configuration in force.
pub struct LiveTls {
    files: Files,
    lifecycle_ca: Option<std::path::PathBuf>,
    config: ArcSwap<ServerConfig>,
    lifecycle: ArcSwap<Option<Arc<dyn ClientCertVerifier>>>,
    status: Mutex<TlsStatus>,
    loaded: Mutex<Loaded>,
}

/// The files' content last built from, and why it was refused (`None`:
/// it is the configuration in force).
struct Loaded {
    contents: Vec<Vec<u8>>,
    refused: Option<String>,
    /// Contents refused as not valid yet: never taken as built from (they
    /// pass with time, so every recheck tries them again); kept only so
    /// that their refusal is logged once, not every second.
    waiting: Option<Vec<Vec<u8>>>,
    /// The notAfter of the certificate in force (Unix seconds).
    not_after: i64,
    /// The notAfter whose passing was warned of: once per certificate,
    /// however often reads fail and succeed again meanwhile.
    expiry_warned: Option<i64>,
}

impl LiveTls {
    /// Loads `settings` (and the Lifecycle CA, if any) for `listener`. The
    /// files are read on a thread of their own, given up after
    /// [`READ_DEADLINE`]: a hung mount fails the start (naming the files)
    /// instead of holding it, and the signals that would stop it, for ever.
    /// The calling thread waits for the read, up to that deadline: in async
    /// code, [`LiveTls::load_off_workers`].
    pub fn load(
        listener: &str,
        settings: &ListenerTls,
        lifecycle_ca: Option<&std::path::Path>,
    ) -> Result<Arc<Self>, String> {
        Self::load_with(listener, settings, lifecycle_ca, READ_DEADLINE, |files| {
            files.contents()
        })
    }

    /// [`LiveTls::load`] reading with `read`, given up after `deadline`.
    fn load_with(
        listener: &str,
        settings: &ListenerTls,
        lifecycle_ca: Option<&std::path::Path>,
        deadline: Duration,
        read: impl FnOnce(Files) -> Result<Vec<Vec<u8>>, String> + Send + 'static,
    ) -> Result<Arc<Self>, String> {
        let files = files_of(listener, settings, lifecycle_ca);
        let contents = read_within(&files, deadline, read)?;
        Self::from_contents(listener, files, contents)
    }

    /// [`LiveTls::load`] for async code: the read's thread is awaited, not
    /// waited for, so a hung mount at start-up holds no async worker (other
    /// tasks run meanwhile, even on a current-thread runtime or with one
    /// worker) until the load fails after [`READ_DEADLINE`].
    pub async fn load_off_workers(
        listener: &str,
        settings: &ListenerTls,
        lifecycle_ca: Option<&std::path::Path>,
    ) -> Result<Arc<Self>, String> {
        let read = |files: Files| files.contents();
        Self::load_off_workers_with(listener, settings, lifecycle_ca, READ_DEADLINE, read).await
    }

    /// [`LiveTls::load_off_workers`] reading with `read`, given up after
    /// `deadline`.
    async fn load_off_workers_with(
        listener: &str,
        settings: &ListenerTls,
        lifecycle_ca: Option<&std::path::Path>,
        deadline: Duration,
        read: impl FnOnce(Files) -> Result<Vec<Vec<u8>>, String> + Send + 'static,
    ) -> Result<Arc<Self>, String> {
        let files = files_of(listener, settings, lifecycle_ca);
        let contents = read_off_workers(&files, deadline, read).await?;
        Self::from_contents(listener, files, contents)
    }

    /// The configuration built from `contents`, the bytes of `files` read
    /// at start-up; refused if they do not make one.
    fn from_contents(
        listener: &str,
        files: Files,
        contents: Vec<Vec<u8>>,
    ) -> Result<Arc<Self>, String> {
        let Built {
            config,
            fingerprint,
            lifecycle,
            not_after,
        } = files.server_config(&contents, ASN1Time::now(), NOT_BEFORE_SKEW)?;
        let status = TlsStatus {
            listener: listener.to_string(),
            cert_file: files.cert.display().to_string(),
            certificate_sha256: fingerprint,
            loads: 1,
            mutual: files.required_ca.is_some(),
            error: None,
        };
        Ok(Arc::new(Self {
            lifecycle_ca: files.optional_ca.clone(),
            files,
            config: ArcSwap::from_pointee(config),
            lifecycle: ArcSwap::from_pointee(lifecycle),
            status: Mutex::new(status),
            loaded: Mutex::new(Loaded {
                contents,
                refused: None,
                waiting: None,
                not_after,
                expiry_warned: None,
            }),
        }))
    }

    /// An acceptor with the configuration in force now.
    pub fn acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(self.config.load_full())
    }

    /// The Lifecycle API's client verifier in force, if one is configured.
    pub fn lifecycle_verifier(&self) -> Option<Arc<dyn ClientCertVerifier>> {
        self.lifecycle.load().as_ref().clone()
    }

    /// Whether a Lifecycle client CA is configured (then a missing
    /// verifier refuses every Lifecycle call rather than allowing it).
    pub fn lifecycle_ca_configured(&self) -> bool {
        self.lifecycle_ca.is_some()
    }

    /// The ALPN protocols the configuration in force offers.
    pub fn alpn_protocols(&self) -> Vec<Vec<u8>> {
        self.config.load().alpn_protocols.clone()
    }

    /// Drops the Lifecycle verifier (tests of the fail-closed check).
    #[cfg(test)]
    pub(super) fn drop_lifecycle_verifier(&self) {
        self.lifecycle.store(Arc::new(None));
    }

    /// What status shows.
    pub fn status(&self) -> TlsStatus {
        self.status
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Follows the files until `stop` is cancelled. Each read is given up
    /// after [`READ_DEADLINE`] (a hung mount), and tried again on a new
    /// thread at growing intervals while it stays stuck (see
    /// `follow_reads`); `stop` ends the follower even mid-read.
    pub fn follow(self: &Arc<Self>, stop: CancellationToken) {
        let files = self.files.clone();
        let pace = Pace {
            every: RECHECK_EVERY,
            deadline: READ_DEADLINE,
            try_again_after: TRY_AGAIN_AFTER,
        };
        drop(self.follow_with(stop, pace, Arc::new(move || files.contents())));
    }

    /// [`LiveTls::follow`] reading with `read`, paced by `pace`.
    fn follow_with(
        self: &Arc<Self>,
        stop: CancellationToken,
        pace: Pace,
        read: ReadFiles,
    ) -> tokio::task::JoinHandle<()> {
        let live = Arc::clone(self);
        let files = format!(
            "the {} listener's TLS files ({})",
            live.status().listener,
            live.files.shown()
        );
        let paths = live.files.paths().into_iter().map(Into::into).collect();
        let mut reads = FollowerReads::new(read, pace, files, paths);
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(pace.every) => {}
                }
                let contents = tokio::select! {
                    () = stop.cancelled() => return,
                    contents = reads.read() => contents,
                };
                // Parsing and checking the files read: no I/O, but CPU,
                // so off the async workers.
                let again = Arc::clone(&live);
                let checked = tokio::task::spawn_blocking(move || {
                    again.apply(contents, ASN1Time::now());
                });
                tokio::select! {
                    () = stop.cancelled() => return,
                    _ = checked => {}
                }
            }
        })
    }

    /// Reloads if the files changed since the last load (or the last
    /// refused attempt), or if they hold a certificate that was not valid
    /// yet.
    pub fn recheck(&self) {
        self.recheck_at(ASN1Time::now());
    }

    /// [`LiveTls::recheck`] with the validity window checked at `now`.
    fn recheck_at(&self, now: ASN1Time) {
        self.apply(self.files.contents(), now);
    }

    /// Reloads if `read` (the files' bytes, or why they were not read)
    /// differs from the last load (or the last refused attempt), or holds
    /// a certificate that was not valid yet, checked at `now`.
    fn apply(&self, read: Result<Vec<Vec<u8>>, String>, now: ASN1Time) {
        let mut loaded = self.loaded.lock().unwrap_or_else(|p| p.into_inner());
        let contents = match read {
            Ok(contents) => contents,
            Err(err) => return self.refuse(&mut loaded, err, now),
        };
        if loaded.contents == contents {
            // Unchanged since the last build: what status shows is that
            // build's outcome, not a read error seen in between (a file
            // briefly missing while being replaced).
            // A certificate in force that has expired since is shown too
            // (every handshake fails until new files come), warned once.
            loaded.waiting = None;
            let expired = self.expired_in_force(&mut loaded, now);
            let shown = match (loaded.refused.clone(), expired) {
                (Some(refused), Some(expired)) => Some(format!("{refused}; {expired}")),
                (refused, expired) => refused.or(expired),
            };
            let mut status = self.status.lock().unwrap_or_else(|p| p.into_inner());
            if status.error != shown {
                if shown.is_none() {
                    tracing::info!(listener = %status.listener, "TLS files readable again and unchanged; the certificate in force stays.");
                }
                status.error = shown;
            }
            return;
        }
        // The allowance for a clock behind the issuer's only when the
        // certificate in force is expired or about to be: otherwise clients
        // on this host (same clock) would refuse the new one as not valid
        // yet while the old one still serves, so the new one waits for its
        // notBefore (the same files are tried every second).
        // The leaf in force is not checked again at all (below): a change
        // of the CA files alone must not refuse it as not valid yet, nor as
        // expired.
        let allowance = i64::try_from(NOT_BEFORE_SKEW.as_secs()).unwrap_or(i64::MAX);
        let in_force = self.status().certificate_sha256;
        let same_leaf = contents
            .first()
            .and_then(|cert| leaf_fingerprint(cert))
            .is_some_and(|leaf| leaf == in_force);
        let skew = if loaded.not_after <= now.timestamp().saturating_add(allowance) {
            NOT_BEFORE_SKEW
        } else {
            Duration::ZERO
        };
        // Built from the bytes just compared, not from a second read: a
        // file caught mid-rewrite by that read would refuse a good set for
        // good (later checks see the same contents and never retry).
        // The leaf in force is not checked again: it already serves, and
        // expired it must not hold back a change of the CA files (an old,
        // maybe compromised, Lifecycle CA would stay trusted).
        let built = if same_leaf {
            self.files.server_config_keeping_leaf(&contents)
        } else {
            self.files.server_config(&contents, now, skew)
        };
        match built {
            Ok(Built {
                config,
                fingerprint,
                lifecycle,
                not_after,
            }) => {
                loaded.contents = contents;
                loaded.refused = None;
                loaded.waiting = None;
                loaded.not_after = not_after;
                self.config.store(Arc::new(config));
                self.lifecycle.store(Arc::new(lifecycle));
                // Only a kept leaf can have expired.
                let expired = self.expired_in_force(&mut loaded, now);
                let mut status = self.status.lock().unwrap_or_else(|p| p.into_inner());
                status.certificate_sha256 = fingerprint;
                status.loads += 1;
                status.error = expired;
                tracing::info!(listener = %status.listener, certificate_sha256 = %status.certificate_sha256, "TLS certificate reloaded; new handshakes use it.");
            }
            Err(Refused {
                reason,
                not_yet_valid: true,
            }) => {
                // Not taken as built from: these same files pass with time
                // (a renewed certificate waiting for its notBefore, a clock
                // behind the issuer's), so the next recheck builds them
                // again. Logged once for these contents; status shows why
                // meanwhile.
                let first = loaded.waiting.as_ref() != Some(&contents);
                loaded.waiting = Some(contents);
                let expired = self.expired_in_force(&mut loaded, now);
                let mut status = self.status.lock().unwrap_or_else(|p| p.into_inner());
                if first {
                    tracing::warn!(listener = %status.listener, error = %reason, "New TLS files refused until their certificate is valid (checked again every second); the certificate in force stays.");
                }
                status.error = Some(match expired {
                    Some(expired) => format!("{reason}; {expired}"),
                    None => reason,
                });
            }
            Err(Refused { reason, .. }) => {
                loaded.contents = contents;
                loaded.refused = Some(reason.clone());
                loaded.waiting = None;
                self.refuse(&mut loaded, reason, now);
            }
        }
    }

    /// Why the certificate in force (`loaded.not_after`) no longer serves
    /// at `now`: `None` while it is valid. Warned once per certificate
    /// (however often reads fail and succeed again meanwhile).
    fn expired_in_force(&self, loaded: &mut Loaded, now: ASN1Time) -> Option<String> {
        let not_after = loaded.not_after;
        if now.timestamp() <= not_after {
            return None;
        }
        let at = ASN1Time::from_timestamp(not_after)
            .map_or_else(|_| format!("{not_after} (Unix time)"), |at| at.to_string());
        let expired = format!(
            "the certificate in force (from `{}`) expired at {at}; every handshake fails until a valid one is written",
            self.files.cert.display()
        );
        if loaded.expiry_warned != Some(not_after) {
            loaded.expiry_warned = Some(not_after);
            let listener = self.status().listener;
            tracing::warn!(listener = %listener, error = %expired, "The TLS certificate in force has expired: handshakes fail until valid files are written.");
        }
        Some(expired)
    }

    /// Shows `err` (why new files were refused, or not read) in status,
    /// with the expiry of the certificate in force if it has expired at
    /// `now`; the certificate in force stays.
    fn refuse(&self, loaded: &mut Loaded, err: String, now: ASN1Time) {
        let shown = match self.expired_in_force(loaded, now) {
            Some(expired) => format!("{err}; {expired}"),
            None => err.clone(),
        };
        let mut status = self.status.lock().unwrap_or_else(|p| p.into_inner());
        if status.error.as_deref() != Some(shown.as_str()) {
            tracing::warn!(listener = %status.listener, error = %err, "New TLS files refused; the certificate in force stays.");
            status.error = Some(shown);
        }
    }
}

/// The files one listener's configuration is made of: `settings`, and the
/// Lifecycle CA on the gRPC listener.
fn files_of(
    listener: &str,
    settings: &ListenerTls,
    lifecycle_ca: Option<&std::path::Path>,
) -> Files {
    Files {
        cert: settings.cert.clone(),
        key: settings.key.clone(),
        required_ca: settings.client_ca.clone(),
        optional_ca: lifecycle_ca.map(std::path::Path::to_path_buf),
        alpn: match listener {
            "grpc" => vec![b"h2".to_vec()],
            _ => vec![b"h2".to_vec(), b"http/1.1".to_vec()],
        },
    }
}

/// `read(files)` as a start-up read: counted among the reads alive of each
/// file (refused at once, naming the file, while the ceiling of reads
/// stuck on it is reached), to run on a thread of its own.
fn counted_start_up_read(
    files: &Files,
    read: impl FnOnce(Files) -> Result<Vec<Vec<u8>>, String> + Send + 'static,
) -> Result<impl FnOnce() -> Result<Vec<Vec<u8>>, String> + Send + 'static, String> {
    let counted = ReadAlive::count_in(&files.paths(), &files.shown())?;
    let owned = files.clone();
    Ok(move || {
        let _counted = counted;
        read(owned)
    })
}

/// Why a start-up read of `files` was given up at `deadline`.
fn took_longer(files: &Files, deadline: Duration) -> String {
    format!(
        "reading {} took longer than {deadline:?}; given up (a hung mount?)",
        files.shown()
    )
}

/// `read(files)` run on a thread of its own, detached, given up after
/// `deadline` (the thread is left to end, or not, on its own). The calling
/// thread waits.
fn read_within(
    files: &Files,
    deadline: Duration,
    read: impl FnOnce(Files) -> Result<Vec<Vec<u8>>, String> + Send + 'static,
) -> Result<Vec<Vec<u8>>, String> {
    let read = counted_start_up_read(files, read)?;
    let (answer, answered) = std::sync::mpsc::sync_channel(1);
    std::thread::Builder::new()
        .name("rewire-tls-read".into())
        .spawn(move || {
            let _ = answer.send(read());
        })
        .map_err(|e| format!("cannot start a thread to read {}: {e}", files.shown()))?;
    answered.recv_timeout(deadline).map_err(|e| match e {
        std::sync::mpsc::RecvTimeoutError::Timeout => took_longer(files, deadline),
        std::sync::mpsc::RecvTimeoutError::Disconnected => format!(
            "reading {}: the reading thread ended without an answer",
            files.shown()
        ),
    })?
}

/// [`read_within`] awaited: the caller's async worker is free meanwhile.
async fn read_off_workers(
    files: &Files,
    deadline: Duration,
    read: impl FnOnce(Files) -> Result<Vec<Vec<u8>>, String> + Send + 'static,
) -> Result<Vec<Vec<u8>>, String> {
    let read = counted_start_up_read(files, read)?;
    DetachedReader::default()
        .read_within(deadline, read)
        .await
        .map_err(|abandoned| match abandoned {
            Abandoned::TimedOut(_) => took_longer(files, deadline),
            other => format!("reading {}: {other}", files.shown()),
        })?
}

/// The SHA-256 fingerprint of the first certificate in `cert` (a
/// certificate file's bytes), if it parses.
fn leaf_fingerprint(cert: &[u8]) -> Option<String> {
    use rustls::pki_types::pem::PemObject;
    let leaf = rustls::pki_types::CertificateDer::pem_slice_iter(cert)
        .next()?
        .ok()?;
    Some(super::material::fingerprint(&leaf))
}

/// Refuses a Lifecycle client CA without TLS on the gRPC listener.
fn refuse_a_lifecycle_ca_without_grpc_tls(settings: &TlsSettings) -> Result<(), String> {
    if settings.lifecycle_client_ca.is_some() && settings.grpc.is_none() {
        return Err("a Lifecycle client CA needs TLS on the gRPC listener (--tls-cert and --tls-key, or --grpc-tls-cert and --grpc-tls-key)".into());
    }
    Ok(())
}

/// The TLS in force on both listeners (`None`: plain text).
#[derive(Clone, Default)]
pub struct ServingTls {
    /// The gRPC listener's.
    pub grpc: Option<Arc<LiveTls>>,
    /// The HTTP listener's.
    pub http: Option<Arc<LiveTls>>,
}

impl ServingTls {
    /// Loads what `settings` asks for and follows the files until `stop`.
    /// The calling thread waits for the reads (up to [`READ_DEADLINE`] per
    /// listener): in async code, [`ServingTls::start_off_workers`].
    pub fn start(settings: &super::TlsSettings, stop: &CancellationToken) -> Result<Self, String> {
        refuse_a_lifecycle_ca_without_grpc_tls(settings)?;
        let load = |listener: &str, tls: &Option<ListenerTls>, lifecycle| {
            tls.as_ref()
                .map(|tls| {
                    LiveTls::load(listener, tls, lifecycle)
                        .map_err(|err| format!("TLS on the {listener} listener: {err}"))
                })
                .transpose()
        };
        let grpc = load(
            "grpc",
            &settings.grpc,
            settings.lifecycle_client_ca.as_deref(),
        )?;
        let http = load("http", &settings.http, None)?;
        Ok(Self::following(grpc, http, stop))
    }

    /// [`ServingTls::start`] for async code: each listener's files are read
    /// on a thread of their own and awaited, so TLS files hanging at
    /// start-up hold no async worker (the signals that stop a start, other
    /// tasks, run meanwhile) until the start fails after [`READ_DEADLINE`].
    pub async fn start_off_workers(
        settings: &super::TlsSettings,
        stop: &CancellationToken,
    ) -> Result<Self, String> {
        refuse_a_lifecycle_ca_without_grpc_tls(settings)?;
        let on =
            |listener: &'static str| move |err| format!("TLS on the {listener} listener: {err}");
        // Both listeners at once: the start takes one read's deadline at
        // most, not one per listener.
        let grpc = async {
            match &settings.grpc {
                Some(tls) => {
                    let client_ca = settings.lifecycle_client_ca.as_deref();
                    let live = LiveTls::load_off_workers("grpc", tls, client_ca).await;
                    live.map(Some).map_err(on("grpc"))
                }
                None => Ok(None),
            }
        };
        let http = async {
            match &settings.http {
                Some(tls) => {
                    let live = LiveTls::load_off_workers("http", tls, None).await;
                    live.map(Some).map_err(on("http"))
                }
                None => Ok(None),
            }
        };
        let (grpc, http) = tokio::try_join!(grpc, http)?;
        Ok(Self::following(grpc, http, stop))
    }

    /// The listeners loaded, their files followed until `stop` (only once
    /// both loaded: a failed start leaves no follower behind).
    fn following(
        grpc: Option<Arc<LiveTls>>,
        http: Option<Arc<LiveTls>>,
        stop: &CancellationToken,
    ) -> Self {
        for live in grpc.iter().chain(http.iter()) {
            live.follow(stop.clone());
        }
        Self { grpc, http }
    }

    /// Refuses TLS in force that is not what `settings` (the serving
    /// options' TLS) asks for: a listener configured in the options but
    /// not loaded here (it would serve plain text, and a Lifecycle CA in
    /// the options drops the token fallback: calls with neither token nor
    /// certificate would pass), one loaded here but not configured, or
    /// loaded from other files (certificate, key, client CA, Lifecycle
    /// CA). `grpc::serve` and `http::serve` call it first, so a library
    /// user who builds the state by hand fails closed; `ServingTls::start`
    /// with the same settings always passes.
    pub fn check_against(&self, settings: &TlsSettings) -> Result<(), String> {
        let check = |listener: &str,
                     live: &Option<Arc<LiveTls>>,
                     wanted: &Option<ListenerTls>,
                     lifecycle_ca: Option<&std::path::Path>| {
            match (live, wanted) {
                (None, None) => Ok(()),
                (None, Some(_)) => Err(format!(
                    "TLS on the {listener} listener is configured (options.tls.{listener}) but not loaded (state.tls.{listener} is None): build the state's TLS with ServingTls::start(&options.tls, ..); refusing to serve plain text"
                )),
                (Some(_), None) => Err(format!(
                    "TLS on the {listener} listener is loaded (state.tls.{listener}) but not configured (options.tls.{listener} is None): build both from the same settings"
                )),
                (Some(live), Some(wanted)) => {
                    let files = &live.files;
                    if files.cert != wanted.cert
                        || files.key != wanted.key
                        || files.required_ca != wanted.client_ca
                        || live.lifecycle_ca.as_deref() != lifecycle_ca
                    {
                        Err(format!(
                            "TLS loaded on the {listener} listener (state.tls.{listener}) is not the one configured (options.tls): other certificate, key or client CA files; build the state's TLS with ServingTls::start(&options.tls, ..)"
                        ))
                    } else {
                        Ok(())
                    }
                }
            }
        };
        if settings.lifecycle_client_ca.is_some() && settings.grpc.is_none() {
            return Err("a Lifecycle client CA (options.tls.lifecycle_client_ca) needs TLS on the gRPC listener (options.tls.grpc)".into());
        }
        check(
            "grpc",
            &self.grpc,
            &settings.grpc,
            settings.lifecycle_client_ca.as_deref(),
        )?;
        check("http", &self.http, &settings.http, None)
    }

    /// Each TLS listener's status.
    pub fn status(&self) -> Vec<TlsStatus> {
        [&self.grpc, &self.http]
            .into_iter()
            .flatten()
            .map(|live| live.status())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;

    #[test]
    fn a_read_error_clears_once_the_same_files_are_back() {
        let ca = testkit::certs::TestCa::new("live-tls");
        let server = ca.server("localhost");
        let settings = ListenerTls {
            cert: server.cert_path.clone(),
            key: server.key_path.clone(),
            client_ca: None,
        };
        let live = LiveTls::load("grpc", &settings, None).expect("loads");
        std::fs::remove_file(&server.cert_path).expect("remove");
        live.recheck();
        assert!(live.status().error.is_some(), "a missing file is shown");
        std::fs::write(&server.cert_path, &server.cert_pem).expect("restore");
        live.recheck();
        let status = live.status();
        assert_eq!(status.error, None, "{status:?}");
        assert_eq!(status.loads, 1, "nothing changed: no reload");

        // A refused set stays shown as refused after the same blip.
        let other = ca.server("other");
        std::fs::write(&server.cert_path, &other.cert_pem).expect("mismatched key");
        live.recheck();
        let refused = live.status().error.expect("refused");
        std::fs::remove_file(&server.cert_path).expect("remove");
        live.recheck();
        std::fs::write(&server.cert_path, &other.cert_pem).expect("restore");
        live.recheck();
        assert_eq!(live.status().error.as_deref(), Some(refused.as_str()));
    }

    /// Reads of `files` whose first `hangs` calls block (as on a hung
    /// mount) until the sender is dropped (30 s at most), later ones read
    /// the files; and the count of calls.
    fn reads_hanging_first(
        files: Files,
        hangs: usize,
    ) -> (
        ReadFiles,
        Arc<std::sync::atomic::AtomicUsize>,
        std::sync::mpsc::Sender<()>,
    ) {
        use std::sync::atomic::Ordering::SeqCst;
        let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (release, hung) = std::sync::mpsc::channel::<()>();
        let hung = Mutex::new(hung);
        let counted = Arc::clone(&calls);
        let read: ReadFiles = Arc::new(move || {
            if counted.fetch_add(1, SeqCst) < hangs {
                let hung = hung.lock().unwrap_or_else(|p| p.into_inner());
                let _ = hung.recv_timeout(Duration::from_secs(30));
            }
            files.contents()
        });
        (read, calls, release)
    }

    fn settings_of(server: &testkit::certs::CertFiles) -> ListenerTls {
        ListenerTls {
            cert: server.cert_path.clone(),
            key: server.key_path.clone(),
            client_ca: None,
        }
    }

    /// A mount that hangs for good, lazily unmounted and mounted again
    /// with a renewed pair: the stuck read is given up, the files are read
    /// again on a new thread, and the renewed pair is loaded. Before: the
    /// follower waited on the stuck read for ever, the old certificate
    /// served until it expired.
    #[tokio::test]
    async fn a_hung_read_is_given_up_and_a_new_thread_loads_the_rotated_pair() {
        let ca = testkit::certs::TestCa::new("live-tls-hung-rotation");
        let server = ca.server("localhost");
        let live = LiveTls::load("grpc", &settings_of(&server), None).expect("loads");
        let rotated = ca.server("rotated");
        rotated.install_at(&server.cert_path, &server.key_path);
        let (read, calls, release) = reads_hanging_first(live.files.clone(), 1);
        let pace = Pace {
            every: Duration::from_millis(10),
            deadline: Duration::from_millis(100),
            try_again_after: Duration::from_millis(200),
        };
        let stop = CancellationToken::new();
        let following = live.follow_with(stop.clone(), pace, read);
        testkit::soon("the rotated pair loaded", async {
            while live.status().loads < 2 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
        let status = live.status();
        assert_eq!(status.error, None, "{status:?}");
        assert_eq!(status.certificate_sha256, fingerprint_of(&rotated.cert_pem));
        // The hung thread, and at least the retry that read the pair.
        assert!(calls.load(std::sync::atomic::Ordering::SeqCst) >= 2);
        stop.cancel();
        testkit::soon("the follower ends", following)
            .await
            .expect("ended");
        drop(release);
    }

    /// While a read hangs, turns start no other thread (until the wait
    /// before trying again), status says why, and the certificate in force
    /// stays.
    #[tokio::test]
    async fn a_hung_read_pins_one_thread_and_status_says_why() {
        let ca = testkit::certs::TestCa::new("live-tls-hung-one-thread");
        let server = ca.server("localhost");
        let live = LiveTls::load("grpc", &settings_of(&server), None).expect("loads");
        let (read, calls, release) = reads_hanging_first(live.files.clone(), usize::MAX);
        let pace = Pace {
            every: Duration::from_millis(10),
            deadline: Duration::from_millis(50),
            try_again_after: Duration::from_secs(3600),
        };
        let stop = CancellationToken::new();
        let following = live.follow_with(stop.clone(), pace, read);
        let error = testkit::soon("a later turn refused", async {
            loop {
                if let Some(error) = live.status().error {
                    if error.contains("are not read again yet") {
                        return error;
                    }
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
        let cert = server.cert_path.display().to_string();
        assert!(
            error.contains("grpc listener") && error.contains(&cert),
            "{error}"
        );
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert_eq!(live.status().loads, 1);
        stop.cancel();
        testkit::soon("the follower ends", following)
            .await
            .expect("ended");
        drop(release);
    }

    /// Stopped while its read hangs (within the read's deadline), the
    /// follower ends. Before: it waited on the stuck read, past shutdown.
    #[tokio::test]
    async fn stop_ends_the_follower_while_its_read_hangs() {
        let ca = testkit::certs::TestCa::new("live-tls-hung-stop");
        let server = ca.server("localhost");
        let live = LiveTls::load("grpc", &settings_of(&server), None).expect("loads");
        let (read, calls, release) = reads_hanging_first(live.files.clone(), usize::MAX);
        let pace = Pace {
            every: Duration::from_millis(10),
            deadline: Duration::from_secs(3600),
            try_again_after: Duration::from_secs(3600),
        };
        let stop = CancellationToken::new();
        let following = live.follow_with(stop.clone(), pace, read);
        testkit::soon("a read started", async {
            while calls.load(std::sync::atomic::Ordering::SeqCst) == 0 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
        stop.cancel();
        testkit::soon("the follower ends mid-read", following)
            .await
            .expect("ended");
        drop(release);
    }

    /// A hung read at start-up fails the load, naming the listener's files,
    /// instead of holding the start for ever.
    #[test]
    fn a_hung_read_at_start_up_is_given_up() {
        let ca = testkit::certs::TestCa::new("live-tls-hung-start");
        let server = ca.server("localhost");
        let settings = settings_of(&server);
        let (read, _calls, release) = reads_hanging_first(
            Files {
                cert: settings.cert.clone(),
                key: settings.key.clone(),
                required_ca: None,
                optional_ca: None,
                alpn: Vec::new(),
            },
            1,
        );
        let deadline = Duration::from_millis(50);
        let err = LiveTls::load_with("grpc", &settings, None, deadline, move |_| read())
            .err()
            .expect("given up");
        let cert = server.cert_path.display().to_string();
        assert!(
            err.contains("took longer than") && err.contains(&cert),
            "{err}"
        );
        drop(release);
    }

    /// A start-up read that hangs holds no async worker: on a
    /// current-thread runtime another task runs meanwhile (here the one
    /// that lets the read answer), and the load completes. Before: the
    /// read was waited for on the worker (`recv_timeout`), no other task
    /// ran, and the load failed at its deadline.
    #[tokio::test]
    async fn a_hung_start_up_read_leaves_the_worker_to_other_tasks() {
        let ca = testkit::certs::TestCa::new("live-tls-hung-start-async");
        let server = ca.server("localhost");
        let settings = settings_of(&server);
        let (answer, hung) = std::sync::mpsc::channel::<()>();
        let read = move |files: Files| {
            let _ = hung.recv_timeout(Duration::from_secs(30));
            files.contents()
        };
        let other_task = tokio::spawn(async move { answer.send(()).expect("the read waits") });
        let deadline = Duration::from_secs(10);
        let live = LiveTls::load_off_workers_with("grpc", &settings, None, deadline, read)
            .await
            .expect("loaded once the other task let the read answer");
        other_task.await.expect("the other task ran");
        assert_eq!(live.status().loads, 1);
        assert_eq!(
            live.status().certificate_sha256,
            fingerprint_of(&server.cert_pem)
        );
    }

    /// A start-up read awaited off the workers is given up at its deadline,
    /// naming the listener's files (paused clock: no real wait).
    #[tokio::test(start_paused = true)]
    async fn a_hung_start_up_read_off_the_workers_is_given_up() {
        let ca = testkit::certs::TestCa::new("live-tls-hung-start-given-up");
        let server = ca.server("localhost");
        let settings = settings_of(&server);
        let (release, hung) = std::sync::mpsc::channel::<()>();
        let read = move |files: Files| {
            let _ = hung.recv_timeout(Duration::from_secs(30));
            files.contents()
        };
        let err = LiveTls::load_off_workers_with("grpc", &settings, None, READ_DEADLINE, read)
            .await
            .err()
            .expect("given up");
        let cert = server.cert_path.display().to_string();
        assert!(
            err.contains("took longer than 5s") && err.contains(&cert),
            "{err}"
        );
        drop(release);
    }

    /// While 8 reads of a listener's certificate are stuck (held here by
    /// their counts), a start-up load of it starts no other read and fails
    /// at once naming the file; once they return, it loads.
    #[tokio::test]
    async fn a_start_up_read_past_the_ceiling_of_stuck_reads_is_refused_at_once() {
        let ca = testkit::certs::TestCa::new("live-tls-start-ceiling");
        let server = ca.server("localhost");
        let settings = settings_of(&server);
        let stuck: Vec<ReadAlive> = (0..super::super::follow_reads::MAX_READS_ALIVE_PER_FILE)
            .map(|_| ReadAlive::count_in(&[server.cert_path.as_path()], "stuck").expect("counted"))
            .collect();
        let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counting = |calls: &Arc<std::sync::atomic::AtomicUsize>| {
            let calls = Arc::clone(calls);
            move |files: Files| {
                calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                files.contents()
            }
        };
        let err = LiveTls::load_off_workers_with(
            "http",
            &settings,
            None,
            READ_DEADLINE,
            counting(&calls),
        )
        .await
        .err()
        .expect("refused at the ceiling");
        let cert = server.cert_path.display().to_string();
        assert!(
            err.contains(&format!("8 reads of `{cert}` have not returned")),
            "{err}"
        );
        let err = LiveTls::load_with("http", &settings, None, READ_DEADLINE, counting(&calls))
            .err()
            .expect("refused at the ceiling, blocking load too");
        assert!(err.contains("8 reads of"), "{err}");
        assert_eq!(
            calls.load(std::sync::atomic::Ordering::SeqCst),
            0,
            "no read started"
        );
        drop(stuck);
        LiveTls::load_off_workers_with("http", &settings, None, READ_DEADLINE, counting(&calls))
            .await
            .expect("loads once they returned");
    }

    /// Both listeners loaded off the workers (on a spawned task) and
    /// followed; a Lifecycle CA without TLS on gRPC refused.
    #[tokio::test]
    async fn start_off_workers_loads_both_listeners() {
        let ca = testkit::certs::TestCa::new("live-tls-start-off-workers");
        let server = ca.server("localhost");
        let listener = settings_of(&server);
        let stop = CancellationToken::new();
        let settings = TlsSettings {
            grpc: Some(listener.clone()),
            http: Some(listener.clone()),
            lifecycle_client_ca: Some(ca.ca_path.clone()),
        };
        // Spawned: the start is `Send`, as `ApiServer::bind`'s must be.
        let starting = stop.clone();
        let serving =
            tokio::spawn(async move { ServingTls::start_off_workers(&settings, &starting).await })
                .await
                .expect("ran")
                .expect("loads");
        let status = serving.status();
        assert_eq!(status.len(), 2, "{status:?}");
        assert!(serving
            .grpc
            .as_ref()
            .is_some_and(|g| g.lifecycle_ca_configured()));
        let err = ServingTls::start_off_workers(
            &TlsSettings {
                http: Some(listener),
                lifecycle_client_ca: Some(ca.ca_path.clone()),
                ..TlsSettings::default()
            },
            &stop,
        )
        .await
        .err()
        .expect("refused");
        assert!(err.contains("needs TLS on the gRPC listener"), "{err}");
        stop.cancel();
    }

    /// Unchanged files whose certificate in force has expired since: status
    /// says so, naming the file. Before: no error, nothing logged, while
    /// every handshake failed.
    #[test]
    fn a_certificate_in_force_that_expired_is_shown_in_status() {
        let ca = testkit::certs::TestCa::new("live-tls-expired-in-force");
        let server = ca.server("localhost");
        let live = LiveTls::load("grpc", &settings_of(&server), None).expect("loads");
        let not_after = live.loaded.lock().expect("lock").not_after;
        let at = |secs: i64| ASN1Time::from_timestamp(secs).expect("time");
        live.recheck_at(at(not_after));
        assert_eq!(live.status().error, None, "valid until its notAfter");
        live.recheck_at(at(not_after + 1));
        let status = live.status();
        let error = status.error.expect("expired shown");
        let cert = server.cert_path.display().to_string();
        assert!(
            error.contains("certificate in force")
                && error.contains("expired at")
                && error.contains(&cert),
            "{error}"
        );
        assert_eq!(status.loads, 1);
        // With a refused change shown too.
        std::fs::write(&server.cert_path, "not a certificate").expect("garble");
        live.recheck_at(at(not_after + 2));
        live.recheck_at(at(not_after + 3));
        let error = live.status().error.expect("refused and expired");
        assert!(
            error.contains("holds no PEM certificate") && error.contains("certificate in force"),
            "{error}"
        );
    }

    /// A Lifecycle CA rotated while the certificate in force has expired
    /// is taken: the old CA's clients are refused, the new one's verified,
    /// and status still says the certificate in force expired. Before: the
    /// build refused the expired leaf, so the old (maybe compromised) CA
    /// stayed trusted.
    #[test]
    fn a_lifecycle_ca_rotation_is_taken_while_the_certificate_in_force_is_expired() {
        use rustls::pki_types::UnixTime;
        crate::crypto::install_ring_provider();
        let ca = testkit::certs::TestCa::new("live-tls-expired-ca-rotation");
        let old_admins = testkit::certs::TestCa::new("live-tls-expired-ca-old");
        let new_admins = testkit::certs::TestCa::new("live-tls-expired-ca-new");
        let server = ca.server("localhost");
        let live =
            LiveTls::load("grpc", &settings_of(&server), Some(&old_admins.ca_path)).expect("loads");
        let not_after = live.loaded.lock().expect("lock").not_after;
        std::fs::write(&old_admins.ca_path, &new_admins.ca_pem).expect("rotate the CA");
        live.recheck_at(ASN1Time::from_timestamp(not_after + 1).expect("time"));
        let verifier = live.lifecycle_verifier().expect("a verifier");
        let verifies = |client: &testkit::certs::CertFiles| {
            let chain = CertificateDer::pem_slice_iter(client.cert_pem.as_bytes())
                .collect::<Result<Vec<_>, _>>()
                .expect("pem");
            verifier
                .verify_client_cert(&chain[0], &chain[1..], UnixTime::now())
                .is_ok()
        };
        assert!(!verifies(&old_admins.client("old-admin")), "old CA refused");
        assert!(verifies(&new_admins.client("new-admin")), "new CA taken");
        let status = live.status();
        assert_eq!(status.loads, 2, "{status:?}");
        let error = status.error.expect("expired shown");
        assert!(error.contains("certificate in force"), "{error}");
    }

    /// While the certificate in force has expired, status says so also
    /// when new files wait for their notBefore and when the files cannot
    /// be read. Before: only the reason they were refused was shown.
    #[test]
    fn an_expired_certificate_in_force_is_shown_beside_any_refusal() {
        let ca = testkit::certs::TestCa::new("live-tls-expired-beside");
        let server = ca.server("localhost");
        let live = LiveTls::load("grpc", &settings_of(&server), None).expect("loads");
        let not_after = live.loaded.lock().expect("lock").not_after;
        let at = |secs: i64| ASN1Time::from_timestamp(secs).expect("time");
        let (cert, key) = certificate_from(not_after + 1 + 3600);
        std::fs::write(&server.key_path, &key).expect("key");
        std::fs::write(&server.cert_path, &cert).expect("cert");
        live.recheck_at(at(not_after + 1));
        let error = live.status().error.expect("waiting and expired");
        assert!(
            error.contains("not valid before") && error.contains("certificate in force"),
            "{error}"
        );
        live.apply(Err("cannot read `cert.pem`".into()), at(not_after + 2));
        let error = live.status().error.expect("unread and expired");
        assert!(
            error.contains("cannot read") && error.contains("certificate in force"),
            "{error}"
        );
        assert_eq!(
            live.loaded.lock().expect("lock").expiry_warned,
            Some(not_after)
        );
    }

    #[test]
    fn the_grpc_listener_offers_only_h2() {
        let ca = testkit::certs::TestCa::new("live-tls-alpn");
        let server = ca.server("localhost");
        let settings = ListenerTls {
            cert: server.cert_path.clone(),
            key: server.key_path.clone(),
            client_ca: None,
        };
        let grpc = LiveTls::load("grpc", &settings, None).expect("grpc");
        assert_eq!(grpc.alpn_protocols(), vec![b"h2".to_vec()]);
        let http = LiveTls::load("http", &settings, None).expect("http");
        assert_eq!(
            http.alpn_protocols(),
            vec![b"h2".to_vec(), b"http/1.1".to_vec()]
        );
    }

    /// A self-signed certificate for `localhost` valid from `not_before`
    /// to `not_after` (years), PEM certificate and key.
    fn certificate_between(not_before: i32, not_after: i32) -> (String, String) {
        let key = rcgen::KeyPair::generate().expect("key");
        let mut params =
            rcgen::CertificateParams::new(vec!["localhost".to_string()]).expect("params");
        params.not_before = rcgen::date_time_ymd(not_before, 1, 1);
        params.not_after = rcgen::date_time_ymd(not_after, 1, 1);
        let certificate = params.self_signed(&key).expect("certificate");
        (certificate.pem(), key.serialize_pem())
    }

    #[test]
    fn an_expired_or_not_yet_valid_certificate_is_not_swapped_in() {
        let ca = testkit::certs::TestCa::new("live-tls-expired");
        let server = ca.server("localhost");
        let settings = ListenerTls {
            cert: server.cert_path.clone(),
            key: server.key_path.clone(),
            client_ca: None,
        };
        let live = LiveTls::load("grpc", &settings, None).expect("loads");
        let before = live.status();
        for (not_before, not_after, says) in [
            (2000, 2001, "certificate expired at"),
            (2990, 2999, "certificate not valid before"),
        ] {
            let (cert, key) = certificate_between(not_before, not_after);
            std::fs::write(&server.key_path, &key).expect("key");
            std::fs::write(&server.cert_path, &cert).expect("cert");
            live.recheck();
            let status = live.status();
            assert_eq!(status.certificate_sha256, before.certificate_sha256);
            assert_eq!(status.loads, 1, "{status:?}");
            let error = status.error.expect("refused");
            assert!(
                error.contains(says) && error.contains(&server.cert_path.display().to_string()),
                "{error}"
            );
        }
        // At start-up too, naming the listener and the file.
        let err = ServingTls::start(
            &TlsSettings {
                grpc: Some(settings),
                ..TlsSettings::default()
            },
            &CancellationToken::new(),
        )
        .err()
        .expect("refused at start");
        assert!(
            err.contains("grpc listener") && err.contains("not valid before"),
            "{err}"
        );
    }

    /// A self-signed certificate for `localhost` valid from `not_before`
    /// (Unix seconds) for a year, PEM certificate and key.
    fn certificate_from(not_before: i64) -> (String, String) {
        let key = rcgen::KeyPair::generate().expect("key");
        let mut params =
            rcgen::CertificateParams::new(vec!["localhost".to_string()]).expect("params");
        let at = |secs: i64| ASN1Time::from_timestamp(secs).expect("time").to_datetime();
        params.not_before = at(not_before);
        params.not_after = at(not_before + YEAR);
        let certificate = params.self_signed(&key).expect("certificate");
        (certificate.pem(), key.serialize_pem())
    }

    fn fingerprint_of(pem: &str) -> String {
        let chain = CertificateDer::pem_slice_iter(pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .expect("pem");
        super::super::material::fingerprint(&chain[0])
    }

    const YEAR: i64 = 365 * 24 * 3600;

    #[test]
    fn a_certificate_issued_by_a_clock_ahead_is_accepted_within_the_skew() {
        let ca = testkit::certs::TestCa::new("live-tls-skew");
        let server = ca.server("localhost");
        let settings = ListenerTls {
            cert: server.cert_path.clone(),
            key: server.key_path.clone(),
            client_ca: None,
        };
        let now = ASN1Time::now().timestamp();
        let at = |secs: i64| ASN1Time::from_timestamp(secs).expect("time");
        // At start-up: issued "now" by a clock two minutes ahead of this one.
        let (cert, key) = certificate_from(now + 120);
        std::fs::write(&server.key_path, &key).expect("key");
        std::fs::write(&server.cert_path, &cert).expect("cert");
        let live = LiveTls::load("grpc", &settings, None).expect("loads within the skew");
        assert_eq!(live.status().certificate_sha256, fingerprint_of(&cert));
        // In a rotation once the certificate in force has expired: one
        // ending a minute from now, replaced a second after it ended.
        let (expiring, key) = certificate_from(now - YEAR + 60);
        std::fs::write(&server.key_path, &key).expect("key");
        std::fs::write(&server.cert_path, &expiring).expect("cert");
        let live = LiveTls::load("grpc", &settings, None).expect("loads");
        let (cert, key) = certificate_from(now + 180);
        std::fs::write(&server.key_path, &key).expect("key");
        std::fs::write(&server.cert_path, &cert).expect("cert");
        live.recheck_at(at(now + 61));
        let status = live.status();
        assert_eq!(status.error, None, "{status:?}");
        assert_eq!(status.loads, 2, "{status:?}");
        assert_eq!(status.certificate_sha256, fingerprint_of(&cert));
    }

    /// A leaf loaded at start-up under the allowance, its notBefore still
    /// ahead: a change of the client CA alone is taken, the leaf kept.
    /// Before: rebuilt with no allowance, the unchanged leaf was refused
    /// as not valid yet.
    #[test]
    fn a_ca_rotation_keeps_the_allowance_of_the_leaf_in_force() {
        let ca = testkit::certs::TestCa::new("live-tls-ca-rotation");
        let server = ca.server("localhost");
        let settings = ListenerTls {
            cert: server.cert_path.clone(),
            key: server.key_path.clone(),
            client_ca: Some(ca.ca_path.clone()),
        };
        let now = ASN1Time::now().timestamp();
        let (cert, key) = certificate_from(now + 120);
        std::fs::write(&server.key_path, &key).expect("key");
        std::fs::write(&server.cert_path, &cert).expect("cert");
        let live = LiveTls::load("grpc", &settings, None).expect("loads within the skew");
        let other = testkit::certs::TestCa::new("live-tls-ca-rotation-new");
        std::fs::write(&ca.ca_path, &other.ca_pem).expect("client CA");
        live.recheck();
        let status = live.status();
        assert_eq!(status.error, None, "{status:?}");
        assert_eq!(status.loads, 2, "{status:?}");
        assert_eq!(status.certificate_sha256, fingerprint_of(&cert));
    }

    /// A renewed certificate not valid yet on this clock waits while the
    /// one in force is still valid: a client on this host (same clock)
    /// trusting both still completes its handshake, with the old one.
    #[tokio::test]
    async fn a_renewed_certificate_waits_for_its_not_before_while_the_old_one_serves() {
        crate::crypto::install_ring_provider();
        let ca = testkit::certs::TestCa::new("live-tls-rotation");
        let server = ca.server("localhost");
        let settings = ListenerTls {
            cert: server.cert_path.clone(),
            key: server.key_path.clone(),
            client_ca: None,
        };
        let live = LiveTls::load("grpc", &settings, None).expect("loads");
        let old = fingerprint_of(&server.cert_pem);
        let now = ASN1Time::now().timestamp();
        let (renewed, key) = certificate_from(now + 120);
        std::fs::write(&server.key_path, &key).expect("key");
        std::fs::write(&server.cert_path, &renewed).expect("cert");
        live.recheck();
        let status = live.status();
        assert_eq!(status.loads, 1, "{status:?}");
        assert_eq!(status.certificate_sha256, old);
        let mut roots = rustls::RootCertStore::empty();
        for pem in [ca.ca_pem.as_str(), renewed.as_str()] {
            for certificate in CertificateDer::pem_slice_iter(pem.as_bytes()) {
                roots.add(certificate.expect("pem")).expect("root");
            }
        }
        let client = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
        let (near, far) = tokio::io::duplex(64 * 1024);
        let acceptor = live.acceptor();
        let served = tokio::spawn(async move { acceptor.accept(far).await.map(|_| ()) });
        let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
        let connected = tokio::time::timeout(
            Duration::from_secs(10),
            tokio_rustls::TlsConnector::from(Arc::new(client)).connect(name, near),
        )
        .await
        .expect("handshake within 10 s")
        .expect("handshake with the certificate in force");
        let presented = connected.get_ref().1.peer_certificates().expect("peer")[0].clone();
        assert_eq!(super::super::material::fingerprint(&presented), old);
        drop(connected);
        let _ = tokio::time::timeout(Duration::from_secs(10), served).await;
        // Once valid on this clock, the same files are swapped in.
        live.recheck_at(ASN1Time::from_timestamp(now + 120).expect("time"));
        let status = live.status();
        assert_eq!(status.error, None, "{status:?}");
        assert_eq!(status.loads, 2, "{status:?}");
        assert_eq!(status.certificate_sha256, fingerprint_of(&renewed));
    }

    #[test]
    fn a_certificate_not_valid_yet_is_loaded_once_valid_from_the_same_files() {
        let ca = testkit::certs::TestCa::new("live-tls-not-yet");
        let server = ca.server("localhost");
        let settings = ListenerTls {
            cert: server.cert_path.clone(),
            key: server.key_path.clone(),
            client_ca: None,
        };
        let live = LiveTls::load("grpc", &settings, None).expect("loads");
        let before = live.status();
        let now = ASN1Time::now().timestamp();
        let at = |secs: i64| ASN1Time::from_timestamp(secs).expect("time");
        // Ten minutes ahead: beyond the skew allowed.
        let (cert, key) = certificate_from(now + 600);
        std::fs::write(&server.key_path, &key).expect("key");
        std::fs::write(&server.cert_path, &cert).expect("cert");
        for later in [0, 1, 2] {
            live.recheck_at(at(now + later));
            let status = live.status();
            assert_eq!(status.loads, 1, "{status:?}");
            assert_eq!(status.certificate_sha256, before.certificate_sha256);
            let error = status.error.expect("refused while not valid");
            assert!(error.contains("certificate not valid before"), "{error}");
        }
        // Time passes, the files stay as they are: loaded.
        live.recheck_at(at(now + 600));
        let status = live.status();
        assert_eq!(status.error, None, "{status:?}");
        assert_eq!(status.loads, 2, "{status:?}");
        assert_eq!(status.certificate_sha256, fingerprint_of(&cert));
        // And then taken as loaded: no rebuild every second.
        live.recheck_at(at(now + 601));
        assert_eq!(live.status().loads, 2);
    }

    #[test]
    fn an_expired_certificate_gets_no_skew_and_is_not_retried() {
        let ca = testkit::certs::TestCa::new("live-tls-expired-once");
        let server = ca.server("localhost");
        let settings = ListenerTls {
            cert: server.cert_path.clone(),
            key: server.key_path.clone(),
            client_ca: None,
        };
        let live = LiveTls::load("grpc", &settings, None).expect("loads");
        let now = ASN1Time::now().timestamp();
        // Expired a second ago.
        let (cert, key) = certificate_from(now - 365 * 24 * 3600 - 1);
        std::fs::write(&server.key_path, &key).expect("key");
        std::fs::write(&server.cert_path, &cert).expect("cert");
        live.recheck();
        let error = live.status().error.expect("expired");
        assert!(error.contains("certificate expired at"), "{error}");
        assert!(live.loaded.lock().expect("lock").waiting.is_none());
        assert_eq!(live.status().loads, 1);
    }

    #[test]
    fn the_configuration_is_built_from_the_bytes_read_not_a_second_read() {
        let ca = testkit::certs::TestCa::new("live-tls-one-read");
        let server = ca.server("localhost");
        let settings = ListenerTls {
            cert: server.cert_path.clone(),
            key: server.key_path.clone(),
            client_ca: Some(ca.ca_path.clone()),
        };
        let live = LiveTls::load("grpc", &settings, Some(&ca.ca_path)).expect("loads");
        let rotated = ca.server("rotated");
        rotated.install_at(&server.cert_path, &server.key_path);
        let contents = live.files.contents().expect("read");
        // The files caught mid-rewrite after that read.
        for path in [&server.cert_path, &server.key_path, &ca.ca_path] {
            std::fs::write(path, "-----BEGIN CERTIFICATE-----\ngarbled").expect("garble");
        }
        let built = live
            .files
            .server_config(&contents, ASN1Time::now(), NOT_BEFORE_SKEW)
            .expect("built from the read");
        let chain = CertificateDer::pem_slice_iter(rotated.cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .expect("pem");
        assert_eq!(
            built.fingerprint,
            super::super::material::fingerprint(&chain[0])
        );
        assert!(
            built.lifecycle.is_some(),
            "the Lifecycle verifier from the read too"
        );
    }

    fn loaded(settings: &TlsSettings) -> ServingTls {
        ServingTls::start(settings, &CancellationToken::new()).expect("loads")
    }

    #[tokio::test]
    async fn tls_in_force_must_be_what_the_options_configure() {
        let ca = testkit::certs::TestCa::new("live-tls-check");
        let server = ca.server("localhost");
        let listener = ListenerTls {
            cert: server.cert_path.clone(),
            key: server.key_path.clone(),
            client_ca: None,
        };
        let grpc_with_ca = TlsSettings {
            grpc: Some(listener.clone()),
            http: None,
            lifecycle_client_ca: Some(ca.ca_path.clone()),
        };
        let http_only = TlsSettings {
            http: Some(listener.clone()),
            ..TlsSettings::default()
        };
        let none = ServingTls::default();
        // Configured, not loaded: plain text with the token fallback gone.
        let err = none
            .check_against(&grpc_with_ca)
            .expect_err("grpc not loaded");
        assert!(
            err.contains("grpc listener") && err.contains("not loaded"),
            "{err}"
        );
        let err = none.check_against(&http_only).expect_err("http not loaded");
        assert!(
            err.contains("http listener") && err.contains("not loaded"),
            "{err}"
        );
        none.check_against(&TlsSettings::default())
            .expect("plain text both");
        // Loaded as configured.
        let both = loaded(&grpc_with_ca);
        both.check_against(&grpc_with_ca).expect("as configured");
        loaded(&http_only)
            .check_against(&http_only)
            .expect("as configured");
        // Loaded, not configured; or loaded without the Lifecycle CA.
        assert!(both.check_against(&TlsSettings::default()).is_err());
        let without_ca = loaded(&TlsSettings {
            lifecycle_client_ca: None,
            ..grpc_with_ca.clone()
        });
        assert!(without_ca.check_against(&grpc_with_ca).is_err());
        // Loaded without mutual TLS the options ask for.
        let mutual = TlsSettings {
            http: Some(ListenerTls {
                client_ca: Some(ca.ca_path.clone()),
                ..listener
            }),
            ..TlsSettings::default()
        };
        assert!(loaded(&http_only).check_against(&mutual).is_err());
        // A Lifecycle CA without TLS on gRPC.
        let ca_only = TlsSettings {
            lifecycle_client_ca: Some(ca.ca_path.clone()),
            ..TlsSettings::default()
        };
        assert!(none.check_against(&ca_only).is_err());
    }
}
