//! Least in-flight balancing over a model's ready replicas, and the demand each model sees:
//! requests in flight and the last one's time, which the idle scale-down reads. Both are
//! counters held by guards, so a request that ends in any way (done, failed, the client hung
//! up) counts down exactly once.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::routes::Replica;

/// Counters kept at most; zero ones are dropped beyond this.
const MOST_COUNTERS: usize = 4096;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Requests in flight per replica.
#[derive(Default)]
pub struct Balancer {
    counters: Mutex<HashMap<String, Arc<AtomicUsize>>>,
    turn: AtomicUsize,
}

/// One request counted against a replica until dropped.
pub struct InFlight(Arc<AtomicUsize>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Balancer {
    /// The replica with the fewest requests in flight (ties taken in turn), other than those in
    /// `skip`, counted until the guard drops.
    pub fn pick(&self, replicas: &[Replica], skip: &[&str]) -> Option<(Replica, InFlight)> {
        let n = replicas.len();
        if n == 0 {
            return None;
        }
        let start = self.turn.fetch_add(1, Ordering::Relaxed) % n;
        let mut counters = lock(&self.counters);
        if counters.len() > MOST_COUNTERS {
            counters.retain(|_, c| c.load(Ordering::Relaxed) > 0);
        }
        let mut best: Option<(usize, Arc<AtomicUsize>, &Replica)> = None;
        for i in 0..n {
            let r = &replicas[(start + i) % n];
            if skip.contains(&r.pod.as_str()) {
                continue;
            }
            let c = counters.entry(r.pod.clone()).or_default().clone();
            let load = c.load(Ordering::Relaxed);
            if best.as_ref().is_none_or(|(l, _, _)| load < *l) {
                best = Some((load, c, r));
            }
        }
        let (_, c, r) = best?;
        c.fetch_add(1, Ordering::Relaxed);
        Some((r.clone(), InFlight(c)))
    }

    /// Requests in flight at `pod` now.
    pub fn load(&self, pod: &str) -> usize {
        lock(&self.counters)
            .get(pod)
            .map_or(0, |c| c.load(Ordering::Relaxed))
    }
}

/// What one model's requests look like at this gateway.
#[derive(Clone, Copy, Debug)]
pub struct Seen {
    pub in_flight: usize,
    /// When the last request began or ended.
    pub last: Instant,
}

/// Requests per model, by `namespace/name`.
#[derive(Default)]
pub struct Demand {
    models: Arc<Mutex<HashMap<String, Seen>>>,
}

/// One request for a model, counted until dropped.
pub struct Asking {
    models: Arc<Mutex<HashMap<String, Seen>>>,
    key: String,
}

impl Drop for Asking {
    fn drop(&mut self) {
        if let Some(s) = lock(&self.models).get_mut(&self.key) {
            s.in_flight = s.in_flight.saturating_sub(1);
            s.last = Instant::now();
        }
    }
}

impl Demand {
    /// Counts a request for `key` from now until the guard drops.
    pub fn begin(&self, key: &str) -> Asking {
        let now = Instant::now();
        let mut m = lock(&self.models);
        let s = m.entry(key.to_string()).or_insert(Seen {
            in_flight: 0,
            last: now,
        });
        s.in_flight += 1;
        s.last = now;
        Asking {
            models: self.models.clone(),
            key: key.to_string(),
        }
    }

    pub fn seen(&self, key: &str) -> Option<Seen> {
        lock(&self.models).get(key).copied()
    }

    /// Forgets models not in `keep` that have nothing in flight.
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        lock(&self.models).retain(|k, s| s.in_flight > 0 || keep(k));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replicas(n: usize) -> Vec<Replica> {
        (0..n)
            .map(|i| Replica {
                pod: format!("ns/p{i}"),
                addr: format!("127.1.0.{i}:8080"),
            })
            .collect()
    }

    #[test]
    fn the_replica_with_the_fewest_requests_in_flight_is_picked() {
        let b = Balancer::default();
        let r = replicas(3);
        let held: Vec<InFlight> = (0..3).map(|_| b.pick(&r, &[]).unwrap().1).collect();
        // One each, taken in turn.
        assert!(r.iter().all(|x| b.load(&x.pod) == 1));
        let (busy, g) = b.pick(&r, &[]).unwrap();
        assert_eq!(b.load(&busy.pod), 2);
        // The next goes to one of the others, never the busy one.
        let (next, _g2) = b.pick(&r, &[]).unwrap();
        assert_ne!(next.pod, busy.pod);
        drop(held);
        drop(g);
        assert_eq!(b.load(&busy.pod), 0);
    }

    #[test]
    fn a_skipped_replica_is_never_picked_and_none_is_left_when_all_are() {
        let b = Balancer::default();
        let r = replicas(2);
        for _ in 0..4 {
            let (p, _) = b.pick(&r, &["ns/p0"]).unwrap();
            assert_eq!(p.pod, "ns/p1");
        }
        assert!(b.pick(&r, &["ns/p0", "ns/p1"]).is_none());
        assert!(b.pick(&[], &[]).is_none());
    }

    #[test]
    fn demand_counts_requests_until_they_end() {
        let d = Demand::default();
        let a = d.begin("ns/m");
        let b = d.begin("ns/m");
        assert_eq!(d.seen("ns/m").unwrap().in_flight, 2);
        drop(a);
        drop(b);
        assert_eq!(d.seen("ns/m").unwrap().in_flight, 0);
        d.retain(|_| false);
        assert!(d.seen("ns/m").is_none());
    }
}
