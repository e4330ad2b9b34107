//! What a GPU takes over from the host under op offload, and what the host keeps of it: a host
//! layer's attention with its copies on the first GPU, and a hybrid model's prompt rows on the
//! host (`Model::compute` uses them).

use std::ops::Range;

use super::{HostShare, Model};
use crate::gguf::memory::Mask;

impl Model {
    /// Under op offload, the first GPU's peak while it runs a host layer's attention: the
    /// engine copies in the mask that layer reads (kept until its last reader) and the layer's
    /// whole KV cache, the views flash attention reads, since the KV cache stays in host
    /// memory (`## SPLIT` inputs `cache_k_l0 (view)`, `cache_v_l0 (view)`, `attn_inp_kq_mask`
    /// in llama-server's `GGML_SCHED_DEBUG` log). `largest` is the largest host weight the GPU
    /// copies in.
    ///
    /// Below the copies lie the rows the first attending layer made before them: the graph's
    /// input, its norm and two query rows (the projection and its roped copy); the weights
    /// copied in for the projections are freed by then and their holes reused
    /// (GGML_ALLOCATOR_DEBUG's layouts over an rpc-server device given CUDA's offload rule,
    /// llama at 5.51 MiB, qwen3moe at 6.77 and 26.53 for its first layer). A later layer's key
    /// copy fits in the first one's holes; its value copy fits only where the rows before it
    /// land no higher than the first layer's did, which the router's rows of a MoE block or a
    /// layer's output put higher (qwen3moe at 7.77 and 34.53 MiB, qwen2 at 6.01), and where
    /// not it lands above the mask: counted for every later layer whose cache is no larger
    /// than the first's (llama's fitted, 5.51 MiB). A larger one (gemma3's global layer after
    /// window layers) is counted whole above the rows, as its copies do not fit in the first's
    /// holes. The attention's output (a query's rows) lands on top (gemma3 at 1.76 MiB on the
    /// first of two devices), or in a hole (llama).
    ///
    /// Where a dense model's mask lies above the first layer's copies, what its FFN puts past
    /// them and whether a later layer's key copy lands above the mask too follow
    /// `Model::past_the_copies`; that FFN is then the host blocks' FFN phase, which the bool
    /// returned says. A fused projection's model (phi3) has its own layout, set by where the
    /// mask lands against the freed place of `attn_qkv`'s copy
    /// (`Model::offloaded_fused_attention`).
    /// A latent cache's copies land beside the query rows (`Model::offloaded_latent`). A hybrid
    /// model, and a latent cache whose header lacks the query's shapes, keep the bound traced
    /// before: the rows of memory's activations (the FFN phase, or latent attention's; without
    /// the residual) below the copies, and the weights copied in (`rows_below`).
    pub(super) fn offloaded_attention(&self, host: &HostShare, largest: u64) -> (u128, bool) {
        let p = &self.parts;
        if let Some(q) = self.latent_query.as_ref().filter(|_| !self.any_recurrent()) {
            return (self.offloaded_latent(q, &host.layers), false);
        }
        if !self.host_attention_traced() {
            return (self.rows_below(host, largest), false);
        }
        if let Some(fused) = self.fused_up.as_ref() {
            return (self.offloaded_fused_attention(fused, &host.layers), false);
        }
        let out = u128::from(p.query);
        // Each attending host layer's mask, KV cache and value part.
        let attending: Vec<(usize, u64, u64, u64)> = host
            .layers
            .clone()
            .filter_map(|il| {
                let i = il as usize;
                let values = p.kv_values.get(i).copied().unwrap_or(0);
                Some((i, self.mask_of(i)?, *p.kv.get(i)?, values))
            })
            .collect();
        let Some(&(first, mask, kv, _)) = attending.first() else {
            return (0, false);
        };
        let pre = self.rows_before_copies(Some(first));
        let past = self.past_the_copies(first, mask.into(), kv.into(), largest, host);
        let key = past.is_some_and(|past| past.key);
        let ffn = past.map_or(0, |past| pre + u128::from(mask) + u128::from(kv) + past.ffn);
        let peak = attending
            .iter()
            .enumerate()
            .map(|(k, &(_, mask, own, values))| {
                let later = k > 0 && own <= kv;
                // A later layer's copies above the mask, which lies above the first layer's,
                // leave its output the place below.
                let (below, above, out) = match (later, key) {
                    (true, true) => (kv, own, 0),
                    (true, false) => (own, values, out),
                    (false, _) => (own, 0, out),
                };
                pre + u128::from(mask) + u128::from(below) + u128::from(above) + out
            })
            .max()
            .unwrap_or(0)
            .max(ffn);
        (peak, past.is_some())
    }

