//! Latent attention (a latent KV cache: deepseek2's MLA without V) on the first GPU under op
//! offload: the query rows a host layer's attention makes there, the place they leave, and where
//! the cache's copies land beside them (`Model::offloaded_latent`).

use std::ops::Range;

use super::{Model, each_block_weight};
use crate::gguf::bounds::{HEAD_COUNT, KEY_LENGTH, KEY_LENGTH_MLA, KV_LORA_RANK, Q_LORA_RANK};
use crate::gguf::header::Header;
use crate::gguf::hparams::Hp;

/// One ubatch of a latent-attention layer's query rows (f32) on the GPU, in bytes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Query {
    /// What lies below the joined query's end, in the order the graph makes it: the split's
    /// input and its norm; the compressed query (`q_a`, none without a query rank) and the
    /// query, each above the weight copied in for it; the query absorbed into the latent space;
    /// the roped part, where it does not fit in the compressed query's freed place; the
    /// absorbed and roped parts joined (`Qcur`, the cache's key width).
    rows: u128,
    /// The place the query and the absorbed query leave once joined, next to each other.
    hole: u128,
    /// The attention's output in the latent space (the absorbed query's width).
    out: u128,
    /// Each block's query projections' weights (`attn_q_a` and `attn_q_b`, or `attn_q`).
    weights: Vec<u64>,
}

impl Query {
    /// The rows for `tokens` tokens of `residual` bytes each; None where the header does not
    /// describe latent attention (no MLA key width, no latent rank or heads).
    pub(super) fn of(h: &Header, residual: u64, tokens: u64, n_layer: usize) -> Option<Query> {
        let hp = Hp::new(h);
        let u = |p| hp.u(p).map(u128::from);
        let key_mla = u(&KEY_LENGTH_MLA)?;
        let (lora, head_k) = (u(&KV_LORA_RANK)?, u(&KEY_LENGTH)?);
        let heads = u128::from(hp.per_layer(&HEAD_COUNT, 0)?);
        if lora == 0 || heads == 0 {
            return None;
        }
        let row = |width: u128| 4 * u128::from(tokens) * width;
        let compressed = row(u(&Q_LORA_RANK).unwrap_or(0));
        let query = row(heads * key_mla);
        let absorbed = row(heads * lora);
        let roped = row(heads * head_k.saturating_sub(lora));
        let roped_on_top = if compressed > 0 && roped <= compressed {
            0
        } else {
            roped
        };
        let mut weights = vec![0u64; n_layer];
        each_block_weight(h, n_layer, |il, kind, _, b| {
            if matches!(kind, "attn_q_a" | "attn_q_b" | "attn_q") {
                weights[il] = weights[il].saturating_add(b);
            }
        });
        Some(Query {
            rows: 2 * u128::from(residual)
                + compressed
                + query
                + absorbed
                + roped_on_top
                + row(heads * head_k),
            hole: query + absorbed,
            out: absorbed,
            weights,
        })
    }
}

impl Model {
    /// Under op offload, the first GPU's peak while it runs the latent attention of the host's
    /// `layers`: the engine copies in the mask and, as the keys' view and the values' view,
    /// the layer's whole cache twice. Above the query rows (`Query`) the first copy takes the
    /// place the query and the absorbed query leave where it fits, the second where what is
    /// left still holds it, else each lands on top; the mask above them, kept for every later
    /// layer; then the first layer's output where that place no longer holds it, and a later
    /// layer's second copy (and its output, where larger) above the mask, the rows below it
    /// taken by that layer's own. GGML_ALLOCATOR_DEBUG's layouts over an rpc-server device
    /// given CUDA's offload rule, `-ngl 1` (b11312, 8192 cells): deepseek2-bench 46.63 MiB, its
    /// first copy of 9 in the 11 the query rows left, the second, the 4 MiB mask and the next
    /// layer's second above the 24.63 of rows (its first layer's 8 MiB output on top, 45.63,
    /// where it runs one host layer); deepseek2-tiny 6.95, both copies of 0.63 on top of 1.07.
    /// Zero where no host layer attends.
    pub(super) fn offloaded_latent(&self, q: &Query, layers: &Range<u32>) -> u128 {
        let p = &self.parts;
        let (mut attending, mut mask, mut cache, mut weights) = (0u128, 0u64, 0u64, 0u64);
        for il in layers.clone() {
            let i = il as usize;
            if let (Some(m), Some(kv)) = (self.mask_of(i), p.kv.get(i)) {
                attending += 1;
                mask = mask.max(m);
                cache = cache.max(*kv);
                weights = weights.max(q.weights.get(i).copied().unwrap_or(0));
            }
        }
        if attending == 0 {
            return 0;
        }
        let cache = u128::from(cache);
        let mut left = q.hole;
        let mut on_top = 0;
        for _ in 0..2 {
            match left.checked_sub(cache) {
                Some(rest) => left = rest,
                None => on_top += cache,
            }
        }
        let larger_out = if q.out > cache { q.out } else { 0 };
        let above = match (attending, q.out > left) {
            (1, true) => q.out,
            (1, false) => 0,
            _ => cache + larger_out,
        };
        q.rows + u128::from(weights) + on_top + u128::from(mask) + above
    }
}
