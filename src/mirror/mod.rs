//! `modelserve mirror`: the one place a model file is fetched and verified for the whole
//! cluster. Requests name (repo, commit, path, sha256, size), never a URL; the mirror builds the
//! URL for its configured registry only. Two requests for the same content share one download,
//! and content already present is never fetched again.

pub mod fetch;
pub mod metrics;
pub mod store;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use axum::Json;
use axum::Router;
use axum::body::Body;
use axum::extract::{Path, State as AxState};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::{Deserialize, Serialize};

use fetch::{Policy, Progress, State};
use store::{FileRef, Store};

use crate::hub::Hub;

/// Settings of `modelserve mirror`.
#[derive(Clone, Debug, clap::Args)]
pub struct Config {
    /// Directory of the store (a PersistentVolume in the cluster).
    #[arg(long, env = "MODELSERVE_MIRROR_DIR")]
    pub dir: std::path::PathBuf,
    /// Address to serve the mirror API and files on.
    #[arg(long, env = "MODELSERVE_MIRROR_ADDR", default_value = "0.0.0.0:8090")]
    pub addr: SocketAddr,
    /// Registry speaking the Hugging Face Hub API; the only place files are fetched from.
    #[arg(long, env = "MODELSERVE_REGISTRY_ENDPOINT", default_value = crate::hub::DEFAULT_ENDPOINT)]
    pub registry_endpoint: String,
    /// Most Range connections per file. A download starts with one and opens another while the
    /// sha256 waits for bytes; files smaller than two segments use one.
    #[arg(long, env = "MODELSERVE_MIRROR_CONNECTIONS", default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub connections: u16,
    /// Files downloading at once; more wait, queued (each holds its connections and an 8 MiB
    /// hashing buffer).
    #[arg(long, env = "MODELSERVE_MIRROR_DOWNLOADS", default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub downloads: u16,
    /// Bytes one connection asks for at a time (at least 1Mi), e.g. 64Mi.
    #[arg(long, env = "MODELSERVE_MIRROR_SEGMENT", default_value = "64Mi", value_parser = parse_segment)]
    pub segment_size: u64,
}

fn parse_segment(s: &str) -> Result<u64, String> {
    match crate::units::parse_quantity(s) {
        Some(b) if b >= 1 << 20 => Ok(b),
        Some(_) => Err(format!("{s} is below the smallest segment, 1Mi")),
        None => Err(format!("{s} is not a size such as 64Mi or 1Gi")),
    }
}

/// A fetch or status request.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Request {
    pub files: Vec<FileRef>,
    /// Registry token for gated or private repositories; used for these files only, never logged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
}

/// The state of one file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FileStatus {
    pub path: String,
    pub state: String,
    pub bytes_done: u64,
    pub size: u64,
    pub bytes_per_second: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The state of a whole request.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    pub files: Vec<FileStatus>,
    pub bytes_done: u64,
    pub bytes_total: u64,
    pub bytes_per_second: u64,
}

/// The running mirror.
pub struct Mirror {
    store: Store,
    endpoint: String,
    policy: Policy,
    jobs: Mutex<Jobs>,
    /// One permit per file that may download at once (`Policy::downloads`).
    slots: tokio::sync::Semaphore,
    pub metrics: metrics::Metrics,
}

#[derive(Default)]
struct Jobs {
    /// By repo@commit/path.
    files: HashMap<String, Arc<Progress>>,
    /// The download of each content.
    by_sha: HashMap<String, Arc<Progress>>,
}

impl Mirror {
    pub fn new(
        store: Store,
        endpoint: &str,
        policy: Policy,
    ) -> Result<Arc<Mirror>, crate::hub::HubError> {
        Hub::new(endpoint, None)?;
        Ok(Arc::new(Mirror {
            store,
            endpoint: endpoint.into(),
            policy,
            jobs: Mutex::default(),
            slots: tokio::sync::Semaphore::new(policy.downloads.max(1)),
            metrics: Default::default(),
        }))
    }

    /// Starts what is not present or under way, and reports every file's state.
    pub fn request(self: &Arc<Mirror>, req: &Request) -> Result<Status, String> {
        for f in &req.files {
            f.validate().map_err(|e| e.to_string())?;
        }
        let mut progress = Vec::with_capacity(req.files.len());
        for f in &req.files {
            progress.push(self.job(f, req.token.clone()));
        }
        Ok(status(&progress))
    }

