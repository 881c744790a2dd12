//! Layotto's sequencer and File methods on the shared operations
//! ([`SequencerOps`](crate::dapr::SequencerOps),
//! [`FileOps`](crate::dapr::FileOps)). Files stream both ways in chunks:
//! a put is read from the request stream as it comes (the store bounds its
//! size; the upload is cut only when no chunk comes for `request_timeout`),
//! a get is sent as it is read, never held whole.

use std::collections::BTreeMap;

use futures_util::FutureExt;
use rewire_runtime::{FileError, FileInfo, Increment, ListRequest, SequencerError};
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tonic::{Code, Status, Streaming};

use super::endable_stream::{EndableStream, StreamEnd};
use super::layotto_date::go_time_string;
use super::proto::spec::proto::runtime::v1 as pb;
use crate::connection::{pump, Pumped, CLIENT_READS_WITHIN, QUEUED_CHUNKS};
use crate::dapr::{check_request_metadata, Call, FileOpError, SequencerOpError, UploadError};
use crate::ApiState;
use tonic::codegen::Bytes;

/// Bytes per `GetFileResponse`.
const CHUNK: usize = 64 * 1024;
/// Files per listing page when the request does not say, and at most.
const PAGE: usize = 100;
const MAX_PAGE: usize = 1000;

/// The answer stream of `GetFile`.
pub(super) type FileStream =
    std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::GetFileResponse, Status>> + Send>>;

/// `GetNextId`: WEAK unless the options say STRONG (no options: WEAK, as
/// Layotto's proto and converter default); another increment is
/// `INVALID_ARGUMENT`, and no sequencer configured at all
/// `FAILED_PRECONDITION`, as Layotto answers. Every sequencer hands out
/// ids in increasing order either way.
pub(super) async fn next_id(
    call: Call,
    req: pb::GetNextIdRequest,
) -> Result<pb::GetNextIdResponse, Status> {
    let sequencer = match call.sequencer(&req.store_name) {
        Ok(sequencer) => sequencer,
        Err(not_found) => {
            // Layotto's answer when there is no sequencer at all (the
            // generation is walked only on this error path).
            let configured = call
                .generation()
                .iter()
                .any(|(key, _)| key.kind == rewire_runtime::Kind::Sequencer);
            if !configured {
                return Err(Status::failed_precondition(
                    "sequencer stores are not configured",
                ));
            }
            return Err(not_found.into());
        }
    };
    check_request_metadata(("sequencer", &req.store_name), &req.metadata)?;
    let increment = increment(req.options)?;
    let metadata: BTreeMap<_, _> = req.metadata.into_iter().collect();
    let next_id = sequencer.next_id(req.key, increment, metadata).await?;
    Ok(pb::GetNextIdResponse { next_id })
}

/// The increment `options` ask for: WEAK when there are none (Layotto's
/// proto: `WEAK = 0; // (default)`; its converter starts from WEAK and
/// reads the options only when present).
fn increment(options: Option<pb::SequencerOptions>) -> Result<Increment, Status> {
    let Some(given) = options.map(|o| o.increment) else {
        return Ok(Increment::Weak);
    };
    match pb::sequencer_options::AutoIncrement::try_from(given) {
        Ok(pb::sequencer_options::AutoIncrement::Weak) => Ok(Increment::Weak),
        Ok(pb::sequencer_options::AutoIncrement::Strong) => Ok(Increment::Strong),
        // Layotto's answer; prost's getter took it as WEAK.
        Err(_) => Err(Status::invalid_argument(format!(
            "Options.Increment is illegal: {given} (WEAK is 0, STRONG 1)"
        ))),
    }
}

