//! Stage 3, Mirror: ask the cluster's mirror for the resolved files and follow its progress.
//! The download belongs to the mirror, not to this process: the operator can restart at any time
//! and simply asks again.
//!
//! Settled once every file is present: the mirror is asked again only when the file set changes
//! or a replica cannot pull, and even then a mirror that does not answer leaves Mirrored as it
//! was, because the replicas that run already have their copies.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use super::env::Env;
use super::outcome::{Failure, Outcome, Progress, Recovery};
use super::token::{self, TokenFailure};
use crate::api::{MirrorFileStatus, MirrorStatus, ModelServe, ResolvedStatus};
use crate::mirror::store::FileRef;
use crate::mirror::{Request, Status};
use crate::names::PULL_CONTAINER;
use crate::units::human_bytes;

/// How often progress is looked at (and at most written) while files arrive.
const POLL: Duration = Duration::from_secs(3);
/// How long one question to the mirror may take.
const ASK_TIMEOUT: Duration = Duration::from_secs(10);
/// The most of a refusal's body quoted in a message.
const QUOTED: usize = 300;
/// When a file the mirror failed is asked for again (the mirror retries it a minute later).
const RETRY_FAILED: Duration = Duration::from_secs(60);

/// Why the files are not on the mirror.
#[derive(Debug, thiserror::Error, strum::IntoStaticStr, strum::VariantNames)]
pub enum MirrorFailure {
    #[error(
        "the operator has no --mirror-url, so files cannot be mirrored; install the chart's mirror or set the flag"
    )]
    MirrorNotConfigured,
    #[error("cannot reach the mirror at {url} ({why}); the download, if any, goes on there")]
    MirrorUnavailable { url: String, why: String },
    #[error("the mirror answered {code}: {body}")]
    MirrorRefused { code: u16, body: String },
    /// The mirror's own reason: wrong bytes, a full disk, a registry that keeps failing.
    #[error("{0}")]
    MirrorFailed(String),
    /// The set does not fit the mirror's volume; nothing of it was fetched.
    #[error("{0}")]
    InsufficientCapacity(String),
    #[error(transparent)]
    #[strum(disabled)]
    Token(#[from] TokenFailure),
}

impl Failure for MirrorFailure {
    fn reason(&self) -> &'static str {
        match self {
            MirrorFailure::Token(t) => t.reason(),
            other => other.into(),
        }
    }

    fn recovery(&self) -> Recovery {
        match self {
            MirrorFailure::MirrorNotConfigured => Recovery::SpecChange,
            MirrorFailure::MirrorFailed(_) | MirrorFailure::InsufficientCapacity(_) => {
                Recovery::Heals(RETRY_FAILED)
            }
            MirrorFailure::Token(t) => t.recovery(),
            MirrorFailure::MirrorUnavailable { .. } | MirrorFailure::MirrorRefused { .. } => {
                Recovery::TRANSIENT
            }
        }
    }
}

/// The file set a Mirrored condition holds for: the commit and each file's content.
pub fn request(resolved: &ResolvedStatus) -> String {
    let mut text = resolved.commit.clone();
    for f in &resolved.files {
        text.push(' ');
        text.push_str(&f.sha256);
        text.push(':');
        text.push_str(&f.path);
    }
    crate::units::digest(text.as_bytes())
}

/// The pure part: the outcome and status.mirror for what the mirror reports.
pub fn decide(s: &Status, request: &str) -> (Outcome, MirrorStatus) {
    let percent = s
        .bytes_done
        .min(s.bytes_total)
        .saturating_mul(100)
        .checked_div(s.bytes_total)
        .unwrap_or(100) as i32;
    let left = s.bytes_total.saturating_sub(s.bytes_done);
    let arriving = left > 0 && s.bytes_per_second > 0;
    let eta = left.checked_div(s.bytes_per_second).filter(|_| arriving);
    let mut mirror = MirrorStatus {
        request: Some(request.to_string()),
        bytes_done: i64::try_from(s.bytes_done).unwrap_or(i64::MAX),
        bytes_total: i64::try_from(s.bytes_total).unwrap_or(i64::MAX),
        percent,
        bytes_per_second: arriving.then(|| i64::try_from(s.bytes_per_second).unwrap_or(i64::MAX)),
        eta_seconds: eta.map(|e| i64::try_from(e).unwrap_or(i64::MAX)),
        files: s
            .files
            .iter()
            .map(|f| MirrorFileStatus {
                path: f.path.clone(),
                state: f.state.clone(),
                bytes_done: i64::try_from(f.bytes_done).unwrap_or(i64::MAX),
            })
            .collect(),
    };
    if let Some(failed) = s.files.iter().find(|f| f.state == "failed") {
        mirror.bytes_per_second = None;
        mirror.eta_seconds = None;
        let why = failed
            .error
            .clone()
            .unwrap_or_else(|| format!("{} failed", failed.path));
        return (Outcome::failed(&MirrorFailure::MirrorFailed(why)), mirror);
    }
    if s.files.iter().all(|f| f.state == "present") {
        let message = format!(
            "{} on the mirror, checksums match the registry",
            human_bytes(s.bytes_total)
        );
        return (Outcome::done(Progress::Mirrored, message), mirror);
    }
    let mut message = format!(
        "{percent}% ({} of {})",
        human_bytes(s.bytes_done),
        human_bytes(s.bytes_total)
    );
    if let Some(left) = eta {
        message += &format!(
            " at {}/s, about {} left",
            human_bytes(s.bytes_per_second),
            crate::units::human_duration(Duration::from_secs(left))
        );
    }
    (Outcome::waiting(Progress::Mirroring, message, POLL), mirror)
}

