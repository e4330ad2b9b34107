//! `modelserve plan OWNER/REPO`: the Resolve stage (and Check, once built) without a cluster.

use std::io::Write;

use crate::api::ModelServeSpec;
use crate::cli::Output;
use crate::hub::Hub;
use crate::pipeline::resolve;
use crate::units::human_bytes;

/// Flags of `modelserve plan`.
#[derive(Clone, Debug, clap::Args)]
pub struct Args {
    /// Repository on the registry, as owner/name.
    pub repo: String,
    /// Quant to choose (default Q4_K_M).
    #[arg(long, conflicts_with = "file")]
    pub quant: Option<String>,
    /// A file path or shard-set name instead of a quant.
    #[arg(long)]
    pub file: Option<String>,
    /// Branch, tag or commit (default main).
    #[arg(long)]
    pub revision: Option<String>,
    /// Registry endpoint (like HF_ENDPOINT).
    #[arg(long, env = "HF_ENDPOINT", default_value = crate::hub::DEFAULT_ENDPOINT)]
    pub endpoint: String,
    /// Registry token for gated or private repositories.
    #[arg(long, env = "HF_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Output format.
    #[arg(long, short, value_enum, default_value = "text")]
    pub output: Output,
}

/// Runs the plan and prints it; Err carries the one-line failure.
pub async fn run(args: Args, out: &mut impl Write) -> Result<(), String> {
    let spec: ModelServeSpec = serde_json::from_value(serde_json::json!({
        "repo": args.repo, "quant": args.quant, "file": args.file, "revision": args.revision,
    }))
    .map_err(|e| format!("invalid arguments: {e}"))?;
    let hub = Hub::new(&args.endpoint, args.token).map_err(|e| format!("--endpoint: {e}"))?;
    let result = resolve::resolve(&hub, &spec).await;
    let write = |out: &mut dyn Write, text: String| {
        out.write_all(text.as_bytes())
            .map_err(|e| format!("cannot write the plan: {e}"))
    };
    match (result, args.output) {
        (Ok(r), Output::Json) => {
            let json = serde_json::json!({ "repo": spec.repo, "revision": spec.revision(), "resolved": r });
            write(out, format!("{json:#}\n"))
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
            let width = r.files.iter().map(|f| f.path.len()).max().unwrap_or(0);
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
            s += "Check       not built yet in this version: no architecture or memory verdict\n";
            write(out, s)
        }
        (Err(e), Output::Json) => {
            let json = serde_json::json!({ "repo": spec.repo, "error": { "reason": e.reason(), "message": e.to_string() } });
            write(out, format!("{json:#}\n"))?;
            Err(format!("{} ({})", e, e.reason()))
        }
        (Err(e), Output::Text) => Err(format!("{} ({})", e, e.reason())),
    }
}
