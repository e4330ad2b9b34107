//! One verified download into `.incomplete/`: a large file comes over several Range connections
//! at once (opened one at a time while the hash waits for bytes, [`ramp`]), one segment each,
//! written in place ([`segment`]); the sha256 follows the bytes as they become contiguous,
//! reading back from the page cache what was just written rather than the whole file at the
//! end, and starts their writeback to disk as it goes ([`hash`]). A ledger beside the partial
//! file records each segment's progress, so a restart (even SIGKILL) resumes every segment
//! where it stopped ([`ledger`]). Size and sha256 are checked before the file moves into place.

mod hash;
mod ledger;
mod progress;
mod ramp;
mod segment;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

pub use hash::resume_from;
pub use progress::{Progress, State};

use super::metrics::Metrics;
use super::store::Store;
use crate::hub::Hub;
use crate::retry::Backoff;
use crate::units::human_bytes;
use ledger::{Partial, ledger_path, segment_size};
use segment::Step;

/// Limits of one download.
#[derive(Clone, Copy, Debug)]
pub struct Policy {
    /// Downloads from scratch after a sha256 mismatch before giving up.
    pub hash_attempts: u32,
    /// Resumes after broken connections without progress before giving up.
    pub stalls: u32,
    /// The first wait before a retry (a resumed connection, a download after a mismatch); the
    /// waits double from there, with jitter, up to `max_backoff`.
    pub backoff: Duration,
    /// The longest wait between retries.
    pub max_backoff: Duration,
    /// A failed file is started again by a request only this long after it started.
    pub retry_failed_after: Duration,
    /// Longest silence from the registry before a connection counts as stalled.
    pub read_timeout: Duration,
    /// Most Range connections for one file (opened while the hash waits for bytes); a file
    /// smaller than two segments uses one.
    pub connections: usize,
    /// Bytes one connection asks for at a time.
    pub segment: u64,
    /// Files downloading at once on the whole mirror; more wait, queued. Each holds its
    /// connections and an 8 MiB hashing buffer, so a repo of many shards stays within bounds.
    pub downloads: usize,
    /// Files queued or downloading at once, beyond which a request for more is refused (each
    /// holds a task and its progress until it ends).
    pub queue: usize,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            hash_attempts: 3,
            stalls: 8,
            backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(30),
            retry_failed_after: Duration::from_secs(60),
            read_timeout: Duration::from_secs(30),
            connections: 4,
            segment: 64 << 20,
            downloads: 8,
            queue: 10_000,
        }
    }
}

impl Policy {
    /// The backoff of this download's retries.
    pub fn retry_backoff(&self) -> Backoff {
        Backoff {
            first: self.backoff,
            cap: self.max_backoff.max(self.backoff),
        }
    }
}

/// Why a file could not be mirrored.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error(
        "{path} arrived with sha256 {got}, the registry published {want} ({attempts} attempts)"
    )]
    Mismatch {
        path: String,
        got: String,
        want: String,
        attempts: u32,
    },
    #[error("{path}: the registry sent more than the {expected} bytes expected from byte {from}")]
    TooLong {
        path: String,
        from: u64,
        expected: u64,
    },
    #[error("{path}: the registry published {published} bytes but its download says {served}")]
    SizeDisagrees {
        path: String,
        published: u64,
        served: u64,
    },
    #[error(
        "{path} needs {needed} more on the mirror's volume, which has {free} free; the part already downloaded is kept for when there is room"
    )]
    NoSpace {
        path: String,
        needed: String,
        free: String,
    },
    #[error("{path}: {cause} (gave up after {stalls} attempts without progress)")]
    Stalled {
        path: String,
        cause: String,
        stalls: u32,
    },
    #[error("{path}: {0}", path = .1)]
    Registry(crate::hub::HubError, String),
    #[error("{path}: disk error: {source}")]
    Disk {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

impl FetchError {
    /// A short label of the kind of failure, for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            FetchError::Mismatch { .. } => "mismatch",
            FetchError::TooLong { .. } | FetchError::SizeDisagrees { .. } => "size",
            FetchError::NoSpace { .. } => "no_space",
            FetchError::Stalled { .. } => "stalled",
            FetchError::Registry(..) => "registry",
            FetchError::Disk { .. } => "disk",
        }
    }
}

