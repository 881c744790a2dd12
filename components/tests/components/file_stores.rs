//! The file stores (`local`, `memory`): put / get / stat / list / delete,
//! names confined to the store, and a 100 MB file streamed through within
//! the size bound, never read whole.

use crate::common;

use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use rewire_components::file_store::memory::ENTRY_OVERHEAD;
use rewire_runtime::{FileError, FileStore, Instance, ListRequest, PutFileRequest};
use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncReadExt, ReadBuf};

async fn store(type_name: &str, metadata: Value) -> Arc<dyn FileStore> {
    match common::start("file", type_name, metadata).await {
        Ok(Instance::File(store)) => store,
        Ok(other) => panic!("expected a file store, got {other:?}"),
        Err(e) => panic!("{e}"),
    }
}

fn put(name: &str, body: &'static [u8]) -> PutFileRequest {
    PutFileRequest {
        name: name.into(),
        body: Box::pin(body),
        metadata: Default::default(),
    }
}

async fn read_all(store: &dyn FileStore, name: &str) -> Result<Vec<u8>, FileError> {
    let mut read = store.get(name).await?;
    let mut data = Vec::new();
    read.body.read_to_end(&mut data).await.unwrap();
    Ok(data)
}

fn names(page: &rewire_runtime::ListPage) -> Vec<&str> {
    page.files.iter().map(|f| f.name.as_str()).collect()
}

async fn round_trip(store: Arc<dyn FileStore>) {
    for name in ["a/1.txt", "a/2.txt", "a/3.txt", "b.txt", "a/deep/4.txt"] {
        let info = store.put(put(name, b"hello")).await.unwrap();
        assert_eq!((info.name.as_str(), info.size), (name, 5));
    }
    store.put(put("b.txt", b"replaced")).await.unwrap();
    assert_eq!(read_all(&*store, "b.txt").await.unwrap(), b"replaced");
    assert_eq!(store.stat("a/1.txt").await.unwrap().size, 5);

    let list = |prefix: &str, marker: Option<&str>| ListRequest {
        prefix: prefix.into(),
        marker: marker.map(Into::into),
        max_keys: 2,
    };
    let first = store.list(list("a/", None)).await.unwrap();
    assert_eq!(names(&first), ["a/1.txt", "a/2.txt"]);
    let second = store
        .list(list("a/", first.marker.as_deref()))
        .await
        .unwrap();
    assert_eq!(names(&second), ["a/3.txt", "a/deep/4.txt"]);
    assert_eq!(second.marker, None);
    let after = store.list(list("a/", Some("a/deep/4.txt"))).await.unwrap();
    assert!(after.files.is_empty() && after.marker.is_none());

    store.delete("a/2.txt").await.unwrap();
    assert_eq!(
        store.stat("a/2.txt").await,
        Err(FileError::NotFound("a/2.txt".into()))
    );
    assert!(matches!(
        store.get("a/2.txt").await,
        Err(FileError::NotFound(_))
    ));
    assert!(matches!(
        store.delete("a/2.txt").await,
        Err(FileError::NotFound(_))
    ));
    for bad in ["../escape", "/etc/passwd", "a/../../x", "a//b", "a\0b"] {
        assert!(
            matches!(store.put(put(bad, b"x")).await, Err(FileError::Invalid(_))),
            "{bad:?}"
        );
        assert!(
            matches!(store.get(bad).await, Err(FileError::Invalid(_))),
            "{bad:?}"
        );
    }
}

#[tokio::test]
async fn local_and_memory_put_get_list_stat_delete() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("files").display().to_string();
    round_trip(store("local", json!({ "root": root })).await).await;
    round_trip(store("memory", json!({})).await).await;
    // Nothing escaped the root; no temporary file is left behind.
    let outside: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert_eq!(outside.len(), 1);
    let leftovers = walk(&dir.path().join("files"));
    assert!(
        leftovers.iter().all(|p| !p.contains(".rewire-tmp-")),
        "{leftovers:?}"
    );
}

fn walk(dir: &std::path::Path) -> Vec<String> {
    let mut all = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            all.extend(walk(&path));
        } else {
            all.push(path.display().to_string());
        }
    }
    all
}

