//! A fake Hugging Face Hub on loopback that speaks the real HTTP API: model info at a revision,
//! the paginated recursive tree, resolve with a 302 to a second "CDN" port carrying
//! X-Repo-Commit / X-Linked-Etag / X-Linked-Size, Range on the CDN, the real error codes, and
//! faults injected on demand.
//!
//! Whole-repository faults ([`RepoFault`]) need no code: a repository named
//! `faults/<fault>` (or `faults/<fault>-anything`), or a fixture listing with a `"fault"` field,
//! misbehaves that way on every request, e.g. `faults/never-answers`, `faults/malformed-json`.
#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use bytes::Bytes;
use futures::StreamExt;
use sha2::{Digest, Sha256};

/// One file of a fake repository.
#[derive(Clone, Debug)]
pub struct HubFile {
    pub path: String,
    pub size: u64,
    pub sha256: String,
    /// Served bytes; None for listings whose content is not needed (served as zeros).
    pub content: Option<Arc<Vec<u8>>>,
    /// For files without content: bytes served first, zeros after (a GGUF header, say).
    pub prefix: Option<Arc<Vec<u8>>>,
    pub lfs: bool,
}

impl HubFile {
    /// A file with real bytes, stored in LFS as the Hub stores *.gguf.
    pub fn with_bytes(path: &str, bytes: Vec<u8>) -> HubFile {
        let sha256 = hex::encode(Sha256::digest(&bytes));
        HubFile {
            path: path.into(),
            size: bytes.len() as u64,
            sha256,
            content: Some(Arc::new(bytes)),
            prefix: None,
            lfs: true,
        }
    }

    /// A listed file of `size` bytes whose content is never fetched in full.
    pub fn listed(path: &str, size: u64) -> HubFile {
        let sha256 = hex::encode(Sha256::digest(format!("{path}:{size}")));
        HubFile {
            path: path.into(),
            size,
            sha256,
            content: None,
            prefix: None,
            lfs: true,
        }
    }

    /// A small git (non-LFS) file, like README.md.
    pub fn git(path: &str, text: &str) -> HubFile {
        let mut f = HubFile::with_bytes(path, text.as_bytes().to_vec());
        f.lfs = false;
        f
    }
}

#[derive(Clone, Debug, Default)]
struct Repo {
    branches: BTreeMap<String, String>,
    commits: HashMap<String, Vec<HubFile>>,
    gated: Option<String>,
    private: bool,
    disabled: bool,
    /// Tokens whose account may read the repository (gated or private).
    approved: HashSet<String>,
    /// How every request about this repository misbehaves.
    fault: Option<RepoFault>,
}

/// A way every request about one repository misbehaves, for the client's bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RepoFault {
    /// Model info is an HTML error page and tree pages are cut-off JSON, both with 200.
    MalformedJson,
    /// Every request is accepted and never answered.
    NeverAnswers,
    /// Model info and tree pages send their headers and a few bytes, then nothing.
    StallsBody,
    /// Model info and tree pages are 20 MiB, with no Content-Length.
    HugeAnswer,
    /// The tree never ends: every page of files links to another.
    EndlessTree,
    /// Every request is redirected to itself.
    RedirectLoop,
}

impl RepoFault {
    pub const ALL: [RepoFault; 6] = [
        RepoFault::MalformedJson,
        RepoFault::NeverAnswers,
        RepoFault::StallsBody,
        RepoFault::HugeAnswer,
        RepoFault::EndlessTree,
        RepoFault::RedirectLoop,
    ];

    /// The fault's name in a repository id or a fixture.
    pub fn name(self) -> &'static str {
        match self {
            RepoFault::MalformedJson => "malformed-json",
            RepoFault::NeverAnswers => "never-answers",
            RepoFault::StallsBody => "stalls-body",
            RepoFault::HugeAnswer => "huge-answer",
            RepoFault::EndlessTree => "endless-tree",
            RepoFault::RedirectLoop => "redirect-loop",
        }
    }

    pub fn parse(name: &str) -> Option<RepoFault> {
        RepoFault::ALL.into_iter().find(|f| f.name() == name)
    }

    /// The fault a repository id asks for by its name: `faults/<name>` or `faults/<name>-...`.
    pub fn of_repo(repo_id: &str) -> Option<RepoFault> {
        let name = repo_id.strip_prefix("faults/")?;
        RepoFault::ALL.into_iter().find(|f| {
            name.strip_prefix(f.name())
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('-'))
        })
    }
}

/// The commit every faulty repository's model info names.
pub const FAULT_COMMIT: &str = "fa017fa017fa017fa017fa017fa017fa017fa017";

