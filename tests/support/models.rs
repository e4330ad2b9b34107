//! GGUF model files for tests: real headers with llama.cpp's key names and tensor layout, and
//! tensor data left out (the Check stage never reads it).
#![allow(dead_code)]

use modelserve::gguf::header::{Value, write};

/// Shape of a dense transformer.
#[derive(Clone, Debug)]
pub struct Dense {
    pub arch: &'static str,
    pub layers: u32,
    pub embd: u64,
    pub heads: u32,
    pub kv_heads: u32,
    pub ff: u64,
    pub vocab: u64,
    /// ggml type of the weight matrices (1 = F16, 8 = Q8_0, 12 = Q4_K).
    pub weight_type: u32,
    /// attention.key_length/value_length, when not embd / heads.
    pub head_dim: Option<u64>,
    /// More metadata, keys without the architecture prefix (`attention.sliding_window`).
    pub extra: Vec<(String, Value)>,
    /// Write `<arch>.vocab_size` instead of the token list (keeps big vocabularies cheap).
    pub vocab_size_only: bool,
    /// Metadata with full key names (`split.count`).
    pub raw: Vec<(String, Value)>,
}

impl Dense {
    pub fn tiny(arch: &'static str) -> Dense {
        Dense {
            arch,
            layers: 2,
            embd: 256,
            heads: 4,
            kv_heads: 2,
            ff: 512,
            vocab: 512,
            weight_type: 1,
            ..Dense::default()
        }
    }

    /// The header bytes.
    pub fn gguf(&self) -> Vec<u8> {
        let a = self.arch;
        let head = self.head_dim.unwrap_or(self.embd / u64::from(self.heads));
        let tokens: Vec<String> = if self.vocab_size_only {
            vec![]
        } else {
            (0..self.vocab).map(|i| format!("t{i}")).collect()
        };
        let token_refs: Vec<&str> = tokens.iter().map(String::as_str).collect();
        let mut keys: Vec<(String, Value)> = vec![
            ("general.architecture".into(), Value::String(a.into())),
            ("general.alignment".into(), Value::U32(32)),
            (format!("{a}.block_count"), Value::U32(self.layers)),
            (format!("{a}.context_length"), Value::U32(32768)),
            (format!("{a}.embedding_length"), Value::U64(self.embd)),
            (format!("{a}.feed_forward_length"), Value::U64(self.ff)),
            (format!("{a}.attention.head_count"), Value::U32(self.heads)),
            (
                format!("{a}.attention.head_count_kv"),
                Value::U32(self.kv_heads),
            ),
            ("tokenizer.ggml.model".into(), Value::String("gpt2".into())),
            (
                "tokenizer.ggml.pre".into(),
                Value::String("llama-bpe".into()),
            ),
        ];
        if self.vocab_size_only {
            keys.push((format!("{a}.vocab_size"), Value::U64(self.vocab)));
        } else {
            keys.push(("tokenizer.ggml.tokens".into(), write::strings(&token_refs)));
        }
        if self.head_dim.is_some() {
            keys.push((format!("{a}.attention.key_length"), Value::U64(head)));
            keys.push((format!("{a}.attention.value_length"), Value::U64(head)));
        }
        keys.extend(
            self.extra
                .iter()
                .map(|(k, v)| (format!("{a}.{k}"), v.clone())),
        );
        keys.extend(self.raw.iter().cloned());
        let kv: Vec<(&str, Value)> = keys.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
        let kv_dim = head * u64::from(self.kv_heads);
        let q_dim = head * u64::from(self.heads);
        let mut shapes: Vec<(String, Vec<u64>, u32)> = vec![(
            "token_embd.weight".into(),
            vec![self.embd, self.vocab],
            self.weight_type,
        )];
        for l in 0..self.layers {
            for (n, d) in [
                ("attn_q", vec![self.embd, q_dim]),
                ("attn_k", vec![self.embd, kv_dim]),
                ("attn_v", vec![self.embd, kv_dim]),
                ("attn_output", vec![q_dim, self.embd]),
                ("ffn_gate", vec![self.embd, self.ff]),
                ("ffn_up", vec![self.embd, self.ff]),
                ("ffn_down", vec![self.ff, self.embd]),
            ] {
                shapes.push((format!("blk.{l}.{n}.weight"), d, self.weight_type));
            }
            shapes.push((format!("blk.{l}.attn_norm.weight"), vec![self.embd], 0));
            shapes.push((format!("blk.{l}.ffn_norm.weight"), vec![self.embd], 0));
        }
        shapes.push(("output_norm.weight".into(), vec![self.embd], 0));
        shapes.push((
            "output.weight".into(),
            vec![self.embd, self.vocab],
            self.weight_type,
        ));
        let tensors: Vec<(&str, &[u64], u32)> = shapes
            .iter()
            .map(|(n, d, t)| (n.as_str(), d.as_slice(), *t))
            .collect();
        write::header(&kv, &tensors)
    }
}

