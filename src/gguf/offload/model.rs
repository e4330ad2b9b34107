//! The model's parts by layer and the engine's placement of them: which device each tensor,
//! KV cache and recurrent state is on (`device_of`, after `get_layer_buft_list`), and the
//! compute buffers each device reserves (`Model::compute`).

use std::ops::Range;

mod attention;
mod copies;
mod fused;
mod home;
mod host;
mod latent;
mod op_offload;
mod scan;

use super::{Backend, DeviceShare, HostShare, Placement};
use crate::gguf::bounds::{MAX_SLOTS, MAX_UBATCH};
use crate::gguf::header::Header;
use crate::gguf::memory::{self, Flags, Parts, repack};
use attention::{Unfused, attention_rows};
use home::{Home, each_block_weight, home};

/// Copies of each split's inputs the scheduler keeps when it pipelines several GPUs
/// (`GGML_SCHED_MAX_COPIES`).
const PIPELINE_COPIES: u128 = 4;
/// The CUDA backend takes over a matrix multiply whose weight is in host memory from this many
/// tokens on (`GGML_OP_OFFLOAD_MIN_BATCH`, `ggml_backend_cuda_device_offload_op`).
const OP_OFFLOAD_MIN_BATCH: u64 = 32;
/// The model's parts by layer, computed once for any number of placements.
pub(super) struct Model {
    pub(super) n_layer: u32,
    /// Weights of each block, its largest tensor, and its largest attention weight (whose
    /// copy's freed place a mask copied in after it may take; `copies`).
    weights: Vec<u64>,
    largest: Vec<u64>,
    attention: Vec<u64>,
    /// Weights of the input layer (and of blocks the model does not have).
    input: u64,
    output: u64,
    output_largest: u64,
    /// `token_embd`'s bytes when it doubles as the output (no `output.weight`), else 0.
    tied: u64,
    /// The last block's attention phase for one ubatch (`last_attention`); 0 where the block is
    /// not plain attention.
    last_attention: u128,
    /// Each block's attention projections under flash attention (`attention::projections`);
    /// 0 where the block does not attend.
    projections: Vec<u128>,
    /// Each block's key and value rows the host keeps under op offload (`attention::copied_back`).
    copied_back: Vec<u128>,
    /// An attention layer's buffers without flash attention; None without attention.
    unfused: Option<Unfused>,
    /// A latent cache's query rows on the first GPU under op offload; None without one.
    latent_query: Option<latent::Query>,
    /// A fused gate and up projection's rows under op offload; None without one.
    fused_up: Option<fused::FusedUp>,
    /// Each block's weights copied in around a host mamba2 layer (`scan::scan_weights`);
    /// empty without such layers.
    scan_weights: Vec<(u64, u64)>,
    /// Whether a device keeps the hole its split's input leaves below the FFN rows
    /// (`Model::keeps_input_hole`).
    input_hole: bool,
    /// Whether any block's FFN has a gate (`ffn_gate`).
    gated: bool,
    parts: Parts,
    /// The settings as `memory` bounds them.
    ubatch: u64,
    parallel: u64,
    cpu: repack::Tiers,
    backend: Backend,
}

