//! One unary call's bodies, read and written without tonic's codec: the
//! request's one message read whole (or put back for tonic when it is
//! anything else), and an answer of one message followed by
//! `grpc-status: 0`.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use http_body::{Body as _, Frame};
use tonic::body::Body;
use tonic::codegen::http::{HeaderMap, HeaderName, HeaderValue};
use tonic::codegen::Bytes;
use tonic::Status;

/// A gRPC message's prefix: a compression flag and a 4-byte length.
pub(super) const PREFIX: usize = 5;
/// The trailer carrying a call's status code (a header name made once: a
/// name given as text is parsed again on every lookup).
const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");

/// What a request's body held.
pub(super) enum Read {
    /// One uncompressed message, its prefix included, and nothing else.
    One(Bytes),
    /// Anything else, to be read again from the start.
    Other(Replayed),
}

/// Reads `body` while it can be one message of at most `limit` bytes.
pub(super) async fn read_one_message(mut body: Body, limit: usize) -> Result<Read, Status> {
    let mut read = Vec::new();
    while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
        // A request's trailers carry nothing gRPC reads.
        let Ok(data) = frame?.into_data() else {
            continue;
        };
        read.extend_from_slice(&data);
        if read.len() > PREFIX + limit {
            return Ok(Read::Other(Replayed::new(read.into(), body)));
        }
    }
    let read = Bytes::from(read);
    Ok(match read.get(..PREFIX) {
        Some([0, length @ ..]) if declared(length) == Some(read.len() - PREFIX) => Read::One(read),
        _ => Read::Other(Replayed::new(read, Body::empty())),
    })
}

/// The length a message's prefix declares.
fn declared(length: &[u8]) -> Option<usize> {
    let length: [u8; 4] = length.try_into().ok()?;
    usize::try_from(u32::from_be_bytes(length)).ok()
}

/// The body of an answer of `message`: its frame, then `grpc-status: 0`
/// (what tonic's `Status::ok("")` puts in the trailers, without making a
/// status to write it).
pub(super) fn one_message(message: &impl prost::Message) -> Result<Body, Status> {
    let length = message.encoded_len();
    let prefix = u32::try_from(length).map_err(|_| {
        Status::resource_exhausted(format!(
            "the answer of {length} bytes is larger than a gRPC message can be"
        ))
    })?;
    let mut frame = Vec::with_capacity(PREFIX + length);
    frame.push(0);
    frame.extend_from_slice(&prefix.to_be_bytes());
    message.encode_raw(&mut frame);
    let mut trailers = HeaderMap::with_capacity(1);
    trailers.insert(GRPC_STATUS, HeaderValue::from_static("0"));
    Ok(Body::new(OneMessage {
        frame: Some(frame.into()),
        trailers: Some(trailers),
    }))
}

/// An answer's body: one frame, then the trailers.
struct OneMessage {
    frame: Option<Bytes>,
    trailers: Option<HeaderMap>,
}

impl http_body::Body for OneMessage {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let frame = match self.frame.take() {
            Some(data) => Frame::data(data),
            None => match self.trailers.take() {
                Some(trailers) => Frame::trailers(trailers),
                None => return Poll::Ready(None),
            },
        };
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.frame.is_none() && self.trailers.is_none()
    }

    /// Exact: the connection layer charges the answer to its reply budgets
    /// by it (and keeps it from hyper, which would send it as
    /// `content-length`).
    fn size_hint(&self) -> http_body::SizeHint {
        let len = self.frame.as_ref().map_or(0, Bytes::len);
        http_body::SizeHint::with_exact(len as u64)
    }
}

/// A request body whose first bytes were already read: those, then the
/// rest.
pub(super) struct Replayed {
    read: Option<Bytes>,
    rest: Body,
}

impl Replayed {
    pub(super) fn new(read: Bytes, rest: Body) -> Self {
        Self {
            read: Some(read).filter(|read| !read.is_empty()),
            rest,
        }
    }
}

impl http_body::Body for Replayed {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        match self.read.take() {
            Some(read) => Poll::Ready(Some(Ok(Frame::data(read)))),
            None => Pin::new(&mut self.rest).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.read.is_none() && self.rest.is_end_stream()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A body of `chunks`, one data frame each.
    fn body(chunks: &[&[u8]]) -> Body {
        chunks.iter().rev().fold(Body::empty(), |rest, chunk| {
            Body::new(Replayed::new(Bytes::copy_from_slice(chunk), rest))
        })
    }

    /// Every data byte of `body`, and its trailers.
    async fn drain<B>(mut body: B) -> (Vec<u8>, Option<HeaderMap>)
    where
        B: http_body::Body<Data = Bytes> + Unpin,
        B::Error: std::fmt::Debug,
    {
        let (mut data, mut trailers) = (Vec::new(), None);
        while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await
        {
            match frame.expect("frame").into_data() {
                Ok(bytes) => data.extend_from_slice(&bytes),
                Err(frame) => trailers = frame.into_trailers().ok(),
            }
        }
        (data, trailers)
    }

    fn framed(flag: u8, message: &[u8]) -> Vec<u8> {
        let mut framed = vec![flag];
        framed.extend_from_slice(&u32::try_from(message.len()).expect("small").to_be_bytes());
        framed.extend_from_slice(message);
        framed
    }

    #[tokio::test]
    async fn one_uncompressed_message_is_read_whole_across_chunks() {
        let framed = framed(0, b"abcdef");
        let read = read_one_message(body(&[&framed[..3], &framed[3..]]), 64).await;
        assert!(matches!(read, Ok(Read::One(bytes)) if bytes[..] == framed[..]));
    }

    #[tokio::test]
    async fn anything_else_is_replayed_byte_for_byte() {
        let compressed = framed(1, b"abcdef");
        let mut two = framed(0, b"ab");
        two.extend_from_slice(&framed(0, b"cd"));
        let short = framed(0, b"abcdef")[..7].to_vec();
        for bytes in [compressed, two, short, vec![0, 0]] {
            let Ok(Read::Other(replayed)) = read_one_message(body(&[&bytes]), 64).await else {
                panic!("{bytes:?} was taken as one message");
            };
            assert_eq!(drain(replayed).await.0, bytes);
        }
    }

    #[tokio::test]
    async fn a_body_over_the_limit_stops_being_read_and_is_replayed_whole() {
        let framed = framed(0, &[7; 25]);
        let chunks = [&framed[..10], &framed[10..20], &framed[20..]];
        let Ok(Read::Other(replayed)) = read_one_message(body(&chunks), 8).await else {
            panic!("over the limit was taken");
        };
        // Read as far as the second chunk (past 5 + 8 bytes); the third is
        // still in the rest.
        assert_eq!(replayed.read.as_ref().map(Bytes::len), Some(20));
        assert_eq!(drain(replayed).await.0, framed);
    }

    #[tokio::test]
    async fn an_answer_is_one_frame_then_grpc_status_0() {
        let message = prost_types::Duration {
            seconds: 7,
            nanos: 3,
        };
        let body = one_message(&message).expect("small");
        let (data, trailers) = drain(body).await;
        assert_eq!(data, framed(0, &prost::Message::encode_to_vec(&message)));
        let trailers = trailers.expect("trailers");
        assert_eq!(
            trailers.get("grpc-status"),
            Some(&HeaderValue::from_static("0"))
        );
        assert_eq!(trailers.len(), 1);
    }
}
