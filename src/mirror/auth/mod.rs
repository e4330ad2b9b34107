//! Who may ask the mirror for what. With `--auth kubernetes` (the default) every request but
//! `/healthz` and `/metrics` carries a ServiceAccount token for the mirror's audience, which the
//! API server checks with a TokenReview:
//!
//! - a file is served only to a namespace with a ModelServe whose resolved set holds it (the
//!   mirror watches the ModelServes itself, so a new model's pod is let in as soon as Resolve
//!   has written its set);
//! - downloads (`POST /v1/fetch`) and the live set (`PUT /v1/live`) only to the operator's
//!   ServiceAccounts.
//!
//! No token or one the API server does not accept is a 401, a caller that may not is a 403, and
//! each says why. A token is never logged or kept: a review is remembered by the token's sha256
//! for at most a minute. `--auth none` lets anyone in, for a mirror only its own host reaches.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Json;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use kube::api::PostParams;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Api, ResourceExt};
use sha2::{Digest, Sha256};

use crate::api::ModelServe;

mod token;
pub use token::read_token_file;
use token::{bearer, quoted, verdict};

/// The audience of the tokens the mirror accepts, unless `--audience` says otherwise.
pub const DEFAULT_AUDIENCE: &str = "modelserve-mirror";
/// The longest token read from a request.
const MAX_TOKEN: usize = 16 << 10;
/// How long a review is remembered: an accepted token, and a refused one.
const REMEMBER_ACCEPTED: Duration = Duration::from_secs(60);
const REMEMBER_REFUSED: Duration = Duration::from_secs(10);
/// Reviews remembered at most; all are forgotten at once when full.
const MOST_REMEMBERED: usize = 4096;
/// The longest one TokenReview may take.
const REVIEW_TIMEOUT: Duration = Duration::from_secs(10);
/// TokenReviews in flight at most: a flood of requests with tokens never seen (each its own
/// review) waits for these instead of sending the API server one request each. A request that
/// cannot start its review within REVIEW_TIMEOUT gets a 503 with Retry-After.
const MOST_REVIEWS: usize = 16;
/// The most characters of the API server's words quoted in a refusal.
const QUOTED: usize = 300;

/// How the mirror checks who asks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// A ServiceAccount token for the mirror's audience, checked with a TokenReview.
    Kubernetes,
    /// Anyone who reaches the mirror may do anything: for a mirror on loopback only.
    None,
}

/// The flags of the mirror's authentication.
#[derive(Clone, Debug, clap::Args)]
pub struct AuthArgs {
    /// How the mirror checks who asks: "kubernetes" (a projected ServiceAccount token for --audience, checked with a TokenReview; files only to namespaces whose ModelServes hold them, downloads only to --operator-service-account) or "none" (no check: only for a mirror nothing else can reach).
    #[arg(long = "auth", env = "MODELSERVE_MIRROR_AUTH", value_enum, default_value_t = Mode::Kubernetes)]
    pub mode: Mode,
    /// The audience a token must be for.
    #[arg(long, env = "MODELSERVE_MIRROR_AUDIENCE", default_value = DEFAULT_AUDIENCE)]
    pub audience: String,
    /// The operator's ServiceAccounts, as NAMESPACE/NAME (comma-separated or repeated): the only callers that may ask for downloads and tell the live set.
    #[arg(
        long = "operator-service-account",
        env = "MODELSERVE_MIRROR_OPERATORS",
        value_delimiter = ','
    )]
    pub operators: Vec<String>,
}

impl Default for AuthArgs {
    fn default() -> Self {
        AuthArgs {
            mode: Mode::None,
            audience: DEFAULT_AUDIENCE.into(),
            operators: Vec::new(),
        }
    }
}

impl AuthArgs {
    /// The operator ServiceAccounts as (namespace, name), or the flag that is wrong and why.
    pub fn validate(&self) -> Result<Vec<(String, String)>, String> {
        if self.audience.is_empty()
            || self.audience.len() > 253
            || !self.audience.bytes().all(|b| b.is_ascii_graphic())
        {
            return Err(format!(
                "--audience {:?}: it must be 1 to 253 visible ASCII characters, such as {DEFAULT_AUDIENCE}",
                self.audience
            ));
        }
        let mut out = Vec::new();
        for sa in &self.operators {
            let parsed = sa
                .trim()
                .split_once('/')
                .filter(|(ns, name)| is_dns_label(ns) && is_dns_subdomain(name));
            match parsed {
                Some((ns, name)) => out.push((ns.to_string(), name.to_string())),
                None => {
                    return Err(format!(
                        "--operator-service-account {sa:?}: it must be NAMESPACE/NAME of a ServiceAccount, such as modelserve/modelserve"
                    ));
                }
            }
        }
        if self.mode == Mode::Kubernetes && out.is_empty() {
            return Err(
                "--auth kubernetes needs --operator-service-account NAMESPACE/NAME: the operator's ServiceAccount, the only one that may ask for downloads".into(),
            );
        }
        Ok(out)
    }
}

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns_label)
}

