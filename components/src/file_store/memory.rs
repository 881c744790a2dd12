//! The `memory` file store: files kept in process, bounded per file
//! (`maxFileSize`, default 64 MiB) and in total (`maxTotalSize`, default
//! 256 MiB). Metadata changes apply in place and keep the files; a rebuild
//! of the same type (a new `appId`) takes over its predecessor's files
//! (see [`crate::memory`]), puts under way on it included. A put
//! reserves its bytes as it reads them, so the files stored and the puts
//! being read hold no more than `maxTotalSize` together (a put replacing a
//! file counts on that file's bytes coming free, unless downloads still
//! hold them): parallel puts cannot buffer `maxFileSize` each past the
//! total.
//!
//! Each file counts its name and [`ENTRY_OVERHEAD`] bytes besides its
//! contents (a put reserves them before it reads its body), so files are
//! bounded in number too: empty files with long names fill the total as
//! any others. A file replaced or deleted while downloads still read it
//! keeps counting its contents ("retired") until the last of those
//! downloads ends, so slow downloads of old versions cannot hold memory
//! past `maxTotalSize` either: a put finding no room for them is refused,
//! and the room comes back as they end.
//!
//! What is reserved is what is allocated: a put keeps its bytes in pieces
//! of at most [`CHUNK`] bytes, each reserved as it is allocated (so a put
//! being read may hold up to one piece more than it has read, never more
//! than the room left), and the file is stored as those very pieces, never
//! copied whole nor grown by doubling.

mod contents;

use std::collections::BTreeMap;
use std::io;
use std::ops::Bound;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::SystemTime;

use rewire_runtime::{
    Component, ComponentError, FileError, FileInfo, FileRead, FileStore, InPlace, InPlaceUpdate,
    InitContext, ListPage, ListRequest, Metadata, PendingInPlace, PutFileRequest, StagedInPlace,
};
use serde::Deserialize;
use tokio::io::AsyncWrite;

use self::contents::{Contents, RetiredBytes};
use super::{copy_bounded, deserialize_size, names, page_size, CHUNK};

/// Bytes each file counts against `maxTotalSize` besides its name and
/// contents: its map entry, times and bookkeeping. Without it, empty
/// files with 1,000-byte names grew the store without bound while its
/// total stayed 0.
pub const ENTRY_OVERHEAD: u64 = 64;

/// What a file named `name` holding `len` bytes counts against
/// `maxTotalSize`.
fn entry_size(name: &str, len: u64) -> u64 {
    name.len() as u64 + ENTRY_OVERHEAD + len
}

/// Go's `os.FileMode` of a folder with permissions 0755 (`ModeDir` is bit
/// 31), as a `local` stat of one answers it.
const FOLDER_MODE: u32 = (1 << 31) | 0o755;

/// Metadata of the `memory` file store.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct MemoryFileMetadata {
    /// Largest file, in bytes.
    #[serde(deserialize_with = "deserialize_size")]
    pub max_file_size: u64,
    /// Largest sum of all files, in bytes: each one's contents, name and
    /// [`ENTRY_OVERHEAD`], with the puts being read and the contents of
    /// replaced or deleted files still being downloaded.
    #[serde(deserialize_with = "deserialize_size")]
    pub max_total_size: u64,
}

impl Default for MemoryFileMetadata {
    fn default() -> Self {
        Self {
            max_file_size: 64 << 20,
            max_total_size: 256 << 20,
        }
    }
}

#[derive(Debug)]
struct Stored {
    data: Contents,
    modified: SystemTime,
}

#[derive(Debug, Default)]
struct Files {
    by_name: BTreeMap<String, Stored>,
    /// What the stored files count: each one's [`entry_size`].
    total: u64,
    /// Bytes reserved by puts not yet stored (or failed): their entries
    /// and what they have read.
    reading: u64,
    /// Contents of replaced or deleted files that downloads still hold.
    retired: RetiredBytes,
}

