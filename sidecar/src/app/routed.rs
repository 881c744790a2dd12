//! [`RoutedSink`]: one subscription's deliveries to the app, each event to
//! the path its routes choose (the first rule whose `match` holds, else
//! the default). The routes can be replaced while the subscription runs,
//! so a reload that only changes routes moves no message.

use std::sync::Arc;
use std::time::Duration;

use reqwest::header::{HeaderName, HeaderValue};
use rewire_runtime::config::SubscriptionRoutes;
use rewire_runtime::DeliveryOutcome;
use tokio::sync::watch;
use tonic::metadata::AsciiMetadataValue;

use super::grpc_app::GrpcApp;
use super::{http_route, AppChannel, AppProtocol, APP_CALL_TIMEOUT};
use crate::auth::APP_TOKEN_HEADER as APP_TOKEN;
use crate::dapr::{EventSink, TopicEvent};

/// The app, as events are delivered to it.
#[derive(Clone)]
pub(super) enum AppTarget {
    /// `POST` of the CloudEvent to `http://ADDRESS/PATH`.
    Http {
        client: reqwest::Client,
        channel: AppChannel,
    },
    /// `AppCallback.OnTopicEvent` (Dapr's, naming the path, or Layotto's).
    Grpc(Box<GrpcApp>),
}

impl AppTarget {
    /// The app's client for `channel`'s protocol (`None`, said in the log,
    /// when it cannot be built).
    pub(super) fn connect(channel: &AppChannel) -> Option<Self> {
        // reqwest (built without a provider of its own) panics at `build`
        // when no rustls provider is installed: a library host that serves
        // the app without `rewire::main()` or the APIs installed none.
        crate::crypto::install_ring_provider();
        let token = app_token_header(channel)?;
        match channel.protocol {
            // Redirects are not followed, as Dapr's app client
            // (`CheckRedirect: http.ErrUseLastResponse`): a `3xx` is the
            // app's answer, and not a `2xx`, so an event is retried, not
            // acknowledged by a login page an auth proxy sent it to (nor
            // posted again to another host). Nor is a proxy from the
            // environment (`HTTP_PROXY`, `ALL_PROXY`, which reqwest reads
            // by default): the app is on this host, and every event and
            // listing would go to the proxy instead.
            // The app token goes on every call made with the client
            // (deliveries, the listing, configuration updates) as a
            // default header: a request's own `dapr-api-token` would win,
            // but a message's metadata never passes one on (`passed_on`).
            AppProtocol::Http => match crate::plain_http::client_builder()
                .default_headers(
                    token
                        .iter()
                        .map(|t| (HeaderName::from_static(APP_TOKEN), t.clone()))
                        .collect(),
                )
                .timeout(APP_CALL_TIMEOUT)
                .redirect(reqwest::redirect::Policy::none())
                .no_proxy()
                .build()
            {
                Ok(client) => Some(Self::Http {
                    client,
                    channel: channel.clone(),
                }),
                Err(err) => {
                    tracing::error!(error = %err, "Cannot build the app's HTTP client.");
                    None
                }
            },
            AppProtocol::Grpc => {
                let endpoint = tonic::transport::Endpoint::from_shared(channel.url("")).map(|e| {
                    // No channel-wide timeout: each call is bounded whole
                    // in `grpc_route` (a delivery by its inbound policy's
                    // timeout, which may be longer than the default); the
                    // pings find a connection whose app went away without
                    // closing it.
                    e.connect_timeout(APP_CALL_TIMEOUT)
                        .http2_keep_alive_interval(APP_CALL_TIMEOUT)
                        .keep_alive_timeout(APP_CALL_TIMEOUT)
                });
                match endpoint {
                    Ok(endpoint) => {
                        let token = match token
                            .map(|t| AsciiMetadataValue::try_from(t.as_bytes()))
                            .transpose()
                        {
                            Ok(token) => token,
                            Err(_) => {
                                tracing::error!(app = %channel.address, "APP_API_TOKEN cannot be sent as gRPC metadata; the app is not called.");
                                return None;
                            }
                        };
                        Some(Self::Grpc(Box::new(
                            GrpcApp::with_token(endpoint.connect_lazy(), token)
                                .listening_on(channel.clone()),
                        )))
                    }
                    Err(err) => {
                        tracing::error!(error = %err, app = %channel.address, "Cannot address the app over gRPC.");
                        None
                    }
                }
            }
        }
    }