/// Which Hub endpoint a request is for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Endpoint {
    Info,
    Tree,
    Resolve,
}

/// A fault: the next `times` requests whose path contains `path_contains` get this answer.
#[derive(Clone, Debug)]
pub struct Fault {
    pub path_contains: String,
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub times: usize,
    /// Sleep this long before answering (a slow registry).
    pub delay: Option<Duration>,
    /// Answer with a body that never ends instead of a short JSON error.
    pub endless_body: bool,
}

#[derive(Default)]
struct Inner {
    repos: HashMap<String, Repo>,
    tokens: HashSet<String>,
    faults: Vec<Fault>,
    page_size: usize,
    cdn_url: String,
    cdn_authorizations: Vec<String>,
    /// (sha256, Range header) of every CDN request.
    cdn_log: Vec<(String, Option<String>)>,
    /// (sha256, bytes, times): the next `times` CDN bodies of that blob break after `bytes`.
    cuts: Vec<(String, u64, usize)>,
    /// Bytes per second each CDN connection may send (None: as fast as it can).
    rate: Option<u64>,
    /// The CDN answers every request with the whole file, as a server without Range support.
    ignore_ranges: bool,
    /// The CDN's Content-Range names this total instead of the real size.
    lie_total: Option<u64>,
    /// Most CDN bodies being sent at the same time, and how many are now.
    concurrent: (usize, usize),
    /// Bytes the throttled CDN has handed to its connections.
    sent: Arc<std::sync::atomic::AtomicU64>,
    requests: Vec<String>,
    next_commit: u64,
}

/// The running fake Hub and its CDN.
#[derive(Clone)]
pub struct FakeHub {
    pub url: String,
    pub cdn_url: String,
    inner: Arc<Mutex<Inner>>,
}

impl FakeHub {
    /// Starts the Hub and its CDN on two loopback ports.
    pub async fn start() -> FakeHub {
        FakeHub::start_on("127.0.0.1:0", "127.0.0.1:0").await
    }

    /// A Hub holding the demo model: `acme/TinyLlama-GGUF` with one real tiny llama GGUF.
    pub async fn with_tiny_llama() -> FakeHub {
        let hub = FakeHub::start().await;
        hub.add_repo(
            "acme/TinyLlama-GGUF",
            vec![HubFile::with_bytes(
                "tinyllama-Q4_K_M.gguf",
                super::models::tiny_llama_gguf(),
            )],
        );
        hub
    }

    /// Starts the Hub and its CDN on the given addresses.
    pub async fn start_on(hub_addr: &str, cdn_addr: &str) -> FakeHub {
        let hub_listener = tokio::net::TcpListener::bind(hub_addr).await.unwrap();
        let cdn_listener = tokio::net::TcpListener::bind(cdn_addr).await.unwrap();
        let url = format!("http://{}", hub_listener.local_addr().unwrap());
        let cdn_url = format!("http://{}", cdn_listener.local_addr().unwrap());
        let inner = Arc::new(Mutex::new(Inner {
            page_size: 1000,
            cdn_url: cdn_url.clone(),
            ..Default::default()
        }));
        let hub = Router::new()
            .route("/api/models/{owner}/{name}/revision/{rev}", get(model_info))
            .route("/api/models/{owner}/{name}/tree/{rev}", get(tree))
            .route(
                "/{owner}/{name}/resolve/{rev}/{*path}",
                get(resolve).head(resolve),
            )
            .with_state(inner.clone());
        let cdn = Router::new()
            .route("/blobs/{sha}", get(cdn_blob))
            .with_state(inner.clone());
        tokio::spawn(async move { axum::serve(hub_listener, hub).await.unwrap() });
        tokio::spawn(async move { axum::serve(cdn_listener, cdn).await.unwrap() });
        FakeHub {
            url,
            cdn_url,
            inner,
        }
    }

    /// Adds a repository whose main branch points at a commit holding `files`; returns the commit.
    pub fn add_repo(&self, repo: &str, files: Vec<HubFile>) -> String {
        let mut inner = self.inner.lock().unwrap();
        inner.next_commit += 1;
        let commit = format!("{:040x}", 0x00c0_ffee_0000_u64 + inner.next_commit);
        let r = inner.repos.entry(repo.into()).or_default();
        r.commits.insert(commit.clone(), files);
        r.branches.insert("main".into(), commit.clone());
        commit
    }

    /// Every repository of tests/fixtures/hf-listings.json (real) and
    /// tests/fixtures/synthetic-listings.json (non-ASCII names, faults).
    pub fn listing_names() -> Vec<String> {
        listings()
            .iter()
            .map(|r| r["repo"].as_str().unwrap().to_string())
            .collect()
    }

