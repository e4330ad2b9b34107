//! One verified download into `.incomplete/`: a large file comes over several Range connections
//! at once (opened one at a time while the hash waits for bytes), one segment each, written in
//! place; the sha256 follows the bytes as they become contiguous, reading back from the page
//! cache what was just written rather than the whole file at the end, and starts their writeback
//! to disk as it goes. A ledger beside the partial file records each segment's progress, so a restart
//! (even SIGKILL) resumes every segment where it stopped. Size and sha256 are checked before the
//! file moves into place.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use reqwest::StatusCode;
use sha2::{Digest, Sha256};
use tokio::sync::Notify;

use super::metrics::Metrics;
use super::store::{FileRef, Store};
use crate::hub::Hub;
use crate::units::human_bytes;

/// States a file goes through on the mirror.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    Queued,
    Downloading,
    Verifying,
    Present,
    Failed,
}

/// Live progress of one file, shared by everyone asking for it.
#[derive(Debug)]
pub struct Progress {
    pub file: FileRef,
    pub state: Mutex<State>,
    pub bytes_done: AtomicU64,
    pub error: Mutex<Option<String>>,
    pub started: Instant,
    /// Bytes that came over the network (not resumed from disk), for speed.
    pub fetched: AtomicU64,
}

impl Progress {
    pub fn new(file: FileRef) -> Progress {
        Progress {
            file,
            state: Mutex::new(State::Queued),
            bytes_done: AtomicU64::new(0),
            error: Mutex::new(None),
            started: Instant::now(),
            fetched: AtomicU64::new(0),
        }
    }

