//! What the benchmark knows of its ModelServes, from one watch on their namespace: how many are
//! OnDemand, and when each one's status.observedGeneration last moved, to time spec changes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use modelserve::api::ModelServe;
use tokio::sync::watch;

/// One model as last seen.
struct Seen {
    observed: i64,
    /// When `observed` took its value: the arrival of the watch event that carried it.
    observed_at: Instant,
    on_demand: bool,
    /// A stage's condition is False: this model will not reach OnDemand by itself.
    failed: bool,
}

#[derive(Default)]
struct State {
    models: HashMap<String, Seen>,
    on_demand: usize,
    failed: usize,
    /// One failed model and what its condition says, to name in an error.
    a_failure: Option<String>,
    synced: bool,
    error: Option<String>,
}

impl State {
    fn apply(&mut self, ms: &ModelServe, now: Instant) {
        let Some(name) = ms.metadata.name.clone() else {
            return;
        };
        let status = ms.status.as_ref();
        let observed = status.and_then(|s| s.observed_generation).unwrap_or(0);
        let on_demand = status.and_then(|s| s.stage.as_deref()) == Some("OnDemand");
        let failure = status.and_then(|s| {
            s.conditions
                .iter()
                .find(|c| c.status == "False" && c.type_ != "Ready")
        });
        let failed = failure.is_some();
        if let Some(c) = failure {
            self.a_failure = Some(format!("{name}: {} ({}): {}", c.type_, c.reason, c.message));
        }
        let old = self.models.get(&name);
        let was = old.is_some_and(|s| s.on_demand);
        let was_failed = old.is_some_and(|s| s.failed);
        let observed_at = match old {
            Some(s) if s.observed == observed => s.observed_at,
            _ => now,
        };
        match (was, on_demand) {
            (false, true) => self.on_demand += 1,
            (true, false) => self.on_demand = self.on_demand.saturating_sub(1),
            _ => {}
        }
        match (was_failed, failed) {
            (false, true) => self.failed += 1,
            (true, false) => self.failed = self.failed.saturating_sub(1),
            _ => {}
        }
        self.models.insert(
            name,
            Seen {
                observed,
                observed_at,
                on_demand,
                failed,
            },
        );
    }

    fn delete(&mut self, ms: &ModelServe) {
        let removed = ms
            .metadata
            .name
            .as_ref()
            .and_then(|n| self.models.remove(n));
        if let Some(s) = removed {
            if s.on_demand {
                self.on_demand = self.on_demand.saturating_sub(1);
            }
            if s.failed {
                self.failed = self.failed.saturating_sub(1);
            }
        }
    }
}

/// A watch on the namespace's ModelServes, running until stopped.
pub struct Tracker {
    state: Arc<Mutex<State>>,
    changed: watch::Receiver<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl Tracker {
    pub fn start(api: Api<ModelServe>) -> Tracker {
        let state = Arc::new(Mutex::new(State::default()));
        let (tx, changed) = watch::channel(0u64);
        let shared = state.clone();
        let task = tokio::spawn(async move {
            let stream = watcher::watcher(api, watcher::Config::default()).default_backoff();
            futures::pin_mut!(stream);
            while let Some(event) = stream.next().await {
                let now = Instant::now();
                {
                    let mut s = shared.lock().unwrap_or_else(PoisonError::into_inner);
                    match event {
                        Ok(Event::Apply(ms) | Event::InitApply(ms)) => s.apply(&ms, now),
                        Ok(Event::Delete(ms)) => s.delete(&ms),
                        Ok(Event::Init) => {}
                        Ok(Event::InitDone) => s.synced = true,
                        Err(e) => s.error = Some(e.to_string()),
                    }
                }
                tx.send_modify(|n| *n = n.wrapping_add(1));
            }
        });
        Tracker {
            state,
            changed,
            task,
        }
    }

    fn with<T>(&self, f: impl FnOnce(&State) -> T) -> T {
        f(&self.state.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// How many models have status.stage OnDemand, and how many have a failed stage.
    pub fn counts(&self) -> (usize, usize) {
        self.with(|s| (s.on_demand, s.failed))
    }

    /// One failed model with its condition, if any failed.
    pub fn a_failure(&self) -> Option<String> {
        self.with(|s| s.a_failure.clone())
    }

    /// The last error of the watch (it retries by itself).
    pub fn last_error(&self) -> Option<String> {
        self.with(|s| s.error.clone())
    }

    /// Waits until the first listing is in.
    pub async fn synced(&mut self, limit: Duration) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        while !self.with(|s| s.synced) {
            if self.wait_change(deadline).await.is_err() {
                return Err(format!(
                    "the watch on the ModelServes did not list them in {}s: {}",
                    limit.as_secs(),
                    self.last_error().unwrap_or_else(|| "no error seen".into())
                ));
            }
        }
        Ok(())
    }

    /// When `name`'s observedGeneration reached `generation`; None when it does not within `limit`.
    pub async fn observed(
        &mut self,
        name: &str,
        generation: i64,
        limit: Duration,
    ) -> Option<Instant> {
        let deadline = Instant::now() + limit;
        loop {
            let at = self.with(|s| {
                s.models
                    .get(name)
                    .filter(|m| m.observed >= generation)
                    .map(|m| m.observed_at)
            });
            if at.is_some() {
                return at;
            }
            self.wait_change(deadline).await.ok()?;
        }
    }

    /// Waits for the next event, or fails at `deadline`.
    async fn wait_change(&mut self, deadline: Instant) -> Result<(), ()> {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, self.changed.changed()).await {
            Ok(Ok(())) => Ok(()),
            _ => Err(()),
        }
    }

    /// Ends the watch, so it sends no request during an idle window.
    pub fn stop(self) {
        drop(self);
    }
}

impl Drop for Tracker {
    fn drop(&mut self) {
        self.task.abort();
    }
}
