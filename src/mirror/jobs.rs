//! The running mirror: one job per file asked for, one download per content whoever asks, a
//! bounded number downloading at once and a bounded number waiting.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use super::fetch::{self, FetchError, Policy, Progress, State};
use super::metrics::Metrics;
use super::request::{self, FileStatus, Invalid, Request, Status};
use super::space::{self, NoRoom, Refs, SpaceArgs};
use super::store::{FileRef, Store};
use crate::hub::{Hub, HubError};
use crate::secret::Secret;

/// Files tracked before finished ones are forgotten (a present file is found again on disk).
const PRUNE_AT: usize = 4096;

/// Why a request was not taken.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    #[error("{0}")]
    Invalid(Invalid),
    #[error(
        "the mirror has {live} files queued or downloading and takes at most {most}; ask again when some have finished"
    )]
    Busy { live: usize, most: usize },
    #[error("{0}")]
    NoRoom(NoRoom),
    #[error("the mirror cannot read its volume: {0}")]
    Disk(String),
}

/// The running mirror.
pub struct Mirror {
    pub(super) store: Store,
    registry: crate::hub::RegistryArgs,
    /// The registry client of requests without a token, built once.
    hub: Hub,
    retry: crate::hub::Retry,
    policy: Policy,
    jobs: Mutex<Jobs>,
    /// One permit per file that may download at once (`Policy::downloads`).
    slots: tokio::sync::Semaphore,
    pub metrics: Metrics,
    space: SpaceArgs,
    /// What is referenced; locked after `jobs` where both are held.
    refs: Mutex<Refs>,
}

#[derive(Default)]
struct Jobs {
    /// By repo@commit/path.
    files: HashMap<String, Arc<Progress>>,
    /// The download of each content.
    by_sha: HashMap<String, Arc<Progress>>,
}

impl Jobs {
    /// Forgets files that are present, and failures old enough to be tried again.
    fn prune(&mut self, policy: &Policy) {
        let keep = |p: &Arc<Progress>| match p.state() {
            State::Present => false,
            State::Failed => p.started.elapsed() < policy.retry_failed_after,
            _ => true,
        };
        self.files.retain(|_, p| keep(p));
        self.by_sha.retain(|_, p| keep(p));
    }

    /// The content downloading, queued, or waiting to be linked now: a file that follows another
    /// download of the same content is linked after that one is present, so its content is
    /// busy until then too, or the collector could delete the blob in between.
    fn busy(&self) -> std::collections::HashSet<String> {
        self.by_sha
            .values()
            .chain(self.files.values())
            .filter(|p| !matches!(p.state(), State::Present | State::Failed))
            .map(|p| p.file.sha256.clone())
            .collect()
    }

    /// Bytes the downloads under way have still to write.
    fn reserved(&self) -> u64 {
        self.by_sha
            .values()
            .filter(|p| !matches!(p.state(), State::Present | State::Failed))
            .map(|p| {
                p.file
                    .size
                    .saturating_sub(p.bytes_done.load(Ordering::Relaxed))
            })
            .fold(0u64, u64::saturating_add)
    }

    fn live(&self) -> usize {
        self.files
            .values()
            .filter(|p| !matches!(p.state(), State::Present | State::Failed))
            .count()
    }
}

impl Mirror {
    /// A mirror of the registry at `endpoint`, trusting the built-in roots.
    pub fn new(store: Store, endpoint: &str, policy: Policy) -> Result<Arc<Mirror>, HubError> {
        let registry = crate::hub::RegistryArgs {
            registry_endpoint: endpoint.into(),
            registry_ca_bundle: None,
        };
        Mirror::with_registry(store, registry, policy)
    }

    /// A mirror of `registry` (its endpoint and CA bundle), with the default disk settings.
    pub fn with_registry(
        store: Store,
        registry: crate::hub::RegistryArgs,
        policy: Policy,
    ) -> Result<Arc<Mirror>, HubError> {
        Mirror::build(store, registry, policy, SpaceArgs::default())
    }

    /// A mirror with its disk settings. Within a Tokio runtime it starts collecting the blobs
    /// no ModelServe references, once the operator has said which are.
    pub fn build(
        store: Store,
        registry: crate::hub::RegistryArgs,
        policy: Policy,
        space: SpaceArgs,
    ) -> Result<Arc<Mirror>, HubError> {
        // The download loop resumes after failures itself, so the client retries little.
        let retry = crate::hub::Retry {
            attempts: 2,
            base: policy.backoff,
            read_timeout: policy.read_timeout,
            ..Default::default()
        };
        let hub = registry.hub(None)?.with_retry(retry)?;
        let permits = policy
            .downloads
            .clamp(1, tokio::sync::Semaphore::MAX_PERMITS);
        let mirror = Arc::new(Mirror {
            store,
            registry,
            hub,
            retry,
            policy,
            jobs: Mutex::default(),
            slots: tokio::sync::Semaphore::new(permits),
            metrics: Default::default(),
            space,
            refs: Mutex::default(),
        });
        if tokio::runtime::Handle::try_current().is_ok() {
            let weak = Arc::downgrade(&mirror);
            tokio::spawn(collect(weak, space.interval()));
        }
        Ok(mirror)
    }