impl Model {
    pub(super) fn new(h: &Header, f: &Flags, backend: Backend) -> Model {
        let parts = memory::parts(h, f);
        // `parts` has one entry per block (at most MAX_LAYERS), none in the fallback.
        let n = parts.kv.len();
        let mut m = Model {
            n_layer: u32::try_from(n).unwrap_or(0),
            weights: vec![0; n],
            largest: vec![0; n],
            attention: vec![0; n],
            input: 0,
            output: 0,
            output_largest: 0,
            tied: 0,
            last_attention: 0,
            projections: Vec::new(),
            copied_back: Vec::new(),
            unfused: None,
            latent_query: None,
            fused_up: None,
            scan_weights: Vec::new(),
            input_hole: false,
            gated: false,
            parts,
            ubatch: f.ubatch.min(MAX_UBATCH),
            parallel: f.parallel.clamp(1, MAX_SLOTS),
            cpu: f.cpu,
            backend,
        };
        let has_output = h.tensors.iter().any(|t| t.name == "output.weight");
        let mut gated = false;
        for t in &h.tensors {
            gated |= t.name.ends_with(".ffn_gate.weight");
            let b = memory::tensor_bytes(t).unwrap_or(0);
            match home(&t.name, n) {
                Home::Input => {
                    m.input = m.input.saturating_add(b);
                    if !has_output && t.name == "token_embd.weight" {
                        m.tied = b;
                    }
                }
                Home::Output => {
                    m.output = m.output.saturating_add(b);
                    m.output_largest = m.output_largest.max(b);
                }
                Home::Layer(il) => {
                    m.weights[il] = m.weights[il].saturating_add(b);
                    m.largest[il] = m.largest[il].max(b);
                    if copies::projects_attention(&t.name) {
                        m.attention[il] = m.attention[il].max(b);
                    }
                }
            }
        }
        m.output_largest = m.output_largest.max(m.tied);
        let rows = attention_rows(h, &m.parts, m.ubatch);
        (m.last_attention, m.projections, m.copied_back) =
            (rows.last, rows.projections, rows.copied_back);
        m.unfused = Unfused::new(h, &m.parts, m.ubatch);
        m.fused_up = fused::FusedUp::of(h, m.ubatch, n);
        if m.parts.scan.offloaded > 0 {
            m.scan_weights = scan::scan_weights(h, n);
        }
        if m.parts.latent_cache {
            m.latent_query = latent::Query::of(h, m.parts.residual, m.ubatch, n);
        }
        m.input_hole = m.keeps_input_hole(gated);
        m.gated = gated;
        m
    }

    /// Whether a device outside a pipeline keeps, at its peak, the hole that its split's input
    /// (the residual rows copied in) leaves when its first layer frees it: a dense model whose
    /// FFN has a gate (llama, qwen2, mistral, ...) keeps its FFN input and norm in other
    /// residual-wide places, and its gate, up and product rows, wider than the hole, go above
    /// them, so the device peaks at the CPU's own figure (GGML_ALLOCATOR_DEBUG's layouts of
    /// llama-server over an rpc-server device: 9 of 9 llama and qwen2 shapes of widths 64 to
    /// 512 and n_ff of 2x to 4x, each one residual row above `memory`'s activations less the
    /// embeddings input). A fused up projection (phi3) takes the hole for its norm, a model
    /// scaling its embeddings counts the row as `memory::Parts::scaled`, and MoE blocks,
    /// latent attention and recurrent layers lay their rows out otherwise.
    fn keeps_input_hole(&self, gated: bool) -> bool {
        let p = &self.parts;
        gated && p.moe_tail == 0 && p.latent_compute == 0 && p.scaled == 0 && !self.any_recurrent()
    }

    /// The GPU of layer `il` (the output layer is `n_layer`), as `get_layer_buft_list` picks
    /// it; None: the host.
    fn device_of(&self, il: u32, ngl: u32, cumulative: &[f32]) -> Option<usize> {
        let all = i64::from(self.n_layer) + 1;
        let start = (all - i64::from(ngl)).max(0);
        let active = i64::from(ngl).min(all);
        let k = i64::from(il) - start;
        if cumulative.is_empty() || k < 0 || k >= active {
            return None;
        }
        let at = k as f32 / active as f32;
        let gpu = cumulative.partition_point(|p| *p <= at);
        Some(gpu.min(cumulative.len() - 1))
    }

    /// The shares of `gpus` GPUs and of the host, but the host's repack and total (which need
    /// the header): cheap enough to try many `ngl`s. The GPUs with a share in `cumulative` take
    /// layers; none does when it is empty.
    pub(super) fn shares(&self, ngl: u32, gpus: usize, cumulative: &[f32]) -> Shares {
        self.shares_as(ngl, gpus, cumulative, true)
    }