impl Files {
    /// Bytes the stored files and the retired contents would count with
    /// `name` holding `size` (its [`entry_size`]; 0: not stored) in place
    /// of what it holds now. Contents a download still reads are not
    /// freed by the replacement: they are retired.
    fn stored_with(&self, name: &str, size: u64) -> u64 {
        let freed = self.by_name.get(name).map_or(0, |old| {
            let whole = entry_size(name, old.data.len());
            if old.data.being_read() {
                whole - old.data.len()
            } else {
                whole
            }
        });
        self.total - freed + size + self.retired.get()
    }

    /// Takes `old`, just replaced or removed under `name`, off the total;
    /// its contents are retired while downloads still hold them.
    fn forget(&mut self, name: &str, old: Stored) {
        self.total -= entry_size(name, old.data.len());
        self.retired.retire(old.data);
    }
}

/// The bytes a put has reserved and not yet stored: let go of when it
/// ends, stored or not.
struct Reading<'a> {
    store: &'a MemoryFileStore,
    /// For the file's entry: its name and [`ENTRY_OVERHEAD`].
    entry: u64,
    /// For its contents.
    bytes: u64,
}

impl Reading<'_> {
    /// Reserves the entry of the file `name` (its [`entry_size`] when
    /// empty), before its body is read: refused when it does not fit.
    fn reserve_entry(&mut self, name: &str, limit: u64) -> Result<(), FileError> {
        let size = entry_size(name, 0);
        self.entry += self.take(name, size, size, limit)?;
        Ok(())
    }

    /// Takes between `least` and `most` more bytes for `name`'s contents,
    /// as many as the stored files, the retired contents and every put
    /// being read leave free under `limit` (the file `name` replaces
    /// counted as gone, but for contents still being downloaded);
    /// refused when fewer than `least` are. Answers the bytes taken.
    fn grow(&mut self, name: &str, least: u64, most: u64, limit: u64) -> Result<u64, FileError> {
        let more = self.take(name, least, most, limit)?;
        self.bytes += more;
        Ok(more)
    }

    /// Reserves between `least` and `most` bytes for `name` (see
    /// [`Self::grow`]).
    fn take(&self, name: &str, least: u64, most: u64, limit: u64) -> Result<u64, FileError> {
        let mut files = self.store.files();
        let held = files.stored_with(name, 0) + files.reading;
        let room = limit.saturating_sub(held);
        if room < least {
            return Err(FileError::TooLarge {
                name: name.to_string(),
                limit,
            });
        }
        let more = most.max(least).min(room);
        files.reading += more;
        Ok(more)
    }

    /// Lets go of the reservation, under `files`' lock.
    fn end(&mut self, files: &mut Files) {
        files.reading -= std::mem::take(&mut self.bytes) + std::mem::take(&mut self.entry);
    }
}

impl Drop for Reading<'_> {
    fn drop(&mut self) {
        if self.bytes + self.entry > 0 {
            let mut files = self.store.files();
            self.end(&mut files);
        }
    }
}

/// A put's contents as it reads them: the pieces filled, and the one being
/// filled, whose whole capacity is reserved (against `maxTotalSize`) when
/// it is allocated, so the put never holds more than it has reserved.
struct PutBuffer<'a> {
    reading: Reading<'a>,
    name: String,
    limits: MemoryFileMetadata,
    /// Pieces filled to their capacity.
    filled: Vec<Box<[u8]>>,
    /// The piece being filled (allocated at its reserved capacity).
    filling: Vec<u8>,
    len: u64,
    /// Why a write was refused (the copy only sees an I/O error).
    refused: Option<FileError>,
}

impl<'a> PutBuffer<'a> {
    /// An empty buffer for a put of `name` to `store`, within `limits`.
    fn new(store: &'a MemoryFileStore, name: String, limits: MemoryFileMetadata) -> Self {
        Self {
            reading: Reading {
                store,
                entry: 0,
                bytes: 0,
            },
            name,
            limits,
            filled: Vec::new(),
            filling: Vec::new(),
            len: 0,
            refused: None,
        }
    }