/// A ServiceAccount the API server vouched for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    pub namespace: String,
    pub name: String,
}

impl std::fmt::Display for Caller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ServiceAccount {}/{}", self.namespace, self.name)
    }
}

/// A request the gate turns away, with the answer's status and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub status: StatusCode,
    pub message: String,
}

impl Refusal {
    fn unauthenticated(message: String) -> Refusal {
        Refusal {
            status: StatusCode::UNAUTHORIZED,
            message,
        }
    }

    fn forbidden(message: String) -> Refusal {
        Refusal {
            status: StatusCode::FORBIDDEN,
            message,
        }
    }

    fn unavailable(message: String) -> Refusal {
        Refusal {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message,
        }
    }

    /// The metric label of this refusal.
    pub fn result(&self) -> &'static str {
        match self.status {
            StatusCode::UNAUTHORIZED => "unauthenticated",
            StatusCode::FORBIDDEN => "forbidden",
            _ => "unavailable",
        }
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let reason = match self.status {
            StatusCode::UNAUTHORIZED => "Unauthorized",
            StatusCode::FORBIDDEN => "Forbidden",
            _ => "ServiceUnavailable",
        };
        let mut r = (
            self.status,
            Json(serde_json::json!({ "error": self.message, "reason": reason })),
        )
            .into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"modelserve-mirror\""),
            );
        }
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
        }
        r
    }
}

/// The mirror's gate: open, or checked against the API server.
#[derive(Clone)]
pub enum Gate {
    Open,
    Checked(Arc<Checker>),
}

impl Gate {
    /// The gate `args` asks for; with `kubernetes`, a client from the pod's ServiceAccount (or
    /// KUBECONFIG) and a watch of every ModelServe.
    pub async fn start(args: &AuthArgs) -> Result<Gate, String> {
        let operators = args.validate()?;
        if args.mode == Mode::None {
            tracing::warn!(
                "--auth none: anyone who reaches the mirror may read every file and ask for downloads"
            );
            return Ok(Gate::Open);
        }
        let client = kube::Client::try_default()
            .await
            .map_err(|e| format!("--auth kubernetes needs the API server: {e}"))?;
        Ok(Gate::Checked(Checker::start(
            client,
            args.audience.clone(),
            operators,
        )))
    }

    /// Who may read `repo@commit/path`; Ok(None) when the gate is open.
    pub async fn may_read(
        &self,
        headers: &HeaderMap,
        repo: &str,
        commit: &str,
        path: &str,
    ) -> Result<Option<Caller>, Refusal> {
        match self {
            Gate::Open => Ok(None),
            Gate::Checked(c) => {
                let caller = c.caller(headers).await?;
                c.holds(&caller, repo, commit, path)?;
                Ok(Some(caller))
            }
        }
    }

    /// Whether the caller may ask for downloads and tell the live set.
    pub async fn may_fetch(&self, headers: &HeaderMap, what: &str) -> Result<(), Refusal> {
        match self {
            Gate::Open => Ok(()),
            Gate::Checked(c) => {
                let caller = c.caller(headers).await?;
                c.is_operator(&caller, what)
            }
        }
    }
}

/// A review remembered: until when, and what it said.
type Remembered = (Instant, Result<Caller, Refusal>);

/// The checks of `--auth kubernetes`.
pub struct Checker {
    client: kube::Client,
    audience: String,
    operators: Vec<(String, String)>,
    models: reflector::Store<ModelServe>,
    synced: Arc<AtomicBool>,
    reviews: Mutex<HashMap<[u8; 32], Remembered>>,
    reviewing: tokio::sync::Semaphore,
}