impl Default for Dense {
    fn default() -> Self {
        Dense {
            arch: "llama",
            layers: 2,
            embd: 256,
            heads: 4,
            kv_heads: 2,
            ff: 512,
            vocab: 512,
            weight_type: 1,
            head_dim: None,
            extra: vec![],
            vocab_size_only: false,
            raw: vec![],
        }
    }
}

/// The ggml type most of a quant's weights use, from the file name.
fn weight_type_of(path: &str) -> u32 {
    let p = path.to_ascii_uppercase();
    let table = [
        ("IQ1_M", 29),
        ("IQ1_S", 19),
        ("IQ2_XXS", 16),
        ("IQ2_M", 22),
        ("IQ3_XXS", 18),
        ("IQ3_M", 21),
        ("IQ4_XS", 23),
        ("IQ4_NL", 20),
        ("Q2_K", 10),
        ("Q3_K", 11),
        ("Q4_K", 12),
        ("Q5_K", 13),
        ("Q6_K", 14),
        ("Q8_K", 8),
        ("Q4_0", 2),
        ("Q4_1", 3),
        ("Q5_0", 6),
        ("Q8_0", 8),
        ("BF16", 30),
        ("FP16", 1),
        ("F16", 1),
    ];
    table
        .iter()
        .find(|(k, _)| p.contains(k))
        .map_or(8, |(_, t)| *t)
}

/// A GGUF header for a file of a real listing (tests/fixtures/hf-listings.json), with the
/// architecture and shapes the model's publisher documents; tensor data is not served.
/// Shards after the first carry only their split keys, as llama-gguf-split writes them.
pub fn listing_header(repo: &str, path: &str) -> Option<Vec<u8>> {
    if !path.to_ascii_lowercase().ends_with(".gguf") {
        return None;
    }
    let kv = |k: &str, v: u32| (k.to_string(), Value::U32(v));
    let mut m = match repo {
        "ggml-org/gemma-3-1b-it-GGUF" => Dense {
            arch: "gemma3",
            layers: 26,
            embd: 1152,
            heads: 4,
            kv_heads: 1,
            ff: 6912,
            vocab: 262_144,
            head_dim: Some(256),
            extra: vec![kv("attention.sliding_window", 512)],
            ..Dense::default()
        },
        "Qwen/Qwen2.5-7B-Instruct-GGUF" => Dense {
            arch: "qwen2",
            layers: 28,
            embd: 3584,
            heads: 28,
            kv_heads: 4,
            ff: 18944,
            vocab: 152_064,
            ..Dense::default()
        },
        "unsloth/Qwen3-32B-GGUF" => Dense {
            arch: "qwen3",
            layers: 64,
            embd: 5120,
            heads: 64,
            kv_heads: 8,
            ff: 25600,
            vocab: 151_936,
            head_dim: Some(128),
            ..Dense::default()
        },
        "bartowski/Llama-3.2-1B-Instruct-GGUF" => Dense {
            arch: "llama",
            layers: 16,
            embd: 2048,
            heads: 32,
            kv_heads: 8,
            ff: 8192,
            vocab: 128_256,
            ..Dense::default()
        },
        "unsloth/Qwen3-0.6B-GGUF" => Dense {
            arch: "qwen3",
            layers: 28,
            embd: 1024,
            heads: 16,
            kv_heads: 8,
            ff: 3072,
            vocab: 151_936,
            head_dim: Some(128),
            ..Dense::default()
        },
        "second-state/All-MiniLM-L6-v2-Embedding-GGUF" => Dense {
            arch: "bert",
            layers: 6,
            embd: 384,
            heads: 12,
            kv_heads: 12,
            ff: 1536,
            vocab: 30_522,
            ..Dense::default()
        },
        _ => return None,
    };
    m.vocab_size_only = true;
    m.weight_type = weight_type_of(path);
    let lower = path.to_ascii_lowercase();
    let shard = lower
        .strip_suffix(".gguf")
        .and_then(|s| s.get(s.len().checked_sub(15)?..))
        .filter(|t| t.starts_with('-') && t[6..10] == *"-of-");
    match shard {
        None => Some(m.gguf()),
        Some(t) => {
            let (no, count): (u16, u16) = (t[1..6].parse().ok()?, t[10..].parse().ok()?);
            let split = [
                ("split.no", Value::U16(no - 1)),
                ("split.count", Value::U16(count)),
            ];
            if no == 1 {
                m.raw
                    .extend(split.iter().map(|(k, v)| (k.to_string(), v.clone())));
                Some(m.gguf())
            } else {
                let kv: Vec<(&str, Value)> = split.to_vec();
                Some(write::header(&kv, &[]))
            }
        }
    }
}

