//! The file routes (rewire's own; Dapr has none). Contents stream both
//! ways, bounded by the store's `maxFileSize`, never held whole:
//!
//! * `PUT /v1.0/rewire/file/{store}/{*name}`: the body is the file →
//!   `{"name", "size", "lastModified"}`; bounded by inactivity, not as a
//!   whole: 408 when no bytes arrive for `request_timeout`; 429 when
//!   `max_uploads` run already;
//! * `GET` the same path: the file (`Content-Length`, `Last-Modified`);
//! * `HEAD`: the same headers, no body (stat);
//! * `DELETE`: 204;
//! * `GET /v1.0/rewire/file/{store}?prefix=&marker=&limit=`: one page,
//!   `{"files": [...], "marker": "..."}` (`marker` only when more follow).

use axum::body::Body;
use axum::extract::{Extension, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use tokio_stream::StreamExt;

use rewire_runtime::{FileInfo, ListRequest};

use super::error::HttpError;
use super::input::{query_pairs, query_value, request_metadata, QueryPairs};
use super::path_params::PathParams;
use super::rewire_error::RewireHttpError;
use crate::connection::{pumped, BodyCharge};
use crate::dapr::{http_date, Call};
use crate::ApiState;

/// Bytes sent per chunk of a streamed file.
const CHUNK: usize = 64 * 1024;

fn info_json(info: &FileInfo) -> Value {
    json!({
        "name": info.name,
        "size": info.size,
        "lastModified": http_date(info.modified),
    })
}

fn info_headers(info: &FileInfo) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(info.size));
    if let Ok(modified) = HeaderValue::from_str(&http_date(info.modified)) {
        headers.insert(header::LAST_MODIFIED, modified);
    }
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    headers
}

/// `PUT /v1.0/rewire/file/{store}/{*name}`: writes the body as the file.
/// Not bounded as a whole (`observe` leaves this route out): however long
/// the upload takes while bytes keep coming (the store bounds its size),
/// cut with 408 when none arrive for `request_timeout`. Each chunk the
/// store is handed stops counting against the listener's budget of request
/// bytes ([`BodyCharge`]): an upload holds only what it has read and not
/// yet passed on, so it may be larger than that budget. It takes a place
/// among `max_uploads` for as long as it runs, and the store's blocking
/// work it left behind (429 when none is left).
pub async fn put(
    State(state): State<ApiState>,
    call: Call,
    PathParams((store, name)): PathParams<(String, String)>,
    query: QueryPairs,
    charge: Option<Extension<BodyCharge>>,
    body: Body,
) -> Result<Json<Value>, RewireHttpError> {
    let metadata = request_metadata(&query_pairs(query)?, ("file store", &store))
        .map_err(HttpError::from)?
        .into_iter()
        .collect();
    let ops = call.file_store(&store)?;
    let place = state
        .metrics
        .uploads()
        .take(state.options.max_uploads, ops.name(), &name)
        .map_err(crate::dapr::UploadError::from)?;
    let charge = charge.map(|Extension(charge)| charge);
    let chunks = body.into_data_stream().map(move |chunk| {
        if let (Ok(bytes), Some(charge)) = (&chunk, &charge) {
            charge.taken(bytes.len());
        }
        chunk.map_err(std::io::Error::other)
    });
    let idle = state.options.request_timeout;
    let put = ops.put_streamed(name, chunks, metadata, idle);
    let info = place.held_through(put).await?;
    Ok(Json(info_json(&info)))
}

/// `GET /v1.0/rewire/file/{store}/{*name}`: the file, streamed; let go
/// of (the response failed) when the client takes no chunk for
/// [`CLIENT_READS_WITHIN`](crate::connection::CLIENT_READS_WITHIN), not
/// held for as long as its connection lives. It holds a place among
/// `max_downloads` until then (429 when none is left).
pub async fn get(
    State(state): State<ApiState>,
    call: Call,
    PathParams((store, name)): PathParams<(String, String)>,
) -> Result<Response, RewireHttpError> {
    let ops = call.file_store(&store)?;
    let place = state
        .metrics
        .downloads()
        .take(state.options.max_downloads, ops.name(), &name)?;
    let read = ops.get(&name).await?;
    let body = Body::from_stream(pumped(place.holding(read.body), CHUNK));
    Ok((info_headers(&read.info), body).into_response())
}

