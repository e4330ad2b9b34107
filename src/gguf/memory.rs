//! The memory a llama-server replica needs, from the GGUF header alone: weights from the tensor
//! infos, KV cache per layer (GQA widths, per-layer head counts, sliding-window layers, MLA),
//! recurrent state of recurrent and hybrid models, the CPU repack copy (`repack`), compute and
//! output buffers, and the engine's memory outside its buffers (`engine`). Formulas follow
//! llama.cpp b6975+ (context padded to 256 cells, one stream per slot).
//!
//! Every hyper-parameter is read through its bound (`hparams::Hp`) and the arithmetic is in
//! `u128`, where the bounded factors cannot overflow; so the estimate never panics, overflows or
//! loops more than `MAX_LAYERS` times, whatever the header says.

mod arch;
mod basis;
pub mod engine;
mod fallback;
mod latent;
pub mod repack;
mod ssm;
#[cfg(test)]
mod tests;

use super::bounds::{
    BLOCK_COUNT, BoundsError, EMBEDDING, EXPERT_COUNT, EXPERT_FEED_FORWARD, EXPERT_SHARED,
    EXPERT_USED, FEED_FORWARD, FULL_ATTENTION_INTERVAL, HEAD_COUNT, HEAD_COUNT_KV, KEY_LENGTH,
    KEY_LENGTH_MLA, KEY_LENGTH_SWA, LEADING_DENSE, MAX_CTX_SIZE, MAX_ESTIMATE, MAX_SLOTS,
    MAX_TENSOR_ELEMENTS, MAX_UBATCH, RECURRENT_LAYERS, SLIDING_WINDOW, SLIDING_WINDOW_PATTERN,
    SSM_DT_RANK, SSM_GROUPS, SSM_INNER, SSM_STATE, VALUE_LENGTH, VALUE_LENGTH_SWA,
};
use super::header::{Header, TensorInfo};
use super::hparams::{self, Hp};
use super::support::ggml_type;
use crate::units::human_bytes;
use arch::{HYBRID_BY_INTERVAL, HYBRID_BY_KV0, NO_KV, RECURRENT, SCALED_EMBEDDINGS, swa_defaults};
use basis::{engine_basis, repack_basis};
pub(crate) use latent::traced_ids;
pub(crate) use ssm::Scan;
use ssm::{recurrent_state, scan};

const KV_ELEMENT_BYTES: u128 = 2; // f16, llama-server's default cache type
const STATE_ELEMENT_BYTES: u128 = 4; // recurrent state is always f32
const PAD: u128 = 256;
/// llama-server reserves logits for its slots only from this build on (before: for a whole
/// ubatch, as llama-fit-params still does).
pub const OUTPUTS_PER_SLOT_FROM: u32 = 9460;
/// MLA caches keep no V from this build on.
const MLA_NO_V_FROM: u32 = 7832;
/// llama-server keeps context checkpoints from this build on (`--swa-checkpoints`): copies of a
/// slot's sliding-window cache and recurrent state, the parts it cannot roll back, so a later
/// prompt with the same prefix need not be read again. They grow with use up to the count per
/// slot (3 at first, 32 since b8218), so the Catalog stage sets the count.
pub const CHECKPOINTS_FROM: u32 = 6160;
/// The flag is `--ctx-checkpoints` from this build on.
pub const CTX_CHECKPOINTS_FLAG_FROM: u32 = 6685;
/// Context checkpoints per slot that the Catalog stage passes: the latest prompt's and one
/// before it.
pub const CTX_CHECKPOINTS: u64 = 2;
/// Bytes a checkpoint keeps per cell beside its K and V rows: the position (i32), the count of
/// sequences (u32) and the one sequence id (i32) that llama_kv_cache::state_write_meta writes.
const CHECKPOINT_CELL_META: u128 = 12;

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
    /// The CPU code the replicas may run, capped by the engine's (the largest repack counts).
    pub cpu: repack::Tiers,
    /// The most logical CPUs of a node the replicas may run on (`engine::threads`).
    pub cpus: u64,
}

