//! The ModelServe controller: the watches that feed its caches and wake it, the reconcile that
//! runs the pipeline and writes status once, and the settings of `modelserve controller`.

pub mod events;
pub mod leader;
pub mod live_set;
pub mod reconcile;
pub mod watches;
mod written;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use kube::api::ListParams;
use kube::runtime::controller;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Client};
use tracing::info;

use crate::Error;
use crate::api::ModelServe;
use crate::conditions::SystemClock;
pub use crate::pipeline::env::{DEFAULT_ENGINE_IMAGE, DEFAULT_PULL_IMAGE};
use crate::pipeline::{Env, env::Settings};
use crate::telemetry::{self, Health, Metrics, Watchdog};
pub use crate::units::parse_duration;

/// Settings of `modelserve controller`.
#[derive(Clone, Debug, clap::Args)]
pub struct Config {
    /// Address of /healthz, /readyz and /metrics.
    #[arg(long, env = "MODELSERVE_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    pub metrics_addr: SocketAddr,
    /// Watch only this namespace (default: all namespaces).
    #[arg(long, env = "MODELSERVE_WATCH_NAMESPACE")]
    pub watch_namespace: Option<String>,
    #[command(flatten)]
    pub settings: Settings,
    #[command(flatten)]
    pub leader: leader::LeaderArgs,
    /// Reconciles that run at once, over all ModelServes (one object is never reconciled twice at once).
    #[arg(long, env = "MODELSERVE_CONCURRENCY", default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub concurrency: u16,
    /// How often a ModelServe with nothing to do is looked at anyway (with up to 20% jitter); it costs no API request when nothing drifted.
    #[arg(long, env = "MODELSERVE_RESYNC", default_value = "10m", value_parser = parse_duration)]
    pub resync: Duration,
    /// How often the leader tells the mirror which blobs the ModelServes reference, so it may
    /// delete the others.
    #[arg(long, env = "MODELSERVE_MIRROR_LIVE_SET_INTERVAL", default_value = "30s", value_parser = parse_duration)]
    pub mirror_live_set_interval: Duration,
    /// /healthz fails when a reconcile has run this long while none finished, so a stuck operator is restarted by its liveness probe. Keep it above --stage-timeout.
    #[arg(long, env = "MODELSERVE_STALL_TIMEOUT", default_value = "15m", value_parser = parse_duration)]
    pub stall_timeout: Duration,
}

/// What every reconcile shares.
pub struct Context {
    pub env: Env,
    pub events: events::Publisher,
    pub metrics: Arc<Metrics>,
    pub watchdog: Arc<Watchdog>,
    pub resync: Duration,
    /// Transient failures in a row, per object, for the backoff; reset on a reconcile without one.
    attempts: Mutex<HashMap<ObjectRef<ModelServe>, u32>>,
    /// Status writes the cache does not show yet, so they are not sent twice.
    pub written: written::Written,
}

impl Context {
    /// Counts one more transient failure of `key` and returns how many in a row.
    pub fn bump(&self, key: ObjectRef<ModelServe>) -> u32 {
        let mut m = self.attempts.lock().unwrap_or_else(|e| e.into_inner());
        let n = m.entry(key).or_insert(0);
        *n = n.saturating_add(1);
        *n
    }

    pub fn reset(&self, key: &ObjectRef<ModelServe>) {
        self.attempts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
    }
}

