//! The controller's Prometheus metrics.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use super::requests::Requests;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StageLabel {
    pub stage: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RetryLabel {
    pub stage: String,
    pub reason: String,
}

/// The controller's metrics.
pub struct Metrics {
    pub registry: Registry,
    pub reconciles: Family<ResultLabel, Counter>,
    pub errors: Family<ReasonLabel, Counter>,
    pub reconcile_seconds: Histogram,
    pub transitions: Family<StageLabel, Counter>,
    pub models_by_stage: Family<StageLabel, Gauge>,
    pub smoke_speed: Histogram,
    pub stage_seconds: Family<StageLabel, Histogram, fn() -> Histogram>,
    /// Transient failures retried by the backoff, by stage and reason.
    pub retries: Family<RetryLabel, Counter>,
    /// Requests the operator's client sent to the API server.
    pub api_requests: Requests,
    /// 1 while this replica runs the controller (holds the Lease, or leader election is off).
    pub leader: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("modelserve");
        let reconciles = Family::<ResultLabel, Counter>::default();
        let errors = Family::<ReasonLabel, Counter>::default();
        let reconcile_seconds = Histogram::new(exponential_buckets(0.001, 2.0, 16));
        let transitions = Family::<StageLabel, Counter>::default();
        let models_by_stage = Family::<StageLabel, Gauge>::default();
        let smoke_speed = Histogram::new(exponential_buckets(0.5, 2.0, 12));
        let stage_seconds: Family<StageLabel, Histogram, fn() -> Histogram> =
            Family::new_with_constructor(|| Histogram::new(exponential_buckets(0.25, 2.0, 18)));
        let retries = Family::<RetryLabel, Counter>::default();
        let api_requests = Requests::default();
        let leader = Gauge::default();
        registry.register(
            "leader",
            "1 while this replica runs the controller (holds the Lease, or leader election is off), 0 while it is a standby",
            leader.clone(),
        );
        registry.register(
            "reconciles",
            "Reconciles by result (ok, error)",
            reconciles.clone(),
        );
        registry.register(
            "reconcile_errors",
            "Failed reconciles by reason",
            errors.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "Time one reconcile took",
            reconcile_seconds.clone(),
        );
        registry.register(
            "condition_transitions",
            "Condition status transitions by condition type",
            transitions.clone(),
        );
        registry.register(
            "models",
            "ModelServes by current stage (status.stage), counted from the watch cache at each scrape",
            models_by_stage.clone(),
        );
        registry.register(
            "stage_retries",
            "Transient stage failures retried with backoff, by stage and reason",
            retries.clone(),
        );
        registry.register(
            "kube_requests",
            "Requests the operator sent to the Kubernetes API server, by verb and resource",
            api_requests.clone(),
        );
        registry.register(
            "stage_duration_seconds",
            "Time from the end of the previous stage (or the object's creation) until a stage was done",
            stage_seconds.clone(),
        );
        registry.register(
            "smoke_tokens_per_second",
            "Generation speed the smoke tests measured",
            smoke_speed.clone(),
        );
        Self {
            registry,
            reconciles,
            errors,
            reconcile_seconds,
            transitions,
            models_by_stage,
            smoke_speed,
            stage_seconds,
            retries,
            api_requests,
            leader,
        }
    }
}

impl Metrics {
    /// Records the speed one smoke test measured, when it measured one.
    pub fn smoke_tokens_per_second(&self, speed: Option<f64>) {
        if let Some(s) = speed {
            self.smoke_speed.observe(s);
        }
    }

    /// Sets the models-per-stage gauge from the stages of every model there is now: a model
    /// that was deleted is not counted, and a restart counts every model at once.
    pub fn set_models<'a>(&self, stages: impl IntoIterator<Item = &'a str>) {
        let mut counts: std::collections::BTreeMap<&str, i64> = std::collections::BTreeMap::new();
        for s in stages {
            *counts.entry(s).or_default() += 1;
        }
        self.models_by_stage.clear();
        for (stage, n) in counts {
            self.models_by_stage
                .get_or_create(&StageLabel {
                    stage: stage.to_string(),
                })
                .set(n);
        }
    }

    /// The text exposition format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn models_by_stage_counts_the_models_there_are_now() {
        let m = Metrics::default();
        m.set_models(["Check", "Check", "Ready"]);
        m.set_models(["Check", "Mirror"]);
        let text = m.encode();
        assert!(
            !text.contains("stage=\"Ready\""),
            "a deleted model is forgotten: {text}"
        );
        assert!(
            text.contains("modelserve_models{stage=\"Check\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("modelserve_models{stage=\"Mirror\"} 1"),
            "{text}"
        );
    }
}
