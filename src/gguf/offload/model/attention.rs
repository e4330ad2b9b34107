//! The attention's rows where they set a device's compute buffer: the model's last block run
//! alone (`last_attention`), a device's only attention layer before layers that do not attend
//! (`projections`), and attention without flash attention (`Unfused`), which the
//! engine falls back to for some placements of hybrid models.
//!
//! llama-server's `--flash-attn auto` checks on a reserve graph that each layer's fused
//! attention runs on the device holding that layer (`llama_context::resolve_fused_ops`), and
//! where one does not it turns flash attention off for every layer. A placement does that when
//! the host's last block attends and the next block, on a GPU, is recurrent: that block's state
//! copies come before the host block's output projection in the graph, and the scheduler
//! extends the GPU's run back over the weightless attention between them. Measured over RPC
//! (granitehybrid, 8192 cells, 2 slots): each device running attention then needed about 96 MiB
//! more, the host 3.5 MiB more.

use std::ops::Range;

use super::{DeviceShare, HostShare, Model, OP_OFFLOAD_MIN_BATCH, clamp};
use crate::gguf::bounds::{EMBEDDING, HEAD_COUNT, HEAD_COUNT_KV, KEY_LENGTH, VALUE_LENGTH};
use crate::gguf::header::{Header, Value};
use crate::gguf::hparams::Hp;
use crate::gguf::memory::{Mask, Parts, traced_ids};

/// The rows alive at the attention's peak in the model's last block, for `tokens` tokens
/// (traced, b11312): the graph gathers the output rows (`inp_out_ids`) before that block's FFN,
/// so where the block runs alone on a device its FFN is a few rows and the attention is its
/// peak. With separate projections: the block's input, its norm, the query and the roped query;
/// with a fused one (`attn_qkv`): the input, the roped query in the norm's freed place, the
/// fused query, key and value, and the roped key. Zero where the last block has no such
/// projections (recurrent layers, latent attention) or the header lacks the head shapes.
/// Without rope (`no_rope`) there is no roped query: the query, key and value rows instead
/// (granitehybrid's last block alone on a second device: 9.51 MiB, its split's two input
/// copies, the mask, Qcur, Vcur and Kcur; GGML_ALLOCATOR_DEBUG over rpc-server devices).
fn last_attention(
    hp: &Hp<'_>,
    how: &[Projected],
    tokens: u64,
    residual: u64,
    no_rope: bool,
) -> u128 {
    let Some(last) = how.len().checked_sub(1) else {
        return 0;
    };
    let Some(s) = Shape::of(hp, last as u64, tokens) else {
        return 0;
    };
    let r = u128::from(residual);
    match how.get(last) {
        _ if s.heads_kv == 0 => 0,
        Some(Projected::Fused) => r + s.q + (s.q + s.k + s.v) + s.k,
        Some(Projected::Apart) if no_rope => 2 * r + s.q + s.k + s.v,
        Some(Projected::Apart) => 2 * r + 2 * s.q,
        _ => 0,
    }
}

/// Whether the model's attention has no rope: granite's hybrid and switch models read
/// `rope.scaling.finetuned` as rope's switch, on where the header lacks it (llama.cpp's
/// `models/granite-hybrid.cpp`); every other family ropes.
fn no_rope(h: &Header) -> bool {
    h.architecture().is_some_and(|arch| {
        ROPE_SWITCHED.contains(&arch)
            && matches!(
                h.get(&format!("{arch}.rope.scaling.finetuned")),
                Some(Value::Bool(false))
            )
    })
}

/// The families whose rope `rope.scaling.finetuned` switches.
const ROPE_SWITCHED: [&str; 2] = ["granitehybrid", "graniteswitch"];

/// How a layer projects its query, key and value: one fused weight (`attn_qkv`), three apart
/// (`attn_q`, `attn_k`, `attn_v`), or neither.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Projected {
    Neither,
    Fused,
    Apart,
}

