//! [`ConfigServiceClient`]: the two routes of Apollo's config service that
//! a client uses.
//!
//! * `GET /configs/{appId}/{cluster}/{namespace}?releaseKey=..&ip=..&messages=..` —
//!   200 with the namespace's released configuration, 304 when
//!   `releaseKey` is still the current release, 404 when the namespace has
//!   no release.
//! * `GET /notifications/v2?appId=..&cluster=..&notifications=[..]` — the
//!   long poll: the service holds it (up to 60 s) until one of the
//!   namespaces has a notification id above the one sent, then answers 200
//!   with the new ids; 304 when nothing happened.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use reqwest::{StatusCode, Url};
use serde::{Deserialize, Serialize};
use tracing::Instrument;

use rewire_runtime::without_credentials;

use super::error::{excerpt, ApolloError};
use super::release_messages::ReleaseMessages;
use super::signing;
use super::value_texts::text_values;
use crate::redacted::shown_addresses;

/// The largest answer read from a config service, meta server or Open
/// API: 16 MiB, the bound of the backup file that keeps a release (see
/// [`crate::component_file`]). Apollo limits an item's value to 20,000
/// characters by default; a namespace this large is a mistake, a
/// misbehaving server or an attack, and is not held in memory: reading
/// stops past the bound and the answer is an [`ApolloError::TooLarge`].
pub const MAX_ANSWER_BYTES: usize = 16 << 20;

/// Why an answer's body was not read.
#[derive(Debug)]
pub(crate) enum BodyError {
    /// More than the limit (announced, or sent).
    TooLarge,
    /// The connection failed while reading.
    Transport(reqwest::Error),
}

/// The body of `response` as text (invalid UTF-8 replaced), reading at
/// most `limit` bytes: a longer answer (by its `Content-Length` or as it
/// comes) is refused without reading the rest.
pub(crate) async fn read_body(
    mut response: reqwest::Response,
    limit: usize,
) -> Result<String, BodyError> {
    if response
        .content_length()
        .is_some_and(|length| length > limit as u64)
    {
        return Err(BodyError::TooLarge);
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(BodyError::Transport)? {
        if chunk.len() > limit.saturating_sub(body.len()) {
            return Err(BodyError::TooLarge);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(match String::from_utf8(body) {
        Ok(text) => text,
        Err(err) => String::from_utf8_lossy(err.as_bytes()).into_owned(),
    })
}

/// One release of a namespace, as the config service sends it (and as the
/// backup cache stores it).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ApolloConfig {
    #[serde(default)]
    pub app_id: String,
    #[serde(default)]
    pub cluster: String,
    pub namespace_name: String,
    /// Key → value; values that are not strings are taken as JSON text,
    /// written as they are read (see [`text_values`]).
    #[serde(deserialize_with = "text_values")]
    pub configurations: BTreeMap<String, String>,
    #[serde(default)]
    pub release_key: String,
}

/// A namespace and the last notification id the client knows of it (-1
/// for none yet). In an answer, `messages` holds the release messages
/// behind the notification (read narrowly, see [`ReleaseMessages`]), sent
/// back with the fetch it calls for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Notification {
    pub namespace_name: String,
    pub notification_id: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub messages: Option<ReleaseMessages>,
}

/// What the config service said about a namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Fetched {
    /// 200: a release other than the one we have.
    Released(ApolloConfig),
    /// 304: the release we have is current.
    Unchanged,
    /// 404: the namespace has no release there (served as empty when
    /// none is held; a release held is kept).
    NotReleased,
}

/// A client of one config service for one app and cluster.
pub(crate) struct ConfigServiceClient {
    http: reqwest::Client,
    server: Url,
    /// `server` without trailing `/`, as configured: tells instances apart
    /// (may hold credentials: never shown).
    address: String,
    /// `address` without credentials, for logs.
    server_text: String,
    /// "config service `{server_text}`", for errors.
    label: String,
    app_id: String,
    cluster: String,
    secret: Option<String>,
    ip: Option<String>,
    request_timeout: Duration,
    long_poll_timeout: Duration,
}

