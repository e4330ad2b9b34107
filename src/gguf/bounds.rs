//! Every bound on what a GGUF header may say, in one place, and the error for a value beyond one.
//!
//! The operator reads the headers of arbitrary public repositories, so every count in them is
//! hostile: each is checked here before it sizes a loop, an allocation or a product. The limits
//! sit far above every public model (the largest real value is noted beside each), so a real
//! model never meets one, and far enough below `u64` that the estimate's products cannot overflow.

// The file.

/// Bytes of one header: a 262k-token vocabulary with scores and merges takes ~10 MiB.
pub const MAX_HEADER: u64 = 64 << 20;
/// Tensors of a model, all shards together: ~50k with 256 experts stored unstacked over 61 layers.
pub const MAX_TENSORS: u64 = 1 << 18;
/// Metadata keys of one file: real ones have under 100.
pub const MAX_KEYS: u64 = 1 << 16;
/// Bytes of a key or a tensor name: the GGUF spec caps keys at 65,535; llama.cpp names are < 64.
pub const MAX_NAME: u64 = 65_535;
/// Bytes of one string value: chat templates take ~10 KiB, an embedded tokenizer.json ~35 MiB.
pub const MAX_STRING: u64 = MAX_HEADER;
/// Elements of one array: the longest real ones are vocabularies and merges (262k to ~1M).
pub const MAX_ARRAY: u64 = 1 << 24;
/// Arrays nested in arrays: llama.cpp writes none.
pub const MAX_NESTING: u32 = 3;
/// Array elements kept as values per array (longer arrays keep their length): only per-layer
/// arrays are read element by element, and they have one element per layer.
pub const KEPT_ARRAY: u64 = MAX_LAYERS;
/// Array elements kept as values per header, so kept arrays cost at most ~2.5 MiB.
pub const KEPT_VALUES: u64 = 1 << 16;
/// Dimensions of a tensor: GGML_MAX_DIMS.
pub const MAX_DIMS: u64 = 4;
/// One dimension of a tensor: the largest real one is a vocabulary (~2^18); four of these
/// multiply within a `u128`.
pub const MAX_DIM: u64 = u32::MAX as u64;
/// Elements of one tensor: the stacked experts of a 1T-parameter model hold ~2^32.
pub const MAX_TENSOR_ELEMENTS: u64 = 1 << 40;
/// Elements of all tensors of a model: the largest public models have 1–2 trillion (2^41).
pub const MAX_MODEL_ELEMENTS: u64 = 1 << 44;

// The hyper-parameters the estimate and the support check read.

/// Layers (`block_count`): the deepest public models have ~200; llama.cpp loads at most 512.
pub const MAX_LAYERS: u64 = 4096;
/// Width of the residual stream (`embedding_length`): the widest public models use 16k–32k.
pub const MAX_EMBEDDING: u64 = 1 << 17;
/// Feed-forward width, dense or of one expert: the widest public models use ~50k–74k.
pub const MAX_FEED_FORWARD: u64 = 1 << 20;
/// Attention heads or KV heads of a layer: the most in a public model is 232 (Falcon 180B).
pub const MAX_HEADS: u64 = 4096;
/// Width of one head (K, V, MLA, RWKV and KDA heads): the widest real ones are 576 (MLA).
pub const MAX_HEAD_DIM: u64 = 1 << 14;
/// Tokens of the vocabulary: the largest public ones have 262k to ~1M.
pub const MAX_VOCAB: u64 = 1 << 22;
/// Experts of a layer, total, used or shared: the most in a public model is 512.
pub const MAX_EXPERTS: u64 = 4096;
/// Tokens of context a model advertises, or a sliding window spans: the longest are 1M–10M.
pub const MAX_CONTEXT_LENGTH: u64 = 1 << 30;
/// Inner width of an SSM layer (`ssm.inner_size`): twice the embedding in real models.
pub const MAX_SSM_INNER: u64 = 2 * MAX_EMBEDDING;
/// SSM state size (`ssm.state_size`): 16 (Mamba) to 256 in real models.
pub const MAX_SSM_STATE: u64 = 1 << 12;
/// SSM groups (`ssm.group_count`): 1 to 8 in real models.
pub const MAX_SSM_GROUPS: u64 = 1 << 10;
/// Convolution kernel (`ssm.conv_kernel`, `shortconv.l_cache`): 3 or 4 in real models.
pub const MAX_CONV_KERNEL: u64 = 1 << 10;
/// Token-shift states of an RWKV layer: 2 in real models.
pub const MAX_TOKEN_SHIFT: u64 = 1 << 8;
/// Low ranks (MLA q/kv ranks, SSM time-step rank, RWKV LoRA sizes): 1536 at most in real models.
pub const MAX_RANK: u64 = MAX_EMBEDDING;

