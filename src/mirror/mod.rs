//! `modelserve mirror`: the one place a model file is fetched and verified for the whole
//! cluster. Requests name (repo, commit, path, sha256, size), never a URL; the mirror builds the
//! URL for its configured registry only. Two requests for the same content share one download,
//! and content already present is never fetched again.
//!
//! A walk through it: [`api`] takes requests ([`request`] checks them), [`jobs`] runs one job
//! per file, [`fetch`] downloads and verifies one file into the [`store`], and [`serve`] hands
//! present files to the replicas.

pub mod api;
pub mod auth;
pub mod fetch;
pub mod jobs;
pub mod metrics;
pub mod request;
pub mod serve;
pub mod space;
pub mod store;

use std::net::SocketAddr;

pub use api::{router, router_with};
pub use jobs::{Mirror, RequestError};
pub use request::{FileStatus, Invalid, Request, Status};

use fetch::Policy;
use store::Store;

/// Settings of `modelserve mirror`.
#[derive(Clone, Debug, clap::Args)]
pub struct Config {
    /// Directory of the store (a PersistentVolume in the cluster).
    #[arg(long, env = "MODELSERVE_MIRROR_DIR")]
    pub dir: std::path::PathBuf,
    /// Address to serve the mirror API and files on.
    #[arg(long, env = "MODELSERVE_MIRROR_ADDR", default_value = "0.0.0.0:8090")]
    pub addr: SocketAddr,
    /// The registry speaking the Hugging Face Hub API: the only place files are fetched from.
    #[command(flatten)]
    pub registry: crate::hub::RegistryArgs,
    /// Most Range connections per file. A download starts with one and opens another while the
    /// sha256 waits for bytes; files smaller than two segments use one.
    #[arg(long, env = "MODELSERVE_MIRROR_CONNECTIONS", default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub connections: u16,
    /// Files downloading at once; more wait, queued (each holds its connections and an 8 MiB
    /// hashing buffer).
    #[arg(long, env = "MODELSERVE_MIRROR_DOWNLOADS", default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub downloads: u16,
    /// Bytes one connection asks for at a time (at least 1Mi), e.g. 64Mi.
    #[arg(long, env = "MODELSERVE_MIRROR_SEGMENT", default_value = "64Mi", value_parser = parse_segment)]
    pub segment_size: u64,
    #[command(flatten)]
    pub space: space::SpaceArgs,
    #[command(flatten)]
    pub auth: auth::AuthArgs,
}

fn parse_segment(s: &str) -> Result<u64, String> {
    match crate::units::parse_quantity(s) {
        Some(b) if b >= 1 << 20 => Ok(b),
        Some(_) => Err(format!("{s} is below the smallest segment, 1Mi")),
        None => Err(format!("{s} is not a size such as 64Mi or 1Gi")),
    }
}

/// Runs `modelserve mirror` until the process ends.
pub async fn run(config: Config) -> Result<(), String> {
    config.space.validate()?;
    config.auth.validate()?;
    let store = Store::open(&config.dir)
        .map_err(|e| format!("cannot open the store at {}: {e}", config.dir.display()))?;
    let policy = Policy {
        connections: config.connections.into(),
        segment: config.segment_size,
        downloads: config.downloads.into(),
        ..Policy::default()
    };
    let mirror = Mirror::build(store, config.registry.clone(), policy, config.space)
        .map_err(|e| format!("{}: {e}", crate::hub::RegistryArgs::flag_of(&e)))?;
    let listener = tokio::net::TcpListener::bind(config.addr)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", config.addr))?;
    let gate = auth::Gate::start(&config.auth).await?;
    tracing::info!(addr = %config.addr, dir = %config.dir.display(), auth = ?config.auth.mode, "mirror serving");
    axum::serve(listener, router_with(mirror, gate))
        .await
        .map_err(|e| e.to_string())
}