impl Projected {
    /// Each of the model's `n_layer` layers', from one pass over the tensors.
    fn of(h: &Header, n_layer: usize) -> Vec<Projected> {
        // Bits: 1 attn_qkv, 2 attn_q, 4 attn_k, 8 attn_v.
        let mut seen = vec![0u8; n_layer];
        for t in &h.tensors {
            let Some((il, rest)) = t.name.strip_prefix("blk.").and_then(|n| n.split_once('.'))
            else {
                continue;
            };
            let bit = match rest {
                "attn_qkv.weight" => 1,
                "attn_q.weight" => 2,
                "attn_k.weight" => 4,
                "attn_v.weight" => 8,
                _ => continue,
            };
            if let Some(b) = il.parse::<usize>().ok().and_then(|il| seen.get_mut(il)) {
                *b |= bit;
            }
        }
        seen.into_iter()
            .map(|b| match b {
                _ if b & 1 != 0 => Projected::Fused,
                _ if b & 14 == 14 => Projected::Apart,
                _ => Projected::Neither,
            })
            .collect()
    }
}

/// An upper bound on the rows alive while a layer projects its query, key and value under
/// flash attention, for `tokens` tokens: the layer's input and its norm, the query, key and
/// value, and a roped query beside them; with a fused projection (`attn_qkv`) the fused rows
/// and the roped query and key. Whatever order the graph ropes in, no more is alive at once.
/// Zero where the layer does not attend or the header lacks its head shapes.
///
/// Where it is a device's only attention layer and recurrent ones follow it, the device's peak
/// is the larger of these rows beside the masks and one layer's: the graph frees the masks
/// after this attention, their last reader, and runs the layers after it in their place
/// (traced over RPC, granitehybrid: 4.51 MiB logged, the masks' 4 MiB and the input, norm,
/// query, key and value beside them; the scan chain after them peaked at 1.66 MiB).
fn projections(s: &Shape, how: Projected, residual: u64) -> u128 {
    let r = u128::from(residual);
    match how {
        _ if s.heads_kv == 0 => 0,
        Projected::Fused => 2 * r + (s.q + s.k + s.v) + s.q + s.k,
        Projected::Apart => 2 * r + 2 * s.q + s.k + s.v,
        Projected::Neither => 0,
    }
}

/// Under op offload, what the host's compute buffer keeps beside the graph's inputs for each
/// block that attends, for the shape's tokens: the GPU computes the block's key and value rows and
/// copies them back for the host to write into its KV cache. Separate projections copy K and V
/// each; a fused one (`attn_qkv`) copies its whole output, K and V being views of it. A copy
/// lands in the residual row the host freed once the embeddings went to the GPU where it fits,
/// else above the inputs. Traced over rpc-server devices given CUDA's offload rule
/// (`Kcur-0 (view)`, `Vcur-0 (view)` among a CPU split's inputs): llama 0 (both fit), gemma3
/// and qwen3moe one row, phi3 its fused rows (5.25 MiB at 896 wide), each within 1% of the
/// logged host buffer. Zero for a block without such projections (latent attention, recurrent
/// layers) or whose shapes the header lacks.
fn copied_back(s: &Shape, how: Projected, residual: u64) -> u128 {
    let copies = match how {
        _ if s.heads_kv == 0 => return 0,
        Projected::Fused => [s.q + s.k + s.v, 0],
        Projected::Apart => [s.k, s.v],
        Projected::Neither => return 0,
    };
    let (mut hole, mut above) = (u128::from(residual), 0u128);
    for c in copies {
        if c <= hole {
            hole -= c;
        } else {
            above += c;
        }
    }
    above
}

/// The model's attention rows, from one pass over the tensors.
pub(super) struct Rows {
    /// The last block's attention rows (`last_attention`).
    pub last: u128,
    /// Each block's `projections` (0 where it does not attend: no KV cache in the parts).
    pub projections: Vec<u128>,
    /// Each block's rows the host keeps under op offload (`copied_back`; 0 likewise).
    pub copied_back: Vec<u128>,
}