#[cfg(unix)]
#[tokio::test]
async fn symbolic_links_out_of_the_root_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("files");
    let outside = dir.path().join("outside");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("secret"), "s3cret").unwrap();
    std::os::unix::fs::symlink(&outside, root.join("out")).unwrap();
    std::os::unix::fs::symlink(outside.join("secret"), root.join("link")).unwrap();
    let store = store("local", json!({ "root": root.display().to_string() })).await;
    for name in ["out/secret", "link"] {
        assert!(
            matches!(store.get(name).await, Err(FileError::Invalid(_))),
            "{name}"
        );
        assert!(
            matches!(store.stat(name).await, Err(FileError::Invalid(_))),
            "{name}"
        );
        assert!(
            matches!(store.delete(name).await, Err(FileError::Invalid(_))),
            "{name}"
        );
    }
    assert!(matches!(
        store.put(put("out/new", b"x")).await,
        Err(FileError::Invalid(_))
    ));
    assert!(matches!(
        store.put(put("link", b"x")).await,
        Err(FileError::Invalid(_))
    ));
    let listed = store.list(ListRequest::default()).await.unwrap();
    assert!(listed.files.is_empty(), "{:?}", listed.files);
    assert_eq!(
        std::fs::read_to_string(outside.join("secret")).unwrap(),
        "s3cret"
    );
    assert!(!outside.join("new").exists());
}

/// What `outside` holds besides its `secret.txt` (as `OUTSIDE` has it),
/// put back as it was.
#[cfg(unix)]
fn outside_changes(outside: &std::path::Path, content: &[u8]) -> Option<String> {
    let mut changes = Vec::new();
    for entry in std::fs::read_dir(outside).unwrap() {
        let entry = entry.unwrap();
        if entry.file_name() != "secret.txt" {
            changes.push(format!("{:?} appeared", entry.file_name()));
            let _ = std::fs::remove_file(entry.path());
        }
    }
    match std::fs::read(outside.join("secret.txt")) {
        Ok(read) if read == content => {}
        Ok(read) => changes.push(format!(
            "secret.txt holds {:?}",
            String::from_utf8_lossy(&read)
        )),
        Err(err) => changes.push(format!("secret.txt: {err}")),
    }
    if changes.is_empty() {
        return None;
    }
    std::fs::write(outside.join("secret.txt"), content).unwrap();
    Some(changes.join(", "))
}