impl Flags {
    /// The settings within their bounds (`MAX_*`, `engine::MAX_CPUS`).
    pub fn check(&self) -> Result<(), BoundsError> {
        for (flag, value, limit) in [
            ("the context size (--ctx-size)", self.ctx_size, MAX_CTX_SIZE),
            ("the slot count (--parallel)", self.parallel, MAX_SLOTS),
            (
                "the micro-batch size (--ubatch-size)",
                self.ubatch,
                MAX_UBATCH,
            ),
            ("the node's CPU count", self.cpus, engine::MAX_CPUS),
        ] {
            if value > limit {
                return Err(BoundsError::Setting { flag, value, limit });
            }
        }
        Ok(())
    }
}

/// The estimate and what it counted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Estimate {
    pub weights: u64,
    /// The CPU repack copy of some weights (resident besides their mapped file pages).
    pub repack: u64,
    /// The tier the repack is counted for.
    pub repack_tier: repack::Tier,
    pub kv: u64,
    pub recurrent: u64,
    /// Context checkpoints: [`CTX_CHECKPOINTS`] copies per slot of its recurrent state and of the
    /// sliding-window cells its window still sees, at most.
    pub checkpoints: u64,
    /// The sliding-window tokens of a slot that one checkpoint holds once the slot has read
    /// that many (0 without sliding-window layers).
    pub checkpoint_window: u64,
    pub compute: u64,
    /// The engine's memory outside the model, KV and compute buffers, part by part.
    pub engine: engine::Engine,
    /// `engine`'s total.
    pub overhead: u64,
    pub total: u64,
    /// KV bytes one more token of context costs (full-attention layers).
    pub kv_bytes_per_token: u64,
    /// True when the header lacked a shape and a rough rule stood in.
    pub fallback: bool,
    /// What was counted, as a sentence.
    pub basis: String,
}

fn pad(n: u128) -> u128 {
    n.div_ceil(PAD) * PAD
}

/// A byte count of the estimate: at most `MAX_ESTIMATE`, which `estimate_checked` refuses.
fn bytes(n: u128) -> u64 {
    u64::try_from(n.min(MAX_ESTIMATE.into())).unwrap_or(MAX_ESTIMATE)
}

/// Estimates the memory of one replica, for any header and settings: values beyond their
/// bounds are clamped to them and the figures to `MAX_ESTIMATE`. For a header and settings that
/// `estimate_checked` accepts, nothing is clamped.
pub fn estimate(h: &Header, f: &Flags) -> Estimate {
    parts(h, f).estimate
}

/// The estimate, or the bound that the header or the settings exceed: the header's counts
/// (`hparams::validate`), the settings (`Flags::check`) and the total (`MAX_ESTIMATE`).
pub fn estimate_checked(h: &Header, f: &Flags) -> Result<Estimate, BoundsError> {
    hparams::validate(h)?;
    f.check()?;
    let Parts {
        estimate: e,
        unclamped: total,
        ..
    } = parts(h, f);
    if total > u128::from(MAX_ESTIMATE) {
        return Err(BoundsError::AboveLimit {
            field: "the estimated memory of a replica".into(),
            value: total,
            limit: MAX_ESTIMATE,
            unit: "bytes",
        });
    }
    Ok(e)
}

