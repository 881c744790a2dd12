//! A clear answer to an oversized request: tonic refuses a message larger
//! than the decoding limit with `OUT_OF_RANGE` and its own wording; callers
//! get `RESOURCE_EXHAUSTED` (what grpc-go, and so Dapr, answers) naming the
//! size, the limit and the option that sets it.

use std::task::{Context, Poll};

use tonic::codegen::http::{Request, Response};
use tonic::codegen::{BoxFuture, Service};
use tonic::server::NamedService;
use tonic::{Code, Status};

/// Wraps a generated server whose decoding limit is `limit` bytes.
#[derive(Debug, Clone)]
pub(super) struct ClearLimit<S> {
    inner: S,
    limit: usize,
}

impl<S> ClearLimit<S> {
    /// `inner`, refusing messages over `limit` bytes with a clear error.
    pub(super) fn new(inner: S, limit: usize) -> Self {
        Self { inner, limit }
    }
}

impl<S: NamedService> NamedService for ClearLimit<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B, R> Service<Request<B>> for ClearLimit<S>
where
    S: Service<Request<B>, Response = Response<R>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let answer = self.inner.call(request);
        let limit = self.limit;
        Box::pin(async move {
            let mut response = answer.await?;
            if let Some(clear) =
                Status::from_header_map(response.headers()).and_then(|s| clearer(&s, limit))
            {
                // A status always fits a header; if not, tonic's stays.
                let _ = clear.add_header(response.headers_mut());
            }
            Ok(response)
        })
    }
}

/// The clear status for tonic's "message too large" one, if it is that.
fn clearer(status: &Status, limit: usize) -> Option<Status> {
    let message = status.message();
    if status.code() != Code::OutOfRange || !message.contains("message length too large") {
        return None;
    }
    let size = message
        .split("found ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse::<u64>().ok());
    let what = match size {
        Some(size) => format!("request message of {size} bytes"),
        None => "request message".to_string(),
    };
    Some(Status::resource_exhausted(format!(
        "{what} is larger than the sidecar accepts: the limit is {limit} bytes (max_request_bytes)"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tonic_size_errors_become_resource_exhausted_with_size_and_limit() {
        let tonic = Status::out_of_range(
            "Error, decoded message length too large: found 5000000 bytes, the limit is: 4194304 bytes",
        );
        let clear = clearer(&tonic, 4_194_304).expect("rewritten");
        assert_eq!(clear.code(), Code::ResourceExhausted);
        assert_eq!(
            clear.message(),
            "request message of 5000000 bytes is larger than the sidecar accepts: the limit is 4194304 bytes (max_request_bytes)"
        );
        assert!(clearer(&Status::out_of_range("other"), 1).is_none());
        assert!(clearer(&Status::internal("message length too large"), 1).is_none());
    }
}