    /// Under op offload, the first GPU's peak while it runs the host's layers, and the masks it
    /// holds (`Model::first_gpu_masks`): the host blocks with the weight copied in
    /// (`largest`; `Model::host_blocks_here`), beside the masks copied in for the host (one
    /// only the GPU's own layers read comes with them, after it, where their phase is counted:
    /// after the host's attention, or a hybrid's host block, whose FFN's gate and up rows are
    /// freed by then; granitehybrid-bench, one host block, 2:1, 25.22 MiB logged, 26.98
    /// counted beside them),
    /// or their attention with its copies (which holds what weights it keeps); then its own
    /// layers' FFN above them, or a hybrid model's own first scan above the mask
    /// (`Model::own_scan_after_host_block`).
    pub(super) fn first_gpu_peak(
        &self,
        own: &Range<u32>,
        masks: &[(bool, bool)],
        host: &HostShare,
        largest: u64,
    ) -> (u128, (bool, bool)) {
        let p = &self.parts;
        let reads = self.first_gpu_masks(masks, host);
        let held = self.mask_bytes(reads);
        let after = self.own_after_host_attention(own, host, held);
        let beside_ffn = if after.is_some() || self.host_runs_prompts(host) {
            self.host_masks(masks, host)
        } else {
            reads
        };
        let weight = u128::from(p.scaled) + u128::from(largest);
        let (attention, laid_out) = self.offloaded_attention(host, largest);
        // Where the host's attention laid out its FFN past the copies, that is its FFN phase.
        let ffn = if laid_out {
            0
        } else {
            self.host_blocks_here(own, host, self.mask_bytes(beside_ffn), weight)
        };
        let scan = self.own_scan_after_host_block(own, host, held, largest);
        let peak = ffn
            .max(attention)
            .max(after.unwrap_or(0))
            .max(scan.unwrap_or(0));
        (peak, reads)
    }

    /// Under op offload, the first GPU's peak while it runs the matrix multiplies of the host's
    /// blocks, beside the `masks` it holds then and the `weight` copied in (the largest host
    /// weight, with gemma's scaled embeddings): memory's FFN phase; for mamba2 layers their
    /// projections and convolution (`Model::offloaded_scans`), beside their blocks' FFN phase,
    /// if any (mamba2's blocks have none), the scan's output and new states staying on the
    /// host; for a fused gate and up projection its rows as traced
    /// (`Model::offloaded_fused_ffn`). Where the GPU's own first layer scans after the host's,
    /// its whole chain lands above what they leave: memory's fitted phase with the weight bounds
    /// it (mamba2-bench, half the layers on the host: layer 4's chain above 4.17 MiB, 22.25
    /// logged, 22.89 counted; alloc trace).
    fn host_blocks_here(
        &self,
        own: &Range<u32>,
        host: &HostShare,
        masks: u128,
        weight: u128,
    ) -> u128 {
        let p = &self.parts;
        let fitted = self.block_rows() + masks + weight;
        if p.scan.input > 0 && self.runs_scan(&host.layers) {
            let rows = u128::from(p.ffn).saturating_sub(u128::from(p.residual));
            let ffn = if p.scan.alone {
                0
            } else {
                rows + masks + weight
            };
            let follows = !own.is_empty() && own.start == host.layers.end;
            let own_scan = if follows && self.recurrent(own.start) {
                fitted
            } else {
                0
            };
            ffn.max(self.offloaded_scans(host)).max(own_scan)
        } else if let Some(fused) = self.fused_up.as_ref().filter(|_| !host.layers.is_empty()) {
            self.offloaded_fused_ffn(fused, &host.layers, masks) + weight
        } else {
            fitted
        }
    }

