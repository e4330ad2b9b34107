//! The host's weights beside the GPUs: which tensors stay in host memory, the CPU repack of
//! them, and the file range mapped for them.

use super::{Home, Model, OP_OFFLOAD_MIN_BATCH, home};
use crate::gguf::header::{Header, TensorInfo};
use crate::gguf::memory::{self, repack};
use crate::gguf::offload::{DeviceShare, HostShare};

impl Model {
    /// Whether the host holds tensors of layer `home`.
    fn on_host(home: &Home, host: &HostShare) -> bool {
        match home {
            Home::Input => true,
            Home::Output => host.output,
            Home::Layer(il) => host.layers.contains(&(*il as u32)),
        }
    }

    /// The repack of the tensors left in host memory (the engine repacks only CPU buffers),
    /// and its tier; none beside GPUs with a host buffer type (`Backend::host_buffer`); no tier
    /// when no GPU holds anything (then it is `memory`'s).
    pub(super) fn host_repack(
        &self,
        h: &Header,
        devices: &[DeviceShare],
        host: &HostShare,
    ) -> (u64, Option<repack::Tier>) {
        if self.backend.host_buffer && !devices.is_empty() {
            return (0, Some(repack::Tier::None));
        }
        if devices.iter().all(|d| d.layers.is_empty() && !d.output) {
            return (self.parts.estimate.repack, None);
        }
        let n = self.n_layer as usize;
        let mut tensors: Vec<TensorInfo> = h
            .tensors
            .iter()
            .filter(|t| Self::on_host(&home(&t.name, n), host))
            .cloned()
            .collect();
        if !host.output {
            // The output is on a GPU: an empty stand-in keeps `repack` from taking the host's
            // token_embd for the CPU's output copy of tied embeddings.
            tensors.push(TensorInfo {
                name: "output.weight".into(),
                dims: vec![0],
                ggml_type: 0,
                offset: 0,
            });
        }
        let host_only = Header {
            version: h.version,
            metadata: Default::default(),
            tensors,
            alignment: h.alignment,
            data_offset: h.data_offset,
        };
        let (bytes, tier, _) = repack::largest(&host_only, self.cpu);
        (bytes, Some(tier))
    }

    /// The file range the engine maps for the host's weights (`CPU_Mapped`): from the first to
    /// the last host tensor it does not repack. The loader reads the GPUs' tensors through the
    /// same mapping and unmaps only what lies outside that range, so the GPUs' tensors between
    /// the host's stay resident with them.
    pub(super) fn host_mapped(&self, h: &Header, host: &HostShare, tier: repack::Tier) -> u64 {
        let n = self.n_layer as usize;
        let (mut first, mut last) = (u64::MAX, 0u64);
        for t in &h.tensors {
            if !Self::on_host(&home(&t.name, n), host) || repack::is_repacked(t, tier, false) {
                continue;
            }
            let bytes = memory::tensor_bytes(t).unwrap_or(0);
            first = first.min(t.offset);
            last = last.max(t.offset.saturating_add(bytes));
        }
        last.saturating_sub(first)
    }

    /// The engine's memory outside its buffers (`memory::engine`) but the output buffer, with
    /// the CPU's matrix-multiply work buffer as far as the host uses it (`memory::engine`'s
    /// `work` is a ubatch of activation rows converted for the weights; the CPU backend grows
    /// it to the largest graph it has run and keeps it). A ubatch's where the host runs its
    /// blocks' prompts (without GPUs, without op offload, or for a model with recurrent
    /// layers, `Model::host_runs_prompts`); under op offload, the batches the GPUs leave it,
    /// under `OP_OFFLOAD_MIN_BATCH` tokens; none where the GPUs run every block and the output,
    /// as the host then only gathers the token embeddings' rows.
    pub(super) fn host_overhead(&self, host: &HostShare, gpus: bool, full: bool) -> u64 {
        let e = &self.parts.estimate;
        let work = e.engine.work;
        let op_offload = self.backend.op_offload && self.ubatch >= OP_OFFLOAD_MIN_BATCH;
        let used = if !gpus {
            work
        } else if full {
            0
        } else if op_offload && !self.host_runs_prompts(host) {
            let tokens = (OP_OFFLOAD_MIN_BATCH - 1).min(self.ubatch);
            let rows = (u128::from(work) * u128::from(tokens)).div_ceil(u128::from(self.ubatch));
            u64::try_from(rows).unwrap_or(work)
        } else {
            work
        };
        e.overhead
            .saturating_sub(e.engine.output)
            .saturating_sub(work.saturating_sub(used))
    }
}