    /// Adds a listing of the fixtures at its pinned commit. A synthetic one may carry
    /// `"fault"` (a [`RepoFault`] name) and `"header": "tiny-llama"` (a GGUF header for its
    /// weights, so the Check stage can read them).
    pub fn add_listing(&self, repo: &str) -> String {
        let all = listings();
        let r = all
            .iter()
            .find(|r| r["repo"] == repo)
            .expect("listing in the fixtures");
        let commit = r["revision"].as_str().unwrap().to_string();
        let tiny = r["header"].as_str() == Some("tiny-llama");
        let files = r["files"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| {
                let path = f["path"].as_str().unwrap();
                match f["size"].as_u64() {
                    Some(size) => {
                        let mut file = HubFile::listed(path, size);
                        file.prefix = match tiny {
                            true => tiny_llama_header(path),
                            false => super::models::listing_header(repo, path),
                        }
                        .map(Arc::new);
                        file
                    }
                    None => HubFile::git(path, "placeholder\n"),
                }
            })
            .collect();
        let mut inner = self.inner.lock().unwrap();
        let repo_entry = inner.repos.entry(repo.into()).or_default();
        repo_entry.commits.insert(commit.clone(), files);
        repo_entry.branches.insert("main".into(), commit.clone());
        repo_entry.fault = r["fault"]
            .as_str()
            .map(|f| RepoFault::parse(f).expect("a RepoFault name"));
        commit
    }

    /// Makes every request about `repo` misbehave as `fault` (None: behave again).
    pub fn set_fault(&self, repo: &str, fault: Option<RepoFault>) {
        self.inner
            .lock()
            .unwrap()
            .repos
            .entry(repo.into())
            .or_default()
            .fault = fault;
    }

    /// Moves `branch` of `repo` to a new commit with `files`; returns the new commit.
    pub fn move_branch(&self, repo: &str, branch: &str, files: Vec<HubFile>) -> String {
        let mut inner = self.inner.lock().unwrap();
        inner.next_commit += 1;
        let commit = format!("{:040x}", 0xbeef_0000_u64 + inner.next_commit);
        let r = inner.repos.get_mut(repo).expect("repo exists");
        r.commits.insert(commit.clone(), files);
        r.branches.insert(branch.into(), commit.clone());
        commit
    }

    pub fn set_gated(&self, repo: &str, mode: &str) {
        self.with_repo(repo, |r| r.gated = Some(mode.into()));
    }

    pub fn set_private(&self, repo: &str) {
        self.with_repo(repo, |r| r.private = true);
    }

    pub fn set_disabled(&self, repo: &str) {
        self.with_repo(repo, |r| r.disabled = true);
    }

    /// Registers a valid token; `approve_for` lists the repos its account may read.
    pub fn add_token(&self, token: &str, approve_for: &[&str]) {
        let mut inner = self.inner.lock().unwrap();
        inner.tokens.insert(token.into());
        for repo in approve_for {
            inner
                .repos
                .entry((*repo).into())
                .or_default()
                .approved
                .insert(token.into());
        }
    }

    /// Injects a fault for the next `times` matching requests.
    pub fn fail(&self, path_contains: &str, status: u16, headers: &[(&str, &str)], times: usize) {
        self.inner.lock().unwrap().faults.push(Fault {
            path_contains: path_contains.into(),
            status,
            headers: headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            times,
            delay: None,
            endless_body: false,
        });
    }

    /// Answers the next `times` matching requests with `status` and a body that never ends.
    pub fn fail_endless(&self, path_contains: &str, status: u16, times: usize) {
        self.inner.lock().unwrap().faults.push(Fault {
            path_contains: path_contains.into(),
            status,
            headers: vec![],
            times,
            delay: None,
            endless_body: true,
        });
    }

    /// Makes the next `times` matching requests answer only after `delay`.
    pub fn slow(&self, path_contains: &str, delay: Duration, times: usize) {
        self.inner.lock().unwrap().faults.push(Fault {
            path_contains: path_contains.into(),
            status: 0,
            headers: vec![],
            times,
            delay: Some(delay),
            endless_body: false,
        });
    }

    /// Entries per tree page (the real Hub uses 1000).
    pub fn set_page_size(&self, n: usize) {
        self.inner.lock().unwrap().page_size = n.max(1);
    }

    /// Authorization headers the CDN received (it must receive none).
    pub fn cdn_authorizations(&self) -> Vec<String> {
        self.inner.lock().unwrap().cdn_authorizations.clone()
    }