    /// The operator's live set: every sha256 some ModelServe's resolved set holds.
    pub fn tell_live(&self, live: std::collections::HashSet<String>) {
        let n = live.len();
        lock(&self.refs).tell(live, std::time::Instant::now());
        tracing::debug!(blobs = n, "the operator told the live set");
    }

    /// The unreferenced ones of `blobs` (the store's listing), oldest first; `busy` are the
    /// sha256 downloading now.
    fn candidates(
        &self,
        blobs: &[space::Blob],
        busy: &std::collections::HashSet<String>,
        refs: &mut Refs,
    ) -> Vec<(space::Blob, std::time::Duration)> {
        refs.unreferenced(blobs, busy, std::time::Instant::now(), self.space.pin())
    }

    /// The volume now: the filesystem's figures, the store's own bytes (`blobs`, its listing,
    /// and the partial downloads) against a capacity.
    fn volume(&self, blobs: &[space::Blob]) -> std::io::Result<(space::Volume, u64)> {
        self.volume_with(blobs, self.store.partial_bytes()?)
    }

    /// [`Self::volume`] with the partial downloads' bytes already listed.
    fn volume_with(
        &self,
        blobs: &[space::Blob],
        partial: u64,
    ) -> std::io::Result<(space::Volume, u64)> {
        let (total, free) = self.store.filesystem()?;
        let stored: u64 = blobs.iter().map(|b| b.size).sum();
        let bytes = stored.saturating_add(partial);
        Ok((
            space::Volume::of(total, free, bytes, self.space.capacity),
            bytes,
        ))
    }

    /// One pass of the collector: deletes what the grace and the watermarks say may go.
    pub fn collect_once(&self) -> std::io::Result<Vec<(space::Blob, space::Reason)>> {
        let mut jobs = lock(&self.jobs);
        let mut refs = lock(&self.refs);
        let blobs = self.store.blobs()?;
        let incomplete = self.store.incomplete()?;
        let busy = jobs.busy();
        let (volume, bytes) = self.volume_with(&blobs, incomplete.bytes)?;
        if refs.newly_stale(std::time::Instant::now()) {
            tracing::warn!(
                "the operator's live set is older than {}: nothing is deleted until it sends one again",
                crate::units::human_duration(space::LIVE_SET_STALE)
            );
        }
        let candidates = self.candidates(&blobs, &busy, &mut refs);
        let plan = space::plan(&candidates, volume, &self.space);
        for (b, reason) in &plan {
            self.delete(&mut jobs, b, *reason)?;
        }
        self.collect_partials(incomplete.partials, &busy, &refs)?;
        let gone: u64 = plan.iter().map(|(b, _)| b.size).sum();
        let reclaimable: u64 = candidates.iter().map(|(b, _)| b.size).sum::<u64>() - gone;
        self.metrics
            .store_bytes
            .set(gauge(bytes.saturating_sub(gone)));
        self.metrics.capacity_bytes.set(gauge(volume.total));
        self.metrics.reclaimable_bytes.set(gauge(reclaimable));
        if !plan.is_empty() {
            tracing::info!("{}", space::describe(&plan, self.space.grace));
        }
        Ok(plan)
    }

    /// Deletes the partial downloads nobody wants any more: not downloading, not referenced
    /// (the live set, a recent request), and untouched for the grace. A failed download of a
    /// file still referenced keeps its partial, so a retry resumes it.
    fn collect_partials(
        &self,
        partials: Vec<space::Blob>,
        busy: &std::collections::HashSet<String>,
        refs: &Refs,
    ) -> std::io::Result<()> {
        let (now, wall) = (std::time::Instant::now(), std::time::SystemTime::now());
        for p in partials {
            let idle = wall.duration_since(p.modified).unwrap_or_default();
            if idle < self.space.grace || refs.referenced(&p.sha256, busy, now, self.space.pin()) {
                continue;
            }
            self.store.remove_partial(&p.sha256)?;
            tracing::info!(sha256 = %p.sha256, bytes = p.size, "deleted an abandoned partial download");
        }
        Ok(())
    }

