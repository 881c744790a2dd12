//! The request counter and latency histogram of each label set, found with
//! one fast lookup per request.
//!
//! A Prometheus [`Family`] hashes its label set with SipHash and takes its
//! lock on every lookup, and a request looks up two families: together
//! about a thirtieth of the CPU a state GET costs the sidecar. The series
//! are shared handles, so this index keeps the pair of each label set it
//! has seen and hands them out; what is counted is the families' own
//! series. It holds no more entries than the families do (the labels are
//! bounded, see [`StoreLabel`](crate::dapr::StoreLabel)), and the series of
//! a store no longer serving are dropped at each reload applied
//! ([`RequestSeries::retain_serving`]): names that change with each push
//! or overlay do not pile up.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::sync::RwLock;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use rewire_runtime::ComponentKey;

use super::{LatencyLabels, RequestLabels};

/// One label set's series: its counter and its (API, method) histogram.
#[derive(Clone)]
pub(super) struct Series {
    pub(super) count: Counter,
    pub(super) seconds: Histogram,
}

/// The series of every label set seen, by label set.
#[derive(Default)]
pub(super) struct RequestSeries {
    seen: RwLock<HashMap<RequestLabels, Series, foldhash::fast::RandomState>>,
}

impl RequestSeries {
    /// The series of `labels`, created in the families on first use.
    pub(super) fn of(
        &self,
        labels: RequestLabels,
        requests: &Family<RequestLabels, Counter>,
        request_seconds: &Family<LatencyLabels, Histogram>,
    ) -> Series {
        let known = self
            .seen
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&labels)
            .cloned();
        if let Some(series) = known {
            return series;
        }
        let series = Series {
            count: requests.get_or_create_owned(&labels),
            seconds: request_seconds.get_or_create_owned(&LatencyLabels {
                api: labels.api,
                method: labels.method,
            }),
        };
        self.seen
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .entry(labels)
            .or_insert(series)
            .clone()
    }

    /// How many label sets the index holds.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.seen.read().map_or(0, |seen| seen.len())
    }

    /// Drops, from the index and from `requests`, the series of every
    /// store label none of the components `serving` is counted under (a
    /// call without a store is kept): a component counts under its name
    /// (the state, pub/sub, binding... APIs' label) and under its key,
    /// `kind/name` (the Lifecycle API's, Dapr's and Layotto's). A call
    /// still running on an older generation may count its store again
    /// after this: that series is dropped at the next reload applied.
    pub(super) fn retain_serving<'a>(
        &self,
        serving: impl IntoIterator<Item = &'a ComponentKey>,
        requests: &Family<RequestLabels, Counter>,
    ) {
        let serving_labels: HashSet<Cow<'a, str>> = serving
            .into_iter()
            .flat_map(|key| [Cow::Borrowed(&*key.name), Cow::Owned(key.to_string())])
            .collect();
        let mut seen = self.seen.write().unwrap_or_else(|p| p.into_inner());
        seen.retain(|labels, _| {
            let kept = labels
                .store
                .as_ref()
                .is_none_or(|store| serving_labels.contains(&*store.0));
            if !kept {
                requests.remove(labels);
            }
            kept
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::result_code::ResultCode;

    fn labels(store: Option<&str>, status: u16) -> RequestLabels {
        RequestLabels {
            api: "http",
            method: "GetState",
            store: store.map(|name| super::super::LabelText(name.into())),
            code: ResultCode::Http(status),
        }
    }

    #[test]
    fn what_is_counted_through_the_index_is_the_families_own_series() {
        let requests = Family::<RequestLabels, Counter>::default();
        let seconds =
            Family::<LatencyLabels, Histogram>::new_with_constructor(|| Histogram::new([0.1, 1.0]));
        let index = RequestSeries::default();
        for (store, status) in [(Some("orders"), 200), (Some("orders"), 200), (None, 404)] {
            let series = index.of(labels(store, status), &requests, &seconds);
            series.count.inc();
            series.seconds.observe(0.5);
        }
        assert_eq!(
            requests.get_or_create(&labels(Some("orders"), 200)).get(),
            2
        );
        assert_eq!(requests.get_or_create(&labels(None, 404)).get(), 1);
        assert_eq!(index.seen.read().map(|seen| seen.len()).ok(), Some(2));
        // One histogram for the (API, method) pair, fed by both label sets.
        let mut text = String::new();
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register("seconds", "latency", seconds.clone());
        prometheus_client::encoding::text::encode(&mut text, &registry).ok();
        assert!(
            text.contains(r#"seconds_count{api="http",method="GetState"} 3"#),
            "{text}"
        );
    }
}