    pub fn state(&self) -> State {
        *self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn set(&self, s: State) {
        *self.state.lock().unwrap_or_else(|e| e.into_inner()) = s;
    }

    pub fn fail(&self, error: String) {
        *self.error.lock().unwrap_or_else(|e| e.into_inner()) = Some(error);
        self.set(State::Failed);
    }

    pub fn error(&self) -> Option<String> {
        self.error.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Bytes per second over the network since the download started.
    pub fn speed(&self) -> u64 {
        let secs = self.started.elapsed().as_secs_f64().max(0.001);
        (self.fetched.load(Ordering::Relaxed) as f64 / secs) as u64
    }
}

/// Limits of one download.
#[derive(Clone, Copy, Debug)]
pub struct Policy {
    /// Downloads from scratch after a sha256 mismatch before giving up.
    pub hash_attempts: u32,
    /// Resumes after broken connections without progress before giving up.
    pub stalls: u32,
    pub backoff: Duration,
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
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            hash_attempts: 3,
            stalls: 8,
            backoff: Duration::from_secs(1),
            retry_failed_after: Duration::from_secs(60),
            read_timeout: Duration::from_secs(30),
            connections: 4,
            segment: 64 << 20,
            downloads: 8,
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
    #[error("{path}: the registry sent more than the {size} bytes it published")]
    TooLong { path: String, size: u64 },
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
    // A registry that ignores Range gets one connection, restarted from byte 0 when it breaks.
    let mut ranges = true;
    let mut restarts = 0;
    let mut attempt = 0;
    loop {
        attempt += 1;
        let segment = if ranges && policy.connections > 1 {
            policy.segment.max(1)
        } else {
            f.size.max(1)
        };
        let (part, ledger, size) = (partial.clone(), ledger_path.clone(), f.size);
        let job = tokio::task::spawn_blocking(move || Job::open(&part, &ledger, size, segment))
            .await
            .map_err(|e| disk(std::io::Error::other(e)))?
            .map_err(disk)?;
        let have = job.done_total();
        let free = store.free_space().map_err(disk)?;
        if free < f.size - have {
            return Err(FetchError::NoSpace {
                path: f.path.clone(),
                needed: human_bytes(f.size - have),
                free: human_bytes(free),
            });
        }
        p.bytes_done.store(have, Ordering::Relaxed);
        p.set(State::Downloading);
        let job = Arc::new(job);
        let connections = if segment >= f.size {
            1
        } else {
            policy.connections
        };
        let (results, digest) = tokio::join!(
            async {
                let r = connect(&job, connections, || {
                    worker(hub, f, &job, p, policy, metrics)
                })
                .await;
                job.stop.store(true, Ordering::Release);
                job.wake.notify_one();
                r
            },
            hash(job.clone(), f.size)
        );
        job.flush();
        let mut no_ranges = false;
        for r in results {
            match r {
                Ok(()) => {}
                Err(Step::NoRanges) => no_ranges = true,
                Err(Step::Fatal(e)) => return Err(e),
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
            .map_err(|e| disk(std::io::Error::other(e)))?
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
        tokio::time::sleep(policy.backoff * attempt).await;
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

/// The ledger beside a partial file.
fn ledger_path(partial: &Path) -> PathBuf {
    partial.with_extension("segments")
}

enum Step {
    Retry(String),
    /// The registry answered a Range request with the whole file.
    NoRanges,
    Fatal(FetchError),
}

/// Ledger layout: magic, segment size, then one little-endian u64 per segment: its bytes done.
const LEDGER_MAGIC: &[u8; 8] = b"MSLEDGR1";
/// A segment's progress reaches the ledger at least every this many bytes.
const LEDGER_EVERY: u64 = 1 << 20;

/// One download in progress: the partial file, its ledger, and each segment's bytes done.
struct Job {
    /// The directory of the partial file.
    dir: PathBuf,
    file: File,
    ledger: File,
    segment: u64,
    size: u64,
    done: Vec<AtomicU64>,
    /// Bytes of each segment as last written to the ledger.
    recorded: Vec<AtomicU64>,
    next: AtomicUsize,
    stop: AtomicBool,
    wake: Notify,
    /// Time the sha256 spent waiting for bytes to hash.
    starved_nanos: AtomicU64,
}

impl Job {
    /// Opens the partial file and its ledger, or starts both afresh when they do not match.
    fn open(partial: &Path, ledger: &Path, size: u64, segment: u64) -> std::io::Result<Job> {
        let count = size.div_ceil(segment) as usize;
        let expected_len = 16 + 8 * count as u64;
        let resumed = (|| {
            let l = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(ledger)
                .ok()?;
            let f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(partial)
                .ok()?;
            if l.metadata().ok()?.len() != expected_len || f.metadata().ok()?.len() != size {
                return None;
            }
            let mut buf = vec![0u8; expected_len as usize];
            l.read_exact_at(&mut buf, 0).ok()?;
            if &buf[..8] != LEDGER_MAGIC || buf[8..16] != segment.to_le_bytes() {
                return None;
            }
            let done = buf[16..]
                .chunks_exact(8)
                .enumerate()
                .map(|(i, b)| {
                    let d = u64::from_le_bytes(b.try_into().unwrap_or_default());
                    d.min(seg_len(i, segment, size))
                })
                .collect::<Vec<_>>();
            Some((f, l, done))
        })();
        let (file, ledger, done) = match resumed {
            Some(r) => r,
            None => {
                let f = File::create(partial)?;
                f.set_len(size)?;
                let l = File::create(ledger)?;
                let mut head = LEDGER_MAGIC.to_vec();
                head.extend_from_slice(&segment.to_le_bytes());
                head.resize(expected_len as usize, 0);
                l.write_all_at(&head, 0)?;
                let f = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(partial)?;
                (f, l, vec![0; count])
            }
        };
        Ok(Job {
            dir: partial.parent().unwrap_or(Path::new(".")).to_path_buf(),
            file,
            ledger,
            segment,
            size,
            recorded: done.iter().map(|d| AtomicU64::new(*d)).collect(),
            done: done.into_iter().map(AtomicU64::new).collect(),
            next: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
            wake: Notify::new(),
            starved_nanos: AtomicU64::new(0),
        })
    }

    fn range(&self, i: usize) -> std::ops::Range<u64> {
        let start = i as u64 * self.segment;
        start..start + seg_len(i, self.segment, self.size)
    }

    fn done_total(&self) -> u64 {
        self.done.iter().map(|d| d.load(Ordering::Relaxed)).sum()
    }

    /// The next segment nobody works on that still misses bytes, in file order.
    fn claim(&self) -> Option<usize> {
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            if i >= self.done.len() {
                return None;
            }
            let r = self.range(i);
            if self.done[i].load(Ordering::Relaxed) < r.end - r.start {
                return Some(i);
            }
        }
    }

    /// Whether some segment is still to be claimed by a connection.
    fn unclaimed(&self) -> bool {
        self.next.load(Ordering::Relaxed) < self.done.len()
    }

    /// Bytes from the start of the file that are all in place.
    fn contiguous(&self) -> u64 {
        let mut end = 0;
        for (i, d) in self.done.iter().enumerate() {
            let d = d.load(Ordering::Acquire);
            end = self.range(i).start + d;
            if d < seg_len(i, self.segment, self.size) {
                break;
            }
        }
        end
    }

    /// Writes segment `i`'s progress to the ledger (the bytes themselves are written first).
    fn record(&self, i: usize) {
        let d = self.done[i].load(Ordering::Relaxed);
        if self
            .ledger
            .write_all_at(&d.to_le_bytes(), 16 + 8 * i as u64)
            .is_ok()
        {
            self.recorded[i].store(d, Ordering::Relaxed);
        }
    }

    fn flush(&self) {
        for i in 0..self.done.len() {
            if self.recorded[i].load(Ordering::Relaxed) != self.done[i].load(Ordering::Relaxed) {
                self.record(i);
            }
        }
    }
}

fn seg_len(i: usize, segment: u64, size: u64) -> u64 {
    let start = i as u64 * segment;
    segment.min(size.saturating_sub(start))
}

/// How often the mirror considers opening one more connection.
const RAMP_EVERY: Duration = Duration::from_millis(100);

/// Runs the connections of one download: one at first, then one more every `RAMP_EVERY` in
/// which the sha256 spent most of its time waiting for bytes, up to `most`. A link whose one
/// connection already outpaces the hash gains nothing from more: they would only take CPU
/// from it and make it read back bytes that arrived out of order.
async fn connect<W, F>(job: &Job, most: usize, open: F) -> Vec<Result<(), Step>>
where
    F: Fn() -> W,
    W: Future<Output = Result<(), Step>>,
{
    use futures::stream::FuturesUnordered;
    let mut running = FuturesUnordered::new();
    running.push(open());
    let mut opened = 1;
    let mut results = Vec::new();
    let mut tick = tokio::time::interval(RAMP_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    let mut starved = job.starved_nanos.load(Ordering::Relaxed);
    loop {
        tokio::select! {
            r = running.next() => match r {
                Some(r) => results.push(r),
                None => return results,
            },
            _ = tick.tick(), if opened < most => {
                let now = job.starved_nanos.load(Ordering::Relaxed);
                let hungry = now - starved > RAMP_EVERY.as_nanos() as u64 / 2;
                starved = now;
                if hungry && job.unclaimed() && !job.stop.load(Ordering::Acquire) {
                    running.push(open());
                    opened += 1;
                }
            }
        }
    }
}

/// One connection: takes segments in file order until none is left.
async fn worker(
    hub: &Hub,
    f: &FileRef,
    job: &Job,
    p: &Progress,
    policy: Policy,
    metrics: &Metrics,
) -> Result<(), Step> {
    let fail = |e: Step| {
        job.stop.store(true, Ordering::Release);
        e
    };
    while let Some(i) = job.claim() {
        let mut stalls = 0;
        loop {
            if job.stop.load(Ordering::Acquire) {
                return Ok(());
            }
            let r = job.range(i);
            let before = job.done[i].load(Ordering::Relaxed);
            if before >= r.end - r.start {
                break;
            }
            match segment(hub, f, job, p, i, metrics).await {
                Ok(()) => {}
                Err(Step::Retry(cause)) => {
                    let now = job.done[i].load(Ordering::Relaxed);
                    stalls = if now > before { 0 } else { stalls + 1 };
                    if stalls >= policy.stalls {
                        return Err(fail(Step::Fatal(FetchError::Stalled {
                            path: f.path.clone(),
                            cause,
                            stalls,
                        })));
                    }
                    tracing::info!(path = %f.path, at = r.start + now, %cause, "download interrupted; resuming");
                    tokio::time::sleep(policy.backoff * stalls.max(1)).await;
                }
                Err(e) => return Err(fail(e)),
            }
        }
    }
    Ok(())
}

/// Streams what segment `i` still misses into place.
async fn segment(
    hub: &Hub,
    f: &FileRef,
    job: &Job,
    p: &Progress,
    i: usize,
    metrics: &Metrics,
) -> Result<(), Step> {
    let r = job.range(i);
    let from = r.start + job.done[i].load(Ordering::Relaxed);
    let resp = hub
        .download(&f.repo, &f.commit, &f.path, from..r.end)
        .await
        .map_err(|e| {
            if e.is_transient() {
                Step::Retry(e.to_string())
            } else {
                Step::Fatal(FetchError::Registry(e, f.path.clone()))
            }
        })?;
    let whole = r.start == 0 && r.end == f.size;
    match resp.status() {
        StatusCode::PARTIAL_CONTENT => {
            if let Some((start, total)) = content_range(resp.headers()) {
                if total.is_some_and(|t| t != f.size) {
                    return Err(Step::Fatal(FetchError::SizeDisagrees {
                        path: f.path.clone(),
                        published: f.size,
                        served: total.unwrap_or_default(),
                    }));
                }
                if start != from {
                    return Err(Step::Retry(format!(
                        "asked for bytes from {from}, the registry sent from {start}"
                    )));
                }
            }
        }
        // The whole file: fine for a download from byte 0 of the whole file, else Range is ignored.
        StatusCode::OK if whole && from == 0 => {
            if let Some(len) = resp.content_length()
                && len != f.size
            {
                return Err(Step::Fatal(FetchError::SizeDisagrees {
                    path: f.path.clone(),
                    published: f.size,
                    served: len,
                }));
            }
        }
        StatusCode::OK => return Err(Step::NoRanges),
        s => return Err(Step::Retry(format!("unexpected HTTP {}", s.as_u16()))),
    }
    let disk = |source: std::io::Error| {
        if source.kind() == std::io::ErrorKind::StorageFull {
            let free = super::store::free_space(&job.dir).unwrap_or(0);
            Step::Fatal(FetchError::NoSpace {
                path: f.path.clone(),
                needed: human_bytes(f.size - job.done_total()),
                free: human_bytes(free),
            })
        } else {
            Step::Fatal(FetchError::Disk {
                path: f.path.clone(),
                source,
            })
        }
    };
    let mut at = from;
    let mut body = resp.bytes_stream();
    while let Some(chunk) = body.next().await {
        if job.stop.load(Ordering::Acquire) {
            return Ok(());
        }
        let chunk =
            chunk.map_err(|e| Step::Retry(format!("the connection broke at byte {at}: {e}")))?;
        if at + chunk.len() as u64 > r.end {
            return Err(Step::Fatal(FetchError::TooLong {
                path: f.path.clone(),
                size: f.size,
            }));
        }
        job.file.write_all_at(&chunk, at).map_err(disk)?;
        at += chunk.len() as u64;
        job.done[i].store(at - r.start, Ordering::Release);
        if at - r.start - job.recorded[i].load(Ordering::Relaxed) >= LEDGER_EVERY {
            job.record(i);
        }
        p.bytes_done
            .fetch_add(chunk.len() as u64, Ordering::Relaxed);
        p.fetched.fetch_add(chunk.len() as u64, Ordering::Relaxed);
        metrics.bytes.inc_by(chunk.len() as u64);
        job.wake.notify_one();
    }
    job.record(i);
    if at < r.end {
        return Err(Step::Retry(format!(
            "the body ended at byte {at} of {}",
            f.size
        )));
    }
    Ok(())
}

/// `Content-Range: bytes START-END/TOTAL`: START and TOTAL (None for `*`).
fn content_range(h: &reqwest::header::HeaderMap) -> Option<(u64, Option<u64>)> {
    let v = h.get(reqwest::header::CONTENT_RANGE)?.to_str().ok()?;
    let (range, total) = v.strip_prefix("bytes ")?.split_once('/')?;
    let start = range.split_once('-')?.0.trim().parse().ok()?;
    Some((start, total.trim().parse().ok()))
}

/// Hashes the file as it becomes contiguous; None when the download stopped before the end.
async fn hash(job: Arc<Job>, size: u64) -> std::io::Result<Option<[u8; 32]>> {
    const CHUNK: u64 = 8 << 20;
    // The hash and one reused buffer travel to the blocking thread and back.
    let mut state = (Sha256::new(), vec![0u8; CHUNK as usize]);
    let mut hashed = 0u64;
    loop {
        let ready = job.contiguous();
        if ready > hashed {
            // Just-written bytes come back from the page cache, off the async threads.
            let (j, (mut h, mut buf)) = (job.clone(), state);
            let len = (ready - hashed).min(CHUNK);
            let at = hashed;
            state = tokio::task::spawn_blocking(move || {
                j.file.read_exact_at(&mut buf[..len as usize], at)?;
                h.update(&buf[..len as usize]);
                // Hashed bytes are final: start writing them to disk now (the kernel does it in
                // the background), so the fsync before the file is present finds little left.
                let _ = rustix::fs::fadvise(
                    &j.file,
                    at,
                    std::num::NonZeroU64::new(len),
                    rustix::fs::Advice::DontNeed,
                );
                Ok::<_, std::io::Error>((h, buf))
            })
            .await
            .map_err(std::io::Error::other)??;
            hashed += len;
            continue;
        }
        if hashed == size {
            return Ok(Some(state.0.finalize().into()));
        }
        if job.stop.load(Ordering::Acquire) && job.contiguous() == hashed {
            return Ok(None);
        }
        let waited = Instant::now();
        let _ = tokio::time::timeout(Duration::from_millis(20), job.wake.notified()).await;
        job.starved_nanos
            .fetch_add(waited.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }
}

/// The hash of what a partial file already holds, and its length (reading it once); a file
/// longer than `size` is removed and counts as nothing.
pub fn resume_from(partial: &Path, size: u64) -> std::io::Result<(Sha256, u64)> {
    use std::io::Read;
    let mut hasher = Sha256::new();
    let mut file = match File::open(partial) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((hasher, 0)),
        Err(e) => return Err(e),
    };
    if file.metadata()?.len() > size {
        drop(file);
        std::fs::remove_file(partial)?;
        return Ok((hasher, 0));
    }
    let mut buf = vec![0u8; 1 << 20];
    let mut have = 0;
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        have += n as u64;
    }
    Ok((hasher, have))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A job over an 8-segment file in a temporary directory.
    fn job(dir: &Path) -> Arc<Job> {
        let part = dir.join("blob.incomplete");
        Arc::new(Job::open(&part, &ledger_path(&part), 8 << 20, 1 << 20).unwrap())
    }

    /// Opens up to `most` connections that each last 0.7 s, while `starve` says whether the
    /// hash waits for bytes; answers how many were opened.
    async fn opened(most: usize, starve: bool) -> usize {
        let dir = tempfile::tempdir().unwrap();
        let job = job(dir.path());
        let count = AtomicUsize::new(0);
        let feeder = {
            let job = job.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    if starve {
                        job.starved_nanos.fetch_add(10_000_000, Ordering::Relaxed);
                    }
                }
            })
        };
        let results = connect(&job, most, || {
            count.fetch_add(1, Ordering::Relaxed);
            async {
                tokio::time::sleep(Duration::from_millis(700)).await;
                Ok(())
            }
        })
        .await;
        feeder.abort();
        assert_eq!(results.len(), count.load(Ordering::Relaxed));
        count.load(Ordering::Relaxed)
    }

    #[tokio::test(start_paused = true)]
    async fn a_link_that_keeps_the_hash_busy_stays_on_one_connection() {
        assert_eq!(opened(4, false).await, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_hash_waiting_for_bytes_opens_connections_up_to_the_most() {
        assert_eq!(opened(4, true).await, 4);
        assert_eq!(opened(2, true).await, 2);
    }
}
