//! [`Refresher`] against testkit's Apollo server.

use std::sync::Arc;
use std::time::Duration;

use rewire_runtime::ComponentKey;
use serde_json::{json, Value};
use testkit::apollo::{ApolloServer, Fault, Route, APP_ID, CLUSTER};

use super::Refresher;
use crate::apollo::namespaces::LiveNamespaces;
use crate::apollo::release_messages::ReleaseMessages;
use crate::apollo::services::{ConfigServices, InstanceSettings};

const PATIENCE: Duration = Duration::from_secs(10);

/// A refresher of `application` on `server`, without backup cache.
async fn refresher(server: &ApolloServer) -> Arc<Refresher> {
    let settings = InstanceSettings {
        app_id: APP_ID.into(),
        cluster: CLUSTER.into(),
        secret: None,
        ip: None,
        request_timeout: PATIENCE,
        long_poll_timeout: Duration::from_secs(5),
        tls: crate::tls::http_config(None).unwrap_or_else(|e| panic!("{e}")),
        tls_configured: false,
    };
    let services = ConfigServices::new(&server.url(), None, Duration::from_secs(60), settings)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let live = Arc::new(LiveNamespaces::new(vec!["application".into()]));
    let key = ComponentKey::new("configuration", "apollo");
    Arc::new(Refresher::new(key, services, live, None, APP_ID, CLUSTER))
}

async fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !condition() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not within {PATIENCE:?}: {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A notification that arrives while the periodic refresh's fetch of the
/// same namespace is under way (and finds a release the poll had not
/// announced, so forgets the namespace's id) still sends its messages
/// with its own fetch: without them a lagging instance may answer that
/// fetch an older release, which would be taken (a rollback).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notification_during_a_periodic_fetch_sends_its_messages() {
    let server = ApolloServer::start().await;
    server.release("application", &[("k", "v1")]);
    let refresher = refresher(&server).await;
    refresher
        .refresh("application")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    server.release("application", &[("k", "v2")]);
    let announced = server
        .current("application")
        .expect("released")
        .notification_id;
    let watch_key = format!("{APP_ID}+{CLUSTER}+application");
    let messages: ReleaseMessages =
        serde_json::from_value(json!({"details": {watch_key.clone(): announced}}))
            .unwrap_or_else(|e| panic!("{e}"));

    server.set_fault(Route::Configs, Some(Fault::Hang));
    let revisit = tokio::spawn({
        let refresher = Arc::clone(&refresher);
        async move { refresher.revisit("application").await }
    });
    eventually("the periodic fetch is held", || {
        server.config_requests("application").len() == 2
    })
    .await;
    let notified = tokio::spawn({
        let refresher = Arc::clone(&refresher);
        async move {
            refresher
                .refresh_notified("application", Some(&messages))
                .await
        }
    });
    // Time for the notified fetch to queue behind the periodic one.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        server.config_requests("application").len(),
        2,
        "fetches of a namespace are serialised"
    );
    server.set_fault(Route::Configs, None);
    for fetch in [revisit, notified] {
        tokio::time::timeout(PATIENCE, fetch)
            .await
            .expect("the fetch ends")
            .expect("the fetch does not panic")
            .unwrap_or_else(|e| panic!("{e}"));
    }

    let requests = server.config_requests("application");
    assert_eq!(requests.len(), 3, "{requests:?}");
    let sent: Option<Value> = requests[2]
        .messages
        .as_deref()
        .map(|text| serde_json::from_str(text).expect("JSON messages"));
    assert_eq!(
        sent.as_ref()
            .and_then(|m| m["details"][&watch_key].as_i64()),
        Some(announced),
        "the notified fetch went without the notification's messages: {sent:?}"
    );
    assert_eq!(
        refresher.live.value("application", "k").as_deref(),
        Some("v2")
    );
}
