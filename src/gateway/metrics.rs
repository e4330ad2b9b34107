//! The gateway's Prometheus metrics, under `modelserve_gateway_`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// A model, by namespace and ModelServe name; empty for requests no model was found for.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModelLabel {
    pub namespace: String,
    pub model: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CodeLabel {
    pub namespace: String,
    pub model: String,
    pub code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    pub namespace: String,
    pub model: String,
    /// ready, failed, timeout (activations); for scale-downs always idle.
    pub result: String,
}

type Histograms = Family<ModelLabel, Histogram, fn() -> Histogram>;

/// Every metric of the gateway.
pub struct Metrics {
    pub registry: Registry,
    pub requests: Family<CodeLabel, Counter>,
    pub first_byte: Histograms,
    pub in_flight: Family<ModelLabel, Gauge>,
    pub activations: Family<ResultLabel, Counter>,
    pub activation_seconds: Histograms,
    pub scale_downs: Family<ModelLabel, Counter>,
}

fn latency() -> Histogram {
    Histogram::new(exponential_buckets(0.000_5, 2.0, 20))
}

fn activation() -> Histogram {
    Histogram::new(exponential_buckets(0.25, 2.0, 14))
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("modelserve_gateway");
        let m = Metrics {
            requests: Family::default(),
            first_byte: Family::new_with_constructor(latency),
            in_flight: Family::default(),
            activations: Family::default(),
            activation_seconds: Family::new_with_constructor(activation),
            scale_downs: Family::default(),
            registry: Registry::default(),
        };
        registry.register(
            "requests",
            "Requests answered, by model and HTTP status code",
            m.requests.clone(),
        );
        registry.register(
            "time_to_first_byte_seconds",
            "Seconds from a request's arrival to the first byte of the replica's answer, activation included",
            m.first_byte.clone(),
        );
        registry.register(
            "in_flight_requests",
            "Requests this gateway is forwarding now, by model",
            m.in_flight.clone(),
        );
        registry.register(
            "activations",
            "Scale-ups from 0 replicas this gateway made for a request, by result (ready, failed, timeout)",
            m.activations.clone(),
        );
        registry.register(
            "activation_seconds",
            "Seconds from a scale-up from 0 to the first ready replica",
            m.activation_seconds.clone(),
        );
        registry.register(
            "scale_downs",
            "Scale-downs to 0 replicas this gateway made after idleAfter without a request",
            m.scale_downs.clone(),
        );
        Metrics { registry, ..m }
    }
}

impl Metrics {
    /// The text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exposition_names_every_metric_under_the_gateway_prefix() {
        let m = Metrics::default();
        let label = ModelLabel {
            namespace: "a".into(),
            model: "tiny".into(),
        };
        m.in_flight.get_or_create(&label).inc();
        m.first_byte.get_or_create(&label).observe(0.002);
        let text = m.encode();
        for name in [
            "modelserve_gateway_in_flight_requests{namespace=\"a\",model=\"tiny\"} 1",
            "modelserve_gateway_time_to_first_byte_seconds_count",
        ] {
            assert!(text.contains(name), "{name} in:\n{text}");
        }
    }
}
