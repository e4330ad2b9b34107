//! Where llama.cpp puts each part of a model when it offloads layers to GPUs, and how many
//! layers to offload: from the GGUF header and the server settings alone, no I/O.
//!
//! The engine's rules, read from llama.cpp (b6975+, as `memory`):
//! - Layers (`llama_model::load_tensors`, its `get_layer_buft_list`): the model has
//!   `block_count` repeating layers and the output layer counts as one more, at index
//!   `block_count`. With `-ngl N`, layers from `i_gpu_start = max(block_count + 1 - N, 0)` on go
//!   to the GPUs, so the output layer is the first one offloaded and the first blocks stay on
//!   the host. The input layer (token embeddings) is always on the host (`dev_input`).
//! - Several GPUs: the tensor split is summed into cumulative shares and normalised to 1; a
//!   layer goes to the first GPU whose cumulative share is above `(il - i_gpu_start) / N`
//!   (`std::upper_bound`, in f32 as the engine computes it). Without `--tensor-split` the
//!   shares are each GPU's free memory at load.
//! - Tensors (`llama_model_loader::create_tensor`): `blk.N.*` goes with layer N; the input
//!   tensors (`LLM_TENSOR_LAYER_INPUT`) with the host; the output tensors
//!   (`LLM_TENSOR_LAYER_OUTPUT`) with the output layer. A model without `output.weight` uses
//!   `token_embd` as its output too (`TENSOR_DUPLICATED`): a second copy where the output
//!   layer is, unless that is the host, which shares the first.
//! - KV cache and recurrent state (`llama_kv_cache`, `llama_memory_recurrent` constructors):
//!   each layer's on its layer's device (llama-server offloads the KV cache by default).
//! - Compute buffers (`llama_context::sched_reserve`, `ggml_backend_sched`): see
//!   `model::Model::compute`.
//! - The logits' output buffer (`llama_context::output_reserve`) is in host memory.
//!
//! Not modelled: the GPU memory of the runtime itself (CUDA context, cuBLAS workspaces, a few
//! hundred MiB; about 600 MiB on an H200), which the margin (`--fit-target`, 1 GiB by default)
//! stands for (its host memory is `Backend::runtime_host`); `-ot`,
//! `--cpu-moe` and row split; `--no-kv-offload`.

#[cfg(test)]
mod copies_tests;
mod fit;
#[cfg(test)]
mod hostile_tests;
#[cfg(test)]
mod inputs_tests;
#[cfg(test)]
mod layout_tests;
mod message;
mod model;
#[cfg(test)]
mod op_offload_tests;
#[cfg(test)]
mod rpc_tests;
#[cfg(test)]
mod tests;

use std::ops::Range;

use super::header::Header;
use super::memory::Flags;
use model::Model;

pub use fit::{decide, decide_on};

/// The most GPUs one replica may be given: the engine's scheduler takes 16 backends
/// (`GGML_SCHED_MAX_BACKENDS`), the CPU's among them.
pub const MAX_DEVICES: usize = 15;
/// The free memory kept on each GPU: llama.cpp's default `--fit-target`, 1024 MiB.
pub const DEFAULT_MARGIN: u64 = 1 << 30;

/// What the GPUs' backend does besides holding buffers, where that changes the placement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backend {
    /// Whether it takes over a prompt's matrix multiplies whose weights are in host memory
    /// (the device's `offload_op`: CUDA, Vulkan and SYCL do, RPC does not), copying the weight
    /// into its compute buffer.
    pub op_offload: bool,
    /// Whether it has a pinned host buffer type (`CUDA_Host`). The engine lists it for the
    /// host's weights before the CPU's repack buffers (`make_cpu_buft_list`: "ACCEL -> GPU host
    /// -> CPU extra -> CPU"), so with such GPUs in use nothing on the host is repacked: a CUDA
    /// llama-server logged its host layers in `CPU_Mapped` alone (testbed/gpu-check.sh on an
    /// H200), where the same layers over RPC devices (no host buffer type) were repacked.
    pub host_buffer: bool,
    /// Host memory the GPU runtime keeps in the server's process, besides the model's buffers:
    /// the driver's and the runtime libraries' pages, the kernels it loads, its staging
    /// buffers. The pod's memory limit is the host part, so it must hold this too. For CUDA,
    /// measured by testbed/gpu-check.sh on an H200 (CUDA 13.0, driver 580) as a llama-server's
    /// peak RSS, after every slot read a prompt that filled its context, less the host part's
    /// other figures: 318 to 333 MiB for models with attention alone (llama, gemma3), whether
    /// all layers or half were offloaded. Mostly the driver's anonymous memory and device
    /// mappings, cuBLASLt's pages and the heap; before any prompt it was 284 to 298 MiB, and
    /// -ngl 0 takes it too (the runtime is set up for every device the server sees).
    pub runtime_host: u64,
    /// What the runtime keeps more for a model with recurrent (Mamba-2) layers: the hybrid
    /// granite model needed 486 and 500 MiB in the same run, the growth anonymous memory
    /// outside the heap (about 110 MiB) and the heap (about 65 MiB) once its prompts had run,
    /// with CUDA graphs on or off. Measured on one hybrid model; what takes it is not
    /// established.
    pub runtime_host_recurrent: u64,
}

