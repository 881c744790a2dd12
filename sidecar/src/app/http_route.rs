//! [`HttpRoute`]: an event delivered as a `POST` of its CloudEvent to one
//! route of the app, answered as Dapr reads an app's answer: a `2xx` with
//! no body, a body that is not JSON, no or an empty `status`, or
//! `{"status": "SUCCESS"}` acknowledges; `{"status": "RETRY"}`, any other
//! `status` value, any other status code (or no answer) retries;
//! `{"status": "DROP"}` and `404` drop. The body is read as Go's
//! `encoding/json` decodes Dapr's `AppResponse` from it (see
//! [`AppResponseScanner`]), as it comes and in constant memory: an answer
//! is read to the end of its first JSON value (or less, once nothing
//! after can change its outcome), never held whole; a first value past
//! daprd's 4 MiB body limit acknowledges, as in daprd. The outcome
//! does not wait for what follows; a little of it is taken in the
//! background so that the connection is kept (see [`let_go`]). An answer
//! that fails midway is one Go cannot decode (acknowledges); one still
//! coming at the delivery's deadline retries, as daprd's timed-out
//! delivery does. A `POST` that could not connect to the app at all
//! (nothing listens on its port) is no answer: the engine waits for the
//! app rather than spend an attempt ([`post_event_if_reachable`]).

use std::time::Duration;

use futures_util::FutureExt;
use reqwest::StatusCode;
use rewire_runtime::DeliveryOutcome;

use crate::dapr::{EventSink, TopicEvent};

mod app_response;
#[cfg(test)]
mod unreachable_app;

use app_response::AppResponseScanner;

/// The most of an answer read after its outcome is known (a trailing
/// newline, a `404`'s text), so that its connection is kept when it ends
/// there (see [`let_go`]); an answer longer still is let go unread.
pub(super) const MAX_ANSWER_BYTES: usize = 64 * 1024;

/// Why the body of an app's answer was not taken ([`answer_body`]).
#[derive(Debug, PartialEq, Eq)]
pub(super) enum BodyNotRead {
    /// Larger than the limit: read no further (the connection is let go).
    TooLarge,
    /// It failed midway (a reset, a timeout): why, for the log.
    Failed(String),
}

/// The body of the app's `answer`, read to at most `limit` bytes. A body
/// that fails midway is an error, not an empty body: a listing cut short
/// must be asked again, not read as "no subscriptions".
pub(super) async fn answer_body(
    mut answer: reqwest::Response,
    limit: usize,
) -> Result<Vec<u8>, BodyNotRead> {
    if answer
        .content_length()
        .is_some_and(|length| length > limit as u64)
    {
        return Err(BodyNotRead::TooLarge);
    }
    let mut body = Vec::new();
    loop {
        match answer.chunk().await {
            Ok(Some(chunk)) if body.len() + chunk.len() > limit => {
                return Err(BodyNotRead::TooLarge)
            }
            Ok(Some(chunk)) => body.extend_from_slice(&chunk),
            Ok(None) => return Ok(body),
            Err(err) => return Err(BodyNotRead::Failed(err.without_url().to_string())),
        }
    }
}

/// The most of an answer its outcome is read from, as daprd reads it
/// (its `--max-body-size`, 4 MiB by default, wraps the app's answer): a
/// first value longer than this is one Go's decoder fails on, and daprd
/// acknowledges it. Also bounds the CPU a first value that never ends
/// costs.
const MAX_DECIDING_BYTES: usize = 4 * 1024 * 1024;

/// The outcome a `2xx` `answer` means, read as it comes until decided
/// (see [`AppResponseScanner`]); within the request's own deadline.
async fn read_outcome(answer: reqwest::Response) -> DeliveryOutcome {
    read_outcome_within(answer, MAX_DECIDING_BYTES).await
}