/// `HEAD /v1.0/rewire/file/{store}/{*name}`: the file's size and age (a
/// folder is not found, as its `GET` is).
pub async fn stat(
    call: Call,
    PathParams((store, name)): PathParams<(String, String)>,
) -> Result<Response, RewireHttpError> {
    let info = call.file_store(&store)?.stat_file(&name).await?;
    Ok(info_headers(&info).into_response())
}

/// `DELETE /v1.0/rewire/file/{store}/{*name}`: removes the file.
pub async fn delete(
    call: Call,
    PathParams((store, name)): PathParams<(String, String)>,
) -> Result<StatusCode, RewireHttpError> {
    call.file_store(&store)?.delete(&name).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /v1.0/rewire/file/{store}`: one page of the listing.
pub async fn list(
    call: Call,
    PathParams(store): PathParams<String>,
    query: QueryPairs,
) -> Result<Json<Value>, RewireHttpError> {
    let pairs = query_pairs(query)?;
    let max_keys = match query_value(&pairs, "limit") {
        None => 0,
        Some(text) => text.parse::<usize>().map_err(|_| {
            HttpError::MalformedQuery(format!(
                "query parameter `limit` is `{text}`; expected a whole number"
            ))
        })?,
    };
    let request = ListRequest {
        prefix: query_value(&pairs, "prefix")
            .unwrap_or_default()
            .to_string(),
        marker: query_value(&pairs, "marker").map(str::to_string),
        max_keys,
    };
    let page = call.file_store(&store)?.list(request).await?;
    let files: Vec<Value> = page.files.iter().map(info_json).collect();
    let mut body = json!({ "files": files });
    if let Some(marker) = page.marker {
        body["marker"] = json!(marker);
    }
    Ok(Json(body))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Condvar, Mutex};
    use std::time::Duration;

    use axum::http::{Method, Request};
    use rewire_runtime::prelude::async_trait;
    use rewire_runtime::{FileError, FileInfo, FileStore, PutFileRequest};
    use tokio::io::AsyncReadExt;
    use tokio::sync::Notify;
    use tower_service::Service;

    use super::*;

    /// Every wait of these tests ends within this.
    const WITHIN: Duration = Duration::from_secs(30);

    /// The disk of the `test.upload.hung_disk` store: while hung, a write
    /// blocks on it (for a minute at most).
    struct Disk {
        hung: Mutex<bool>,
        moved: Condvar,
        /// Told when a write blocks on the hung disk.
        stuck: Notify,
        /// Told when a write has returned and let go of its upload's hold.
        returned: Notify,
        /// Set once a put's future has run to its end.
        answered: AtomicBool,
    }

    static DISK: Disk = Disk {
        hung: Mutex::new(true),
        moved: Condvar::new(),
        stuck: Notify::const_new(),
        returned: Notify::const_new(),
        answered: AtomicBool::new(false),
    };

    impl Disk {
        /// A blocking write: waits while the disk is hung.
        fn write(&self) {
            let hung = self.hung.lock().unwrap_or_else(|p| p.into_inner());
            if *hung {
                self.stuck.notify_one();
            }
            let _ = self
                .moved
                .wait_timeout_while(hung, Duration::from_secs(60), |hung| *hung);
        }

        fn recover(&self) {
            *self.hung.lock().unwrap_or_else(|p| p.into_inner()) = false;
            self.moved.notify_all();
        }
    }

    /// A store whose put reads its body, then writes it on the blocking
    /// pool, as the `local` store does: the blocking write keeps the
    /// upload's hold until it returns, and runs on when the put's future
    /// is dropped.
    #[derive(rewire_runtime::Component, Default)]
    #[component(kind = "file", type = "test.upload.hung_disk")]
    struct HungDiskFiles {}

    #[async_trait]
    impl rewire_runtime::Component for HungDiskFiles {}

    #[async_trait]
    impl FileStore for HungDiskFiles {
        async fn put(&self, mut req: PutFileRequest) -> Result<FileInfo, FileError> {
            let mut whole = Vec::new();
            req.body
                .read_to_end(&mut whole)
                .await
                .map_err(|e| FileError::Invalid(e.to_string()))?;
            let hold = PutFileRequest::upload_hold();
            tokio::task::spawn_blocking(move || {
                DISK.write();
                drop(hold);
                DISK.returned.notify_one();
            })
            .await
            .map_err(|e| FileError::Backend(e.to_string()))?;
            DISK.answered.store(true, Ordering::Release);
            Ok(FileInfo {
                name: req.name,
                size: whole.len() as u64,
                modified: std::time::SystemTime::now(),
                metadata: Default::default(),
            })
        }
        async fn get(&self, name: &str) -> Result<rewire_runtime::FileRead, FileError> {
            Err(FileError::NotFound(name.into()))
        }
        async fn list(&self, _: ListRequest) -> Result<rewire_runtime::ListPage, FileError> {
            Ok(rewire_runtime::ListPage::default())
        }
        async fn stat(&self, name: &str) -> Result<FileInfo, FileError> {
            Err(FileError::NotFound(name.into()))
        }
        async fn delete(&self, name: &str) -> Result<(), FileError> {
            Err(FileError::NotFound(name.into()))
        }
    }

    /// The API state of a runtime whose file store `files` writes to the
    /// hung disk, one upload at a time.
    async fn one_upload_at_a_time() -> ApiState {
        use rewire_runtime::config::{parse, validate};
        let config = serde_json::json!({
            "appId": "app",
            "components": {"file": {"files": {"type": "test.upload.hung_disk"}}},
        });
        let file = parse(config.to_string().as_bytes()).unwrap_or_else(|p| panic!("{p}"));
        let registry = rewire_runtime::Registry::collected();
        let config = validate(file, &registry).unwrap_or_else(|p| panic!("{p}"));
        let options = rewire_runtime::RuntimeOptions::default();
        let runtime = rewire_runtime::Runtime::start(config, registry, options)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        ApiState {
            runtime,
            options: Arc::new(crate::ApiOptions {
                max_uploads: 1,
                ..crate::ApiOptions::default()
            }),
            ..ApiState::empty().await
        }
    }

    fn upload(name: &str) -> Request<Body> {
        Request::builder()
            .method(Method::PUT)
            .uri(format!("/v1.0/rewire/file/files/{name}"))
            .body(Body::from("contents"))
            .unwrap_or_else(|e| panic!("{e}"))
    }

    #[tokio::test]
    async fn an_uploads_place_is_kept_until_its_stores_blocking_write_on_a_hung_disk_returns() {
        let state = one_upload_at_a_time().await;
        let mut router = crate::http::router(state.clone());
        // The first upload's write hangs; its client gives up.
        let first = router.call(upload("one.bin"));
        tokio::select! {
            answer = first => panic!("answered on a hung disk: {answer:?}"),
            () = DISK.stuck.notified() => {}
            () = tokio::time::sleep(WITHIN) => panic!("the write never reached the disk"),
        }
        assert!(!DISK.answered.load(Ordering::Acquire));
        // Its handler is gone; its blocking write is not: no place yet.
        let refused = tokio::time::timeout(WITHIN, router.call(upload("two.bin")))
            .await
            .expect("refused at once, never sent to the hung store")
            .unwrap_or_else(|e| match e {});
        assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(state.metrics.uploads().running(), 1);
        // The disk recovers: the write returns and gives the place back.
        DISK.recover();
        tokio::time::timeout(WITHIN, DISK.returned.notified())
            .await
            .expect("the stuck write returns");
        assert_eq!(state.metrics.uploads().running(), 0);
        let admitted = tokio::time::timeout(WITHIN, router.call(upload("three.bin")))
            .await
            .expect("answered")
            .unwrap_or_else(|e| match e {});
        assert_eq!(admitted.status(), StatusCode::OK);
        state.runtime.shutdown().await;
    }
}