// The server settings the estimate is for.

/// --ctx-size: the CRD allows up to 4,194,304 tokens.
pub const MAX_CTX_SIZE: u64 = 1 << 26;
/// --parallel: the CRD allows up to 16,384 slots (llama.cpp runs at most 256 sequences).
pub const MAX_SLOTS: u64 = 1 << 16;
/// --ubatch-size: the Check stage uses 512.
pub const MAX_UBATCH: u64 = 1 << 20;
/// An estimate above this (1 PiB) is a broken header, not a model: no node holds it.
pub const MAX_ESTIMATE: u64 = 1 << 50;

/// How a hyper-parameter may be written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// One number.
    Scalar,
    /// One number, or an array with one per layer (llama.cpp refuses any other length).
    PerLayer,
    /// A period, or an array of per-layer flags at most MAX_LAYERS long.
    LayerFlags,
}

/// A hyper-parameter `{arch}.{key}` and its bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Param {
    pub key: &'static str,
    pub limit: u64,
    pub unit: &'static str,
    pub kind: Kind,
}

const fn scalar(key: &'static str, limit: u64, unit: &'static str) -> Param {
    Param {
        key,
        limit,
        unit,
        kind: Kind::Scalar,
    }
}

const fn per_layer(key: &'static str, limit: u64, unit: &'static str) -> Param {
    Param {
        key,
        limit,
        unit,
        kind: Kind::PerLayer,
    }
}

const fn layer_flags(key: &'static str) -> Param {
    Param {
        key,
        limit: MAX_LAYERS,
        unit: "layers",
        kind: Kind::LayerFlags,
    }
}

pub const BLOCK_COUNT: Param = scalar("block_count", MAX_LAYERS, "layers");
pub const EMBEDDING: Param = scalar("embedding_length", MAX_EMBEDDING, "elements");
pub const FEED_FORWARD: Param = per_layer("feed_forward_length", MAX_FEED_FORWARD, "elements");
pub const HEAD_COUNT: Param = per_layer("attention.head_count", MAX_HEADS, "heads");
pub const HEAD_COUNT_KV: Param = per_layer("attention.head_count_kv", MAX_HEADS, "heads");
pub const KEY_LENGTH: Param = scalar("attention.key_length", MAX_HEAD_DIM, "elements");
pub const VALUE_LENGTH: Param = scalar("attention.value_length", MAX_HEAD_DIM, "elements");
pub const KEY_LENGTH_SWA: Param = scalar("attention.key_length_swa", MAX_HEAD_DIM, "elements");
pub const VALUE_LENGTH_SWA: Param = scalar("attention.value_length_swa", MAX_HEAD_DIM, "elements");
pub const KEY_LENGTH_MLA: Param = scalar("attention.key_length_mla", MAX_HEAD_DIM, "elements");
pub const VALUE_LENGTH_MLA: Param = scalar("attention.value_length_mla", MAX_HEAD_DIM, "elements");
pub const Q_LORA_RANK: Param = scalar("attention.q_lora_rank", MAX_RANK, "elements");
pub const KV_LORA_RANK: Param = scalar("attention.kv_lora_rank", MAX_RANK, "elements");
pub const SLIDING_WINDOW: Param = scalar("attention.sliding_window", MAX_CONTEXT_LENGTH, "tokens");
pub const SLIDING_WINDOW_PATTERN: Param = layer_flags("attention.sliding_window_pattern");
pub const RECURRENT_LAYERS: Param = layer_flags("attention.recurrent_layers");
pub const FULL_ATTENTION_INTERVAL: Param = scalar("full_attention_interval", MAX_LAYERS, "layers");
pub const CONTEXT_LENGTH: Param = scalar("context_length", MAX_CONTEXT_LENGTH, "tokens");
pub const VOCAB_SIZE: Param = scalar("vocab_size", MAX_VOCAB, "tokens");
pub const EXPERT_COUNT: Param = scalar("expert_count", MAX_EXPERTS, "experts");
pub const EXPERT_USED: Param = scalar("expert_used_count", MAX_EXPERTS, "experts");
pub const EXPERT_SHARED: Param = scalar("expert_shared_count", MAX_EXPERTS, "experts");
pub const EXPERT_FEED_FORWARD: Param =
    scalar("expert_feed_forward_length", MAX_FEED_FORWARD, "elements");
