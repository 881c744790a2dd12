//! Scenario tests of the runtime: start-up, reloads, triggers, faults and
//! failover stories, secret hygiene. One test binary; one module per scenario.
// Test code: a failed setup step should panic where it happens.
#![allow(clippy::unwrap_used)]

mod support;

mod fault_init_hang;
mod fault_redis_bad_switch;
mod fault_redis_restart;
mod handle_borrow;
mod hardening;
mod panic_redaction;
mod reload_add;
mod reload_apply_timeout;
mod reload_cancelled;
mod reload_change_ref;
mod reload_change_type;
mod reload_close_faults;
mod reload_dependents;
mod reload_in_place;
mod reload_in_place_commit;
mod reload_invalid;
mod reload_lossless;
mod reload_memory_data;
mod reload_no_change;
mod reload_rebuild;
mod reload_remove;
mod reload_rollback_init;
mod reload_rollback_readiness;
mod reload_sequencer;
mod reload_subscription;
mod reload_transitive;
mod resiliency_redis;
mod secret_hygiene;
mod slow_subscriber;
mod start_concurrency;
mod start_failure;
mod start_order;
mod status_readiness;
mod story_apollo_instances;
mod story_etcd_cluster;
mod story_redis_failover;
mod trigger_file;
mod trigger_overlay;
mod trigger_overlay_rejected;
mod trigger_push;
mod trigger_watched_ref;