impl Checker {
    /// A checker reviewing with `client`, watching every ModelServe from now on.
    pub fn start(
        client: kube::Client,
        audience: String,
        operators: Vec<(String, String)>,
    ) -> Arc<Checker> {
        let (models, writer) = reflector::store();
        let synced = Arc::new(AtomicBool::new(false));
        let api: Api<ModelServe> = Api::all(client.clone());
        let stream = watcher(api, watcher::Config::default())
            .default_backoff()
            .modify(|ms| {
                // Only the spec's repository and the resolved set are read.
                ms.managed_fields_mut().clear();
                ms.annotations_mut().clear();
            })
            .reflect(writer);
        let flag = synced.clone();
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(event) = stream.next().await {
                match event {
                    Ok(watcher::Event::InitDone) => {
                        if !flag.swap(true, Ordering::SeqCst) {
                            tracing::info!(
                                "the mirror has read the ModelServes; files are served to their namespaces"
                            );
                        }
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot watch the ModelServes; files are served by what was last read")
                    }
                }
            }
        });
        Arc::new(Checker {
            client,
            audience,
            operators,
            models,
            synced,
            reviews: Mutex::default(),
            reviewing: tokio::sync::Semaphore::new(MOST_REVIEWS),
        })
    }

    /// The ServiceAccount whose token the request carries.
    async fn caller(&self, headers: &HeaderMap) -> Result<Caller, Refusal> {
        let token = bearer(headers, &self.audience)?;
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        if let Some(verdict) = self.remembered(&key) {
            return verdict;
        }
        let _permit = tokio::time::timeout(REVIEW_TIMEOUT, self.reviewing.acquire())
            .await
            .map_err(|_| {
                Refusal::unavailable(format!(
                    "cannot check the token yet: {MOST_REVIEWS} TokenReviews are in flight and none ended within {}s",
                    REVIEW_TIMEOUT.as_secs()
                ))
            })?
            .map_err(|_| Refusal::unavailable("the mirror is stopping".into()))?;
        // The same token may have been reviewed while this request waited.
        if let Some(verdict) = self.remembered(&key) {
            return verdict;
        }
        let verdict = self.review(token).await;
        let keep = match &verdict {
            Ok(_) => REMEMBER_ACCEPTED,
            // The API server not answering is not remembered: the next request asks again.
            Err(r) if r.status == StatusCode::SERVICE_UNAVAILABLE => return verdict,
            Err(_) => REMEMBER_REFUSED,
        };
        let mut reviews = self.lock();
        if reviews.len() >= MOST_REMEMBERED {
            reviews.clear();
        }
        reviews.insert(key, (Instant::now() + keep, verdict.clone()));
        verdict
    }

    async fn review(&self, token: &str) -> Result<Caller, Refusal> {
        let api: Api<TokenReview> = Api::all(self.client.clone());
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_string(),
                audiences: Some(vec![self.audience.clone()]),
            },
            ..Default::default()
        };
        let answer = tokio::time::timeout(
            REVIEW_TIMEOUT,
            api.create(&PostParams::default(), &review),
        )
        .await
        .map_err(|_| {
            Refusal::unavailable(format!(
                "cannot check the token: the API server did not answer the TokenReview in {}s",
                REVIEW_TIMEOUT.as_secs()
            ))
        })?
        .map_err(|e| {
            Refusal::unavailable(format!(
                "cannot check the token with a TokenReview: {}",
                quoted(&e.to_string())
            ))
        })?;
        let status = answer.status.unwrap_or_default();
        verdict(&status, &self.audience)
    }

    /// Whether a ModelServe in the caller's namespace has `repo@commit/path` in its resolved set.
    fn holds(&self, caller: &Caller, repo: &str, commit: &str, path: &str) -> Result<(), Refusal> {
        if !self.synced.load(Ordering::SeqCst) {
            return Err(Refusal::unavailable(
                "the mirror is still reading the ModelServes it serves files to; try again shortly"
                    .into(),
            ));
        }
        let holds = self.models.state().iter().any(|ms| {
            ms.namespace().as_deref() == Some(caller.namespace.as_str())
                && ms.spec.repo.eq_ignore_ascii_case(repo)
                && ms
                    .status
                    .as_ref()
                    .and_then(|s| s.resolved.as_ref())
                    .is_some_and(|r| {
                        r.commit.eq_ignore_ascii_case(commit)
                            && r.files.iter().any(|f| f.path == path)
                    })
        });
        if holds {
            Ok(())
        } else {
            Err(Refusal::forbidden(format!(
                "{caller} may not read {repo}@{commit}/{path}: no ModelServe in namespace {} has this file in its resolved set",
                caller.namespace
            )))
        }
    }

    fn is_operator(&self, caller: &Caller, what: &str) -> Result<(), Refusal> {
        if self
            .operators
            .iter()
            .any(|(ns, name)| *ns == caller.namespace && *name == caller.name)
        {
            return Ok(());
        }
        let allowed: Vec<String> = self
            .operators
            .iter()
            .map(|(ns, name)| format!("{ns}/{name}"))
            .collect();
        Err(Refusal::forbidden(format!(
            "{caller} may not {what}: only the operator's ServiceAccount ({}) may",
            allowed.join(", ")
        )))
    }

    fn remembered(&self, key: &[u8; 32]) -> Option<Result<Caller, Refusal>> {
        self.lock()
            .get(key)
            .filter(|(until, _)| Instant::now() < *until)
            .map(|(_, verdict)| verdict.clone())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 32], Remembered>> {
        self.reviews.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests;