/// A tiny llama that the real llama-server loads, written by testbed/gen_gguf.py.
pub fn tiny_llama_gguf() -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let files = gen_gguf(dir.path(), &["--arch", "llama"]);
    let [file] = &files[..] else {
        panic!("gen_gguf.py --arch llama wrote one model, not {files:?}")
    };
    std::fs::read(file).unwrap()
}

fn run(cmd: &mut std::process::Command, what: &str) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The memory benchmark's rows the tests serve (tests/quantized_memory.rs on the CPU,
/// tests/offload_engine.rs over devices): one model per quantization family, with real
/// vocabularies up to the largest the families use. (family, vocabulary of the sdist, size,
/// type).
pub const QUANTIZED: [(&str, &str, &str, &str); 7] = [
    // F16, a 32k SPM vocabulary, a width (896) no k-quant divides.
    ("phi3", "phi-3", "bench", "F16"),
    // Legacy 8-bit over a 151k vocabulary and 16 experts.
    ("qwen3moe", "qwen2", "bench", "Q8_0"),
    // The k-quant mix (Q4_K, Q6_K, fallbacks) with latent attention and a 128k vocabulary.
    ("deepseek2", "llama-bpe", "bench", "Q4_K_M"),
    // Legacy 4-bit, repacked for AVX2, in a hybrid of attention and Mamba-2 layers.
    ("granitehybrid", "llama-bpe", "bench", "Q4_0"),
    // An i-quant in a recurrent model.
    ("mamba2", "gpt-neox", "bench", "IQ4_XS"),
    // The largest vocabulary (262k, tied) in a model of 1.17 GiB with sliding-window layers of
    // 1024 tokens: every slot ends with two full context checkpoints.
    ("gemma3", "gemma-4", "bench", "Q4_K_M"),
    // The largest vocabulary (262k, tied) on a 64-wide body: its tables and samplers are nearly
    // all of it. The peak RSS is nearly the same at 1 and 4 slots (164.1 and 166.4 MiB): at 1
    // it is reached while loading, with the loader's GGUF copy of the merges (freed once the
    // model is loaded), at 4 with every slot's sampler and request: 1.06x and 1.08x on the CPU
    // (1.13x and 1.21x when the estimate added the copy to the samplers and requests).
    ("gemma3", "gemma-4", "tiny", "Q4_K_M"),
];

/// The models testbed/gpu-check.sh runs on a real GPU, as testbed/gpu-check.models lists them
/// (testbed/gpu-sources.sh writes the same bytes from the same list); tests/offload_engine.rs
/// serves the hybrid one over an rpc-server device: (family, vocabulary, size, type) as in
/// `QUANTIZED`, each line's four words.
pub fn gpu_check() -> Vec<(&'static str, &'static str, &'static str, &'static str)> {
    include_str!("../../testbed/gpu-check.models")
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| match l.split_whitespace().collect::<Vec<_>>()[..] {
            [family, vocab, size, quant] => (family, vocab, size, quant),
            _ => panic!("testbed/gpu-check.models: '{l}' is not 'family vocabulary size type'"),
        })
        .collect()
}

/// A model of `family` and `size` with the real tokenizer of the sdist's `vocab`, written by
/// testbed/gen_gguf.py in F16 into `dir`: its path.
pub fn generated(
    dir: &std::path::Path,
    family: &str,
    vocab: &str,
    size: &str,
) -> std::path::PathBuf {
    let args = ["--arch", family, "--size", size, "--vocab", vocab];
    gen_gguf(dir, &args)
        .pop()
        .expect("gen_gguf.py prints the file")
}

/// The files testbed/gen_gguf.py writes into `dir` with `args`, as it prints them (random
/// weights; needs numpy and pyyaml, which scripts/test installs).
pub fn gen_gguf(dir: &std::path::Path, args: &[&str]) -> Vec<std::path::PathBuf> {
    let printed = run(
        std::process::Command::new("python3")
            .arg(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("testbed/gen_gguf.py"))
            .arg(dir)
            .args(args),
        &format!("gen_gguf.py {args:?} (scripts/test installs numpy and pyyaml)"),
    );
    printed
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(std::path::PathBuf::from))
        .collect()
}

/// A real model of the memory benchmark: written by testbed/gen_gguf.py in F16 into `dir`, then
/// quantized to `quant` by llama-quantize (F16: left as written).
pub fn quantized(
    dir: &std::path::Path,
    quantize: &std::path::Path,
    (family, vocab, size, quant): (&str, &str, &str, &str),
) -> std::path::PathBuf {
    use std::process::Command;
    let f16 = generated(dir, family, vocab, size);
    if quant == "F16" {
        return f16;
    }
    let out = dir.join(format!("{family}-{size}-{vocab}-{quant}.gguf"));
    run(
        Command::new(quantize).arg(&f16).arg(&out).arg(quant),
        "llama-quantize",
    );
    std::fs::remove_file(&f16).unwrap();
    out
}