/// Everything but the secret.
impl fmt::Debug for ConfigServiceClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConfigServiceClient")
            .field("server", &self.server_text)
            .field("app_id", &self.app_id)
            .field("cluster", &self.cluster)
            .field("signed", &self.secret.is_some())
            .finish()
    }
}

/// Settings of a [`ConfigServiceClient`].
pub(crate) struct ClientSettings<'a> {
    pub server: &'a str,
    /// The metadata field the server comes from, for errors.
    pub field: &'a str,
    pub app_id: &'a str,
    pub cluster: &'a str,
    pub secret: Option<&'a str>,
    pub ip: Option<&'a str>,
    pub request_timeout: Duration,
    pub long_poll_timeout: Duration,
    /// TLS for `https://` (rustls, ring).
    pub tls: &'a rustls::ClientConfig,
}

/// Parses an `http://` or `https://` base URL (a trailing `/` is
/// ignored), naming `field` in the error (which quotes the URL without its
/// credentials).
pub(crate) fn base_url(text: &str, field: &str) -> Result<Url, ApolloError> {
    let trimmed = text.trim().trim_end_matches('/');
    let url = Url::parse(trimmed).map_err(|err| {
        ApolloError::Config(format!(
            "metadata field `{field}`: `{}` is not a URL: {err}",
            shown_addresses(trimmed)
        ))
    })?;
    match url.scheme() {
        "http" | "https" => Ok(url),
        other => Err(ApolloError::Config(format!(
            "metadata field `{field}`: `{}` must be an http:// or https:// URL, not {other}:",
            shown_addresses(trimmed)
        ))),
    }
}

/// `url` without trailing `/` nor credentials, for logs and errors.
pub(crate) fn shown_url(url: &Url) -> String {
    without_credentials(url.as_str().trim_end_matches('/')).into_owned()
}

/// `base` with `segments` appended, each percent-encoded.
pub(crate) fn join(base: &Url, segments: &[&str]) -> Url {
    let mut url = base.clone();
    if let Ok(mut path) = url.path_segments_mut() {
        path.pop_if_empty().extend(segments);
    }
    url
}

/// An HTTP client speaking TLS with `tls`, connecting within `connect`.
pub(crate) fn http_client(
    tls: &rustls::ClientConfig,
    connect: Duration,
) -> Result<reqwest::Client, ApolloError> {
    reqwest::Client::builder()
        .tls_backend_preconfigured(tls.clone())
        .connect_timeout(connect)
        .build()
        .map_err(|err| ApolloError::Config(format!("cannot build the HTTP client: {err}")))
}

/// The path and query of `url` as they go on the request line.
fn path_with_query(url: &Url) -> String {
    match url.query() {
        Some(query) => format!("{}?{query}", url.path()),
        None => url.path().to_string(),
    }
}

impl ConfigServiceClient {
    /// A client for `settings`.
    pub(crate) fn new(settings: ClientSettings<'_>) -> Result<Self, ApolloError> {
        let server = base_url(settings.server, settings.field)?;
        let http = http_client(settings.tls, settings.request_timeout)?;
        let server_text = shown_url(&server);
        Ok(Self {
            http,
            label: format!("config service `{server_text}` ({})", settings.field),
            address: server.as_str().trim_end_matches('/').to_string(),
            server_text,
            server,
            app_id: settings.app_id.to_string(),
            cluster: settings.cluster.to_string(),
            secret: settings
                .secret
                .filter(|s| !s.is_empty())
                .map(str::to_string),
            ip: settings.ip.map(str::to_string),
            request_timeout: settings.request_timeout,
            long_poll_timeout: settings.long_poll_timeout,
        })
    }

    /// The same client with another TLS configuration (new material).
    pub(crate) fn with_tls(&self, tls: &rustls::ClientConfig) -> Result<Self, ApolloError> {
        Ok(Self {
            http: http_client(tls, self.request_timeout)?,
            server: self.server.clone(),
            address: self.address.clone(),
            server_text: self.server_text.clone(),
            label: self.label.clone(),
            app_id: self.app_id.clone(),
            cluster: self.cluster.clone(),
            secret: self.secret.clone(),
            ip: self.ip.clone(),
            request_timeout: self.request_timeout,
            long_poll_timeout: self.long_poll_timeout,
        })
    }

