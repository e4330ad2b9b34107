//! A fused gate and up projection (phi3's `ffn_up`, twice the FFN's width, and no `ffn_gate`)
//! on the first GPU under op offload: the rows a host block's FFN makes there, with the weights
//! copied in around them (`Model::offloaded_fused_ffn`), and where the host's attention, its
//! fused `attn_qkv` copied in, lays its KV copies and mask (`Model::offloaded_fused_attention`).

use std::ops::Range;

use super::copies::stack;
use super::{Model, each_block_weight};
use crate::gguf::bounds::FEED_FORWARD;
use crate::gguf::header::Header;
use crate::gguf::hparams::Hp;

/// Each block's fused projection, where the model has one.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct FusedUp {
    /// The fused projection's output rows for one ubatch (f32), per block.
    rows: Vec<u128>,
    /// The fused projection's weight per block, copied in for its product.
    weight: Vec<u64>,
}

impl FusedUp {
    /// The blocks' fused projections for `tokens` tokens; None where any block has a separate
    /// gate, or no block's `ffn_up` is twice its FFN's width.
    pub(super) fn of(h: &Header, tokens: u64, n_layer: usize) -> Option<FusedUp> {
        let hp = Hp::new(h);
        let mut fused = FusedUp {
            rows: vec![0; n_layer],
            weight: vec![0; n_layer],
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
                    fused.weight[il] = b;
                }
            }
            _ => {}
        });
        if gated {
            return None;
        }
        any.then_some(fused)
    }

    /// The largest fused rows and weight among `layers` (0 for blocks the model does not have).
    fn largest(&self, layers: &Range<u32>) -> (u128, u128) {
        layers.clone().fold((0, 0), |(rows, weight), il| {
            let i = il as usize;
            let r = self.rows.get(i).copied().unwrap_or(0);
            let w = u128::from(self.weight.get(i).copied().unwrap_or(0));
            (rows.max(r), weight.max(w))
        })
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
        let (rows, _) = fused.largest(layers);
        let attention = layers
            .clone()
            .map(|il| self.attention_weight(il as usize))
            .max()
            .unwrap_or(0);
        4 * u128::from(self.parts.residual) + u128::from(attention).max(mask) + rows
    }

    /// Under op offload, the first GPU's peak while it runs the attention of the host's
    /// `layers` in a model with a fused projection (phi3: `attn_qkv`, and `ffn_up`), and what
    /// the FFN after it puts above it. The first attending layer leaves two rows below (its
    /// input and query), then the freed place of its attention weight's copy, then its K and V
    /// copies. Where the mask copied in after them fits that place, it lies there: the first
    /// attention's output lands above the copies, and a later layer's copies above its input
    /// and query rows (each row in what the mask leaves of the place, where it fits). Where
    /// the mask does not fit, it lands above the copies, the output in the weight's place
    /// (where it fits), and each later layer's value copy above the mask, its rows before it
    /// having taken the start of the first layer's copies' place; the FFN's weight and rows
    /// fit in that place below the mask, or land above it.
    ///
    /// GGML_ALLOCATOR_DEBUG's layouts over an rpc-server device given CUDA's offload rule,
    /// `-ngl 1`: phi3-bench at 8192 and 9216 cells, the 4 and 4.5 MiB masks in the 4.59 MiB
    /// place of `attn_qkv`'s copy (37.85 and 41.35 MiB, the FFN peaking at 47.22 above them),
    /// at 10240 the 5 MiB mask above the copies at 43.10 and the FFN's 19 MiB rows above it
    /// (67.10, its weight in the key copy's place), at 14336 layer 1's 24.5 MiB value copy above
    /// the 7 MiB mask (88.60); phi3-bench with a 512-wide FFN, whose attention sets the peak:
    /// layer 1's copies above its input and query at 8192 and 9216 cells (39.60 and 43.10),
    /// above its input only at 4096 (23.85, the query beside the 2 MiB mask; one host layer's
    /// output there too, 22.10; layer 1 of two host layers fits at 8192, 37.85, counted 39.6 as
    /// a later layer); phi3-tiny's 4 MiB mask above its 2 MiB of copies, the output on top
    /// (6.40).
    pub(super) fn offloaded_fused_attention(&self, fused: &FusedUp, layers: &Range<u32>) -> u128 {
        let p = &self.parts;
        let row = u128::from(p.residual);
        let out = u128::from(p.query);
        let mut attending = layers.clone().filter_map(|il| {
            let i = il as usize;
            Some((i, u128::from(self.mask_of(i)?), u128::from(*p.kv.get(i)?)))
        });
        let Some((first, mask, kv)) = attending.next() else {
            return 0;
        };
        let place = u128::from(self.attention_weight(first));
        let copies = 2 * row + place + kv;
        let later = attending.map(|(i, _, kv)| (i, kv));
        if mask <= place {
            // The output, and a later layer's query, fit beside the mask in the place.
            let beside = if mask + out <= place { 0 } else { out };
            let later = later.map(|(_, kv)| 3 * row + place + beside + kv).max();
            return (copies + beside).max(later.unwrap_or(0));
        }
        let top = copies + mask;
        let output = if out <= place { top } else { top + out };
        let values = later
            .map(|(i, _)| top + u128::from(p.kv_values.get(i).copied().unwrap_or(0)))
            .max();
        let (rows, weight) = fused.largest(layers);
        let ffn = top + stack(kv, &[weight, rows]);
        output.max(values.unwrap_or(0)).max(ffn)
    }
}