/// `PutFile`: the first message names the store and the file; its data
/// and every later message's are the contents (no message at all is OK,
/// nothing written, as Layotto answers it). However long the upload
/// takes while chunks keep coming (the store bounds its size); cut with
/// `DEADLINE_EXCEEDED` when none arrives for `idle` (`request_timeout`).
/// Each message handed on stops counting against the listener's budget of
/// request bytes, by its wire framing (`crate::connection`'s `Messages`),
/// once the store asks for the next: an upload holds only what it has read
/// and not yet passed on, so it may be larger than that budget. The first
/// message's metadata is held to the request bounds, and the upload takes
/// a place among `max_uploads` for as long as it runs, and the store's
/// blocking work it left behind (`RESOURCE_EXHAUSTED` when none is left).
pub(super) async fn put(
    call: Call,
    mut incoming: Streaming<pb::PutFileRequest>,
    state: &ApiState,
) -> Result<(), Status> {
    let idle = state.options.request_timeout;
    let first = tokio::time::timeout(idle, incoming.message())
        .await
        .map_err(|_| {
            Status::deadline_exceeded(format!(
                "PutFile: no message arrived for {idle:?} (request_timeout); the first names \
                 the store and file"
            ))
        })??;
    // A stream closed before its first message writes nothing and answers
    // OK, as Layotto's `PutFile` does for a client that sends EOF at once.
    let Some(first) = first else {
        return Ok(());
    };
    check_request_metadata(("file store", &first.store_name), &first.metadata)?;
    let store = call.file_store(&first.store_name)?;
    let place = state
        .metrics
        .uploads()
        .take(state.options.max_uploads, store.name(), &first.name)
        .map_err(UploadError::from)?;
    let metadata: BTreeMap<_, _> = first.metadata.into_iter().collect();
    let rest = incoming.map(|message| message.map(|message| message.data));
    let chunks = tokio_stream::once(Ok(first.data)).chain(rest).map(|chunk| {
        chunk
            .map(Bytes::from)
            .map_err(|status| std::io::Error::other(status.message().to_string()))
    });
    let put = store.put_streamed(first.name, chunks, metadata, idle);
    place.held_through(put).await?;
    Ok(())
}

/// `GetFile`: the contents in chunks of [`CHUNK`] bytes, read as sent,
/// holding a place among `max_downloads` until the file is let go of
/// (`RESOURCE_EXHAUSTED` when none is left).
pub(super) async fn get(
    call: Call,
    req: pb::GetFileRequest,
    state: &ApiState,
) -> Result<FileStream, Status> {
    let store = call.file_store(&req.store_name)?;
    let place = state
        .metrics
        .downloads()
        .take(state.options.max_downloads, store.name(), &req.name)
        .map_err(|full| Status::resource_exhausted(full.to_string()))?;
    let read = store.get(&req.name).await?;
    let (out, stream) = mpsc::channel(QUEUED_CHUNKS);
    let end = StreamEnd::default();
    let stream = EndableStream::new(stream, &end);
    let file = format!("file `{}` of file store `{}`", req.name, req.store_name);
    tokio::spawn(send_chunks(place.holding(read.body), out, end, file));
    Ok(Box::pin(stream))
}

/// Sends `body` to `out` in chunks of [`CHUNK`] bytes until it ends, fails
/// or the client takes no chunk for [`CLIENT_READS_WITHIN`] (then the
/// stream is ended with a status and `body` dropped, an open file each
/// else for as long as the connection lives).
async fn send_chunks(
    body: impl tokio::io::AsyncRead + Unpin,
    out: mpsc::Sender<Result<pb::GetFileResponse, Status>>,
    end: StreamEnd,
    file: String,
) {
    let message = |read: std::io::Result<Vec<u8>>| match read {
        Ok(data) => Ok(pb::GetFileResponse { data }),
        Err(err) => Err(Status::internal(format!("reading the file failed: {err}"))),
    };
    // A store's reader that panics mid-file ends the stream with an
    // error: ended without one, the client would take a cut file for the
    // whole of it (status OK).
    let pumped =
        std::panic::AssertUnwindSafe(pump(body, CHUNK, &out, message, CLIENT_READS_WITHIN))
            .catch_unwind()
            .await;
    match pumped {
        Ok(Pumped::Done) => {}
        Ok(Pumped::Stalled) => end.end(Status::deadline_exceeded(format!(
            "reading {}: the client took no chunk for {CLIENT_READS_WITHIN:?}",
            rewire_runtime::echoed(&file)
        ))),
        Err(_) => {
            tracing::error!(file = %rewire_runtime::echoed(&file), "A file store's reader panicked while a file was sent; the stream ends with an error.");
            end.end(Status::internal(format!(
                "reading {} failed: the file store's reader panicked",
                rewire_runtime::echoed(&file)
            )));
        }
    }
}