    /// Under op offload, the first GPU's peak where a hybrid model's host block (a mamba2 layer
    /// and its FFN) hands over to its own first layer, a mamba2 layer too, and the mask the GPU
    /// holds (`masks`) is larger than the place the host block's gate and up rows leave: the
    /// mask is copied in while that FFN's product is alive and lands above it, and the GPU's
    /// in-projection and gate copy above the mask; the chain's other rows fit below. Below the
    /// mask: four residual rows (holes of the block's input, norm and scan rows, and its
    /// output), one of the FFN's rows freed and its product, beside the weight copied in
    /// (`largest`). GGML_ALLOCATOR_DEBUG's layouts over two rpc-server devices given CUDA's
    /// offload rule, one host block, `-ts 2,1`: granitehybrid-tiny 5.84 MiB (its 4 MiB mask at
    /// 1.02, 0.57 and 0.25 above it; counted below the mask before, 5.76), the GPU check's
    /// granitehybrid 11.60 (the mask at 4.09, 2.52 and 1.0 above). None elsewhere: where the
    /// mask fits the freed rows' place (granitehybrid-bench: in its gate's, the chain above it,
    /// 25.22 MiB), where the GPU's first layer attends, or the host's last does not scan.
    fn own_scan_after_host_block(
        &self,
        own: &Range<u32>,
        host: &HostShare,
        masks: u128,
        largest: u64,
    ) -> Option<u128> {
        let p = &self.parts;
        let gate = u128::from(p.gate);
        let handed = host
            .layers
            .end
            .checked_sub(1)
            .is_some_and(|il| self.recurrent(il));
        let scans = !own.is_empty() && self.recurrent(own.start) && p.scan.input > 0;
        if !handed || !scans || p.scan.alone || gate == 0 || masks <= 2 * gate {
            return None;
        }
        let below = 4 * u128::from(p.residual) + 2 * gate + u128::from(largest);
        Some(below + masks + p.scan.input + p.scan.gate)
    }

    /// One layer's peak rows on a device: memory's activations less the embeddings input, which
    /// only the host has.
    pub(super) fn block_rows(&self) -> u128 {
        u128::from(self.parts.activations).saturating_sub(u128::from(self.parts.residual))
    }

    /// The bytes of the masks (full, window) `reads`.
    pub(super) fn mask_bytes(&self, (full, window): (bool, bool)) -> u128 {
        let p = &self.parts;
        u128::from(if full { p.mask_full } else { 0 })
            + u128::from(if window { p.mask_window } else { 0 })
    }

    /// Under op offload, the first GPU's peak in its own layers (`own`) after it ran the host's
    /// attention (`Model::offloaded_attention`'s traced case): that attention's rows below the
    /// masks (its input, norm and two query rows) are holes by then, split by the small inputs
    /// copied in among them; every mask the GPU holds (`masks`: one only its own layers read
    /// is copied in with them, above the host's) lies above them, and its own FFN's up rows
    /// and their product above the masks, the gate rows alone fitting in the hole the host's
    /// embeddings copy left (GGML_ALLOCATOR_DEBUG's layouts over rpc-server devices given
    /// CUDA's offload rule, gemma3-tiny with window-attention layers on the host: 6.01 MiB
    /// with the global layer on the device, 2.01 without; both counted below the masks
    /// before). None where that is not traced: a latent cache, a hybrid model, a host that
    /// does not attend, a GPU without layers of its own.
    pub(super) fn own_after_host_attention(
        &self,
        own: &Range<u32>,
        host: &HostShare,
        masks: u128,
    ) -> Option<u128> {
        if own.is_empty()
            || !self.host_attention_traced()
            || !self.runs_attention(host.layers.clone())
        {
            return None;
        }
        Some(self.rows_before_copies(None) + masks + 2 * u128::from(self.parts.gate))
    }

