//! What an architecture's layers hold, where the header does not say: which are recurrent, which
//! hold no KV cache, and the sliding window llama.cpp assumes.

/// Archs whose every layer is recurrent.
pub(super) const RECURRENT: [&str; 6] =
    ["mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"];
/// Hybrids whose recurrent layers are those with head_count_kv 0.
pub(super) const HYBRID_BY_KV0: [&str; 8] = [
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
pub(super) const HYBRID_BY_INTERVAL: [&str; 4] = ["qwen3next", "qwen35", "qwen35moe", "minimax-01"];
/// Architectures without a KV cache (embedding and diffusion models).
pub(super) const NO_KV: [&str; 14] = [
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

/// Architectures that scale the token embeddings before the first block (gemma's
/// sqrt(n_embd)): a copy of the ubatch's embeddings where that block runs.
pub(super) const SCALED_EMBEDDINGS: [&str; 8] = [
    "gemma",
    "gemma2",
    "gemma3",
    "gemma3n",
    "gemma4",
    "gemma-embedding",
    "afmoe",
    "minicpm3",
];

/// Default sliding-window size and pattern period by architecture, when the header has none.
pub(super) fn swa_defaults(arch: &str) -> Option<(u64, u64)> {
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
