//! What a GPU takes over from the host under op offload, and what the host keeps of it: a host
//! layer's attention with its copies on the first GPU, and a hybrid model's prompt rows on the
//! host (`Model::compute` uses them).

use super::{HostShare, Model};
use crate::gguf::memory::Mask;

impl Model {
    /// Under op offload, the first GPU's peak while it runs a host layer's attention: the
    /// engine copies in the mask that layer reads (kept until its last reader) and the layer's
    /// whole KV cache, the views flash attention reads, since the KV cache stays in host
    /// memory (`## SPLIT` inputs `cache_k_l0 (view)`, `cache_v_l0 (view)`, `attn_inp_kq_mask`
    /// in llama-server's `GGML_SCHED_DEBUG` log). Those land above the layer's rows, which
    /// memory's activations before them bound (the FFN phase, or latent attention's; without
    /// the residual). Over RPC devices given CUDA's offload rule: within 1% for the H200's
    /// llama at 8192 cells, above elsewhere where the copies partly fit in the rows' holes
    /// (up to 1.7x, phi3's F16 model), below for the tiny MoE model (tests/offload_engine.rs
    /// lists each with its bound).
    ///
    /// Where the model has recurrent layers, only the host's last layer, next to the GPU's
    /// run: the hybrid granite model ran its other host layers' attention on the CPU
    /// (`Model::host_runs_prompts`).
    pub(super) fn offloaded_attention(&self, host: &HostShare) -> u128 {
        let p = &self.parts;
        // The rows below: the FFN phase's, or latent attention's where that is larger (memory's
        // activations); a hybrid's scan phase is not among them.
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
            .filter(|il| {
                p.mask_layers
                    .get(*il as usize)
                    .is_some_and(|m| *m != Mask::None)
            })
            .count();
        let copies = match (p.latent_cache, attending) {
            (false, _) => 1,
            (true, 0 | 1) => 2,
            (true, _) => 3,
        };
        layers
            .filter_map(|il| {
                let i = il as usize;
                let mask = match p.mask_layers.get(i)? {
                    Mask::Full => p.mask_full,
                    Mask::Window => p.mask_window,
                    Mask::None => return None,
                };
                Some(rows + u128::from(mask) + copies * u128::from(*p.kv.get(i)?))
            })
            .max()
            .unwrap_or(0)
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
    /// not). The CPU's own compute figure, a layer's prompt, bounds it.
    pub(super) fn host_runs_prompts(&self, host: &HostShare) -> bool {
        self.any_recurrent() && !host.layers.is_empty()
    }
}

/// Under op offload, the masks (full, window) the first GPU holds, of `masks` (each GPU's, then the
/// host's, as `Model::shares_as` collects them): those its own layers read, and those the host's
/// layers read, copied in with their attention. A mask that neither reads goes straight to the GPU
/// whose layers read it (a split's inputs go where it runs: GGML_SCHED_DEBUG's split inputs). The
/// tiny gemma3 model over two rpc-server devices given CUDA's offload rule, window-attention layers
/// on the host: the first device held 1.76 MiB with none on it (`-ngl 2 -ts 0,2`; estimate 1.95,
/// the KV copies fitting in holes) and 2.01 MiB with window-attention layers 1-4 (`-ngl 6 -ts 4,2`;
/// estimate 1.94, its first layer's FFN rows above the mask), where all the masks counted 5.88;
/// once it held the global layer, 5.76 MiB as on one device. Without flash attention, 8.51 MiB
/// against 41.01 on one device.
pub(super) fn first_gpu_masks(masks: &[(bool, bool)]) -> (bool, bool) {
    let (own, host) = (masks.first(), masks.last());
    let (a, b) = (
        own.copied().unwrap_or_default(),
        host.copied().unwrap_or_default(),
    );
    (a.0 || b.0, a.1 || b.1)
}