/// A process that can write in the root swaps folder `a` for a symbolic
/// link out of the root and back, as fast as it can, while the store
/// puts, gets, stats and deletes `a/secret.txt` thousands of times: no
/// operation ever reaches the `secret.txt` outside (names are resolved
/// from a handle on the root, the final part beneath a handle on its
/// folder, never by walking the path again after checking it).
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_folder_swapped_for_a_symbolic_link_midway_never_leads_out_of_the_root() {
    use std::sync::atomic::AtomicBool;
    const OUTSIDE: &[u8] = b"the secret outside the root";
    const WRITTEN: &[u8] = b"put through the store";
    const ROUNDS: usize = 2_000;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("files");
    let outside = dir.path().join("outside");
    std::fs::create_dir_all(root.join("a")).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("secret.txt"), OUTSIDE).unwrap();
    let store = store("local", json!({ "root": root.display().to_string() })).await;

    let stop = Arc::new(AtomicBool::new(false));
    let swaps = Arc::new(AtomicUsize::new(0));
    let swapper = {
        let (stop, swaps) = (Arc::clone(&stop), Arc::clone(&swaps));
        let (a, moved, outside) = (root.join("a"), root.join("a.d"), outside.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if std::fs::rename(&a, &moved).is_err() {
                    let _ = std::fs::create_dir(&a);
                    continue;
                }
                let _ = std::os::unix::fs::symlink(&outside, &a);
                let _ = std::fs::remove_file(&a);
                if std::fs::rename(&moved, &a).is_err() {
                    // A put made `a` again meanwhile: that one stays.
                    let _ = std::fs::remove_dir_all(&moved);
                }
                swaps.fetch_add(1, Ordering::Relaxed);
            }
        })
    };

    let name = "a/secret.txt";
    let rounds = async {
        let mut escapes = Vec::new();
        // The operations that worked: the store was really used, not
        // merely refused every time.
        let (mut puts, mut reads) = (0, 0);
        for round in 0..ROUNDS {
            if store.put(put(name, WRITTEN)).await.is_ok() {
                puts += 1;
            }
            if let Some(changes) = outside_changes(&outside, OUTSIDE) {
                escapes.push(format!(
                    "round {round}: a put changed the folder outside: {changes}"
                ));
            }
            if let Ok(read) = read_all(&*store, name).await {
                if read == WRITTEN {
                    reads += 1;
                }
                if read == OUTSIDE {
                    escapes.push(format!("round {round}: a get read the file outside"));
                }
            }
            if let Ok(info) = store.stat(name).await {
                if info.size == OUTSIDE.len() as u64 {
                    escapes.push(format!("round {round}: a stat answered the file outside"));
                }
            }
            let _ = store.delete(name).await;
            if let Some(changes) = outside_changes(&outside, OUTSIDE) {
                escapes.push(format!(
                    "round {round}: a delete changed the folder outside: {changes}"
                ));
            }
        }
        (escapes, puts, reads)
    };
    let escapes = tokio::time::timeout(std::time::Duration::from_secs(60), rounds).await;
    stop.store(true, Ordering::Relaxed);
    swapper.join().unwrap();
    let (escapes, puts, reads) = escapes.expect("the rounds did not end within 60 s");
    let swaps = swaps.load(Ordering::Relaxed);
    assert!(swaps > 100, "the folder was swapped only {swaps} times");
    assert!(
        puts > 0 && reads > 0,
        "of {ROUNDS} rounds, {puts} puts and {reads} reads of what was put worked"
    );
    assert!(
        escapes.is_empty(),
        "{} escapes in {ROUNDS} rounds ({swaps} swaps): {escapes:#?}",
        escapes.len()
    );
}

/// A body of `len` bytes made up as it is read (never held), recording the
/// largest read it was asked for.
struct Generated {
    len: u64,
    sent: u64,
    largest_read: Arc<AtomicUsize>,
}

fn byte_at(offset: u64) -> u8 {
    (offset.wrapping_mul(2_654_435_761) >> 13) as u8
}

impl AsyncRead for Generated {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        self.largest_read
            .fetch_max(buf.remaining(), Ordering::Relaxed);
        let n = (self.len - self.sent).min(buf.remaining() as u64);
        let start = self.sent;
        let bytes: Vec<u8> = (start..start + n).map(byte_at).collect();
        buf.put_slice(&bytes);
        self.sent += n;
        Poll::Ready(Ok(()))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_100_mb_file_streams_through_within_the_bound() {
    const SIZE: u64 = 100 * 1024 * 1024;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("files");
    let metadata = json!({ "root": root.display().to_string(), "maxFileSize": SIZE });
    let store = store("local", metadata).await;
    let largest_read = Arc::new(AtomicUsize::new(0));
    let body = |len| Generated {
        len,
        sent: 0,
        largest_read: largest_read.clone(),
    };
    let request = |len| PutFileRequest {
        name: "big/file.bin".into(),
        body: Box::pin(body(len)),
        metadata: Default::default(),
    };
    assert_eq!(store.put(request(SIZE)).await.unwrap().size, SIZE);
    // The store pulled the body in chunks, never all of it at once.
    let largest = largest_read.load(Ordering::Relaxed);
    assert!(largest <= 1024 * 1024, "asked for {largest} bytes at once");

    // Read back through a 64 KiB buffer, checked as it comes.
    let mut read = store.get("big/file.bin").await.unwrap();
    assert_eq!(read.info.size, SIZE);
    let mut chunk = vec![0u8; 64 * 1024];
    let mut offset: u64 = 0;
    loop {
        let n = read.body.read(&mut chunk).await.unwrap();
        if n == 0 {
            break;
        }
        for (i, byte) in chunk[..n].iter().enumerate() {
            assert_eq!(
                *byte,
                byte_at(offset + i as u64),
                "byte {}",
                offset + i as u64
            );
        }
        offset += n as u64;
    }
    assert_eq!(offset, SIZE);

    // One byte over the bound: refused, the old file kept, nothing left over.
    let refused = store.put(request(SIZE + 1)).await;
    assert!(
        matches!(refused, Err(FileError::TooLarge { limit: SIZE, .. })),
        "{refused:?}"
    );
    assert_eq!(store.stat("big/file.bin").await.unwrap().size, SIZE);
    assert_eq!(walk(&root).len(), 1);
}

#[tokio::test]
async fn the_memory_store_bounds_each_file_and_the_total() {
    // Room for 6 bytes of contents besides two one-letter files' entries.
    const TOTAL: u64 = 6 + 2 * (1 + ENTRY_OVERHEAD);
    let store = store("memory", json!({"maxFileSize": 4, "maxTotalSize": TOTAL})).await;
    store.put(put("a", b"1234")).await.unwrap();
    assert!(matches!(
        store.put(put("b", b"12345")).await,
        Err(FileError::TooLarge { limit: 4, .. })
    ));
    assert!(matches!(
        store.put(put("b", b"123")).await,
        Err(FileError::TooLarge { limit: TOTAL, .. })
    ));
    store.put(put("a", b"12")).await.unwrap();
    store.put(put("b", b"1234")).await.unwrap();
    let err = common::start("file", "memory", json!({"maxFileSize": 0}))
        .await
        .unwrap_err();
    assert!(err.contains("maxFileSize"), "{err}");
    let err = common::start("file", "local", json!({})).await.unwrap_err();
    assert!(err.contains("root"), "{err}");
}

/// A body read from `inner`, counting the bytes read.
struct Counting<R> {
    inner: R,
    read: Arc<AtomicUsize>,
}

impl<R: AsyncRead + Unpin> AsyncRead for Counting<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        let read = buf.filled().len() - before;
        self.read.fetch_add(read, Ordering::AcqRel);
        polled
    }
}

