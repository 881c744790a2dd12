//! What the commands that call a running sidecar (`apply`, `status`)
//! share: how long they wait for it, and how they tell why it failed.

use std::error::Error;
use std::ffi::OsString;
use std::time::Duration;

/// The longest wait for a connection (TCP, and TLS where asked for) to the
/// sidecar: an address nobody answers fails in seconds, not minutes.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The longest wait for the status answer, once connected.
pub const STATUS_TIMEOUT: Duration = Duration::from_secs(30);

/// The largest status body read: a real status is kilobytes; a peer
/// streaming without end (not a sidecar, a broken proxy) is cut off here
/// rather than held in memory. (`apply`'s answers are bounded by tonic's
/// 4 MiB message limit.)
pub const STATUS_BODY_LIMIT: usize = 16 * 1024 * 1024;

/// How often `apply` pings the sidecar while it waits for the answer.
pub const PING_EVERY: Duration = Duration::from_secs(2);

/// How soon a ping must be answered: a sidecar that does not (stopped, or
/// not a sidecar at all) is given up on. Generous: a sidecar whose workers
/// a component's init keeps busy answers late.
pub const PING_ANSWERED_WITHIN: Duration = Duration::from_secs(10);

/// The longest wait for an `apply` answer, sent as the call's
/// `grpc-timeout`: the sidecar answers by then ("queued", when its reload
/// is not done).
pub const APPLY_TIMEOUT: Duration = Duration::from_secs(600);

/// The token in the environment variable `name`, read as the sidecar
/// reads it: `None` when unset or empty; an error naming the variable
/// when it is set to something that is not valid UTF-8 (taken for unset,
/// the call would go without the token the user set).
pub fn token_var(name: &str) -> Result<Option<String>, String> {
    token_of(name, std::env::var_os(name))
}

/// [`token_var`] of the value `value` the variable `name` has.
fn token_of(name: &str, value: Option<OsString>) -> Result<Option<String>, String> {
    match value.map(OsString::into_string) {
        None => Ok(None),
        Some(Ok(text)) => Ok(Some(text).filter(|text| !text.is_empty())),
        Some(Err(_)) => Err(format!(
            "the environment variable {name} is set but is not valid UTF-8: a token must be \
             text (unset it, or set it empty, for no token)"
        )),
    }
}

/// `text` with its control characters escaped (`\u{1b}`, `\r`), as
/// `validate` shows a configuration's problems: a name or reason from the
/// sidecar (pushed by anyone with the token, or quoting a backend) must
/// not drive the terminal (an OSC 52 sequence sets the clipboard) nor
/// split a line.
pub fn one_line(text: &str) -> String {
    let mut shown = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() {
            shown.extend(c.escape_default());
        } else {
            shown.push(c);
        }
    }
    shown
}

