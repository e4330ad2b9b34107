//! `modelserve gateway`: the OpenAI-compatible front door. It routes each request by its `model`
//! to the ModelServe that answers to that name (served name or alias), forwards it to the
//! ready replica with the fewest requests in flight using the model's engine key, and streams
//! the answer back as it comes. A request for an on-demand model at 0 replicas scales it to 1
//! and is held until a replica is ready; after `spec.onDemand.idleAfter` without a request the
//! gateway scales the model back to 0.
//!
//! Who owns `spec.replicas` of an on-demand model (one with `spec.onDemand`): the gateway writes
//! it (1 on a request at 0, 0 when idle) through the scale subresource, with the object's
//! resourceVersion as a precondition, so of several gateway replicas one write wins. The
//! controller only reads it. A person may scale the model up; the gateway scales it back to 0
//! once idle. Without `spec.onDemand` the gateway never scales a model.

pub mod activate;
pub mod balance;
pub mod events;
pub mod idle;
pub mod keys;
pub mod metrics;
pub mod openai;
pub mod proxy;
pub mod routes;
pub mod watch;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::serve::ListenerExt;

use crate::units::parse_duration;

/// How the gateway checks its clients.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum AuthMode {
    /// Every request carries one of the gateway's API keys (Secrets labelled modelserve.dev/gateway-key=true).
    Keys,
    /// No key: anyone who reaches the gateway may use every model. Only for a gateway nothing else can reach.
    None,
}

/// Flags of `modelserve gateway`.
#[derive(Clone, Debug, clap::Args)]
pub struct Config {
    /// Where clients reach the OpenAI-compatible API.
    #[arg(long, env = "MODELSERVE_GATEWAY_ADDR", default_value = "0.0.0.0:8080")]
    pub addr: SocketAddr,
    /// Where /metrics, /healthz and /readyz are served.
    #[arg(
        long,
        env = "MODELSERVE_GATEWAY_METRICS_ADDR",
        default_value = "0.0.0.0:9090"
    )]
    pub metrics_addr: SocketAddr,
    /// Route only to ModelServes of this namespace (default: every namespace).
    #[arg(long, env = "MODELSERVE_WATCH_NAMESPACE")]
    pub watch_namespace: Option<String>,
    /// Namespace of the API-key Secrets (default: the pod's own from POD_NAMESPACE, else default).
    #[arg(long, env = "MODELSERVE_GATEWAY_KEYS_NAMESPACE")]
    pub keys_namespace: Option<String>,
    /// How clients authenticate: keys (a Bearer key of a Secret labelled modelserve.dev/gateway-key=true) or none.
    #[arg(long = "auth", env = "MODELSERVE_GATEWAY_AUTH", value_enum, default_value_t = AuthMode::Keys)]
    pub auth: AuthMode,
    /// Longest a request is held for a model with no ready replica (loading from 0 included) before a 503 that says why.
    #[arg(long, env = "MODELSERVE_GATEWAY_ACTIVATION_TIMEOUT", default_value = "5m", value_parser = parse_duration)]
    pub activation_timeout: Duration,
    /// Longest a replica may go without sending a byte of its answer.
    #[arg(long, env = "MODELSERVE_GATEWAY_UPSTREAM_TIMEOUT", default_value = "10m", value_parser = parse_duration)]
    pub upstream_timeout: Duration,
    /// How often on-demand models are checked for idleness.
    #[arg(long, env = "MODELSERVE_GATEWAY_IDLE_CHECK", default_value = "1s", value_parser = parse_duration)]
    pub idle_check: Duration,
}

impl Config {
    /// Checks the flags; the error names the flag and what would be valid.
    pub fn validate(&self) -> Result<(), String> {
        let within = |flag: &str, d: Duration, lo: Duration, hi: Duration| {
            if (lo..=hi).contains(&d) {
                Ok(())
            } else {
                Err(format!(
                    "{flag} {}: give a duration from {} to {}",
                    crate::units::human_duration(d),
                    crate::units::human_duration(lo),
                    crate::units::human_duration(hi)
                ))
            }
        };
        let s = Duration::from_secs;
        within(
            "--activation-timeout",
            self.activation_timeout,
            s(1),
            s(3600),
        )?;
        within("--upstream-timeout", self.upstream_timeout, s(1), s(86400))?;
        within(
            "--idle-check",
            self.idle_check,
            Duration::from_millis(100),
            s(60),
        )
    }