    /// [`Model::shares`], with flash attention on whatever the placement (`unfused` false):
    /// what `--fit` compares, as it never keeps a placement that turns it off.
    pub(super) fn shares_as(
        &self,
        ngl: u32,
        gpus: usize,
        cumulative: &[f32],
        unfused: bool,
    ) -> Shares {
        let mut devices = vec![DeviceShare::default(); gpus];
        // The masks each GPU's layers read (full, window), then the host's layers' ones.
        let mut masks = vec![(false, false); gpus + 1];
        let mut host = HostShare {
            weights: self.input,
            ..HostShare::default()
        };
        let (mut host_largest, mut host_blocks, mut output_copy) = (0u64, false, 0u64);
        for il in 0..self.n_layer {
            let i = il as usize;
            let at = |v: &[u64]| v.get(i).copied().unwrap_or(0);
            let (w, kv, rec) = (
                self.weights[i],
                at(&self.parts.kv),
                at(&self.parts.recurrent),
            );
            let gpu = self.device_of(il, ngl, cumulative).filter(|d| *d < gpus);
            let reads = &mut masks[gpu.unwrap_or(gpus)];
            let (full, window) = op_offload::reads(self.parts.mask_layers.get(i));
            (reads.0, reads.1) = (reads.0 || full, reads.1 || window);
            match gpu.and_then(|d| devices.get_mut(d)) {
                Some(s) => {
                    s.layers = extend(&s.layers, il);
                    s.weights = s.weights.saturating_add(w);
                    s.kv = s.kv.saturating_add(kv);
                    s.recurrent = s.recurrent.saturating_add(rec);
                }
                None => {
                    host.layers = extend(&host.layers, il);
                    host.weights = host.weights.saturating_add(w);
                    host.kv = host.kv.saturating_add(kv);
                    host.recurrent = host.recurrent.saturating_add(rec);
                    host_largest = host_largest.max(self.largest[i]);
                    host_blocks = true;
                }
            }
        }
        match self
            .device_of(self.n_layer, ngl, cumulative)
            .and_then(|d| devices.get_mut(d))
        {
            Some(s) => {
                s.output = true;
                output_copy = self.tied;
                s.weights = s
                    .weights
                    .saturating_add(self.output)
                    .saturating_add(self.tied);
            }
            None => {
                host.output = true;
                host.weights = host.weights.saturating_add(self.output);
                host_largest = host_largest.max(self.output_largest);
            }
        }
        let full = !host_blocks && !host.output;
        let fa_off = unfused && self.flash_attention_off(&host);
        self.compute(&mut devices, &masks, &mut host, full, host_largest, fa_off);
        if fa_off {
            self.unfused_compute(&mut devices, &masks, &mut host, host_largest);
        }
        for s in &mut devices {
            s.total = [s.weights, s.kv, s.recurrent, s.compute]
                .iter()
                .fold(0u64, |a, b| a.saturating_add(*b));
        }
        let e = &self.parts.estimate;
        host.checkpoints = e.checkpoints;
        host.output_buffer = e.engine.output;
        host.overhead = self.host_overhead(&host, !devices.is_empty(), full);
        (devices, host, output_copy)
    }

