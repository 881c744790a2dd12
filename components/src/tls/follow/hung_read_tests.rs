//! A followed file whose read hangs (a FIFO with no writer stands for a
//! file on a hung NFS or FUSE mount): the read is given up at the
//! deadline with one warning, the turns go on without starting another
//! read while it has not returned, the material in force stays, and once
//! the mount answers again with rotated files they are taken up.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Mutex;

use rewire_runtime::FileReadError;
use testkit::certs::TestCa;

use super::*;
use crate::tls::read_within::tests::fifo;
use crate::tls::PemSource;

/// Reads started by [`counted_plain_read`].
static STARTED: AtomicUsize = AtomicUsize::new(0);
/// Of those, the ones that have not returned.
static OUTSTANDING: AtomicUsize = AtomicUsize::new(0);
/// The most that had not returned at once.
static MOST_AT_ONCE: AtomicUsize = AtomicUsize::new(0);

/// A plain read, blocking (a FIFO with no writer: until one comes; the
/// real read refuses a FIFO at once), counted.
fn counted_plain_read(path: &Path) -> Result<Vec<u8>, FileReadError> {
    STARTED.fetch_add(1, SeqCst);
    let now = OUTSTANDING.fetch_add(1, SeqCst) + 1;
    MOST_AT_ONCE.fetch_max(now, SeqCst);
    let read = std::fs::read(path).map_err(|source| FileReadError::Io {
        path: path.display().to_string(),
        source,
    });
    OUTSTANDING.fetch_sub(1, SeqCst);
    read
}

/// Waits (10 s at most) until `done`.
async fn until(what: &str, mut done: impl FnMut() -> bool) {
    testkit::soon(what, async {
        while !done() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
}

#[tokio::test]
async fn a_hung_file_is_given_up_once_not_read_again_while_it_hangs_and_a_later_rotation_is_taken_up(
) {
    let (ca, rotated) = (TestCa::new("follow-hung"), TestCa::new("follow-rotated"));
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("ca.pem");
    std::fs::write(&path, &ca.ca_pem).expect("write the CA");
    let fields = ClientTlsFields {
        ca_cert: Some(PemSource::File(path.clone())),
        ..ClientTlsFields::default()
    };
    let in_force = fields.load().expect("material");
    // The mount hangs: a read of the file does not return.
    std::fs::remove_file(&path).expect("remove the CA");
    fifo(&dir, "ca.pem");
    let applied = Arc::new(Mutex::new(Vec::<ClientTls>::new()));
    let followed = FieldFiles {
        fields: fields.clone(),
        in_force,
        apply: {
            let applied = applied.clone();
            move |material: ClientTls| {
                applied
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(material);
                async { Ok(()) }
            }
        },
        deadline: Duration::from_millis(200),
        read: counted_plain_read,
    };
    let stop = CancellationToken::new();
    let counts = follow_field_files("custom/follower".into(), "Test", stop.clone(), followed);

    // Given up at the deadline; the turns go on, refused at once.
    until("turns while the file hangs", || counts.turns() >= 4).await;
    assert_eq!(STARTED.load(SeqCst), 1, "reads started while it hangs");
    assert_eq!(OUTSTANDING.load(SeqCst), 1, "the hung read returned");
    assert_eq!(counts.warnings(), 1, "one warning for the hang");
    assert_eq!(counts.attempts(), 0, "the material in force is kept");

    // The mount answers again, with rotated files: the hung read returns
    // (its writer comes and goes) after the file is replaced.
    let next = dir.path().join("ca.pem.next");
    std::fs::write(&next, &rotated.ca_pem).expect("write the rotated CA");
    let (fifo_path, next_path) = (path.clone(), next.clone());
    let replaced = tokio::task::spawn_blocking(move || -> std::io::Result<()> {
        // Opened at once: the hung read has the FIFO open for reading.
        let writer = std::fs::OpenOptions::new().write(true).open(&fifo_path)?;
        std::fs::rename(&next_path, &fifo_path)?;
        drop(writer);
        Ok(())
    });
    let replaced = testkit::soon("the FIFO replaced", replaced).await;
    replaced.expect("joined").expect("replaced");
    let rotated_material = fields.load().expect("rotated material");
    let taken = || {
        let applied = applied.lock().unwrap_or_else(|p| p.into_inner());
        applied.contains(&rotated_material)
    };
    until("the rotated CA taken up", taken).await;
    assert_eq!(MOST_AT_ONCE.load(SeqCst), 1, "reads outstanding at once");
    assert_eq!(OUTSTANDING.load(SeqCst), 0);
    assert_eq!(counts.warnings(), 1);
    stop.cancel();
}

/// Replaces the FIFO at `fifo`, whose read hangs, with a regular file
/// holding `content`; the hung read returns (its writer comes and goes).
async fn answer_again(fifo: &Path, content: &str) {
    let (fifo, content) = (fifo.to_path_buf(), content.to_owned());
    let replaced = tokio::task::spawn_blocking(move || -> std::io::Result<()> {
        let next = fifo.with_extension("next");
        std::fs::write(&next, content)?;
        // Opened at once: the hung read has the FIFO open for reading.
        let writer = std::fs::OpenOptions::new().write(true).open(&fifo)?;
        std::fs::rename(&next, &fifo)?;
        drop(writer);
        Ok(())
    });
    let replaced = testkit::soon("the FIFO replaced", replaced).await;
    replaced.expect("joined").expect("replaced");
}

/// `caCert` hangs (one warning), answers again, then `clientKey` hangs:
/// a hang of another file is warned about too.
#[tokio::test]
async fn a_hang_of_another_file_is_warned_about_too() {
    let ca = TestCa::new("follow-hung-other");
    let client = ca.client("app");
    let dir = tempfile::tempdir().expect("temp dir");
    let (ca_path, cert, key) = (
        dir.path().join("ca.pem"),
        dir.path().join("client.crt"),
        dir.path().join("client.key"),
    );
    std::fs::write(&ca_path, &ca.ca_pem).expect("write the CA");
    client.install_at(&cert, &key);
    let fields = ClientTlsFields {
        ca_cert: Some(PemSource::File(ca_path.clone())),
        client_cert: Some(PemSource::File(cert)),
        client_key: Some(PemSource::File(key.clone())),
        insecure_skip_verify: false,
    };
    let in_force = fields.load().expect("material");
    std::fs::remove_file(&ca_path).expect("remove the CA");
    fifo(&dir, "ca.pem");
    let followed = FieldFiles {
        fields,
        in_force,
        apply: |_: ClientTls| async { Ok(()) },
        deadline: Duration::from_millis(200),
        read: crate::tls::read_within::tests::plain_read,
    };
    let stop = CancellationToken::new();
    let counts = follow_field_files("custom/hung-other".into(), "Test", stop.clone(), followed);
    until("the caCert hang warned about", || counts.warnings() >= 1).await;

    // clientKey's mount hangs, then caCert's answers again.
    std::fs::remove_file(&key).expect("remove the key");
    fifo(&dir, "client.key");
    answer_again(&ca_path, &ca.ca_pem).await;
    until("the clientKey hang warned about", || counts.warnings() >= 2).await;
    let turns = counts.turns();
    until("turns while clientKey hangs", || {
        counts.turns() >= turns + 2
    })
    .await;
    assert_eq!(counts.warnings(), 2, "one warning per hung file");
    assert_eq!(counts.attempts(), 0, "the material in force is kept");
    stop.cancel();
    answer_again(&key, &client.key_pem).await;
}