    /// Breaks the next `times` CDN bodies of the blob `sha256` after `bytes` bytes.
    /// Bytes the throttled CDN handed to its connections so far.
    pub fn cdn_bytes_sent(&self) -> u64 {
        self.inner
            .lock()
            .unwrap()
            .sent
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Makes the CDN ignore Range headers and send whole files with 200.
    pub fn ignore_ranges(&self) {
        self.inner.lock().unwrap().ignore_ranges = true;
    }

    /// Makes the CDN's Content-Range announce `total` bytes, whatever the file's size.
    pub fn lie_about_size(&self, total: u64) {
        self.inner.lock().unwrap().lie_total = Some(total);
    }

    /// The most CDN bodies that were being sent at once.
    pub fn max_concurrent_downloads(&self) -> usize {
        self.inner.lock().unwrap().concurrent.0
    }

    /// The size of `path` at the head of `repo`'s main branch.
    pub fn file_size(&self, repo: &str, path: &str) -> u64 {
        let inner = self.inner.lock().unwrap();
        let r = &inner.repos[repo];
        r.commits[&r.branches["main"]]
            .iter()
            .find(|f| f.path == path)
            .map(|f| f.size)
            .unwrap_or_else(|| panic!("{repo} has no {path}"))
    }

    /// Caps every CDN connection at `bytes_per_second`.
    pub fn throttle(&self, bytes_per_second: u64) {
        self.inner.lock().unwrap().rate = Some(bytes_per_second.max(1));
    }

    pub fn cut(&self, sha256: &str, bytes: u64, times: usize) {
        self.inner
            .lock()
            .unwrap()
            .cuts
            .push((sha256.into(), bytes, times));
    }

    /// (sha256, Range header) of every request the CDN served.
    pub fn cdn_log(&self) -> Vec<(String, Option<String>)> {
        self.inner.lock().unwrap().cdn_log.clone()
    }

    /// Paths the Hub was asked for, in order.
    pub fn requests(&self) -> Vec<String> {
        self.inner.lock().unwrap().requests.clone()
    }

    /// How many requests reached the Hub whose path contains `s`.
    pub fn count(&self, s: &str) -> usize {
        self.inner
            .lock()
            .unwrap()
            .requests
            .iter()
            .filter(|p| p.contains(s))
            .count()
    }

    fn with_repo(&self, repo: &str, f: impl FnOnce(&mut Repo)) {
        f(self
            .inner
            .lock()
            .unwrap()
            .repos
            .get_mut(repo)
            .expect("repo exists"));
    }
}

type Shared = Arc<Mutex<Inner>>;

/// The repositories of both listing fixtures.
fn listings() -> Vec<serde_json::Value> {
    ["hf-listings.json", "synthetic-listings.json"]
        .iter()
        .flat_map(|name| {
            let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
            let data: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
            data["repos"].as_array().unwrap().clone()
        })
        .collect()
}

/// A small llama header for a weights file of a synthetic listing; a shard after the first
/// carries only its split keys, as llama-gguf-split writes them.
fn tiny_llama_header(path: &str) -> Option<Vec<u8>> {
    use modelserve::gguf::header::{Value, write};
    let stem = path.strip_suffix(".gguf")?;
    let shard = stem
        .rsplit_once("-of-")
        .and_then(|(head, count)| Some((head.get(head.len().checked_sub(5)?..)?, count)))
        .and_then(|(no, count)| Some((no.parse::<u16>().ok()?, count.parse::<u16>().ok()?)));
    let mut m = super::models::Dense::tiny("llama");
    m.vocab_size_only = true;
    match shard {
        None => Some(m.gguf()),
        Some((no, count)) => {
            let split = [
                ("split.no", Value::U16(no.checked_sub(1)?)),
                ("split.count", Value::U16(count)),
            ];
            if no == 1 {
                m.raw
                    .extend(split.iter().map(|(k, v)| (k.to_string(), v.clone())));
                Some(m.gguf())
            } else {
                Some(write::header(&split, &[]))
            }
        }
    }
}

/// Records a request about `repo_id` and answers it as the repository's fault says, if it
/// has one; None lets the request through. A request that is never answered never returns.
async fn faulty(
    state: &Shared,
    endpoint: Endpoint,
    repo_id: &str,
    path: &str,
    query: Option<&str>,
    headers: &HeaderMap,
) -> Option<Response> {
    let fault = {
        let inner = state.lock().unwrap();
        RepoFault::of_repo(repo_id).or_else(|| inner.repos.get(repo_id).and_then(|r| r.fault))
    }?;
    let (page_size, start) = {
        let mut inner = state.lock().unwrap();
        inner.requests.push(path.to_string());
        let start = query
            .and_then(|q| q.split('&').find_map(|p| p.strip_prefix("cursor=")))
            .and_then(|c| c.parse::<usize>().ok())
            .unwrap_or(0);
        (inner.page_size, start)
    };
    let json = |body: String| {
        Response::builder()
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(body))
            .unwrap()
    };
    let info = || {
        json(
            serde_json::json!({ "id": repo_id, "sha": FAULT_COMMIT, "private": false, "gated": false })
                .to_string(),
        )
    };
    match (fault, endpoint) {
        (RepoFault::NeverAnswers, _) => std::future::pending().await,
        (RepoFault::RedirectLoop, _) => {
            let target = match query {
                Some(q) => format!("{path}?{q}"),
                None => path.to_string(),
            };
            Some(
                Response::builder()
                    .status(StatusCode::FOUND)
                    .header(header::LOCATION, target)
                    .body(Body::empty())
                    .unwrap(),
            )
        }
        (_, Endpoint::Resolve) => None,
        (RepoFault::MalformedJson, Endpoint::Info) => Some(
            Response::builder()
                .header(header::CONTENT_TYPE, "text/html")
                .body(Body::from(
                    "<!DOCTYPE html><html><body><h1>502 Proxy Error</h1></body></html>",
                ))
                .unwrap(),
        ),
        (RepoFault::MalformedJson, Endpoint::Tree) => Some(json(
            "[{\"type\":\"file\",\"path\":\"m-Q8_0.gguf\",\"size\":".into(),
        )),
        (RepoFault::StallsBody, _) => {
            let head = futures::stream::iter([Ok::<_, std::io::Error>(Bytes::from_static(
                b"{\"sha\":\"",
            ))]);
            let body = head.chain(futures::stream::pending());
            Some(
                Response::builder()
                    .header(header::CONTENT_TYPE, "application/json")
                    .header(header::CONTENT_LENGTH, "4096")
                    .body(Body::from_stream(body))
                    .unwrap(),
            )
        }
        (RepoFault::HugeAnswer, _) => {
            // 20 MiB of JSON whitespace, chunked: only reading tells how long it is.
            let piece = Bytes::from(vec![b' '; 64 << 10]);
            let body = futures::stream::iter(
                (0..320).map(move |_| Ok::<_, std::io::Error>(piece.clone())),
            );
            Some(
                Response::builder()
                    .header(header::CONTENT_TYPE, "application/json")
                    .body(Body::from_stream(body))
                    .unwrap(),
            )
        }
        (RepoFault::EndlessTree, Endpoint::Info) => Some(info()),
        (RepoFault::EndlessTree, Endpoint::Tree) => {
            let page: Vec<_> = (start..start + page_size)
                .map(|n| serde_json::json!({"type": "file", "path": format!("d{}/f{n}.bin", n % 97), "size": n}))
                .collect();
            let host = headers
                .get(header::HOST)
                .and_then(|h| h.to_str().ok())
                .unwrap_or("127.0.0.1");
            let mut r = json(serde_json::Value::Array(page).to_string());
            let link = format!(
                "<http://{host}{path}?recursive=true&cursor={}>; rel=\"next\"",
                start + page_size
            );
            r.headers_mut().insert(header::LINK, link.parse().unwrap());
            Some(r)
        }
    }
}