    /// Appends `bytes`: what the piece being filled has room for, the rest
    /// into a new piece, reserved first: as large as what the put has read
    /// so far (pieces double from the first read's size, so a put reserves
    /// at most twice what it has read, and small concurrent puts are not
    /// refused for 64 KiB each reserved unused), at most [`CHUNK`] bytes,
    /// never past `maxFileSize` nor the room left under `maxTotalSize`.
    fn append(&mut self, bytes: &[u8]) -> Result<(), FileError> {
        let spare = self.filling.capacity() - self.filling.len();
        let (fits, spill) = bytes.split_at(spare.min(bytes.len()));
        self.filling.extend_from_slice(fits);
        if !spill.is_empty() {
            let file_room = self.limits.max_file_size.saturating_sub(self.reading.bytes);
            let capacity = self.reading.grow(
                &self.name,
                spill.len() as u64,
                file_room.min(CHUNK as u64).min(self.len.max(1)),
                self.limits.max_total_size,
            )?;
            let piece = std::mem::replace(&mut self.filling, Vec::with_capacity(capacity as usize));
            if !piece.is_empty() {
                // Full: its capacity is its length, so this does not copy.
                self.filled.push(piece.into_boxed_slice());
            }
            self.filling.extend_from_slice(spill);
        }
        self.len += bytes.len() as u64;
        Ok(())
    }

    /// The contents read, the last piece trimmed to what it holds, and the
    /// reservation (to let go of once stored or refused).
    fn finish(mut self) -> (Contents, Reading<'a>) {
        let last = std::mem::take(&mut self.filling);
        if !last.is_empty() {
            self.filled.push(last.into_boxed_slice());
        }
        (Contents::new(self.filled, self.len), self.reading)
    }

    /// Bytes allocated for contents: the pieces' capacities.
    #[cfg(test)]
    fn capacity(&self) -> u64 {
        let filled: usize = self.filled.iter().map(|piece| piece.len()).sum();
        (filled + self.filling.capacity()) as u64
    }
}

impl AsyncWrite for PutBuffer<'_> {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        Poll::Ready(match this.append(buf) {
            Ok(()) => Ok(buf.len()),
            Err(refused) => {
                this.refused = Some(refused);
                Err(io::Error::other(
                    "refused by the memory file store's bounds",
                ))
            }
        })
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// An in-process file store.
#[derive(rewire_runtime::Component, Debug, Default)]
#[component(
    kind = "file",
    type = "memory",
    example = r#"{"maxFileSize": 67108864, "maxTotalSize": 268435456}"#
)]
pub struct MemoryFileStore {
    #[metadata]
    metadata: MemoryFileMetadata,
    /// Set by an in-place update (shared with a staged one).
    limits: Arc<Mutex<Option<MemoryFileMetadata>>>,
    /// The component's files: shared with the instances rebuilt from or
    /// into this one.
    files: Arc<Mutex<Files>>,
}

impl MemoryFileStore {
    /// An empty store with `metadata`'s limits.
    pub fn new(metadata: MemoryFileMetadata) -> Self {
        Self {
            metadata,
            ..Self::default()
        }
    }

    fn limits(&self) -> MemoryFileMetadata {
        let limits = self.limits.lock().unwrap_or_else(|p| p.into_inner());
        limits.clone().unwrap_or_else(|| self.metadata.clone())
    }

    fn files(&self) -> MutexGuard<'_, Files> {
        self.files.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Refuses `name` where the local store would: a folder on its way that
    /// is a file ("passes through a file", any operation), or, for a put,
    /// the name of a folder ("is not a regular file"), so a store moved
    /// from `memory` to `local` refuses the same names (same wording).
    fn refuse_clash(files: &Files, name: &str, put: bool) -> Result<(), FileError> {
        let refused = |why: &str| FileError::Invalid(format!("file name `{name}`: {why}"));
        let mut folders = name.match_indices('/').map(|(at, _)| &name[..at]);
        if folders.any(|folder| files.by_name.contains_key(folder)) {
            return Err(refused("passes through a file"));
        }
        if put && Self::inside(files, name).next().is_some() {
            return Err(refused("is not a regular file"));
        }
        Ok(())
    }

