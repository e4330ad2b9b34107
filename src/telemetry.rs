//! Logs, Prometheus metrics and the health endpoints (/healthz, /readyz, /metrics).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Log format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Human,
    Json,
}

/// Installs the tracing subscriber; RUST_LOG overrides the default `info`.
pub fn init_logs(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,kube=warn,hyper=warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Human => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

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
    /// The last stage of each model (namespace/name), for models_by_stage.
    stages: std::sync::Mutex<std::collections::HashMap<String, String>>,
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
            "ModelServes by current stage, as last reconciled",
            models_by_stage.clone(),
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
            stages: Default::default(),
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

    /// Records the stage of one model and recounts the models per stage.
    pub fn model_stage(&self, model: &str, stage: &str) {
        let mut stages = self.stages.lock().unwrap_or_else(|e| e.into_inner());
        stages.insert(model.to_string(), stage.to_string());
        let mut counts: std::collections::BTreeMap<&str, i64> = std::collections::BTreeMap::new();
        for s in stages.values() {
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

/// Shared state of the health server.
#[derive(Clone)]
pub struct Health {
    pub ready: Arc<AtomicBool>,
    pub metrics: Arc<Metrics>,
}

/// Serves /healthz, /readyz and /metrics until the process ends.
pub async fn serve(addr: SocketAddr, health: Health) -> Result<(), crate::Error> {
    let app = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(health);
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| crate::Error::Listen {
            what: "health and metrics",
            addr,
            source,
        })?;
    tracing::info!(%addr, "serving /healthz, /readyz and /metrics");
    axum::serve(listener, app)
        .await
        .map_err(|source| crate::Error::Listen {
            what: "health and metrics",
            addr,
            source,
        })
}

async fn readyz(State(h): State<Health>) -> impl IntoResponse {
    if h.ready.load(Ordering::Relaxed) {
        (StatusCode::OK, "ok")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: the controller has not started watching yet",
        )
    }
}

async fn metrics(State(h): State<Health>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        h.metrics.encode(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn models_by_stage_counts_each_model_once_at_its_latest_stage() {
        let m = Metrics::default();
        m.model_stage("ns/a", "Check");
        m.model_stage("ns/b", "Check");
        m.model_stage("ns/a", "Mirror");
        let text = m.encode();
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
