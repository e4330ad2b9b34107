//! `modelserve pull`: the replicas' init container. Copies a model's files from the cluster's
//! mirror into the pod's volume, hashing while the bytes arrive, resuming a partial copy with a
//! Range request, and moving a file into place only when its size and sha256 are the ones the
//! registry published. A file already in place and intact is not copied again.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use sha2::{Digest, Sha256};
use url::Url;

use crate::hub::check_repo;
use crate::hub::select::safe_path;
use crate::mirror::fetch::resume_from;
use crate::mirror::store::free_space;
use crate::units::human_bytes;

/// Flags of `modelserve pull`.
#[derive(Clone, Debug, clap::Args)]
pub struct Args {
    /// The cluster's model mirror (`modelserve mirror`), for example http://modelserve-mirror:8090.
    #[arg(long)]
    pub mirror: String,
    /// Repository the files belong to, as owner/name.
    #[arg(long)]
    pub repo: String,
    /// The pinned commit (40 hex digits).
    #[arg(long)]
    pub commit: String,
    /// Directory the files go into (the pod's model volume).
    #[arg(long)]
    pub dest: PathBuf,
    /// A file to pull, as SHA256:SIZE:PATH (PATH relative, may contain '/'); repeat per file.
    #[arg(long = "file", required = true, value_name = "SHA256:SIZE:PATH")]
    pub files: Vec<String>,
    /// Seconds to wait for the mirror to accept a connection.
    #[arg(long, default_value_t = 10, value_name = "SECONDS")]
    pub connect_timeout: u64,
    /// Seconds without a byte from the mirror before a connection counts as stalled.
    #[arg(long, default_value_t = 30, value_name = "SECONDS")]
    pub stall_timeout: u64,
    /// Copies from scratch after a sha256 mismatch before giving up.
    #[arg(long, default_value_t = 3, value_name = "N")]
    pub attempts: u32,
}

/// One file to pull, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wanted {
    pub sha256: String,
    pub size: u64,
    pub path: String,
}

/// Why a pull failed; the Display is the one line the init container's log ends with.
#[derive(Debug, thiserror::Error)]
pub enum PullError {
    #[error("{flag} {value:?}: {why}")]
    Input {
        flag: &'static str,
        value: String,
        why: String,
    },
    #[error("{path} arrived with sha256 {got}, the mirror published {want} ({attempts} attempts)")]
    Mismatch {
        path: String,
        got: String,
        want: String,
        attempts: u32,
    },
    #[error(
        "{path}: the mirror has a file of {got} bytes where the registry published {want}; the mirror's copy is not the published file"
    )]
    WrongSize { path: String, got: u64, want: u64 },
    #[error("{path} needs {needed} more in {dest}, which has {free} free")]
    NoSpace {
        path: String,
        dest: String,
        needed: String,
        free: String,
    },
    #[error("the {count} files still to pull need {needed} in {dest}, which has {free} free")]
    NoSpaceForAll {
        count: usize,
        dest: String,
        needed: String,
        free: String,
    },
    #[error(
        "{dest} filled up while writing {path}: it needs {size}, {free} is free now (the partial copy of {written} was removed)"
    )]
    DiskFull {
        path: String,
        dest: String,
        written: String,
        size: String,
        free: String,
    },
    #[error(
        "{path} is not on the mirror ({url} answered 404); the Mirror stage puts it there first"
    )]
    NotOnMirror { path: String, url: String },
    #[error("{path}: {cause} (gave up after {tries} attempts without progress)")]
    Unreachable {
        path: String,
        cause: String,
        tries: u32,
    },
    #[error("{path}: the mirror refused the request: HTTP {status} {body}")]
    Refused {
        path: String,
        status: u16,
        body: String,
    },
    #[error("{path}: disk error in {dest}: {source}")]
    Disk {
        path: String,
        dest: String,
        #[source]
        source: std::io::Error,
    },
}

/// The checked command line.
#[derive(Clone, Debug)]
pub struct Plan {
    pub mirror: Url,
    pub owner: String,
    pub name: String,
    pub commit: String,
    pub dest: PathBuf,
    pub files: Vec<Wanted>,
}

