//! The memory a llama-server replica needs, from the GGUF header alone: weights from the tensor
//! infos, KV cache per layer (GQA widths, per-layer head counts, sliding-window layers, MLA),
//! recurrent state of recurrent and hybrid models, compute and output buffers, engine overhead.
//! Formulas follow llama.cpp b6975+ (context padded to 256 cells, one stream per slot).

use super::header::{Header, Value};
use super::support::ggml_type;
use crate::units::human_bytes;

const KV_ELEMENT_BYTES: u64 = 2; // f16, llama-server's default cache type
const STATE_ELEMENT_BYTES: u64 = 4; // recurrent state is always f32
const PAD: u64 = 256;
/// Resident memory of the llama-server process before the model: binary, libraries, threads.
const ENGINE_OVERHEAD: u64 = 32 << 20;
/// llama-server reserves logits for its slots only from this build on (before: for a whole ubatch).
const OUTPUTS_PER_SLOT_FROM: u32 = 9460;
/// MLA caches keep no V from this build on.
const MLA_NO_V_FROM: u32 = 7832;

/// The server settings the estimate is for (the Catalog stage passes the same to llama-server).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Flags {
    /// --ctx-size: tokens of context shared by the slots.
    pub ctx_size: u64,
    /// --parallel: slots (contextSize / contextLength).
    pub parallel: u64,
    /// --ubatch-size.
    pub ubatch: u64,
    /// The llama.cpp build the nodes run.
    pub build: u32,
}

/// The estimate and what it counted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Estimate {
    pub weights: u64,
    pub kv: u64,
    pub recurrent: u64,
    pub compute: u64,
    pub overhead: u64,
    pub total: u64,
    /// KV bytes one more token of context costs (full-attention layers).
    pub kv_bytes_per_token: u64,
    /// True when the header lacked a shape and a rough rule stood in.
    pub fallback: bool,
    /// What was counted, as a sentence.
    pub basis: String,
}

struct Hp<'a> {
    h: &'a Header,
    arch: &'a str,
}

impl Hp<'_> {
    fn key(&self, k: &str) -> Option<&Value> {
        self.h.get(&format!("{}.{k}", self.arch))
    }
    fn u(&self, k: &str) -> Option<u64> {
        self.key(k).and_then(Value::as_u64)
    }
    /// A scalar or per-layer array value for layer `il`.
    fn per_layer(&self, k: &str, il: u64) -> Option<u64> {
        match self.key(k)? {
            Value::Array {
                items: Some(items), ..
            } => items.get(il as usize).and_then(Value::as_u64),
            v => v.as_u64(),
        }
    }
}

fn pad(n: u64) -> u64 {
    n.div_ceil(PAD) * PAD
}

/// Archs whose every layer is recurrent.
const RECURRENT: [&str; 6] = ["mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"];
/// Hybrids whose recurrent layers are those with head_count_kv 0.
const HYBRID_BY_KV0: [&str; 8] = [
    "jamba",
    "granitehybrid",
    "lfm2",
    "lfm2moe",
    "plamo2",
    "kimi-linear",
    "bailingmoe3",
    "kimi-k3",
];
/// Hybrids whose attention layers are every full_attention_interval-th.
const HYBRID_BY_INTERVAL: [&str; 4] = ["qwen3next", "qwen35", "qwen35moe", "minimax-01"];
/// Architectures without a KV cache (embedding and diffusion models).
const NO_KV: [&str; 14] = [
    "bert",
    "jina-bert-v2",
    "jina-bert-v3",
    "nomic-bert",
    "nomic-bert-moe",
    "neo-bert",
    "eurobert",
    "modern-bert",
    "gemma-embedding",
    "wavtokenizer-dec",
    "dream",
    "llada",
    "llada-moe",
    "rnd1",
];

/// Default sliding-window size and pattern period by architecture, when the header has none.
fn swa_defaults(arch: &str) -> Option<(u64, u64)> {
    Some(match arch {
        "gemma2" => (4096, 2),
        "gemma3" => (0, 6),
        "cohere2" => (0, 4),
        "llama4" => (8192, 4),
        "gpt-oss" => (0, 2),
        "exaone4" => (4096, 4),
        "exaone-moe" => (128, 4),
        "olmo2" | "afmoe" => (0, 4),
        "plamo3" => (0, 8),
        _ => return None,
    })
}

