//! `modelserve plan OWNER/REPO`: the Resolve stage (and Check, once built) without a cluster.

use std::io::Write;

use crate::api::{CheckStatus, ModelServe, ModelServeSpec};
use crate::cli::Output;
use crate::hub::RegistryArgs;
use crate::pipeline::check::CheckFailure;
use crate::pipeline::{Failure, check, resolve};
use crate::secret::Secret;
use crate::units::human_bytes;

/// Flags of `modelserve plan`.
#[derive(Clone, Debug, clap::Args)]
// `--endpoint` was this command's name for the registry before the commands shared one.
#[command(mut_arg("registry_endpoint", |a| a.visible_alias("endpoint")))]
pub struct Args {
    #[command(flatten)]
    pub target: super::Target,
    #[command(flatten)]
    pub registry: RegistryArgs,
    /// Registry token for gated or private repositories.
    #[arg(long, env = "HF_TOKEN", hide_env_values = true)]
    pub token: Option<Secret>,
    /// llama.cpp server image the nodes run; its tag names the build.
    #[arg(long, default_value = crate::pipeline::env::DEFAULT_ENGINE_IMAGE)]
    pub engine_image: String,
    /// The nodes' llama.cpp build, when the image tag does not say.
    #[arg(long)]
    pub engine_build: Option<u32>,
    /// Total context of the server in tokens (default 16384).
    #[arg(long, default_value_t = 16384)]
    pub context_size: i32,
    /// Context of one request (default 4096); slots = context-size / context-length.
    #[arg(long, default_value_t = 4096)]
    pub context_length: i32,
    /// The CPU code the nodes run, which decides the CPU repack: none, avx2, avx512, amx,
    /// arm-dotprod, several joined by '|', x86, arm, or unknown (the largest of all).
    #[arg(long, default_value = "unknown", value_parser = clap::value_parser!(crate::gguf::memory::repack::Tiers))]
    pub cpu: crate::gguf::memory::repack::Tiers,
    /// The nodes' logical CPUs: llama-server starts a thread per CPU and about as many for
    /// HTTP, whatever the pod's CPU limit, and each takes memory.
    #[arg(long, default_value_t = crate::gguf::memory::engine::DEFAULT_CPUS, value_parser = clap::value_parser!(u64).range(1..=crate::gguf::memory::engine::MAX_CPUS))]
    pub node_cpus: u64,
    /// Output format.
    #[arg(long, short, value_enum, default_value = "text")]
    pub output: Output,
}

/// Runs the plan and prints it; Err carries the one-line failure.
pub async fn run(args: Args, out: &mut impl Write) -> Result<(), String> {
    let spec: ModelServeSpec = serde_json::from_value(serde_json::json!({
        "repo": args.target.repo, "quant": args.target.quant, "file": args.target.file,
        "revision": args.target.revision,
        "contextSize": args.context_size, "contextLength": args.context_length,
    }))
    .map_err(|e| format!("invalid arguments: {e}"))?;
    let mut registry = args.registry.clone();
    // Like huggingface_hub, plan reads HF_ENDPOINT when nothing of modelserve's names one.
    if registry.registry_endpoint == crate::hub::DEFAULT_ENDPOINT
        && std::env::var_os("MODELSERVE_REGISTRY_ENDPOINT").is_none()
        && let Ok(e) = std::env::var("HF_ENDPOINT")
        && !e.is_empty()
    {
        registry.registry_endpoint = e;
    }
    let hub = registry
        .hub(args.token)
        .map_err(|e| format!("{}: {e}", RegistryArgs::flag_of(&e)))?;
    let result = resolve::resolve(&hub, &spec).await;
    let ms = ModelServe::new("plan", spec.clone());
    let p = check::plan(
        &ms,
        &args.engine_image,
        args.engine_build,
        args.cpu,
        args.node_cpus,
    );
    let checked = match &result {
        Ok(r) => Some(check::inspect(&hub, &spec.repo, r, &p).await),
        Err(_) => None,
    };
    let write = |out: &mut dyn Write, text: String| {
        out.write_all(text.as_bytes())
            .map_err(|e| format!("cannot write the plan: {e}"))
    };
    match (result, args.output) {
        (Ok(r), Output::Json) => {
            let check = match &checked {
                Some(Ok(c)) => serde_json::json!(c),
                Some(Err(o)) => outcome_json(o),
                None => serde_json::Value::Null,
            };
            let json = serde_json::json!({ "repo": spec.repo, "revision": spec.revision(), "resolved": r, "check": check });
            write(out, format!("{json:#}\n"))?;
            check_result(&checked)
        }
        (Ok(r), Output::Text) => {
            let mut s = String::new();
            s += &format!("Repository  {}\n", spec.repo);
            s += &format!("Revision    {} -> commit {}\n", spec.revision(), r.commit);
            s += &format!(
                "Set         {}{}\n",
                r.set,
                r.quant
                    .as_deref()
                    .map(|q| format!(" ({q})"))
                    .unwrap_or_default()
            );
            s += &format!("Served as   {}\n", r.served_name);
            s += "Files\n";
            // Padding counts characters, so names in any script line up as ASCII ones do.
            let width = r
                .files
                .iter()
                .map(|f| f.path.chars().count())
                .max()
                .unwrap_or(0);
            for f in &r.files {
                s += &format!(
                    "  {:<width$}  {:>9}  sha256 {}\n",
                    f.path,
                    human_bytes(f.size as u64),
                    f.sha256
                );
            }
            s += &format!(
                "Total       {} in {} file(s)\n",
                human_bytes(r.total_bytes as u64),
                r.files.len()
            );
            match &checked {
                Some(Ok(c)) => {
                    s += &format!(
                        "Check       {} loads from {} (nodes run {}{})\n",
                        c.architecture.as_deref().unwrap_or("?"),
                        c.first_build.as_deref().unwrap_or("?"),
                        c.engine_build.as_deref().unwrap_or("?"),
                        p.build_note
                            .as_deref()
                            .map(|n| format!("; {n}"))
                            .unwrap_or_default()
                    );
                    s += &format!(
                        "Memory      {} per replica ({} slot(s) of {} tokens): {}\n",
                        c.memory.as_deref().unwrap_or("?"),
                        p.flags.parallel,
                        spec.context_length,
                        c.basis.as_deref().unwrap_or_default()
                    );
                    s += "Nodes       not compared: plan runs without a cluster\n";
                }
                Some(Err(o)) => s += &format!("Check       {}\n", outcome_text(o)),
                None => {}
            }
            write(out, s)?;
            check_result(&checked)
        }
        (Err(e), Output::Json) => {
            let json = serde_json::json!({ "repo": spec.repo, "error": { "reason": e.reason(), "message": e.to_string() } });
            write(out, format!("{json:#}\n"))?;
            Err(format!("{} ({})", e, e.reason()))
        }
        (Err(e), Output::Text) => Err(format!("{} ({})", e, e.reason())),
    }
}

fn outcome_text(f: &CheckFailure) -> String {
    format!("{f} ({})", f.reason())
}

fn outcome_json(f: &CheckFailure) -> serde_json::Value {
    serde_json::json!({ "error": { "reason": f.reason(), "message": f.to_string() } })
}

/// The plan fails when the check says the model cannot be served.
fn check_result(checked: &Option<Result<CheckStatus, CheckFailure>>) -> Result<(), String> {
    match checked {
        Some(Err(o)) => Err(outcome_text(o)),
        _ => Ok(()),
    }
}