/// Resumes without progress before a file gives up.
const STALLS: u32 = 5;

impl Plan {
    /// Checks every flag, naming the one that is wrong and what would be valid.
    pub fn new(args: &Args) -> Result<Plan, PullError> {
        let input = |flag, value: &str, why: &str| PullError::Input {
            flag,
            value: value.into(),
            why: why.into(),
        };
        let mirror = Url::parse(&args.mirror)
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https") && u.has_host())
            .filter(|u| u.query().is_none() && u.fragment().is_none())
            .ok_or_else(|| {
                input(
                    "--mirror",
                    &args.mirror,
                    "it must be an http(s) URL like http://modelserve-mirror:8090",
                )
            })?;
        check_repo(&args.repo).map_err(|_| {
            input(
                "--repo",
                &args.repo,
                "it must be owner/name, letters, digits, '-', '_' and '.' (for example bartowski/Qwen2.5-7B-Instruct-GGUF)",
            )
        })?;
        let (owner, name) = args.repo.split_once('/').unwrap_or_default();
        let commit = args.commit.to_ascii_lowercase();
        if !is_hex(&commit, 40) {
            return Err(input(
                "--commit",
                &args.commit,
                "it must be the pinned commit, 40 hex digits",
            ));
        }
        if args.dest.as_os_str().is_empty() {
            return Err(input("--dest", "", "it must name a directory"));
        }
        if args.attempts == 0 {
            return Err(input("--attempts", "0", "it must be at least 1"));
        }
        let mut files: Vec<Wanted> = Vec::with_capacity(args.files.len());
        for spec in &args.files {
            let f = parse_file(spec)?;
            if files.iter().any(|g| g.path == f.path) {
                return Err(input("--file", spec, "this path is given more than once"));
            }
            files.push(f);
        }
        if files.is_empty() {
            return Err(input("--file", "", "give at least one SHA256:SIZE:PATH"));
        }
        Ok(Plan {
            mirror,
            owner: owner.into(),
            name: name.into(),
            commit,
            dest: args.dest.clone(),
            files,
        })
    }

    /// The mirror's URL of one file: `{mirror}/v1/files/{owner}/{name}/{commit}/{path}`.
    pub fn url(&self, path: &str) -> Url {
        let mut u = self.mirror.clone();
        if let Ok(mut segs) = u.path_segments_mut() {
            segs.pop_if_empty()
                .extend(["v1", "files", &self.owner, &self.name, &self.commit])
                .extend(path.split('/'));
        }
        u
    }
}

fn is_hex(s: &str, n: usize) -> bool {
    s.len() == n && s.bytes().all(|c| c.is_ascii_hexdigit())
}

/// `SHA256:SIZE:PATH`, the form the operator writes into the init container's args.
pub fn parse_file(spec: &str) -> Result<Wanted, PullError> {
    let input = |why: &str| PullError::Input {
        flag: "--file",
        value: spec.into(),
        why: why.into(),
    };
    let mut parts = spec.splitn(3, ':');
    let (Some(sha), Some(size), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(input("it must be SHA256:SIZE:PATH"));
    };
    let sha256 = sha.to_ascii_lowercase();
    if !is_hex(&sha256, 64) {
        return Err(input("the sha256 must be 64 hex digits"));
    }
    let size: u64 = size
        .parse()
        .map_err(|_| input("the size must be a whole number of bytes"))?;
    if !safe_path(path) {
        return Err(input(
            "the path must be relative, inside the destination, without '..' (for example Q4_K_M/model-00001-of-00002.gguf)",
        ));
    }
    Ok(Wanted {
        sha256,
        size,
        path: path.into(),
    })
}