    /// The compute buffers, after the scheduler (`ggml_backend_sched`) that reserves them for
    /// the worst-case graph of one ubatch (`llama_context::sched_reserve`), as llama-server
    /// logged them over llama.cpp's RPC backend. The allocator reuses memory from layer to
    /// layer, so a device that runs any block needs one layer's peak (`memory`'s activations),
    /// however many it holds, less the embeddings input that only the host has, plus the masks
    /// its layers read (and the query's hole where the first block runs or in a pipeline:
    /// `Model::query_hole`), and the small inputs below them (`Model::small_inputs`); the
    /// logits are where the output layer is, after the blocks have freed theirs. Besides:
    /// - the host's buffer holds the graph's inputs: the ubatch's embeddings twice (the
    ///   embeddings input and the rows gathered from `token_embd`), the masks, the token ids
    ///   and the small inputs; with layers
    ///   of its own it runs them as the CPU alone does (`memory`'s compute), but for latent
    ///   attention after one MoE block at most (`Model::latent_unfragmented`), which a device
    ///   outside a pipeline reaches too; a device running the attention after two, the second
    ///   its own, holds the fitted rows whole (`Model::latent_fragmented`);
    /// - pipeline parallelism (several GPUs, everything offloaded; `llama_context`'s
    ///   constructor) keeps `PIPELINE_COPIES` copies of each split's inputs, allocated first
    ///   and never freed, so still there beside the logits: the residual (on the first device
    ///   below its block's rows, but for a scan's or latent attention's fitted ones, which
    ///   hold one) and the masks, and where a mamba2 layer ends one device's run and
    ///   another begins the next, the in-projection on the next device and its gate back on
    ///   the first (`memory::Scan`);
    /// - a device running mamba2 layers needs their chain (`memory::Scan`) above the residual
    ///   rows the allocator leaves below it (measured): four where the first block runs outside
    ///   a pipeline (the embeddings' copy, the layer's input and the two rows the layer before
    ///   freed), three above a pipeline's inputs (`Model::beside_pipeline_scan`), and the
    ///   conv state's rows the layer gathers for its slots (`memory::Scan::state_rows`) among
    ///   them (mamba2-bench: its in-projection at 6.04 MiB, above four 1.5 MiB rows); where
    ///   two such layers follow each other in a hybrid block, the second's in-projection lands
    ///   above the first's scan output (`memory::Scan::follow`), and above the masks where they
    ///   come between two attention layers on the device (`Model::masks_under_scans`);
    /// - outside a pipeline, with flash attention, a device whose first layer is its only
    ///   attending one frees the masks after that attention (their last reader) and runs the
    ///   layers after it in their place (`attention::projections`);
    /// - in a partial offload whose host ends with a MoE block, the first device runs that
    ///   block's tail (`memory::Parts::moe_tail`);
    /// - a host whose only block is a mamba2 layer before a GPU's recurrent one hands that
    ///   layer's gate to the GPU: its peak is the chain alone (`memory::Scan::handing_over`),
    ///   and under op offload the first GPU runs the chain as a first block does;
    /// - op offload (where the backend has it): a prompt's matrix multiplies whose weights are
    ///   in host memory run on the first GPU (`ggml_backend_sched_backend_id_from_cur`,
    ///   "1.off"), which copies the weight into its compute buffer (the largest such weight,
    ///   beside a host block's FFN rows), and the weightless operations between them follow it
    ///   there, a host layer's attention with its mask and KV cache copied in
    ///   (`Model::offloaded_attention`; a latent cache beside the query rows it leaves a
    ///   place below, `Model::offloaded_latent`); its own layers' FFN then lands above the masks
    ///   (`Model::own_after_host_attention`), and a hybrid's own scan after a host block
    ///   above the mask where the mask does not fit that block's freed FFN rows
    ///   (`Model::own_scan_after_host_block`);
    ///   the host runs only the token-by-token graph of its layers, keeping the key and value
    ///   rows the GPU copies back for its KV cache (`attention::copied_back`), but for a model
    ///   with recurrent layers, whose scans it runs (`Model::host_prompt`). RPC devices given
    ///   CUDA's offload rule (testbed/rpc-offload.py) logged every CUDA0 and host compute buffer of
    ///   testbed/gpu-check.sh's H200 runs exactly; these were traced on them, and
    ///   tests/offload_engine.rs holds the placement to them.
    ///
    /// Without GPUs it is `memory`'s compute figure.
    fn compute(
        &self,
        devices: &mut [DeviceShare],
        masks: &[(bool, bool)],
        host: &mut HostShare,
        full: bool,
        largest: u64,
        fa_off: bool,
    ) {
        let p = &self.parts;
        if devices.is_empty() {
            host.compute = p.estimate.compute;
            return;
        }
        let (residual, logits) = (u128::from(p.residual), u128::from(p.logits));
        let all_masks = u128::from(p.masks);
        let block = self.block_rows();
        let first = |s: &DeviceShare| s.layers.start == 0 && !s.layers.is_empty();
        let op_offload = self.backend.op_offload && !full && self.ubatch >= OP_OFFLOAD_MIN_BATCH;
        let pipeline = full && devices.len() > 1;
        let copies = if pipeline { PIPELINE_COPIES } else { 1 };
        let boundary = if pipeline {
            self.scan_boundaries(devices)
        } else {
            vec![0; devices.len()]
        };
        for (d, s) in devices.iter_mut().enumerate() {
            let m = self.mask_bytes(masks.get(d).copied().unwrap_or_default());
            let blocks = !s.layers.is_empty();
            // Outside a pipeline the split's copy of the masks is freed before the logits.
            let masks_freed = if pipeline { 0 } else { m };
            // The traced latent rows hold the graph's small inputs already.
            let mut inputs_counted = false;
            let piped = self.pipeline_latent(&s.layers, pipeline);
            // The model's last block alone: its FFN runs on the output rows only
            // (`inp_out_ids`), so the attention sets the peak.
            let phase = if self.last_only(&s.layers) {
                self.last_attention
            } else if self.input_hole && !pipeline {
                block + residual
            } else if self.latent_unfragmented(&s.layers) && !pipeline {
                inputs_counted = true;
                u128::from(p.latent_rows)
            } else if self.latent_fragmented(&s.layers) {
                u128::from(p.activations)
            } else if let Some(rows) = piped {
                rows
            } else {
                block
            };
            let mut c = match self.lone_attention(&s.layers) {
                Some(a) if !pipeline && !fa_off => (a + m).max(block),
                _ if blocks => phase + masks_freed,
                _ => 0,
            };
            if blocks && (pipeline || first(s)) {
                c += self.query_hole();
            }
            // A mamba2 layer's chain over the residual rows and the conv state's rows below it:
            // the device's peak where the layer is the whole block, else a floor under
            // `memory`'s fitted one; a device past the host's blocks, outside a pipeline, keeps
            // the fitted peak, but the first GPU under op offload given the gate (mamba2-bench,
            // `-ngl 8 -ts 2,1`: its layer 3's chain over 4 residual rows and layer 1's conv
            // state rows, 24.13 MiB against the fitted 22.89; alloc trace).
            let handed = d == 0 && op_offload && self.hands_over_gate(host);
            let below = match (pipeline, first(s) || handed) {
                (true, _) => self.beside_pipeline_scan(&s.layers, first(s)),
                (false, true) => 4 * residual,
                (false, false) => 0,
            };
            if below > 0 && self.runs_scan(&s.layers) {
                let scan = below + p.scan.state_rows + p.scan.chain;
                c = if p.scan.alone { scan } else { c.max(scan) };
                if self.runs_scans_in_a_row(&s.layers) {
                    // Outside a pipeline (which counts its copies of the masks below), the
                    // masks a later attention reads lie under the second scan's rows where an
                    // attention before them left its holes.
                    let held = if !pipeline && self.masks_under_scans(&s.layers) {
                        m
                    } else {
                        0
                    };
                    c = c.max(below + p.scan.follow + held);
                }
            }
            if !s.layers.is_empty() && s.layers.start == host.layers.end && self.moe(host) {
                c = c.max(u128::from(p.moe_tail) + m);
            }
            if s.output {
                // The output layer's rows: outside a pipeline, the last block's output where
                // blocks run here; alone here outside a pipeline, only the output norm's rows
                // copied in (qwen2-wide, 2:1: 0.01 MiB, `norm#0` and the logits; alloc trace).
                let rows = if blocks && !pipeline { residual } else { 0 };
                let outs = if blocks || pipeline { 2 } else { 1 };
                c = c.max(logits + rows + outs * u128::from(p.out_rows));
            }
            if pipeline {
                // The first device's four copies of its input lie below its block too, whose
                // own residual rows are the attention's output and its norm's hole (llama-tiny,
                // 1:3: 17.54 MiB logged, one row less counted; gemma's scaled rows had stood in
                // for it); a scan's or latent attention's fitted rows hold one of them, but for
                // the chain of a model without attention (`Model::scan_above_every_copy`) and
                // latent attention whose rows are counted above the copies (after two MoE
                // blocks, `Model::latent_fragmented`; else `Model::pipeline_latent`).
                let fitted = (self.any_recurrent() && !self.scan_above_every_copy(&s.layers))
                    || (p.latent_compute > 0
                        && !self.latent_fragmented(&s.layers)
                        && piped.is_none());
                // A device with the output layer alone copies in the gathered output rows, the
                // output phase's own input row one of them (deepseek2-bench, 1:1:1: 1.01 MiB).
                let (rows, input) = match (blocks, first(s) && fitted) {
                    (false, _) => (copies - 1, u128::from(p.out_rows)),
                    (true, true) => (copies - 1, residual),
                    (true, false) => (copies, residual),
                };
                c += rows * input + copies * m + boundary.get(d).copied().unwrap_or(0);
            }
            let mut reads = masks.get(d).copied().unwrap_or_default();
            if d == 0 && op_offload {
                let peak;
                (peak, reads) = self.first_gpu_peak(&s.layers, masks, host, largest);
                c = c.max(peak);
                if host.output {
                    c += logits;
                }
            }
            if (blocks || (d == 0 && op_offload)) && !inputs_counted {
                c += copies * self.small_inputs(reads);
            }
            s.compute = clamp(c);
        }
        // The host's inputs: the token ids (i32) and the small ones beside the embeddings and
        // masks, each of them copied for a pipeline.
        let small =
            4 * u128::from(self.ubatch) + self.small_inputs((p.mask_full > 0, p.mask_window > 0));
        let inputs = 2 * residual + all_masks + small;
        host.compute = if full {
            clamp(inputs + (copies - 1) * (residual + all_masks + small))
        } else if !op_offload {
            if self.hands_over_gate(host) {
                clamp(p.scan.handing_over(residual, u128::from(self.ubatch)))
            } else if self.latent_unfragmented(&host.layers) && !host.output {
                p.latent_compute
            } else if self.runs_scans_in_a_row(&host.layers) {
                // Above its inputs, the host's second scan in a row (`memory::Scan::follow`)
                // and the first one's output below it (granitehybrid-tiny, `-ngl 3 -ts 1,1`:
                // 6.05 MiB logged, 5.84 at memory's fitted figure; alloc trace).
                p.estimate
                    .compute
                    .max(clamp(inputs + residual + p.scan.follow))
            } else {
                p.estimate.compute
            }
        } else {
            // The token-by-token graph (one token per slot, under the op-offload batch) stays
            // here, with its logits when the output layer does.
            let tokens = u128::from(self.parallel.min(self.ubatch));
            let back = host
                .layers
                .clone()
                .filter_map(|il| self.copied_back.get(il as usize).copied())
                .max()
                .unwrap_or(0);
            let mut c = inputs
                + back
                + u128::from(p.activations)
                    .checked_div(u128::from(self.ubatch))
                    .unwrap_or(0)
                    * tokens;
            if host.output {
                c += u128::from(p.estimate.engine.output);
            }
            if self.host_runs_prompts(host) {
                c = c.max(self.host_prompt(host, inputs));
            }
            clamp(c)
        };
    }