fn error(status: u16, code: Option<&str>, message: &str) -> Response {
    let mut r = Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json");
    if let Some(c) = code {
        r = r.header("x-error-code", c);
    }
    r = r.header("x-error-message", message);
    r.body(Body::from(
        serde_json::json!({ "error": message }).to_string(),
    ))
    .unwrap()
}

/// The checks every Hub request makes, in the Hub's order. Returns the repo or the error answer.
async fn gate(
    state: &Shared,
    path: &str,
    headers: &HeaderMap,
    repo_id: &str,
    content: bool,
) -> Result<Repo, Response> {
    let fault = {
        let mut inner = state.lock().unwrap();
        inner.requests.push(path.to_string());
        let found = inner
            .faults
            .iter_mut()
            .find(|f| f.times > 0 && path.contains(&f.path_contains));
        found.map(|f| {
            f.times -= 1;
            f.clone()
        })
    };
    if let Some(f) = fault {
        if let Some(d) = f.delay {
            tokio::time::sleep(d).await;
        }
        if f.status != 0 {
            let mut r = Response::builder().status(f.status);
            for (k, v) in &f.headers {
                r = r.header(k.as_str(), v.as_str());
            }
            let body = if f.endless_body {
                let piece = Bytes::from(vec![b'x'; 16 << 10]);
                Body::from_stream(futures::stream::repeat_with(move || {
                    Ok::<_, std::io::Error>(piece.clone())
                }))
            } else {
                Body::from("{\"error\":\"injected\"}")
            };
            return Err(r.body(body).unwrap());
        }
    }
    let inner = state.lock().unwrap();
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_string);
    if let Some(t) = &token
        && !inner.tokens.contains(t)
    {
        return Err(error(
            401,
            None,
            "Invalid credentials in Authorization header",
        ));
    }
    let not_found = || {
        let status = if token.is_some() { 404 } else { 401 };
        error(status, Some("RepoNotFound"), "Repository not found")
    };
    let Some(repo) = inner.repos.get(repo_id) else {
        return Err(not_found());
    };
    let approved = token.as_ref().is_some_and(|t| repo.approved.contains(t));
    if repo.private && !approved {
        return Err(not_found());
    }
    if repo.disabled {
        return Err(error(403, None, "Access to this resource is disabled."));
    }
    if content && repo.gated.is_some() && !approved {
        return Err(match token {
            None => error(
                401,
                Some("GatedRepo"),
                &format!(
                    "Access to model {repo_id} is restricted. You must have access to it and be authenticated to access it. Please log in."
                ),
            ),
            Some(_) => error(
                403,
                Some("GatedRepo"),
                &format!(
                    "Access to model {repo_id} is restricted and you are not in the authorized list."
                ),
            ),
        });
    }
    Ok(repo.clone())
}

