//! Starting the Apollo store: building its clients, the first load of
//! every namespace, and falling back to the backup cache.

use std::sync::Arc;

use rewire_runtime::InitContext;
use tracing::warn;

use super::cache::BackupCache;
use super::error::ApolloError;
use super::namespaces::LiveNamespaces;
use super::open_api::{OpenApiClient, OpenApiSettings};
use super::refresh::Refresher;
use super::services::{ConfigServices, InstanceSettings};
use super::{ApolloConfigStore, Running};
use crate::backoff::Backoff;

/// The most namespaces fetched at once by the first load.
pub(super) const FIRST_LOAD_AT_ONCE: usize = 8;

/// The TLS fields and the material read from them, when TLS is on.
pub(super) type Followed = Option<(crate::tls::ClientTlsFields, crate::tls::ClientTls)>;

impl ApolloConfigStore {
    /// The TLS configuration of both clients: the metadata's CA, client
    /// certificate and key (read now, off the async workers), else the
    /// system's roots (also when every server configured is `http://`: a
    /// meta server may announce `https://` config services).
    /// Also returns the fields and the material read, when TLS is on, to
    /// follow the files among them.
    async fn tls_config(
        &self,
        cx: &InitContext,
    ) -> Result<(rustls::ClientConfig, Followed), ApolloError> {
        let settings = &self.settings;
        let fields = settings.tls_fields(cx.config_dir.as_deref());
        let https = std::iter::once(settings.config_server.as_str())
            .chain(settings.meta_server.as_deref())
            .chain(settings.open_api_address.as_deref())
            .any(|url| url.trim().starts_with("https://"));
        let tls_error = |err: crate::tls::TlsError| ApolloError::Config(err.to_string());
        if fields.insecure_skip_verify {
            warn!(component = %cx.key, "insecureSkipVerify: the Apollo servers' certificates are NOT verified. For tests only.");
        }
        let material = match https || fields != crate::tls::ClientTlsFields::default() {
            true => Some(
                fields
                    .load_within(crate::tls::FILE_READ_DEADLINE)
                    .await
                    .map_err(tls_error)?,
            ),
            false => None,
        };
        let config = crate::tls::http_config(material.as_ref()).map_err(tls_error)?;
        Ok((config, material.map(|material| (fields, material))))
    }

    /// Follows the TLS files (if any are named) while the store runs:
    /// new material makes new clients of the config services, which must
    /// answer a fetch of the first namespace before they are swapped in
    /// (the long poll then polls again on them), and a new Open API
    /// client. Ends when `stop` is cancelled.
    pub(super) fn follow_tls_files(
        cx: &InitContext,
        followed: Followed,
        running: &Running,
        stop: tokio_util::sync::CancellationToken,
    ) {
        let Some((fields, material)) = followed else {
            return;
        };
        let refresher = Arc::downgrade(&running.refresher);
        let open_api = running.open_api.clone();
        crate::tls::follow_files(
            cx.key.to_string(),
            "Apollo",
            fields,
            material,
            stop,
            move |material| {
                let (refresher, open_api) = (refresher.clone(), open_api.clone());
                async move {
                    let Some(refresher) = refresher.upgrade() else {
                        return Err("the store is gone".to_string());
                    };
                    let tls =
                        crate::tls::http_config(Some(&material)).map_err(|e| e.to_string())?;
                    let probe = refresher.live.order().first().cloned().unwrap_or_default();
                    refresher
                        .client
                        .replace_tls(tls.clone(), &probe)
                        .await
                        .map_err(|e| e.to_string())?;
                    if let Some(open_api) = &open_api {
                        open_api.replace_tls(&tls).map_err(|e| e.to_string())?;
                    }
                    Ok(())
                }
            },
        );
    }