/// Estimates the memory of one replica.
pub fn estimate(h: &Header, f: &Flags) -> Estimate {
    let weights: u64 = h
        .tensors
        .iter()
        .map(|t| ggml_type(t.ggml_type).map_or(0, |ty| ty.bytes(t.elements())))
        .sum();
    let unknown_types = h.tensors.iter().any(|t| ggml_type(t.ggml_type).is_none());
    let arch = h.architecture().unwrap_or_default();
    let hp = Hp { h, arch };
    let parallel = f.parallel.max(1);
    let n_ctx = pad(f.ctx_size.max(1));
    let n_ctx_seq = pad(n_ctx / parallel);
    let vocab = hp
        .u("vocab_size")
        .or_else(|| h.get("tokenizer.ggml.tokens").and_then(Value::array_len))
        .unwrap_or(0);
    let n_out = if f.build >= OUTPUTS_PER_SLOT_FROM {
        parallel
    } else {
        f.ubatch
    };

    let (Some(n_layer), Some(n_embd)) = (hp.u("block_count"), hp.u("embedding_length")) else {
        return fallback(weights, arch);
    };
    let n_head0 = hp.per_layer("attention.head_count", 0).unwrap_or(0);
    let head_k = hp
        .u("attention.key_length")
        .or_else(|| n_embd.checked_div(n_head0))
        .unwrap_or(0);
    let head_v = hp.u("attention.value_length").unwrap_or(head_k);
    let head_k_swa = hp.u("attention.key_length_swa").unwrap_or(head_k);
    let head_v_swa = hp.u("attention.value_length_swa").unwrap_or(head_v);
    let mla = hp.key("attention.key_length_mla").is_some();
    let (default_swa, default_period) = swa_defaults(arch).unwrap_or((0, 0));
    let n_swa = hp.u("attention.sliding_window").unwrap_or(default_swa);
    let pattern = hp.key("attention.sliding_window_pattern");
    let interval = hp.u("full_attention_interval").unwrap_or(4).max(1);
    let recurrent_layers = hp.key("attention.recurrent_layers").and_then(Value::items);

    let is_swa = |il: u64| -> bool {
        if n_swa == 0 {
            return false;
        }
        match pattern {
            Some(Value::Array {
                items: Some(items), ..
            }) => items.get(il as usize).and_then(Value::as_u64) == Some(1),
            Some(v) => v
                .as_u64()
                .filter(|p| *p > 0)
                .is_some_and(|p| il % p < p - 1),
            None if arch == "lfm2" || arch == "lfm2moe" => true,
            None => default_period > 0 && il % default_period < default_period - 1,
        }
    };
    let is_recurrent = |il: u64| -> bool {
        if RECURRENT.contains(&arch) || arch == "falcon-h1" {
            return true;
        }
        if let Some(flags) = recurrent_layers {
            return flags.get(il as usize).and_then(Value::as_u64) == Some(1);
        }
        let kv0 = hp.per_layer("attention.head_count_kv", il) == Some(0);
        match arch {
            a if HYBRID_BY_KV0.contains(&a) => kv0,
            "nemotron_h" | "nemotron_h_moe" => {
                kv0 && hp.per_layer("feed_forward_length", il) == Some(0)
            }
            a if HYBRID_BY_INTERVAL.contains(&a) => !(il + 1).is_multiple_of(interval),
            _ => false,
        }
    };
    let has_kv = |il: u64| -> bool {
        if NO_KV.contains(&arch) || RECURRENT.contains(&arch) {
            return false;
        }
        let hybrid_attention = arch == "falcon-h1" || !is_recurrent(il);
        hybrid_attention
            && hp
                .per_layer("attention.head_count_kv", il)
                .or(hp.per_layer("attention.head_count", il))
                .unwrap_or(0)
                > 0
    };

    let swa_cells = pad(n_ctx_seq.min(n_swa + f.ubatch)) * parallel;
    let full_cells = n_ctx_seq * parallel;
    let (mut kv, mut per_token, mut swa_layers, mut full_layers) = (0u64, 0u64, 0u64, 0u64);
    for il in 0..n_layer {
        if !has_kv(il) {
            continue;
        }
        let heads_kv = hp
            .per_layer("attention.head_count_kv", il)
            .or(hp.per_layer("attention.head_count", il))
            .unwrap_or(0);
        let swa = is_swa(il);
        let (hk, hv) = if swa {
            (head_k_swa, head_v_swa)
        } else {
            (head_k, head_v)
        };
        let v_width = if mla && f.build >= MLA_NO_V_FROM {
            0
        } else {
            hv * heads_kv
        };
        let row = (hk * heads_kv + v_width) * KV_ELEMENT_BYTES;
        if swa {
            kv += row * swa_cells;
            swa_layers += 1;
        } else {
            kv += row * full_cells;
            per_token += row;
            full_layers += 1;
        }
    }

    let mut state_per_seq = 0u64;
    let mut recurrent_count = 0u64;
    for il in 0..n_layer {
        if !is_recurrent(il) {
            continue;
        }
        recurrent_count += 1;
        state_per_seq += recurrent_state(&hp, n_embd) * STATE_ELEMENT_BYTES;
    }
    let recurrent = state_per_seq * parallel;

    let n_ff = (0..n_layer)
        .filter_map(|il| hp.per_layer("feed_forward_length", il))
        .max()
        .unwrap_or(4 * n_embd);
    let n_ff_moe =
        hp.u("expert_feed_forward_length").unwrap_or(0) * hp.u("expert_used_count").unwrap_or(0);
    let logits = vocab * n_out * 4;
    // The graph allocator's peak for one ubatch: the FFN phase keeps the residual, the normed
    // input and gate/up/product rows alive (fitted on llama-server's own compute-buffer figures);
    // recurrent layers keep their projected inputs and scan output instead.
    // MoE layers keep the chosen experts' rows plus the router's logits and probabilities; an
    // all-MoE model (no leading dense layers) has no dense FFN phase at all.
    let experts = hp.u("expert_count").unwrap_or(0);
    let dense_phase = 4 * n_embd + 3 * n_ff;
    let ffn_phase = if experts > 0 {
        let shared = hp.u("expert_shared_count").unwrap_or(0)
            * hp.u("expert_feed_forward_length").unwrap_or(0);
        let moe_phase = 4 * n_embd + 3 * (n_ff_moe + shared) + 2 * experts;
        let dense_layers = hp.u("leading_dense_block_count").unwrap_or(0);
        if dense_layers > 0 {
            moe_phase.max(dense_phase)
        } else {
            moe_phase
        }
    } else {
        dense_phase
    };
    let d_inner = hp.u("ssm.inner_size").unwrap_or(0);
    let ssm_phase = if recurrent_count > 0 {
        4 * n_embd
            + 5 * d_inner
            + 2 * hp.u("ssm.group_count").unwrap_or(0) * hp.u("ssm.state_size").unwrap_or(0)
            + hp.u("ssm.time_step_rank").unwrap_or(0)
    } else {
        0
    };
    let activations = f.ubatch * 4 * ffn_phase.max(ssm_phase);
    // The attention masks are f16, one row per cell of one stream, per cache (full and window).
    let masks = f.ubatch
        * 2
        * (if full_layers > 0 { n_ctx_seq } else { 0 }
            + if swa_layers > 0 {
                swa_cells / parallel
            } else {
                0
            });
    let compute = logits + activations + masks;
    let overhead = ENGINE_OVERHEAD + vocab * parallel * 4;
    let total = (weights + kv + recurrent + compute + overhead).div_ceil(1 << 20) << 20;

    let mut basis = format!(
        "weights {} + KV {} for {} tokens in {} slot(s)",
        human_bytes(weights),
        human_bytes(kv),
        n_ctx,
        parallel
    );
    if swa_layers > 0 {
        basis += &format!(
            " ({full_layers} full-attention layers, {swa_layers} sliding-window layers of {n_swa} tokens)"
        );
    }
    if mla {
        basis += " (MLA cache)";
    }
    if recurrent_count > 0 {
        basis += &format!(
            " + recurrent state {} ({recurrent_count} layers)",
            human_bytes(recurrent)
        );
    }
    basis += &format!(
        " + compute {} + engine {}",
        human_bytes(compute),
        human_bytes(overhead)
    );
    if unknown_types {
        basis += "; tensors of unknown types counted as 0 bytes";
    }
    Estimate {
        weights,
        kv,
        recurrent,
        compute,
        overhead,
        total,
        kv_bytes_per_token: per_token,
        fallback: false,
        basis,
    }
}