/// A put whose body is the read end of a pipe (kept open by its writer),
/// and the count of bytes it has read.
fn piped_put(
    store: &Arc<dyn FileStore>,
    name: &str,
) -> (
    tokio::io::DuplexStream,
    Arc<AtomicUsize>,
    tokio::task::JoinHandle<Result<rewire_runtime::FileInfo, FileError>>,
) {
    let (writer, reader) = tokio::io::duplex(64 * 1024);
    let read = Arc::new(AtomicUsize::new(0));
    let body = Counting {
        inner: reader,
        read: Arc::clone(&read),
    };
    let request = PutFileRequest {
        name: name.into(),
        body: Box::pin(body),
        metadata: Default::default(),
    };
    let store = Arc::clone(store);
    let put = tokio::spawn(async move { store.put(request).await });
    (writer, read, put)
}

/// Yields (on this single-threaded runtime) until `read` counts `bytes`:
/// the put that read them has then taken them too.
async fn until_read(read: &AtomicUsize, bytes: usize) {
    while read.load(Ordering::Acquire) < bytes {
        tokio::task::yield_now().await;
    }
    tokio::task::yield_now().await;
}

#[tokio::test]
async fn memory_puts_being_read_count_against_the_total() {
    use tokio::io::AsyncWriteExt;
    // Room for 150 bytes of contents besides the entries of `first` and
    // `third` (each put reserves its entry before it reads).
    const TOTAL: u64 = 150 + 2 * ENTRY_OVERHEAD + 5 + 5;
    let store = store("memory", json!({"maxFileSize": 100, "maxTotalSize": TOTAL})).await;
    // A put that has read 80 bytes and waits for more.
    let (mut writer, read, first) = piped_put(&store, "first");
    writer.write_all(&[1; 80]).await.unwrap();
    until_read(&read, 80).await;
    // A second put of 80 would hold 160 with it: refused as it reads.
    let second = store.put(put("second", &[2; 80])).await;
    assert!(
        matches!(second, Err(FileError::TooLarge { limit: TOTAL, .. })),
        "{second:?}"
    );
    drop(writer);
    assert_eq!(first.await.unwrap().unwrap().size, 80);
    // What a put holds is let go of once it ends, stored or refused.
    store.put(put("third", &[3; 70])).await.unwrap();
    // A put replacing a file counts on its bytes coming free.
    store.put(put("first", &[4; 80])).await.unwrap();
    // A delete makes room for `fifth`'s 70 bytes; a put of 71 (under a
    // longer name) is refused as it reads, and lets go of what it read.
    store.delete("third").await.unwrap();
    let (mut writer, read, refused) = piped_put(&store, "fourth");
    writer.write_all(&[5; 60]).await.unwrap();
    until_read(&read, 60).await;
    writer.write_all(&[5; 11]).await.unwrap();
    drop(writer);
    assert!(matches!(
        refused.await.unwrap(),
        Err(FileError::TooLarge { limit: TOTAL, .. })
    ));
    store.put(put("fifth", &[6; 70])).await.unwrap();
}