pub(super) fn attention_rows(h: &Header, p: &Parts, tokens: u64) -> Rows {
    let hp = Hp::new(h);
    let how = Projected::of(h, p.kv.len());
    let last = last_attention(&hp, &how, tokens, p.residual, no_rope(h));
    let (projections, copied_back) =
        p.kv.iter()
            .zip(how)
            .enumerate()
            .map(
                |(il, (kv, how))| match (kv, Shape::of(&hp, il as u64, tokens)) {
                    (0, _) | (_, None) => (0, 0),
                    (_, Some(s)) => (
                        projections(&s, how, p.residual),
                        copied_back(&s, how, p.residual),
                    ),
                },
            )
            .unzip();
    Rows {
        last,
        projections,
        copied_back,
    }
}

/// A layer's heads and its query, key and value rows for a ubatch.
struct Shape {
    heads: u128,
    heads_kv: u64,
    head_v: u128,
    q: u128,
    k: u128,
    v: u128,
}

impl Shape {
    fn of(hp: &Hp<'_>, il: u64, tokens: u64) -> Option<Shape> {
        let (n_embd, heads) = (hp.u(&EMBEDDING)?, hp.per_layer(&HEAD_COUNT, il)?);
        let heads_kv = hp.per_layer(&HEAD_COUNT_KV, il).unwrap_or(heads);
        let head_k = hp.u(&KEY_LENGTH).or_else(|| n_embd.checked_div(heads))?;
        let head_v = hp.u(&VALUE_LENGTH).unwrap_or(head_k);
        let row = |width: u64| u128::from(width) * u128::from(tokens) * 4;
        Some(Shape {
            heads: u128::from(heads),
            heads_kv,
            head_v: u128::from(head_v),
            q: row(heads * head_k),
            k: row(heads_kv * head_k),
            v: row(heads_kv * head_v),
        })
    }
}

/// One attention layer's buffers without flash attention, for a ubatch: the largest of the
/// model's full-attention layers (of its sliding-window ones where it has none). Per stream the
/// engine multiplies the cached keys by the queries into a score matrix (f32: the stream's
/// cells by its tokens by the heads; all streams hold a ubatch), takes its softmax in place
/// against the mask, which is f32 now, copies the layer's V cache transposed (the cache was made
/// for flash attention), and multiplies it by the scores into the output, which it then copies
/// contiguous. Measured: within 5% above the logged buffers (tests/offload_engine.rs).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Unfused {
    scores: u128,
    v_copy: u128,
    out: u128,
    /// The rows the layer's own projections leave alive beside them: input, norm, query, roped
    /// query (2 residual and 2 query rows).
    rows: u128,
    /// What a device running another device's attention copies in besides the mask: the
    /// query rows and the layer's K and V cache.
    copied: u128,
}

impl Unfused {
    /// The largest figures of the full-attention layers (else the sliding-window ones); None
    /// without such a layer or without head shapes.
    pub(super) fn new(h: &Header, p: &Parts, tokens: u64) -> Option<Unfused> {
        let kind = [Mask::Full, Mask::Window]
            .into_iter()
            .find(|k| p.mask_layers.contains(k))?;
        let hp = Hp::new(h);
        (0..p.mask_layers.len())
            .filter(|il| p.mask_layers[*il] == kind)
            .filter_map(|il| Unfused::of_layer(&hp, p, il, tokens))
            .max_by_key(|u| u.own(0))
    }

