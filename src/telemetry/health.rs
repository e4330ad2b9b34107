//! /healthz, /readyz and /metrics. Ready means the watch caches have listed once, so the
//! controller decides from the whole picture; healthy means the reconcile loop is making
//! progress, so a stuck operator fails its liveness probe and is restarted.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;

use super::Metrics;

/// Which reconciles are running and when one last finished.
pub struct Watchdog {
    limit: Duration,
    next: AtomicU64,
    running: Mutex<HashMap<u64, Instant>>,
    last_done: Mutex<Instant>,
}

/// Held while one reconcile runs; dropping it (finished, failed or cancelled) records that.
pub struct Running<'a> {
    dog: &'a Watchdog,
    id: u64,
}

impl Watchdog {
    /// A watchdog that calls the loop stuck after `limit` without progress.
    pub fn new(limit: Duration) -> Watchdog {
        Watchdog {
            limit,
            next: AtomicU64::new(0),
            running: Mutex::default(),
            last_done: Mutex::new(Instant::now()),
        }
    }

    /// Marks one reconcile as running until the returned guard drops.
    pub fn start(&self) -> Running<'_> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        lock(&self.running).insert(id, Instant::now());
        Running { dog: self, id }
    }

    /// Why the loop is stuck at `now`, if it is: some reconcile has run longer than the limit and
    /// no other has finished within it. An idle loop is never stuck.
    pub fn stuck(&self, now: Instant) -> Option<String> {
        let oldest = lock(&self.running).values().min().copied()?;
        let last = *lock(&self.last_done);
        let stalled = now.saturating_duration_since(oldest.max(last));
        (stalled > self.limit).then(|| {
            format!(
                "no reconcile has finished for {}s while one has been running since {}s ago (limit {}s)",
                now.saturating_duration_since(last).as_secs(),
                now.saturating_duration_since(oldest).as_secs(),
                self.limit.as_secs()
            )
        })
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        lock(&self.dog.running).remove(&self.id);
        *lock(&self.dog.last_done) = Instant::now();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Shared state of the health server.
#[derive(Clone)]
pub struct Health {
    /// Set once every watch cache has listed.
    pub ready: Arc<AtomicBool>,
    pub metrics: Arc<Metrics>,
    pub watchdog: Arc<Watchdog>,
    /// Leader, standby, or alone (leader election off).
    pub role: super::RoleCell,
    /// The stage of every model there is, read at each scrape.
    pub stages: Arc<dyn Fn() -> Vec<String> + Send + Sync>,
}

/// Serves /healthz, /readyz and /metrics until the process ends.
pub async fn serve(addr: SocketAddr, health: Health) -> Result<(), crate::Error> {
    let app = Router::new()
        .route("/healthz", get(healthz))
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

async fn healthz(State(h): State<Health>) -> impl IntoResponse {
    match h.watchdog.stuck(Instant::now()) {
        None => (StatusCode::OK, "ok".to_string()),
        Some(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("stuck: {why}")),
    }
}

/// A standby is ready: it has nothing to list until it leads, and it takes over within a lease
/// duration; a PodDisruptionBudget counts only ready replicas, so a not-ready standby would
/// block every node drain. Its body says it is not the leader. The leader (or a lone replica)
/// is ready once its watch caches have listed.
async fn readyz(State(h): State<Health>) -> impl IntoResponse {
    use super::Role;
    match h.role.get() {
        Role::Standby => (
            StatusCode::OK,
            "ok: standby, not leader; takes over when the leader's Lease expires",
        ),
        _ if !h.ready.load(Ordering::Relaxed) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: the watch caches have not listed yet",
        ),
        Role::Leader => (StatusCode::OK, "ok: leader"),
        Role::Alone => (StatusCode::OK, "ok"),
    }
}

async fn metrics(State(h): State<Health>) -> impl IntoResponse {
    let stages = (h.stages)();
    h.metrics.set_models(stages.iter().map(String::as_str));
    h.metrics.leader.set(i64::from(h.role.leads()));
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
    fn an_idle_loop_is_healthy_and_a_stuck_one_is_not() {
        let dog = Watchdog::new(Duration::from_secs(60));
        let now = Instant::now();
        assert_eq!(dog.stuck(now + Duration::from_secs(3600)), None, "idle");
        let running = dog.start();
        assert_eq!(dog.stuck(now + Duration::from_secs(30)), None);
        let why = dog
            .stuck(Instant::now() + Duration::from_secs(120))
            .unwrap();
        assert!(why.contains("limit 60s"), "{why}");
        drop(running);
        assert_eq!(dog.stuck(Instant::now() + Duration::from_secs(3600)), None);
    }

    #[test]
    fn one_slow_reconcile_is_not_stuck_while_others_finish() {
        let dog = Watchdog::new(Duration::from_secs(60));
        let _slow = dog.start();
        drop(dog.start());
        assert_eq!(dog.stuck(Instant::now() + Duration::from_secs(30)), None);
    }
}