/// `ListFile`: one page of the files under the request's name (a prefix).
pub(super) async fn list(call: Call, req: pb::ListFileRequest) -> Result<pb::ListFileResp, Status> {
    let request = req.request.ok_or_else(|| {
        Status::invalid_argument("ListFile: `request` (store and prefix) is required")
    })?;
    let store = call.file_store(&request.store_name)?;
    let max_keys = usize::try_from(req.page_size)
        .ok()
        .filter(|n| *n > 0)
        .map_or(PAGE, |n| n.min(MAX_PAGE));
    let page = store
        .list(ListRequest {
            prefix: request.name,
            marker: Some(req.marker).filter(|m| !m.is_empty()),
            max_keys,
        })
        .await?;
    Ok(pb::ListFileResp {
        is_truncated: page.marker.is_some(),
        marker: page.marker.unwrap_or_default(),
        files: page.files.into_iter().map(file_info).collect(),
    })
}

/// `DelFile`.
pub(super) async fn delete(call: Call, req: pb::DelFileRequest) -> Result<(), Status> {
    let request = req.request.ok_or_else(|| {
        Status::invalid_argument("DelFile: `request` (store and name) is required")
    })?;
    Ok(call
        .file_store(&request.store_name)?
        .delete(&request.name)
        .await?)
}

/// `GetFileMeta`: size, last modification (as Layotto writes it: Go's
/// `time.Time.String()`) and what else the store knows of the file (each
/// value a list of one, as Layotto's); a folder answers too, as Layotto's
/// `local` store's `os.Stat` (`IsDir` `true`); `NOT_FOUND` for no such
/// file.
pub(super) async fn meta(
    call: Call,
    req: pb::GetFileMetaRequest,
) -> Result<pb::GetFileMetaResponse, Status> {
    let request = req.request.ok_or_else(|| {
        Status::invalid_argument("GetFileMeta: `request` (store and name) is required")
    })?;
    let info = call
        .file_store(&request.store_name)?
        .stat(&request.name)
        .await?;
    let metadata = info
        .metadata
        .into_iter()
        .map(|(name, value)| (name, pb::FileMetaValue { value: vec![value] }))
        .collect();
    Ok(pb::GetFileMetaResponse {
        size: i64::try_from(info.size).unwrap_or(i64::MAX),
        last_modified: go_time_string(info.modified),
        response: Some(pb::FileMeta { metadata }),
    })
}

/// A listed file: name, size and last modification (as in
/// `GetFileMeta`); no metadata, as Layotto's stores list none (`FileMode`
/// and the like are `GetFileMeta`'s).
fn file_info(info: FileInfo) -> pb::FileInfo {
    pb::FileInfo {
        size: i64::try_from(info.size).unwrap_or(i64::MAX),
        last_modified: go_time_string(info.modified),
        file_name: info.name,
        metadata: Default::default(),
    }
}

/// An unknown store is `INVALID_ARGUMENT` (as for every kind); a missing
/// file `NOT_FOUND`; a refused name `INVALID_ARGUMENT`; a file over the
/// store's bound `RESOURCE_EXHAUSTED`.
impl From<FileOpError> for Status {
    fn from(err: FileOpError) -> Self {
        let code = match err.store_error() {
            None => Code::InvalidArgument,
            Some(FileError::NotFound(_)) => Code::NotFound,
            Some(FileError::Invalid(_)) => Code::InvalidArgument,
            Some(FileError::TooLarge { .. }) => Code::ResourceExhausted,
            Some(FileError::Backend(_)) => Code::Internal,
        };
        Status::new(code, err.to_string())
    }
}

/// An upload cut for inactivity (the client's or the store's) is
/// `DEADLINE_EXCEEDED`, one refused for too many running
/// `RESOURCE_EXHAUSTED`; a failed write is the store's error.
impl From<UploadError> for Status {
    fn from(err: UploadError) -> Self {
        match err {
            UploadError::File(err) => err.into(),
            idle @ (UploadError::Idle { .. } | UploadError::StoreStalled { .. }) => {
                Status::deadline_exceeded(idle.to_string())
            }
            busy @ UploadError::TooMany { .. } => Status::resource_exhausted(busy.to_string()),
        }
    }
}