/// f32 elements of one recurrent layer's state for one sequence (R + S).
fn recurrent_state(hp: &Hp<'_>, n_embd: u64) -> u64 {
    match hp.arch {
        "rwkv6" | "rwkv6qwen2" | "rwkv7" | "arwkv7" => {
            hp.u("token_shift_count").unwrap_or(2) * n_embd
                + n_embd * hp.u("wkv.head_size").unwrap_or(0)
        }
        "lfm2" | "lfm2moe" => n_embd * hp.u("shortconv.l_cache").unwrap_or(1).saturating_sub(1),
        "kimi-linear" | "kimi-k3" | "bailingmoe3" => {
            let (d_conv, n_head, dim) = (
                hp.u("ssm.conv_kernel").unwrap_or(0),
                hp.u("attention.head_count").unwrap_or(0),
                hp.u("kda.head_dim").unwrap_or(0),
            );
            3 * d_conv.saturating_sub(1) * n_head * dim + dim * dim * n_head
        }
        _ => {
            let (d_conv, d_inner, d_state, n_group) = (
                hp.u("ssm.conv_kernel").unwrap_or(0),
                hp.u("ssm.inner_size").unwrap_or(0),
                hp.u("ssm.state_size").unwrap_or(0),
                hp.u("ssm.group_count").unwrap_or(0),
            );
            d_conv.saturating_sub(1) * (d_inner + 2 * n_group * d_state) + d_state * d_inner
        }
    }
}

