//! Recurrent layers: the state each keeps per sequence, and the rows one ubatch through a
//! mamba2-style layer (`build_mamba2_layer`) leaves in a device's compute buffer.

use crate::gguf::bounds::{
    HEAD_COUNT, KDA_HEAD_DIM, SHORTCONV_CACHE, SSM_CONV_KERNEL, SSM_DT_RANK, SSM_GROUPS, SSM_INNER,
    SSM_STATE, TOKEN_SHIFT, WKV_HEAD_SIZE,
};
use crate::gguf::hparams::Hp;

/// Archs whose recurrent layers are mamba2's (`build_mamba2_layer`).
const MAMBA2_LAYERS: [&str; 5] = [
    "mamba2",
    "granitehybrid",
    "nemotron_h",
    "nemotron_h_moe",
    "falcon-h1",
];
/// Of those, the archs whose recurrent layer opens with its state reads: falcon-h1 runs
/// attention first in every layer.
const OPENS_WITH_STATE: [&str; 4] = ["mamba2", "granitehybrid", "nemotron_h", "nemotron_h_moe"];
/// Of those, the archs whose block runs its FFN after the recurrent layer (granite's hybrid
/// blocks); mamba2's block is the layer alone and nemotron_h's FFN is a block of its own.
const FFN_AFTER_SCAN: [&str; 1] = ["granitehybrid"];

/// f32 elements of one recurrent layer's state for one sequence (R + S).
pub(super) fn recurrent_state(hp: &Hp<'_>, n_embd: u128) -> u128 {
    let u = |p| hp.u(p).map_or(0, u128::from);
    match hp.arch {
        "rwkv6" | "rwkv6qwen2" | "rwkv7" | "arwkv7" => {
            hp.u(&TOKEN_SHIFT).map_or(2, u128::from) * n_embd + n_embd * u(&WKV_HEAD_SIZE)
        }
        "lfm2" | "lfm2moe" => {
            n_embd
                * hp.u(&SHORTCONV_CACHE)
                    .map_or(1, u128::from)
                    .saturating_sub(1)
        }
        "kimi-linear" | "kimi-k3" | "bailingmoe3" => {
            let (d_conv, n_head, dim) = (u(&SSM_CONV_KERNEL), u(&HEAD_COUNT), u(&KDA_HEAD_DIM));
            3 * d_conv.saturating_sub(1) * n_head * dim + dim * dim * n_head
        }
        _ => {
            let (d_conv, d_inner, d_state, n_group) = (
                u(&SSM_CONV_KERNEL),
                u(&SSM_INNER),
                u(&SSM_STATE),
                u(&SSM_GROUPS),
            );
            d_conv.saturating_sub(1) * (d_inner + 2 * n_group * d_state) + d_state * d_inner
        }
    }
}

/// One ubatch through a mamba2 layer on a device, in bytes (all f32); zero for other archs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Scan {
    /// The rows alive at the layer's peak: the in-projection (z, x, B, C and dt of each token),
    /// the convolution's input (the conv state's rows before each sequence's tokens) and its
    /// output; and the scan's output (y and each sequence's new state) where it does not fit
    /// in the convolution input's freed place, which the allocator gives it when it can.
    pub chain: u128,
    /// The in-projection, which the next device copies in when this layer ends a device's run
    /// and the next layer, on another device, is recurrent too: that layer's state reads come
    /// first in the graph, so the scheduler runs this layer's copy of its gate (`ggml_cont(z)`,
    /// which has no weight) on the next device.
    pub input: u128,
    /// That gate, which the first device then copies back.
    pub gate: u128,
    /// The conv state's rows the layer gathers for its slots (`build_rs`) before its
    /// in-projection, which then lands above them.
    pub state_rows: u128,
    /// Whether the layer is the whole block (mamba2: no FFN after the scan), so that the chain
    /// is a device's peak rather than a floor under `memory`'s fitted one.
    pub alone: bool,
    /// The rows of a second such layer right after the first on one device, in a block with an
    /// FFN after the scan, where the scan's output takes its convolution input's freed place
    /// (measured, b11312): the graph reads the next layer's conv state rows (`build_rs`'s
    /// gather) as soon as the first layer's scan is done, so they land just above its output
    /// and stay until the next convolution. The FFN's rows free what lies below them, but no
    /// free block there holds the next in-projection, which goes above those rows, with its gate
    /// copy above it. From the first layer's in-projection on: its conv state rows below it,
    /// the in-projection, the scan's output, the next rows, the next in-projection and gate;
    /// zero where that does not apply.
    pub follow: u128,
    /// Whether the gate's copy (`ggml_cont(z)`), made after the scan, finds no hole in the
    /// chain: the scan's output takes the convolution input's freed place where it fits, and
    /// the gate then needs what is left of it, else the whole place. Where it finds none it
    /// lands on top, which a pipeline's later device running one layer shows (alloc traces,
    /// b11312: mamba2-tiny's output 0.27 MiB in the 0.32 place, its 0.25 gate on top;
    /// mamba2-bench's 4.5 output on top, its 3.0 gate in the 3.54 place).
    pub gate_spills: bool,
    /// Under op offload, a host's peak where it runs mamba2 layers (the GPU runs their matrix
    /// multiplies and convolution): above the graph's inputs, the scan's inputs copied back from
    /// the GPU (x, the time steps, B and C; each view of the convolution's output copied with
    /// its strides, so spanning all but one token's row of it) and the scan's output (alloc
    /// traces over an rpc-server device given CUDA's offload rule, b11312: mamba2-bench 3.50,
    /// 0.05, 3.49, 3.49 and 4.50 MiB above its embeddings, the host at 16.54 MiB wherever its
    /// blocks end; granitehybrid-bench the same above the full mask, 20.54).
    pub host_scan: u128,
    /// Under op offload, the GPU's rows of a host layer's mamba2 layer, whose scan the host
    /// runs (`host_scan`): the in-projection, the convolution's input and output, and the
    /// gate's copy, which takes no hole in the chain (alloc traces over an rpc-server device
    /// given CUDA's offload rule, b11312: mamba2-bench and granitehybrid-bench 6.55, 3.54, 3.50
    /// and 3.0 MiB, x's copy for the host in the convolution input's freed place).
    pub offloaded: u128,
}

