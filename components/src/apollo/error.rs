//! [`ApolloError`]: why talking to Apollo (config service, Open API) or to
//! the backup cache failed. Messages name the server and never carry the
//! secret or the token.

use std::path::PathBuf;
use std::time::Duration;

/// Why an Apollo operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApolloError {
    /// The metadata cannot work (bad URL, no namespace...).
    #[error("{0}")]
    Config(String),
    /// No answer: connection refused, reset, or timed out.
    #[error("{server} unreachable ({path}): {message}")]
    Unreachable {
        /// The config service or Open API address.
        server: String,
        /// The route asked for (no query).
        path: String,
        /// What went wrong.
        message: String,
    },
    /// The server refused the credentials (access-key signature for the
    /// config service, token for the Open API).
    #[error("{server} rejected the credentials of app `{app_id}` (HTTP {status}) on {path}; check {check}")]
    Unauthorized {
        /// The config service or Open API address.
        server: String,
        /// The route asked for (no query).
        path: String,
        /// The app id the request was for.
        app_id: String,
        /// 401 or 403.
        status: u16,
        /// The metadata field to check.
        check: &'static str,
    },
    /// An unexpected status.
    #[error("{server} answered HTTP {status} on {path}{}", body_suffix(.body))]
    Status {
        /// The config service or Open API address.
        server: String,
        /// The route asked for (no query).
        path: String,
        /// The status code.
        status: u16,
        /// The start of the answer's body, if any.
        body: String,
    },
    /// A 200 whose body is not what the protocol says.
    #[error("{server} answered malformed JSON on {path}: {message}")]
    Malformed {
        /// The config service address.
        server: String,
        /// The route asked for (no query).
        path: String,
        /// What serde said.
        message: String,
    },
    /// An answer larger than the client reads
    /// ([`MAX_ANSWER_BYTES`](super::MAX_ANSWER_BYTES)): not read, and taken
    /// as a malformed answer (retried, the last good configuration kept).
    #[error("{server} answered more than {} on {path}; not read (the answer is malformed or the server misbehaves)", size_text(*.limit))]
    TooLarge {
        /// The config service or meta server address.
        server: String,
        /// The route asked for (no query).
        path: String,
        /// The most bytes read.
        limit: usize,
    },
    /// The backup file could not be read or written.
    #[error("backup cache `{}`: {message}", .path.display())]
    Cache {
        /// The backup file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
}

/// `bytes` in MiB when whole, else in bytes.
fn size_text(bytes: usize) -> String {
    const MIB: usize = 1 << 20;
    if bytes >= MIB && bytes % MIB == 0 {
        format!("{} MiB", bytes / MIB)
    } else {
        format!("{bytes} bytes")
    }
}

fn body_suffix(body: &str) -> String {
    if body.is_empty() {
        String::new()
    } else {
        format!(": {body}")
    }
}

impl ApolloError {
    /// Whether trying again later may help (a rejected credential or a bad
    /// setting will not get better by itself).
    pub fn is_retryable(&self) -> bool {
        !matches!(self, Self::Unauthorized { .. } | Self::Config(_))
    }

    /// Whether the server that answered (or did not) is down, so that
    /// another instance may answer: no connection or answer, or HTTP 5xx.
    pub(crate) fn is_instance_down(&self) -> bool {
        match self {
            Self::Unreachable { .. } => true,
            Self::Status { status, .. } => *status >= 500,
            _ => false,
        }
    }

    /// Whether the server refused the request itself for what it carries:
    /// a parameter it cannot read (400), a request line or headers too
    /// long (414, 431). The same request will be refused again; a shorter
    /// one may not. A 408 or 429 (a gateway limiting the rate) is not: the
    /// same request may pass later.
    pub(crate) fn is_refused_request(&self) -> bool {
        matches!(self, Self::Status { status, .. } if matches!(status, 400 | 414 | 431))
    }

    /// An error for a failed request `err` to `server` on `path`.
    pub(crate) fn transport(
        server: &str,
        path: &str,
        err: &reqwest::Error,
        timeout: Duration,
    ) -> Self {
        let message = if err.is_timeout() {
            format!("no answer within {timeout:?}")
        } else {
            source_chain(err)
        };
        Self::Unreachable {
            server: server.to_string(),
            path: path.to_string(),
            message,
        }
    }
}

/// The sources of `err`, innermost last, without reqwest's URL preamble.
fn source_chain(err: &reqwest::Error) -> String {
    let mut parts = Vec::new();
    let mut source = std::error::Error::source(err);
    while let Some(current) = source {
        let text = current.to_string();
        if !parts.contains(&text) {
            parts.push(text);
        }
        source = current.source();
    }
    if parts.is_empty() {
        if err.is_connect() {
            "connection failed".into()
        } else if err.is_body() || err.is_decode() {
            "the answer's body could not be read".into()
        } else {
            "request failed".into()
        }
    } else {
        parts.join(": ")
    }
}

/// The first characters of a response body, for error messages.
pub(crate) fn excerpt(body: &str) -> String {
    const LIMIT: usize = 200;
    let trimmed = body.trim();
    match trimmed.char_indices().nth(LIMIT) {
        Some((cut, _)) => format!("{}…", &trimmed[..cut]),
        None => trimmed.to_string(),
    }
}

impl From<ApolloError> for rewire_runtime::ComponentError {
    fn from(err: ApolloError) -> Self {
        Self::new(err.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_server_and_status() {
        let err = ApolloError::Unauthorized {
            server: "http://127.0.0.1:8080".into(),
            path: "/configs/a/default/application".into(),
            app_id: "a".into(),
            status: 401,
            check: "`secret`",
        };
        let text = err.to_string();
        assert!(
            text.contains("http://127.0.0.1:8080") && text.contains("401"),
            "{text}"
        );
        assert!(!err.is_retryable());
        let status = ApolloError::Status {
            server: "s".into(),
            path: "/p".into(),
            status: 500,
            body: String::new(),
        };
        assert_eq!(status.to_string(), "s answered HTTP 500 on /p");
        assert!(status.is_retryable());
    }

    /// Only a request refused for what it carries drops the release
    /// messages: a gateway's 408 or 429 keeps them (the notified fetch is
    /// tried again as it was, not at once without them).
    #[test]
    fn only_a_request_refused_for_its_content_counts_as_refused() {
        let answered = |status| ApolloError::Status {
            server: "s".into(),
            path: "/p".into(),
            status,
            body: String::new(),
        };
        for status in [400, 414, 431] {
            assert!(answered(status).is_refused_request(), "{status}");
        }
        for status in [404, 408, 409, 429, 500, 503] {
            assert!(!answered(status).is_refused_request(), "{status}");
        }
    }

    #[test]
    fn excerpts_are_bounded() {
        let long = "x".repeat(1000);
        assert_eq!(excerpt(&long).chars().count(), 201);
        assert_eq!(excerpt(" short "), "short");
    }
}
