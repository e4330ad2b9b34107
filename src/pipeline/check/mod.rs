//! Stage 2, Check, before any download: read the GGUF header over HTTP ranges, decide whether
//! the nodes' llama.cpp build loads it, estimate a replica's memory, and stop if no node can
//! hold it.
//!
//! Settled once passed: a Check that is True for the same set, server flags and placement is
//! not redone, so a scale or any other edit that does not change those reads nothing again.

pub mod cpu;
pub mod fit;
pub mod gpu;

use std::time::Duration;

use super::env::Env;
use super::outcome::{Failure, Outcome, Progress, Recovery};
use super::resolve::registry_recovery;
use super::token::{self, TokenFailure};
use crate::api::{CheckStatus, ModelServe, ResolvedStatus};
use crate::gguf::inspect::{InspectError, Verdict};
use crate::gguf::memory::Flags;
use crate::gguf::memory::repack::Tiers;
use crate::gguf::{self, ReadError, SourceError, support};
use crate::hub::{Hub, HubError};
use crate::units::gi_quantity;

/// llama-server's --ubatch-size, as the Catalog stage runs it.
pub const UBATCH: u64 = 512;
/// How often a model no node can hold is compared with the nodes again (from the cache).
pub const RECHECK_NODES: Duration = Duration::from_secs(300);