pub const LEADING_DENSE: Param = scalar("leading_dense_block_count", MAX_LAYERS, "layers");
pub const SSM_CONV_KERNEL: Param = scalar("ssm.conv_kernel", MAX_CONV_KERNEL, "elements");
pub const SSM_INNER: Param = scalar("ssm.inner_size", MAX_SSM_INNER, "elements");
pub const SSM_STATE: Param = scalar("ssm.state_size", MAX_SSM_STATE, "elements");
pub const SSM_GROUPS: Param = scalar("ssm.group_count", MAX_SSM_GROUPS, "groups");
pub const SSM_DT_RANK: Param = scalar("ssm.time_step_rank", MAX_RANK, "elements");
pub const TOKEN_SHIFT: Param = scalar("token_shift_count", MAX_TOKEN_SHIFT, "states");
pub const WKV_HEAD_SIZE: Param = scalar("wkv.head_size", MAX_HEAD_DIM, "elements");
pub const SHORTCONV_CACHE: Param = scalar("shortconv.l_cache", MAX_CONV_KERNEL, "elements");
pub const KDA_HEAD_DIM: Param = scalar("kda.head_dim", MAX_HEAD_DIM, "elements");
pub const TIME_MIX_EXTRA_DIM: Param = scalar("time_mix_extra_dim", MAX_RANK, "elements");
pub const TIME_DECAY_EXTRA_DIM: Param = scalar("time_decay_extra_dim", MAX_RANK, "elements");
pub const DECAY_LORA_RANK: Param = scalar("attention.decay_lora_rank", MAX_RANK, "elements");
pub const ICLR_LORA_RANK: Param = scalar("attention.iclr_lora_rank", MAX_RANK, "elements");
pub const VALUE_MIX_LORA_RANK: Param = scalar(
    "attention.value_residual_mix_lora_rank",
    MAX_RANK,
    "elements",
);
pub const GATE_LORA_RANK: Param = scalar("attention.gate_lora_rank", MAX_RANK, "elements");

/// Every hyper-parameter that is checked; the estimate reads no other.
pub const PARAMS: &[Param] = &[
    BLOCK_COUNT,
    EMBEDDING,
    FEED_FORWARD,
    HEAD_COUNT,
    HEAD_COUNT_KV,
    KEY_LENGTH,
    VALUE_LENGTH,
    KEY_LENGTH_SWA,
    VALUE_LENGTH_SWA,
    KEY_LENGTH_MLA,
    VALUE_LENGTH_MLA,
    Q_LORA_RANK,
    KV_LORA_RANK,
    SLIDING_WINDOW,
    SLIDING_WINDOW_PATTERN,
    RECURRENT_LAYERS,
    FULL_ATTENTION_INTERVAL,
    CONTEXT_LENGTH,
    VOCAB_SIZE,
    EXPERT_COUNT,
    EXPERT_USED,
    EXPERT_SHARED,
    EXPERT_FEED_FORWARD,
    LEADING_DENSE,
    SSM_CONV_KERNEL,
    SSM_INNER,
    SSM_STATE,
    SSM_GROUPS,
    SSM_DT_RANK,
    TOKEN_SHIFT,
    WKV_HEAD_SIZE,
    SHORTCONV_CACHE,
    KDA_HEAD_DIM,
    TIME_MIX_EXTRA_DIM,
    TIME_DECAY_EXTRA_DIM,
    DECAY_LORA_RANK,
    ICLR_LORA_RANK,
    VALUE_MIX_LORA_RANK,
    GATE_LORA_RANK,
];

