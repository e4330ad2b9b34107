//! `modelserve estimate FILE...`: the Check stage's verdict and memory estimate for local GGUF
//! files (the shards of one model, first shard first), without a registry or a cluster.

use std::io::Write;

use crate::gguf::inspect::{self, Verdict};
use crate::gguf::memory::repack::Tiers;
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
    /// The CPU code the engine runs, which decides the CPU repack: none, avx2, avx512, amx,
    /// arm-dotprod, several joined by '|' (the largest repack counts), x86, arm, or unknown (the
    /// largest of all).
    #[arg(long, default_value = "unknown", value_parser = clap::value_parser!(Tiers))]
    pub cpu: Tiers,
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
        cpu: args.cpu,
    };
    let Verdict {
        first_build,
        estimate: e,
    } = inspect::judge(&header, args.files.len() > 1, args.engine_build, &flags)
        .map_err(|e| format!("{e} ({})", e.reason()))?;
    let parts = parts(&e);
    let json = serde_json::json!({
        "architecture": header.architecture(),
        "firstBuild": format!("b{first_build}"),
        "parallel": flags.parallel,
        "cpu": e.repack_tier.to_string(),
        "weights": e.weights, "repack": e.repack, "kv": e.kv, "recurrent": e.recurrent,
        "checkpoints": e.checkpoints, "checkpointWindow": e.checkpoint_window, "compute": e.compute, "output": e.engine.output, "vocab": e.engine.vocab,
        "sampler": e.engine.sampler, "work": e.engine.work, "graph": e.engine.graph,
        "engine": e.engine.fixed, "overhead": e.overhead, "total": e.total,
        "memory": gi_quantity(e.total), "kvBytesPerToken": e.kv_bytes_per_token,
        "fallback": e.fallback, "basis": e.basis, "parts": parts,
    });
    out.write_all(format!("{json:#}\n").as_bytes())
        .map_err(|e| e.to_string())
}

fn refusal(e: ReadError) -> String {
    format!("{e} ({})", e.reason())
}

/// The parts one by one, each with the line llama-server logs for it (at `-lv 4`) or what it
/// is when the engine logs nothing for it.
fn parts(e: &memory::Estimate) -> Vec<serde_json::Value> {
    let mib = |b: u64| format!("{:.2} MiB", b as f64 / f64::from(1 << 20));
    let logged = |line: &str, b: u64| Some(format!("{line} = {}", mib(b)));
    let repack_buffer = if e.repack_tier == memory::repack::Tier::Amx {
        "load_tensors: AMX model buffer size"
    } else {
        "load_tensors: CPU_REPACK model buffer size"
    };
    [
        (
            "weights",
            e.weights,
            None,
            "the tensors as the file holds them (mapped)",
        ),
        (
            "repack",
            e.repack,
            (e.repack > 0).then_some(repack_buffer),
            "weights copied into the CPU's interleaved layouts, besides their mapped pages",
        ),
        (
            "kv",
            e.kv,
            Some("llama_kv_cache: size"),
            "the KV cache of every slot",
        ),
        (
            "recurrent",
            e.recurrent,
            (e.recurrent > 0).then_some("llama_memory_recurrent: size"),
            "recurrent state of every slot",
        ),
        (
            "checkpoints",
            e.checkpoints,
            None,
            "context checkpoints: copies of each slot's recurrent state and of the sliding-window cells its window still sees, the server logs each as it makes it",
        ),
        (
            "compute",
            e.compute,
            Some("sched_reserve: CPU compute buffer size"),
            "the graph's activations for one micro-batch",
        ),
        (
            "output",
            e.engine.output,
            Some("llama_context: CPU  output buffer size"),
            "logits of one token per slot",
        ),
        (
            "vocab",
            e.engine.vocab,
            None,
            "token texts, the text-to-id map, the piece cache and merge ranks",
        ),
        (
            "sampler",
            e.engine.sampler,
            None,
            "each slot's candidate array over the vocabulary",
        ),
        (
            "work",
            e.engine.work,
            None,
            "the CPU matmul work buffer (activations in the weights' dot-product type)",
        ),
        (
            "graph",
            e.engine.graph,
            None,
            "graph and scheduler metadata",
        ),
        (
            "engine",
            e.engine.fixed,
            None,
            "binary, libraries, threads and HTTP server",
        ),
    ]
    .into_iter()
    .map(|(part, bytes, line, what)| {
        serde_json::json!({
            "part": part,
            "bytes": bytes,
            "mib": mib(bytes),
            "engineLogs": line.and_then(|l| logged(l, bytes)),
            "what": what,
        })
    })
    .collect()
}