    /// Deletes a blob and forgets the jobs that found it present, so a later request for it
    /// fetches it again instead of answering from memory.
    fn delete(
        &self,
        jobs: &mut Jobs,
        b: &space::Blob,
        reason: space::Reason,
    ) -> std::io::Result<()> {
        jobs.files.retain(|_, p| p.file.sha256 != b.sha256);
        jobs.by_sha.remove(&b.sha256);
        let links = self.store.remove_blob(&b.sha256)?;
        let reason: &'static str = reason.into();
        tracing::info!(sha256 = %b.sha256, bytes = b.size, links, reason, "deleted an unreferenced blob");
        self.metrics.evicted(reason, b.size);
        Ok(())
    }

    /// Checks that the new content of `req` fits, making room from unreferenced blobs if that
    /// is enough. Content present or downloading already needs no room.
    fn room_for(&self, jobs: &mut Jobs, req: &Request) -> Result<(), RequestError> {
        let disk = |e: std::io::Error| RequestError::Disk(e.to_string());
        let mut refs = lock(&self.refs);
        let now = std::time::Instant::now();
        for f in &req.files {
            refs.requested(&f.sha256, now);
        }
        let busy = jobs.busy();
        let mut seen = std::collections::HashSet::new();
        let needed: u64 = req
            .files
            .iter()
            .filter(|f| seen.insert(f.sha256.as_str()))
            .filter(|f| !busy.contains(&f.sha256) && !self.store.has_blob(&f.sha256))
            .map(|f| f.size)
            .sum();
        if needed == 0 {
            return Ok(());
        }
        let reserved = jobs.reserved();
        let blobs = self.store.blobs().map_err(disk)?;
        let (volume, _) = self.volume(&blobs).map_err(disk)?;
        let room = volume.available.saturating_sub(reserved);
        if needed <= room {
            return Ok(());
        }
        let candidates = self.candidates(&blobs, &busy, &mut refs);
        match space::make_room(&candidates, needed - room) {
            Some(blobs) => {
                for b in &blobs {
                    self.delete(jobs, b, space::Reason::Capacity)
                        .map_err(disk)?;
                }
                Ok(())
            }
            None => Err(RequestError::NoRoom(NoRoom {
                needed,
                available: volume.available,
                reserved,
                reclaimable: candidates.iter().map(|(b, _)| b.size).sum(),
            })),
        }
    }

    /// Starts what is not present or under way, and reports every file's state.
    pub fn request(self: &Arc<Mirror>, req: &Request) -> Result<Status, RequestError> {
        request::check(req).map_err(RequestError::Invalid)?;
        let mut jobs = lock(&self.jobs);
        if jobs.files.len() > PRUNE_AT {
            jobs.prune(&self.policy);
        }
        let new = req
            .files
            .iter()
            .filter(|f| self.current(&jobs, f).is_none())
            .count();
        if new > 0 {
            let live = jobs.live();
            let most = self.policy.queue.max(1);
            if live.saturating_add(new) > most {
                return Err(RequestError::Busy { live, most });
            }
        }
        if new > 0 {
            self.room_for(&mut jobs, req)?;
        } else {
            let now = std::time::Instant::now();
            let mut refs = lock(&self.refs);
            for f in &req.files {
                refs.requested(&f.sha256, now);
            }
        }
        let progress: Vec<_> = req
            .files
            .iter()
            .map(|f| self.job(&mut jobs, f, req.token.as_ref()))
            .collect();
        drop(jobs);
        Ok(status(&progress))
    }

    /// The job of `f` that still answers for it: any but a failure old enough to be retried.
    fn current(&self, jobs: &Jobs, f: &FileRef) -> Option<Arc<Progress>> {
        // A failed file is tried again only after a pause, so asking for status is not a retry loop.
        jobs.files
            .get(&key(f))
            .filter(|p| {
                p.state() != State::Failed || p.started.elapsed() < self.policy.retry_failed_after
            })
            .cloned()
    }

    fn job(
        self: &Arc<Mirror>,
        jobs: &mut Jobs,
        f: &FileRef,
        token: Option<&Secret>,
    ) -> Arc<Progress> {
        if let Some(p) = self.current(jobs, f) {
            return p;
        }
        let p = Arc::new(Progress::new(f.clone()));
        jobs.files.insert(key(f), p.clone());
        // One download per content, whoever asks: other names for it wait for that one.
        if let Some(leader) = jobs
            .by_sha
            .get(&f.sha256)
            .filter(|l| l.state() != State::Failed)
            .cloned()
        {
            self.follow(p.clone(), leader);
            return p;
        }
        jobs.by_sha.insert(f.sha256.clone(), p.clone());
        let (mirror, job, token) = (self.clone(), p.clone(), token.cloned());
        tokio::spawn(async move { mirror.download(&job, token).await });
        p
    }

