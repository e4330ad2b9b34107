//! The model registry client: model info at a revision, the recursive tree at a commit, and
//! access checks, speaking the Hugging Face Hub HTTP API. Errors are mapped from the status and
//! `X-Error-Code` to causes a person can act on; transient ones are retried with capped backoff.

pub mod select;

use std::time::Duration;

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use reqwest::header::{AUTHORIZATION, HeaderMap, LINK, RETRY_AFTER, USER_AGENT};
use reqwest::{Method, StatusCode};
use serde::Deserialize;
use url::Url;

use select::{RepoFile, safe_path};

/// Default registry endpoint.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// Characters kept as they are when a revision goes into a URL path segment.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'.');

/// Bounds on what one listing may hold; a registry sending more is refused, not followed forever.
const MAX_TREE_PAGES: usize = 500;
const MAX_TREE_ENTRIES: usize = 200_000;

/// A registry failure, named by its cause.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum HubError {
    #[error(
        "the registry has no repository {repo}, or it is private and the request had no token with access (the registry answers both the same way); check spec.repo, or set spec.tokenSecretRef"
    )]
    RepoNotFound { repo: String },
    #[error("{repo} has no branch, tag or commit named {revision}; check spec.revision")]
    RevisionNotFound { repo: String, revision: String },
    #[error(
        "{repo} is gated and the request had no token: set spec.tokenSecretRef to a Secret holding the token of an account that was granted access at {url}"
    )]
    GatedNoToken { repo: String, url: String },
    #[error(
        "{repo} is gated and the token's account is not in its authorized list yet: ask for access at {url}, then change the spec to retry"
    )]
    GatedNotApproved { repo: String, url: String },
    #[error("{repo} at {revision} has no file {path}")]
    FileNotFound {
        repo: String,
        revision: String,
        path: String,
    },
    #[error(
        "{repo} is disabled on the registry (access to it is turned off by its owner or the registry)"
    )]
    Disabled { repo: String },
    #[error(
        "the registry rejected the token (invalid credentials) for {repo}: check the Secret the token comes from"
    )]
    BadToken { repo: String },
    #[error("the registry refused access to {repo} ({status}): {message}")]
    Forbidden {
        repo: String,
        status: u16,
        message: String,
    },
    #[error("the registry is rate-limiting these requests; retrying after {retry_after:?}")]
    RateLimited { retry_after: Duration },
    #[error("the registry is unavailable ({cause}) after {attempts} attempts; retrying")]
    Unavailable { cause: String, attempts: u32 },
    #[error("the registry sent a response that cannot be used ({what})")]
    Malformed { what: String },
    #[error("{repo} lists more than {max} files; this is more than the operator reads")]
    TooManyFiles { repo: String, max: usize },
    #[error("{what} {value:?} is not valid: {why}")]
    InvalidInput {
        what: &'static str,
        value: String,
        why: &'static str,
    },
}

impl HubError {
    /// The condition reason.
    pub fn reason(&self) -> &'static str {
        match self {
            HubError::RepoNotFound { .. } => "RepoNotFound",
            HubError::RevisionNotFound { .. } => "RevisionNotFound",
            HubError::GatedNoToken { .. } => "GatedRepoNoToken",
            HubError::GatedNotApproved { .. } => "GatedRepoNotApproved",
            HubError::FileNotFound { .. } => "FileNotFound",
            HubError::Disabled { .. } => "RepoDisabled",
            HubError::BadToken { .. } => "InvalidToken",
            HubError::Forbidden { .. } => "AccessDenied",
            HubError::RateLimited { .. } => "RateLimited",
            HubError::Unavailable { .. } => "RegistryUnavailable",
            HubError::Malformed { .. } => "InvalidRegistryResponse",
            HubError::TooManyFiles { .. } => "TooManyFiles",
            HubError::InvalidInput { .. } => "InvalidSpec",
        }
    }

    /// Whether retrying later can help without a change of spec.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            HubError::RateLimited { .. }
                | HubError::Unavailable { .. }
                | HubError::Malformed { .. }
        )
    }
}