    /// The files inside folder `name` (none: it is no folder). A name is a
    /// folder when a name starts with it and `/`: those sort from `name/`
    /// on (names hold no empty part).
    fn inside<'f>(files: &'f Files, name: &str) -> impl Iterator<Item = &'f Stored> {
        let folder = format!("{name}/");
        files
            .by_name
            .range::<str, _>((Bound::Included(folder.as_str()), Bound::Unbounded))
            .take_while(move |(inner, _)| inner.starts_with(&folder))
            .map(|(_, stored)| stored)
    }

    /// What a stat of folder `name` says, as the `local` store's (Layotto's
    /// `os.Stat`) in kind: size 0, the time of the first file it holds (by
    /// name: a stat never walks the folder, which may hold any number of
    /// empty files), `IsDir` and Go's `FileMode` of a folder
    /// (`ModeDir | 0755`); `None`: no folder. A folder whose files were
    /// all deleted is gone (`local` keeps it).
    fn folder_info(files: &Files, name: &str) -> Option<FileInfo> {
        let modified = Self::inside(files, name).next()?.modified;
        Some(FileInfo {
            name: name.to_string(),
            size: 0,
            modified,
            metadata: [
                ("FileMode".to_string(), FOLDER_MODE.to_string()),
                ("IsDir".to_string(), "true".to_string()),
            ]
            .into(),
        })
    }

    fn info(name: &str, stored: &Stored) -> FileInfo {
        FileInfo {
            name: name.to_string(),
            size: stored.data.len(),
            modified: stored.modified,
            metadata: BTreeMap::new(),
        }
    }
}

#[rewire_runtime::prelude::async_trait]
impl Component for MemoryFileStore {
    async fn init(&mut self, cx: &InitContext) -> Result<(), ComponentError> {
        let (files, adopted) = crate::memory::shared_with_predecessors(cx, self.files.clone());
        self.files = files;
        if adopted {
            tracing::info!(component = %cx.key, files = self.files().by_name.len(), "Memory file store rebuilt: it keeps its predecessor's files.");
        }
        Ok(())
    }

    fn as_in_place(&self) -> Option<&dyn InPlaceUpdate> {
        Some(self)
    }
}

/// Deferred: the new limits are put in force at commit.
#[rewire_runtime::prelude::async_trait]
impl InPlaceUpdate for MemoryFileStore {
    async fn update_in_place(&self, metadata: &Metadata) -> Result<InPlace, ComponentError> {
        let StagedInPlace::Deferred(pending) = self.stage_in_place(metadata).await? else {
            return Ok(InPlace::NeedsRebuild);
        };
        pending.apply();
        Ok(InPlace::Applied)
    }

    async fn stage_in_place(&self, metadata: &Metadata) -> Result<StagedInPlace, ComponentError> {
        let new = metadata
            .decode::<MemoryFileMetadata>()
            .map_err(|err| ComponentError::new(format!("new metadata rejected: {err}")))?;
        let limits = self.limits.clone();
        Ok(StagedInPlace::Deferred(PendingInPlace::new(move || {
            *limits.lock().unwrap_or_else(|p| p.into_inner()) = Some(new);
        })))
    }
}

