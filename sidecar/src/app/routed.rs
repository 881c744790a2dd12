//! [`RoutedSink`]: one subscription's deliveries to the app, each event to
//! the path its routes choose (the first rule whose `match` holds, else
//! the default). The routes can be replaced while the subscription runs,
//! so a reload that only changes routes moves no message.

use std::sync::Arc;
use std::time::Duration;

use rewire_runtime::config::SubscriptionRoutes;
use rewire_runtime::DeliveryOutcome;
use tokio::sync::watch;

use super::grpc_app::GrpcApp;
use super::{http_route, AppChannel, AppProtocol, APP_CALL_TIMEOUT};
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
        match channel.protocol {
            // Redirects are not followed, as Dapr's app client
            // (`CheckRedirect: http.ErrUseLastResponse`): a `3xx` is the
            // app's answer, and not a `2xx`, so an event is retried, not
            // acknowledged by a login page an auth proxy sent it to (nor
            // posted again to another host). Nor is a proxy from the
            // environment (`HTTP_PROXY`, `ALL_PROXY`, which reqwest reads
            // by default): the app is on this host, and every event and
            // listing would go to the proxy instead.
            AppProtocol::Http => match reqwest::Client::builder()
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
                        Some(Self::Grpc(Box::new(GrpcApp::new(endpoint.connect_lazy()))))
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
        match self {
            Self::Http { client, channel } => {
                http_route::post_event(client, &channel.url(path), event, within).await
            }
            Self::Grpc(app) => app.deliver(path, event, within).await,
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

    /// Set in the child process the test below runs itself in.
    const PROVIDER_CHILD: &str = "REWIRE_TEST_APP_CLIENT_PROVIDER_CHILD";

    /// The app's HTTP client is built in a process where nothing installed
    /// a rustls provider (a library host serving the app without the
    /// APIs): reqwest, built without one of its own, panicked there. Run
    /// in a fresh process, as the provider is set once per process.
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
                .env(PROVIDER_CHILD, "1"),
        );
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success() && stdout.contains("1 passed"),
            "the child failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}
