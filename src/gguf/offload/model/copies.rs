//! Where the first GPU puts what follows a host layer's attention under op offload, once the
//! mask copied in for it lies above the layer's K and V copies (it is larger than the place
//! the layer's attention weight's copy leaves): the FFN's weight and rows, and a later layer's
//! copies, each fit in the copies' freed place below the mask or land above it
//! (`Model::past_the_copies`).

use super::home::kind;
use super::{HostShare, Model};

/// Whether a weight is one of a block's attention projections.
pub(super) fn projects_attention(name: &str) -> bool {
    matches!(
        kind(name),
        "attn_qkv" | "attn_q" | "attn_k" | "attn_v" | "attn_output"
    )
}

/// The bytes of `items` that land above a place of `room` bytes, each taking the rest of the
/// place in turn where it fits.
pub(super) fn stack(room: u128, items: &[u128]) -> u128 {
    let (mut room, mut above) = (room, 0u128);
    for &item in items {
        if item <= room {
            room -= item;
        } else {
            above += item;
        }
    }
    above
}

/// What lands above the mask past a host layer's copies (`Model::past_the_copies`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Past {
    /// The bytes of the FFN's weight and rows above the mask.
    pub(super) ffn: u128,
    /// Whether a later layer's key copy lands above the mask too, beside its value copy.
    pub(super) key: bool,
}

impl Model {
    /// Block `i`'s largest attention weight (0 for a block the model does not have).
    pub(super) fn attention_weight(&self, i: usize) -> u64 {
        self.attention.get(i).copied().unwrap_or(0)
    }

    /// Under op offload, for a dense model whose FFN has a gate, what the first GPU puts past
    /// the first attending host layer (`first`) once the `mask` copied in for it, larger than
    /// the place that layer's attention weight leaves (less the roped query, where that takes
    /// it), lies above its `kv` bytes of K and V copies. Into the copies' freed place go, each
    /// where the rest of it holds it, the attention's output row, the largest weight copied in
    /// (`largest`), the gate rows and the up rows; the others land above the mask. The FFN's
    /// output, which the next layer reads, then lies where the gate rows did: where it leaves
    /// no half of the place whole, a later layer's key copy lands above the mask too. None
    /// where the mask fits the weight's place, the FFN has no gate, experts run on the host,
    /// sliding-window layers have a mask of their own, or scaled embeddings are alive beside
    /// the first block.
    ///
    /// GGML_ALLOCATOR_DEBUG's layouts over an rpc-server device given CUDA's offload rule,
    /// `-ngl 1`: a 1024-wide llama at 16384 cells (16 MiB of copies, the 8 MiB mask above them
    /// at 22.00, the up rows above it at 35.50, layer 1's output in the gate rows' place at
    /// 13.50 and its copies above the mask, 46.00; counted 42.0 before, under) and at 8192 (the
    /// gate and up rows above the mask, 29.00); a 1536-wide qwen2 (its 26.25 MiB FFN weight and
    /// both rows above the 8 and 4 MiB masks, 94.26 and 82.26 at 16384 and 8192 cells, the
    /// latter's mask in no place below, the query taking 3 MiB of its weight's 4.5; counted
    /// 92.8, under, and 88.8 before).
    pub(super) fn past_the_copies(
        &self,
        first: usize,
        mask: u128,
        kv: u128,
        largest: u64,
        host: &HostShare,
    ) -> Option<Past> {
        let p = &self.parts;
        let (gate, query) = (u128::from(p.gate), u128::from(p.query));
        let experts = self.moe(host);
        // The roped query takes the weight's place where it fits (`rows_before_copies`).
        let place = u128::from(self.attention_weight(first));
        let place = if place >= query { place - query } else { place };
        // Traced with one mask only: sliding-window layers (gemma3) lay their FFN out otherwise.
        if mask <= place || !self.gated || gate == 0 || experts || p.mask_window > 0 || p.scaled > 0
        {
            return None;
        }
        let (row, weight) = (u128::from(p.residual), u128::from(largest));
        let ffn = stack(kv.saturating_sub(row), &[weight, gate, gate]);
        let before = row + weight;
        let after = kv.saturating_sub(before + row);
        let key = before + gate <= kv && before.max(after) < kv / 2;
        Some(Past { ffn, key })
    }
}
