//! Multi-head latent attention (deepseek2 and its kin): the rows its query projections keep in
//! a compute buffer, per token, in f32 elements.

use crate::gguf::bounds::{KEY_LENGTH_MLA, KV_LORA_RANK};
use crate::gguf::hparams::Hp;

/// The attention's phase two ways.
pub(super) struct Phases {
    /// Fitted on the CPU alone: per head, the query with its rotary part in the latent space
    /// (the cache's key width), the query absorbed into the latent space and the latent
    /// attention output, beside two residual rows: wider than the FFN phase of a small model
    /// (the engine logged 33.0 MiB of compute for a 768-wide deepseek2 whose FFN phase gives
    /// 21). That run peaks in a block after a MoE block: the MoE block's output lands above its
    /// experts' rows, and the next attention stacks above it.
    pub fitted: u128,
    /// Traced (b11312) where no block runs after a MoE block in the same buffer, so the first
    /// attention sets the peak: the embeddings input, its gathered copy and the norm, and per
    /// head the roped query, the query, the query absorbed into the latent space and that
    /// joined with the roped query (the cache's key width), all alive at once.
    pub traced: u128,
}

impl Phases {
    /// The traced phase for `tokens` tokens, with the graph's ids beside it: the tokens', their
    /// positions' and the cache rows' (16 bytes a token) and the outputs' (an aligned slot).
    pub(super) fn traced_bytes(&self, tokens: u128) -> u128 {
        4 * tokens * self.traced + traced_ids(tokens)
    }
}

/// The graph's ids in the traced phase (`Phases::traced_bytes`) for `tokens` tokens.
pub(crate) fn traced_ids(tokens: u128) -> u128 {
    16 * tokens + 32
}

pub(super) fn phases(hp: &Hp<'_>, n_embd: u128, n_head: u128, head_k: u128) -> Phases {
    let u = |p| hp.u(p).map_or(0, u128::from);
    let lora = u(&KV_LORA_RANK);
    let rope = head_k.saturating_sub(lora);
    Phases {
        fitted: 2 * n_embd + n_head * (head_k + 2 * lora),
        traced: 3 * n_embd + n_head * (rope + u(&KEY_LENGTH_MLA) + lora + head_k),
    }
}
