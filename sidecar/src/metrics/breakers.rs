//! Circuit breaker gauges, per component, refreshed from the generation
//! serving at each scrape: `rewire_circuit_breaker_state` (0 closed,
//! 1 half-open, 2 open), `rewire_circuit_breaker_consecutive_failures` and
//! `rewire_circuit_breaker_trips` (times opened since the breaker's settings
//! last changed). Only components a resiliency policy gives a breaker are
//! listed, so the label set is bounded by the configuration; `direction`
//! is `outbound` (the component's calls) or `inbound` (a pub/sub's
//! deliveries to the app), as Dapr's `flow_direction`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use rewire_runtime::Generation;

use super::LabelText;

/// Labels of one breaker: the component's and the policy's names are free
/// text, written escaped.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BreakerLabels {
    component: LabelText<String>,
    policy: LabelText<String>,
    direction: &'static str,
}

/// The breaker gauges.
pub(super) struct BreakerMetrics {
    state: Family<BreakerLabels, Gauge>,
    failures: Family<BreakerLabels, Gauge>,
    trips: Family<BreakerLabels, Gauge>,
}

impl BreakerMetrics {
    /// The gauges, registered in `registry`.
    pub(super) fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            state: Family::default(),
            failures: Family::default(),
            trips: Family::default(),
        };
        registry.register(
            "circuit_breaker_state",
            "Circuit breaker state per component: 0 closed, 1 half-open, 2 open",
            metrics.state.clone(),
        );
        registry.register(
            "circuit_breaker_consecutive_failures",
            "Consecutive failures a closed circuit breaker has counted",
            metrics.failures.clone(),
        );
        registry.register(
            "circuit_breaker_trips",
            "Times a circuit breaker opened since its settings last changed",
            metrics.trips.clone(),
        );
        metrics
    }

    /// Sets the gauges to the breakers of `generation` now.
    pub(super) fn refresh(&self, generation: &Generation) {
        self.state.clear();
        self.failures.clear();
        self.trips.clear();
        let policies = generation.policies();
        let outbound = policies.breakers().map(|b| ("outbound", b));
        let inbound = policies.inbound_breakers().map(|b| ("inbound", b));
        for (direction, (key, status)) in outbound.chain(inbound) {
            let labels = BreakerLabels {
                component: LabelText(key.to_string()),
                policy: LabelText(status.policy.clone()),
                direction,
            };
            self.state
                .get_or_create(&labels)
                .set(status.state.as_number());
            self.failures
                .get_or_create(&labels)
                .set(i64::from(status.consecutive_failures));
            self.trips
                .get_or_create(&labels)
                .set(i64::try_from(status.trips).unwrap_or(i64::MAX));
        }
    }
}
