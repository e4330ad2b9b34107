//! A fused gate and up projection (phi3's `ffn_up`, twice the FFN's width, and no `ffn_gate`)
//! on the first GPU under op offload: the rows a host block's FFN makes there, with the weights
//! copied in around them (`Model::offloaded_fused_ffn`).

use std::ops::Range;

use super::{Model, each_block_weight};
use crate::gguf::bounds::FEED_FORWARD;
use crate::gguf::header::Header;
use crate::gguf::hparams::Hp;

/// Each block's fused projection, where the model has one.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct FusedUp {
    /// The fused projection's output rows for one ubatch (f32), per block.
    rows: Vec<u128>,
    /// The largest attention weight (`attn_qkv`, `attn_q`, `attn_k`, `attn_v`, `attn_output`)
    /// per block, whose copy's freed place the mask copied in after it takes.
    attention: Vec<u64>,
}

impl FusedUp {
    /// The blocks' fused projections for `tokens` tokens; None where any block has a separate
    /// gate, or no block's `ffn_up` is twice its FFN's width.
    pub(super) fn of(h: &Header, tokens: u64, n_layer: usize) -> Option<FusedUp> {
        let hp = Hp::new(h);
        let mut fused = FusedUp {
            rows: vec![0; n_layer],
            attention: vec![0; n_layer],
        };
        let (mut any, mut gated) = (false, false);
        each_block_weight(h, n_layer, |il, kind, t, b| match kind {
            "ffn_gate" => gated = true,
            "ffn_up" => {
                let width = t.dims.get(1).copied().unwrap_or(0);
                let ff = hp.per_layer(&FEED_FORWARD, il as u64).unwrap_or(0);
                if ff > 0 && width == 2 * ff {
                    any = true;
                    fused.rows[il] = 4 * u128::from(tokens) * u128::from(width);
                }
            }
            "attn_qkv" | "attn_q" | "attn_k" | "attn_v" | "attn_output" => {
                fused.attention[il] = fused.attention[il].max(b);
            }
            _ => {}
        });
        if gated {
            return None;
        }
        any.then_some(fused)
    }
}

impl Model {
    /// Under op offload, the first GPU's rows while it runs the FFN of the host's `layers` with
    /// a fused gate and up projection, below the projection's weight copied in: the first
    /// attention's input and query rows, held below the mask copied in into the freed place of
    /// that attention's weight (or the mask's own, if larger); then the block's input and its
    /// norm, and the projection's output, both halves of it (the gated product then fits in the
    /// weight's freed place). GGML_ALLOCATOR_DEBUG's layouts over an rpc-server device given
    /// CUDA's offload rule, `-ngl 1` (b11312): phi3-bench 47.22 MiB, layer 1's 19 MiB rows above
    /// its 16.62 MiB weight, the norm and the input, over the 4 MiB mask in the 4.59 MiB place
    /// of `attn_qkv`'s copy and two 1.75 MiB rows (memory's FFN phase, three rows of the FFN's
    /// width, counted 52.62).
    pub(super) fn offloaded_fused_ffn(
        &self,
        fused: &FusedUp,
        layers: &Range<u32>,
        mask: u128,
    ) -> u128 {
        let (mut rows, mut attention) = (0u128, 0u64);
        for il in layers.clone() {
            let i = il as usize;
            rows = rows.max(fused.rows.get(i).copied().unwrap_or(0));
            attention = attention.max(fused.attention.get(i).copied().unwrap_or(0));
        }
        4 * u128::from(self.parts.residual) + u128::from(attention).max(mask) + rows
    }
}