#[rewire_runtime::prelude::async_trait]
impl FileStore for MemoryFileStore {
    async fn put(&self, req: PutFileRequest) -> Result<FileInfo, FileError> {
        names::parts(&req.name)?;
        // Refused before the body is read, and again when stored (a put of
        // a clashing name may have been stored meanwhile).
        Self::refuse_clash(&self.files(), &req.name, true)?;
        let limits = self.limits();
        let max_total_size = limits.max_total_size;
        let mut buffer = PutBuffer::new(self, req.name.clone(), limits.clone());
        buffer.reading.reserve_entry(&req.name, max_total_size)?;
        // The buffer reserves as it allocates.
        let copied = copy_bounded(
            &req.name,
            req.body,
            &mut buffer,
            limits.max_file_size,
            |_| Ok(()),
        )
        .await;
        if let Err(err) = copied {
            return Err(buffer.refused.take().unwrap_or(err));
        }
        let (data, mut reading) = buffer.finish();
        let mut files = self.files();
        reading.end(&mut files);
        Self::refuse_clash(&files, &req.name, true)?;
        let size = entry_size(&req.name, data.len());
        if files.stored_with(&req.name, size) > max_total_size {
            return Err(FileError::TooLarge {
                name: req.name,
                limit: max_total_size,
            });
        }
        let stored = Stored {
            data,
            modified: SystemTime::now(),
        };
        let info = Self::info(&req.name, &stored);
        if let Some(old) = files.by_name.insert(req.name, stored) {
            files.forget(&info.name, old);
        }
        files.total += size;
        Ok(info)
    }

    async fn get(&self, name: &str) -> Result<FileRead, FileError> {
        names::parts(name)?;
        let files = self.files();
        Self::refuse_clash(&files, name, false)?;
        let stored = files
            .by_name
            .get(name)
            .ok_or_else(|| FileError::NotFound(name.to_string()))?;
        Ok(FileRead {
            info: Self::info(name, stored),
            body: Box::pin(stored.data.reader()),
        })
    }

    async fn list(&self, req: ListRequest) -> Result<ListPage, FileError> {
        let size = page_size(&req);
        let files = self.files();
        let start = match &req.marker {
            Some(marker) => Bound::Excluded(marker.clone()),
            None => Bound::Included(req.prefix.clone()),
        };
        let mut page: Vec<FileInfo> = files
            .by_name
            .range((start, Bound::Unbounded))
            .skip_while(|(name, _)| !name.starts_with(&req.prefix) && **name < req.prefix)
            .take_while(|(name, _)| name.starts_with(&req.prefix))
            .take(size + 1)
            .map(|(name, stored)| Self::info(name, stored))
            .collect();
        let marker = (page.len() > size).then(|| {
            page.truncate(size);
            page.last().map(|info| info.name.clone())
        });
        Ok(ListPage {
            files: page,
            marker: marker.flatten(),
        })
    }

    async fn stat(&self, name: &str) -> Result<FileInfo, FileError> {
        names::parts(name)?;
        let files = self.files();
        Self::refuse_clash(&files, name, false)?;
        files
            .by_name
            .get(name)
            .map(|stored| Self::info(name, stored))
            .or_else(|| Self::folder_info(&files, name))
            .ok_or_else(|| FileError::NotFound(name.to_string()))
    }

