//! The mirror's Prometheus metrics: bytes fetched, files by outcome, failures by kind, and the
//! current throughput.

use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Outcome {
    /// downloaded, reused (already present or shared content), failed
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Reason {
    /// grace, watermark, capacity
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Refused {
    /// unauthenticated, forbidden, unavailable
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Kind {
    pub kind: String,
}

/// Counters shared by every download.
pub struct Metrics {
    pub registry: Registry,
    pub bytes: Counter,
    pub files: Family<Outcome, Counter>,
    pub failures: Family<Kind, Counter>,
    pub active: Gauge,
    pub speed: Gauge,
    /// Bytes the store holds (verified blobs and partial downloads).
    pub store_bytes: Gauge,
    /// The volume's size, or the capacity the store may use.
    pub capacity_bytes: Gauge,
    /// Bytes of blobs no ModelServe references, which the collector may delete.
    pub reclaimable_bytes: Gauge,
    pub evictions: Family<Reason, Counter>,
    pub evicted_bytes: Counter,
    /// Callers turned away, by result (unauthenticated, forbidden, unavailable).
    pub refusals: Family<Refused, Counter>,
    /// Bytes counted at the last throughput sample, and when (ms since start).
    sample: (AtomicU64, AtomicU64),
    started: std::time::Instant,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("modelserve_mirror");
        let m = Metrics {
            bytes: Counter::default(),
            files: Family::default(),
            failures: Family::default(),
            active: Gauge::default(),
            speed: Gauge::default(),
            store_bytes: Gauge::default(),
            capacity_bytes: Gauge::default(),
            reclaimable_bytes: Gauge::default(),
            evictions: Family::default(),
            evicted_bytes: Counter::default(),
            refusals: Family::default(),
            sample: (AtomicU64::new(0), AtomicU64::new(0)),
            started: std::time::Instant::now(),
            registry: Registry::default(),
        };
        registry.register(
            "downloaded_bytes",
            "Bytes received from the registry",
            m.bytes.clone(),
        );
        registry.register(
            "files",
            "Files made present, by outcome (downloaded, reused, failed)",
            m.files.clone(),
        );
        registry.register(
            "failures",
            "Failed files by kind (mismatch, size, no_space, stalled, registry, disk)",
            m.failures.clone(),
        );
        registry.register(
            "downloads_active",
            "Files downloading now",
            m.active.clone(),
        );
        registry.register(
            "throughput_bytes_per_second",
            "Bytes per second received since the previous scrape",
            m.speed.clone(),
        );
        registry.register(
            "store_bytes",
            "Bytes the store holds: verified blobs and partial downloads",
            m.store_bytes.clone(),
        );
        registry.register(
            "capacity_bytes",
            "Size of the mirror's volume, or the capacity it may use (--capacity)",
            m.capacity_bytes.clone(),
        );
        registry.register(
            "reclaimable_bytes",
            "Bytes of blobs no ModelServe references, which garbage collection may delete",
            m.reclaimable_bytes.clone(),
        );
        registry.register(
            "evictions",
            "Unreferenced blobs deleted, by reason (grace, watermark, capacity)",
            m.evictions.clone(),
        );
        registry.register(
            "evicted_bytes",
            "Bytes of unreferenced blobs deleted",
            m.evicted_bytes.clone(),
        );
        registry.register(
            "refused_requests",
            "Requests turned away by the mirror's authentication, by result (unauthenticated, forbidden, unavailable)",
            m.refusals.clone(),
        );
        Metrics { registry, ..m }
    }
}

impl Metrics {
    pub fn file(&self, outcome: &str) {
        self.files
            .get_or_create(&Outcome {
                outcome: outcome.into(),
            })
            .inc();
    }

    pub fn refused(&self, result: &str) {
        self.refusals
            .get_or_create(&Refused {
                result: result.into(),
            })
            .inc();
    }

    pub fn evicted(&self, reason: &str, bytes: u64) {
        self.evictions
            .get_or_create(&Reason {
                reason: reason.into(),
            })
            .inc();
        self.evicted_bytes.inc_by(bytes);
    }

    pub fn failure(&self, kind: &str) {
        self.file("failed");
        self.failures
            .get_or_create(&Kind { kind: kind.into() })
            .inc();
    }

    /// The Prometheus text, with the throughput since the previous scrape.
    pub fn encode(&self) -> String {
        let now = self.started.elapsed().as_millis() as u64;
        let bytes = self.bytes.get();
        let before = self.sample.0.swap(bytes, Ordering::Relaxed);
        let then = self.sample.1.swap(now, Ordering::Relaxed);
        let ms = now.saturating_sub(then).max(1);
        let speed = bytes.saturating_sub(before).saturating_mul(1000) / ms;
        self.speed.set(i64::try_from(speed).unwrap_or(i64::MAX));
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}