/// Retry settings for transient failures within one call.
#[derive(Clone, Copy, Debug)]
pub struct Retry {
    pub attempts: u32,
    pub base: Duration,
    pub max_delay: Duration,
    /// A rate limit that resets within this long is waited out inside the call.
    pub max_rate_limit_wait: Duration,
    /// Limit of one request, headers and body (downloads have none).
    pub request_timeout: Duration,
    /// Longest silence while waiting for bytes: a stalled connection fails after this.
    pub read_timeout: Duration,
}

impl Default for Retry {
    fn default() -> Self {
        Self {
            attempts: 4,
            base: Duration::from_millis(500),
            max_delay: Duration::from_secs(8),
            max_rate_limit_wait: Duration::from_secs(30),
            request_timeout: Duration::from_secs(60),
            read_timeout: Duration::from_secs(30),
        }
    }
}

/// Model info at a revision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelInfo {
    /// The commit the revision resolved to.
    pub commit: String,
    /// Gating mode (`auto` or `manual`), None when not gated.
    pub gated: Option<String>,
    pub private: bool,
    pub disabled: bool,
}

#[derive(Deserialize)]
struct RawInfo {
    sha: Option<String>,
    #[serde(default)]
    gated: serde_json::Value,
    #[serde(default)]
    private: bool,
    #[serde(default)]
    disabled: bool,
}

#[derive(Deserialize)]
struct RawEntry {
    #[serde(rename = "type")]
    kind: String,
    path: String,
    #[serde(default)]
    size: u64,
    lfs: Option<RawLfs>,
}

#[derive(Deserialize)]
struct RawLfs {
    oid: String,
    size: u64,
}

/// The registry client.
#[derive(Clone, Debug)]
pub struct Hub {
    http: reqwest::Client,
    /// The same, without following redirects: access checks stop at the registry.
    probe: reqwest::Client,
    endpoint: Url,
    token: Option<String>,
    retry: Retry,
}

impl Hub {
    /// A client for `endpoint` (like HF_ENDPOINT), sending `token` to that host only.
    pub fn new(endpoint: &str, token: Option<String>) -> Result<Hub, HubError> {
        let endpoint = parse_endpoint(endpoint)?;
        let retry = Retry::default();
        let (http, probe) = clients(&retry)?;
        Ok(Hub {
            http,
            probe,
            endpoint,
            token: token.filter(|t| !t.trim().is_empty()),
            retry,
        })
    }

    /// The same client with other retry and timeout settings.
    pub fn with_retry(mut self, retry: Retry) -> Result<Hub, HubError> {
        (self.http, self.probe) = clients(&retry)?;
        self.retry = retry;
        Ok(self)
    }

    pub fn endpoint(&self) -> &Url {
        &self.endpoint
    }

    pub fn has_token(&self) -> bool {
        self.token.is_some()
    }

    /// Model info at `revision`: the commit it resolves to, and whether the repo is gated.
    pub async fn model_info(&self, repo: &str, revision: &str) -> Result<ModelInfo, HubError> {
        check_repo(repo)?;
        check_revision(revision)?;
        let url = self.url(&format!(
            "api/models/{repo}/revision/{}",
            utf8_percent_encode(revision, SEGMENT)
        ))?;
        let ctx = Ctx {
            repo,
            revision: Some(revision),
            path: None,
        };
        let resp = self.send(Method::GET, url, &ctx).await?;
        let raw: RawInfo = resp.json().await.map_err(|e| HubError::Malformed {
            what: format!("model info of {repo}: {e}"),
        })?;
        let commit = raw
            .sha
            .filter(|s| is_hex(s, 40))
            .ok_or_else(|| HubError::Malformed {
                what: format!("model info of {repo} has no 40-hex commit sha"),
            })?;
        let gated = match raw.gated {
            serde_json::Value::String(s) => Some(s),
            serde_json::Value::Bool(true) => Some("true".into()),
            _ => None,
        };
        Ok(ModelInfo {
            commit,
            gated,
            private: raw.private,
            disabled: raw.disabled,
        })
    }