    /// The config service address, without credentials: for logs.
    pub(crate) fn server(&self) -> &str {
        &self.server_text
    }

    /// The config service address as configured (credentials included):
    /// to tell instances apart, never to show.
    pub(crate) fn address(&self) -> &str {
        &self.address
    }

    /// Fetches `namespace`; `release_key` is the release we hold, if any;
    /// `messages`, the release messages the long poll last brought for it:
    /// a config service whose release cache predates them reloads it
    /// rather than answer an older release, or 304 for a release it has
    /// not seen yet (Apollo's `ConfigServiceWithCache`, as the Java client
    /// uses it).
    pub(crate) async fn fetch(
        &self,
        namespace: &str,
        release_key: Option<&str>,
        messages: Option<&ReleaseMessages>,
    ) -> Result<Fetched, ApolloError> {
        let mut url = join(
            &self.server,
            &["configs", &self.app_id, &self.cluster, namespace],
        );
        {
            let mut query = url.query_pairs_mut();
            if let Some(key) = release_key.filter(|k| !k.is_empty()) {
                query.append_pair("releaseKey", key);
            }
            if let Some(ip) = &self.ip {
                query.append_pair("ip", ip);
            }
            if let Some(messages) = messages.filter(|m| !m.is_empty()) {
                query.append_pair("messages", &messages.query_text());
            }
        }
        if url.query() == Some("") {
            url.set_query(None);
        }
        let (status, body) = self.send(url.clone(), self.request_timeout).await?;
        match status {
            StatusCode::OK => serde_json::from_str::<ApolloConfig>(&body)
                .map(Fetched::Released)
                .map_err(|err| self.malformed(&url, &err)),
            StatusCode::NOT_MODIFIED => Ok(Fetched::Unchanged),
            StatusCode::NOT_FOUND => Ok(Fetched::NotReleased),
            other => Err(self.unexpected(&url, other, &body)),
        }
    }

    /// Long-polls for notifications after `known`: `None` when nothing
    /// changed (304), else the namespaces with a newer notification id.
    pub(crate) async fn poll(
        &self,
        known: &[Notification],
    ) -> Result<Option<Vec<Notification>>, ApolloError> {
        let notifications = serde_json::to_string(known)
            .map_err(|err| ApolloError::Config(format!("cannot encode notifications: {err}")))?;
        let mut url = join(&self.server, &["notifications", "v2"]);
        {
            let mut query = url.query_pairs_mut();
            query.append_pair("appId", &self.app_id);
            query.append_pair("cluster", &self.cluster);
            query.append_pair("notifications", &notifications);
            if let Some(ip) = &self.ip {
                query.append_pair("ip", ip);
            }
        }
        let (status, body) = self.send(url.clone(), self.long_poll_timeout).await?;
        match status {
            StatusCode::OK => serde_json::from_str::<Vec<Notification>>(&body)
                .map(Some)
                .map_err(|err| self.malformed(&url, &err)),
            StatusCode::NOT_MODIFIED => Ok(None),
            other => Err(self.unexpected(&url, other, &body)),
        }
    }