    async fn deliver(&self, path: &str, event: &TopicEvent, within: Duration) -> DeliveryOutcome {
        self.deliver_if_reachable(path, event, within)
            .await
            .unwrap_or(DeliveryOutcome::Retry)
    }

    /// [`deliver`](Self::deliver), `None` when the app could not be
    /// reached at all (see [`EventSink::send_if_reachable`]).
    async fn deliver_if_reachable(
        &self,
        path: &str,
        event: &TopicEvent,
        within: Duration,
    ) -> Option<DeliveryOutcome> {
        match self {
            Self::Http { client, channel } => {
                http_route::post_event_if_reachable(client, &channel.url(path), event, within).await
            }
            Self::Grpc(app) => app.deliver_if_reachable(path, event, within).await,
        }
    }

    /// Resolves once the app takes connections on its port again
    /// ([`wait_for_app`](super::wait_for_app)); its caller bounds it.
    async fn reachable(&self) {
        match self {
            Self::Http { channel, .. } => {
                super::wait_for_app(channel, &tokio_util::sync::CancellationToken::new()).await;
            }
            Self::Grpc(app) => app.reachable().await,
        }
    }
}

/// The header every call to the app carries: `dapr-api-token: TOKEN`
/// when `channel` has an app token (Dapr's `APP_API_TOKEN`), marked
/// sensitive. Its bytes are sent as they are, past ASCII too (as Dapr's
/// Go client sends them). A token that cannot be a header value (a
/// control character other than a tab, such as a line feed, or `DEL`) is
/// said in the log, without its value, and the app is not called at all
/// (`None`): calls without it would be refused, or reach an app that
/// expects none. `ApiOptions::from_env` refuses such an `APP_API_TOKEN`
/// at start; this is the backstop for a channel given one in code.
fn app_token_header(channel: &AppChannel) -> Option<Option<HeaderValue>> {
    let Some(token) = channel.app_token() else {
        return Some(None);
    };
    match HeaderValue::from_str(token.expose()) {
        Ok(mut value) => {
            value.set_sensitive(true);
            Some(Some(value))
        }
        Err(_) => {
            tracing::error!(app = %channel.address, "APP_API_TOKEN cannot be sent as a header (it holds a control character, such as a line feed); the app is not called.");
            None
        }
    }
}

/// One subscription's sink: routes, then the app.
pub(super) struct RoutedSink {
    pub(super) app: AppTarget,
    pub(super) routes: watch::Receiver<Arc<SubscriptionRoutes>>,
}

#[tonic::async_trait]
impl EventSink for RoutedSink {
    async fn send(&self, event: &TopicEvent, within: Duration) -> DeliveryOutcome {
        let routes = self.routes.borrow().clone();
        match event.routed_path(&routes) {
            Some(path) => self.app.deliver(path, event, within).await,
            None => {
                // The engine sets such an event aside before each attempt
                // ([`EventSink::takes`]: to the dead-letter topic, else
                // acknowledged, as Dapr); this is only reached when the
                // routes changed in between. Asked again, not answered
                // SUCCESS: the engine finds no route then and sets it
                // aside (acknowledged unsent, it skipped its dead-letter
                // topic and counted as delivered for a hand-over).
                tracing::debug!(id = %crate::dapr::logged(&event.id), topic = %crate::dapr::logged(&event.topic), "No route matches the event any more; asked again.");
                DeliveryOutcome::Retry
            }
        }
    }

    /// [`send`](EventSink::send), `None` when the app could not be reached
    /// at all; an event no route takes is asked again, as there.
    async fn send_if_reachable(
        &self,
        event: &TopicEvent,
        within: Duration,
    ) -> Option<DeliveryOutcome> {
        let routes = self.routes.borrow().clone();
        match event.routed_path(&routes) {
            Some(path) => self.app.deliver_if_reachable(path, event, within).await,
            None => Some(self.send(event, within).await),
        }
    }

    async fn reachable(&self) {
        self.app.reachable().await;
    }

    async fn closed(&self) {
        std::future::pending().await
    }