#[tokio::test]
async fn the_memory_store_counts_each_files_name_and_entry_so_empty_files_are_bounded() {
    // A client putting empty files under new 1,000-byte names in a loop:
    // each counts its name and entry, so the total bounds their number.
    const TOTAL: u64 = 1 << 20;
    let store = store("memory", json!({ "maxTotalSize": TOTAL })).await;
    let name = |i: usize| {
        let filler = |c: &str| c.repeat(249);
        format!("{i:0>250}/{}/{}/{}", filler("b"), filler("c"), filler("d"))
    };
    assert_eq!(name(0).len(), 1_000);
    let mut stored = 0;
    let refused = loop {
        assert!(
            stored < 2_000,
            "2,000 empty files with 1,000-byte names all stored in 1 MiB"
        );
        match store.put(put(&name(stored), b"")).await {
            Ok(info) => {
                assert_eq!(info.size, 0);
                stored += 1;
            }
            Err(refused) => break refused,
        }
    };
    assert!(
        matches!(refused, FileError::TooLarge { limit: TOTAL, .. }),
        "{refused:?}"
    );
    assert_eq!(stored as u64, TOTAL / (1_000 + ENTRY_OVERHEAD));
    // A delete makes room again.
    store.delete(&name(0)).await.unwrap();
    store.put(put(&name(stored), b"")).await.unwrap();
}

fn temp_files(root: &std::path::Path) -> Vec<String> {
    walk(root)
        .into_iter()
        .filter(|path| path.contains(".rewire-tmp-"))
        .collect()
}

#[tokio::test]
async fn a_local_put_abandoned_midway_leaves_no_temporary_file() {
    use tokio::io::AsyncWriteExt;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("files");
    let store = store("local", json!({ "root": root.display().to_string() })).await;
    let (mut writer, read, put) = piped_put(&store, "docs/abandoned.bin");
    writer.write_all(&[7; 1000]).await.unwrap();
    until_read(&read, 1000).await;
    assert_eq!(temp_files(&root).len(), 1, "the put is writing");
    // The caller goes away (a deadline, a reset stream): the put is dropped.
    put.abort();
    assert!(put.await.unwrap_err().is_cancelled());
    // Removed off the runtime: soon.
    until_gone(&root).await;
    assert!(!root.join("docs/abandoned.bin").exists());
}

/// Waits until no temporary file is left under `root` (failing after 10 s).
async fn until_gone(root: &std::path::Path) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !temp_files(root).is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "{:?} still there",
            temp_files(root)
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// This host's tag in temporary names, read from a put being written (on
/// a root of its own).
async fn host_tag() -> String {
    use tokio::io::AsyncWriteExt;
    let dir = tempfile::tempdir().unwrap();
    let store = store("local", json!({ "root": dir.path().display().to_string() })).await;
    let (mut writer, read, put) = piped_put(&store, "probe");
    writer.write_all(&[1; 10]).await.unwrap();
    until_read(&read, 10).await;
    let name = temp_files(dir.path()).pop().expect("a temporary file");
    put.abort();
    let name = name.rsplit('/').next().unwrap();
    let tag = name.strip_prefix(".rewire-tmp-").unwrap().split('-').next();
    tag.unwrap().to_string()
}