/// The gate's checks, then the commit `rev` names (a commit or a branch), as the Hub answers them.
async fn at_revision(
    state: &Shared,
    path: &str,
    headers: &HeaderMap,
    repo_id: &str,
    rev: &str,
    content: bool,
) -> Result<(Repo, String), Response> {
    let repo = gate(state, path, headers, repo_id, content).await?;
    let commit = if repo.commits.contains_key(rev) {
        Some(rev.to_string())
    } else {
        repo.branches.get(rev).cloned()
    };
    match commit {
        Some(c) => Ok((repo, c)),
        None => Err(error(
            404,
            Some("RevisionNotFound"),
            &format!("Invalid rev id: {rev}"),
        )),
    }
}

async fn model_info(
    State(state): State<Shared>,
    Path((owner, name, rev)): Path<(String, String, String)>,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    let repo_id = format!("{owner}/{name}");
    let path = format!("/api/models/{repo_id}/revision/{rev}");
    if let Some(r) = faulty(
        &state,
        Endpoint::Info,
        &repo_id,
        uri.path(),
        uri.query(),
        &headers,
    )
    .await
    {
        return r;
    }
    let (repo, commit) = match at_revision(&state, &path, &headers, &repo_id, &rev, false).await {
        Ok(found) => found,
        Err(resp) => return resp,
    };
    let siblings: Vec<_> = repo.commits[&commit]
        .iter()
        .map(|f| serde_json::json!({ "rfilename": f.path }))
        .collect();
    let gated = repo
        .gated
        .clone()
        .map_or(serde_json::Value::Bool(false), serde_json::Value::String);
    let body = serde_json::json!({
        "_id": "0123456789abcdef01234567", "id": repo_id, "modelId": repo_id, "sha": commit,
        "private": repo.private, "gated": gated, "disabled": repo.disabled,
        "tags": ["gguf"], "siblings": siblings,
    });
    (
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// git's blob id of an LFS pointer, as the real tree endpoint reports it.
fn pointer_oid(f: &HubFile) -> (String, usize) {
    let pointer = format!(
        "version https://git-lfs.github.com/spec/v1\noid sha256:{}\nsize {}\n",
        f.sha256, f.size
    );
    let oid = hex::encode(sha1::Sha1::digest(
        format!("blob {}\0{}", pointer.len(), pointer).as_bytes(),
    ));
    (oid, pointer.len())
}

async fn tree(
    State(state): State<Shared>,
    Path((owner, name, rev)): Path<(String, String, String)>,
    Query(q): Query<HashMap<String, String>>,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    let repo_id = format!("{owner}/{name}");
    let path = format!("/api/models/{repo_id}/tree/{rev}");
    if let Some(r) = faulty(
        &state,
        Endpoint::Tree,
        &repo_id,
        uri.path(),
        uri.query(),
        &headers,
    )
    .await
    {
        return r;
    }
    let (repo, commit) = match at_revision(&state, &path, &headers, &repo_id, &rev, false).await {
        Ok(found) => found,
        Err(resp) => return resp,
    };
    let page_size = state.lock().unwrap().page_size;
    let start: usize = q.get("cursor").and_then(|c| c.parse().ok()).unwrap_or(0);
    let files = &repo.commits[&commit];
    let mut dirs: Vec<String> = files
        .iter()
        .filter_map(|f| f.path.rsplit_once('/').map(|(d, _)| d.to_string()))
        .collect();
    dirs.sort();
    dirs.dedup();
    let mut entries: Vec<serde_json::Value> =
        dirs.iter().map(|d| serde_json::json!({"type": "directory", "oid": "0".repeat(40), "size": 0, "path": d})).collect();
    for f in files {
        entries.push(if f.lfs {
            let (oid, pointer_size) = pointer_oid(f);
            serde_json::json!({"type": "file", "oid": oid, "size": f.size, "path": f.path,
                "lfs": {"oid": f.sha256, "size": f.size, "pointerSize": pointer_size}})
        } else {
            serde_json::json!({"type": "file", "oid": f.sha256.get(..40), "size": f.size, "path": f.path})
        });
    }
    let page: Vec<_> = entries
        .iter()
        .skip(start)
        .take(page_size)
        .cloned()
        .collect();
    let mut resp = (
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::Value::Array(page).to_string(),
    )
        .into_response();
    if start + page_size < entries.len() {
        let host = headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or("127.0.0.1");
        let link = format!(
            "<http://{host}/api/models/{repo_id}/tree/{rev}?recursive=true&cursor={}>; rel=\"next\"",
            start + page_size
        );
        resp.headers_mut()
            .insert(header::LINK, link.parse().unwrap());
    }
    resp
}

async fn resolve(
    State(state): State<Shared>,
    method: Method,
    Path((owner, name, rev, file)): Path<(String, String, String, String)>,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    let repo_id = format!("{owner}/{name}");
    let path = format!("/{repo_id}/resolve/{rev}/{file}");
    if let Some(r) = faulty(
        &state,
        Endpoint::Resolve,
        &repo_id,
        uri.path(),
        uri.query(),
        &headers,
    )
    .await
    {
        return r;
    }
    let (repo, commit) = match at_revision(&state, &path, &headers, &repo_id, &rev, true).await {
        Ok(found) => found,
        Err(resp) => return resp,
    };
    let Some(f) = repo.commits[&commit].iter().find(|f| f.path == file) else {
        let mut r = error(
            404,
            Some("EntryNotFound"),
            &format!("{file} does not exist on \"{rev}\""),
        );
        r.headers_mut()
            .insert("x-repo-commit", commit.parse().unwrap());
        return r;
    };
    if f.lfs {
        let cdn = state.lock().unwrap().cdn_url.clone();
        return Response::builder()
            .status(StatusCode::FOUND)
            .header(
                header::LOCATION,
                format!("{cdn}/blobs/{}?X-Amz-Signature=fake", f.sha256),
            )
            .header("x-repo-commit", commit)
            .header("x-linked-etag", format!("\"{}\"", f.sha256))
            .header("x-linked-size", f.size.to_string())
            .header(header::CONTENT_LENGTH, "0")
            .body(Body::empty())
            .unwrap();
    }
    let body = if method == Method::HEAD {
        Body::empty()
    } else {
        Body::from(f.content.as_ref().map(|c| c.to_vec()).unwrap_or_default())
    };
    Response::builder()
        .header("x-repo-commit", commit)
        .header(
            header::ETAG,
            format!("\"{}\"", f.sha256.get(..40).unwrap_or_default()),
        )
        .header(header::CONTENT_LENGTH, f.size.to_string())
        .body(body)
        .unwrap()
}

async fn cdn_blob(
    State(state): State<Shared>,
    Path(sha): Path<String>,
    headers: HeaderMap,
) -> Response {
    let file = {
        let mut inner = state.lock().unwrap();
        if let Some(a) = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
        {
            inner.cdn_authorizations.push(a.to_string());
        }
        let range = headers
            .get(header::RANGE)
            .and_then(|v| v.to_str().ok())
            .map(String::from);
        inner.cdn_log.push((sha.clone(), range));
        inner
            .repos
            .values()
            .flat_map(|r| r.commits.values().flatten())
            .find(|f| f.sha256 == sha)
            .cloned()
    };
    let Some(f) = file else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let (ignore_ranges, lie_total) = {
        let inner = state.lock().unwrap();
        (inner.ignore_ranges, inner.lie_total)
    };
    let range = headers
        .get(header::RANGE)
        .filter(|_| !ignore_ranges)
        .and_then(|v| v.to_str().ok());
    let (start, end) = match range.and_then(parse_range) {
        Some((s, e)) if s < f.size => (s, e.unwrap_or(f.size - 1).min(f.size - 1)),
        Some(_) => {
            return Response::builder()
                .status(StatusCode::RANGE_NOT_SATISFIABLE)
                .header(header::CONTENT_RANGE, format!("bytes */{}", f.size))
                .body(Body::empty())
                .unwrap();
        }
        None => (0, f.size.saturating_sub(1)),
    };
    let len = if f.size == 0 { 0 } else { end - start + 1 };
    // Real content is sent without copying it (benchmarks serve gigabytes from memory).
    let bytes: Bytes = match &f.content {
        Some(c) => {
            Bytes::from_owner(ArcBytes(c.clone())).slice(start as usize..(start + len) as usize)
        }
        None => {
            let mut bytes = vec![0u8; len.min(64 << 20) as usize];
            if let Some(p) = &f.prefix {
                let from = (start as usize).min(p.len());
                let upto = ((start + len) as usize).min(p.len());
                bytes[..upto - from].copy_from_slice(&p[from..upto]);
            }
            Bytes::from(bytes)
        }
    };
    let cut = {
        let mut inner = state.lock().unwrap();
        let found = inner.cuts.iter_mut().find(|c| c.0 == sha && c.2 > 0);
        found.map(|c| {
            c.2 -= 1;
            c.1
        })
    };
    let partial = range.is_some();
    let mut r = Response::builder()
        .status(if partial {
            StatusCode::PARTIAL_CONTENT
        } else {
            StatusCode::OK
        })
        .header(header::ACCEPT_RANGES, "bytes")
        .header(header::CONTENT_LENGTH, bytes.len().to_string());
    if partial {
        r = r.header(
            header::CONTENT_RANGE,
            format!("bytes {start}-{end}/{}", lie_total.unwrap_or(f.size)),
        );
    }
    let (rate, sent) = {
        let inner = state.lock().unwrap();
        (inner.rate, inner.sent.clone())
    };
    match cut {
        // Announce the whole length, send part of it, then break the connection.
        Some(after) if (after as usize) < bytes.len() => {
            let head = bytes.slice(..after as usize);
            // Let the head reach the client before the connection breaks.
            let broken = futures::stream::once(async {
                tokio::time::sleep(Duration::from_millis(200)).await;
                Err::<Bytes, _>(std::io::Error::other("connection cut by the test"))
            });
            let body = futures::stream::iter([Ok::<_, std::io::Error>(head)]).chain(broken);
            r.body(Body::from_stream(counted(state.clone(), body)))
                .unwrap()
        }
        _ => match rate {
            None => {
                let body = futures::stream::iter([Ok::<_, std::io::Error>(bytes)]);
                r.body(Body::from_stream(counted(state.clone(), body)))
                    .unwrap()
            }
            Some(rate) => {
                // 64 KiB pieces, each when the rate allows for it since the body started (a
                // schedule, not a pause per piece: timer granularity would lower the rate).
                let piece = 64 << 10;
                let pause = Duration::from_secs_f64(piece as f64 / rate as f64);
                let pieces: Vec<Bytes> = (0..bytes.len())
                    .step_by(piece)
                    .map(|at| bytes.slice(at..(at + piece).min(bytes.len())))
                    .collect();
                let start = tokio::time::Instant::now();
                let body =
                    futures::stream::iter(pieces.into_iter().enumerate()).then(move |(i, p)| {
                        let sent = sent.clone();
                        async move {
                            tokio::time::sleep_until(start + pause * (i as u32 + 1)).await;
                            sent.fetch_add(p.len() as u64, std::sync::atomic::Ordering::Relaxed);
                            Ok::<_, std::io::Error>(p)
                        }
                    });
                r.body(Body::from_stream(counted(state.clone(), body)))
                    .unwrap()
            }
        },
    }
}

/// A shared file content as the owner of zero-copy `Bytes`.
struct ArcBytes(Arc<Vec<u8>>);

impl AsRef<[u8]> for ArcBytes {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

/// Counts the body among the CDN bodies being sent while it is.
fn counted<S>(state: Shared, body: S) -> impl futures::Stream<Item = S::Item> + Send + 'static
where
    S: futures::Stream + Send + 'static,
{
    struct Guard(Shared);
    impl Drop for Guard {
        fn drop(&mut self) {
            self.0.lock().unwrap().concurrent.1 -= 1;
        }
    }
    {
        let mut inner = state.lock().unwrap();
        inner.concurrent.1 += 1;
        inner.concurrent.0 = inner.concurrent.0.max(inner.concurrent.1);
    }
    let guard = Guard(state);
    body.map(move |item| {
        let _ = &guard;
        item
    })
}

fn parse_range(v: &str) -> Option<(u64, Option<u64>)> {
    let (s, e) = v.strip_prefix("bytes=")?.split_once('-')?;
    Some((
        s.parse().ok()?,
        if e.is_empty() {
            None
        } else {
            Some(e.parse().ok()?)
        },
    ))
}