/// The estimate and what it is made of, layer by layer where the engine keeps a part with its
/// layer: what `offload` needs to put each part on the device that holds it.
pub(crate) struct Parts {
    pub estimate: Estimate,
    /// The estimate's total before clamping.
    pub unclamped: u128,
    /// Bytes of each layer's KV cache (`block_count` entries; none in the fallback).
    pub kv: Vec<u64>,
    /// Bytes of each layer's values in its KV cache (none where attention reads them from the
    /// keys' rows).
    pub kv_values: Vec<u64>,
    /// Bytes of each layer's recurrent state, all slots together.
    pub recurrent: Vec<u64>,
    /// The compute buffer's parts (it is the larger of activations, `scaled` and masks, and of
    /// logits, two residual rows and `out_rows`): the logits of the reserved outputs, the widest layer's
    /// activations for one ubatch, and the attention masks (f16) of one ubatch.
    pub logits: u64,
    pub activations: u64,
    pub masks: u64,
    /// The masks' parts: of the full-attention cache, and of the sliding-window cache.
    pub mask_full: u64,
    pub mask_window: u64,
    /// The mask each layer reads (`block_count` entries; none in the fallback).
    pub mask_layers: Vec<Mask>,
    /// One ubatch of the residual stream (n_embd f32 per token).
    pub residual: u64,
    /// One ubatch of the widest layer's query rows (heads by key width, f32).
    pub query: u64,
    /// The FFN phase of `activations` alone (dense or MoE; no scan, no latent attention): the
    /// rows a hybrid model's host layer leaves below its attention's copies on a GPU under op
    /// offload (`offload`), where the scan phase is not alive.
    pub ffn: u64,
    /// One ubatch of the widest dense FFN's gate rows (n_ff f32 per token).
    pub gate: u64,
    /// One ubatch of scaled token embeddings where the first block runs (`SCALED_EMBEDDINGS`).
    pub scaled: u64,
    /// The small graph inputs a split running attention layers reads, allocated before its
    /// rows and kept: the ubatch's positions (i32), and per KV cache its layers write (full,
    /// window) each token's key and value cell (i64 each, flash attention's layout; a latent
    /// cache has keys only). 0 without attention.
    pub positions: u64,
    pub cache_indices: u64,
    /// The residual rows of the reserved outputs (n_embd f32 each).
    pub out_rows: u64,
    /// A mamba2 layer's rows on a device.
    pub scan: Scan,
    /// A MoE block's tail (the weighted sum of its experts and the residual add) has no
    /// weight, so where the host's last block is one, the first device after it runs the tail:
    /// its split starts with that block's expert outputs and residual, below the masks; the
    /// next block's gate rows then land below the masks and its up rows above, and its
    /// down projection, finding no place, above them. Those rows, without the masks.
    pub moe_tail: u64,
    /// The leading blocks of a MoE model whose FFN is dense.
    pub dense_lead: u64,
    /// The compute figure of a buffer whose latent attention runs after one MoE block at most
    /// (`latent::Phases::traced`); 0 without it.
    pub latent_compute: u64,
    /// Its rows alone, without the masks (a device's copy of them is counted with the device).
    pub latent_rows: u64,
    /// Whether the KV cache is latent (MLA without V, from `MLA_NO_V_FROM` on): attention reads
    /// its values as a view of the keys' rows.
    pub latent_cache: bool,
}

/// The attention mask a layer reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mask {
    /// None: no KV cache (a recurrent layer).
    None,
    Full,
    Window,
}

