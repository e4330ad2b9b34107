//! The registry client: model info at a revision, the recursive tree at a commit, access
//! checks and byte ranges, each one call bounded in time, in bytes read, and in attempts.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use reqwest::{Method, StatusCode};
use serde::Deserialize;
use url::Url;

use super::HubError;
use super::error::Ctx;
use super::request::key;
use super::select::{RepoFile, safe_path};
use super::transport::{self, ClientKey, Clients, Limits, Retry, describe, next_link};
use super::validate::{
    check_repo, check_revision, encode_path, encode_revision, is_hex, parse_endpoint, url_problem,
};
use crate::secret::Secret;

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

/// The registry client. Cheap to create and clone: its HTTP clients are shared by every `Hub`
/// of the process with the same endpoint, CA bundle and timeouts.
#[derive(Clone, Debug)]
pub struct Hub {
    pub(super) clients: Clients,
    pub(super) endpoint: Url,
    pub(super) ca_bundle: Option<PathBuf>,
    pub(super) token: Option<Secret>,
    pub(super) retry: Retry,
    pub(super) limits: Limits,
}

impl Hub {
    /// A client for `endpoint` (like HF_ENDPOINT), sending `token` to that host only.
    pub fn new(endpoint: &str, token: Option<Secret>) -> Result<Hub, HubError> {
        let endpoint = parse_endpoint(endpoint)?;
        let retry = Retry::default();
        let clients = transport::clients(&key(&endpoint, None, &retry))?;
        Ok(Hub {
            clients,
            endpoint,
            ca_bundle: None,
            token: token.filter(|t| !t.expose().trim().is_empty()),
            retry,
            limits: Limits::default(),
        })
    }

    /// The same client trusting the root certificates of a PEM file too (an internal
    /// registry's CA); None keeps the built-in roots only.
    pub fn with_ca_bundle(mut self, ca_bundle: Option<&Path>) -> Result<Hub, HubError> {
        self.ca_bundle = ca_bundle.map(Path::to_path_buf);
        self.clients = transport::clients(&self.key())?;
        Ok(self)
    }

    /// The same client with other retry and timeout settings.
    pub fn with_retry(mut self, retry: Retry) -> Result<Hub, HubError> {
        self.retry = retry;
        self.clients = transport::clients(&self.key())?;
        Ok(self)
    }

    /// The same client with other bounds on what it reads.
    pub fn with_limits(mut self, limits: Limits) -> Hub {
        self.limits = limits;
        self
    }

    pub fn endpoint(&self) -> &Url {
        &self.endpoint
    }

    pub fn has_token(&self) -> bool {
        self.token.is_some()
    }

    fn key(&self) -> ClientKey {
        key(&self.endpoint, self.ca_bundle.clone(), &self.retry)
    }