fn fallback(weights: u64, arch: &str) -> Estimate {
    let compute = 512 << 20;
    let margin = weights / 10;
    let total = (weights + margin + compute + ENGINE_OVERHEAD).div_ceil(1 << 20) << 20;
    Estimate {
        weights,
        kv: 0,
        recurrent: 0,
        compute: compute + margin,
        overhead: ENGINE_OVERHEAD,
        total,
        kv_bytes_per_token: 0,
        fallback: true,
        basis: format!(
            "FALLBACK: the header lacks {arch}.block_count or {arch}.embedding_length, so the KV cache cannot be computed; estimate = weights {} + 10% + 512 MiB + engine {}",
            human_bytes(weights),
            human_bytes(ENGINE_OVERHEAD)
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::super::header::{parse, write};
    use super::*;

    fn flags(ctx: u64, parallel: u64) -> Flags {
        Flags {
            ctx_size: ctx,
            parallel,
            ubatch: 512,
            build: 10000,
        }
    }

    fn header(arch: &str, kv: &[(&str, Value)]) -> Header {
        let mut all = vec![("general.architecture", Value::String(arch.into()))];
        let keys: Vec<(String, Value)> = kv
            .iter()
            .map(|(k, v)| (format!("{arch}.{k}"), v.clone()))
            .collect();
        all.extend(keys.iter().map(|(k, v)| (k.as_str(), v.clone())));
        parse(
            &write::header(&all, &[("token_embd.weight", &[4096, 1000], 1)]),
            true,
        )
        .unwrap()
    }

    #[test]
    fn llama_31_8b_kv_is_128_kib_per_token() {
        let h = header(
            "llama",
            &[
                ("block_count", Value::U32(32)),
                ("embedding_length", Value::U32(4096)),
                ("attention.head_count", Value::U32(32)),
                ("attention.head_count_kv", Value::U32(8)),
            ],
        );
        let e = estimate(&h, &flags(8192, 1));
        assert_eq!(e.kv_bytes_per_token, 128 << 10);
        assert_eq!(e.kv, 1 << 30, "8192 tokens -> 1024 MiB");
        assert_eq!(e.weights, 4096 * 1000 * 2);
        assert!(!e.fallback);
        assert!(
            e.basis
                .starts_with("weights 7.8 MiB + KV 1.0 GiB for 8192 tokens in 1 slot(s)"),
            "{}",
            e.basis
        );
    }

    #[test]
    fn gemma3_27b_sliding_window_layers_keep_only_the_window() {
        let h = header(
            "gemma3",
            &[
                ("block_count", Value::U32(62)),
                ("embedding_length", Value::U32(5376)),
                ("attention.head_count", Value::U32(32)),
                ("attention.head_count_kv", Value::U32(16)),
                ("attention.key_length", Value::U32(128)),
                ("attention.value_length", Value::U32(128)),
                ("attention.sliding_window", Value::U32(1024)),
            ],
        );
        let e = estimate(&h, &flags(32768, 1));
        // 10 global layers x 32768 cells + 52 SWA layers x 1536 cells, 8 KiB per layer per token.
        assert_eq!(e.kv, (10 * 32768 + 52 * 1536) * 8192);
        assert_eq!(e.kv >> 20, 3184);
    }

    #[test]
    fn deepseek_mla_caches_576_k_elements_and_no_v() {
        let h = header(
            "deepseek2",
            &[
                ("block_count", Value::U32(61)),
                ("embedding_length", Value::U32(7168)),
                ("attention.head_count", Value::U32(128)),
                ("attention.head_count_kv", Value::U32(1)),
                ("attention.key_length", Value::U32(576)),
                ("attention.value_length", Value::U32(512)),
                ("attention.key_length_mla", Value::U32(192)),
                ("attention.value_length_mla", Value::U32(128)),
            ],
        );
        assert_eq!(
            estimate(&h, &flags(32768, 1)).kv_bytes_per_token,
            61 * 576 * 2
        );
        let old = Flags {
            build: 7000,
            ..flags(32768, 1)
        };
        assert_eq!(estimate(&h, &old).kv_bytes_per_token, 61 * (576 + 512) * 2);
    }

    #[test]
    fn mamba_state_is_per_slot_and_has_no_kv() {
        let h = header(
            "mamba",
            &[
                ("block_count", Value::U32(64)),
                ("embedding_length", Value::U32(2560)),
                ("ssm.conv_kernel", Value::U32(4)),
                ("ssm.inner_size", Value::U32(5120)),
                ("ssm.state_size", Value::U32(16)),
            ],
        );
        let one = estimate(&h, &flags(4096, 1));
        assert_eq!(one.kv, 0);
        // (3 x 5120 + 16 x 5120) x 4 B x 64 layers = 23.75 MiB per sequence.
        assert_eq!(one.recurrent, 24_903_680);
        assert_eq!(estimate(&h, &flags(4096, 4)).recurrent, 4 * 24_903_680);
    }

    #[test]
    fn a_hybrid_counts_kv_on_attention_layers_and_state_on_the_others() {
        let h = header(
            "granitehybrid",
            &[
                ("block_count", Value::U32(4)),
                ("embedding_length", Value::U32(1024)),
                ("attention.head_count", Value::U32(8)),
                ("attention.head_count_kv", write::u32s(&[0, 0, 0, 2])),
                ("ssm.conv_kernel", Value::U32(4)),
                ("ssm.inner_size", Value::U32(2048)),
                ("ssm.state_size", Value::U32(128)),
                ("ssm.group_count", Value::U32(1)),
            ],
        );
        let e = estimate(&h, &flags(4096, 2));
        assert_eq!(
            e.kv_bytes_per_token,
            2 * 128 * 2 * 2,
            "one attention layer, 2 KV heads of 128, K+V, f16"
        );
        assert_eq!(e.kv, e.kv_bytes_per_token * 4096);
        assert_eq!(e.recurrent, 3 * (3 * (2048 + 2 * 128) + 128 * 2048) * 4 * 2);
        assert!(
            e.basis.contains("recurrent state") && e.basis.contains("(3 layers)"),
            "{}",
            e.basis
        );
    }

    #[test]
    fn a_header_without_shapes_gets_a_labelled_fallback() {
        let h = header("llama", &[]);
        let e = estimate(&h, &flags(4096, 1));
        assert!(e.fallback);
        assert!(e.basis.starts_with("FALLBACK"), "{}", e.basis);
        assert!(e.total > e.weights);
    }

    #[test]
    fn context_is_padded_and_split_across_slots() {
        let h = header(
            "llama",
            &[
                ("block_count", Value::U32(1)),
                ("embedding_length", Value::U32(128)),
                ("attention.head_count", Value::U32(1)),
            ],
        );
        // 1000 tokens -> 1024 cells; 3 slots -> PAD(1024/3=341) = 512 cells each.
        assert_eq!(estimate(&h, &flags(1000, 1)).kv, 1024 * 128 * 2 * 2);
        assert_eq!(estimate(&h, &flags(1000, 3)).kv, 3 * 512 * 128 * 2 * 2);
    }
}