    /// Builds the clients for `app_id`.
    pub(super) async fn connect(
        &self,
        cx: &InitContext,
        app_id: &str,
    ) -> Result<(Running, Followed), ApolloError> {
        let settings = &self.settings;
        let namespaces = settings.namespaces();
        if namespaces.is_empty() {
            return Err(ApolloError::Config(
                "metadata field `namespace_name` names no namespace".into(),
            ));
        }
        let fields = settings.tls_fields(cx.config_dir.as_deref());
        if fields.ca_cert.is_none() && !fields.insecure_skip_verify {
            // Read here, off the workers: the clients built next trust
            // them (an announced config service may be `https://`).
            if let Err(err) = crate::tls::system_roots::preload().await {
                warn!(component = %cx.key, "{err}: `https://` Apollo servers are refused.");
            }
        }
        let (tls, followed) = self.tls_config(cx).await?;
        let instance = InstanceSettings {
            app_id: app_id.to_string(),
            cluster: settings.cluster.clone(),
            secret: settings.secret.clone().filter(|s| !s.is_empty()),
            ip: settings.ip.clone(),
            request_timeout: settings.request_timeout(),
            long_poll_timeout: settings.long_poll_timeout(),
            tls: tls.clone(),
            tls_configured: followed.is_some(),
        };
        let client = ConfigServices::new(
            &settings.config_server,
            settings.meta_server.as_deref(),
            settings.meta_refresh_interval(),
            instance,
        )
        .await?;
        let address = settings
            .open_api_address
            .as_deref()
            .filter(|s| !s.trim().is_empty());
        let token = settings.open_api_token.as_deref().filter(|s| !s.is_empty());
        let open_api = match (address, token) {
            (Some(address), Some(token)) => Some(Arc::new(OpenApiClient::new(OpenApiSettings {
                address,
                token,
                user: &settings.open_api_user,
                env: &settings.env,
                app_id,
                cluster: &settings.cluster,
                timeout: settings.request_timeout(),
                tls: &tls,
            })?)),
            (Some(_), None) => {
                return Err(ApolloError::Config(
                    "metadata field `open_api_address` is set but `open_api_token` is not".into(),
                ))
            }
            (None, Some(_)) => {
                return Err(ApolloError::Config(
                    "metadata field `open_api_token` is set but `open_api_address` is not".into(),
                ))
            }
            (None, None) => None,
        };
        let cache = settings.is_backup_config.then(|| {
            BackupCache::new(
                cx.resolve_path(settings.backup_dir()),
                app_id,
                &settings.cluster,
            )
        });
        let live = Arc::new(LiveNamespaces::new(namespaces));
        let refresher = Refresher::new(
            cx.key.clone(),
            client,
            live,
            cache,
            app_id,
            &settings.cluster,
        );
        Ok((
            Running {
                refresher: Arc::new(refresher),
                open_api,
                writing: super::write_turn_of(cx),
                own_writes: Arc::default(),
                _follow: None,
            },
            followed,
        ))
    }

