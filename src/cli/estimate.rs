//! `modelserve estimate FILE...`: the Check stage's verdict and memory estimate for local GGUF
//! files (the shards of one model, first shard first), without a registry or a cluster.

use std::io::Write;

use crate::gguf::inspect::{self, Verdict};
use crate::gguf::{self, FileSource, ReadError, memory, read_header};
use crate::pipeline::check;
use crate::units::gi_quantity;

/// Flags of `modelserve estimate`.
#[derive(Clone, Debug, clap::Args)]
pub struct Args {
    /// GGUF files of one model (shards in order).
    #[arg(required = true)]
    pub files: Vec<std::path::PathBuf>,
    /// Total context of the server in tokens.
    #[arg(long, default_value_t = 16384)]
    pub context_size: u64,
    /// Context of one request; slots = context-size / context-length.
    #[arg(long, default_value_t = 4096)]
    pub context_length: u64,
    /// The nodes' llama.cpp build.
    #[arg(long, default_value_t = check::LATEST_KNOWN_BUILD)]
    pub engine_build: u32,
}

/// Prints the estimate as JSON; an error is one line naming the file, what is wrong and the
/// condition reason the Check stage would give.
pub async fn run(args: Args, out: &mut impl Write) -> Result<(), String> {
    let mut model = None;
    for path in &args.files {
        let file = path.display().to_string();
        let mut src = FileSource { path: path.clone() };
        let read = read_header(&mut src, &file).await.map_err(refusal)?;
        gguf::merge(&mut model, read.header, &file).map_err(refusal)?;
    }
    let header = model.ok_or("no file given")?;
    let flags = memory::Flags {
        ctx_size: args.context_size,
        parallel: (args.context_size / args.context_length.max(1)).max(1),
        ubatch: check::UBATCH,
        build: args.engine_build,
    };
    let Verdict {
        first_build,
        estimate: e,
    } = inspect::judge(&header, args.files.len() > 1, args.engine_build, &flags)
        .map_err(|e| format!("{e} ({})", e.reason()))?;
    let json = serde_json::json!({
        "architecture": header.architecture(),
        "firstBuild": format!("b{first_build}"),
        "parallel": flags.parallel,
        "weights": e.weights, "kv": e.kv, "recurrent": e.recurrent, "compute": e.compute,
        "overhead": e.overhead, "total": e.total, "memory": gi_quantity(e.total),
        "kvBytesPerToken": e.kv_bytes_per_token, "fallback": e.fallback, "basis": e.basis,
    });
    out.write_all(format!("{json:#}\n").as_bytes())
        .map_err(|e| e.to_string())
}

fn refusal(e: ReadError) -> String {
    format!("{e} ({})", e.reason())
}