    /// Runs one download to its end and records the outcome.
    async fn download(&self, job: &Progress, token: Option<Secret>) {
        self.metrics.active.inc();
        let hub = match &token {
            None => Ok(self.hub.clone()),
            Some(t) => self
                .registry
                .hub(Some(t.clone()))
                .and_then(|h| h.with_retry(self.retry)),
        };
        let result = match hub {
            Ok(hub) => {
                fetch::fetch(
                    &hub,
                    &self.store,
                    job,
                    self.policy,
                    &self.metrics,
                    &self.slots,
                )
                .await
            }
            Err(e) => Err(FetchError::Registry(e, job.file.path.clone())),
        };
        self.metrics.active.dec();
        match result {
            Ok(()) if job.fetched.load(Ordering::Relaxed) > 0 => {
                tracing::info!(path = %job.file.path, bytes = job.file.size, "mirrored and verified");
                self.metrics.file("downloaded");
            }
            Ok(()) => self.metrics.file("reused"),
            Err(e) => {
                // A registry may quote the request back in its error: the token never goes on.
                let error = scrub(e.to_string(), token.as_ref());
                tracing::warn!(path = %job.file.path, %error, "mirroring failed");
                self.metrics.failure(e.kind());
                job.fail(error);
            }
        }
    }

    /// Links `me` once `leader` (the same content under another name) lands.
    fn follow(self: &Arc<Mirror>, me: Arc<Progress>, leader: Arc<Progress>) {
        let mirror = self.clone();
        tokio::spawn(async move {
            loop {
                me.bytes_done.store(
                    leader.bytes_done.load(Ordering::Relaxed).min(me.file.size),
                    Ordering::Relaxed,
                );
                match leader.state() {
                    State::Present => {
                        match mirror.store.adopt(&me.file) {
                            Ok(true) => me.set(State::Present),
                            Ok(false) => {
                                me.fail("the shared download vanished before it was linked".into())
                            }
                            Err(e) => me.fail(format!("{}: disk error: {e}", me.file.path)),
                        }
                        return;
                    }
                    State::Failed => return me.fail(leader.error().unwrap_or_default()),
                    s => me.set(s),
                }
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        });
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn gauge(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// The collector: a pass every `interval` while the mirror lives.
async fn collect(mirror: std::sync::Weak<Mirror>, interval: std::time::Duration) {
    // The same failure pass after pass is logged once, until it changes.
    let mut last: Option<String> = None;
    loop {
        tokio::time::sleep(interval).await;
        let Some(m) = mirror.upgrade() else { return };
        let told = lock(&m.refs).told();
        let pass = tokio::task::spawn_blocking(move || {
            if told {
                m.collect_once().map(|_| ())
            } else {
                // Nothing goes before the operator has spoken; the figures are kept current.
                m.store
                    .blobs()
                    .and_then(|b| m.volume(&b))
                    .map(|(v, bytes)| {
                        m.metrics.store_bytes.set(gauge(bytes));
                        m.metrics.capacity_bytes.set(gauge(v.total));
                    })
            }
        })
        .await;
        match pass {
            Ok(Err(e)) => {
                let e = e.to_string();
                if last.as_deref() != Some(e.as_str()) {
                    tracing::warn!(error = %e, "garbage collection could not read or delete in the store");
                }
                last = Some(e);
            }
            _ => last = None,
        }
    }
}

/// `text` with every occurrence of the token replaced by a placeholder.
fn scrub(text: String, token: Option<&Secret>) -> String {
    match token.map(Secret::expose).filter(|t| !t.is_empty()) {
        Some(t) if text.contains(t) => text.replace(t, "<redacted>"),
        _ => text,
    }
}

fn key(f: &FileRef) -> String {
    format!("{}@{}/{}", f.repo, f.commit, f.path)
}

fn status(progress: &[Arc<Progress>]) -> Status {
    let files: Vec<FileStatus> = progress
        .iter()
        .map(|p| {
            let state = p.state();
            FileStatus {
                path: p.file.path.clone(),
                state: state.as_str().into(),
                bytes_done: p.bytes_done.load(Ordering::Relaxed),
                size: p.file.size,
                bytes_per_second: if state == State::Downloading {
                    p.speed()
                } else {
                    0
                },
                error: p.error(),
            }
        })
        .collect();
    let sum =
        |get: fn(&FileStatus) -> u64| files.iter().fold(0u64, |a, f| a.saturating_add(get(f)));
    Status {
        bytes_done: sum(|f| f.bytes_done),
        bytes_total: sum(|f| f.size),
        bytes_per_second: sum(|f| f.bytes_per_second),
        files,
    }
}

#[cfg(test)]
mod tests;