/// Whether some replica's init container failed to copy the files from the mirror.
pub fn pull_failing(pods: &[std::sync::Arc<Pod>]) -> bool {
    pods.iter()
        .flat_map(|p| {
            p.status
                .iter()
                .flat_map(|s| s.init_container_statuses.iter().flatten())
        })
        .filter(|s| s.name == PULL_CONTAINER)
        .any(|s| {
            let failed = |t: Option<&k8s_openapi::api::core::v1::ContainerStateTerminated>| {
                t.is_some_and(|t| t.exit_code != 0)
            };
            failed(s.state.as_ref().and_then(|st| st.terminated.as_ref()))
                || failed(s.last_state.as_ref().and_then(|st| st.terminated.as_ref()))
        })
}

/// Runs the stage.
pub async fn run(
    env: &Env,
    ms: &ModelServe,
    resolved: &ResolvedStatus,
    out: &mut Option<MirrorStatus>,
    progress: &mut Option<String>,
) -> Outcome {
    let key = request(resolved);
    let settled = settled(ms, &key);
    if let Some(done) = &settled {
        let namespace = ms.namespace().unwrap_or_default();
        if !pull_failing(&env.cache.pods_of(&namespace, &ms.name_any())) {
            return done.clone();
        }
    }
    let status = match ask(env, ms, resolved).await {
        Ok(s) => s,
        // Replicas that run have their copies: an unreachable mirror does not unsettle them.
        Err(f) => return settled.unwrap_or_else(|| Outcome::failed(&f)),
    };
    let (outcome, mirror) = decide(&status, &key);
    *progress = Some(format!("{}%", mirror.percent));
    *out = Some(mirror);
    outcome
}

/// The Mirrored condition as it stands, when it holds for this file set.
fn settled(ms: &ModelServe, key: &str) -> Option<Outcome> {
    let status = ms.status.as_ref()?;
    let c = crate::conditions::get(&status.conditions, "Mirrored")?;
    let holds = c.status == "True"
        && status.mirror.as_ref().and_then(|m| m.request.as_deref()) == Some(key);
    holds.then(|| Outcome::done(Progress::Mirrored, c.message.clone()))
}

async fn ask(
    env: &Env,
    ms: &ModelServe,
    resolved: &ResolvedStatus,
) -> Result<Status, MirrorFailure> {
    let Some(url) = env.settings.mirror_url.as_deref() else {
        return Err(MirrorFailure::MirrorNotConfigured);
    };
    let token = token::token(env, ms).await?;
    let files = resolved
        .files
        .iter()
        .map(|f| FileRef {
            repo: ms.spec.repo.clone(),
            commit: resolved.commit.clone(),
            path: f.path.clone(),
            sha256: f.sha256.clone(),
            size: f.size.max(0) as u64,
        })
        .collect();
    let unavailable = |why: String| MirrorFailure::MirrorUnavailable {
        url: url.to_string(),
        why,
    };
    let mut post = env
        .http
        .post(format!("{}/v1/fetch", url.trim_end_matches('/')))
        .timeout(ASK_TIMEOUT)
        .json(&Request { files, token });
    if let Some(bearer) = env.settings.mirror_token().map_err(&unavailable)? {
        post = post.bearer_auth(bearer);
    }
    let answer = post.send().await.map_err(|e| unavailable(e.to_string()))?;
    let code = answer.status();
    let body = crate::http::read_capped(answer, 4 << 20)
        .await
        .map_err(|e| unavailable(format!("the answer broke off: {e}")))?;
    if code == reqwest::StatusCode::INSUFFICIENT_STORAGE {
        return Err(MirrorFailure::InsufficientCapacity(no_room(&body)));
    }
    if !code.is_success() {
        let text: String = String::from_utf8_lossy(&body)
            .chars()
            .take(QUOTED)
            .collect();
        return Err(MirrorFailure::MirrorRefused {
            code: code.as_u16(),
            body: text,
        });
    }
    serde_json::from_slice(&body).map_err(|e| unavailable(format!("unreadable answer: {e}")))
}