    fn job(self: &Arc<Mirror>, f: &FileRef, token: Option<String>) -> Arc<Progress> {
        let mut jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        // A failed file is tried again only after a pause, so asking for status is not a retry loop.
        let live = |p: &Arc<Progress>| {
            p.state() != State::Failed || p.started.elapsed() < self.policy.retry_failed_after
        };
        if let Some(p) = jobs.files.get(&key(f)).filter(|p| live(p)) {
            return p.clone();
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
        let (mirror, job) = (self.clone(), p.clone());
        tokio::spawn(async move {
            // The download loop resumes after failures itself, so the client retries little.
            let retry = crate::hub::Retry {
                attempts: 2,
                base: mirror.policy.backoff,
                read_timeout: mirror.policy.read_timeout,
                ..Default::default()
            };
            mirror.metrics.active.inc();
            let result = match Hub::new(&mirror.endpoint, token.map(crate::secret::Secret::new))
                .and_then(|h| h.with_retry(retry))
            {
                Ok(hub) => {
                    fetch::fetch(
                        &hub,
                        &mirror.store,
                        &job,
                        mirror.policy,
                        &mirror.metrics,
                        &mirror.slots,
                    )
                    .await
                }
                Err(e) => Err(fetch::FetchError::Registry(e, job.file.path.clone())),
            };
            mirror.metrics.active.dec();
            match result {
                Ok(()) if job.fetched.load(Ordering::Relaxed) > 0 => {
                    tracing::info!(path = %job.file.path, bytes = job.file.size, "mirrored and verified");
                    mirror.metrics.file("downloaded");
                }
                Ok(()) => mirror.metrics.file("reused"),
                Err(e) => {
                    tracing::warn!(path = %job.file.path, error = %e, "mirroring failed");
                    mirror.metrics.failure(e.kind());
                    job.fail(e.to_string());
                }
            }
        });
        p
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

fn key(f: &FileRef) -> String {
    format!("{}@{}/{}", f.repo, f.commit, f.path)
}

fn status(progress: &[Arc<Progress>]) -> Status {
    let files: Vec<FileStatus> = progress
        .iter()
        .map(|p| FileStatus {
            path: p.file.path.clone(),
            state: serde_json::to_value(p.state())
                .ok()
                .and_then(|v| v.as_str().map(String::from))
                .unwrap_or_default(),
            bytes_done: p.bytes_done.load(Ordering::Relaxed),
            size: p.file.size,
            bytes_per_second: if p.state() == State::Downloading {
                p.speed()
            } else {
                0
            },
            error: p.error(),
        })
        .collect();
    Status {
        bytes_done: files.iter().map(|f| f.bytes_done).sum(),
        bytes_total: files.iter().map(|f| f.size).sum(),
        bytes_per_second: files.iter().map(|f| f.bytes_per_second).sum(),
        files,
    }
}

/// The mirror's HTTP API.
pub fn router(mirror: Arc<Mirror>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/metrics",
            get(|AxState(m): AxState<Arc<Mirror>>| async move {
                (
                    [(
                        header::CONTENT_TYPE,
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    )],
                    m.metrics.encode(),
                )
            }),
        )
        .route("/v1/fetch", post(fetch_files))
        .route("/v1/files/{owner}/{name}/{commit}/{*path}", get(serve_file))
        .with_state(mirror)
}

async fn fetch_files(AxState(m): AxState<Arc<Mirror>>, Json(req): Json<Request>) -> Response {
    match m.request(&req) {
        Ok(s) => (StatusCode::ACCEPTED, Json(s)).into_response(),
        Err(e) => (
            StatusCode::BAD_REQUEST,
            Json(serde_json::json!({ "error": e })),
        )
            .into_response(),
    }
}

/// Serves a present file, with Range, for the replicas' init container.
async fn serve_file(
    AxState(m): AxState<Arc<Mirror>>,
    Path((owner, name, commit, path)): Path<(String, String, String, String)>,
    headers: HeaderMap,
) -> Response {
    use tokio::io::{AsyncReadExt, AsyncSeekExt};
    let f = FileRef {
        repo: format!("{owner}/{name}"),
        commit,
        path,
        sha256: "0".repeat(64),
        size: 0,
    };
    if let Err(e) = f.validate() {
        return (StatusCode::BAD_REQUEST, e.to_string()).into_response();
    }
    let snapshot = m.store.snapshot(&f);
    let Ok(mut file) = tokio::fs::File::open(&snapshot).await else {
        return (StatusCode::NOT_FOUND, "not present on the mirror").into_response();
    };
    let size = match file.metadata().await {
        Ok(meta) => meta.len(),
        Err(_) => return StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    };
    let range = headers
        .get(header::RANGE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (s, e) = v.strip_prefix("bytes=")?.split_once('-')?;
            let start: u64 = s.parse().ok()?;
            let end: u64 = if e.is_empty() {
                size.checked_sub(1)?
            } else {
                e.parse::<u64>().ok()?.min(size.checked_sub(1)?)
            };
            (start <= end).then_some((start, end))
        });
    let (status, start, len) = match range {
        Some((s, e)) => (StatusCode::PARTIAL_CONTENT, s, e - s + 1),
        None if headers.contains_key(header::RANGE) => {
            return (
                StatusCode::RANGE_NOT_SATISFIABLE,
                [(header::CONTENT_RANGE, format!("bytes */{size}"))],
            )
                .into_response();
        }
        None => (StatusCode::OK, 0, size),
    };
    if file.seek(std::io::SeekFrom::Start(start)).await.is_err() {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    }
    let stream = tokio_util::io::ReaderStream::new(file.take(len));
    let mut resp = Response::builder()
        .status(status)
        .header(header::ACCEPT_RANGES, "bytes")
        .header(header::CONTENT_LENGTH, len.to_string());
    if status == StatusCode::PARTIAL_CONTENT {
        resp = resp.header(
            header::CONTENT_RANGE,
            format!("bytes {start}-{}/{size}", start + len - 1),
        );
    }
    resp.body(Body::from_stream(stream))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

/// Runs `modelserve mirror` until the process ends.
pub async fn run(config: Config) -> Result<(), String> {
    let store = Store::open(&config.dir)
        .map_err(|e| format!("cannot open the store at {}: {e}", config.dir.display()))?;
    let policy = Policy {
        connections: config.connections.into(),
        segment: config.segment_size,
        downloads: config.downloads.into(),
        ..Policy::default()
    };
    let mirror = Mirror::new(store, &config.registry_endpoint, policy)
        .map_err(|e| format!("--registry-endpoint: {e}"))?;
    let listener = tokio::net::TcpListener::bind(config.addr)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", config.addr))?;
    tracing::info!(addr = %config.addr, dir = %config.dir.display(), "mirror serving");
    axum::serve(listener, router(mirror))
        .await
        .map_err(|e| e.to_string())
}