    fn of_layer(hp: &Hp<'_>, p: &Parts, il: usize, tokens: u64) -> Option<Unfused> {
        let s = Shape::of(hp, il as u64, tokens).filter(|s| s.heads_kv > 0)?;
        // A mask is a stream's cells by the ubatch in f16: the scores are as many f32 per head.
        let mask = u128::from(match p.mask_layers[il] {
            Mask::Full => p.mask_full,
            _ => p.mask_window,
        });
        let kv = u128::from(p.kv.get(il).copied().unwrap_or(0));
        let v_copy = (kv * s.v).checked_div(s.k + s.v).unwrap_or(0);
        Some(Unfused {
            scores: 2 * mask * s.heads,
            v_copy,
            out: 2 * s.head_v * s.heads * u128::from(tokens) * 4,
            rows: 2 * u128::from(p.residual) + 2 * s.q,
            copied: s.q + kv,
        })
    }

    /// The peak of a device running its own attention layers, reading `masks` (their f16 size).
    pub(super) fn own(&self, masks: u128) -> u128 {
        self.rows + self.attention(masks)
    }

    /// The peak of a device running another device's attention (the host's last block).
    pub(super) fn borrowed(&self, masks: u128) -> u128 {
        self.copied + self.attention(masks)
    }

    fn attention(&self, masks: u128) -> u128 {
        self.scores + self.v_copy + self.out + 2 * masks
    }
}

impl Model {
    /// Whether the engine turns flash attention off for a placement leaving `host` these
    /// blocks (`attention`): the host's last block attends and the next, on a GPU, is
    /// recurrent without attention, so that its state reads open it. (falcon-h1's layers,
    /// recurrent and attending at once, open with the attention's norm, a GPU weight.) Decided
    /// from the layers alone: a header without head shapes is flagged too, though its
    /// `Unfused` buffers cannot be sized.
    pub(in crate::gguf::offload) fn flash_attention_off(&self, host: &HostShare) -> bool {
        let end = host.layers.end;
        !host.layers.is_empty()
            && end < self.n_layer
            && self.attends(end - 1)
            && self.recurrent(end)
            && !self.attends(end)
    }

    /// The compute buffers grown for attention without flash attention (`attention::Unfused`):
    /// every mask is f32; a device running attention layers keeps their score matrices; the
    /// device after the host runs the host's last attention on copies of its inputs (so does
    /// the first GPU under op offload, which takes the host's prompt work, beside the block's
    /// input); the host keeps the masks' inputs, and the scores where it runs attention
    /// besides its last block. `largest` is the largest host weight a GPU copies in.
    pub(super) fn unfused_compute(
        &self,
        devices: &mut [DeviceShare],
        masks: &[(bool, bool)],
        host: &mut HostShare,
        largest: u64,
    ) {
        let (Some(u), Some(last)) = (self.unfused, host.layers.end.checked_sub(1)) else {
            return;
        };
        let p = &self.parts;
        let mask_of = |m: Option<&Mask>| {
            u128::from(match m {
                Some(Mask::Full) => p.mask_full,
                Some(Mask::Window) => p.mask_window,
                _ => 0,
            })
        };
        let both = |(full, window): (bool, bool)| {
            mask_of(full.then_some(&Mask::Full)) + mask_of(window.then_some(&Mask::Window))
        };
        let all_masks = u128::from(p.masks);
        let op_offload = self.backend.op_offload && self.ubatch >= OP_OFFLOAD_MIN_BATCH;
        for (d, s) in devices.iter_mut().enumerate() {
            let own = masks.get(d).copied().unwrap_or_default();
            let m = both(own);
            let mut c = u128::from(s.compute);
            if self.runs_attention(s.layers.clone()) {
                c = (c + m).max(u.own(m));
            }
            if !s.layers.is_empty() && s.layers.start == host.layers.end {
                c = c.max(u.borrowed(mask_of(p.mask_layers.get(last as usize))));
            }
            if d == 0 && op_offload {
                // It runs the host's layers too, so the block's input, kept for the residual
                // add after the attention, is its own row here, not the host's, above the rows
                // the block before left where its FFN ran here too: its gate rows, its input,
                // and its down projection's weight copied in with a hole, counted at the
                // largest host weight (granitehybrid-bench, -ngl 5: `ffn_out-2` at 6.84 MiB,
                // above 4.0 of gate rows, 1.5 of input, the 0.84 weight and a 0.5 hole, then
                // the K and V copies, the mask and the scores; 124.34 MiB logged, 122.00
                // counted without those rows, 128.88 with them, the largest weight 1.38).
                let before = if host.layers.len() > 1 {
                    u128::from(largest) + u128::from(p.gate) + u128::from(p.residual)
                } else {
                    0
                };
                let input = before + u128::from(p.residual);
                c = c.max(input + u.borrowed(both(self.first_gpu_masks(masks, host))));
            }
            s.compute = clamp(c);
        }
        let mut c = u128::from(host.compute) + all_masks;
        if self.runs_attention(host.layers.start..last) {
            c = c.max(2 * u128::from(p.residual) + u.own(all_masks));
        }
        host.compute = clamp(c);
    }