/// The mirror's words from a 507 answer, bounded.
fn no_room(body: &[u8]) -> String {
    let why = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["error"].as_str().map(str::to_string))
        .unwrap_or_else(|| String::from_utf8_lossy(body).into_owned());
    let why: String = why.chars().take(QUOTED * 2).collect();
    format!("the mirror has no room for this model: {why}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mirror::FileStatus;

    #[test]
    fn a_set_the_mirror_has_no_room_for_says_so_with_its_figures() {
        let body = br#"{"error": "the set needs 3.0 GiB on the mirror's volume, which has 1.0 GiB free less 0 B reserved", "reason": "InsufficientCapacity"}"#;
        let f = MirrorFailure::InsufficientCapacity(no_room(body));
        assert_eq!(f.reason(), "InsufficientCapacity");
        assert_eq!(
            f.to_string(),
            "the mirror has no room for this model: the set needs 3.0 GiB on the mirror's volume, which has 1.0 GiB free less 0 B reserved"
        );
        assert!(matches!(f.recovery(), Recovery::Heals(_)));
        assert!(no_room(&[b'x'; 4096]).len() < 700, "bounded");
    }

    fn file(state: &str, done: u64, size: u64) -> FileStatus {
        FileStatus {
            path: format!("f{done}"),
            state: state.into(),
            bytes_done: done,
            size,
            bytes_per_second: 0,
            error: None,
        }
    }

    fn status(files: Vec<FileStatus>, speed: u64) -> Status {
        Status {
            bytes_done: files.iter().map(|f| f.bytes_done).sum(),
            bytes_total: files.iter().map(|f| f.size).sum(),
            bytes_per_second: speed,
            files,
        }
    }

    #[test]
    fn progress_reads_as_percent_bytes_speed_and_eta() {
        let (o, m) = decide(
            &status(
                vec![
                    file("present", 1 << 30, 1 << 30),
                    file("downloading", 1 << 29, 3 << 30),
                ],
                50 << 20,
            ),
            "k",
        );
        assert_eq!(m.percent, 37);
        assert_eq!(m.request.as_deref(), Some("k"));
        assert_eq!(m.bytes_per_second, Some(50 << 20));
        assert_eq!(m.eta_seconds, Some(51));
        assert_eq!(
            o.message(),
            "37% (1.5 GiB of 4.0 GiB) at 50.0 MiB/s, about 51s left"
        );
    }

    #[test]
    fn all_present_is_done_and_a_failure_is_reported_with_the_mirrors_reason() {
        let (o, m) = decide(
            &status(vec![file("present", 10, 10), file("present", 20, 20)], 0),
            "k",
        );
        assert_eq!(m.percent, 100);
        assert_eq!(
            o,
            Outcome::done(
                Progress::Mirrored,
                "30 B on the mirror, checksums match the registry"
            )
        );
        let mut bad = file("failed", 0, 10);
        bad.error = Some("m arrived with sha256 a, the registry published b".into());
        let (o, _) = decide(&status(vec![bad], 0), "k");
        assert_eq!(o.reason(), "MirrorFailed");
        assert!(o.message().contains("registry published b"));
    }

    #[test]
    fn a_mirror_reporting_more_than_the_total_never_exceeds_100_percent() {
        let mut s = status(vec![file("downloading", 50, 10)], 0);
        s.bytes_done = u64::MAX;
        let (_, m) = decide(&s, "k");
        assert_eq!(m.percent, 100);
    }

    #[test]
    fn the_set_key_changes_with_any_file() {
        let r = |sha: &str| ResolvedStatus {
            request: "r".into(),
            commit: "c".repeat(40),
            set: "s".into(),
            quant: None,
            files: vec![crate::api::ResolvedFile {
                path: "m.gguf".into(),
                size: 1,
                sha256: sha.into(),
            }],
            total_bytes: 1,
            served_name: "m".into(),
        };
        assert_eq!(request(&r("a")), request(&r("a")));
        assert_ne!(request(&r("a")), request(&r("b")));
    }

    #[test]
    fn a_replica_whose_pull_exited_non_zero_cannot_pull() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "m-1"},
            "status": {"initContainerStatuses": [{
                "name": "pull", "image": "i", "imageID": "", "ready": false, "restartCount": 1,
                "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}}
            }]}
        }))
        .unwrap();
        assert!(pull_failing(&[std::sync::Arc::new(pod.clone())]));
        let mut ok = pod;
        if let Some(s) = ok
            .status
            .as_mut()
            .and_then(|s| s.init_container_statuses.as_mut())
        {
            s[0].last_state = None;
            s[0].state = Some(Default::default());
        }
        assert!(!pull_failing(&[std::sync::Arc::new(ok)]));
    }
}