    /// Sends a signed GET of `url`; the status and body of the answer.
    async fn send(&self, url: Url, timeout: Duration) -> Result<(StatusCode, String), ApolloError> {
        let path = url.path().to_string();
        let mut request = self.http.get(url.clone()).timeout(timeout);
        if let Some(secret) = &self.secret {
            let (authorization, timestamp) =
                signing::headers(&self.app_id, &path_with_query(&url), secret);
            request = request
                .header(reqwest::header::AUTHORIZATION, authorization)
                .header(signing::TIMESTAMP_HEADER, timestamp);
        }
        let transport =
            |err: reqwest::Error| ApolloError::transport(&self.label, &path, &err, timeout);
        let response = request
            .send()
            .instrument(super::trace::request_span("GET", &path))
            .await
            .map_err(transport)?;
        let status = response.status();
        if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
            return Err(ApolloError::Unauthorized {
                server: self.label.clone(),
                path,
                app_id: self.app_id.clone(),
                status: status.as_u16(),
                check: if self.secret.is_some() {
                    "`secret` (the app's access key)"
                } else {
                    "`secret`: the app has an access key but none is set"
                },
            });
        }
        let body = read_body(response, MAX_ANSWER_BYTES)
            .await
            .map_err(|err| match err {
                BodyError::Transport(err) => transport(err),
                BodyError::TooLarge => ApolloError::TooLarge {
                    server: self.label.clone(),
                    path: path.clone(),
                    limit: MAX_ANSWER_BYTES,
                },
            })?;
        Ok((status, body))
    }

    fn malformed(&self, url: &Url, err: &serde_json::Error) -> ApolloError {
        ApolloError::Malformed {
            server: self.label.clone(),
            path: url.path().to_string(),
            message: err.to_string(),
        }
    }

    fn unexpected(&self, url: &Url, status: StatusCode, body: &str) -> ApolloError {
        ApolloError::Status {
            server: self.label.clone(),
            path: url.path().to_string(),
            status: status.as_u16(),
            body: excerpt(body),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};
    use std::sync::Arc;

    #[test]
    fn urls_encode_each_segment_and_keep_the_base_path() {
        let base =
            base_url("http://h:8080/apollo/", "config_server").unwrap_or_else(|e| panic!("{e}"));
        let url = join(&base, &["configs", "app id", "default", "a/b"]);
        assert_eq!(
            url.as_str(),
            "http://h:8080/apollo/configs/app%20id/default/a%2Fb"
        );
        let root = base_url("http://h:8080", "config_server").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            join(&root, &["notifications", "v2"]).path(),
            "/notifications/v2"
        );
    }

    #[test]
    fn http_and_https_are_accepted() {
        assert!(base_url("https://h", "config_server").is_ok());
        let err = base_url("ftp://h", "config_server").expect_err("expected an error");
        assert!(err.to_string().contains("`config_server`"), "{err}");
        assert!(base_url("not a url", "config_server").is_err());
    }

    #[test]
    fn bad_urls_are_quoted_without_credentials() {
        for text in [
            "ftp://u:hunter2@h",
            "http://u:hun/ter2@h:port",
            "http://u:hunter2@h:port",
        ] {
            let err = base_url(text, "config_server").expect_err("expected an error");
            assert!(!err.to_string().contains("hunter2"), "{err}");
            assert!(!err.to_string().contains("ter2"), "{err}");
        }
    }

    #[tokio::test]
    async fn labels_and_errors_show_no_credentials() {
        let tls = crate::tls::http_config(None).unwrap_or_else(|e| panic!("{e}"));
        let client = ConfigServiceClient::new(ClientSettings {
            // Nothing listens on port 1: the fetch fails at once.
            server: "http://apollo:hunter2@127.0.0.1:1/",
            field: "config_server",
            app_id: "app",
            cluster: "default",
            secret: None,
            ip: None,
            request_timeout: Duration::from_secs(5),
            long_poll_timeout: Duration::from_secs(5),
            tls: &tls,
        })
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(client.server(), "http://apollo:[redacted]@127.0.0.1:1");
        assert!(!format!("{client:?}").contains("hunter2"), "{client:?}");
        assert_eq!(client.address(), "http://apollo:hunter2@127.0.0.1:1");
        let err = client
            .fetch("application", None, None)
            .await
            .expect_err("nothing listens on port 1");
        assert!(!err.to_string().contains("hunter2"), "{err}");
        assert!(err.to_string().contains("127.0.0.1:1"), "{err}");
    }

    /// A server that answers each connection 200 with `body` (chunked
    /// when `chunked`, else with its `Content-Length`) and counts the bytes
    /// it could send before the client hung up.
    async fn answering(body: Vec<u8>, chunked: bool) -> (String, Arc<AtomicUsize>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let address = format!(
            "http://{}",
            listener.local_addr().unwrap_or_else(|e| panic!("{e}"))
        );
        let sent = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&sent);
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let mut request = [0; 4096];
                let _ = stream.read(&mut request).await;
                let head = match chunked {
                    true => "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_string(),
                    false => format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", body.len()),
                };
                if stream.write_all(head.as_bytes()).await.is_err() {
                    continue;
                }
                for part in body.chunks(1024) {
                    let framed = match chunked {
                        true => {
                            [format!("{:x}\r\n", part.len()).as_bytes(), part, b"\r\n"].concat()
                        }
                        false => part.to_vec(),
                    };
                    if stream.write_all(&framed).await.is_err() {
                        break;
                    }
                    counter.fetch_add(part.len(), AtomicOrdering::SeqCst);
                }
                if chunked {
                    let _ = stream.write_all(b"0\r\n\r\n").await;
                }
            }
        });
        (address, sent)
    }

    async fn get(address: &str) -> reqwest::Response {
        let tls = crate::tls::http_config(None).unwrap_or_else(|e| panic!("{e}"));
        let http = http_client(&tls, Duration::from_secs(5)).unwrap_or_else(|e| panic!("{e}"));
        http.get(address)
            .send()
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }

    #[tokio::test]
    async fn answers_are_read_up_to_the_limit_and_refused_beyond_it() {
        for chunked in [true, false] {
            let (address, _) = answering(vec![b'x'; 4096], chunked).await;
            let text = read_body(get(&address).await, 4096)
                .await
                .unwrap_or_else(|e| panic!("{e:?}"));
            assert_eq!(text.len(), 4096);
            let refused = read_body(get(&address).await, 4095).await;
            assert!(matches!(refused, Err(BodyError::TooLarge)), "{refused:?}");
        }
    }

    #[tokio::test]
    async fn an_endless_answer_is_not_read_to_its_end() {
        // 64 MiB sent in chunks (no length announced), read with a 64 KiB
        // limit: reading stops at once, the rest is never taken in.
        let (address, sent) = answering(vec![b'x'; 64 << 20], true).await;
        let refused = read_body(get(&address).await, 64 << 10).await;
        assert!(matches!(refused, Err(BodyError::TooLarge)), "{refused:?}");
        assert!(sent.load(AtomicOrdering::SeqCst) < 32 << 20);
    }

    #[test]
    fn the_too_large_error_names_the_server_the_route_and_the_bound() {
        let err = ApolloError::TooLarge {
            server: "config service `http://h:8080` (config_server)".into(),
            path: "/configs/a/default/application".into(),
            limit: MAX_ANSWER_BYTES,
        };
        assert_eq!(
            err.to_string(),
            "config service `http://h:8080` (config_server) answered more than 16 MiB on /configs/a/default/application; not read (the answer is malformed or the server misbehaves)"
        );
        assert!(err.is_retryable() && !err.is_instance_down());
    }

    #[test]
    fn configurations_accept_non_string_values() {
        let config: ApolloConfig = serde_json::from_str(
            r#"{"appId":"a","cluster":"default","namespaceName":"application",
                "configurations":{"s":"x","n":5},"releaseKey":"r1"}"#,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            config.configurations.get("n").map(String::as_str),
            Some("5")
        );
        assert_eq!(config.release_key, "r1");
    }

    #[test]
    fn notifications_keep_their_messages_and_send_none() {
        let parsed: Vec<Notification> = serde_json::from_str(
            r#"[{"namespaceName":"application","notificationId":7,"messages":{"details":{"a+default+application":7}}}]"#,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(parsed[0].notification_id, 7);
        assert_eq!(
            parsed[0].messages.as_ref().map(ReleaseMessages::query_text),
            Some(r#"{"details":{"a+default+application":7}}"#.to_string())
        );
        let sent = Notification {
            messages: None,
            ..parsed[0].clone()
        };
        let text = serde_json::to_string(&[sent]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            text,
            r#"[{"namespaceName":"application","notificationId":7}]"#
        );
    }
}