    fn keys_namespace(&self) -> String {
        self.keys_namespace
            .clone()
            .or_else(|| std::env::var("POD_NAMESPACE").ok())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "default".into())
    }
}

/// Everything a request reads.
pub struct Gateway {
    pub client: kube::Client,
    pub views: Arc<watch::Views>,
    pub http: reqwest::Client,
    pub balancer: balance::Balancer,
    pub demand: balance::Demand,
    pub activations: activate::Activations,
    pub idle: idle::Heartbeats,
    pub metrics: metrics::Metrics,
    pub events: events::Publisher,
    pub config: Config,
}

impl Gateway {
    pub fn new(client: kube::Client, config: Config) -> Result<Arc<Gateway>, String> {
        config.validate()?;
        let views = watch::start(
            &client,
            config.watch_namespace.as_deref(),
            &config.keys_namespace(),
        );
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .read_timeout(config.upstream_timeout)
            .pool_idle_timeout(Duration::from_secs(90))
            .tcp_nodelay(true)
            .no_proxy()
            .build()
            .map_err(|e| format!("cannot build the HTTP client: {e}"))?;
        Ok(Arc::new(Gateway {
            events: events::Publisher::new(client.clone()),
            client,
            views,
            http,
            balancer: Default::default(),
            demand: Default::default(),
            activations: Default::default(),
            idle: Default::default(),
            metrics: Default::default(),
            config,
        }))
    }
}

/// Runs `modelserve gateway` until the process ends.
pub async fn run(config: Config) -> Result<(), String> {
    let client = kube::Client::try_default()
        .await
        .map_err(|e| format!("the gateway needs the API server: {e}"))?;
    let addr = config.addr;
    let metrics_addr = config.metrics_addr;
    let gw = Gateway::new(client, config)?;
    if gw.config.auth == AuthMode::None {
        tracing::warn!("--auth none: anyone who reaches the gateway may use every model");
    }
    // The idle loop outlives a panic in one pass: it is started again, and says so.
    let idle_gw = gw.clone();
    tokio::spawn(async move {
        loop {
            if let Err(e) = tokio::spawn(idle::run(idle_gw.clone())).await {
                tracing::error!(error = %e, "the idle scale-down loop ended; starting it again");
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
        }
    });
    let api = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    let health = tokio::net::TcpListener::bind(metrics_addr)
        .await
        .map_err(|e| format!("cannot listen on {metrics_addr}: {e}"))?;
    tracing::info!(%addr, %metrics_addr, "gateway serving");
    let health_app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(gw.clone());
    tokio::spawn(async move { axum::serve(health, health_app).await });
    // An answer goes out as the replica sends it, often in small pieces (SSE chunks): without
    // TCP_NODELAY the kernel would hold a piece back until the client acknowledged the last.
    let api = api.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY on a client connection");
        }
    });
    axum::serve(api, proxy::router(gw))
        .await
        .map_err(|e| e.to_string())
}

async fn metrics(State(gw): State<Arc<Gateway>>) -> impl IntoResponse {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        gw.metrics.encode(),
    )
}

async fn readyz(State(gw): State<Arc<Gateway>>) -> impl IntoResponse {
    if gw.views.synced() {
        (StatusCode::OK, "ok")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: the ModelServes, pods and keys have not been listed yet",
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        c: Config,
    }

    #[test]
    fn out_of_range_durations_name_the_flag() {
        let c = Cli::parse_from(["gw", "--activation-timeout", "0s"]).c;
        assert!(c.validate().unwrap_err().contains("--activation-timeout"));
        let c = Cli::parse_from(["gw", "--idle-check", "2h"]).c;
        assert!(c.validate().unwrap_err().contains("--idle-check"));
        assert!(Cli::parse_from(["gw"]).c.validate().is_ok());
    }
}