/// Runs the controller until SIGTERM or Ctrl-C.
pub async fn run(config: Config) -> Result<(), Error> {
    few_malloc_arenas();
    config
        .settings
        .registry
        .hub(None)
        .map_err(|e| Error::BadFlag {
            flag: crate::hub::RegistryArgs::flag_of(&e),
            message: e.to_string(),
        })?;
    if config.stall_timeout <= config.settings.stage_timeout {
        return Err(Error::BadFlag {
            flag: "--stall-timeout",
            message: format!(
                "{} must be longer than --stage-timeout ({}), or a slow stage would restart the operator",
                crate::units::human_duration(config.stall_timeout),
                crate::units::human_duration(config.settings.stage_timeout)
            ),
        });
    }
    config.leader.validate()?;
    let metrics = Arc::new(Metrics::default());
    let (client, url) = connect_counted(&metrics).await?;
    ensure_crd_installed(&client, &url, config.watch_namespace.as_deref()).await?;

    let watchdog = Arc::new(Watchdog::new(config.stall_timeout));
    let role = telemetry::RoleCell::default();
    // The watches start once this replica leads (kube-runtime's controller drives them), so the
    // stages count reads an empty slot until then.
    let models_slot: Arc<std::sync::OnceLock<kube::runtime::reflector::Store<ModelServe>>> =
        Default::default();
    let slot = models_slot.clone();
    let health = Health {
        ready: Default::default(),
        role: role.clone(),
        metrics: metrics.clone(),
        watchdog: watchdog.clone(),
        stages: Arc::new(move || {
            slot.get()
                .map(|models| {
                    models
                        .state()
                        .iter()
                        .map(|m| {
                            m.status
                                .as_ref()
                                .and_then(|s| s.stage.clone())
                                .unwrap_or_else(|| "New".into())
                        })
                        .collect()
                })
                .unwrap_or_default()
        }),
    };
    let mut server = tokio::spawn(telemetry::serve(config.metrics_addr, health.clone()));

    let mut election = if config.leader.enabled {
        role.set(telemetry::Role::Standby);
        let namespace = config.leader.namespace(config.watch_namespace.as_deref());
        Some(leader::Election::start(client.clone(), &config.leader, namespace).await?)
    } else {
        None
    };
    if let Some(e) = election.as_mut() {
        // A standby serves /readyz and /metrics, and sends nothing but its Lease requests.
        let stop = tokio::select! {
            r = e.acquired() => r.map(|_| false)?,
            r = &mut server => served(r).map(|_| true)?,
            _ = shutdown() => true,
        };
        if stop {
            if let Some(e) = election {
                e.release().await;
            }
            return Ok(());
        }
        role.set(telemetry::Role::Leader);
    }

    let watches = watches::Watches::start(&client, config.watch_namespace.as_deref());
    let _ = models_slot.set(watches.models.clone());
    let cache = watches.cache.clone();
    let ready = health.ready.clone();
    tokio::spawn(async move {
        cache.wait_until_synced().await;
        ready.store(true, Ordering::Relaxed);
        info!("watch caches synced; ready");
    });

    let http = Env::http_client().map_err(Error::Config)?;
    if let Some(url) = config.settings.mirror_url.clone() {
        tokio::spawn(live_set::publish(
            http.clone(),
            url,
            config.settings.clone(),
            watches.models.clone(),
            watches.models_listed.clone(),
            config.mirror_live_set_interval.max(Duration::from_secs(1)),
        ));
    }
    let ctx = Arc::new(Context {
        events: events::Publisher::new(client.clone(), std::env::var("POD_NAME").ok()),
        env: Env {
            client,
            settings: config.settings.clone(),
            cache: watches.cache.clone(),
            clock: Arc::new(SystemClock),
            http,
            inspections: Default::default(),
        },
        metrics,
        watchdog,
        resync: config.resync,
        attempts: Mutex::default(),
        written: Default::default(),
    });
    info!(concurrency = config.concurrency, "controller started");
    let controller = watches
        .controller()
        .with_config(controller::Config::default().concurrency(config.concurrency))
        .run(reconcile::reconcile, reconcile::error_policy, ctx)
        .for_each(|_| async {});
    // Dropping the controller cancels every reconcile in flight: a replica that may no longer
    // lead sends nothing more.
    let lost = async {
        match election.as_mut() {
            Some(e) => e.lost().await,
            None => std::future::pending().await,
        }
    };
    let stopped = tokio::select! {
        _ = controller => Ok(false),
        r = &mut server => served(r).map(|_| false),
        why = lost => Err(Error::LostLease(why)),
        _ = shutdown() => Ok(true),
    };
    match (stopped, election) {
        (Ok(true), Some(e)) => {
            info!("stopping");
            e.release().await;
        }
        (Ok(true), None) => info!("stopping"),
        (Err(lost @ Error::LostLease(_)), Some(e)) => {
            e.abandon().await;
            return Err(lost);
        }
        (Err(e), _) => return Err(e),
        (Ok(false), _) => {}
    }
    Ok(())
}

/// The end of the health server, which ends the operator with it.
fn served(r: Result<Result<(), Error>, tokio::task::JoinError>) -> Result<(), Error> {
    match r {
        Ok(Err(e)) => Err(e),
        _ => Ok(()),
    }
}

/// SIGTERM or SIGINT.
async fn shutdown() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// A client from the kubeconfig or the in-cluster configuration, and the server's URL.
pub async fn connect() -> Result<(Client, String), Error> {
    let config = kube::Config::infer()
        .await
        .map_err(|e| Error::Config(e.to_string()))?;
    let url = config.cluster_url.to_string();
    let client = Client::try_from(config).map_err(|e| Error::Config(e.to_string()))?;
    Ok((client, url))
}

/// A client whose every request is counted in `metrics` (`modelserve_kube_requests_total`).
async fn connect_counted(metrics: &Metrics) -> Result<(Client, String), Error> {
    let config = kube::Config::infer()
        .await
        .map_err(|e| Error::Config(e.to_string()))?;
    let url = config.cluster_url.to_string();
    let client = kube::client::ClientBuilder::try_from(config)
        .map_err(|e| Error::Config(e.to_string()))?
        .with_layer(&telemetry::requests::CountLayer(
            metrics.api_requests.clone(),
        ))
        .build();
    Ok((client, url))
}

/// Fails with a clear message when the CRD is missing or the API server cannot be reached.
/// Lists in the watched namespace only, so a namespace-scoped install (a Role) passes.
pub async fn ensure_crd_installed(
    client: &Client,
    url: &str,
    namespace: Option<&str>,
) -> Result<(), Error> {
    let api: Api<ModelServe> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    match api.list(&ListParams::default().limit(1)).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Err(Error::CrdMissing),
        Err(e) => Err(Error::Unreachable {
            url: url.to_string(),
            source: e,
        }),
    }
}

/// glibc gives each thread that allocates an arena of its own (up to 8 per core), and a cached
/// object built on one runtime worker and dropped on another leaves pages behind in several.
/// The controller's memory is its caches: two arenas keep them tighter.
fn few_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes a malloc parameter; M_ARENA_MAX takes any positive count.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}