    /// Whether the first GPU's layout around a host layer's attention copies was traced
    /// (`Model::offloaded_attention`): neither a latent cache nor recurrent layers.
    fn host_attention_traced(&self) -> bool {
        !self.parts.latent_cache && !self.any_recurrent()
    }

    /// The rows the first attending host layer (`first`, where known) makes on the first GPU
    /// before its copies: the graph's input, its norm and two query rows (the projection and
    /// its roped copy), or one where the roped copy takes the place of the query weight's copy
    /// (a 1024-wide llama's and a 1536-wide qwen2's, as large as the query or larger: their
    /// copies above three rows, 6.00 and 9.01 MiB; alloc trace).
    fn rows_before_copies(&self, first: Option<usize>) -> u128 {
        let p = &self.parts;
        let query = u128::from(p.query);
        let roped = match first {
            Some(i) if u128::from(self.attention_weight(i)) >= query => 0,
            _ => query,
        };
        2 * u128::from(p.residual) + query + roped
    }

    /// The mask layer `i` reads, in bytes; None for a layer without attention.
    pub(super) fn mask_of(&self, i: usize) -> Option<u64> {
        let p = &self.parts;
        match p.mask_layers.get(i)? {
            Mask::Full => Some(p.mask_full),
            Mask::Window => Some(p.mask_window),
            Mask::None => None,
        }
    }

    /// [`Model::offloaded_attention`] for a hybrid model (or a latent cache without the query's
    /// shapes in its header, `latent::Query`): the rows below, the FFN phase's or latent
    /// attention's where that is larger (memory's activations; a hybrid's scan phase is not
    /// among them), then the mask and the copies, with the weight copied in (and for a host MoE
    /// block, its gate and up experts, both alive below the next attention's copies). Over RPC
    /// devices given CUDA's offload rule: above where the copies partly fit in the rows' holes
    /// (tests/offload_engine.rs lists each with its bound).
    ///
    /// Where the model has recurrent layers, only the host's last layer, next to the GPU's
    /// run: the hybrid granite model ran its other host layers' attention on the CPU
    /// (`Model::host_runs_prompts`).
    fn rows_below(&self, host: &HostShare, largest: u64) -> u128 {
        let p = &self.parts;
        let phase = if self.any_recurrent() {
            p.ffn
        } else {
            p.activations
        };
        let rows = u128::from(phase).saturating_sub(u128::from(p.residual));
        let layers = if self.any_recurrent() {
            host.layers.end.saturating_sub(1).max(host.layers.start)..host.layers.end
        } else {
            host.layers.clone()
        };
        // A latent cache is copied in twice, as the keys' view and the values' view of it,
        // each spanning the layer's cells; from the second attending layer on, one of the two
        // lands above the mask, the first layer's places below it being split by the rows
        // (GGML_ALLOCATOR_DEBUG's layouts of deepseek2 over an rpc-server device, 8192 and
        // 32768 cells: two `(permuted)` copies, and the second layer's second above the mask).
        let attending = layers
            .clone()
            .filter(|il| self.mask_of(*il as usize).is_some())
            .count();
        let copies = match (p.latent_cache, attending) {
            (false, _) => 1,
            (true, 0 | 1) => 2,
            (true, _) => 3,
        };
        let experts = if self.moe(host) { largest } else { 0 };
        let weights = u128::from(largest) + u128::from(experts);
        layers
            .filter_map(|il| {
                let i = il as usize;
                let mask = self.mask_of(i)?;
                Some(rows + u128::from(mask) + copies * u128::from(*p.kv.get(i)?))
            })
            .max()
            .map_or(weights, |a| a + weights)
    }

    /// Whether any layer keeps a recurrent state.
    pub(super) fn any_recurrent(&self) -> bool {
        self.parts.recurrent.iter().any(|b| *b > 0)
    }

