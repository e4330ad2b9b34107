//! Stage 4, Catalog: the serving objects, applied server-side and owned by the ModelServe: an
//! engine-key Secret, a Deployment running the llama.cpp server (sized by the Check stage, fed by
//! an init container that copies the files from the mirror), and a Service.
//!
//! What the objects look like is a pure function ([`objects::objects`]); the live objects come
//! from the cache, and an apply is sent only when they no longer carry what the operator applies
//! ([`apply`]). A deleted or hand-edited object is put back by the reconcile its watch triggers.

pub mod apply;
pub mod args;
mod container;
pub mod gpu;
pub mod objects;
#[cfg(test)]
mod testing;

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use kube::ResourceExt;

use super::env::Env;
use super::outcome::{Failure, Outcome, Progress, Recovery};
use crate::api::{ModelServe, ModelServeStatus};
use crate::names::{PORT, secret_name, selector};
use crate::units::{gi_quantity, human_bytes};
pub use objects::{Settings, objects};

/// When a name someone else holds is looked at again.
const RECHECK_TAKEN: Duration = Duration::from_secs(60);

/// Why the serving objects cannot be what the spec asks.
#[derive(Debug, thiserror::Error, strum::IntoStaticStr, strum::VariantNames)]
pub enum CatalogFailure {
    #[error("the operator has no --mirror-url, so replicas have nowhere to copy the model from")]
    MirrorNotConfigured,
    #[error("{0}")]
    CatalogInvalid(String),
    #[error(
        "a {kind} named {name} already exists and does not belong to this ModelServe; delete or rename it, or give the ModelServe another name"
    )]
    NameTaken { kind: &'static str, name: String },
    #[error("{what} failed: {source}")]
    ApiError {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("{0}")]
    EngineKeyFailed(String),
}

impl Failure for CatalogFailure {
    fn reason(&self) -> &'static str {
        self.into()
    }

    fn recovery(&self) -> Recovery {
        match self {
            CatalogFailure::MirrorNotConfigured | CatalogFailure::CatalogInvalid(_) => {
                Recovery::SpecChange
            }
            // The other object may be deleted without any change here.
            CatalogFailure::NameTaken { .. } => Recovery::Heals(RECHECK_TAKEN),
            CatalogFailure::ApiError { .. } | CatalogFailure::EngineKeyFailed(_) => {
                Recovery::TRANSIENT
            }
        }
    }
}

/// Applies what drifted and reports the objects.
pub async fn run(env: &Env, ms: &ModelServe, status: &mut ModelServeStatus) -> Outcome {
    match catalog(env, ms, status).await {
        Ok(message) => Outcome::done(Progress::Cataloged, message),
        Err(f) => Outcome::failed(&f),
    }
}

async fn catalog(
    env: &Env,
    ms: &ModelServe,
    status: &mut ModelServeStatus,
) -> Result<String, CatalogFailure> {
    let (Some(resolved), Some(check)) = (status.resolved.clone(), status.check.clone()) else {
        return Err(CatalogFailure::CatalogInvalid(
            "nothing is resolved and checked yet".into(),
        ));
    };
    let mirror_url = env
        .settings
        .mirror_url
        .clone()
        .ok_or(CatalogFailure::MirrorNotConfigured)?;
    // The build only: the CPU code and count do not change the objects.
    let accelerator = ms
        .spec
        .engine
        .as_ref()
        .map(|e| e.accelerator())
        .unwrap_or_default();
    let default_image = env.settings.engine_image_for(accelerator);
    let plan = super::check::plan(
        ms,
        default_image,
        env.settings.engine_build,
        crate::gguf::memory::repack::Tiers::ANY,
        crate::gguf::memory::engine::DEFAULT_CPUS,
    );
    let settings = Settings {
        engine_image: default_image.to_string(),
        build: plan.build,
        pull_image: env.settings.pull_image.clone(),
        mirror_url,
        mirror_audience: env.settings.mirror_audience.clone(),
    };
    let key = apply::engine_key(env, ms).await?;
    let key_digest = crate::units::digest(apply::key_of(&key).unwrap_or_default());
    let (deployment, service) = objects(ms, &resolved, &check, &settings, &key_digest)
        .map_err(CatalogFailure::CatalogInvalid)?;
    let ns = ms.namespace().unwrap_or_else(|| "default".into());
    let name = ms.name_any();
    // The two are independent: applied at once, so a reconcile waits for one round trip.
    let (live, _) = futures::try_join!(
        apply::apply_if_drifted(
            env,
            ms,
            "Deployment",
            env.cache.deployment(&ns, &name),
            &deployment,
        ),
        apply::apply_if_drifted(env, ms, "Service", env.cache.service(&ns, &name), &service),
    )?;
    let live: std::sync::Arc<Deployment> = live;

    status.selector = Some(selector(ms));
    if let Some(st) = &live.status {
        status.replicas = st.replicas.unwrap_or(0);
        status.ready_replicas = st.ready_replicas.unwrap_or(0);
    }
    let memory = check
        .memory_bytes
        .map(|m| gi_quantity(m.max(0) as u64))
        .unwrap_or_default();
    let n = ms.spec.replicas;
    Ok(format!(
        "Deployment {name} ({n} replica{s} of {memory} memory, {files} copied from the mirror), Service {name}:{PORT}, key in Secret {key}",
        s = if n == 1 { "" } else { "s" },
        files = human_bytes(resolved.total_bytes.max(0) as u64),
        key = secret_name(ms),
    ))
}