/// Runs `modelserve pull`: every file present and verified in `--dest`, or the reason why not.
pub async fn run(args: Args) -> Result<(), String> {
    let plan = Plan::new(&args).map_err(|e| e.to_string())?;
    let limits = Limits {
        stall: Duration::from_secs(args.stall_timeout.max(1)),
        attempts: args.attempts,
        backoff: Duration::from_millis(500),
    };
    let http = reqwest::Client::builder()
        // Stalls are timed per request and per chunk in `Job::stream`, which says which it was.
        .connect_timeout(Duration::from_secs(args.connect_timeout.max(1)))
        .no_proxy()
        .build()
        .map_err(|e| format!("cannot build the HTTP client: {e}"))?;
    pull(&http, &plan, limits, &mut std::io::stderr())
        .await
        .map_err(|e| e.to_string())
}

/// Limits of one pull.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Longest silence from the mirror.
    pub stall: Duration,
    /// Copies from scratch after a sha256 mismatch.
    pub attempts: u32,
    pub backoff: Duration,
}

/// Pulls every file of `plan`, printing progress lines to `out`.
pub async fn pull(
    http: &reqwest::Client,
    plan: &Plan,
    limits: Limits,
    out: &mut impl Write,
) -> Result<(), PullError> {
    let started = Instant::now();
    let dest = plan.dest.display().to_string();
    let total: u64 = plan.files.iter().map(|f| f.size).sum();
    let _ = writeln!(
        out,
        "pulling {} file(s), {}, of {}/{}@{} from {} into {dest}",
        plan.files.len(),
        human_bytes(total),
        plan.owner,
        plan.name,
        &plan.commit[..12],
        plan.mirror
    );
    std::fs::create_dir_all(&plan.dest).map_err(|source| PullError::Disk {
        path: plan.files[0].path.clone(),
        dest: dest.clone(),
        source,
    })?;
    check_room_for_all(plan)?;
    for f in &plan.files {
        let job = Job::new(plan, f, limits);
        if let Some(parent) = job.target.parent() {
            std::fs::create_dir_all(parent).map_err(|e| job.disk(e))?;
        }
        if already_present(&job.target, f)
            .await
            .map_err(|e| job.disk(e))?
        {
            let _ = writeln!(out, "{}: already present, sha256 verified", f.path);
            continue;
        }
        job.run(http, out).await?;
    }
    let _ = writeln!(
        out,
        "all {} file(s) present and verified in {dest} ({}, {:.1}s)",
        plan.files.len(),
        human_bytes(total),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Fails before the first byte moves when the files still to pull cannot all fit (a file in
/// place of the right size counts as pulled; its hash is checked later).
fn check_room_for_all(plan: &Plan) -> Result<(), PullError> {
    let len = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    let mut count = 0;
    let mut needed = 0u64;
    for f in &plan.files {
        let target = plan.dest.join(&f.path);
        if len(&target) == f.size && target.is_file() {
            continue;
        }
        count += 1;
        needed += f.size.saturating_sub(len(&part_path(&target)));
    }
    let free = free_space(&plan.dest).map_err(|source| PullError::Disk {
        path: plan.files[0].path.clone(),
        dest: plan.dest.display().to_string(),
        source,
    })?;
    if count > 1 && free < needed {
        return Err(PullError::NoSpaceForAll {
            count,
            dest: plan.dest.display().to_string(),
            needed: human_bytes(needed),
            free: human_bytes(free),
        });
    }
    Ok(())
}

/// Whether `target` holds the file already; a wrong copy is removed.
async fn already_present(target: &Path, f: &Wanted) -> std::io::Result<bool> {
    match std::fs::metadata(target) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
        Ok(m) if m.is_file() && m.len() == f.size => {}
        Ok(_) => {
            tracing::warn!(path = %f.path, "a file of another size is in the way; replacing it");
            std::fs::remove_file(target)?;
            return Ok(false);
        }
    }
    let (path, size) = (target.to_path_buf(), f.size);
    let (hasher, _) = tokio::task::spawn_blocking(move || resume_from(&path, size))
        .await
        .map_err(std::io::Error::other)??;
    let got = hex::encode(hasher.finalize());
    if got == f.sha256 {
        return Ok(true);
    }
    tracing::warn!(path = %f.path, %got, want = %f.sha256, "the file in place has another sha256; replacing it");
    std::fs::remove_file(target)?;
    Ok(false)
}

/// Where a copy grows until it is verified: `DIR/PATH.part`.
fn part_path(target: &Path) -> PathBuf {
    let mut s = target.as_os_str().to_owned();
    s.push(".part");
    PathBuf::from(s)
}

/// An interrupted request: retry (resuming), or give up with this error.
enum Step {
    Retry(String),
    Fatal(PullError),
}

/// Whether an I/O error means the filesystem has no room (ENOSPC, EDQUOT, or EFBIG from a file
/// size limit).
fn is_out_of_space(e: &std::io::Error) -> bool {
    use rustix::io::Errno;
    matches!(
        Errno::from_io_error(e),
        Some(Errno::NOSPC | Errno::DQUOT | Errno::FBIG)
    )
}

/// The copy of one file.
struct Job<'a> {
    plan: &'a Plan,
    f: &'a Wanted,
    target: PathBuf,
    part: PathBuf,
    url: Url,
    limits: Limits,
}

/// Where one copy stands: the hash and length of what `DIR/PATH.part` holds.
struct Copy {
    hasher: Sha256,
    have: u64,
    progress: Progress,
}

impl Copy {
    fn restart(&mut self) {
        self.hasher = Sha256::new();
        self.have = 0;
        self.progress.fetched = 0;
    }
}

impl<'a> Job<'a> {
    fn new(plan: &'a Plan, f: &'a Wanted, limits: Limits) -> Job<'a> {
        let target = plan.dest.join(&f.path);
        Job {
            plan,
            f,
            part: part_path(&target),
            target,
            url: plan.url(&f.path),
            limits,
        }
    }

    fn disk(&self, source: std::io::Error) -> PullError {
        PullError::Disk {
            path: self.f.path.clone(),
            dest: self.plan.dest.display().to_string(),
            source,
        }
    }

    /// The error for a volume that filled up after `written` bytes.
    fn full(&self, written: u64) -> PullError {
        PullError::DiskFull {
            path: self.f.path.clone(),
            dest: self.plan.dest.display().to_string(),
            written: human_bytes(written),
            size: human_bytes(self.f.size),
            free: free_space(&self.plan.dest)
                .map(human_bytes)
                .unwrap_or_else(|e| format!("unknown ({e})")),
        }
    }

    /// An I/O error while writing: a full volume frees what this copy took, so nothing else on
    /// it starves, and says so.
    fn write_error(&self, e: std::io::Error, written: u64) -> PullError {
        if is_out_of_space(&e) {
            let _ = std::fs::remove_file(&self.part);
            self.full(written)
        } else {
            self.disk(e)
        }
    }

    async fn run(&self, http: &reqwest::Client, out: &mut impl Write) -> Result<(), PullError> {
        let f = self.f;
        let mut attempt = 0;
        loop {
            attempt += 1;
            // Hashing what an earlier run left reads up to the whole file: off the async threads.
            let (p, size) = (self.part.clone(), f.size);
            let (hasher, have) = tokio::task::spawn_blocking(move || resume_from(&p, size))
                .await
                .map_err(|e| self.disk(std::io::Error::other(e)))?
                .map_err(|e| self.disk(e))?;
            let free = free_space(&self.plan.dest).map_err(|e| self.disk(e))?;
            if free < f.size - have {
                return Err(PullError::NoSpace {
                    path: f.path.clone(),
                    dest: self.plan.dest.display().to_string(),
                    needed: human_bytes(f.size - have),
                    free: human_bytes(free),
                });
            }
            if have > 0 {
                let _ = writeln!(
                    out,
                    "{}: resuming at {} of {}",
                    f.path,
                    human_bytes(have),
                    human_bytes(f.size)
                );
            } else {
                let _ = writeln!(out, "{}: pulling {}", f.path, human_bytes(f.size));
            }
            let mut copy = Copy {
                hasher,
                have,
                progress: Progress::new(f),
            };
            let mut stalls = 0;
            while copy.have < f.size {
                let before = copy.have;
                match self.stream(http, &mut copy, out).await {
                    Ok(()) => {}
                    Err(Step::Fatal(e)) => return Err(e),
                    Err(Step::Retry(cause)) => {
                        stalls = if copy.have > before { 0 } else { stalls + 1 };
                        if stalls >= STALLS {
                            return Err(PullError::Unreachable {
                                path: f.path.clone(),
                                cause,
                                tries: stalls,
                            });
                        }
                        tracing::debug!(path = %f.path, have = copy.have, %cause, "copy interrupted");
                        let _ = writeln!(
                            out,
                            "{}: {cause}; resuming at {}",
                            f.path,
                            human_bytes(copy.have)
                        );
                        tokio::time::sleep(self.limits.backoff * stalls.max(1)).await;
                    }
                }
            }
            let got = hex::encode(copy.hasher.finalize());
            if got == f.sha256 {
                let (p, t) = (self.part.clone(), self.target.clone());
                tokio::task::spawn_blocking(move || place(&p, &t))
                    .await
                    .map_err(|e| self.disk(std::io::Error::other(e)))?
                    .map_err(|e| self.write_error(e, f.size))?;
                let _ = writeln!(
                    out,
                    "{}: {} verified (sha256 {}) in {:.1}s",
                    f.path,
                    human_bytes(f.size),
                    &got[..16],
                    copy.progress.started.elapsed().as_secs_f64()
                );
                return Ok(());
            }
            // Wrong bytes are never kept: copy again from scratch, give up after the last attempt.
            let _ = std::fs::remove_file(&self.part);
            if attempt >= self.limits.attempts {
                return Err(PullError::Mismatch {
                    path: f.path.clone(),
                    got,
                    want: f.sha256.clone(),
                    attempts: attempt,
                });
            }
            tracing::warn!(path = %f.path, %got, want = %f.sha256, attempt, "sha256 mismatch; copying again");
            tokio::time::sleep(self.limits.backoff * attempt).await;
        }
    }

    /// One request: from `copy.have` to the end, or until the connection breaks.
    async fn stream(
        &self,
        http: &reqwest::Client,
        copy: &mut Copy,
        out: &mut impl Write,
    ) -> Result<(), Step> {
        let f = self.f;
        let stall = self.limits.stall;
        let mut req = http
            .get(self.url.clone())
            .header(reqwest::header::ACCEPT_ENCODING, "identity")
            .header(
                reqwest::header::USER_AGENT,
                concat!("modelserve-pull/", env!("CARGO_PKG_VERSION")),
            );
        if copy.have > 0 {
            req = req.header(reqwest::header::RANGE, format!("bytes={}-", copy.have));
        }
        let mut resp = match tokio::time::timeout(stall, req.send()).await {
            Err(_) => {
                return Err(Step::Retry(format!(
                    "the mirror sent no answer in {}s",
                    stall.as_secs()
                )));
            }
            Ok(Err(e)) => return Err(Step::Retry(describe(&e))),
            Ok(Ok(resp)) => resp,
        };
        let wrong_size = |got| {
            Step::Fatal(PullError::WrongSize {
                path: f.path.clone(),
                got,
                want: f.size,
            })
        };
        match resp.status() {
            StatusCode::OK => {
                if let Some(len) = resp.content_length().filter(|&n| n != f.size) {
                    return Err(wrong_size(len));
                }
                if copy.have > 0 {
                    // The server ignored the Range: the whole file comes, so start over.
                    tracing::info!(path = %f.path, have = copy.have, "the mirror answered a Range with the whole file; starting over");
                    std::fs::OpenOptions::new()
                        .write(true)
                        .open(&self.part)
                        .and_then(|p| p.set_len(0))
                        .map_err(|e| Step::Fatal(self.disk(e)))?;
                    copy.restart();
                }
            }
            StatusCode::PARTIAL_CONTENT => match content_range(&resp) {
                Some((_, total)) if total != f.size => return Err(wrong_size(total)),
                Some((start, _)) if start == copy.have => {}
                other => {
                    return Err(Step::Retry(format!(
                        "the mirror answered a Range from byte {} with one from {:?}",
                        copy.have,
                        other.map(|(s, _)| s)
                    )));
                }
            },
            StatusCode::NOT_FOUND => {
                return Err(Step::Fatal(PullError::NotOnMirror {
                    path: f.path.clone(),
                    url: self.url.to_string(),
                }));
            }
            StatusCode::RANGE_NOT_SATISFIABLE => {
                // The mirror's file is shorter than the partial copy: that cannot be its start.
                let _ = std::fs::remove_file(&self.part);
                copy.restart();
                return Err(Step::Retry(
                    "the mirror cannot continue the partial copy; starting over".into(),
                ));
            }
            s if s.is_server_error() || s == StatusCode::TOO_MANY_REQUESTS => {
                return Err(Step::Retry(format!(
                    "the mirror answered HTTP {}",
                    s.as_u16()
                )));
            }
            s => {
                let body = resp.text().await.unwrap_or_default();
                return Err(Step::Fatal(PullError::Refused {
                    path: f.path.clone(),
                    status: s.as_u16(),
                    body: body.chars().take(200).collect::<String>().trim().into(),
                }));
            }
        }
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.part)
            .map_err(|e| Step::Fatal(self.write_error(e, copy.have)))?;
        loop {
            let chunk = match tokio::time::timeout(stall, resp.chunk()).await {
                Err(_) => {
                    return Err(Step::Retry(format!(
                        "the mirror sent nothing for {}s at byte {}",
                        stall.as_secs(),
                        copy.have
                    )));
                }
                Ok(Err(e)) => {
                    return Err(Step::Retry(format!(
                        "the connection broke at byte {}: {}",
                        copy.have,
                        describe(&e)
                    )));
                }
                Ok(Ok(None)) => break,
                Ok(Ok(Some(c))) => c,
            };
            let n = chunk.len() as u64;
            if copy.have + n > f.size {
                drop(file);
                let _ = std::fs::remove_file(&self.part);
                return Err(wrong_size(copy.have + n));
            }
            if let Err(e) = file.write_all(&chunk) {
                drop(file);
                return Err(Step::Fatal(self.write_error(e, copy.have)));
            }
            copy.hasher.update(&chunk);
            copy.have += n;
            copy.progress.tick(copy.have, n, out);
        }
        if copy.have < f.size {
            return Err(Step::Retry(format!(
                "the body ended at byte {} of {}",
                copy.have, f.size
            )));
        }
        Ok(())
    }
}

