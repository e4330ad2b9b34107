//! One verified download: stream from the registry into `.incomplete/`, hashing as the bytes
//! arrive, resume after a broken connection from where it stopped, check size and sha256, and
//! only then move the file into place.

use std::io::{Read, Write};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use reqwest::StatusCode;
use sha2::{Digest, Sha256};

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
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            hash_attempts: 3,
            stalls: 8,
            backoff: Duration::from_secs(1),
            retry_failed_after: Duration::from_secs(60),
            read_timeout: Duration::from_secs(30),
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
    #[error("{path} needs {needed} more on the mirror's volume, which has {free} free")]
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

/// Downloads and verifies one file into the store; `p` follows along.
pub async fn fetch(
    hub: &Hub,
    store: &Store,
    p: &Progress,
    policy: Policy,
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
    let partial = store.partial(&f.sha256);
    let mut attempt = 0;
    loop {
        attempt += 1;
        // Hashing what a restart left behind reads up to the whole file: off the async threads.
        let (part, size) = (partial.clone(), f.size);
        let (mut hasher, mut have) = tokio::task::spawn_blocking(move || resume_from(&part, size))
            .await
            .map_err(|e| disk(std::io::Error::other(e)))?
            .map_err(disk)?;
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
        let mut stalls = 0;
        while have < f.size {
            let before = have;
            match stream_into(hub, f, &partial, &mut hasher, &mut have, p).await {
                Ok(()) => {}
                Err(Step::Fatal(e)) => return Err(e),
                Err(Step::Retry(cause)) => {
                    stalls = if have > before { 0 } else { stalls + 1 };
                    if stalls >= policy.stalls {
                        return Err(FetchError::Stalled {
                            path: f.path.clone(),
                            cause,
                            stalls,
                        });
                    }
                    tracing::info!(path = %f.path, have, %cause, "download interrupted; resuming");
                    tokio::time::sleep(policy.backoff * stalls.max(1)).await;
                }
            }
        }
        p.set(State::Verifying);
        let got = hex::encode(hasher.finalize());
        if got == f.sha256 {
            let (store, file) = (store.clone(), f.clone());
            tokio::task::spawn_blocking(move || store.commit(&file))
                .await
                .map_err(|e| disk(std::io::Error::other(e)))?
                .map_err(disk)?;
            p.set(State::Present);
            return Ok(());
        }
        // Wrong bytes are never kept: start over, and give up after the last attempt.
        let _ = std::fs::remove_file(&partial);
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

enum Step {
    Retry(String),
    Fatal(FetchError),
}

/// The hash of what a partial file already holds, and its length (reading it once).
fn resume_from(partial: &std::path::Path, size: u64) -> std::io::Result<(Sha256, u64)> {
    let mut hasher = Sha256::new();
    let mut file = match std::fs::File::open(partial) {
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

async fn stream_into(
    hub: &Hub,
    f: &FileRef,
    partial: &std::path::Path,
    hasher: &mut Sha256,
    have: &mut u64,
    p: &Progress,
) -> Result<(), Step> {
    let resp = hub
        .download(&f.repo, &f.commit, &f.path, *have)
        .await
        .map_err(|e| {
            if e.is_transient() {
                Step::Retry(e.to_string())
            } else {
                Step::Fatal(FetchError::Registry(e, f.path.clone()))
            }
        })?;
    let disk = |source| {
        Step::Fatal(FetchError::Disk {
            path: f.path.clone(),
            source,
        })
    };
    let mut out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(partial)
        .map_err(disk)?;
    if resp.status() == StatusCode::OK && *have > 0 {
        // The server ignored the Range: what comes is the whole file, so start over.
        out.set_len(0).map_err(disk)?;
        *hasher = Sha256::new();
        *have = 0;
    } else if resp.status() != StatusCode::PARTIAL_CONTENT && resp.status() != StatusCode::OK {
        return Err(Step::Retry(format!(
            "unexpected HTTP {}",
            resp.status().as_u16()
        )));
    }
    let mut body = resp.bytes_stream();
    while let Some(chunk) = body.next().await {
        let chunk =
            chunk.map_err(|e| Step::Retry(format!("the connection broke at byte {have}: {e}")))?;
        if *have + chunk.len() as u64 > f.size {
            drop(out);
            let _ = std::fs::remove_file(partial);
            return Err(Step::Fatal(FetchError::TooLong {
                path: f.path.clone(),
                size: f.size,
            }));
        }
        out.write_all(&chunk).map_err(disk)?;
        hasher.update(&chunk);
        *have += chunk.len() as u64;
        p.bytes_done.store(*have, Ordering::Relaxed);
        p.fetched.fetch_add(chunk.len() as u64, Ordering::Relaxed);
    }
    if *have < f.size {
        return Err(Step::Retry(format!(
            "the body ended at byte {have} of {}",
            f.size
        )));
    }
    Ok(())
}