    /// Model info at `revision`: the commit it resolves to, and whether the repo is gated.
    pub async fn model_info(&self, repo: &str, revision: &str) -> Result<ModelInfo, HubError> {
        check_repo(repo)?;
        check_revision(revision)?;
        let url = self.url(&format!(
            "api/models/{repo}/revision/{}",
            encode_revision(revision)
        ))?;
        let ctx = Ctx::info(repo, revision);
        let (_, body) = self.get(url, &ctx, self.limits.info_bytes).await?;
        let raw: RawInfo = self.json(&body, &ctx, "an object with the commit as \"sha\"")?;
        let commit = raw
            .sha
            .filter(|s| is_hex(s, 40))
            .ok_or_else(|| HubError::Malformed {
                what: format!(
                    "{} from {} has no 40-hex commit sha",
                    ctx.what(),
                    self.endpoint
                ),
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

    /// Every file of `repo` at `commit`, following the tree's pagination within the limits.
    pub async fn tree(&self, repo: &str, commit: &str) -> Result<Vec<RepoFile>, HubError> {
        check_repo(repo)?;
        check_revision(commit)?;
        let first = self.url(&format!(
            "api/models/{repo}/tree/{}?recursive=true",
            encode_revision(commit)
        ))?;
        let mut next = Some(first);
        let mut seen = HashSet::new();
        let mut files = Vec::new();
        let mut page = 0;
        while let Some(url) = next.take() {
            page += 1;
            if page > self.limits.tree_pages {
                return Err(HubError::TooManyPages {
                    repo: repo.into(),
                    max: self.limits.tree_pages,
                    files: files.len(),
                });
            }
            if !seen.insert(url.to_string()) {
                return Err(HubError::Malformed {
                    what: format!("the file tree of {repo} links back to a page it already sent"),
                });
            }
            let ctx = Ctx::tree_page(repo, commit, page);
            let (headers, body) = self.get(url, &ctx, self.limits.page_bytes).await?;
            next = next_link(&headers, &self.endpoint)?;
            let entries: Vec<RawEntry> = self.json(
                &body,
                &ctx,
                "an array of entries with \"type\", \"path\", \"size\" and \"lfs\"",
            )?;
            for e in entries
                .into_iter()
                .filter(|e| e.kind == "file" && safe_path(&e.path))
            {
                if files.len() >= self.limits.tree_files {
                    return Err(HubError::TooManyFiles {
                        repo: repo.into(),
                        max: self.limits.tree_files,
                    });
                }
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
        }
        Ok(files)
    }

    /// Checks that the token (or no token) may download `path` of a gated repo, without
    /// downloading: the registry answers 401/403 GatedRepo before redirecting to the CDN.
    pub async fn check_access(&self, repo: &str, commit: &str, path: &str) -> Result<(), HubError> {
        let url = self.resolve_url(repo, commit, path)?;
        let ctx = Ctx::file(repo, commit, path);
        let probe = &self.clients.probe;
        self.retrying(&ctx, |left| {
            self.attempt(probe, Method::HEAD, &url, &ctx, None, Some(left))
        })
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
        let want = len as usize;
        let url = self.resolve_url(repo, commit, path)?;
        let ctx = Ctx::file(repo, commit, path);
        let range = format!("bytes={}-{}", offset, offset.saturating_add(len - 1));
        let follow = &self.clients.follow;
        let resp = self
            .retrying(&ctx, |left| {
                self.attempt(follow, Method::GET, &url, &ctx, Some(&range), Some(left))
            })
            .await?;
        let skip = if resp.status() == StatusCode::PARTIAL_CONTENT {
            0
        } else {
            offset
        };
        let mut out = Vec::with_capacity(want);
        let mut seen = 0u64;
        let mut body = resp.bytes_stream();
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| match describe(&e) {
                cause if e.is_timeout() => HubError::NoAnswer {
                    endpoint: self.endpoint.to_string(),
                    what: format!("{} ({cause})", ctx.what()),
                    waited: self.retry.read_timeout,
                    attempts: 1,
                },
                cause => HubError::Unavailable { cause, attempts: 1 },
            })?;
            let start = skip.saturating_sub(seen).min(chunk.len() as u64) as usize;
            seen = seen.saturating_add(chunk.len() as u64);
            let end = chunk
                .len()
                .min(start.saturating_add(want.saturating_sub(out.len())));
            out.extend_from_slice(chunk.get(start..end).unwrap_or_default());
            if out.len() >= want {
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
        let follow = &self.clients.follow;
        // A download of many GB has no total limit; a stall is caught by the read timeout.
        self.retrying(&ctx, |_| {
            self.attempt(follow, Method::GET, &url, &ctx, Some(&range), None)
        })
        .await
    }

    /// The download URL of a file at a commit; repo, revision and path are checked first.
    pub fn resolve_url(&self, repo: &str, commit: &str, path: &str) -> Result<Url, HubError> {
        check_repo(repo)?;
        check_revision(commit)?;
        let path = encode_path(path)?;
        self.url(&format!(
            "{repo}/resolve/{}/{path}",
            encode_revision(commit)
        ))
    }

    fn url(&self, rel: &str) -> Result<Url, HubError> {
        self.endpoint.join(rel).map_err(|e| HubError::InvalidInput {
            what: "registry URL",
            value: rel.into(),
            why: url_problem(e),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

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
        let u = hub
            .resolve_url("o/r", "main", "Модели/Модель-Q4_K_M-00001-of-00003.gguf")
            .unwrap();
        assert_eq!(
            u.path(),
            "/o/r/resolve/main/%D0%9C%D0%BE%D0%B4%D0%B5%D0%BB%D0%B8/%D0%9C%D0%BE%D0%B4%D0%B5%D0%BB%D1%8C-Q4_K_M-00001-of-00003.gguf"
        );
        assert!(hub.resolve_url("o/r", "c", "../x").is_err());
    }

    #[test]
    fn every_hub_of_one_registry_shares_its_clients() {
        let a = Hub::new("http://shared.test:8080", None).unwrap();
        let b = Hub::new("http://shared.test:8080/other/path", Some(Secret::new("t"))).unwrap();
        assert_eq!(a.clients.id, b.clients.id, "same origin, same settings");
        let quick = Retry {
            read_timeout: Duration::from_secs(1),
            ..Retry::default()
        };
        let c = a.clone().with_retry(quick).unwrap();
        let d = b.with_retry(quick).unwrap();
        assert_ne!(c.clients.id, a.clients.id, "other timeouts, other clients");
        assert_eq!(c.clients.id, d.clients.id);
        let e = Hub::new("http://elsewhere.test:8080", None).unwrap();
        assert_ne!(e.clients.id, a.clients.id);
    }

    #[test]
    fn a_blank_token_is_no_token_and_a_token_never_prints() {
        let hub = Hub::new("http://127.0.0.1:1", Some(Secret::new("  "))).unwrap();
        assert!(!hub.has_token());
        let hub = Hub::new("http://127.0.0.1:1", Some(Secret::new("hf_secret"))).unwrap();
        assert!(hub.has_token());
        assert!(!format!("{hub:?}").contains("hf_secret"));
    }
}