    /// Whether the host's last block is a MoE layer (`memory::Parts::moe_tail`).
    fn moe(&self, host: &HostShare) -> bool {
        let p = &self.parts;
        !host.layers.is_empty() && p.moe_tail > 0 && u64::from(host.layers.end) > p.dense_lead
    }

    /// The whole placement: the shares, the host's repack and its total.
    pub(super) fn placement(
        &self,
        ngl: u32,
        split: &[f64],
        cumulative: &[f32],
        h: &Header,
    ) -> Placement {
        let (devices, mut host, output_copy) = self.shares(ngl, split.len(), cumulative);
        let (repack, tier) = self.host_repack(h, &devices, &host);
        host.repack = repack;
        if !split.is_empty() {
            host.runtime = self.backend.runtime_host
                + if self.any_recurrent() {
                    self.backend.runtime_host_recurrent
                } else {
                    0
                };
        }
        host.mapped = match tier {
            Some(tier) => self.host_mapped(h, &host, tier),
            None => host.weights,
        };
        let parts = [
            host.mapped,
            host.repack,
            host.kv,
            host.recurrent,
            host.checkpoints,
            host.compute,
            host.output_buffer,
            host.overhead,
            host.runtime,
        ];
        let sum: u128 = parts.iter().map(|b| u128::from(*b)).sum();
        host.total = clamp(sum.div_ceil(1 << 20) << 20);
        let on_gpus: u32 = devices.iter().map(|d| d.layers.len() as u32).sum();
        let flash_attention_off = self.flash_attention_off(&host);
        Placement {
            ngl: on_gpus + u32::from(devices.iter().any(|d| d.output)),
            n_layer: self.n_layer,
            split: split.to_vec(),
            devices,
            host,
            output_copy,
            fallback: self.parts.estimate.fallback,
            flash_attention_off,
        }
    }
}

/// The GPUs' shares, the host's, and the bytes of the tied output's copy on a GPU.
pub(super) type Shares = (Vec<DeviceShare>, HostShare, u64);

/// `r` grown to hold `il`, the layers coming in order.
fn extend(r: &Range<u32>, il: u32) -> Range<u32> {
    if r.is_empty() {
        il..il + 1
    } else {
        r.start..il + 1
    }
}

/// A byte count within `u64`.
fn clamp(n: u128) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}
