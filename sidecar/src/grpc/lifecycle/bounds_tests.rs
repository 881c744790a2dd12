//! What a push can make the sidecar hold or answer is bounded by the push,
//! not multiplied by it: refs per push, the reasons of an answer, and the
//! backlog charged for a push as parsed.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use prost::Message;
use tonic::{Code, Request};

use rewire_runtime::config::validate;
use rewire_runtime::prelude::async_trait;
use rewire_runtime::{Component, ComponentError, InitContext, Registry, Runtime, RuntimeOptions};

use super::super::lifecycle_patch::{MAX_PROBLEMS, MAX_REFS_PER_KIND};
use super::super::lifecycle_wait::{MAX_PENDING_BYTES, MAX_PENDING_PUSHES};
use super::*;

/// Set while a holder's `init` is to wait (its reload with it).
static HOLDING: AtomicBool = AtomicBool::new(false);
/// Set once a holder's `init` is waiting.
static HELD: AtomicBool = AtomicBool::new(false);

/// A worker whose `init` waits while [`HOLDING`] is set (30 s at most).
#[derive(rewire_runtime::Component, Default)]
#[component(kind = "worker", type = "test.lifecycle.holder")]
struct Holder {}

#[async_trait]
impl Component for Holder {
    async fn init(&mut self, _cx: &InitContext) -> Result<(), ComponentError> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while HOLDING.load(Ordering::SeqCst) && tokio::time::Instant::now() < deadline {
            HELD.store(true, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(())
    }
}

/// A worker that does nothing.
#[derive(rewire_runtime::Component, Default)]
#[component(kind = "worker", type = "test.lifecycle.idle")]
struct Idle {}

#[async_trait]
impl Component for Idle {}

/// The Lifecycle API over a runtime of the components collected here.
pub(super) async fn api() -> (LifecycleApi, ApiState) {
    let registry = Registry::collected();
    let config = validate(Default::default(), &registry).unwrap_or_else(|p| panic!("{p}"));
    let runtime = Runtime::start(config, registry, RuntimeOptions::default())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let state = ApiState {
        runtime,
        ..ApiState::empty().await
    };
    (
        LifecycleApi::new(state.clone(), Duration::from_secs(45)),
        state,
    )
}

pub(super) fn push(config: pb::ComponentConfig, within: &str) -> Request<pb::DynamicConfiguration> {
    let mut request = Request::new(pb::DynamicConfiguration {
        component_config: Some(config),
        based_on_generation: None,
    });
    let timeout = within.parse().expect("ascii");
    request.metadata_mut().insert("grpc-timeout", timeout);
    request
}

pub(super) fn component(kind: &str, name: &str, type_name: &str) -> pb::ComponentConfig {
    pb::ComponentConfig {
        kind: kind.into(),
        name: name.into(),
        r#type: type_name.into(),
        ..pb::ComponentConfig::default()
    }
}

#[tokio::test]
async fn a_push_giving_more_refs_than_a_push_may_is_refused_naming_the_field() {
    let state = ApiState::empty().await;
    let api = LifecycleApi::new(state.clone(), Duration::from_secs(45));
    // 2 bytes each on the wire: 200,000 in 400 KB (2 M fit in 4 MiB).
    let mut config = component("state", "s", "memory");
    config.secret_refs = vec![pb::SecretRef::default(); 200_000];
    let answer = api.apply_configuration(push(config, "10S")).await;
    match answer {
        Err(refused) => {
            assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
            let message = refused.message();
            assert!(
                message.contains("state/s")
                    && message.contains("`secret_refs` gives 200000 refs")
                    && message.contains(&MAX_REFS_PER_KIND.to_string()),
                "names the component, the field and the limit: {message}"
            );
        }
        Ok(nack) => panic!(
            "answered a NACK of {} bytes for a 400 KB push",
            nack.get_ref().encoded_len()
        ),
    }
    state.runtime.shutdown().await;
}

#[tokio::test]
async fn a_push_with_more_problems_than_an_answer_gives_reports_the_first_and_counts_the_rest() {
    let state = ApiState::empty().await;
    let api = LifecycleApi::new(state.clone(), Duration::from_secs(45));
    let mut config = component("state", "s", "memory");
    config.secret_refs = vec![pb::SecretRef::default(); MAX_REFS_PER_KIND];
    let nack = api
        .apply_configuration(push(config, "10S"))
        .await
        .expect("a NACK")
        .into_inner();
    assert!(!nack.accepted);
    assert_eq!(
        nack.errors.len(),
        MAX_PROBLEMS + 1,
        "{} reasons",
        nack.errors.len()
    );
    assert!(nack.errors[0].starts_with("state/s: secret_refs[0]: `store`, `name`, `key`"));
    assert_eq!(
        nack.errors[MAX_PROBLEMS],
        format!(
            "state/s: … and {} more problems",
            MAX_REFS_PER_KIND - MAX_PROBLEMS
        )
    );
    assert!(
        nack.encoded_len() < 8 * 1024,
        "{} bytes",
        nack.encoded_len()
    );
    state.runtime.shutdown().await;
}

#[tokio::test]
async fn a_push_the_runtime_finds_many_problems_in_gets_a_bounded_answer() {
    let (api, state) = api().await;
    // Well-formed refs, so the push reaches the runtime's validation: each
    // names a store that is not declared.
    let mut config = component("worker", "w", "test.lifecycle.holder");
    config.secret_refs = (0..MAX_REFS_PER_KIND)
        .map(|i| pb::SecretRef {
            store: format!("missing{i}"),
            name: "n".into(),
            key: format!("k{i}"),
            ..pb::SecretRef::default()
        })
        .collect();
    let nack = api
        .apply_configuration(push(config, "10S"))
        .await
        .expect("a NACK")
        .into_inner();
    assert!(!nack.accepted);
    assert_eq!(nack.outcome, "rejected");
    assert_eq!(
        nack.errors.len(),
        MAX_REASONS + 1,
        "{} reasons, {} bytes",
        nack.errors.len(),
        nack.encoded_len()
    );
    assert!(nack.errors[0].contains("worker/w"), "{:?}", nack.errors[0]);
    assert!(
        nack.errors[MAX_REASONS].starts_with("… and "),
        "{:?}",
        nack.errors[MAX_REASONS]
    );
    assert!(
        nack.encoded_len() < 16 * 1024,
        "{} bytes",
        nack.encoded_len()
    );
    state.runtime.shutdown().await;
}

#[test]
fn an_answer_gives_the_first_reasons_scrubbed_and_cut_then_counts_the_rest() {
    let reasons = (0..100_000).map(|i| format!("state/s: problem {i} hunter2"));
    let kept = bounded_reasons(reasons, |r| r.replace("hunter2", "***"));
    assert_eq!(kept.len(), MAX_REASONS + 1);
    assert_eq!(kept[0], "state/s: problem 0 ***");
    assert_eq!(
        kept[MAX_REASONS],
        format!("… and {} more", 100_000 - MAX_REASONS)
    );
    let long = bounded_reasons(
        [format!("state/s: {}", "x".repeat(100_000))],
        str::to_string,
    );
    assert!(
        long[0].len() < 1100 && long[0].contains('…'),
        "{}",
        long[0].len()
    );
}

#[tokio::test]
async fn pushes_held_behind_a_reload_are_charged_as_parsed() {
    let (api, state) = api().await;
    let api = std::sync::Arc::new(api);
    HOLDING.store(true, Ordering::SeqCst);
    let holding = {
        let api = api.clone();
        let config = component("worker", "holder", "test.lifecycle.holder");
        tokio::spawn(async move { api.apply_configuration(push(config, "20S")).await })
    };
    let started = std::time::Instant::now();
    while !HELD.load(Ordering::SeqCst) {
        assert!(started.elapsed() < Duration::from_secs(10), "never held");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // 1 MiB of text parses into 512 K values of 32 bytes (16–32 MiB):
    // at 1 MiB each, 63 would be taken before the 64 MiB budget refused one.
    let zeros = vec!["0"; 512 * 1024].join(",");
    let mut taken = 0;
    let refused = loop {
        let mut config = component("state", format!("big{taken}").as_str(), "memory");
        config.metadata_json = format!(r#"{{"a":[{zeros}]}}"#);
        match api.apply_configuration(push(config, "100m")).await {
            Ok(answer) => {
                assert_eq!(answer.get_ref().outcome, "queued", "{answer:?}");
                taken += 1;
            }
            Err(refused) => break refused,
        }
        assert!(taken < 64, "64 pushes of 1 MiB text held, never refused");
    };
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    let each = 2 * 1024 * 1024 + 512 * 1024 * 2 * std::mem::size_of::<serde_json::Value>();
    assert_eq!(
        taken,
        MAX_PENDING_BYTES / each,
        "refused at the parsed budget"
    );
    assert!(refused.message().contains("(parsed)"), "{refused:?}");
    HOLDING.store(false, Ordering::SeqCst);
    let _ = holding.await;
    state.runtime.shutdown().await;
}

#[tokio::test]
async fn a_push_named_in_many_lines_gets_one_line_reasons_and_a_small_answer() {
    let state = ApiState::empty().await;
    let api = LifecycleApi::new(state.clone(), Duration::from_secs(45));
    // 32 lines of 1 KiB in a name, and 1,000 refs missing their fields:
    // 33 reasons of 32 lines each (1 MB) before.
    let name = format!("{}\n", "x".repeat(1000)).repeat(32);
    let mut config = component("state", &name, "memory");
    config.secret_refs = vec![pb::SecretRef::default(); MAX_REFS_PER_KIND];
    let request = push(config, "10S");
    let pushed = request.get_ref().encoded_len();
    let nack = api
        .apply_configuration(request)
        .await
        .expect("a NACK")
        .into_inner();
    assert_eq!(nack.errors.len(), MAX_PROBLEMS + 1);
    assert!(
        nack.errors.iter().all(|e| !e.contains(['\n', '\r'])),
        "the first reason has {} lines",
        nack.errors[0].lines().count()
    );
    assert!(
        nack.encoded_len() <= pushed.min(64 * 1024),
        "{} bytes answered to a {pushed}-byte push",
        nack.encoded_len()
    );
    assert!(nack.errors[0].ends_with("secret_refs[0]: `store`, `name`, `key` must not be empty"));
    state.runtime.shutdown().await;
}

#[test]
fn an_answer_of_many_long_lined_reasons_stays_small() {
    let reason = format!("state/s: {}\n", "x".repeat(1000)).repeat(32);
    let kept = bounded_reasons(vec![reason; 100], str::to_string);
    let bytes: usize = kept.iter().map(String::len).sum();
    assert!(
        bytes <= 64 * 1024,
        "{bytes} bytes in {} reasons",
        kept.len()
    );
}

#[tokio::test]
async fn a_malformed_push_is_answered_at_once_when_the_backlog_is_full() {
    let state = ApiState::empty().await;
    let api = LifecycleApi::new(state.clone(), Duration::from_secs(45));
    let _full: Vec<_> = (0..MAX_PENDING_PUSHES)
        .map(|_| api.pushes.admit(1).expect("room"))
        .collect();
    for text in ["{", "[0]"] {
        let mut config = component("state", "s", "memory");
        config.metadata_json = text.into();
        let nack = api
            .apply_configuration(push(config, "10S"))
            .await
            .unwrap_or_else(|refused| panic!("{text:?}: not retryable: {refused:?}"))
            .into_inner();
        assert!(!nack.accepted);
        assert_eq!(nack.outcome, "rejected");
        assert!(
            nack.errors[0].starts_with("state/s: metadata_json: "),
            "{:?}",
            nack.errors
        );
    }
    let mut config = component("state", "s", "memory");
    config.secret_refs = vec![pb::SecretRef::default()];
    let nack = api.apply_configuration(push(config, "10S")).await;
    assert_eq!(
        nack.map(|n| n.into_inner().outcome).ok().as_deref(),
        Some("rejected")
    );
    let well_formed = component("state", "s", "memory");
    let busy = api.apply_configuration(push(well_formed, "10S")).await;
    assert_eq!(busy.err().map(|s| s.code()), Some(Code::ResourceExhausted));
    state.runtime.shutdown().await;
}

/// A push the sidecar's shutdown cuts short (or refuses, its reloads
/// stopped) is `UNAVAILABLE` marked `RELOAD_CUT_SHORT`: `rewire apply`
/// tells it (nothing in force) from a proxy's or a connection's
/// `UNAVAILABLE`, whose outcome is unknown. Before: unmarked.
#[tokio::test]
async fn a_push_cut_short_by_shutdown_is_marked_so() {
    use tonic_types::StatusExt;
    let (api, state) = api().await;
    state.runtime.stop_reloads();
    let refused = api
        .apply_configuration(push(component("state", "s", "memory"), "10S"))
        .await
        .expect_err("refused once the reloads are stopped");
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    let info = refused.get_details_error_info().expect("marked");
    assert_eq!(
        (info.reason.as_str(), info.domain.as_str()),
        ("RELOAD_CUT_SHORT", "rewire")
    );
    state.runtime.shutdown().await;
}

/// An ACK lists what its reload acted on, not every component serving:
/// its size is the push's, not the running set's. Before: each ACK
/// named every serving component `unchanged`.
#[tokio::test]
async fn an_ack_lists_only_what_its_reload_acted_on() {
    let (api, state) = api().await;
    for i in 0..20 {
        let config = component("worker", &format!("idle-{i}"), "test.lifecycle.idle");
        let ack = api
            .apply_configuration(push(config, "10S"))
            .await
            .expect("an ACK")
            .into_inner();
        assert!(ack.accepted, "{ack:?}");
        assert_eq!(
            ack.actions,
            [(format!("worker/idle-{i}"), "added".to_string())].into(),
            "push {i}"
        );
    }
    state.runtime.shutdown().await;
}