    /// The first load: every namespace from the config service, else from
    /// the backup cache, else retried until the readiness timeout.
    ///
    /// The readiness timeout, counted from `started` (the start of
    /// `init`), bounds it all: each attempt asks for every namespace at
    /// once (at most [`FIRST_LOAD_AT_ONCE`] in flight), asks no more after
    /// one that no instance answered, and is cut short when the budget
    /// runs out — then the backup is served if it can be. A config service
    /// that accepts connections but never answers thus costs at most the
    /// budget, not `requestTimeoutMs` per namespace and instance (which,
    /// with a few namespaces, outlasted the runtime's init limit though a
    /// good backup was there).
    pub(super) async fn first_load(
        &self,
        refresher: &Arc<Refresher>,
        cx: &InitContext,
        started: tokio::time::Instant,
    ) -> Result<(), ApolloError> {
        // Elapsed time against the timeout: no instant arithmetic, so no
        // timeout or wait is too large.
        let mut backoff = Backoff::new(
            self.settings.retry_interval(),
            self.settings.max_retry_interval(),
        );
        loop {
            let budget = cx.ready_timeout.saturating_sub(started.elapsed());
            let attempt = tokio::select! {
                () = cx.shutdown.cancelled() => {
                    return Err(ApolloError::Config("start abandoned".into()));
                }
                attempt = tokio::time::timeout(budget, load_attempt(refresher)) => attempt,
            };
            let err = match attempt {
                Ok(Ok(None)) => return Ok(()),
                Ok(Err(err)) => return Err(err),
                Ok(Ok(Some(err))) => err,
                Err(_) => ApolloError::Unreachable {
                    server: format!(
                        "config service `{}` (config_server)",
                        refresher.client.servers()
                    ),
                    path: "/configs".into(),
                    message: format!(
                        "no answer for every namespace within the readiness timeout ({:?})",
                        cx.ready_timeout
                    ),
                },
            };
            let unusable = match self.serve_backup(refresher, cx, &err).await {
                Ok(true) => return Ok(()),
                Ok(false) => None,
                Err(cache_err) => Some(cache_err),
            };
            let wait = backoff.next_wait();
            if started.elapsed().saturating_add(wait) > cx.ready_timeout {
                let backup = match (&refresher.cache, unusable) {
                    (Some(_), Some(cache_err)) => format!("backup not served: {cache_err}"),
                    (Some(cache), None) => {
                        format!("no backup cache in `{}`", cache.dir().display())
                    }
                    (None, _) => "backup cache off (`is_backup_config` is false)".to_string(),
                };
                return Err(ApolloError::Config(format!(
                    "no answer from config_server within {:?}: {err}; {backup}",
                    cx.ready_timeout
                )));
            }
            warn!(
                component = %cx.key,
                error = %err,
                retry_in_ms = wait.as_millis() as u64,
                "Apollo config service not answering yet."
            );
            tokio::select! {
                () = cx.shutdown.cancelled() => {
                    return Err(ApolloError::Config("start abandoned".into()));
                }
                () = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// Serves the namespaces the service did not answer for from the cache,
    /// if every one of them is there. Returns whether it did; `Err` (also
    /// logged) when a file is there but cannot be served (damaged, or in a
    /// folder another user owns or may write).
    async fn serve_backup(
        &self,
        refresher: &Refresher,
        cx: &InitContext,
        err: &ApolloError,
    ) -> Result<bool, ApolloError> {
        let Some(cache) = &refresher.cache else {
            return Ok(false);
        };
        let mut backups = Vec::new();
        for namespace in refresher.live.unconfirmed() {
            match cache.read(&namespace).await {
                Ok(Some(config)) => backups.push(config),
                Ok(None) => return Ok(false),
                Err(cache_err) => {
                    warn!(component = %cx.key, error = %cache_err, "Apollo backup cache unusable.");
                    return Err(cache_err);
                }
            }
        }
        let names: Vec<String> = backups.iter().map(|c| c.namespace_name.clone()).collect();
        for config in backups {
            refresher.serve_backup(config);
        }
        warn!(
            component = %cx.key,
            error = %err,
            namespaces = %names.join(","),
            dir = %cache.dir().display(),
            "Config service unreachable; serving the backup cache until it answers."
        );
        Ok(true)
    }
}

/// One attempt of the first load: fetches the namespaces not answered for
/// yet, [`FIRST_LOAD_AT_ONCE`] at a time; after a fetch that no instance
/// answered (the service is down or hangs) no other is started, those in
/// flight finish. `Ok(None)` when every one answered; `Ok(Some(err))` with
/// the last retryable error; `Err` on one that is not (a rejected
/// signature). Dropped, it stops the fetches in flight.
async fn load_attempt(refresher: &Arc<Refresher>) -> Result<Option<ApolloError>, ApolloError> {
    let mut waiting = refresher.live.unconfirmed().into_iter();
    let mut fetching = tokio::task::JoinSet::new();
    let mut last_error = None;
    let mut service_down = false;
    loop {
        while fetching.len() < FIRST_LOAD_AT_ONCE && !service_down {
            let Some(namespace) = waiting.next() else {
                break;
            };
            let refresher = Arc::clone(refresher);
            fetching.spawn(async move { refresher.refresh(&namespace).await });
        }
        let Some(done) = fetching.join_next().await else {
            return Ok(last_error);
        };
        match done {
            Ok(Ok(_)) => {}
            Ok(Err(err)) if !err.is_retryable() => return Err(err),
            Ok(Err(err)) => {
                service_down |= err.is_instance_down();
                last_error = Some(err);
            }
            Err(join) if join.is_panic() => std::panic::resume_unwind(join.into_panic()),
            Err(join) => return Err(ApolloError::Config(format!("a fetch was stopped: {join}"))),
        }
    }
}
