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