impl Backend {
    /// NVIDIA GPUs, what the operator places on.
    pub const CUDA: Backend = Backend {
        op_offload: true,
        host_buffer: true,
        runtime_host: 352 << 20,
        runtime_host_recurrent: 176 << 20,
    };
    /// llama.cpp's RPC backend (`rpc-server` devices, `llama-server --rpc`): its client keeps
    /// no runtime of its own.
    pub const RPC: Backend = Backend {
        op_offload: false,
        host_buffer: false,
        runtime_host: 0,
        runtime_host_recurrent: 0,
    };
}

/// A GPU a replica may use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Device {
    /// What a person calls it (`NVIDIA-A10`).
    pub name: String,
    /// Its free memory, in bytes.
    pub free: u64,
}

/// What one GPU holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceShare {
    /// The repeating layers (blocks) it holds.
    pub layers: Range<u32>,
    /// Whether it holds the output layer.
    pub output: bool,
    pub weights: u64,
    pub kv: u64,
    pub recurrent: u64,
    pub compute: u64,
    /// All of the above: what it needs besides the runtime's own memory and the margin.
    pub total: u64,
}

/// What host memory holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostShare {
    /// The blocks left on the host (the first ones).
    pub layers: Range<u32>,
    /// Whether the output layer is left on the host.
    pub output: bool,
    /// Token embeddings, the blocks and the output layer left here.
    pub weights: u64,
    /// The model file's range mapped for them, resident in host memory (`CPU_Mapped`): from
    /// the first to the last tensor left here that is not repacked, so the GPUs' tensors between
    /// them too (the loader reads those through the mapping). Without GPUs: `weights`.
    pub mapped: u64,
    /// The CPU repack copy of the weights left here (`memory::repack`).
    pub repack: u64,
    pub kv: u64,
    pub recurrent: u64,
    /// llama-server's context checkpoints, always in host memory.
    pub checkpoints: u64,
    pub compute: u64,
    /// The logits' output buffer.
    pub output_buffer: u64,
    /// The engine's memory outside its buffers (`memory::engine`) but the output buffer, with
    /// the CPU's matmul work buffer as far as the host multiplies (`Model::host_overhead`).
    pub overhead: u64,
    /// The GPU runtime's own (`Backend::runtime_host`, and `runtime_host_recurrent` more for a
    /// model with recurrent layers), when any GPU is used.
    pub runtime: u64,
    /// All of the above but `weights` (what of them is resident is `mapped`), rounded up to a
    /// MiB as `memory::estimate` rounds its total.
    pub total: u64,
}

/// Where the engine puts a model for one `-ngl` and tensor split.
#[derive(Clone, Debug, PartialEq)]
pub struct Placement {
    /// Layers on the GPUs, the output layer counted: at most `n_layer + 1`.
    pub ngl: u32,
    /// Repeating layers of the model (`block_count`).
    pub n_layer: u32,
    /// The tensor split, one share per GPU (for `--tensor-split`).
    pub split: Vec<f64>,
    pub devices: Vec<DeviceShare>,
    pub host: HostShare,
    /// Bytes of `token_embd` copied to a GPU as the output of a model with tied embeddings.
    pub output_copy: u64,
    /// True when the header lacked the shapes and the figures are rough (`memory`'s fallback).
    pub fallback: bool,
    /// True when the engine turns flash attention off for this placement (the host's last block
    /// attends and the next, on a GPU, is recurrent); the compute figures count it.
    pub flash_attention_off: bool,
}