    /// Whether `layers` are the model's last block alone, an attention block whose phase is
    /// known.
    pub(super) fn last_only(&self, layers: &Range<u32>) -> bool {
        self.last_attention > 0 && layers.len() == 1 && layers.end == self.n_layer
    }

    /// The projections of the device's first layer where it is the only one of `layers` that
    /// attends and others follow it (`Model::compute`).
    pub(super) fn lone_attention(&self, layers: &Range<u32>) -> Option<u128> {
        let a = self.projections.get(layers.start as usize).copied()?;
        let others = layers.start + 1..layers.end;
        (a > 0 && !others.is_empty() && !others.clone().any(|il| self.attends(il))).then_some(a)
    }

    /// Whether latent attention in `layers` runs after one MoE block of theirs at most, so that
    /// the buffer peaks in an attention as traced (`memory::Parts::latent_compute`), not in one
    /// that follows two MoE blocks, which stacks above the rows they leave (memory's fitted
    /// figure, from the CPU alone running them all). deepseek2's 4-block model over an
    /// rpc-server device (`testbed/alloc-trace.sh`, b11312), for -ngl 0 to 5: the CPU with the
    /// dense block and MoE blocks 1 and 2 before block 3's attention logged 33.04 MiB (fitted
    /// 32.0), and with one MoE block before its last attention 29.51 (traced 29.51); a device
    /// with blocks 1 to 3 31.54, with 2 and 3, or 3 alone, 28.51 (traced 29.51: the device has
    /// no embeddings input, but a hole where its split input was).
    pub(super) fn latent_unfragmented(&self, layers: &Range<u32>) -> bool {
        let p = &self.parts;
        let first_moe = u64::from(layers.start).max(p.dense_lead);
        p.latent_compute > 0
            && p.moe_tail > 0
            && !layers.is_empty()
            && first_moe + 2 >= u64::from(layers.end)
    }

    /// Whether `layers` run the latent attention of a block that follows two MoE blocks, the
    /// second of them here: it stacks above the holes the MoE block leaves, with its norm and
    /// that block's output, memory's fitted rows whole, none of them the split's input
    /// (`Model::latent_unfragmented` comes first outside a pipeline). deepseek2-bench over
    /// rpc-server devices (dense block 0, MoE blocks 1 to 3), where block 3's attention sets
    /// the peak: blocks 0 to 3 on one device, 31.54 MiB logged with its norm in the input's
    /// place (32.01 counted; the block less a residual row had 30.51); in a full offload, above
    /// a pipeline's input copies, masks and small inputs, 28.0 (the fitted rows) on the second
    /// device at 1:3 (blocks 2 and 3: 50.02 logged, 48.52 counted before) and 27.54 on the
    /// first at 3:1 (blocks 0 to 3: 49.56 logged, 50.02 now); where block 2's attention, after
    /// one MoE block, is a device's last, block 1's sets its peak (blocks 0 to 2 at 1:1 and 0
    /// and 1 at 1:3: 46.02 logged both). Alloc traces.
    pub(super) fn latent_fragmented(&self, layers: &Range<u32>) -> bool {
        let p = &self.parts;
        let first = (u64::from(layers.start) + 1).max(p.dense_lead + 2);
        p.latent_compute > 0 && p.moe_tail > 0 && first < u64::from(layers.end)
    }

