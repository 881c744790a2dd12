//! Layotto's API over real backends: state and locks on a real
//! redis-server (the same Dapr layout Layotto uses).

use crate::support::grpc::{self, layotto};
use crate::support::sidecar::Sidecar;
use layotto::lock_keep_alive_response::Status as KeepAliveStatus;
use layotto::runtime_client::RuntimeClient;
use rewire::sidecar::ApiOptions;
use testkit::redis::RedisServer;
use tonic::transport::Channel;

async fn runtime(sidecar: &Sidecar) -> RuntimeClient<Channel> {
    RuntimeClient::new(grpc::channel(sidecar.grpc_url()).await)
}

#[tokio::test]
async fn state_and_locks_on_redis() {
    let redis = RedisServer::start().await;
    let config = format!(
        r#"{{"components": {{
            "state": {{"orders": {{"type": "redis", "metadata": {{"redisHost": "{0}"}}}}}},
            "lock": {{"locks": {{"type": "redis", "metadata": {{"redisHost": "{0}"}}}}}}
        }}}}"#,
        redis.addr()
    );
    let sidecar = Sidecar::start(&config, ApiOptions::default()).await;
    let mut client = runtime(&sidecar).await;
    client
        .save_state(layotto::SaveStateRequest {
            store_name: "orders".into(),
            states: vec![layotto::StateItem {
                key: "o1".into(),
                value: b"{\"qty\":2}".to_vec(),
                ..Default::default()
            }],
        })
        .await
        .expect("save");
    let got = client
        .get_state(layotto::GetStateRequest {
            store_name: "orders".into(),
            key: "o1".into(),
            ..Default::default()
        })
        .await
        .expect("get")
        .into_inner();
    assert_eq!(got.data, b"{\"qty\":2}");
    assert_eq!(got.etag, "1", "Dapr's redis layout: the first version is 1");

    let lock = layotto::TryLockRequest {
        store_name: "locks".into(),
        resource_id: "r".into(),
        lock_owner: "alice".into(),
        expire: 2,
    };
    assert!(client.try_lock(lock).await.unwrap().into_inner().success);
    let renewed = client
        .lock_keep_alive(layotto::LockKeepAliveRequest {
            store_name: "locks".into(),
            resource_id: "r".into(),
            lock_owner: "alice".into(),
            expire: 120,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(renewed.status(), KeepAliveStatus::Success);
    // The key's own expiry in redis is the renewed one (no key prefix is
    // configured, so the key is the resource id).
    let ttl = redis.query(&["PTTL", "r"]).await.expect("PTTL");
    let ttl_ms: i64 = ttl[0].parse().expect("a number");
    assert!(ttl_ms > 60_000, "renewed to 120 s, PTTL {ttl_ms}");
    sidecar.stop().await;
}