    /// The routes are taken out of the watch first: reading the event's
    /// members (up to megabytes) under its lock would hold up a reload's
    /// new routes.
    fn takes(&self, event: &TopicEvent) -> bool {
        let routes = self.routes.borrow().clone();
        event.routed_path(&routes).is_some()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use rewire_runtime::SecretString;

    use super::*;

    /// An app behind an auth proxy: `POST /orders` is answered `status`
    /// with `Location: /login`, and `/login` answers `200` (a page, for any
    /// method); how many requests reached `/login`.
    async fn app_redirecting_to_a_login_page(status: u16) -> (AppChannel, Arc<AtomicUsize>) {
        let login_hits = Arc::new(AtomicUsize::new(0));
        let hits = login_hits.clone();
        let app = axum::Router::new()
            .route(
                "/orders",
                axum::routing::post(move || async move {
                    (
                        axum::http::StatusCode::from_u16(status).expect("a status"),
                        [(axum::http::header::LOCATION, "/login")],
                    )
                }),
            )
            .route(
                "/login",
                axum::routing::any(move || {
                    let hits = hits.clone();
                    async move {
                        hits.fetch_add(1, Ordering::SeqCst);
                        "<html>Sign in</html>"
                    }
                }),
            );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port");
        let port = listener.local_addr().expect("an address").port();
        tokio::spawn(async move { axum::serve(listener, app).await });
        (AppChannel::local(port), login_hits)
    }

    fn event() -> TopicEvent {
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

    /// A redirect is the app's answer, not followed (as Dapr's app
    /// client): a `302` to a login page that answers `200` does not
    /// acknowledge the event, and a `307` / `308` does not post it again
    /// elsewhere.
    #[tokio::test]
    async fn a_redirect_is_not_followed_and_the_event_is_retried() {
        crate::tls::install_ring_provider();
        for status in [301, 302, 303, 307, 308] {
            let (channel, login_hits) = app_redirecting_to_a_login_page(status).await;
            let app = AppTarget::connect(&channel).expect("an HTTP client");
            let outcome = app
                .deliver("/orders", &event(), Duration::from_secs(10))
                .await;
            assert_eq!(outcome, DeliveryOutcome::Retry, "answered {status}");
            assert_eq!(
                login_hits.load(Ordering::SeqCst),
                0,
                "the {status} was followed"
            );
        }
    }

    /// An event whose routes a reload changed between the engine's check
    /// and the send (no rule matches, no default) is asked again, so the
    /// engine sets it aside (to the dead-letter topic when one is set);
    /// it was answered SUCCESS: acknowledged unsent, no dead letter.
    #[tokio::test]
    async fn an_event_no_route_takes_when_sent_is_asked_again() {
        let (_routes_now, routes) = watch::channel(Arc::new(SubscriptionRoutes {
            rules: Vec::new(),
            default: None,
        }));
        let sink = RoutedSink {
            app: AppTarget::Http {
                client: testkit::http_client(),
                channel: AppChannel::local(1),
            },
            routes,
        };
        assert!(!sink.takes(&event()), "no route takes it");
        let outcome = sink.send(&event(), Duration::from_secs(10)).await;
        assert_eq!(outcome, DeliveryOutcome::Retry);
    }

    /// The token of [`app_requiring_a_token`].
    const APP_TOKEN_VALUE: &str = "s3cret-app-token";

    /// An app that answers `401` to every request whose `dapr-api-token`
    /// is not [`APP_TOKEN_VALUE`]: `GET /dapr/subscribe` lists one
    /// subscription, `POST /orders` acknowledges, any other path answers
    /// `200`.
    async fn app_requiring_a_token() -> AppChannel {
        let app = axum::Router::new()
            .route(
                "/dapr/subscribe",
                axum::routing::get(|| async {
                    axum::Json(serde_json::json!([
                        {"pubsubname": "bus", "topic": "orders", "route": "/orders"}
                    ]))
                }),
            )
            .fallback(|| async { "" })
            .layer(axum::middleware::from_fn(
                |request: axum::extract::Request, next: axum::middleware::Next| async move {
                    let token = request.headers().get(APP_TOKEN).map(|v| v.as_bytes());
                    if token != Some(APP_TOKEN_VALUE.as_bytes()) {
                        return axum::http::StatusCode::UNAUTHORIZED.into_response();
                    }
                    next.run(request).await
                },
            ));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port");
        let port = listener.local_addr().expect("an address").port();
        tokio::spawn(async move { axum::serve(listener, app).await });
        AppChannel::local(port)
    }

    use axum::response::IntoResponse;

    /// With `APP_API_TOKEN` set, every call to an HTTP app carries it as
    /// `dapr-api-token` (as Dapr): the listing is taken, an event is
    /// delivered (a publisher's own `dapr-api-token` metadata does not
    /// replace it), and a call made with the client, as configuration
    /// updates are posted, carries it too. Before, it was never sent: the
    /// app answered `401` to all.
    #[tokio::test]
    async fn the_app_token_is_sent_on_every_http_call_to_the_app() {
        crate::tls::install_ring_provider();
        let channel = app_requiring_a_token()
            .await
            .with_app_token(Some(SecretString::new(APP_TOKEN_VALUE)));
        let app = AppTarget::connect(&channel).expect("an HTTP client");
        let AppTarget::Http { client, .. } = &app else {
            panic!("an HTTP app");
        };
        use super::super::subscriptions::{ask_once, Listing};
        let listing = ask_once(client, &channel.url("dapr/subscribe")).await;
        let Listing::Answered(listed) = listing else {
            panic!("the listing was refused");
        };
        assert_eq!(listed.len(), 1);
        let message = rewire_runtime::Message {
            topic: "orders".into(),
            data: b"x".to_vec(),
            metadata: std::collections::HashMap::from([(
                "dapr-api-token".to_string(),
                "a publisher's".to_string(),
            )]),
            ..Default::default()
        };
        let event = TopicEvent::of(&message, "bus", "orders");
        let outcome = app
            .deliver("/orders", &event, Duration::from_secs(10))
            .await;
        assert_eq!(outcome, DeliveryOutcome::Success);
        let update = client
            .post(channel.url("configuration/store/key"))
            .send()
            .await
            .expect("answered");
        assert_eq!(update.status(), reqwest::StatusCode::OK);
        // Without the token, the same app refuses the same event.
        let untokened =
            AppTarget::connect(&channel.clone().with_app_token(None)).expect("a client");
        let outcome = untokened
            .deliver("/orders", &event, Duration::from_secs(10))
            .await;
        assert_eq!(outcome, DeliveryOutcome::Retry);
    }

    /// A token that cannot be a header value is refused, the app not
    /// called, and its value never said.
    #[test]
    fn an_app_token_that_is_no_header_value_is_refused() {
        crate::tls::install_ring_provider();
        let channel = AppChannel::local(1).with_app_token(Some(SecretString::new("a\nb")));
        assert!(AppTarget::connect(&channel).is_none());
    }

    /// A token with bytes past ASCII is a header value and gRPC metadata
    /// (sent as it is, as Dapr): the app is called, over either protocol.
    #[tokio::test]
    async fn an_app_token_past_ascii_is_sent_as_it_is() {
        crate::tls::install_ring_provider();
        let channel = AppChannel::local(1).with_app_token(Some(SecretString::new("tökén")));
        let http = AppTarget::connect(&channel);
        assert!(matches!(http, Some(AppTarget::Http { .. })));
        let grpc = AppTarget::connect(&channel.with_protocol(AppProtocol::Grpc));
        assert!(matches!(grpc, Some(AppTarget::Grpc(_))));
    }

    /// Set in the child process the test below runs itself in.
    const PROVIDER_CHILD: &str = "REWIRE_TEST_APP_CLIENT_PROVIDER_CHILD";

    /// The app's HTTP client is built in a process where nothing installed
    /// a rustls provider (a library host serving the app without the
    /// APIs): reqwest, built without one of its own, panicked there; and
    /// where there is no CA bundle (a distroless image): the app is always
    /// `http://`, so no system certificate is read (reqwest's platform
    /// verifier failed the build, "builder error"). Run in a fresh
    /// process, as the provider and the environment are process-wide.
    #[test]
    fn the_apps_http_client_is_built_without_a_provider_installed_before() {
        const NAME: &str =
            "app::routed::tests::the_apps_http_client_is_built_without_a_provider_installed_before";
        if std::env::var_os(PROVIDER_CHILD).is_some() {
            assert!(rustls::crypto::CryptoProvider::get_default().is_none());
            assert!(AppTarget::connect(&AppChannel::local(1)).is_some());
            return;
        }
        let output = testkit::output(
            std::process::Command::new(std::env::current_exe().expect("test binary"))
                .args(["--exact", NAME, "--test-threads=1"])
                .env(PROVIDER_CHILD, "1")
                .env("SSL_CERT_FILE", "/nonexistent/ca.pem")
                .env("SSL_CERT_DIR", "/nonexistent"),
        );
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success() && stdout.contains("1 passed"),
            "the child failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}