    /// Under op offload, whether the host runs its layers' prompt itself: in a model with
    /// recurrent layers the scheduler left rows of the host's layers at the prompt's width on
    /// the CPU, its attention's among them (granitehybrid over RPC devices given CUDA's
    /// offload rule, which matched CUDA0 on an H200: the host's compute 5.5 MiB above the
    /// token-by-token graph from 4096 to 16384 cells, whether the host's layers attend or
    /// not). `Model::host_prompt` says what it holds.
    pub(super) fn host_runs_prompts(&self, host: &HostShare) -> bool {
        self.any_recurrent() && !host.layers.is_empty()
    }

    /// Under op offload, the host's peak where it runs its layers' prompt
    /// (`Model::host_runs_prompts`), above `inputs` (the graph's, with the rows gathered from
    /// `token_embd`). With mamba2 layers the GPU still runs their matrix multiplies and
    /// convolution: the host holds the embeddings input, not the gathered rows, and the scan's
    /// rows (`memory::Scan::prompt_on_host`), or where it attends before its last layer (whose
    /// attention the GPU runs), the query copied in and the attention's output on the CPU, if
    /// more (a bound the traced hosts' scans exceed). Other recurrent layers, and a host
    /// without a mamba2 layer, keep the CPU's own compute figure, a layer's prompt.
    pub(super) fn host_prompt(&self, host: &HostShare, inputs: u128) -> u128 {
        let p = &self.parts;
        if p.scan.host_scan == 0 || !self.runs_scan(&host.layers) {
            return u128::from(p.estimate.compute);
        }
        let below = inputs.saturating_sub(u128::from(p.residual));
        let before_last = host.layers.start..host.layers.end.saturating_sub(1);
        let attention = if self.runs_attention(before_last) {
            below + 2 * u128::from(p.query)
        } else {
            0
        };
        p.scan.prompt_on_host(below).max(attention)
    }

    /// Under op offload, the masks (full, window) the first GPU holds, of `masks` (each GPU's,
    /// then the host's, as `Model::shares_as` collects them): those its own layers read, and
    /// those the host's layers read, copied in with their attention. A mask that neither reads
    /// goes straight to the GPU whose layers read it (a split's inputs go where it runs:
    /// GGML_SCHED_DEBUG's split inputs). The tiny gemma3 model over two rpc-server devices given
    /// CUDA's offload rule, window-attention layers on the host: the first device held 1.76 MiB
    /// with none on it (`-ngl 2 -ts 0,2`; estimate 2.03, the KV copies and the attention's
    /// output fitting in holes) and 2.01 MiB with window-attention layers 1-4 (`-ngl 6 -ts
    /// 4,2`; its first layer's FFN rows above the mask, `Model::own_after_host_attention`),
    /// where all the masks counted 5.88; once it held the global layer, 5.76 MiB as on one
    /// device. Without flash attention, 8.51 MiB against 41.01 on one device.
    ///
    /// A hybrid model's host runs its attention on the CPU but for its last layer's
    /// (`Model::host_runs_prompts`), so only that layer's mask comes here: granitehybrid-tiny,
    /// every block on the host, the last one recurrent, held its scans' rows alone, 1.74 MiB
    /// (alloc trace; the full mask counted 5.76).
    pub(super) fn first_gpu_masks(&self, masks: &[(bool, bool)], host: &HostShare) -> (bool, bool) {
        let own = masks.first().copied().unwrap_or_default();
        let read = self.host_masks(masks, host);
        (own.0 || read.0, own.1 || read.1)
    }

    /// Of [`Model::first_gpu_masks`], those copied in for the host's layers.
    pub(super) fn host_masks(&self, masks: &[(bool, bool)], host: &HostShare) -> (bool, bool) {
        if self.host_runs_prompts(host) {
            let last = host.layers.end.checked_sub(1);
            reads(last.and_then(|il| self.parts.mask_layers.get(il as usize)))
        } else {
            masks.last().copied().unwrap_or_default()
        }
    }
}

/// The masks (full, window) a layer reading `mask` needs.
pub(super) fn reads(mask: Option<&Mask>) -> (bool, bool) {
    match mask {
        Some(Mask::Full) => (true, false),
        Some(Mask::Window) => (false, true),
        _ => (false, false),
    }
}
