//! [`OpenApiClient`]: writes through Apollo's Open API (the portal), which
//! edits a namespace's items and then releases them.
//!
//! * `PUT {address}/openapi/v1/envs/{env}/apps/{appId}/clusters/{cluster}/namespaces/{ns}/items/{key}?createIfNotExists=true`
//!   with `{"key", "value", "dataChangeLastModifiedBy", "dataChangeCreatedBy"}`;
//! * `DELETE …/items/{key}?operator={user}` (an item already gone is fine);
//! * `POST …/namespaces/{ns}/releases` with `{"releaseTitle", "releasedBy"}`.
//!
//! Every request carries `Authorization: {token}`.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use reqwest::{Method, StatusCode, Url};
use serde_json::json;
use tracing::Instrument;

use super::client::{base_url, join, shown_url};
use super::error::{excerpt, ApolloError};

/// A client of the Open API for one app, cluster and environment.
pub(crate) struct OpenApiClient {
    /// Replaced when the TLS material changes.
    http: std::sync::RwLock<reqwest::Client>,
    address: Url,
    address_text: String,
    token: String,
    user: String,
    env: String,
    app_id: String,
    cluster: String,
    timeout: Duration,
}

/// Everything but the token.
impl fmt::Debug for OpenApiClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenApiClient")
            .field("address", &shown_url(&self.address))
            .field("user", &self.user)
            .field("env", &self.env)
            .finish()
    }
}

/// Settings of an [`OpenApiClient`].
pub(crate) struct OpenApiSettings<'a> {
    pub address: &'a str,
    pub token: &'a str,
    pub user: &'a str,
    pub env: &'a str,
    pub app_id: &'a str,
    pub cluster: &'a str,
    pub timeout: Duration,
    /// TLS for `https://` (rustls, ring).
    pub tls: &'a rustls::ClientConfig,
}

impl OpenApiClient {
    /// A client for `settings`.
    pub(crate) fn new(settings: OpenApiSettings<'_>) -> Result<Self, ApolloError> {
        let address = base_url(settings.address, "open_api_address")?;
        let http = super::client::http_client(settings.tls, settings.timeout)?;
        Ok(Self {
            http: std::sync::RwLock::new(http),
            address_text: format!("Open API `{}` (open_api_address)", shown_url(&address)),
            address,
            token: settings.token.to_string(),
            user: settings.user.to_string(),
            env: settings.env.to_string(),
            app_id: settings.app_id.to_string(),
            cluster: settings.cluster.to_string(),
            timeout: settings.timeout,
        })
    }

    /// Makes the next requests with `tls` (new material); those in
    /// flight finish with the old client.
    pub(crate) fn replace_tls(&self, tls: &rustls::ClientConfig) -> Result<(), ApolloError> {
        let http = super::client::http_client(tls, self.timeout)?;
        *self.http.write().unwrap_or_else(|p| p.into_inner()) = http;
        Ok(())
    }

    /// How long one request may take (`requestTimeoutMs`).
    pub(crate) fn request_timeout(&self) -> Duration {
        self.timeout
    }

    /// Creates or updates `key` of `namespace` (not released yet).
    pub(crate) async fn put_item(
        &self,
        namespace: &str,
        key: &str,
        value: &str,
    ) -> Result<(), ApolloError> {
        let mut url = self.namespace_url(namespace, &["items", key]);
        url.query_pairs_mut()
            .append_pair("createIfNotExists", "true");
        let body = json!({
            "key": key,
            "value": value,
            "dataChangeLastModifiedBy": self.user,
            "dataChangeCreatedBy": self.user,
        });
        self.send(Method::PUT, url, Some(body), false).await
    }

    /// Deletes `key` of `namespace` (not released yet); a missing key is
    /// not an error.
    pub(crate) async fn delete_item(&self, namespace: &str, key: &str) -> Result<(), ApolloError> {
        let mut url = self.namespace_url(namespace, &["items", key]);
        url.query_pairs_mut().append_pair("operator", &self.user);
        self.send(Method::DELETE, url, None, true).await
    }

    /// Releases the items of `namespace`.
    pub(crate) async fn release(&self, namespace: &str) -> Result<(), ApolloError> {
        let url = self.namespace_url(namespace, &["releases"]);
        let millis = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or_default();
        let body = json!({
            "releaseTitle": format!("rewire-{millis}"),
            "releaseComment": "released by rewire",
            "releasedBy": self.user,
        });
        self.send(Method::POST, url, Some(body), false).await
    }

    fn namespace_url(&self, namespace: &str, rest: &[&str]) -> Url {
        let mut segments = vec![
            "openapi",
            "v1",
            "envs",
            &self.env,
            "apps",
            &self.app_id,
            "clusters",
            &self.cluster,
            "namespaces",
            namespace,
        ];
        segments.extend_from_slice(rest);
        join(&self.address, &segments)
    }

    async fn send(
        &self,
        method: Method,
        url: Url,
        body: Option<serde_json::Value>,
        missing_is_fine: bool,
    ) -> Result<(), ApolloError> {
        let path = url.path().to_string();
        let method_name = method_label(&method);
        let http = self.http.read().unwrap_or_else(|p| p.into_inner()).clone();
        let mut request = http
            .request(method, url)
            .timeout(self.timeout)
            .header(reqwest::header::AUTHORIZATION, &self.token);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let transport = |err: reqwest::Error| {
            ApolloError::transport(&self.address_text, &path, &err, self.timeout)
        };
        let response = request
            .send()
            .instrument(super::trace::request_span(method_name, &path))
            .await
            .map_err(transport)?;
        let status = response.status();
        if status.is_success() || (missing_is_fine && status == StatusCode::NOT_FOUND) {
            return Ok(());
        }
        if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
            return Err(ApolloError::Unauthorized {
                server: self.address_text.clone(),
                path,
                app_id: self.app_id.clone(),
                status: status.as_u16(),
                check: "`open_api_token` (and that it may edit and release this namespace)",
            });
        }
        let text = super::client::read_body(response, super::client::MAX_ANSWER_BYTES)
            .await
            .unwrap_or_default();
        Err(ApolloError::Status {
            server: self.address_text.clone(),
            path,
            status: status.as_u16(),
            body: excerpt(&text),
        })
    }
}

/// The method's name for a trace span (one of the few this client sends).
fn method_label(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::PUT => "PUT",
        Method::POST => "POST",
        Method::DELETE => "DELETE",
        _ => "HTTP",
    }
}