/// Why Check stops the pipeline.
#[derive(Debug, thiserror::Error)]
pub enum CheckFailure {
    /// The header could not be read or is not a loadable GGUF.
    #[error("{}", header_message(.0))]
    Header(#[source] ReadError),
    #[error("{source}{note}")]
    Unsupported {
        #[source]
        source: support::Unsupported,
        /// The build note, when the build is an assumption.
        note: String,
    },
    /// A count beyond its bound (InvalidHeader), or server settings beyond theirs (InvalidSpec).
    #[error("{0}")]
    Bounds(#[source] crate::gguf::bounds::BoundsError),
    #[error("{0}")]
    InvalidResources(String),
    #[error("{why}. {summary}")]
    NoNodeFits { why: String, summary: String },
    /// The runtime dropped the judging task (the operator is shutting down).
    #[error("the header check was cancelled: {0}")]
    Cancelled(String),
    #[error(transparent)]
    Registry(#[from] HubError),
    #[error(transparent)]
    Token(#[from] TokenFailure),
}

/// A registry failure says what was being read; a bad file speaks for itself.
fn header_message(e: &ReadError) -> String {
    match e {
        ReadError::Source(SourceError::Hub(h)) => format!("reading the GGUF header: {h}"),
        other => other.to_string(),
    }
}

impl Failure for CheckFailure {
    fn reason(&self) -> &'static str {
        match self {
            CheckFailure::Header(e) => e.reason(),
            CheckFailure::Bounds(e) => e.reason(),
            CheckFailure::Unsupported { source, .. } => source.reason(),
            CheckFailure::InvalidResources(_) => "InvalidResources",
            CheckFailure::NoNodeFits { .. } => "NoNodeFits",
            CheckFailure::Cancelled(_) => "InternalError",
            CheckFailure::Registry(e) => e.reason(),
            CheckFailure::Token(e) => e.reason(),
        }
    }

    fn recovery(&self) -> Recovery {
        match self {
            CheckFailure::Header(ReadError::Source(SourceError::Hub(h))) => registry_recovery(h),
            CheckFailure::Registry(h) => registry_recovery(h),
            CheckFailure::Token(e) => e.recovery(),
            CheckFailure::Cancelled(_) => Recovery::TRANSIENT,
            // Nodes come and go without a spec change.
            CheckFailure::NoNodeFits { .. } => Recovery::Heals(RECHECK_NODES),
            CheckFailure::Header(_)
            | CheckFailure::Bounds(_)
            | CheckFailure::Unsupported { .. }
            | CheckFailure::InvalidResources(_) => Recovery::SpecChange,
        }
    }
}

/// The settings the check is for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    pub build: u32,
    /// Said in messages when the build is an assumption rather than read from the image tag.
    pub build_note: Option<String>,
    pub flags: Flags,
    /// With a GPU accelerator: what is asked for, and the GPUs of the nodes it may run on.
    pub gpu: Option<GpuCheck>,
}

/// The GPU part of a check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuCheck {
    pub request: gpu::Request,
    pub nodes: Vec<gpu::NodeGpus>,
}

impl GpuCheck {
    /// The GPU request of `engine` and the GPUs of the `candidates` among `nodes` its replicas
    /// may land on; None on cpu, an error naming a spec field that is wrong.
    pub fn of(
        env: &Env,
        engine: &crate::api::EngineSpec,
        nodes: &[std::sync::Arc<k8s_openapi::api::core::v1::Node>],
        candidates: &[fit::Candidate],
    ) -> Result<Option<GpuCheck>, String> {
        let default_image = env.settings.engine_image_for(engine.accelerator());
        let image = engine.image.as_deref().unwrap_or(default_image);
        let Some(request) = gpu::Request::of(engine, image, env.settings.gpu_headroom)? else {
            return Ok(None);
        };
        let names: Vec<String> = candidates.iter().map(|c| c.name.clone()).collect();
        let nodes = gpu::node_gpus(nodes, &names, &request);
        Ok(Some(GpuCheck { request, nodes }))
    }
}

/// The nodes' build and the server flags for `ms`, from the spec and the operator's
/// configuration, for replicas that may run the CPU code `cpu` on nodes of at most `cpus`
/// logical CPUs.
pub fn plan(
    ms: &ModelServe,
    default_image: &str,
    build_override: Option<u32>,
    cpu: Tiers,
    cpus: u64,
) -> Plan {
    let image = ms
        .spec
        .engine
        .as_ref()
        .and_then(|e| e.image.clone())
        .unwrap_or_else(|| default_image.to_string());
    let (build, build_note) = match (support::build_of_image(&image), build_override) {
        (_, Some(b)) => (
            b,
            Some(format!("build b{b} as configured (--engine-build)")),
        ),
        (Some(b), None) => (b, None),
        (None, None) => (
            LATEST_KNOWN_BUILD,
            Some(format!(
                "the image {image} names no build, so b{LATEST_KNOWN_BUILD} is assumed; set --engine-build to be exact"
            )),
        ),
    };
    let parallel = (ms.spec.context_size / ms.spec.context_length.max(1)).max(1) as u64;
    Plan {
        build,
        build_note,
        flags: Flags {
            ctx_size: ms.spec.context_size.max(1) as u64,
            parallel,
            ubatch: UBATCH,
            build,
            cpu,
            cpus,
        },
        gpu: None,
    }
}

/// The newest build the data tables describe.
pub const LATEST_KNOWN_BUILD: u32 = 10587;

/// What status.check.request records for this check.
pub fn request(r: &ResolvedStatus, p: &Plan) -> String {
    let base = format!(
        "{}@{} ctx={} parallel={} build=b{} cpu={} cpus={}",
        r.set,
        r.commit,
        p.flags.ctx_size,
        p.flags.parallel,
        p.build,
        p.flags.cpu.key(),
        p.flags.cpus
    );
    match &p.gpu {
        None => base,
        Some(g) => {
            // The placement depends on the nodes' GPUs: a change there checks again.
            let nodes: Vec<String> = g.nodes.iter().map(gpu::NodeGpus::key).collect();
            let digest = crate::units::digest(nodes.join(",").as_bytes());
            format!("{base} {} gpus@{digest}", g.request.key())
        }
    }
}

/// Reads the model's header from the registry and judges its counts, build support and
/// memory. The judging is CPU work, bounded by the header's limits: it runs on the blocking
/// pool, so a large header never holds up a runtime worker (and a panic there still reaches
/// the stage's guard).
pub async fn inspect(
    hub: &Hub,
    repo: &str,
    r: &ResolvedStatus,
    p: &Plan,
) -> Result<CheckStatus, CheckFailure> {
    let paths: Vec<String> = r.files.iter().map(|f| f.path.clone()).collect();
    let (header, _) = gguf::read_model(hub, repo, &r.commit, &paths)
        .await
        .map_err(CheckFailure::Header)?;
    let (split, build, flags) = (paths.len() > 1, p.build, p.flags);
    let gpus = p.gpu.clone();
    let judged = tokio::task::spawn_blocking(move || {
        let v = gguf::inspect::judge(&header, split, build, &flags);
        // The placement only for a model the build loads and whose counts are in bounds.
        let placed = match (&v, &gpus) {
            (Ok(_), Some(g)) => Some(gpu::plan(&header, &flags, &g.nodes, &g.request)),
            _ => None,
        };
        (header, v, placed)
    })
    .await;
    let (header, verdict, placed) = match judged {
        Ok(j) => j,
        Err(e) => match e.try_into_panic() {
            Ok(panic) => std::panic::resume_unwind(panic),
            Err(e) => return Err(CheckFailure::Cancelled(e.to_string())),
        },
    };
    let Verdict {
        first_build: first,
        estimate: e,
    } = verdict.map_err(|e| match e {
        InspectError::Read(e) => CheckFailure::Header(e),
        InspectError::Bounds(e) => CheckFailure::Bounds(e),
        InspectError::Unsupported(source) => CheckFailure::Unsupported {
            source,
            note: p
                .build_note
                .as_ref()
                .map(|n| format!(" ({n})"))
                .unwrap_or_default(),
        },
    })?;
    let mut status = CheckStatus {
        request: Some(request(r, p)),
        architecture: header.architecture().map(String::from),
        engine_build: Some(format!("b{}", p.build)),
        first_build: Some(format!("b{first}")),
        parallel: Some(p.flags.parallel as i32),
        memory_bytes: Some(i64::try_from(e.total).unwrap_or(i64::MAX)),
        memory: Some(gi_quantity(e.total)),
        kv_bytes_per_token: Some(i64::try_from(e.kv_bytes_per_token).unwrap_or(i64::MAX)),
        basis: Some(e.basis.clone()),
        ..Default::default()
    };
    match placed {
        None => {}
        Some(Err(why)) => {
            return Err(CheckFailure::NoNodeFits {
                why,
                summary: format!(
                    "{} loads from b{first} (nodes run b{})",
                    status.architecture.as_deref().unwrap_or("the model"),
                    p.build
                ),
            });
        }
        Some(Ok(plan)) => {
            // The GPUs hold their part; the pod's memory request is the host's alone.
            let host = plan.placement.host.total;
            let i = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
            status.memory_bytes = Some(i(host));
            status.memory = Some(gi_quantity(host));
            status.gpu_layers = Some(plan.placement.ngl as i32);
            status.layers = Some(plan.placement.n_layer as i32 + 1);
            status.tensor_split =
                (plan.placement.devices.len() > 1).then(|| plan.placement.tensor_split_arg());
            status.gpu_memory_bytes = Some(i(plan.memory));
            status.gpu_shared_by = plan.shared_by.iter().map(|n| *n as i32).collect();
            status.gke_accelerators = plan.gke.clone();
            status.instance_types = plan.instance_types.clone();
            status.amd_mixed_sizes = plan.amd_mixed.clone();
            status.devices = plan.devices();
            status.basis = Some(plan.message.clone());
        }
    }
    Ok(status)
}

fn with_note(message: String, p: &Plan) -> String {
    match &p.build_note {
        Some(n) => format!("{message} ({n})"),
        None => message,
    }
}

/// What the fit depends on besides the estimate: the memory the user asks for and where the
/// replicas may go. Part of status.check.request, so changing any of them checks again.
pub fn placement_key(ms: &ModelServe) -> Option<String> {
    let e = ms.spec.engine.as_ref()?;
    let memory = e.memory_request().map(|q| q.0.clone());
    if memory.is_none() && e.node_selector.is_empty() && e.tolerations.is_empty() {
        return None;
    }
    let text = serde_json::json!([memory, e.node_selector, e.tolerations]).to_string();
    Some(crate::units::digest(text.as_bytes()))
}

/// The whole request a passed Check holds for.
fn full_request(inspection: &str, ms: &ModelServe) -> String {
    match placement_key(ms) {
        Some(k) => format!("{inspection} placement={k}"),
        None => inspection.to_string(),
    }
}

/// Runs the stage.
pub async fn run(
    env: &Env,
    ms: &ModelServe,
    resolved: &ResolvedStatus,
    check: &mut Option<CheckStatus>,
) -> Outcome {
    let engine = ms.spec.engine.clone().unwrap_or_default();
    let nodes = env.cache.nodes();
    let tolerations = gpu::tolerations(&engine);
    let candidates = fit::candidates(&nodes, &engine.node_selector, &tolerations);
    // The pod may land on any candidate: the estimate counts the largest repack among them.
    let cpu = cpu::union(candidates.iter().map(|c| &c.cpu)).capped(env.settings.engine_cpu);
    let default_image = env.settings.engine_image_for(engine.accelerator());
    let cpus = fit::most_cpus(&candidates);
    let mut p = plan(ms, default_image, env.settings.engine_build, cpu, cpus);
    match GpuCheck::of(env, &engine, &nodes, &candidates) {
        Ok(gpu) => p.gpu = gpu,
        Err(why) => {
            *check = None;
            return Outcome::failed(&CheckFailure::InvalidResources(why));
        }
    }
    let inspection = request(resolved, &p);
    let full = full_request(&inspection, ms);
    // A check that passed for this very request holds: nothing it depends on has changed.
    if let Some(done) = settled(ms, &full) {
        return done;
    }
    let cached = check.clone().filter(|c| {
        c.request
            .as_deref()
            .is_some_and(|r| r == inspection || r.starts_with(&format!("{inspection} placement=")))
    });
    // The same file set under the same flags reads the same header: many ModelServes of one
    // repository ask the registry once.
    let shared = format!("{} {inspection}", ms.spec.repo);
    let mut status = match cached.or_else(|| env.inspections.get(&shared)) {
        Some(c) => c,
        None => match read(env, ms, resolved, &p).await {
            Ok(s) => {
                env.inspections.put(shared, s.clone());
                s
            }
            Err(f) => {
                *check = None;
                return Outcome::failed(&f);
            }
        },
    };
    status.request = Some(full);
    *check = Some(status.clone());
    match judge(&engine, &candidates, &status, &p) {
        Ok(message) => Outcome::done(Progress::Checked, message),
        Err(f) => Outcome::failed(&f),
    }
}

/// The Checked condition as it stands, when it passed for `request`.
fn settled(ms: &ModelServe, request: &str) -> Option<Outcome> {
    let status = ms.status.as_ref()?;
    let c = crate::conditions::get(&status.conditions, "Checked")?;
    let holds = c.status == "True"
        && status.check.as_ref().and_then(|c| c.request.as_deref()) == Some(request);
    holds.then(|| Outcome::done(Progress::Checked, c.message.clone()))
}

async fn read(
    env: &Env,
    ms: &ModelServe,
    resolved: &ResolvedStatus,
    p: &Plan,
) -> Result<CheckStatus, CheckFailure> {
    let token = token::token(env, ms).await?;
    let hub = env.settings.registry.hub(token)?;
    inspect(&hub, &ms.spec.repo, resolved, p).await
}

/// Compares what a replica will request with the nodes it may land on (from the cache).
fn judge(
    engine: &crate::api::EngineSpec,
    candidates: &[fit::Candidate],
    status: &CheckStatus,
    p: &Plan,
) -> Result<String, CheckFailure> {
    let needed = status.memory_bytes.unwrap_or(0).max(0) as u64;
    // The scheduler places a replica by the memory its pod requests: the user's, when set.
    let (asked, asked_note) =
        fit::requested(engine, needed).map_err(CheckFailure::InvalidResources)?;
    // With GPUs, the host part must fit on a node whose GPUs take the rest.
    let gpu_nodes: Vec<fit::Candidate>;
    let candidates = match (&p.gpu, status.gpu_memory_bytes) {
        (Some(g), Some(memory)) => {
            let memory = memory.max(0) as u64;
            gpu_nodes = candidates
                .iter()
                .filter(|c| {
                    g.nodes.iter().any(|n| {
                        n.node == c.name
                            && n.takes(g.request.gpus)
                            && n.known().is_some_and(|m| m >= memory)
                    })
                })
                .cloned()
                .collect();
            &gpu_nodes
        }
        _ => candidates,
    };
    let verdict = fit::fit(asked, candidates);
    let mut summary = format!(
        "{} loads from {} (nodes run {}); {}",
        status.architecture.as_deref().unwrap_or("the model"),
        status.first_build.as_deref().unwrap_or("?"),
        status.engine_build.as_deref().unwrap_or("?"),
        status.basis.as_deref().unwrap_or_default()
    );
    if let Some(n) = asked_note {
        summary = format!("{summary}; {n}");
    }
    match verdict {
        Ok(fits) => Ok(with_note(format!("{summary}; {fits}"), p)),
        Err(why) => Err(CheckFailure::NoNodeFits { why, summary }),
    }
}

/// Node labels from (key, value) pairs, for tests of what the nodes say.
#[cfg(test)]
pub(crate) fn test_labels(pairs: &[(&str, &str)]) -> std::collections::BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_build_comes_from_the_image_or_is_a_stated_assumption() {
        let mut ms = ModelServe::new(
            "m",
            serde_json::from_value(
                serde_json::json!({"repo": "a/b", "contextSize": 16384, "contextLength": 4096}),
            )
            .unwrap(),
        );
        let p = plan(
            &ms,
            "ghcr.io/ggml-org/llama.cpp:server-b6500",
            None,
            Tiers::ANY,
            8,
        );
        assert_eq!(
            (p.build, p.build_note.clone(), p.flags.parallel),
            (6500, None, 4)
        );
        let p = plan(&ms, "llama.cpp:latest", None, Tiers::ANY, 8);
        assert!(p.build_note.unwrap().contains("names no build"));
        ms.spec.engine = Some(crate::api::EngineSpec {
            image: Some("x:server-cuda-b7000".into()),
            ..Default::default()
        });
        assert_eq!(
            plan(
                &ms,
                "ghcr.io/ggml-org/llama.cpp:server-b6500",
                None,
                Tiers::ANY,
                8
            )
            .build,
            7000
        );
        assert_eq!(plan(&ms, "y", Some(5000), Tiers::ANY, 8).build, 5000);
    }
}