    /// Every file of `repo` at `commit`, following the tree's pagination.
    pub async fn tree(&self, repo: &str, commit: &str) -> Result<Vec<RepoFile>, HubError> {
        check_repo(repo)?;
        check_revision(commit)?;
        let ctx = Ctx {
            repo,
            revision: Some(commit),
            path: None,
        };
        let mut next = Some(self.url(&format!("api/models/{repo}/tree/{commit}?recursive=true"))?);
        let mut files = Vec::new();
        let mut pages = 0;
        while let Some(url) = next.take() {
            pages += 1;
            if pages > MAX_TREE_PAGES {
                return Err(HubError::TooManyFiles {
                    repo: repo.into(),
                    max: files.len(),
                });
            }
            let resp = self.send(Method::GET, url, &ctx).await?;
            next = next_link(resp.headers(), &self.endpoint)?;
            let entries: Vec<RawEntry> = resp.json().await.map_err(|e| HubError::Malformed {
                what: format!("tree of {repo}: {e}"),
            })?;
            for e in entries
                .into_iter()
                .filter(|e| e.kind == "file" && safe_path(&e.path))
            {
                let sha256 = match e.lfs {
                    Some(lfs) if is_hex(&lfs.oid, 64) && lfs.size == e.size => {
                        Some(lfs.oid.to_ascii_lowercase())
                    }
                    Some(_) => {
                        return Err(HubError::Malformed {
                            what: format!("LFS entry of {} in {repo}", e.path),
                        });
                    }
                    None => None,
                };
                files.push(RepoFile {
                    path: e.path,
                    size: e.size,
                    sha256,
                });
            }
            if files.len() > MAX_TREE_ENTRIES {
                return Err(HubError::TooManyFiles {
                    repo: repo.into(),
                    max: MAX_TREE_ENTRIES,
                });
            }
        }
        Ok(files)
    }

    /// Checks that the token (or no token) may download `path` of a gated repo, without
    /// downloading: the registry answers 401/403 GatedRepo before redirecting to the CDN.
    pub async fn check_access(&self, repo: &str, commit: &str, path: &str) -> Result<(), HubError> {
        let url = self.resolve_url(repo, commit, path)?;
        let ctx = Ctx::file(repo, commit, path);
        self.send_with(&self.probe, Method::HEAD, url, &ctx, None, true)
            .await
            .map(|_| ())
    }

