//! Logs, Prometheus metrics, the API-request counter and the health endpoints.

pub mod health;
pub mod metrics;
pub mod requests;
pub mod role;

pub use health::{Health, Watchdog, serve};
pub use metrics::{Metrics, ReasonLabel, ResultLabel, RetryLabel, StageLabel};
pub use role::{Role, RoleCell};

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