/// An unknown store or a bad key is `INVALID_ARGUMENT`; a sequence out of
/// ids, or a sequencer out of room for another key, `RESOURCE_EXHAUSTED`.
impl From<SequencerOpError> for Status {
    fn from(err: SequencerOpError) -> Self {
        let code = match err.store_error() {
            None | Some(SequencerError::Invalid(_)) => Code::InvalidArgument,
            Some(SequencerError::Exhausted(_) | SequencerError::Capacity(_)) => {
                Code::ResourceExhausted
            }
            Some(SequencerError::Backend(_)) => Code::Internal,
        };
        Status::new(code, err.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listed_file_carries_no_metadata_whatever_its_store_knows_as_layottos_list() {
        let listed = file_info(FileInfo {
            name: "docs/report.txt".into(),
            size: 9,
            modified: std::time::UNIX_EPOCH,
            metadata: [("FileMode".to_string(), "416".to_string())].into(),
        });
        assert_eq!(
            (listed.file_name.as_str(), listed.size),
            ("docs/report.txt", 9)
        );
        assert!(listed.metadata.is_empty(), "{listed:?}");
    }

    /// A sequencer out of room for another key refuses a valid request:
    /// `RESOURCE_EXHAUSTED`, not the caller's `INVALID_ARGUMENT`.
    #[test]
    fn a_sequencer_out_of_capacity_is_resource_exhausted() {
        let failed = |source| SequencerOpError::NextId {
            store: "ids".into(),
            key: "orders".into(),
            source,
        };
        let full = Status::from(failed(SequencerError::Capacity("too many keys".into())));
        assert_eq!(full.code(), Code::ResourceExhausted);
        let bad = Status::from(failed(SequencerError::Invalid("empty key".into())));
        assert_eq!(bad.code(), Code::InvalidArgument);
    }

    #[test]
    fn no_options_and_default_options_ask_for_weak_as_layottos_proto_says() {
        let asked = |increment| Some(pb::SequencerOptions { increment });
        assert_eq!(increment(None).unwrap(), Increment::Weak);
        assert_eq!(
            increment(Some(pb::SequencerOptions::default())).unwrap(),
            Increment::Weak
        );
        assert_eq!(increment(asked(1)).unwrap(), Increment::Strong);
        assert_eq!(
            increment(asked(2)).unwrap_err().code(),
            Code::InvalidArgument
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_reader_that_takes_no_chunk_has_its_stream_ended_and_the_file_let_go() {
        let (out, queued) = mpsc::channel(1);
        let end = StreamEnd::default();
        let mut stream = EndableStream::new(queued, &end);
        // An endless file; nothing is read from the stream.
        let sending = tokio::spawn(send_chunks(
            tokio::io::repeat(7),
            out,
            end,
            "file `big` of file store `files`".into(),
        ));
        tokio::time::timeout(CLIENT_READS_WITHIN * 4, sending)
            .await
            .expect("the sender gave up")
            .expect("no panic");
        let Some(Err(status)) = stream.next().await else {
            panic!("the status comes ahead of the queued chunk");
        };
        assert_eq!(status.code(), Code::DeadlineExceeded);
        assert!(status
            .message()
            .contains("file `big` of file store `files`"));
        assert!(stream.next().await.is_none());
    }
    /// A reader that panics after its first chunk: the stream ends with
    /// INTERNAL. Failed before: it ended with no status,
    /// so the client took the cut file for the whole of it.
    #[tokio::test]
    async fn a_reader_panicking_mid_file_ends_the_stream_with_an_error() {
        struct PanicsAfterOneChunk(bool);
        impl tokio::io::AsyncRead for PanicsAfterOneChunk {
            fn poll_read(
                mut self: std::pin::Pin<&mut Self>,
                _: &mut std::task::Context<'_>,
                buf: &mut tokio::io::ReadBuf<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                assert!(!self.0, "the store's reader panics");
                self.0 = true;
                buf.put_slice(b"first");
                std::task::Poll::Ready(Ok(()))
            }
        }
        let (out, queued) = mpsc::channel(4);
        let end = StreamEnd::default();
        let mut stream = EndableStream::new(queued, &end);
        send_chunks(
            PanicsAfterOneChunk(false),
            out,
            end,
            "file `a` of file store `files`".into(),
        )
        .await;
        // The status comes ahead of what is queued: the client knows at
        // once the file is not whole.
        let Some(Err(status)) = stream.next().await else {
            panic!("the stream ended with no error");
        };
        assert_eq!(status.code(), Code::Internal);
        assert!(status.message().contains("panicked"), "{status:?}");
        assert!(stream.next().await.is_none());
    }
}