    /// Reads `len` bytes of a file at `offset`, following the registry's redirect to its CDN
    /// (without the token). A server that ignores Range is read only as far as needed.
    pub async fn read_range(
        &self,
        repo: &str,
        commit: &str,
        path: &str,
        offset: u64,
        len: u64,
    ) -> Result<Vec<u8>, HubError> {
        use futures::StreamExt;
        const MAX_RANGE: u64 = 64 << 20;
        if len == 0 || len > MAX_RANGE {
            return Err(HubError::InvalidInput {
                what: "byte range length",
                value: len.to_string(),
                why: "it must be 1 byte to 64 MiB",
            });
        }
        let url = self.resolve_url(repo, commit, path)?;
        let ctx = Ctx::file(repo, commit, path);
        let range = format!("bytes={}-{}", offset, offset.saturating_add(len - 1));
        let resp = self.send_ranged(Method::GET, url, &ctx, &range).await?;
        let skip = if resp.status() == StatusCode::PARTIAL_CONTENT {
            0
        } else {
            offset
        };
        let mut out = Vec::with_capacity(len as usize);
        let mut seen = 0u64;
        let mut body = resp.bytes_stream();
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| HubError::Unavailable {
                cause: describe(&e),
                attempts: 1,
            })?;
            let start = skip.saturating_sub(seen).min(chunk.len() as u64) as usize;
            seen += chunk.len() as u64;
            let want = (len as usize).saturating_sub(out.len());
            out.extend_from_slice(&chunk[start..chunk.len().min(start + want)]);
            if out.len() as u64 >= len {
                break;
            }
        }
        Ok(out)
    }

    /// Starts downloading bytes `start..end` of a file at a commit, following the redirect to the
    /// CDN without the token. The caller checks for 206 (the range) or 200 (the whole file).
    pub async fn download(
        &self,
        repo: &str,
        commit: &str,
        path: &str,
        range: std::ops::Range<u64>,
    ) -> Result<reqwest::Response, HubError> {
        let url = self.resolve_url(repo, commit, path)?;
        let ctx = Ctx::file(repo, commit, path);
        let range = format!("bytes={}-{}", range.start, range.end.saturating_sub(1));
        self.send_with(&self.http, Method::GET, url, &ctx, Some(&range), false)
            .await
    }

    /// The download URL of a file at a commit; repo, revision and path are checked first.
    pub fn resolve_url(&self, repo: &str, commit: &str, path: &str) -> Result<Url, HubError> {
        check_repo(repo)?;
        check_revision(commit)?;
        if !safe_path(path) {
            return Err(HubError::InvalidInput {
                what: "file path",
                value: path.into(),
                why: "it must be a relative path without '..'",
            });
        }
        let encoded: Vec<String> = path
            .split('/')
            .map(|s| utf8_percent_encode(s, SEGMENT).to_string())
            .collect();
        self.url(&format!("{repo}/resolve/{commit}/{}", encoded.join("/")))
    }

    fn url(&self, rel: &str) -> Result<Url, HubError> {
        self.endpoint.join(rel).map_err(|e| HubError::InvalidInput {
            what: "registry URL",
            value: rel.into(),
            why: url_problem(e),
        })
    }

    async fn send(
        &self,
        method: Method,
        url: Url,
        ctx: &Ctx<'_>,
    ) -> Result<reqwest::Response, HubError> {
        self.send_with(&self.http, method, url, ctx, None, true)
            .await
    }

    async fn send_ranged(
        &self,
        method: Method,
        url: Url,
        ctx: &Ctx<'_>,
        range: &str,
    ) -> Result<reqwest::Response, HubError> {
        self.send_with(&self.http, method, url, ctx, Some(range), true)
            .await
    }

    async fn send_with(
        &self,
        http: &reqwest::Client,
        method: Method,
        url: Url,
        ctx: &Ctx<'_>,
        range: Option<&str>,
        total_timeout: bool,
    ) -> Result<reqwest::Response, HubError> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let mut req = http.request(method.clone(), url.clone());
            // A download of many GB has no total limit; a stall is caught by the read timeout.
            if total_timeout {
                req = req.timeout(self.retry.request_timeout);
            }
            let mut req = req.header(
                USER_AGENT,
                concat!("modelserve/", env!("CARGO_PKG_VERSION")),
            );
            if let Some(t) = &self.token {
                req = req.header(AUTHORIZATION, format!("Bearer {t}"));
            }
            if let Some(r) = range {
                req = req
                    .header(reqwest::header::RANGE, r)
                    .header(reqwest::header::ACCEPT_ENCODING, "identity");
            }
            let (cause, wait) = match req.send().await {
                Ok(resp) if resp.status().is_success() || resp.status().is_redirection() => {
                    return Ok(resp);
                }
                Ok(resp) if resp.status() == StatusCode::TOO_MANY_REQUESTS => {
                    let wait = rate_limit_reset(resp.headers())
                        .unwrap_or_else(|| backoff(self.retry, attempt));
                    if wait > self.retry.max_rate_limit_wait || attempt >= self.retry.attempts {
                        return Err(HubError::RateLimited { retry_after: wait });
                    }
                    ("429 Too Many Requests".to_string(), wait)
                }
                Ok(resp) if is_retryable(resp.status()) => (
                    format!("HTTP {}", resp.status().as_u16()),
                    backoff(self.retry, attempt),
                ),
                Ok(resp) => {
                    return Err(map_error(resp, ctx, &self.endpoint, self.token.is_some()).await);
                }
                Err(e) => (describe(&e), backoff(self.retry, attempt)),
            };
            if attempt >= self.retry.attempts {
                return Err(HubError::Unavailable {
                    cause,
                    attempts: attempt,
                });
            }
            tracing::debug!(%cause, ?wait, attempt, "registry request failed; retrying");
            tokio::time::sleep(wait).await;
        }
    }
}