/// [`read_outcome`], deciding from at most `limit` bytes of the answer.
async fn read_outcome_within(mut answer: reqwest::Response, limit: usize) -> DeliveryOutcome {
    let mut scanner = AppResponseScanner::default();
    let mut left = limit;
    loop {
        match answer.chunk().await {
            Ok(Some(chunk)) => {
                let fed = &chunk[..chunk.len().min(left)];
                left -= fed.len();
                if let Some(outcome) = scanner.feed(fed) {
                    let_go(answer);
                    return outcome;
                }
                if left == 0 {
                    // Past daprd's limit, undecided: Go's decode fails.
                    return DeliveryOutcome::Success;
                }
            }
            Ok(None) => return scanner.end(),
            // Not answered within the delivery's deadline.
            Err(err) if err.is_timeout() => return DeliveryOutcome::Retry,
            // Go's decode fails on a body that fails: daprd acknowledges.
            Err(_) => return DeliveryOutcome::Success,
        }
    }
}

/// How long the rest of an answer whose outcome is known is awaited, in
/// the background (see [`let_go`]).
const REST_AWAITED_FOR: Duration = Duration::from_secs(1);

/// Reads the rest of `answer` to its end, up to [`MAX_ANSWER_BYTES`] and
/// for at most [`REST_AWAITED_FOR`], so that its connection is kept for
/// the next delivery when the answer ends soon after its first value (a
/// trailing newline, a last chunk); otherwise the connection is let go.
/// The delivery's outcome does not wait for it: what has not arrived yet
/// is awaited in the background.
fn let_go(mut answer: reqwest::Response) {
    let mut taken = 0;
    // What has arrived, at once: most answers end there.
    loop {
        if taken > MAX_ANSWER_BYTES {
            return;
        }
        match answer.chunk().now_or_never() {
            Some(Ok(Some(chunk))) => taken += chunk.len(),
            Some(Ok(None) | Err(_)) => return,
            None => break,
        }
    }
    tokio::spawn(tokio::time::timeout(REST_AWAITED_FOR, async move {
        while taken <= MAX_ANSWER_BYTES {
            match answer.chunk().await {
                Ok(Some(chunk)) => taken += chunk.len(),
                Ok(None) | Err(_) => return,
            }
        }
    }));
}

/// One route of the app.
pub struct HttpRoute {
    client: reqwest::Client,
    url: String,
}

impl HttpRoute {
    /// Delivers to `url` with `client`. No app token is added: for an app
    /// that requires one (Dapr's `APP_API_TOKEN`), `client` must carry the
    /// `dapr-api-token` header itself (a default header, marked
    /// sensitive), else the app refuses every event and each is retried.
    pub fn new(client: reqwest::Client, url: String) -> Self {
        Self { client, url }
    }
}

/// The outcome an answer's status code means, unless its body says (a
/// `2xx`).
fn code_outcome(status: StatusCode) -> Option<DeliveryOutcome> {
    // As current Dapr's HTTP postman (`ErrMessageDropped`): dropped, so to
    // the dead-letter topic when one is set. (Older releases returned nil
    // there: acknowledged, not dead-lettered.)
    if status == StatusCode::NOT_FOUND {
        return Some(DeliveryOutcome::Drop);
    }
    if !status.is_success() {
        return Some(DeliveryOutcome::Retry);
    }
    None
}

#[tonic::async_trait]
impl EventSink for HttpRoute {
    async fn send(&self, event: &TopicEvent, within: Duration) -> DeliveryOutcome {
        post_event(&self.client, &self.url, event, within).await
    }

    async fn send_if_reachable(
        &self,
        event: &TopicEvent,
        within: Duration,
    ) -> Option<DeliveryOutcome> {
        post_event_if_reachable(&self.client, &self.url, event, within).await
    }

    /// Once the URL's host takes connections on its port (see
    /// [`wait_for_app`](super::wait_for_app)); at once for a URL with
    /// no host or port (the engine's backoff spaces the sends).
    async fn reachable(&self) {
        let Some(address) = listening_address(&self.url) else {
            return;
        };
        let app = super::AppChannel {
            address,
            ..super::AppChannel::local(0)
        };
        super::wait_for_app(&app, &tokio_util::sync::CancellationToken::new()).await;
    }

    async fn closed(&self) {
        std::future::pending().await
    }
}

