//! Rows of the memory benchmark (testbed/bench_memory.py) kept as assertions: real quantized
//! models, one per quantization family (F16, the legacy Q8_0 and Q4_0, a k-quant mix, an
//! i-quant), with real vocabularies up to the largest the families use (262k). Each is served
//! by the real llama-server with the Catalog stage's flags, every slot busy at once with a
//! prompt that fills its context. The estimate must be at least the engine's peak RSS and at
//! most 1.10 times it, and the KV cache and recurrent state must equal the engine's own figures.

mod support;

use std::path::Path;

use modelserve::gguf::memory::{CTX_CHECKPOINTS, Estimate, Flags, estimate_checked};
use modelserve::gguf::{FileSource, read_header};
use support::engine::{Server, fill_every_slot, logged};
use support::models::{QUANTIZED, generated, quantized};
use support::rpc::peak_rss;
use support::{testbed_script, testbed_script_with};

const UBATCH: u64 = 512;
const MIB: f64 = (1u64 << 20) as f64;
/// The goal: at most this many times the peak RSS.
const OVER: f64 = 1.10;

/// llama-server with the pods' flags (src/pipeline/catalog/args.rs).
fn start(server: &Path, model: &Path, ctx: u64, parallel: u64) -> Server {
    let args = [
        "--ctx-size".to_string(),
        ctx.to_string(),
        "--parallel".into(),
        parallel.to_string(),
        "--ubatch-size".into(),
        UBATCH.to_string(),
        "--ctx-checkpoints".into(),
        CTX_CHECKPOINTS.to_string(),
        "--metrics".into(),
        "--cache-ram".into(),
        "0".into(),
        "--no-webui".into(),
    ];
    Server::start(server, model, &args)
}

async fn estimate(model: &Path, ctx: u64, parallel: u64) -> Estimate {
    let header = read_header(
        &mut FileSource {
            path: model.to_path_buf(),
        },
        "m",
    )
    .await
    .unwrap()
    .header;
    estimate_checked(
        &header,
        &Flags {
            ctx_size: ctx,
            parallel,
            ubatch: UBATCH,
            build: 10587,
            cpu: "avx2".parse().unwrap(),
            cpus: support::cpus(),
        },
    )
    .unwrap()
}

/// `model` served with the pods' flags at `ctx` x `parallel`, every slot's context filled: the
/// server and its peak RSS, the most a replica's slots can touch.
async fn served_full(
    server: &Path,
    model: &Path,
    ctx: u64,
    parallel: u64,
    http: &reqwest::Client,
) -> (Server, u64) {
    let mut s = start(server, model, ctx, parallel);
    s.ready(http).await;
    fill_every_slot(&s, http, ctx, parallel).await;
    let peak = peak_rss(s.child.id());
    (s, peak)
}