/// The HTTP clients: one following redirects, one stopping at the registry.
fn clients(retry: &Retry) -> Result<(reqwest::Client, reqwest::Client), HubError> {
    // Redirects to another host or port lose the Authorization header (reqwest drops it);
    // the token is never sent anywhere but the configured endpoint.
    let client = |policy| {
        reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .read_timeout(retry.read_timeout)
            .redirect(policy)
            .no_proxy()
            .build()
            .map_err(|e| HubError::Malformed {
                what: format!("HTTP client: {e}"),
            })
    };
    Ok((
        client(reqwest::redirect::Policy::limited(10))?,
        client(reqwest::redirect::Policy::none())?,
    ))
}

struct Ctx<'a> {
    repo: &'a str,
    revision: Option<&'a str>,
    path: Option<&'a str>,
}

impl<'a> Ctx<'a> {
    /// The context of a request for one file at a revision.
    fn file(repo: &'a str, revision: &'a str, path: &'a str) -> Ctx<'a> {
        Ctx {
            repo,
            revision: Some(revision),
            path: Some(path),
        }
    }
}

fn is_retryable(s: StatusCode) -> bool {
    s == StatusCode::REQUEST_TIMEOUT || s.is_server_error()
}

fn backoff(r: Retry, attempt: u32) -> Duration {
    let factor = 1u32
        .checked_shl(attempt.saturating_sub(1))
        .unwrap_or(u32::MAX);
    r.base.saturating_mul(factor).min(r.max_delay)
}

fn describe(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        "timed out".into()
    } else if e.is_connect() {
        "connection failed".into()
    } else {
        format!("request failed: {e}")
    }
}

/// Seconds until the rate limit resets: `RateLimit: "api";r=0;t=N`, else `Retry-After: N`.
pub fn rate_limit_reset(h: &HeaderMap) -> Option<Duration> {
    let from_ratelimit = h
        .get("ratelimit")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.split(';').find_map(|p| {
                p.trim()
                    .strip_prefix("t=")
                    .and_then(|n| n.trim().parse::<u64>().ok())
            })
        });
    let from_retry_after = || {
        h.get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    from_ratelimit
        .or_else(from_retry_after)
        .map(|s| Duration::from_secs(s.min(3600)))
}

