//! Integration tests of the components (memory, file, env, redis, etcd,
//! apollo) against real servers started by `testkit`. One test binary.
// Test code: a failed setup step should panic where it happens.
#![allow(clippy::unwrap_used)]

mod common;
mod support;

mod apollo_backup;
mod apollo_errors;
mod apollo_fetch;
mod apollo_long_poll;
mod apollo_open_api;
mod apollo_periodic_refresh;
mod apollo_release_gone;
mod apollo_signature;
mod apollo_tls;
mod component_files;
mod env_secret_store;
mod etcd_auth;
mod etcd_cluster;
mod etcd_compaction;
mod etcd_kv;
mod etcd_large_values;
mod etcd_restart;
mod etcd_sequencer;
mod etcd_sharing;
mod etcd_tls;
mod etcd_watch;
mod extreme_values;
mod file_config_store;
mod file_stores;
mod local_file_secret_store;
mod memory_config_store;
mod memory_lock;
mod memory_state_store;
mod redis_cluster;
mod redis_cluster_ask;
mod redis_cluster_master_down;
mod redis_dynamic;
mod redis_failover;
mod redis_init;
mod redis_lock;
mod redis_pubsub;
mod redis_pubsub_failover;
mod redis_state;
mod redis_state_plain;
mod redis_strong;
mod redis_tls;
mod registry;
mod sequencers;
mod state_transaction;
mod story_etcd_failover;
mod time_limits;
