//! A connection that never starts a request is closed after the
//! first-request limit (10 s), not the idle timeout (120 s): silent
//! connections at the cap lock other clients out only that long, on both
//! listeners.

use crate::support::{grpc, sidecar};

use std::time::{Duration, Instant};

use rewire::sidecar::ApiOptions;
use sidecar::Sidecar;
use tokio::net::TcpStream;

const CONFIG: &str = r#"{"components": {"state": {"orders": {"type": "memory"}}}}"#;

/// The first-request limit, with room for a slow machine.
const SERVED_WITHIN: Duration = Duration::from_secs(15);

#[tokio::test]
async fn silent_connections_at_the_cap_free_their_slots_after_the_first_request_limit() {
    let options = ApiOptions {
        max_connections: 2,
        ..ApiOptions::default()
    };
    let sidecar = Sidecar::start(CONFIG, options).await;
    let mut silent = Vec::new();
    for addr in [sidecar.http_addr, sidecar.grpc_addr] {
        for _ in 0..2 {
            silent.push(TcpStream::connect(addr).await.unwrap());
        }
    }
    let started = Instant::now();
    let http = async {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_millis(500))
            .build()
            .unwrap();
        let url = format!("{}/v1.0/healthz", sidecar.http_url());
        let served = tokio::time::timeout(SERVED_WITHIN, async {
            loop {
                if let Ok(response) = client.get(&url).send().await {
                    return response.status();
                }
            }
        })
        .await
        .expect("HTTP: silent connections kept both slots");
        assert!(served.is_success(), "{served}");
        started.elapsed()
    };
    let grpc = async {
        let call = async {
            let mut client = grpc::dapr_client(sidecar.grpc_url()).await;
            client.get_metadata(grpc::dapr::GetMetadataRequest {}).await
        };
        let answered = tokio::time::timeout(SERVED_WITHIN, call)
            .await
            .expect("gRPC: silent connections kept both slots");
        assert!(answered.is_ok(), "{answered:?}");
        started.elapsed()
    };
    let (http_after, grpc_after) = tokio::join!(http, grpc);
    // Served once the silent ones went, not before: the cap held.
    for (listener, after) in [("HTTP", http_after), ("gRPC", grpc_after)] {
        assert!(
            after >= Duration::from_secs(5),
            "{listener} after {after:?}"
        );
    }
    drop(silent);
    sidecar.stop().await;
}