/// Makes a verified copy durable and moves it into place.
fn place(part: &Path, target: &Path) -> std::io::Result<()> {
    std::fs::File::open(part)?.sync_all()?;
    std::fs::rename(part, target)?;
    if let Some(dir) = target.parent() {
        // The rename itself survives a crash only once the directory is synced.
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// The start of a `Content-Range: bytes START-END/TOTAL` header, and TOTAL.
fn content_range(resp: &reqwest::Response) -> Option<(u64, u64)> {
    let v = resp
        .headers()
        .get(reqwest::header::CONTENT_RANGE)?
        .to_str()
        .ok()?;
    let (range, total) = v.strip_prefix("bytes ")?.split_once('/')?;
    let (start, _) = range.split_once('-')?;
    Some((start.parse().ok()?, total.parse().ok()?))
}

/// One line for a failed request, with the innermost cause (reqwest's own text says little).
fn describe(e: &reqwest::Error) -> String {
    let mut msg = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        msg = format!("{msg}: {s}");
        src = s.source();
    }
    if e.is_connect() {
        format!("cannot connect to the mirror: {msg}")
    } else if e.is_timeout() {
        format!("the mirror stalled: {msg}")
    } else {
        msg
    }
}

/// Progress lines for one file, at most one every few seconds.
struct Progress {
    path: String,
    size: u64,
    started: Instant,
    last: Instant,
    fetched: u64,
}

impl Progress {
    const EVERY: Duration = Duration::from_secs(5);

    fn new(f: &Wanted) -> Progress {
        let now = Instant::now();
        Progress {
            path: f.path.clone(),
            size: f.size,
            started: now,
            last: now,
            fetched: 0,
        }
    }

    fn tick(&mut self, have: u64, n: u64, out: &mut impl Write) {
        self.fetched += n;
        if self.last.elapsed() < Self::EVERY || have >= self.size {
            return;
        }
        self.last = Instant::now();
        let secs = self.started.elapsed().as_secs_f64().max(0.001);
        let _ = writeln!(
            out,
            "{}: {}% ({} of {}, {}/s)",
            self.path,
            have * 100 / self.size.max(1),
            human_bytes(have),
            human_bytes(self.size),
            human_bytes((self.fetched as f64 / secs) as u64)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHA: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

    fn args(files: &[&str]) -> Args {
        Args {
            mirror: "http://mirror:8090".into(),
            repo: "acme/M-GGUF".into(),
            commit: COMMIT.into(),
            dest: "/models".into(),
            files: files.iter().map(|s| s.to_string()).collect(),
            connect_timeout: 10,
            stall_timeout: 30,
            attempts: 3,
        }
    }

    fn message(a: &Args) -> String {
        Plan::new(a).unwrap_err().to_string()
    }

    #[test]
    fn a_file_spec_splits_at_the_first_two_colons() {
        let f = parse_file(&format!("{}:1234:Q4_K_M/m:v2.gguf", SHA.to_uppercase())).unwrap();
        assert_eq!(
            f,
            Wanted {
                sha256: SHA.into(),
                size: 1234,
                path: "Q4_K_M/m:v2.gguf".into()
            }
        );
    }

    #[test]
    fn bad_file_specs_name_the_flag_the_value_and_what_is_valid() {
        for (spec, why) in [
            ("abc:12:m.gguf", "the sha256 must be 64 hex digits"),
            (
                &format!("{SHA}:12MB:m.gguf"),
                "the size must be a whole number",
            ),
            (
                &format!("{SHA}:-1:m.gguf"),
                "the size must be a whole number",
            ),
            (&format!("{SHA}:12:../m.gguf"), "the path must be relative"),
            (
                &format!("{SHA}:12:/etc/passwd"),
                "the path must be relative",
            ),
            (&format!("{SHA}:12:a/./m.gguf"), "the path must be relative"),
            (&format!("{SHA}:12:"), "the path must be relative"),
            (&format!("{SHA}:12"), "it must be SHA256:SIZE:PATH"),
        ] {
            let m = message(&args(&[spec]));
            assert!(m.starts_with(&format!("--file {spec:?}: {why}")), "{m}");
        }
    }

    #[test]
    fn bad_repo_commit_and_mirror_name_their_flag() {
        let f = format!("{SHA}:12:m.gguf");
        let mut a = args(&[&f]);
        a.repo = "acme".into();
        assert!(message(&a).starts_with("--repo \"acme\": it must be owner/name"));
        let mut a = args(&[&f]);
        a.commit = "main".into();
        assert!(message(&a).starts_with("--commit \"main\": it must be the pinned commit"));
        let mut a = args(&[&f]);
        a.mirror = "mirror:8090".into();
        assert!(message(&a).starts_with("--mirror \"mirror:8090\": it must be an http(s) URL"));
    }

    #[test]
    fn a_path_given_twice_is_refused() {
        let f = format!("{SHA}:12:m.gguf");
        assert!(message(&args(&[&f, &f])).contains("given more than once"));
    }

    #[test]
    fn file_urls_keep_folders_and_escape_each_segment() {
        let f = format!("{SHA}:12:Q4 K/m#1.gguf");
        let mut a = args(&[&f]);
        a.mirror = "http://mirror:8090/base/".into();
        let p = Plan::new(&a).unwrap();
        assert_eq!(
            p.url("Q4 K/m#1.gguf").as_str(),
            format!("http://mirror:8090/base/v1/files/acme/M-GGUF/{COMMIT}/Q4%20K/m%231.gguf")
        );
    }

    #[test]
    fn the_part_file_sits_beside_the_target() {
        assert_eq!(
            part_path(Path::new("/models/Q4/m.gguf")),
            PathBuf::from("/models/Q4/m.gguf.part")
        );
    }
}