/// The estimate and its parts.
pub(crate) fn parts(h: &Header, f: &Flags) -> Parts {
    let (weights, unknown_types) = weights(h);
    let hp = Hp::new(h);
    let arch = hp.arch;
    let parallel = u128::from(f.parallel.clamp(1, MAX_SLOTS));
    let ubatch = u128::from(f.ubatch.min(MAX_UBATCH));
    let n_ctx = pad(f.ctx_size.clamp(1, MAX_CTX_SIZE).into());
    let n_ctx_seq = pad(n_ctx / parallel);
    let vocab = u128::from(hp.vocab());
    let n_out = if f.build >= OUTPUTS_PER_SLOT_FROM {
        parallel
    } else {
        ubatch
    };

    let (Some(n_layer), Some(n_embd)) = (hp.u(&BLOCK_COUNT), hp.u(&EMBEDDING)) else {
        return fallback::parts(h, weights, arch, f);
    };
    let n_embd_w = u128::from(n_embd);
    let n_head0 = hp.per_layer(&HEAD_COUNT, 0).unwrap_or(0);
    let head_k = u128::from(
        hp.u(&KEY_LENGTH)
            .or_else(|| n_embd.checked_div(n_head0))
            .unwrap_or(0),
    );
    let head_v = hp.u(&VALUE_LENGTH).map_or(head_k, u128::from);
    let head_k_swa = hp.u(&KEY_LENGTH_SWA).map_or(head_k, u128::from);
    let head_v_swa = hp.u(&VALUE_LENGTH_SWA).map_or(head_v, u128::from);
    let mla = hp.get(&KEY_LENGTH_MLA).is_some();
    let latent_cache = mla && f.build >= MLA_NO_V_FROM;
    let (default_swa, default_period) = swa_defaults(arch).unwrap_or((0, 0));
    let n_swa = hp.u(&SLIDING_WINDOW).unwrap_or(default_swa);
    let pattern = hp.get(&SLIDING_WINDOW_PATTERN);
    let interval = hp.u(&FULL_ATTENTION_INTERVAL).unwrap_or(4).max(1);

    let is_swa = |il: u64| -> bool {
        if n_swa == 0 {
            return false;
        }
        match (pattern, hp.flag(&SLIDING_WINDOW_PATTERN, il)) {
            (_, Some(flag)) => flag,
            (Some(_), None) => hp
                .u(&SLIDING_WINDOW_PATTERN)
                .filter(|p| *p > 0)
                .is_some_and(|p| il % p < p - 1),
            (None, None) if arch == "lfm2" || arch == "lfm2moe" => true,
            (None, None) => default_period > 0 && il % default_period < default_period - 1,
        }
    };
    let is_recurrent = |il: u64| -> bool {
        if RECURRENT.contains(&arch) || arch == "falcon-h1" {
            return true;
        }
        if let Some(flag) = hp.flag(&RECURRENT_LAYERS, il) {
            return flag;
        }
        let kv0 = hp.per_layer(&HEAD_COUNT_KV, il) == Some(0);
        match arch {
            a if HYBRID_BY_KV0.contains(&a) => kv0,
            "nemotron_h" | "nemotron_h_moe" => kv0 && hp.per_layer(&FEED_FORWARD, il) == Some(0),
            a if HYBRID_BY_INTERVAL.contains(&a) => !(il + 1).is_multiple_of(interval),
            _ => false,
        }
    };
    let heads_kv = |il: u64| -> u64 {
        hp.per_layer(&HEAD_COUNT_KV, il)
            .or(hp.per_layer(&HEAD_COUNT, il))
            .unwrap_or(0)
    };
    let has_kv = |il: u64| -> bool {
        if NO_KV.contains(&arch) || RECURRENT.contains(&arch) {
            return false;
        }
        (arch == "falcon-h1" || !is_recurrent(il)) && heads_kv(il) > 0
    };

    // Bounded factors: layers <= 2^12, heads <= 2^12, head widths <= 2^17, cells <= 2^27,
    // slots <= 2^16, vocabulary <= 2^22, widths <= 2^20, experts <= 2^12, ubatch <= 2^20: the
    // largest sums below (KV, recurrent state) stay under 2^72, far inside u128.
    let swa_cells = pad(n_ctx_seq.min(u128::from(n_swa) + ubatch)) * parallel;
    let full_cells = n_ctx_seq * parallel;
    let (mut kv, mut per_token, mut swa_layers, mut full_layers) = (0u128, 0u128, 0u64, 0u64);
    let mut swa_row = 0u128;
    let mut kv_layers = vec![0u64; usize::try_from(n_layer).unwrap_or(0)];
    let mut kv_values = vec![0u64; kv_layers.len()];
    let mut mask_layers = vec![Mask::None; kv_layers.len()];
    for (((il, layer_kv), values), mask) in (0..n_layer)
        .zip(kv_layers.iter_mut())
        .zip(kv_values.iter_mut())
        .zip(&mut mask_layers)
    {
        if !has_kv(il) {
            continue;
        }
        let heads = u128::from(heads_kv(il));
        let swa = is_swa(il);
        *mask = if swa { Mask::Window } else { Mask::Full };
        let (hk, hv) = if swa {
            (head_k_swa, head_v_swa)
        } else {
            (head_k, head_v)
        };
        let v_width = if latent_cache { 0 } else { hv * heads };
        let row = (hk * heads + v_width) * KV_ELEMENT_BYTES;
        let cells = if swa { swa_cells } else { full_cells };
        kv += row * cells;
        *layer_kv = bytes(row * cells);
        *values = bytes(v_width * KV_ELEMENT_BYTES * cells);
        if swa {
            swa_row += row;
            swa_layers += 1;
        } else {
            per_token += row;
            full_layers += 1;
        }
    }

    let recurrent_count = (0..n_layer).filter(|il| is_recurrent(*il)).count() as u128;
    let layer_state = recurrent_state(&hp, n_embd_w) * STATE_ELEMENT_BYTES * parallel;
    let recurrent = recurrent_count * layer_state;
    let recurrent_layers = (0..n_layer)
        .map(|il| {
            if is_recurrent(il) {
                bytes(layer_state)
            } else {
                0
            }
        })
        .collect();
    // A checkpoint holds one slot's recurrent state and the cells of its sliding-window cache
    // that the window still sees: the engine writes only the cells within n_swa positions of the
    // slot's latest (llama_kv_cache::state_write skips the masked ones), so at most n_swa of the
    // n_swa + ubatch cells the cache keeps per slot; each written cell also carries its position
    // and sequence id (CHECKPOINT_CELL_META bytes).
    let window_cells = n_ctx_seq.min(u128::from(n_swa));
    let window = if swa_layers > 0 {
        (swa_row + CHECKPOINT_CELL_META) * window_cells
    } else {
        0
    };
    let checkpoints = if f.build >= CHECKPOINTS_FROM {
        u128::from(CTX_CHECKPOINTS) * (window * parallel + recurrent)
    } else {
        0
    };

    let n_ff = (0..n_layer)
        .filter_map(|il| hp.per_layer(&FEED_FORWARD, il))
        .max()
        .map_or(4 * n_embd_w, u128::from);
    let u = |p| hp.u(p).map_or(0, u128::from);
    let n_ff_moe = u(&EXPERT_FEED_FORWARD) * u(&EXPERT_USED);
    let logits = vocab * n_out * 4;
    // The graph allocator's peak for one ubatch, fitted on llama-server's own compute-buffer
    // figures (b11312, CPU and RPC devices) for the test bed's tiny models and the memory
    // benchmark's (widths 768 to 2304), within 5%: the FFN phase keeps three residual-wide rows
    // (the layer's input, the graph's embeddings input and their gathered copy) and the gate,
    // up and product rows alive; recurrent layers keep their projected inputs and scan output
    // instead, and the scan's new state of each slot.
    // MoE layers keep the chosen experts' rows plus the router's logits and probabilities, and
    // two residual rows more (fitted on a 512-wide model using 4 of 16 experts); an all-MoE
    // model (no leading dense layers) has no dense FFN phase at all.
    let experts = u(&EXPERT_COUNT);
    let dense_phase = 3 * n_embd_w + 3 * n_ff;
    let ffn_phase = if experts > 0 {
        let shared = u(&EXPERT_SHARED) * u(&EXPERT_FEED_FORWARD);
        let moe_phase = 5 * n_embd_w + 3 * (n_ff_moe + shared) + 2 * experts;
        if u(&LEADING_DENSE) > 0 {
            moe_phase.max(dense_phase)
        } else {
            moe_phase
        }
    } else {
        dense_phase
    };
    let (ssm_phase, scan_state) = if recurrent_count > 0 {
        (
            4 * n_embd_w + 5 * u(&SSM_INNER) + 2 * u(&SSM_GROUPS) * u(&SSM_STATE) + u(&SSM_DT_RANK),
            layer_state,
        )
    } else {
        (0, 0)
    };
    let latent = mla.then(|| latent::phases(&hp, n_embd_w, u128::from(n_head0), head_k));
    let rest = (ubatch * 4 * ffn_phase).max(ubatch * 4 * ssm_phase + scan_state);
    let activations = rest.max(ubatch * 4 * latent.as_ref().map_or(0, |l| l.fitted));
    // The attention masks are f16 (flash attention, which llama-server turns on where the
    // backend has it), one row per cell of one stream, per cache (full and window).
    let mask_full = if full_layers > 0 {
        ubatch * 2 * n_ctx_seq
    } else {
        0
    };
    let mask_window = if swa_layers > 0 {
        ubatch * 2 * (swa_cells / parallel)
    } else {
        0
    };
    let masks = mask_full + mask_window;
    let attends = full_layers + swa_layers > 0;
    let residual = ubatch * n_embd_w * 4;
    let used = u(&EXPERT_USED);
    let expert_rows = used * u(&EXPERT_FEED_FORWARD) * ubatch * 4;
    let moe_tail = if experts > 0 {
        (2 * used + 1) * residual + 2 * expert_rows
    } else {
        0
    };
    let scaled = if SCALED_EMBEDDINGS.contains(&arch) {
        residual
    } else {
        0
    };
    // The logits come after the last block has freed its rows: the output phase holds them,
    // the embeddings input (two residual rows) and the reserved outputs' rows, the masks freed.
    let out_rows = n_out * n_embd_w * 4;
    let compute_of = |a: u128| (a + scaled + masks).max(logits + 2 * residual + out_rows);
    let compute = compute_of(activations);
    let latent_rows = latent.map_or(0, |l| rest.max(l.traced_bytes(ubatch)));
    let latent_compute = if latent_rows > 0 {
        compute_of(latent_rows)
    } else {
        0
    };
    let head_k0 = head_k * u128::from(n_head0);
    let n_head = (0..n_layer)
        .filter_map(|il| hp.per_layer(&HEAD_COUNT, il))
        .max()
        .unwrap_or(n_head0);
    let query = ubatch * 4 * head_k.max(head_k_swa) * u128::from(n_head);
    let widest = [n_ff, n_embd_w, head_k0, n_ff_moe]
        .into_iter()
        .max()
        .unwrap_or(0);
    let eng = engine::parts(
        h,
        &engine::Shape {
            vocab: hp.vocab(),
            parallel: bytes(parallel),
            ubatch: bytes(ubatch),
            widest: bytes(widest),
            cpus: f.cpus,
        },
    );
    let overhead = u128::from(eng.total());
    let (repack, tier, repacked) = repack::largest(h, f.cpu);
    let total = (weights + u128::from(repack) + kv + recurrent + checkpoints + compute + overhead)
        .div_ceil(1 << 20)
        << 20;

    let mut basis = format!(
        "weights {}{} + KV {} for {} tokens in {} slot(s)",
        human_bytes(bytes(weights)),
        repack_basis(repack, tier, repacked, f.cpu),
        human_bytes(bytes(kv)),
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
            human_bytes(bytes(recurrent))
        );
    }
    if checkpoints > 0 {
        basis += &format!(
            " + context checkpoints {} ({CTX_CHECKPOINTS} per slot of its {})",
            human_bytes(bytes(checkpoints)),
            match (window > 0, recurrent > 0) {
                (true, true) =>
                    format!("last {window_cells} sliding-window tokens and recurrent state"),
                (true, false) => format!("last {window_cells} sliding-window tokens"),
                _ => "recurrent state".to_string(),
            }
        );
    }
    basis += &format!(
        " + compute {} + {}",
        human_bytes(bytes(compute)),
        engine_basis(&eng, h, hp.vocab())
    );
    if unknown_types {
        basis += "; tensors of unknown types counted as 0 bytes";
    }
    let e = Estimate {
        weights: bytes(weights),
        repack,
        repack_tier: tier,
        kv: bytes(kv),
        recurrent: bytes(recurrent),
        checkpoints: bytes(checkpoints),
        checkpoint_window: if window > 0 { bytes(window_cells) } else { 0 },
        compute: bytes(compute),
        engine: eng,
        overhead: bytes(overhead),
        total: bytes(total),
        kv_bytes_per_token: bytes(per_token),
        fallback: false,
        basis,
    };
    Parts {
        estimate: e,
        unclamped: total,
        kv: kv_layers,
        kv_values,
        recurrent: recurrent_layers,
        logits: bytes(logits),
        activations: bytes(activations),
        masks: bytes(masks),
        mask_full: bytes(mask_full),
        mask_window: bytes(mask_window),
        mask_layers,
        residual: bytes(residual),
        query: bytes(query),
        ffn: bytes(ubatch * 4 * ffn_phase),
        gate: bytes(ubatch * 4 * n_ff),
        scaled: bytes(scaled),
        positions: bytes(if attends { ubatch * 4 } else { 0 }),
        cache_indices: bytes(match (attends, latent_cache) {
            (false, _) => 0,
            (true, keys_only) => ubatch * 8 * if keys_only { 1 } else { 2 },
        }),
        out_rows: bytes(out_rows),
        moe_tail: bytes(moe_tail),
        dense_lead: bytes(u(&LEADING_DENSE)),
        scan: scan(&hp, ubatch, parallel),
        latent_compute: bytes(latent_compute),
        latent_rows: bytes(latent_rows),
        latent_cache,
    }
}

/// Bytes of the tensors, each clamped to `MAX_TENSOR_ELEMENTS`, and whether a type is unknown.
fn weights(h: &Header) -> (u128, bool) {
    let mut sum = 0u128;
    let mut unknown = false;
    for t in &h.tensors {
        match tensor_bytes(t) {
            Some(b) => sum += u128::from(b),
            None => unknown = true,
        }
    }
    (sum, unknown)
}

/// Bytes of one tensor, its elements clamped to `MAX_TENSOR_ELEMENTS`; None for a type this
/// build of the table does not know.
pub(crate) fn tensor_bytes(t: &TensorInfo) -> Option<u64> {
    ggml_type(t.ggml_type).map(|ty| ty.bytes(t.elements().min(MAX_TENSOR_ELEMENTS)))
}