#[tokio::test]
async fn the_estimate_covers_the_peak_of_real_quantized_models_within_the_goals() {
    let server = testbed_script("build-llama-server.sh");
    let quantize = testbed_script_with("build-llama-tool.sh", &["llama-quantize"]);
    let dir = tempfile::tempdir().unwrap();
    let http = reqwest::Client::new();
    let mut failures = Vec::new();
    for (family, vocab, size, quant) in QUANTIZED {
        let path = quantized(dir.path(), &quantize, (family, vocab, size, quant));
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        for (ctx, parallel) in [(4096, 1), (16384, 4)] {
            let e = estimate(&path, ctx, parallel).await;
            let (s, peak) = served_full(&server, &path, ctx, parallel, &http).await;
            let log = s.log_text();
            let ratio = e.total as f64 / peak as f64;
            println!(
                "{name} {ctx}x{parallel}: estimate {:.1} MiB, peak RSS {:.1} MiB, ratio {ratio:.3}",
                e.total as f64 / MIB,
                peak as f64 / MIB
            );
            if !(1.0..=OVER).contains(&ratio) {
                failures.push(format!("{name} {ctx}x{parallel}: ratio {ratio:.3}"));
            }
            // The engine prints MiB with two decimals.
            let kv = (
                format!("{:.2}", e.kv as f64 / MIB),
                format!("{:.2}", logged(&log, "llama_kv_cache: size =")),
            );
            let state = (
                format!("{:.2}", e.recurrent as f64 / MIB),
                format!("{:.2}", logged(&log, "llama_memory_recurrent: size =")),
            );
            if kv.0 != kv.1 || state.0 != state.1 {
                failures.push(format!(
                    "{name} {ctx}x{parallel}: KV {kv:?}, recurrent state {state:?}"
                ));
            }
        }
        std::fs::remove_file(&path).unwrap();
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// testbed/bench_memory.py is Python and cannot import the crate's constants: it copies them,
/// and this keeps the copies true.
#[test]
fn the_memory_benchmark_serves_with_the_flags_the_pods_get() {
    let script = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("testbed/bench_memory.py"),
    )
    .unwrap();
    let constant = |name: &str| -> u64 {
        script
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name} = ")))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or_else(|| panic!("bench_memory.py has no {name} = <number>"))
    };
    assert_eq!(constant("UBATCH"), modelserve::pipeline::check::UBATCH);
    assert_eq!(constant("CTX_CHECKPOINTS"), CTX_CHECKPOINTS);
    assert_eq!(UBATCH, modelserve::pipeline::check::UBATCH);
}

/// The sdist's vocabularies the tiny model body takes (testbed/gen_gguf.py --vocab): SPM,
/// WordPiece, UGM and BPE, 30k to 262k tokens, 0 to 515k merges.
const VOCABULARIES: [&str; 19] = [
    "aquila",
    "baichuan",
    "bert-bge",
    "command-r",
    "deepseek-coder",
    "deepseek-llm",
    "falcon",
    "gemma-4",
    "gpt-2",
    "gpt-neox",
    "llama-bpe",
    "llama-spm",
    "mpt",
    "nomic-bert-moe",
    "phi-3",
    "qwen2",
    "qwen35",
    "refact",
    "starcoder",
];

/// The most estimate / peak RSS for the tiny body: the engine's own memory (counted at its
/// most, 27 MiB, and 18-24 MiB on a quiet machine) is most of what the smaller vocabularies
/// leave.
const OVER_VOCABULARY: f64 = 1.35;

/// The vocabulary's tables, the loader's copy of the merges and the samplers, fitted on a few
/// of these vocabularies, cover the engine's peak on every one of them: from the load (where the
/// loader's copy peaks) through every slot's context full (where serving does), on a body so
/// small that the vocabulary is most of the engine's memory.
#[tokio::test]
async fn the_estimate_covers_the_peak_over_every_vocabulary_of_the_sdist() {
    let server = testbed_script("build-llama-server.sh");
    let dir = tempfile::tempdir().unwrap();
    let http = reqwest::Client::new();
    let mut failures = Vec::new();
    for vocab in VOCABULARIES {
        let path = generated(dir.path(), "llama", vocab, "tiny");
        for (ctx, parallel) in [(4096, 1), (8192, 4)] {
            let e = estimate(&path, ctx, parallel).await;
            let (_s, peak) = served_full(&server, &path, ctx, parallel, &http).await;
            let ratio = e.total as f64 / peak as f64;
            println!(
                "{vocab:<15} {ctx}x{parallel}: vocabulary {:.1} MiB, estimate {:.1} MiB, peak RSS {:.1} MiB, ratio {ratio:.3}",
                e.engine.vocab as f64 / MIB,
                e.total as f64 / MIB,
                peak as f64 / MIB
            );
            if !(1.0..=OVER_VOCABULARY).contains(&ratio) {
                failures.push(format!("{vocab} {ctx}x{parallel}: ratio {ratio:.3}"));
            }
        }
        std::fs::remove_file(&path).unwrap();
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
