//! Stage 1, Resolve: the repository at its revision -> a pinned commit and the GGUF file set.
//!
//! Once resolved, the result is kept for as long as the spec asks for the same thing, so a moved
//! branch never changes a served model. A permanent failure is not retried until the spec
//! changes; a transient one is retried with capped backoff.

use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::{Api, ResourceExt};

use super::Outcome;
use crate::api::{ModelServe, ModelServeSpec, ResolvedFile, ResolvedStatus};
use crate::conditions;
use crate::controller::Context;
use crate::hub::select::{self, FileSet, Want};
use crate::hub::{Hub, HubError};
use crate::naming::served_name;
use crate::units::human_bytes;

/// Reasons of a False Resolved condition that are worth checking again without a spec change.
const RECHECKED: [&str; 2] = ["TokenSecretMissing", "KubernetesApiError"];

/// What the spec asks to resolve, as recorded in status.resolved.request.
pub fn request(spec: &ModelServeSpec) -> String {
    match &spec.file {
        Some(f) => format!("{}@{} file={f}", spec.repo, spec.revision()),
        None => format!("{}@{} quant={}", spec.repo, spec.revision(), spec.quant()),
    }
}

/// The pure part: does status already answer this spec, or did it fail for this generation?
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
    (c.status == "False" && same_generation && !RECHECKED.contains(&c.reason.as_str())).then(|| {
        Outcome::Failed {
            reason: c.reason.clone(),
            message: c.message.clone(),
            retry: None,
        }
    })
}

fn done(r: &ResolvedStatus) -> Outcome {
    let files = if r.files.len() == 1 {
        "1 file".to_string()
    } else {
        format!("{} files", r.files.len())
    };
    let what = r.quant.clone().unwrap_or_else(|| r.set.clone());
    Outcome::Done {
        reason: "Resolved".into(),
        message: format!(
            "{what}, {} in {files}, commit {}",
            human_bytes(r.total_bytes.max(0) as u64),
            &r.commit[..r.commit.len().min(7)]
        ),
    }
}

/// Runs the stage: writes status.resolved on success, clears it when the spec asks for something
/// it cannot resolve.
pub async fn run(ctx: &Context, ms: &ModelServe, resolved: &mut Option<ResolvedStatus>) -> Outcome {
    if let Some(outcome) = settled(ms) {
        return outcome;
    }
    let key = format!(
        "{}/{}/resolve",
        ms.namespace().unwrap_or_default(),
        ms.name_any()
    );
    let token = match token(ctx, ms).await {
        Ok(t) => t,
        Err(outcome) => return outcome,
    };
    let result = match Hub::new(
        &ctx.config.registry_endpoint,
        token.map(crate::secret::Secret::new),
    ) {
        Ok(hub) => resolve(&hub, &ms.spec).await,
        Err(e) => Err(Failure::Hub(e)),
    };
    match result {
        Ok(r) => {
            ctx.retries.reset(&key).await;
            let outcome = done(&r);
            *resolved = Some(r);
            outcome
        }
        Err(Failure::Hub(e)) if e.is_transient() => {
            let attempt = ctx.retries.bump(&key).await;
            let wait = crate::controller::backoff(attempt).max(match &e {
                HubError::RateLimited { retry_after } => *retry_after,
                _ => Duration::ZERO,
            });
            Outcome::Waiting {
                reason: e.reason().into(),
                message: format!(
                    "{e}; trying again in {}s (attempt {attempt})",
                    wait.as_secs()
                ),
                after: wait,
            }
        }
        Err(f) => {
            ctx.retries.reset(&key).await;
            *resolved = None;
            let (reason, message) = match f {
                Failure::Hub(e) => (e.reason(), e.to_string()),
                Failure::Select(e) => (e.reason(), e.to_string()),
            };
            Outcome::Failed {
                reason: reason.into(),
                message,
                retry: None,
            }
        }
    }
}