/// ggml's `TENSOR_ALIGNMENT`: the allocator rounds each tensor up to it.
const TENSOR_ALIGNMENT: u128 = 32;

/// `bytes` as the allocator places them, rounded up to `TENSOR_ALIGNMENT`.
fn aligned(bytes: u128) -> u128 {
    bytes.div_ceil(TENSOR_ALIGNMENT) * TENSOR_ALIGNMENT
}

impl Scan {
    /// The peak of a device (the host, in a partial offload) whose only block is such a layer
    /// that hands its gate to the next device's recurrent layer (traced, mamba2): above the
    /// graph's inputs (the token ids; the state copy's and outputs' ids, a few bytes each in an
    /// aligned slot; the embeddings input and its gathered copy), the conv state's rows and the
    /// norm's freed row, the chain. `memory`'s fitted figure has the gate's copy above them.
    pub(crate) fn handing_over(&self, residual: u128, tokens: u128) -> u128 {
        let ids = 4 * tokens + 2 * TENSOR_ALIGNMENT;
        ids + 3 * residual + self.state_rows + self.chain
    }

    /// The host's peak where it runs the scans of a prompt under op offload (`host_scan`),
    /// above `inputs`, the graph's inputs that stay (the token ids, the embeddings input, the
    /// masks and the small inputs), and the state copy's and outputs' ids in their aligned
    /// slots.
    pub(crate) fn prompt_on_host(&self, inputs: u128) -> u128 {
        inputs + 2 * TENSOR_ALIGNMENT + self.host_scan
    }
}

/// The mamba2 layer's rows for a ubatch of `tokens` over `seqs` sequences.
pub(super) fn scan(hp: &Hp<'_>, tokens: u128, seqs: u128) -> Scan {
    if !MAMBA2_LAYERS.contains(&hp.arch) {
        return Scan::default();
    }
    let u = |p| hp.u(p).map_or(0, u128::from);
    let (d_conv, d_inner, d_state, n_group) = (
        u(&SSM_CONV_KERNEL),
        u(&SSM_INNER),
        u(&SSM_STATE),
        u(&SSM_GROUPS),
    );
    let xbc = d_inner + 2 * n_group * d_state;
    let input = (d_inner + xbc + u(&SSM_DT_RANK)) * tokens * 4;
    let conv_in = xbc * (tokens + d_conv.saturating_sub(1) * seqs) * 4;
    let y = (d_inner * tokens + d_state * d_inner * seqs) * 4;
    let above = if y > conv_in { y } else { 0 };
    let opens = OPENS_WITH_STATE.contains(&hp.arch);
    let gate = d_inner * tokens * 4;
    let rows = xbc * d_conv.saturating_sub(1) * seqs * 4;
    // A view of `per_token` elements at each of the convolution output's rows, with its strides.
    let spanning = |per_token: u128| aligned((tokens.saturating_sub(1) * xbc + per_token) * 4);
    let time_steps = aligned(u(&SSM_DT_RANK) * tokens * 4);
    let host_scan = spanning(d_inner) + time_steps + 2 * spanning(n_group * d_state) + aligned(y);
    // The convolution input's place, less the output where that went there.
    let gate_spills = gate > conv_in - (y - above);
    let follow = if FFN_AFTER_SCAN.contains(&hp.arch) && y <= conv_in {
        rows + input + y + rows + input + gate
    } else {
        0
    };
    Scan {
        chain: input + conv_in + xbc * tokens * 4 + above,
        input: if opens { input } else { 0 },
        gate: if opens { gate } else { 0 },
        state_rows: if opens { rows } else { 0 },
        alone: hp.arch == "mamba2",
        follow,
        gate_spills: opens && gate_spills,
        host_scan,
        offloaded: input + conv_in + xbc * tokens * 4 + d_inner * tokens * 4,
    }
}