async fn until_missing(path: &std::path::Path) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while path.exists() {
        assert!(std::time::Instant::now() < deadline, "{path:?} not swept");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn init_removes_the_temporary_files_of_dead_puts_only() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("files");
    std::fs::create_dir_all(root.join("deep")).unwrap();
    let ours = std::process::id();
    let tag = host_tag().await;
    // This host's, its process gone (no such pid on Linux).
    let gone = root.join(format!(".rewire-tmp-{tag}-999999999-0"));
    // This host's, this process's, untouched for an hour.
    let old = root.join(format!("deep/.rewire-tmp-{tag}-{ours}-900"));
    // This host's, being written (as by another instance on the root).
    let live = root.join(format!(".rewire-tmp-{tag}-{ours}-901"));
    // Another host's (a root shared over a network volume): its pid means
    // nothing here, so only age counts.
    let foreign = root.join(".rewire-tmp-0123456789abcdef-999999999-0");
    let foreign_old = root.join("deep/.rewire-tmp-0123456789abcdef-999999999-1");
    for path in [&gone, &old, &live, &foreign, &foreign_old] {
        std::fs::write(path, b"partial").unwrap();
    }
    let hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
    for path in [&old, &foreign_old] {
        std::fs::File::options()
            .write(true)
            .open(path)
            .unwrap()
            .set_modified(hour_ago)
            .unwrap();
    }
    let _store = store("local", json!({ "root": root.display().to_string() })).await;
    // The sweep runs in the background, the root's files before `deep`'s:
    // once those are gone every file was judged.
    until_missing(&old).await;
    until_missing(&foreign_old).await;
    if cfg!(target_os = "linux") {
        assert!(!gone.exists(), "its process is gone");
    }
    assert!(live.exists(), "a live process's recent file is kept");
    assert!(foreign.exists(), "another host's recent file is kept");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_local_put_answers_the_size_it_wrote_under_concurrent_puts_of_the_name() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("files");
    let store = store("local", json!({ "root": root.display().to_string() })).await;
    // Four writers of one name, each its own size: every answer is the
    // writer's own size, never another's that renamed over it since.
    let writers: Vec<_> = (1..=4usize)
        .map(|writer| {
            let store = Arc::clone(&store);
            tokio::spawn(async move {
                let body: &'static [u8] = Box::leak(vec![b'x'; writer].into_boxed_slice());
                let mut wrong = Vec::new();
                for _ in 0..150 {
                    let info = store.put(put("shared.bin", body)).await.unwrap();
                    if info.size != writer as u64 {
                        wrong.push(info.size);
                    }
                }
                wrong
            })
        })
        .collect();
    for (writer, answers) in writers.into_iter().enumerate() {
        let wrong = answers.await.unwrap();
        assert!(
            wrong.is_empty(),
            "writer {} was answered {wrong:?}",
            writer + 1
        );
    }
}

/// What each operation answers on names where a file and a folder meet.
async fn file_and_folder_clashes(store: Arc<dyn FileStore>) -> Vec<String> {
    let mut answers = Vec::new();
    store.put(put("a", b"file")).await.unwrap();
    store.put(put("c/d", b"file")).await.unwrap();
    answers.push(format!("{:?}", store.put(put("a/b", b"x")).await));
    answers.push(format!("{:?}", store.put(put("a/b/c", b"x")).await));
    answers.push(format!("{:?}", store.put(put("c", b"x")).await));
    answers.push(format!("{:?}", store.stat("a/b").await));
    answers.push(format!("{:?}", store.get("a/b").await.map(|_| ())));
    answers.push(format!("{:?}", store.delete("a/b").await));
    answers.push(format!("{:?}", store.stat("c").await));
    answers.push(format!("{:?}", store.delete("c").await));
    // Nothing was stored by the refused puts; the others are intact.
    let all = store.list(ListRequest::default()).await.unwrap();
    answers.push(format!("{:?}", names(&all)));
    assert_eq!(read_all(&*store, "a").await.unwrap(), b"file");
    assert_eq!(read_all(&*store, "c/d").await.unwrap(), b"file");
    answers
}

