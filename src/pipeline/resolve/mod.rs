//! Stage 1, Resolve: the repository at its revision -> a pinned commit and the GGUF file set.
//!
//! Once resolved, the result is kept for as long as the spec asks for the same thing, so a moved
//! branch never changes a served model. A permanent failure is not retried until the spec
//! changes; a transient one is retried with capped backoff.

use std::time::Duration;

use super::env::Env;
use super::outcome::{Failure, Outcome, Progress, Recovery, RunFailure};
use super::token::{self, TokenFailure};
use crate::api::{ModelServe, ModelServeSpec, ResolvedFile, ResolvedStatus};
use crate::conditions;
use crate::hub::select::{self, FileSet, SelectError, Want};
use crate::hub::{Hub, HubError};
use crate::names::served_name_of;
use crate::units::human_bytes;

/// How often a gated repository whose access request is pending is asked again.
pub const RECHECK_APPROVAL: Duration = Duration::from_secs(600);

/// Why Resolve could not choose a set.
#[derive(Debug, thiserror::Error)]
pub enum ResolveFailure {
    #[error(transparent)]
    Registry(#[from] HubError),
    #[error(transparent)]
    Selection(#[from] SelectError),
    #[error(transparent)]
    Token(#[from] TokenFailure),
}

impl Failure for ResolveFailure {
    fn reason(&self) -> &'static str {
        match self {
            ResolveFailure::Registry(e) => e.reason(),
            ResolveFailure::Selection(e) => e.reason(),
            ResolveFailure::Token(e) => e.reason(),
        }
    }

    fn recovery(&self) -> Recovery {
        match self {
            ResolveFailure::Registry(e) => registry_recovery(e),
            ResolveFailure::Selection(_) => Recovery::SpecChange,
            ResolveFailure::Token(e) => e.recovery(),
        }
    }
}

/// How a registry failure gets better: transient ones by backoff (not before a rate limit
/// resets), a pending access request by itself, the rest by a spec change.
pub fn registry_recovery(e: &HubError) -> Recovery {
    match e {
        HubError::RateLimited { retry_after } => Recovery::Transient {
            at_least: *retry_after,
        },
        HubError::GatedNotApproved { .. } => Recovery::Heals(RECHECK_APPROVAL),
        e if e.is_transient() => Recovery::TRANSIENT,
        _ => Recovery::SpecChange,
    }
}

/// Reasons of a False Resolved condition that something other than a spec change can fix: the
/// stage runs again for these; for every other reason it waits for a new generation.
pub fn recovers_without_spec_change(reason: &str) -> bool {
    let registry = [
        HubError::RateLimited {
            retry_after: Duration::ZERO,
        },
        HubError::GatedNotApproved {
            repo: String::new(),
            url: String::new(),
        },
        HubError::Unavailable {
            cause: String::new(),
            attempts: 0,
        },
        HubError::Malformed {
            what: String::new(),
        },
    ];
    registry.iter().any(|e| e.reason() == reason)
        || <TokenFailure as strum::VariantNames>::VARIANTS.contains(&reason)
        || <RunFailure as strum::VariantNames>::VARIANTS.contains(&reason)
}

/// What the spec asks to resolve, as recorded in status.resolved.request.
pub fn request(spec: &ModelServeSpec) -> String {
    match &spec.file {
        Some(f) => format!("{}@{} file={f}", spec.repo, spec.revision()),
        None => format!("{}@{} quant={}", spec.repo, spec.revision(), spec.quant()),
    }
}

/// The pure part: does status already answer this spec, or did it fail for good for this
/// generation?
pub fn settled(ms: &ModelServe) -> Option<Outcome> {
    let status = ms.status.as_ref()?;
    if let Some(r) = status
        .resolved
        .as_ref()
        .filter(|r| r.request == request(&ms.spec))
    {
        return Some(done(r));
    }
    let c = conditions::get(&status.conditions, "Resolved")?;
    let same_generation =
        c.observed_generation.is_some() && c.observed_generation == ms.metadata.generation;
    (c.status == "False" && same_generation && !recovers_without_spec_change(&c.reason)).then(
        || Outcome::Failed {
            reason: c.reason.clone(),
            message: c.message.clone(),
            recovery: Recovery::SpecChange,
        },
    )
}

fn done(r: &ResolvedStatus) -> Outcome {
    let files = if r.files.len() == 1 {
        "1 file".to_string()
    } else {
        format!("{} files", r.files.len())
    };
    let what = r.quant.clone().unwrap_or_else(|| r.set.clone());
    let short: String = r.commit.chars().take(7).collect();
    Outcome::done(
        Progress::Resolved,
        format!(
            "{what}, {} in {files}, commit {short}",
            human_bytes(r.total_bytes.max(0) as u64),
        ),
    )
}

/// Runs the stage: writes status.resolved on success, clears it when the spec asks for something
/// it cannot resolve.
pub async fn run(env: &Env, ms: &ModelServe, resolved: &mut Option<ResolvedStatus>) -> Outcome {
    if let Some(outcome) = settled(ms) {
        return outcome;
    }
    match attempt(env, ms).await {
        Ok(r) => {
            let outcome = done(&r);
            *resolved = Some(r);
            outcome
        }
        Err(f) => {
            if f.recovery() == Recovery::SpecChange {
                *resolved = None;
            }
            Outcome::failed(&f)
        }
    }
}

async fn attempt(env: &Env, ms: &ModelServe) -> Result<ResolvedStatus, ResolveFailure> {
    let token = token::token(env, ms).await?;
    let hub = env.settings.registry.hub(token)?;
    resolve(&hub, &ms.spec).await
}

/// Model info -> tree at the pinned commit -> file set -> access check for gated repos.
pub async fn resolve(hub: &Hub, spec: &ModelServeSpec) -> Result<ResolvedStatus, ResolveFailure> {
    let repo = spec.repo.as_str();
    let info = hub.model_info(repo, spec.revision()).await?;
    let files = hub.tree(repo, &info.commit).await?;
    let want = match &spec.file {
        Some(f) => Want::File(f),
        None => Want::Quant(spec.quant()),
    };
    let set = select::select(repo, &files, want)?;
    if info.gated.is_some()
        && let Some(first) = set.files.first()
    {
        hub.check_access(repo, &info.commit, &first.path).await?;
    }
    Ok(status_of(spec, &info.commit, set))
}

fn status_of(spec: &ModelServeSpec, commit: &str, set: FileSet) -> ResolvedStatus {
    let total = set.total_bytes();
    ResolvedStatus {
        request: request(spec),
        commit: commit.into(),
        set: set.name,
        quant: set.label.map(|l| l.to_ascii_uppercase()),
        files: set
            .files
            .into_iter()
            .map(|f| ResolvedFile {
                path: f.path,
                size: f.size as i64,
                sha256: f.sha256.unwrap_or_default(),
            })
            .collect(),
        total_bytes: total as i64,
        served_name: served_name_of(spec),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ModelServeStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

    fn ms(spec: serde_json::Value) -> ModelServe {
        let mut m = ModelServe::new("m", serde_json::from_value(spec).unwrap());
        m.metadata.generation = Some(2);
        m
    }

    fn resolved_for(spec: &ModelServeSpec) -> ResolvedStatus {
        ResolvedStatus {
            request: request(spec),
            commit: "1a2b3c4d5e".repeat(4),
            set: "m-q4_k_m".into(),
            quant: Some("Q4_K_M".into()),
            files: vec![
                ResolvedFile {
                    path: "m-q4_k_m-00001-of-00002.gguf".into(),
                    size: 3_993_201_344,
                    sha256: "a".repeat(64),
                },
                ResolvedFile {
                    path: "m-q4_k_m-00002-of-00002.gguf".into(),
                    size: 689_872_288,
                    sha256: "b".repeat(64),
                },
            ],
            total_bytes: 3_993_201_344 + 689_872_288,
            served_name: "m".into(),
        }
    }

    #[test]
    fn a_pinned_result_is_reused_while_the_spec_asks_the_same() {
        let mut m = ms(serde_json::json!({"repo": "o/m-GGUF"}));
        let r = resolved_for(&m.spec);
        m.status = Some(ModelServeStatus {
            resolved: Some(r),
            ..Default::default()
        });
        let Some(Outcome::Done { message, .. }) = settled(&m) else {
            panic!("should be settled")
        };
        assert_eq!(message, "Q4_K_M, 4.4 GiB in 2 files, commit 1a2b3c4");
    }

    #[test]
    fn a_changed_quant_resolves_again() {
        let mut m = ms(serde_json::json!({"repo": "o/m-GGUF"}));
        let r = resolved_for(&m.spec);
        m.status = Some(ModelServeStatus {
            resolved: Some(r),
            ..Default::default()
        });
        m.spec.quant = Some("Q8_0".into());
        assert_eq!(settled(&m), None);
    }

    fn failed(reason: &str, generation: i64) -> Condition {
        Condition {
            type_: "Resolved".into(),
            status: "False".into(),
            reason: reason.into(),
            message: "x".into(),
            observed_generation: Some(generation),
            last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ),
        }
    }

    #[test]
    fn a_permanent_failure_waits_for_a_new_generation() {
        let mut m = ms(serde_json::json!({"repo": "o/m"}));
        m.status = Some(ModelServeStatus {
            conditions: vec![failed("GatedRepoNoToken", 2)],
            ..Default::default()
        });
        assert!(matches!(
            settled(&m),
            Some(Outcome::Failed {
                recovery: Recovery::SpecChange,
                ..
            })
        ));
        m.metadata.generation = Some(3);
        assert_eq!(settled(&m), None, "a spec change tries again");
    }

    #[test]
    fn failures_that_heal_without_a_spec_change_are_looked_at_again() {
        for reason in [
            "TokenSecretMissing",
            "KubernetesApiError",
            "GatedRepoNotApproved",
            "RegistryUnavailable",
            "RateLimited",
            "InternalError",
            "StageTimeout",
        ] {
            let mut m = ms(serde_json::json!({"repo": "o/m"}));
            m.status = Some(ModelServeStatus {
                conditions: vec![failed(reason, 2)],
                ..Default::default()
            });
            assert_eq!(settled(&m), None, "{reason}");
        }
    }

    #[test]
    fn the_request_names_quant_or_file() {
        assert_eq!(
            request(&ms(serde_json::json!({"repo": "o/m"})).spec),
            "o/m@main quant=Q4_K_M"
        );
        assert_eq!(
            request(
                &ms(serde_json::json!({"repo": "o/m", "file": "x.gguf", "revision": "v1"})).spec
            ),
            "o/m@v1 file=x.gguf"
        );
    }
}