/// `host:port` of `url`, as [`wait_for_app`](super::wait_for_app) tries
/// it (an IPv6 host in brackets); `None` without a host or a port.
fn listening_address(url: &str) -> Option<String> {
    let url = reqwest::Url::parse(url).ok()?;
    Some(format!(
        "{}:{}",
        url.host_str()?,
        url.port_or_known_default()?
    ))
}

/// Whether `err` (a failure to connect) says nothing listened where the
/// connection went: a refused connection, or no route to the host (an
/// [`std::io::Error`] of that kind in its chain of sources). A failed TLS
/// handshake (an untrusted certificate), a name that does not resolve or
/// a timeout is no such failure: waiting for the port would not mend it.
pub(super) fn nothing_listens(err: &(dyn std::error::Error + 'static)) -> bool {
    use std::io::ErrorKind;
    let mut cause = Some(err);
    while let Some(err) = cause {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            return matches!(
                io.kind(),
                ErrorKind::ConnectionRefused
                    | ErrorKind::NotConnected
                    | ErrorKind::AddrNotAvailable
                    | ErrorKind::HostUnreachable
                    | ErrorKind::NetworkUnreachable
            );
        }
        cause = err.source();
    }
    false
}

/// Whether `url`'s host takes connections on its port now; false for a
/// URL with no host or port. A send that could not connect although the
/// app listens failed on the way (a proxy refusing, a TLS handshake), not
/// for want of the app: it spends an attempt rather than wait for a port
/// that is already open (for ever).
async fn app_listens(url: &str) -> bool {
    match listening_address(url) {
        Some(address) => super::takes_connections(&address).await,
        None => false,
    }
}

/// Delivers `event` as a `POST` of its CloudEvent to `url`; the app's
/// answer (a retry when it does not end `within`, or when the app could
/// not be reached).
pub(super) async fn post_event(
    client: &reqwest::Client,
    url: &str,
    event: &TopicEvent,
    within: Duration,
) -> DeliveryOutcome {
    post_event_if_reachable(client, url, event, within)
        .await
        .unwrap_or(DeliveryOutcome::Retry)
}