#[tokio::test]
async fn memory_refuses_a_file_and_a_folder_of_one_name_as_local_does() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("files").display().to_string();
    let local = file_and_folder_clashes(store("local", json!({ "root": root })).await).await;
    let memory = file_and_folder_clashes(store("memory", json!({})).await).await;
    // A folder's stat (6th) differs in size and time; the rest as one.
    let but_the_folder_stat = |answers: &[String]| {
        let mut answers = answers.to_vec();
        answers.remove(6);
        answers
    };
    assert_eq!(but_the_folder_stat(&memory), but_the_folder_stat(&local));
    for stat in [&local[6], &memory[6]] {
        assert!(stat.starts_with("Ok(FileInfo { name: \"c\""), "{stat}");
        assert!(stat.contains(r#""IsDir": "true""#), "{stat}");
    }
    let refused = |name: &str, why: &str| {
        format!(
            "{:?}",
            Err::<(), _>(FileError::Invalid(format!("file name `{name}`: {why}")))
        )
    };
    assert_eq!(local[0], refused("a/b", "passes through a file"));
    assert_eq!(local[1], refused("a/b/c", "passes through a file"));
    assert_eq!(local[2], refused("c", "is not a regular file"));
}

/// Waits until the file at `path` holds `bytes` bytes (the put's write
/// of them is done: its time is not changed by it any more).
async fn until_size(path: &std::path::Path, bytes: u64) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::fs::metadata(path).map(|m| m.len()).unwrap_or(0) < bytes {
        assert!(std::time::Instant::now() < deadline, "{path:?} not written");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reloads_sweep_keeps_a_stalled_put_of_this_process() {
    use tokio::io::AsyncWriteExt;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("files");
    std::fs::create_dir_all(root.join("deep")).unwrap();
    let metadata = json!({ "root": root.display().to_string() });
    let first = store("local", metadata.clone()).await;
    // A put whose client stalls mid-body, untouched for an hour.
    let (mut writer, read, put) = piped_put(&first, "stalled.bin");
    writer.write_all(&[7; 1000]).await.unwrap();
    until_read(&read, 1000).await;
    let temp = std::path::PathBuf::from(temp_files(&root).pop().expect("the put's temporary file"));
    until_size(&temp, 1000).await;
    let hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
    std::fs::File::options()
        .write(true)
        .open(&temp)
        .unwrap()
        .set_modified(hour_ago)
        .unwrap();
    // A reload inits a store on the root: its sweep (swept `deep/` after
    // the root's files) removes another host's old file, not the put's.
    let canary = root.join("deep/.rewire-tmp-0123456789abcdef-999999999-7");
    std::fs::write(&canary, b"old").unwrap();
    std::fs::File::options()
        .write(true)
        .open(&canary)
        .unwrap()
        .set_modified(hour_ago)
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut reloads = Vec::new();
    while canary.exists() {
        // A new init sweeps unless a sweep of the root still runs.
        assert!(std::time::Instant::now() < deadline, "no sweep ran");
        reloads.push(store("local", metadata.clone()).await);
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(temp.exists(), "the stalled put's file was swept");
    // The client resumes: the put completes, with all it sent.
    writer.write_all(&[8; 500]).await.unwrap();
    drop(writer);
    let info = put.await.unwrap().unwrap();
    assert_eq!(info.size, 1500);
    let reload = reloads.pop().unwrap();
    let data = read_all(&*reload, "stalled.bin").await.unwrap();
    assert_eq!((data.len(), data[0], data[1499]), (1500, 7, 8));
}

#[tokio::test]
async fn a_put_whose_temporary_file_vanished_fails_as_a_backend_error_not_not_found() {
    use tokio::io::AsyncWriteExt;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("files");
    let store = store("local", json!({ "root": root.display().to_string() })).await;
    let (mut writer, read, put) = piped_put(&store, "docs/report.bin");
    writer.write_all(&[1; 100]).await.unwrap();
    until_read(&read, 100).await;
    // Another process removes the temporary file midway.
    let temp = std::path::PathBuf::from(temp_files(&root).pop().expect("the put's temporary file"));
    std::fs::remove_file(&temp).unwrap();
    drop(writer);
    let answer = put.await.unwrap();
    let Err(FileError::Backend(why)) = &answer else {
        panic!("expected a backend error, got {answer:?}");
    };
    assert!(
        why.contains("docs/report.bin") && why.contains("temporary file vanished"),
        "{why}"
    );
    assert!(!root.join("docs/report.bin").exists());
}
