//! Stage 3, Mirror: ask the cluster's mirror for the resolved files and follow its progress.
//! The download belongs to the mirror, not to this process: the operator can restart at any time
//! and simply asks again.

use std::time::Duration;

use super::Outcome;
use crate::api::{MirrorFileStatus, MirrorStatus, ModelServe, ResolvedStatus};
use crate::controller::Context;
use crate::mirror::store::FileRef;
use crate::mirror::{Request, Status};
use crate::units::human_bytes;

/// How often progress is looked at (and at most written) while files arrive.
const POLL: Duration = Duration::from_secs(3);

/// The pure part: the outcome and status.mirror for what the mirror reports.
pub fn decide(s: &Status) -> (Outcome, MirrorStatus) {
    let percent = s
        .bytes_done
        .saturating_mul(100)
        .checked_div(s.bytes_total)
        .unwrap_or(100) as i32;
    let mirror = MirrorStatus {
        bytes_done: s.bytes_done as i64,
        bytes_total: s.bytes_total as i64,
        percent,
        files: s
            .files
            .iter()
            .map(|f| MirrorFileStatus {
                path: f.path.clone(),
                state: f.state.clone(),
                bytes_done: f.bytes_done as i64,
            })
            .collect(),
    };
    if let Some(failed) = s.files.iter().find(|f| f.state == "failed") {
        let why = failed
            .error
            .clone()
            .unwrap_or_else(|| format!("{} failed", failed.path));
        // The mirror tries a failed file again a minute after it failed; so do we.
        return (
            Outcome::Failed {
                reason: "MirrorFailed".into(),
                message: why,
                retry: Some(Duration::from_secs(60)),
            },
            mirror,
        );
    }
    if s.files.iter().all(|f| f.state == "present") {
        let message = format!(
            "{} on the mirror, checksums match the registry",
            human_bytes(s.bytes_total)
        );
        return (
            Outcome::Done {
                reason: "Mirrored".into(),
                message,
            },
            mirror,
        );
    }
    let mut message = format!(
        "{percent}% ({} of {})",
        human_bytes(s.bytes_done),
        human_bytes(s.bytes_total)
    );
    if let Some(left) = s
        .bytes_total
        .saturating_sub(s.bytes_done)
        .checked_div(s.bytes_per_second)
    {
        message += &format!(
            " at {}/s, about {} left",
            human_bytes(s.bytes_per_second),
            eta(left)
        );
    }
    (
        Outcome::Waiting {
            reason: "Mirroring".into(),
            message,
            after: POLL,
        },
        mirror,
    )
}

fn eta(secs: u64) -> String {
    match secs {
        0..60 => format!("{secs}s"),
        60..3600 => format!("{}m{}s", secs / 60, secs % 60),
        _ => format!("{}h{}m", secs / 3600, secs % 3600 / 60),
    }
}

/// Runs the stage.
pub async fn run(
    ctx: &Context,
    ms: &ModelServe,
    resolved: &ResolvedStatus,
    out: &mut Option<MirrorStatus>,
    progress: &mut Option<String>,
) -> Outcome {
    let Some(url) = ctx.config.mirror_url.as_deref() else {
        return Outcome::Failed {
            reason: "MirrorNotConfigured".into(),
            message: "the operator has no --mirror-url, so files cannot be mirrored; install the chart's mirror or set the flag".into(),
            retry: Some(Duration::from_secs(60)),
        };
    };
    let token = match super::resolve::token(ctx, ms).await {
        Ok(t) => t,
        Err(outcome) => return outcome,
    };
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
    let answer = ctx
        .http
        .post(format!("{}/v1/fetch", url.trim_end_matches('/')))
        .timeout(Duration::from_secs(10))
        .json(&Request {
            files,
            token: token.map(crate::secret::Secret::new),
        })
        .send()
        .await;
    let status: Status = match answer {
        Ok(r) if r.status().is_success() => match r.json().await {
            Ok(s) => s,
            Err(e) => return unavailable(url, &format!("unreadable answer: {e}")),
        },
        Ok(r) => {
            let code = r.status().as_u16();
            let body: String = r
                .text()
                .await
                .unwrap_or_default()
                .chars()
                .take(300)
                .collect();
            return Outcome::Failed {
                reason: "MirrorRefused".into(),
                message: format!("the mirror answered {code}: {body}"),
                retry: Some(Duration::from_secs(60)),
            };
        }
        Err(e) => return unavailable(url, &e.to_string()),
    };
    let (outcome, mirror) = decide(&status);
    *progress = Some(format!("{}%", mirror.percent));
    *out = Some(mirror);
    outcome
}

fn unavailable(url: &str, why: &str) -> Outcome {
    Outcome::Waiting {
        reason: "MirrorUnavailable".into(),
        message: format!(
            "cannot reach the mirror at {url} ({why}); the download, if any, goes on there"
        ),
        after: Duration::from_secs(10),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mirror::FileStatus;

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
        let (o, m) = decide(&status(
            vec![
                file("present", 1 << 30, 1 << 30),
                file("downloading", 1 << 29, 3 << 30),
            ],
            50 << 20,
        ));
        assert_eq!(m.percent, 37);
        let Outcome::Waiting { message, .. } = o else {
            panic!()
        };
        assert_eq!(
            message,
            "37% (1.5 GiB of 4.0 GiB) at 50.0 MiB/s, about 51s left"
        );
    }

    #[test]
    fn all_present_is_done_and_a_failure_is_reported_with_the_mirrors_reason() {
        let (o, m) = decide(&status(
            vec![file("present", 10, 10), file("present", 20, 20)],
            0,
        ));
        assert_eq!(m.percent, 100);
        assert!(
            matches!(o, Outcome::Done { ref message, .. } if message == "30 B on the mirror, checksums match the registry")
        );
        let mut bad = file("failed", 0, 10);
        bad.error = Some("m arrived with sha256 a, the registry published b".into());
        let (o, _) = decide(&status(vec![bad], 0));
        assert!(
            matches!(o, Outcome::Failed { ref reason, ref message, .. } if reason == "MirrorFailed" && message.contains("registry published b"))
        );
    }
}
