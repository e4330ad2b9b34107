//! `modelserve pull`: the replicas' init container. Copies a model's files from the cluster's
//! mirror into the pod's volume, hashing while the bytes arrive, resuming a partial copy with a
//! Range request, and moving a file into place only when its size and sha256 are the ones the
//! registry published. A file already in place and intact is not copied again.
//!
//! A walk through it: [`args`] checks the flags into a [`Plan`], [`verify`] looks at what
//! `--dest` already holds, [`copy`] copies one file, and [`pull`] does that for every file.

mod args;
mod copy;
mod error;
mod progress;
mod verify;

use std::io::Write;
use std::time::{Duration, Instant};

pub use args::{Args, Plan, Wanted, parse_file};
pub use error::PullError;

use crate::retry::Backoff;
use crate::units::human_bytes;

/// The longest `--connect-timeout` and `--stall-timeout` taken: a day.
const MAX_TIMEOUT_SECS: u64 = 86_400;

/// Runs `modelserve pull`: every file present and verified in `--dest`, or the reason why not.
pub async fn run(args: Args) -> Result<(), String> {
    let plan = Plan::new(&args).map_err(|e| e.to_string())?;
    let limits = Limits {
        stall: Duration::from_secs(args.stall_timeout.clamp(1, MAX_TIMEOUT_SECS)),
        attempts: args.attempts,
        backoff: Backoff {
            first: Duration::from_millis(500),
            cap: Duration::from_secs(10),
        },
    };
    // The one client of this process: every file's requests reuse its connections.
    let http = reqwest::Client::builder()
        // Stalls are timed per request and per chunk in `copy`, which says which it was.
        .connect_timeout(Duration::from_secs(
            args.connect_timeout.clamp(1, MAX_TIMEOUT_SECS),
        ))
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
    /// The waits before a resumed request or another copy.
    pub backoff: Backoff,
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
    let total = plan.total_bytes();
    let _ = writeln!(
        out,
        "pulling {} file(s), {}, of {}/{}@{} from {} into {dest}",
        plan.files.len(),
        human_bytes(total),
        plan.owner,
        plan.name,
        plan.short_commit(),
        plan.mirror
    );
    std::fs::create_dir_all(&plan.dest).map_err(|source| PullError::Disk {
        path: plan
            .files
            .first()
            .map(|f| f.path.clone())
            .unwrap_or_default(),
        dest: dest.clone(),
        source,
    })?;
    verify::check_room_for_all(plan)?;
    for f in &plan.files {
        let job = copy::Job::new(plan, f, limits);
        if let Some(parent) = job.target.parent() {
            std::fs::create_dir_all(parent).map_err(|e| job.disk(e))?;
        }
        if verify::already_present(&job.target, f)
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