/// Why Resolve could not choose a set.
#[derive(Debug)]
pub enum Failure {
    Hub(HubError),
    Select(select::SelectError),
}

/// Model info -> tree at the pinned commit -> file set -> access check for gated repos.
pub async fn resolve(hub: &Hub, spec: &ModelServeSpec) -> Result<ResolvedStatus, Failure> {
    let repo = spec.repo.as_str();
    let info = hub
        .model_info(repo, spec.revision())
        .await
        .map_err(Failure::Hub)?;
    let files = hub.tree(repo, &info.commit).await.map_err(Failure::Hub)?;
    let want = match &spec.file {
        Some(f) => Want::File(f),
        None => Want::Quant(spec.quant()),
    };
    let set = select::select(repo, &files, want).map_err(Failure::Select)?;
    if info.gated.is_some() {
        hub.check_access(repo, &info.commit, &set.files[0].path)
            .await
            .map_err(Failure::Hub)?;
    }
    Ok(status_of(spec, &info.commit, set))
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Hub(e) => e.fmt(f),
            Failure::Select(e) => e.fmt(f),
        }
    }
}

impl Failure {
    /// The condition reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Failure::Hub(e) => e.reason(),
            Failure::Select(e) => e.reason(),
        }
    }
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
        served_name: spec
            .served_name
            .clone()
            .unwrap_or_else(|| served_name(&spec.repo)),
    }
}

/// The registry token: spec.tokenSecretRef in the ModelServe's namespace, else the operator's
/// default Secret, else none.
pub(crate) async fn token(ctx: &Context, ms: &ModelServe) -> Result<Option<String>, Outcome> {
    let (namespace, name, key) = match (&ms.spec.token_secret_ref, &ctx.config.default_token_secret)
    {
        (Some(r), _) => (
            ms.namespace().unwrap_or_default(),
            r.name.clone(),
            r.key.clone(),
        ),
        (None, Some(d)) => match d.split_once('/') {
            Some((ns, name)) => (ns.to_string(), name.to_string(), "token".to_string()),
            None => return Ok(None),
        },
        (None, None) => return Ok(None),
    };
    let missing = |message: String| Outcome::Failed {
        reason: "TokenSecretMissing".into(),
        message,
        retry: Some(Duration::from_secs(30)),
    };
    let secret = match Api::<Secret>::namespaced(ctx.client.clone(), &namespace)
        .get_opt(&name)
        .await
    {
        Ok(Some(s)) => s,
        Ok(None) => {
            return Err(missing(format!(
                "the token Secret {namespace}/{name} does not exist; create it with the registry token under key {key}"
            )));
        }
        Err(e) => {
            return Err(Outcome::Failed {
                reason: "KubernetesApiError".into(),
                message: format!("cannot read the token Secret {namespace}/{name}: {e}"),
                retry: Some(Duration::from_secs(30)),
            });
        }
    };
    match secret.data.as_ref().and_then(|d| d.get(&key)) {
        Some(ByteString(bytes)) => match String::from_utf8(bytes.clone()) {
            Ok(t) if !t.trim().is_empty() => Ok(Some(t.trim().to_string())),
            _ => Err(missing(format!(
                "the key {key} of Secret {namespace}/{name} is empty or not text"
            ))),
        },
        None => Err(missing(format!(
            "the Secret {namespace}/{name} has no key {key}"
        ))),
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
            Some(Outcome::Failed { retry: None, .. })
        ));
        m.metadata.generation = Some(3);
        assert_eq!(settled(&m), None, "a spec change tries again");
    }

    #[test]
    fn a_missing_token_secret_is_checked_again() {
        let mut m = ms(serde_json::json!({"repo": "o/m"}));
        m.status = Some(ModelServeStatus {
            conditions: vec![failed("TokenSecretMissing", 2)],
            ..Default::default()
        });
        assert_eq!(settled(&m), None);
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