async fn map_error(
    resp: reqwest::Response,
    ctx: &Ctx<'_>,
    endpoint: &Url,
    had_token: bool,
) -> HubError {
    let status = resp.status().as_u16();
    let header = |name: &str| {
        resp.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let code = header("x-error-code").unwrap_or_default();
    let message = header("x-error-message").unwrap_or_default();
    let body: String = resp
        .text()
        .await
        .unwrap_or_default()
        .chars()
        .take(300)
        .collect();
    let repo = ctx.repo.to_string();
    let url = endpoint
        .join(ctx.repo)
        .map(|u| u.to_string())
        .unwrap_or_else(|_| ctx.repo.to_string());
    match (status, code.as_str()) {
        (_, "EntryNotFound") => HubError::FileNotFound {
            repo,
            revision: ctx.revision.unwrap_or_default().into(),
            path: ctx.path.unwrap_or_default().into(),
        },
        (416, _) => HubError::Malformed {
            what: format!(
                "a byte range beyond the end of {}",
                ctx.path.unwrap_or_default()
            ),
        },
        (_, "RevisionNotFound") => HubError::RevisionNotFound {
            repo,
            revision: ctx.revision.unwrap_or_default().into(),
        },
        (_, "GatedRepo") if !had_token || status == 401 => HubError::GatedNoToken { repo, url },
        (_, "GatedRepo") => HubError::GatedNotApproved { repo, url },
        (_, "RepoNotFound") => HubError::RepoNotFound { repo },
        (403, _) if message.contains("disabled") => HubError::Disabled { repo },
        (401, _) if message.contains("Invalid credentials") => HubError::BadToken { repo },
        (401, _) | (404, _) => HubError::RepoNotFound { repo },
        _ => HubError::Forbidden {
            repo,
            status,
            message: if message.is_empty() { body } else { message },
        },
    }
}

fn next_link(h: &HeaderMap, endpoint: &Url) -> Result<Option<Url>, HubError> {
    let Some(link) = h.get(LINK).and_then(|v| v.to_str().ok()) else {
        return Ok(None);
    };
    for part in link.split(',') {
        let Some((target, params)) = part.split_once(';') else {
            continue;
        };
        if !params
            .split(';')
            .any(|p| matches!(p.trim(), "rel=\"next\"" | "rel=next"))
        {
            continue;
        }
        let target = target.trim().trim_start_matches('<').trim_end_matches('>');
        let url = endpoint.join(target).map_err(|e| HubError::Malformed {
            what: format!("Link header: {e}"),
        })?;
        // The token goes with every page, so a page elsewhere is never followed.
        if url.origin() != endpoint.origin() {
            return Err(HubError::Malformed {
                what: format!(
                    "the tree's next page points at another host ({})",
                    url.origin().ascii_serialization()
                ),
            });
        }
        return Ok(Some(url));
    }
    Ok(None)
}

fn parse_endpoint(endpoint: &str) -> Result<Url, HubError> {
    let trimmed = endpoint.trim().trim_end_matches('/');
    let url = Url::parse(&format!("{trimmed}/")).map_err(|_| HubError::InvalidInput {
        what: "registry endpoint",
        value: endpoint.into(),
        why: "it must be an http(s) URL such as https://huggingface.co",
    })?;
    if !matches!(url.scheme(), "http" | "https") || url.host().is_none() || url.query().is_some() {
        return Err(HubError::InvalidInput {
            what: "registry endpoint",
            value: endpoint.into(),
            why: "it must be an http(s) URL such as https://huggingface.co",
        });
    }
    Ok(url)
}

/// Checks an `owner/name` repository id before it goes into a URL.
pub fn check_repo(repo: &str) -> Result<(), HubError> {
    let part_ok = |p: &str| {
        !p.is_empty()
            && p.len() <= 96
            && p.bytes()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
            && p.as_bytes()[0].is_ascii_alphanumeric()
            && p.as_bytes()[p.len() - 1].is_ascii_alphanumeric()
    };
    match repo.split_once('/') {
        Some((o, n)) if part_ok(o) && part_ok(n) && !n.contains("..") => Ok(()),
        _ => Err(HubError::InvalidInput {
            what: "repository",
            value: repo.into(),
            why: "it must be owner/name, letters, digits, '-', '_' and '.' (for example bartowski/Qwen2.5-7B-Instruct-GGUF)",
        }),
    }
}

/// Checks a revision (branch, tag or commit) before it goes into a URL.
pub fn check_revision(rev: &str) -> Result<(), HubError> {
    let ok = !rev.is_empty()
        && rev.len() <= 255
        && !rev.contains("..")
        && rev
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.' | b'/'));
    if ok {
        Ok(())
    } else {
        Err(HubError::InvalidInput {
            what: "revision",
            value: rev.into(),
            why: "it must be a branch, tag or commit: letters, digits, '-', '_', '.', '/', no '..'",
        })
    }
}

fn is_hex(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|c| c.is_ascii_hexdigit())
}