    /// The rows above a pipeline device's input copies, masks and small inputs where its latent
    /// attention runs after one MoE block of its own at most (`Model::latent_unfragmented`,
    /// not `Model::latent_fragmented`): the traced rows without the embeddings input and its
    /// gathered copy, whose place the split's copies take, and with the input row of a block
    /// after the device's first, which the attention's norm reads. deepseek2-bench over
    /// rpc-server devices at 1:1 (alloc traces, b11312): the second device, block 3 alone, its
    /// norm, roped query, a hole the query leaves, the absorbed query and Qcur, 22.5 MiB above
    /// its copies (44.52 logged, 48.52 counted with memory's fitted rows); the first, blocks 0
    /// to 2, block 0's output under block 1's same rows, 24.0 above all four copies (46.02
    /// logged, 47.02 counted with three). None outside a pipeline or for other layers.
    pub(super) fn pipeline_latent(&self, layers: &Range<u32>, pipeline: bool) -> Option<u128> {
        if !pipeline || !self.latent_unfragmented(layers) || self.latent_fragmented(layers) {
            return None;
        }
        let residual = u128::from(self.parts.residual);
        let ids = traced_ids(u128::from(self.ubatch));
        let rows = u128::from(self.parts.latent_rows).saturating_sub(ids + 2 * residual);
        Some(rows + if layers.len() > 1 { residual } else { 0 })
    }

    /// What a model that scales its embeddings (`memory::Parts::scaled`) keeps above the masks
    /// on a device that runs its first block, or any block in a pipeline. The host scales the
    /// rows it gathered, and the device gets them copied in as any model's input, which the
    /// FFN's norm takes when the layer is done with it. The hole the attention's query rows
    /// leave stays below the FFN where its gate is wider than they are (GGML_ALLOCATOR_DEBUG's
    /// layouts over rpc-server devices, gemma3-bench's 4 MiB hole under an 18 MiB gate: 72.52
    /// MiB logged on one device against the block and masks' 68.50; 91.04 and 107.07 on two,
    /// 1:3, against 87.00 and 103.00 without it. The gate takes the hole in gemma3-tiny and
    /// gemma3-gpu, whose gate is as wide: 5.77 and 9.02 MiB on one device against 5.75 and
    /// 9.00, the rest being the small inputs). Outside a pipeline, a device without the first
    /// block peaks without it (gemma3-bench, partial on two: 68.52 and 64.51 against 68.50 and
    /// 64.50).
    pub(super) fn query_hole(&self) -> u128 {
        let p = &self.parts;
        if p.scaled > 0 && p.gate > p.query {
            u128::from(p.query)
        } else {
            0
        }
    }

    /// The small graph inputs (`memory::Parts::positions`, `cache_indices`) of a split whose
    /// layers read `masks` (full, window): the positions and each cache's cell indices, which
    /// the allocator places first and keeps under the split's rows (alloc traces: 18 KiB
    /// under gemma3's 9.02 MiB on one device, where the rows came to 9.00; 4 copies of a
    /// window cache's 10 KiB under the first of two pipeline devices' 91.04). None without
    /// attention.
    pub(super) fn small_inputs(&self, (full, window): (bool, bool)) -> u128 {
        let p = &self.parts;
        let caches = u128::from(full) + u128::from(window);
        if caches == 0 {
            return 0;
        }
        u128::from(p.positions) + caches * u128::from(p.cache_indices)
    }

    pub(super) fn runs_attention(&self, mut layers: Range<u32>) -> bool {
        layers.any(|il| self.attends(il))
    }

    fn attends(&self, il: u32) -> bool {
        self.parts.kv.get(il as usize).is_some_and(|b| *b > 0)
    }
}
