//! `modelserve estimate FILE...`: the Check stage's verdict and memory estimate for local GGUF
//! files (the shards of one model, first shard first), without a registry or a cluster; with
//! `--gpu`, where llama.cpp would put the model on those GPUs (`gpu`).

mod gpu;

use std::io::Write;

use crate::cli::Output;
use crate::gguf::inspect::{self, Verdict};
use crate::gguf::memory::repack::Tiers;
use crate::gguf::{self, FileSource, ReadError, memory, read_header};
use crate::pipeline::check;
use crate::units::{gi_quantity, human_bytes};

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
    /// The nodes' logical CPUs: llama-server starts a thread per CPU and about as many for
    /// HTTP, whatever the pod's CPU limit, and each takes memory.
    #[arg(long, default_value_t = memory::engine::DEFAULT_CPUS, value_parser = clap::value_parser!(u64).range(1..=memory::engine::MAX_CPUS))]
    pub node_cpus: u64,
    /// A GPU's free memory, one flag per GPU (--gpu 24GiB --gpu 24GiB), optionally named
    /// (--gpu A10=22.5GiB): units B, KiB, MiB, GiB, TiB, KB, MB, GB, TB (or Ki, Mi, Gi, Ti).
    #[arg(long = "gpu", value_name = "[NAME=]MEMORY", value_parser = gpu::parse_gpu)]
    pub gpus: Vec<gpu::Gpu>,
    /// Layers on the GPUs, the output layer counted (llama-server's -ngl): a number, all, or auto
    /// (default: as llama.cpp's --fit decides for the GPUs' free memory).
    #[arg(long, value_name = "N|all|auto", value_parser = gpu::parse_layers, allow_hyphen_values = true)]
    pub gpu_layers: Option<gpu::Layers>,
    /// One share of the layers per GPU, as llama-server's --tensor-split takes them: 3,1
    /// (default: by free memory for --gpu-layers N, or as --fit decides).
    #[arg(long, value_name = "SHARES", value_parser = gpu::parse_split, allow_hyphen_values = true)]
    pub tensor_split: Option<gpu::Split>,
    /// MiB kept free on each GPU for the CUDA runtime (llama.cpp's --fit-target) [default: 1024].
    #[arg(long, value_name = "MiB", value_parser = gpu::parse_fit_target, allow_hyphen_values = true)]
    pub fit_target: Option<u64>,
    /// Output format [default: json; text with --gpu].
    #[arg(long, short, value_enum)]
    pub output: Option<Output>,
}

/// Prints the estimate, as JSON unless asked for text; with GPUs, also the offload (under
/// `offload` in JSON). An error is one line naming the file or the flag, what is wrong and, for
/// a file, the condition reason the Check stage would give.
pub async fn run(args: Args, out: &mut impl Write) -> Result<(), String> {
    // The flags first: a wrong one is reported before any file is read.
    let request = gpu::Request::new(
        &args.gpus,
        args.gpu_layers,
        args.tensor_split.as_ref(),
        args.fit_target,
    )?;
    let output = args.output.unwrap_or(if args.gpus.is_empty() {
        Output::Json
    } else {
        Output::Text
    });
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
        cpus: args.node_cpus,
    };
    let Verdict {
        first_build,
        estimate: e,
    } = inspect::judge(&header, args.files.len() > 1, args.engine_build, &flags)
        .map_err(|e| format!("{e} ({})", e.reason()))?;
    let offload = if args.gpus.is_empty() && output == Output::Json {
        None
    } else {
        Some(gpu::offload(&header, &flags, &request)?)
    };
    if output == Output::Text {
        let arch = header.architecture().unwrap_or("unknown architecture");
        let head = format!(
            "{arch}, first build b{first_build}, {} slots of {} tokens: {} of RAM without a GPU\n",
            flags.parallel,
            args.context_size / flags.parallel,
            human_bytes(e.total)
        );
        let body = offload.map(|o| o.text()).unwrap_or_default();
        return out
            .write_all(format!("{head}{body}").as_bytes())
            .map_err(|e| e.to_string());
    }
    let parts = parts(&e);
    let mut json = serde_json::json!({
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
    if let Some(o) = offload {
        json["offload"] = o.json();
    }
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
            "token texts, the text-to-id map, the piece cache, merge ranks, and the loader's copy of the merges past what serving adds",
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