fn url_problem(e: url::ParseError) -> &'static str {
    match e {
        url::ParseError::EmptyHost => "empty host",
        url::ParseError::InvalidPort => "invalid port",
        _ => "not a valid URL",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    #[test]
    fn repo_and_revision_are_validated_before_any_url() {
        assert!(check_repo("bartowski/Qwen2.5-7B-Instruct-GGUF").is_ok());
        for bad in [
            "noslash", "a/b/c", "../x", "a/..", "a/b?x=1", "a/b#f", "a /b", "/b", "a/", "-a/b",
        ] {
            let e = check_repo(bad).unwrap_err();
            assert!(e.to_string().contains("must be owner/name"), "{bad}: {e}");
        }
        assert!(check_revision("main").is_ok());
        assert!(check_revision("refs/pr/1").is_ok());
        for bad in ["", "a..b", "x?y", "x y", "a%2F"] {
            assert_eq!(
                check_revision(bad).unwrap_err().reason(),
                "InvalidSpec",
                "{bad}"
            );
        }
    }

    #[test]
    fn endpoint_must_be_an_http_url() {
        assert_eq!(
            parse_endpoint("https://huggingface.co/").unwrap().as_str(),
            "https://huggingface.co/"
        );
        assert_eq!(
            parse_endpoint("http://hub.internal:8080/mirror")
                .unwrap()
                .as_str(),
            "http://hub.internal:8080/mirror/"
        );
        for bad in ["huggingface.co", "ftp://x", "http://", "https://x/?a=b"] {
            assert!(parse_endpoint(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn file_paths_are_encoded_per_segment() {
        let hub = Hub::new("http://127.0.0.1:1", None).unwrap();
        let u = hub
            .resolve_url("o/r", &"a".repeat(40), "BF16/m v#1.gguf")
            .unwrap();
        assert!(
            u.as_str()
                .ends_with("/resolve/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa/BF16/m%20v%231.gguf"),
            "{u}"
        );
        assert!(hub.resolve_url("o/r", "c", "../x").is_err());
    }

    #[test]
    fn rate_limit_reset_prefers_the_ratelimit_header() {
        let mut h = HeaderMap::new();
        h.insert("ratelimit", HeaderValue::from_static("\"api\";r=0;t=7"));
        h.insert(RETRY_AFTER, HeaderValue::from_static("30"));
        assert_eq!(rate_limit_reset(&h), Some(Duration::from_secs(7)));
        h.remove("ratelimit");
        assert_eq!(rate_limit_reset(&h), Some(Duration::from_secs(30)));
        h.insert(
            RETRY_AFTER,
            HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT"),
        );
        assert_eq!(rate_limit_reset(&h), None);
    }

    #[test]
    fn next_page_must_stay_on_the_endpoint() {
        let ep = parse_endpoint("http://127.0.0.1:5000").unwrap();
        let mut h = HeaderMap::new();
        h.insert(
            LINK,
            HeaderValue::from_static(
                "<http://127.0.0.1:5000/api/models/o/r/tree/c?cursor=abc>; rel=\"next\"",
            ),
        );
        assert_eq!(
            next_link(&h, &ep).unwrap().unwrap().query(),
            Some("cursor=abc")
        );
        h.insert(
            LINK,
            HeaderValue::from_static("<http://evil.example/x>; rel=\"next\""),
        );
        assert!(next_link(&h, &ep).is_err());
        h.insert(
            LINK,
            HeaderValue::from_static("<http://127.0.0.1:5000/x>; rel=\"prev\""),
        );
        assert_eq!(next_link(&h, &ep).unwrap(), None);
    }

    #[test]
    fn backoff_is_capped() {
        let r = Retry::default();
        assert_eq!(backoff(r, 1), Duration::from_millis(500));
        assert_eq!(backoff(r, 3), Duration::from_secs(2));
        assert_eq!(backoff(r, 30), Duration::from_secs(8));
    }
}