/// `error` and each of its sources, `outer: inner: …`: the cause
/// (`Connection refused`, a TLS certificate error) that a transport
/// error's own text (`transport error`, `error sending request`) leaves
/// out. A source whose text its outer one already holds is not repeated.
pub fn error_chain(error: &dyn Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// The body of `response`, read a chunk at a time up to `limit` bytes: a
/// larger `Content-Length` is refused before anything is read, a body
/// that grows past `limit` as soon as it does. The error says the limit
/// (`larger than 16 MiB`).
pub async fn body_within(mut response: reqwest::Response, limit: usize) -> Result<Vec<u8>, String> {
    let too_large = || format!("the body is larger than {}", size_text(limit));
    let declared = response.content_length().unwrap_or(0);
    if declared > limit as u64 {
        return Err(format!("{} ({declared} bytes declared)", too_large()));
    }
    let mut body = Vec::with_capacity(usize::try_from(declared).unwrap_or(0));
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|err| format!("reading the body: {}", error_chain(&err)))?
    {
        if body.len() + chunk.len() > limit {
            return Err(too_large());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// `bytes` as text: `16 MiB` when a whole number of MiB, else bytes.
fn size_text(bytes: usize) -> String {
    const MIB: usize = 1024 * 1024;
    if bytes >= MIB && bytes % MIB == 0 {
        format!("{} MiB", bytes / MIB)
    } else {
        format!("{bytes} bytes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A token variable set to bytes that are not UTF-8 is an error naming
    /// it. Before: taken for unset, the call went without the token.
    #[test]
    fn a_token_variable_that_is_not_utf8_is_an_error_naming_it() {
        use std::os::unix::ffi::OsStringExt;
        let bad = OsString::from_vec(vec![0xff, b'a']);
        let refused = token_of("REWIRE_ADMIN_TOKEN", Some(bad)).expect_err("refused");
        assert!(
            refused.contains("REWIRE_ADMIN_TOKEN") && refused.contains("not valid UTF-8"),
            "{refused}"
        );
        assert_eq!(
            token_of("T", Some("s3cret".into())),
            Ok(Some("s3cret".into()))
        );
        assert_eq!(token_of("T", Some(OsString::new())), Ok(None));
        assert_eq!(token_of("T", None), Ok(None));
    }

    #[derive(Debug)]
    struct Wrapped(&'static str, Option<Box<dyn Error + 'static>>);

    impl std::fmt::Display for Wrapped {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }

    impl Error for Wrapped {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            self.1.as_deref()
        }
    }

    #[test]
    fn every_cause_is_told_once() {
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let refused_text = refused.to_string();
        let connect = Wrapped("tcp connect error", Some(Box::new(refused)));
        let error = Wrapped("transport error", Some(Box::new(connect)));
        assert_eq!(
            error_chain(&error),
            format!("transport error: tcp connect error: {refused_text}")
        );
        let repeated = Wrapped(
            "error: bad certificate",
            Some(Box::new(Wrapped("bad certificate", None))),
        );
        assert_eq!(error_chain(&repeated), "error: bad certificate");
    }

    /// Serves one HTTP/1.1 answer of `head` then `body_bytes` bytes of
    /// `x` on a loopback port; returns its URL.
    async fn one_answer(head: String, body_bytes: usize) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/", listener.local_addr().unwrap());
        tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut request = [0u8; 1024];
            let _ = stream.read(&mut request).await;
            let _ = stream.write_all(head.as_bytes()).await;
            let chunk = vec![b'x'; 4096];
            let mut sent = 0;
            while sent < body_bytes {
                let n = chunk.len().min(body_bytes - sent);
                if stream.write_all(&chunk[..n]).await.is_err() {
                    return; // The reader gave up: as it should past the limit.
                }
                sent += n;
            }
        });
        url
    }

    async fn get(url: &str) -> reqwest::Response {
        // Plain HTTP, but reqwest (`rustls-no-provider`) wants a TLS
        // configuration all the same.
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth();
        let client = reqwest::Client::builder()
            .no_proxy()
            .tls_backend_preconfigured(tls)
            .build()
            .unwrap();
        client.get(url).send().await.unwrap()
    }

    /// A body streamed (no `Content-Length`) past the limit is cut off
    /// with an error naming the limit. Before: read whole into memory
    /// (400 MB streamed took the CLI to 858 MB).
    #[tokio::test]
    async fn a_body_streamed_past_the_limit_is_cut_off() {
        let limit = 64 * 1024;
        let head = "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n".to_string();
        let response = get(&one_answer(head, limit + 1).await).await;
        let error = body_within(response, limit)
            .await
            .expect_err("over the limit");
        assert_eq!(error, "the body is larger than 65536 bytes");
        let head = "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n".to_string();
        let response = get(&one_answer(head, limit).await).await;
        assert_eq!(
            body_within(response, limit).await.map(|b| b.len()),
            Ok(limit)
        );
    }

    /// A `Content-Length` over the limit is refused before the body is read.
    #[tokio::test]
    async fn a_declared_length_over_the_limit_is_refused_up_front() {
        let head = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n",
            STATUS_BODY_LIMIT + 1
        );
        let response = get(&one_answer(head, 10).await).await;
        let error = body_within(response, STATUS_BODY_LIMIT)
            .await
            .expect_err("declared");
        assert!(
            error.starts_with("the body is larger than 16 MiB ("),
            "{error}"
        );
    }
}