impl Placement {
    /// Whether every layer, the output included, is on a GPU.
    pub fn full(&self) -> bool {
        self.ngl > self.n_layer
    }

    /// The split as `--tensor-split` takes it: `17,16`.
    pub fn tensor_split_arg(&self) -> String {
        let parts: Vec<String> = self.split.iter().map(|s| s.to_string()).collect();
        parts.join(",")
    }
}

/// A GPU's need against what it has, when the model does not fit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Need {
    /// Its share of a full offload plus the margin.
    pub needed: u64,
    pub free: u64,
}

/// How to offload a model to a set of GPUs.
#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// Every layer on the GPUs, each keeping its margin free.
    Full(Placement),
    /// The most layers the GPUs hold with their margins; the first blocks stay on the host.
    Partial(Placement),
    /// Not one layer fits beside the buffers: the CPU placement, and each GPU's need for a
    /// full offload against its free memory.
    NoFit {
        placement: Placement,
        needs: Vec<Need>,
    },
}

impl Decision {
    /// The placement to run.
    pub fn placement(&self) -> &Placement {
        match self {
            Decision::Full(p) | Decision::Partial(p) | Decision::NoFit { placement: p, .. } => p,
        }
    }

    /// The decision as a sentence: "31 of 33 layers on 2× NVIDIA-A10 (21.9 and 20.4 of 22.5
    /// GiB), 2 layers in 6.1 GiB of RAM".
    pub fn message(&self, devices: &[Device]) -> String {
        message::describe(self, devices)
    }
}

/// Why a device list or tensor split is refused.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum OffloadError {
    #[error("{count} GPUs are more than the {MAX_DEVICES} a replica may use")]
    TooManyDevices { count: usize },
    #[error("tensor split share #{index} is {value}; a share is a finite number, 0 or more")]
    BadShare { index: usize, value: f64 },
    #[error("the tensor split gives no GPU a share")]
    NoShare,
}

impl OffloadError {
    /// The condition reason.
    pub fn reason(&self) -> &'static str {
        "InvalidPlacement"
    }
}

/// The engine's placement of the model for `-ngl ngl` and `--tensor-split split` (one share
/// per GPU; none: no GPU). An `ngl` above the layer count offloads everything, as the engine
/// reads it.
pub fn place(h: &Header, f: &Flags, ngl: u32, split: &[f64]) -> Result<Placement, OffloadError> {
    place_on(h, f, ngl, split, Backend::CUDA)
}

/// [`place`] on GPUs of `backend`.
pub fn place_on(
    h: &Header,
    f: &Flags,
    ngl: u32,
    split: &[f64],
    backend: Backend,
) -> Result<Placement, OffloadError> {
    let cumulative = check_split(split)?;
    let m = Model::new(h, f, backend);
    Ok(m.placement(ngl, split, &cumulative, h))
}

/// The cumulative shares, normalised to 1, in f32 as the engine sums them.
fn check_split(split: &[f64]) -> Result<Vec<f32>, OffloadError> {
    if split.len() > MAX_DEVICES {
        return Err(OffloadError::TooManyDevices { count: split.len() });
    }
    for (index, &value) in split.iter().enumerate() {
        if !(value.is_finite() && value >= 0.0 && (value as f32).is_finite()) {
            return Err(OffloadError::BadShare { index, value });
        }
    }
    let cumulative = cumulative(split);
    if !split.is_empty() && cumulative.is_empty() {
        return Err(OffloadError::NoShare);
    }
    Ok(cumulative)
}

/// The engine's split points (`llama_model::load_tensors`): running sums divided by the total;
/// empty when the shares add up to nothing (or to more than f32 holds).
fn cumulative(split: &[f64]) -> Vec<f32> {
    let mut sum = 0f32;
    let mut points: Vec<f32> = split
        .iter()
        .map(|s| {
            sum += *s as f32;
            sum
        })
        .collect();
    if !(sum.is_finite() && sum > 0.0) {
        return Vec::new();
    }
    for p in &mut points {
        *p /= sum;
    }
    points
}