/// Downloads and verifies one file into the store, once one of `slots` is free (queued until
/// then); `p` follows along.
pub async fn fetch(
    hub: &Hub,
    store: &Store,
    p: &Progress,
    policy: Policy,
    metrics: &Metrics,
    slots: &tokio::sync::Semaphore,
) -> Result<(), FetchError> {
    let f = &p.file;
    let disk = |source| FetchError::Disk {
        path: f.path.clone(),
        source,
    };
    let joined = |e: tokio::task::JoinError| disk(std::io::Error::other(e));
    if store.present(f) || store.adopt(f).map_err(disk)? {
        p.bytes_done.store(f.size, Ordering::Relaxed);
        p.set(State::Present);
        return Ok(());
    }
    // Queued until a slot frees; the slot is held to the end, retries included.
    let _slot = slots
        .acquire()
        .await
        .map_err(|e| disk(std::io::Error::other(e)))?;
    let partial = store.partial(&f.sha256);
    let ledger_path = ledger_path(&partial);
    let backoff = policy.retry_backoff();
    // A registry that ignores Range gets one connection, restarted from byte 0 when it breaks.
    let mut ranges = true;
    let mut restarts = 0;
    let mut attempt = 0;
    loop {
        attempt += 1;
        let segment = if ranges && policy.connections > 1 {
            segment_size(f.size, policy.segment)
        } else {
            f.size.max(1)
        };
        let (part, ledger, size) = (partial.clone(), ledger_path.clone(), f.size);
        let resumed =
            tokio::task::spawn_blocking(move || Partial::resume(&part, &ledger, size, segment))
                .await
                .map_err(joined)?;
        // Room is checked before a new partial file is made, so a size no volume holds never
        // becomes a file.
        let have = resumed.as_ref().map_or(0, Partial::done_total);
        let free = store.free_space().map_err(disk)?;
        let needed = f.size.saturating_sub(have);
        if free < needed {
            return Err(FetchError::NoSpace {
                path: f.path.clone(),
                needed: human_bytes(needed),
                free: human_bytes(free),
            });
        }
        let job = match resumed {
            Some(job) => job,
            None => {
                let (part, ledger) = (partial.clone(), ledger_path.clone());
                tokio::task::spawn_blocking(move || Partial::create(&part, &ledger, size, segment))
                    .await
                    .map_err(joined)?
                    .map_err(disk)?
            }
        };
        p.bytes_done.store(have, Ordering::Relaxed);
        p.set(State::Downloading);
        let job = Arc::new(job);
        let connections = if segment >= f.size {
            1
        } else {
            policy.connections.max(1)
        };
        let (results, digest) = tokio::join!(
            async {
                let r = ramp::connect(&job, connections, || {
                    segment::worker(hub, f, &job, p, policy, metrics)
                })
                .await;
                job.stop.store(true, Ordering::Release);
                job.wake.notify_one();
                r
            },
            hash::hash(job.clone(), f.size)
        );
        job.flush();
        let mut no_ranges = false;
        for r in results {
            match r {
                Ok(()) => {}
                Err(Step::NoRanges) => no_ranges = true,
                Err(Step::Fatal(e)) => return Err(*e),
                // Workers give up on retries themselves; should one come back, it ends the same way.
                Err(Step::Retry(cause)) => {
                    return Err(FetchError::Stalled {
                        path: f.path.clone(),
                        cause,
                        stalls: policy.stalls,
                    });
                }
            }
        }
        if no_ranges {
            restarts += 1;
            if restarts > policy.stalls {
                return Err(FetchError::Stalled {
                    path: f.path.clone(),
                    cause: "the registry ignores Range requests and the connection keeps breaking"
                        .into(),
                    stalls: restarts,
                });
            }
            tracing::info!(path = %f.path, "the registry ignores Range: one connection from byte 0");
            ranges = false;
            remove(&partial, &ledger_path);
            attempt -= 1;
            continue;
        }
        let digest = digest.map_err(disk)?;
        p.set(State::Verifying);
        let got = digest.map(hex::encode).unwrap_or_default();
        if got == f.sha256 {
            let (store, file, ledger) = (store.clone(), f.clone(), ledger_path.clone());
            tokio::task::spawn_blocking(move || {
                store.commit(&file)?;
                std::fs::remove_file(ledger).or_else(ignore_missing)
            })
            .await
            .map_err(joined)?
            .map_err(disk)?;
            p.set(State::Present);
            return Ok(());
        }
        // Wrong bytes are never kept: start over, and give up after the last attempt.
        remove(&partial, &ledger_path);
        if attempt >= policy.hash_attempts {
            return Err(FetchError::Mismatch {
                path: f.path.clone(),
                got,
                want: f.sha256.clone(),
                attempts: attempt,
            });
        }
        tracing::warn!(path = %f.path, %got, want = %f.sha256, "sha256 mismatch; downloading again");
        tokio::time::sleep(backoff.delay(attempt)).await;
    }
}

fn ignore_missing(e: std::io::Error) -> std::io::Result<()> {
    if e.kind() == std::io::ErrorKind::NotFound {
        Ok(())
    } else {
        Err(e)
    }
}

fn remove(partial: &Path, ledger: &Path) {
    let _ = std::fs::remove_file(partial);
    let _ = std::fs::remove_file(ledger);
}