    async fn delete(&self, name: &str) -> Result<(), FileError> {
        names::parts(name)?;
        let mut files = self.files();
        Self::refuse_clash(&files, name, false)?;
        let removed = files
            .by_name
            .remove(name)
            .ok_or_else(|| FileError::NotFound(name.to_string()))?;
        files.forget(name, removed);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;
    use tokio::io::{AsyncRead, AsyncReadExt, ReadBuf};

    /// Read sizes a body may come in: tiny frames, whole chunks, and what
    /// lies between.
    const UNEVEN: [usize; 7] = [1, 7, 3_000, CHUNK, CHUNK - 1, 2, 40_000];

    fn store(max_file_size: u64, max_total_size: u64) -> MemoryFileStore {
        MemoryFileStore::new(MemoryFileMetadata {
            max_file_size,
            max_total_size,
        })
    }

    /// `len` bytes of a pattern that tells pieces apart.
    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|at| (at % 251) as u8).collect()
    }

    /// A body giving `data` in reads of the [`UNEVEN`] sizes in turn.
    struct UnevenBody {
        data: Vec<u8>,
        at: usize,
        reads: usize,
    }

    impl AsyncRead for UnevenBody {
        fn poll_read(
            self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            let this = self.get_mut();
            let size = UNEVEN[this.reads % UNEVEN.len()];
            let end = this.data.len().min(this.at + size.min(buf.remaining()));
            buf.put_slice(&this.data[this.at..end]);
            this.at = end;
            this.reads += 1;
            Poll::Ready(Ok(()))
        }
    }

    fn put_request(name: &str, data: Vec<u8>) -> PutFileRequest {
        PutFileRequest {
            name: name.to_string(),
            body: Box::pin(UnevenBody {
                data,
                at: 0,
                reads: 0,
            }),
            metadata: BTreeMap::new(),
        }
    }

    #[test]
    fn a_put_never_holds_more_than_it_has_reserved_and_stores_what_it_read() {
        let store = store(1 << 20, 1 << 20);
        let data = pattern(600_000);
        let mut buffer = PutBuffer::new(&store, "f".to_string(), store.limits());
        let mut allocated = BTreeSet::new();
        let (mut at, mut reads) = (0, 0);
        while at < data.len() {
            let end = data.len().min(at + UNEVEN[reads % UNEVEN.len()]);
            buffer.append(&data[at..end]).unwrap();
            (at, reads) = (end, reads + 1);
            allocated.insert(buffer.filling.as_ptr() as usize);
            let reserved = store.files().reading;
            assert!(
                buffer.capacity() <= reserved,
                "{} bytes allocated for {reserved} reserved, after {at} read",
                buffer.capacity()
            );
            assert!(
                reserved - at as u64 <= CHUNK as u64,
                "at most one piece ahead"
            );
        }
        let (contents, mut reading) = buffer.finish();
        assert_eq!(contents.len(), data.len() as u64);
        assert_eq!(contents.pieces.concat(), data);
        // Stored as the very pieces read into (the last one trimmed): no
        // copy of the whole file.
        let (_last, kept) = contents.pieces.split_last().unwrap();
        for piece in kept {
            assert!(
                allocated.contains(&(piece.as_ptr() as usize)),
                "a piece was copied"
            );
        }
        reading.end(&mut store.files());
        assert_eq!(store.files().reading, 0);
    }

    #[test]
    fn concurrent_small_puts_reserve_at_most_twice_what_they_read() {
        // Ten puts of 5,000 bytes in 1,000-byte reads, side by side, in a
        // store of 100,000: each reserves at most twice what it read, so
        // all fit. (A 64 KiB piece reserved at each put's first read
        // refused the third.)
        let store = store(1 << 20, 100_000);
        let data = pattern(5_000);
        let mut puts: Vec<PutBuffer<'_>> = (0..10)
            .map(|i| PutBuffer::new(&store, format!("f{i}"), store.limits()))
            .collect();
        for frame in data.chunks(1_000) {
            for put in &mut puts {
                put.append(frame).expect("room for all");
            }
        }
        assert!(store.files().reading <= 2 * 10 * 5_000);
        for put in puts {
            let (contents, mut reading) = put.finish();
            assert_eq!(contents.pieces.concat(), data);
            reading.end(&mut store.files());
        }
        assert_eq!(store.files().reading, 0);
    }

    #[tokio::test]
    async fn a_file_put_in_uneven_reads_is_read_back_whole_across_its_pieces() {
        let store = store(1 << 20, 1 << 20);
        let data = pattern(300_001);
        let info = store.put(put_request("dir/f", data.clone())).await.unwrap();
        assert_eq!(info.size, data.len() as u64);
        {
            let files = store.files();
            let size = entry_size("dir/f", data.len() as u64);
            assert_eq!((files.total, files.reading), (size, 0));
            assert!(files.by_name["dir/f"].data.pieces.len() > 1);
        }
        // Read back in small reads, crossing the pieces' ends.
        let mut body = store.get("dir/f").await.unwrap().body;
        let mut read = Vec::new();
        let mut small = [0u8; 1_000];
        loop {
            let n = body.read(&mut small).await.unwrap();
            if n == 0 {
                break;
            }
            read.extend_from_slice(&small[..n]);
        }
        assert_eq!(read, data);
        let mut whole = Vec::new();
        let mut body = store.get("dir/f").await.unwrap().body;
        body.read_to_end(&mut whole).await.unwrap();
        assert_eq!(whole, data);
        let empty = store.put(put_request("empty", Vec::new())).await.unwrap();
        assert_eq!(empty.size, 0);
        let mut body = store.get("empty").await.unwrap().body;
        assert_eq!(body.read(&mut small).await.unwrap(), 0);
    }

    #[tokio::test]
    async fn a_file_filling_the_total_exactly_fits_though_a_whole_piece_would_not() {
        // Room for 100,000 bytes besides the file's entry: the second piece
        // may only take the room left, 34,464 bytes.
        let limit = 100_000 + entry_size("f", 0);
        let store = store(1 << 20, limit);
        let info = store.put(put_request("f", pattern(100_000))).await.unwrap();
        assert_eq!(info.size, 100_000);
        let over = store.put(put_request("g", Vec::new())).await;
        assert!(
            matches!(over, Err(FileError::TooLarge { limit: l, .. }) if l == limit),
            "{over:?}"
        );
        let over = store.put(put_request("f", pattern(100_001))).await;
        assert!(
            matches!(over, Err(FileError::TooLarge { limit: l, .. }) if l == limit),
            "{over:?}"
        );
        let files = store.files();
        assert_eq!((files.total, files.reading), (limit, 0));
    }

    /// Whether `answer` is a refusal naming `limit`.
    fn too_large(answer: &Result<FileInfo, FileError>, limit: u64) -> bool {
        matches!(answer, Err(FileError::TooLarge { limit: l, .. }) if *l == limit)
    }

    /// All a download gives.
    async fn read_whole(mut body: rewire_runtime::FileBody) -> Vec<u8> {
        let mut read = Vec::new();
        body.read_to_end(&mut read).await.unwrap();
        read
    }

    #[tokio::test]
    async fn contents_still_downloaded_after_a_put_or_delete_count_until_the_download_ends() {
        // Room for 100 bytes besides one file's entry, 60 at most a file.
        let limit = 100 + entry_size("a", 0);
        let store = store(60, limit);
        let old = vec![1; 60];
        store.put(put_request("a", old.clone())).await.unwrap();
        // A slow download of `a`: its 60 bytes stay held while it lives,
        // so 60 more for a new `a` do not fit.
        let download = store.get("a").await.unwrap().body;
        let again = store.put(put_request("a", vec![2; 60])).await;
        assert!(too_large(&again, limit), "{again:?}");
        assert_eq!(store.files().reading, 0);
        drop(download);
        store.put(put_request("a", vec![2; 60])).await.unwrap();

        // Deleted while downloaded: retired until the download ends.
        let download = store.get("a").await.unwrap().body;
        store.delete("a").await.unwrap();
        {
            let files = store.files();
            assert_eq!((files.total, files.retired.get()), (0, 60));
        }
        let other = store.put(put_request("b", vec![3; 60])).await;
        assert!(too_large(&other, limit), "{other:?}");
        assert_eq!(read_whole(download).await, vec![2; 60]);
        assert_eq!(store.files().retired.get(), 0);
        store.put(put_request("b", vec![3; 60])).await.unwrap();

        // Replaced while downloaded, with room for both: the download
        // reads the old contents, counted until it ends.
        let store = self::store(60, 2 * limit);
        store.put(put_request("a", old.clone())).await.unwrap();
        let download = store.get("a").await.unwrap().body;
        store.put(put_request("a", vec![2; 60])).await.unwrap();
        assert_eq!(store.files().retired.get(), 60);
        assert_eq!(read_whole(download).await, old);
        let files = store.files();
        assert_eq!((files.total, files.retired.get()), (entry_size("a", 60), 0));
    }
}