/// [`post_event`], `None` when the request could not connect to the app
/// at all (refused, nothing listening, no route to it): nothing of it was
/// sent, so the app cannot have seen the event. A failure once connected
/// (a reset, a timeout, an answer cut short) may follow the app's having
/// taken the event: it is a retry.
pub(super) async fn post_event_if_reachable(
    client: &reqwest::Client,
    url: &str,
    event: &TopicEvent,
    within: Duration,
) -> Option<DeliveryOutcome> {
    // The CloudEvent as it came (see `TopicEvent::body`), as daprd posts it.
    let body = event.body.clone();
    let mut request = client
        .post(url)
        .timeout(within)
        .header("content-type", "application/cloudevents+json");
    // The message's metadata, as daprd's `WithCustomHTTPMetadata` passes
    // it; a name or value that is no valid header is left out.
    for (name, value) in super::callback_call::passed_on(event) {
        if let (Ok(name), Ok(value)) = (
            reqwest::header::HeaderName::from_bytes(name.as_bytes()),
            reqwest::header::HeaderValue::from_str(value),
        ) {
            request = request.header(name, value);
        }
    }
    // `pubsubname` names the subscription's pub/sub, as Dapr's; the
    // publisher's trace goes on to the app, as Dapr passes it, when it is
    // one (see `delivered_trace`). Only valid header values are sent: a
    // field of the event that is not one (a line break in it) must not
    // fail every attempt at the event.
    let (traceparent, tracestate) = crate::telemetry::propagation::delivered_trace(
        Some(&event.field("traceparent")),
        Some(&event.field("tracestate")),
    );
    let headers = [
        ("pubsubname", event.pubsub_name.clone()),
        ("traceparent", traceparent.unwrap_or_default()),
        ("tracestate", tracestate.unwrap_or_default()),
    ];
    for (name, value) in headers {
        if let Ok(value) = reqwest::header::HeaderValue::from_str(&value) {
            if !value.is_empty() {
                request = request.header(name, value);
            }
        }
    }
    let sent = request.body(body).send().await;
    let outcome = match sent {
        Ok(answer) => match code_outcome(answer.status()) {
            Some(outcome) => {
                let_go(answer);
                outcome
            }
            None => read_outcome(answer).await,
        },
        Err(err) if err.is_connect() && nothing_listens(&err) && !app_listens(url).await => {
            tracing::debug!(url = %url, error = %err, "The app could not be reached; the event waits for it.");
            return None;
        }
        Err(err) => {
            tracing::debug!(url = %url, error = %err, "Delivering to the app failed; retried.");
            DeliveryOutcome::Retry
        }
    };
    Some(outcome)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use std::collections::HashMap;

    /// The outcome an app's whole answer means, read at once, and read a
    /// byte at a time: both must agree.
    fn outcome_of(status: StatusCode, body: &[u8]) -> DeliveryOutcome {
        let Some(outcome) = code_outcome(status) else {
            let mut whole = AppResponseScanner::default();
            let at_once = whole.feed(body).unwrap_or_else(|| whole.end());
            let mut bytes = AppResponseScanner::default();
            let by_byte = body
                .iter()
                .find_map(|byte| bytes.feed(&[*byte]))
                .unwrap_or_else(|| bytes.end());
            assert_eq!(at_once, by_byte, "{}", String::from_utf8_lossy(body));
            return at_once;
        };
        outcome
    }

    /// A piece of an app's answer.
    enum Piece {
        Text(&'static [u8]),
        /// This many `x`s.
        Xs(usize),
        /// Nothing more, and the answer never ends.
        Stall,
    }

    /// An app answering one request `200` with `pieces`, chunked; how many
    /// bytes it sent before the client let go, and whether it sent them
    /// all.
    async fn app_answering_in_pieces(
        pieces: Vec<Piece>,
    ) -> (u16, tokio::task::JoinHandle<(usize, bool)>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let served = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.expect("accept");
            let mut head = Vec::new();
            let mut buf = [0u8; 4096];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = socket.read(&mut buf).await.expect("request");
                assert!(n > 0, "the request ended early");
                head.extend_from_slice(&buf[..n]);
            }
            let answer =
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n";
            if socket.write_all(answer).await.is_err() {
                return (0, false);
            }
            let xs = vec![b'x'; 64 * 1024];
            let mut sent = 0;
            for piece in pieces {
                let (bytes, mut left): (&[u8], usize) = match piece {
                    Piece::Text(text) => (text, text.len()),
                    Piece::Xs(n) => (&xs, n),
                    Piece::Stall => std::future::pending().await,
                };
                while left > 0 {
                    let part = &bytes[..left.min(bytes.len())];
                    let mut chunk = format!("{:x}\r\n", part.len()).into_bytes();
                    chunk.extend_from_slice(part);
                    chunk.extend_from_slice(b"\r\n");
                    if socket.write_all(&chunk).await.is_err() {
                        return (sent, false);
                    }
                    sent += part.len();
                    left -= part.len();
                }
            }
            let whole = socket.write_all(b"0\r\n\r\n").await.is_ok();
            (sent, whole)
        });
        (port, served)
    }

    /// An app answering one request `200` with a JSON document saying
    /// `RETRY` padded to `total` bytes, chunked (see
    /// [`app_answering_in_pieces`]).
    pub(in crate::app) async fn app_answering_a_huge_document(
        total: usize,
    ) -> (u16, tokio::task::JoinHandle<(usize, bool)>) {
        let open = br#"{"status":"RETRY","pad":""#;
        let end = br#""}"#;
        app_answering_in_pieces(vec![
            Piece::Text(open),
            Piece::Xs(total - open.len() - end.len()),
            Piece::Text(end),
        ])
        .await
    }

    /// `pieces` delivered to an app answering with them: the outcome, how
    /// many bytes the app sent, whether it sent them all.
    async fn delivered_to_an_app_answering(
        pieces: Vec<Piece>,
        within: Duration,
    ) -> (DeliveryOutcome, usize, bool) {
        let (port, served) = app_answering_in_pieces(pieces).await;
        crate::tls::install_ring_provider();
        let client = reqwest::Client::new();
        let url = format!("http://127.0.0.1:{port}/orders");
        let outcome = tokio::time::timeout(
            Duration::from_secs(20),
            post_event(&client, &url, &plain_event(), within),
        )
        .await
        .expect("answered in time");
        let (sent, whole) = tokio::time::timeout(Duration::from_secs(10), served)
            .await
            .expect("the app saw the client let go")
            .expect("no panic");
        (outcome, sent, whole)
    }

    const MIB: usize = 1024 * 1024;

    #[tokio::test]
    async fn a_huge_first_value_decides_and_what_follows_it_is_not_read() {
        // An app echoing the event back: read whole, as daprd reads it.
        let (outcome, sent, whole) = delivered_to_an_app_answering(
            vec![
                Piece::Text(br#"{"status":"RETRY","echo":""#),
                Piece::Xs(3 * MIB),
                Piece::Text(br#""}"#),
                Piece::Xs(32 * MIB),
            ],
            Duration::from_secs(30),
        )
        .await;
        assert_eq!(outcome, DeliveryOutcome::Retry);
        assert!(
            !whole,
            "what follows the first value was read ({sent} bytes)"
        );
        assert!(sent < 16 * MIB, "{sent} bytes were taken");
    }

    #[tokio::test]
    async fn a_first_value_past_daprds_body_limit_acknowledges_as_daprd_does() {
        let (outcome, _, _) = delivered_to_an_app_answering(
            vec![
                Piece::Text(br#"{"status":"RETRY","echo":""#),
                Piece::Xs(MAX_DECIDING_BYTES),
                Piece::Text(br#""}"#),
            ],
            Duration::from_secs(30),
        )
        .await;
        assert_eq!(outcome, DeliveryOutcome::Success);
    }

    #[tokio::test]
    async fn a_first_value_ending_at_the_limit_still_decides() {
        let said = br#"{"status":"RETRY"}"#;
        let answer = |body: &'static [u8]| reqwest::Response::from(axum::http::Response::new(body));
        let exactly = read_outcome_within(answer(said), said.len()).await;
        assert_eq!(exactly, DeliveryOutcome::Retry);
        let short = read_outcome_within(answer(said), said.len() - 1).await;
        assert_eq!(short, DeliveryOutcome::Success);
    }

    #[tokio::test]
    async fn an_answer_larger_than_64_kib_says_its_status_as_go_decodes_it() {
        let cases: [(&[&'static [u8]], DeliveryOutcome); 4] = [
            (
                &[br#"{"status":"RETRY","echo":""#, br#""}"#],
                DeliveryOutcome::Retry,
            ),
            (
                &[br#"{"echo":""#, br#"","Status":"DROP"}"#],
                DeliveryOutcome::Drop,
            ),
            (
                &[
                    br#"{"status":"RETRY","echo":""#,
                    br#"","status":"SUCCESS"}"#,
                ],
                DeliveryOutcome::Success,
            ),
            // Not JSON at its end: Go's decode fails, daprd acknowledges.
            (
                &[br#"{"status":"RETRY","echo":""#, br#""]"#],
                DeliveryOutcome::Success,
            ),
        ];
        for (texts, expected) in cases {
            let said = format!(
                "{}...{}",
                String::from_utf8_lossy(texts[0]),
                String::from_utf8_lossy(texts[1])
            );
            let (outcome, sent, whole) = delivered_to_an_app_answering(
                vec![Piece::Text(texts[0]), Piece::Xs(MIB), Piece::Text(texts[1])],
                Duration::from_secs(30),
            )
            .await;
            assert_eq!(outcome, expected, "{said}");
            assert!(whole, "{said}: read whole to decide ({sent} bytes)");
        }
    }

    /// An app answering every request on a connection `200` with
    /// `answer` (written at once); how many connections it took.
    async fn app_keeping_connections(
        answer: &'static [u8],
    ) -> (u16, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = accepted.clone();
        tokio::spawn(async move {
            loop {
                let (mut socket, _) = listener.accept().await.expect("accept");
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut held = Vec::new();
                    let mut buf = [0u8; 4096];
                    loop {
                        let Some(end) = held.windows(4).position(|w| w == b"\r\n\r\n") else {
                            let n = socket.read(&mut buf).await.unwrap_or(0);
                            if n == 0 {
                                return;
                            }
                            held.extend_from_slice(&buf[..n]);
                            continue;
                        };
                        let head = String::from_utf8_lossy(&held[..end]).to_ascii_lowercase();
                        let length: usize = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .map_or(0, |v| v.trim().parse().expect("length"));
                        while held.len() < end + 4 + length {
                            let n = socket.read(&mut buf).await.unwrap_or(0);
                            if n == 0 {
                                return;
                            }
                            held.extend_from_slice(&buf[..n]);
                        }
                        held.drain(..end + 4 + length);
                        if socket.write_all(answer).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (port, accepted)
    }

    #[tokio::test]
    async fn the_connection_is_kept_when_the_answer_ends_after_its_first_value() {
        let answers: [&'static [u8]; 2] = [
            // As Go's `json.NewEncoder(w).Encode` answers: a newline follows.
            b"HTTP/1.1 200 OK\r\ncontent-length: 18\r\n\r\n{\"status\":\"DROP\"}\n",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n11\r\n{\"status\":\"DROP\"}\r\n1\r\n\n\r\n0\r\n\r\n",
        ];
        crate::tls::install_ring_provider();
        for answer in answers {
            let (port, accepted) = app_keeping_connections(answer).await;
            let client = reqwest::Client::new();
            let url = format!("http://127.0.0.1:{port}/orders");
            for _ in 0..3 {
                let outcome =
                    post_event(&client, &url, &plain_event(), Duration::from_secs(10)).await;
                assert_eq!(outcome, DeliveryOutcome::Drop);
                // The rest is taken in the background.
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            let connections = accepted.load(std::sync::atomic::Ordering::SeqCst);
            assert_eq!(connections, 1, "{}", String::from_utf8_lossy(answer));
        }
    }

    #[tokio::test]
    async fn an_answer_still_coming_at_the_deadline_retries() {
        let started = std::time::Instant::now();
        let (port, _served) = app_answering_in_pieces(vec![
            Piece::Text(br#"{"status":"SUCCESS","echo":""#),
            Piece::Xs(MIB),
            Piece::Stall,
        ])
        .await;
        crate::tls::install_ring_provider();
        let url = format!("http://127.0.0.1:{port}/orders");
        let outcome = post_event(
            &reqwest::Client::new(),
            &url,
            &plain_event(),
            Duration::from_millis(500),
        )
        .await;
        assert_eq!(outcome, DeliveryOutcome::Retry);
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn answers_read_as_dapr_reads_them() {
        assert_eq!(outcome_of(StatusCode::OK, b""), DeliveryOutcome::Success);
        assert_eq!(
            outcome_of(StatusCode::OK, br#"{"status":"SUCCESS"}"#),
            DeliveryOutcome::Success
        );
        assert_eq!(
            outcome_of(StatusCode::OK, br#"{"status":"retry"}"#),
            DeliveryOutcome::Retry
        );
        assert_eq!(
            outcome_of(StatusCode::OK, br#"{"status":"DROP"}"#),
            DeliveryOutcome::Drop
        );
        // An unknown status is not an acknowledgement.
        assert_eq!(
            outcome_of(StatusCode::OK, br#"{"status":"not_valid"}"#),
            DeliveryOutcome::Retry
        );
        for acknowledging in [&br#"{"status":""}"#[..], b"{}", b"ok", br#"{"status":3}"#] {
            assert_eq!(
                outcome_of(StatusCode::OK, acknowledging),
                DeliveryOutcome::Success,
                "{}",
                String::from_utf8_lossy(acknowledging)
            );
        }
        assert_eq!(
            outcome_of(StatusCode::NOT_FOUND, b""),
            DeliveryOutcome::Drop
        );
        // Dapr's values, as they are: one in other letters is unknown.
        assert_eq!(
            outcome_of(StatusCode::OK, br#"{"status":"drop"}"#),
            DeliveryOutcome::Retry
        );
        assert_eq!(
            outcome_of(StatusCode::OK, br#"{"status":"success"}"#),
            DeliveryOutcome::Retry
        );
        assert_eq!(
            outcome_of(StatusCode::INTERNAL_SERVER_ERROR, b""),
            DeliveryOutcome::Retry
        );
    }

    #[test]
    fn the_status_key_is_matched_in_any_case_as_go_matches_it() {
        // A Go app's untagged `Status` field.
        assert_eq!(
            outcome_of(StatusCode::OK, br#"{"Status":"RETRY"}"#),
            DeliveryOutcome::Retry
        );
        assert_eq!(
            outcome_of(StatusCode::OK, br#"{"STATUS":"DROP"}"#),
            DeliveryOutcome::Drop
        );
        // The last key naming it wins; `null` changes nothing.
        assert_eq!(
            outcome_of(
                StatusCode::OK,
                br#"{"status":"RETRY","Status":"DROP","stAtus":null}"#
            ),
            DeliveryOutcome::Drop
        );
        assert_eq!(
            outcome_of(StatusCode::OK, br#"{"Status":"DROP","status":"SUCCESS"}"#),
            DeliveryOutcome::Success
        );
        assert_eq!(
            outcome_of(StatusCode::OK, br#"{"statuses":"DROP"}"#),
            DeliveryOutcome::Success
        );
        // A status that is not a string fails Go's decode: acknowledged.
        assert_eq!(
            outcome_of(StatusCode::OK, br#"{"status":"RETRY","Status":1}"#),
            DeliveryOutcome::Success
        );
    }

    #[test]
    fn only_the_first_json_value_is_read_as_gos_decoder_reads_it() {
        assert_eq!(
            outcome_of(StatusCode::OK, br#"{"status":"DROP"} x"#),
            DeliveryOutcome::Drop
        );
        assert_eq!(
            outcome_of(
                StatusCode::OK,
                b"{\"status\":\"RETRY\"}\n{\"status\":\"SUCCESS\"}"
            ),
            DeliveryOutcome::Retry
        );
        // A first value cut short is not one.
        assert_eq!(
            outcome_of(StatusCode::OK, br#"{"status":"RETRY""#),
            DeliveryOutcome::Success
        );
    }

    /// An app that records the body and headers of the first request it
    /// gets and answers `SUCCESS`.
    async fn app_recording_the_request() -> (
        u16,
        tokio::sync::oneshot::Receiver<(Vec<u8>, axum::http::HeaderMap)>,
    ) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port");
        let port = listener.local_addr().expect("an address").port();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let tx = std::sync::Arc::new(std::sync::Mutex::new(Some(tx)));
        let app = axum::Router::new().fallback(
            move |headers: axum::http::HeaderMap, body: axum::body::Bytes| async move {
                if let Some(tx) = tx.lock().expect("lock").take() {
                    let _ = tx.send((body.to_vec(), headers));
                }
                axum::Json(serde_json::json!({ "status": "SUCCESS" }))
            },
        );
        tokio::spawn(async move { axum::serve(listener, app).await });
        (port, rx)
    }

    #[tokio::test]
    async fn the_cloud_event_is_posted_as_it_came_with_the_messages_metadata_as_headers() {
        crate::tls::install_ring_provider();
        // A number past 64 bits, a duplicate key: re-serialised, both
        // would change.
        let published = br#"{"specversion":"1.0","id":"e1","source":"s","type":"t","datacontenttype":"application/json","data":{"n":123456789012345678901234567890,"k":1,"k":2}}"#;
        let message = rewire_runtime::Message {
            topic: "orders".into(),
            data: published.to_vec(),
            metadata: HashMap::from([
                ("X-Tenant".to_string(), "acme".to_string()),
                ("dapr-api-token".to_string(), "not passed".to_string()),
                ("content-type".to_string(), "text/evil".to_string()),
                ("bad name".to_string(), "v".to_string()),
                ("multi".to_string(), "line\nvalue".to_string()),
            ]),
            ..Default::default()
        };
        let event = TopicEvent::of(&message, "bus", "orders");
        let (port, request) = app_recording_the_request().await;
        let url = format!("http://127.0.0.1:{port}/orders");
        let outcome = post_event(
            &reqwest::Client::new(),
            &url,
            &event,
            Duration::from_secs(10),
        )
        .await;
        assert_eq!(
            outcome,
            DeliveryOutcome::Success,
            "invalid headers fail nothing"
        );
        let (body, headers) = tokio::time::timeout(Duration::from_secs(10), request)
            .await
            .expect("the app got the request")
            .expect("recorded");
        assert_eq!(body, published, "{}", String::from_utf8_lossy(&body));
        assert_eq!(headers["x-tenant"], "acme");
        assert_eq!(headers["content-type"], "application/cloudevents+json");
        assert_eq!(headers["pubsubname"], "bus");
        assert!(headers.get("dapr-api-token").is_none());
        assert!(headers.get("multi").is_none());
    }

    /// A one-byte plain-text event of topic `orders` on `bus`.
    fn plain_event() -> TopicEvent {
        TopicEvent {
            cloud_event: Default::default(),
            routed: Default::default(),
            id: "e1".into(),
            data_content_type: "text/plain".into(),
            data: b"x".to_vec(),
            data_unreadable: None,
            body: Vec::new(),
            metadata: Default::default(),
            pubsub_name: "bus".into(),
            topic: "orders".into(),
        }
    }

    /// An app that answers `status` after `delay`, on a port of its own.
    async fn app_answering_after(delay: Duration, status: &'static str) -> u16 {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port");
        let port = listener.local_addr().expect("an address").port();
        let app = axum::Router::new().fallback(move || async move {
            tokio::time::sleep(delay).await;
            axum::Json(serde_json::json!({ "status": status }))
        });
        tokio::spawn(async move { axum::serve(listener, app).await });
        port
    }

    #[tokio::test]
    async fn the_given_wait_overrides_the_clients_own_timeout_both_ways() {
        let event = plain_event();
        crate::tls::install_ring_provider();
        let port = app_answering_after(Duration::from_millis(300), "DROP").await;
        let url = format!("http://127.0.0.1:{port}/orders");
        // A client whose own timeout is shorter than the app's 300 ms: a
        // longer wait given (an inbound policy's timeout) wins.
        let short = reqwest::Client::builder()
            .timeout(Duration::from_millis(100))
            .build()
            .expect("a client");
        let outcome = post_event(&short, &url, &event, Duration::from_secs(2)).await;
        assert_eq!(outcome, DeliveryOutcome::Drop, "the app's answer was read");
        // And a shorter one cuts a client that would wait longer.
        let long = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .expect("a client");
        let outcome = post_event(&long, &url, &event, Duration::from_millis(50)).await;
        assert_eq!(outcome, DeliveryOutcome::Retry, "cut before the app's DROP");
    }

    /// A failure wrapping another (as hyper's and tonic's connect errors
    /// wrap the socket's).
    #[derive(Debug)]
    struct Wrapping(std::io::Error);

    impl std::fmt::Display for Wrapping {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("could not connect")
        }
    }

    impl std::error::Error for Wrapping {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    /// Only a refused connection or no route, found down the chain of
    /// sources, says nothing listens (the engine then waits for the app's
    /// port); a TLS handshake failing (rustls' error in an `InvalidData`
    /// I/O error), a name that does not resolve or a timeout does not.
    #[test]
    fn only_a_refused_connection_or_no_route_says_nothing_listens() {
        use std::io::{Error, ErrorKind};
        let wrapped = |kind: ErrorKind| Wrapping(Error::new(kind, "at the socket"));
        for kind in [
            ErrorKind::ConnectionRefused,
            ErrorKind::HostUnreachable,
            ErrorKind::NetworkUnreachable,
            ErrorKind::AddrNotAvailable,
        ] {
            assert!(nothing_listens(&wrapped(kind)), "{kind:?}");
        }
        for kind in [
            ErrorKind::InvalidData,
            ErrorKind::TimedOut,
            ErrorKind::Other,
        ] {
            assert!(!nothing_listens(&wrapped(kind)), "{kind:?}");
        }
        let no_io = std::fmt::Error;
        assert!(!nothing_listens(&no_io), "no socket error at all");
    }
}