/// A value of a header, or a server setting, beyond what this operator accepts.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BoundsError {
    #[error("{field} is {value}, above the limit of {limit} {unit}")]
    AboveLimit {
        field: String,
        /// Wide enough for the element count of any four 32-bit dimensions.
        value: u128,
        limit: u64,
        unit: &'static str,
    },
    #[error(
        "{field} has {len} entries, but the model has {layers} layers; a per-layer array needs one entry per layer"
    )]
    PerLayerLength {
        field: String,
        len: u64,
        layers: u64,
    },
    #[error("{flag} is {value}, above the limit of {limit}")]
    Setting {
        flag: &'static str,
        value: u64,
        limit: u64,
    },
}

impl BoundsError {
    /// The condition reason: the header is refused, or the server settings are.
    pub fn reason(&self) -> &'static str {
        match self {
            BoundsError::Setting { .. } => "InvalidSpec",
            _ => "InvalidHeader",
        }
    }
}

/// `value` when it is at most `limit`; else the error naming `field`.
pub fn at_most(
    value: u64,
    limit: u64,
    unit: &'static str,
    field: impl FnOnce() -> String,
) -> Result<u64, BoundsError> {
    if value <= limit {
        return Ok(value);
    }
    Err(BoundsError::AboveLimit {
        field: field(),
        value: value.into(),
        limit,
        unit,
    })
}

/// The element count of a tensor, with its dimension count, each dimension and their product
/// checked.
pub fn tensor_elements(name: &str, dims: &[u64]) -> Result<u64, BoundsError> {
    at_most(dims.len() as u64, MAX_DIMS, "dimensions", || {
        format!("the dimension count of tensor {name:?}")
    })?;
    let mut product: u128 = 1;
    for (i, d) in dims.iter().enumerate() {
        at_most(*d, MAX_DIM, "elements", || {
            format!("dimension {i} of tensor {name:?}")
        })?;
        // At most four factors below 2^32: the product stays below 2^128.
        product = product.saturating_mul(u128::from(*d));
    }
    match u64::try_from(product) {
        Ok(n) if n <= MAX_TENSOR_ELEMENTS => Ok(n),
        _ => Err(BoundsError::AboveLimit {
            field: format!("the element count of tensor {name:?}"),
            value: product,
            limit: MAX_TENSOR_ELEMENTS,
            unit: "elements",
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_names_field_value_and_limit() {
        let e = at_most(0xFFFF_FFF0, MAX_LAYERS, "layers", || {
            "llama.block_count".into()
        })
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "llama.block_count is 4294967280, above the limit of 4096 layers"
        );
        assert_eq!(e.reason(), "InvalidHeader");
    }

    #[test]
    fn a_shape_whose_product_overflows_u64_is_refused_with_its_product() {
        let e = tensor_elements("t", &[u64::from(u32::MAX); 4]).unwrap_err();
        let BoundsError::AboveLimit { value, limit, .. } = &e else {
            panic!("{e:?}");
        };
        assert_eq!(*value, u128::from(u32::MAX).pow(4));
        assert_eq!(*limit, MAX_TENSOR_ELEMENTS);
        assert!(
            e.to_string()
                .starts_with("the element count of tensor \"t\""),
            "{e}"
        );
        assert_eq!(tensor_elements("t", &[4096, 262_144]), Ok(1 << 30));
        assert_eq!(tensor_elements("t", &[]), Ok(1));
        assert_eq!(tensor_elements("t", &[7, 0]), Ok(0));
    }

    #[test]
    fn every_param_is_listed_once_and_every_limit_is_generous() {
        let mut keys: Vec<&str> = PARAMS.iter().map(|p| p.key).collect();
        keys.sort_unstable();
        let n = keys.len();
        keys.dedup();
        assert_eq!(keys.len(), n, "a key is listed twice");
        assert_eq!(
            PARAMS.first(),
            Some(&BLOCK_COUNT),
            "validate checks the layer count before the per-layer arrays"
        );
        for p in PARAMS {
            assert!(p.limit >= 256, "{} is bounded at {}", p.key, p.limit);
        }
    }
}
