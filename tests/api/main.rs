//! The sidecar's Dapr-compatible gRPC and HTTP APIs and the Lifecycle API,
//! plus the Dapr Python SDK as a client. One test binary; one module per API area.
// Test code: a failed setup step should panic where it happens.
#![allow(clippy::unwrap_used)]

mod support;

mod api_connection_first_request;
mod api_connections;
mod api_grpc_auth;
mod api_grpc_configuration;
mod api_grpc_decoded_size;
mod api_grpc_delete_bulk_state;
mod api_grpc_hot_path;
mod api_grpc_lifecycle;
mod api_grpc_lifecycle_deadline;
mod api_grpc_lifecycle_release;
mod api_grpc_lock;
mod api_grpc_metadata_unimplemented;
mod api_grpc_pubsub;
mod api_grpc_secrets;
mod api_grpc_state;
mod api_grpc_state_transaction;
mod api_http_admin;
mod api_http_auth;
mod api_http_configuration;
mod api_http_configuration_subscribe;
mod api_http_health_metadata;
mod api_http_lock;
mod api_http_metrics_status;
mod api_http_panics;
mod api_http_paths;
mod api_http_routes;
mod api_http_secrets;
mod api_http_sequencer_file;
mod api_http_sequencer_head;
mod api_http_sequencer_route;
mod api_http_shutdown;
mod api_http_state;
mod api_http_state_hot_path;
mod api_http_state_transaction;
mod api_limits;
mod api_metadata_extended;
mod api_metadata_subscriptions;
mod api_publish_parity;
mod api_pubsub_broker_switch;
mod api_pubsub_declarative;
mod api_pubsub_handover;
mod api_redis_cluster;
mod api_reply_budget;
mod api_reply_budget_off_hot_path;
mod api_reply_budget_send_buffer;
mod api_reply_budget_writes;
mod api_request_errors;
mod api_request_limits;
mod api_secret_scopes;
mod api_state_bulk_get_metadata;
mod api_state_bytes;
mod api_state_key_separator;
mod api_state_redis_plain;
mod api_topic_stream_requests;
mod api_topic_streams;
mod dapr_python_sdk;
mod layotto_app_callback;
mod layotto_grpc;
mod layotto_grpc_backends;
mod layotto_grpc_blocks;
