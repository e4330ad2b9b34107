//! Op offload: what a CUDA GPU takes over from the host (a host layer's attention, with its
//! copies) and what the host keeps beside a GPU with a pinned host buffer type.

use super::inputs_tests::inputs;
use super::layout_tests::{deepseek2, deepseek2_with};
use super::rpc_tests::{granite, mamba2};
use super::tests::{MIB, Model, N_EMBD, flags, hybrid};
use super::*;
use crate::gguf::header::Value;
use crate::gguf::memory::{Flags, estimate, repack};

#[test]
fn beside_cuda_nothing_on_the_host_is_repacked() {
    let h = Model::llama(4, 64 * MIB).header();
    let f = Flags {
        cpu: repack::Tiers::ANY,
        ..flags(4096, 1)
    };
    // CUDA_Host comes before the CPU's repack buffers in the host's list, even at -ngl 0.
    let cuda = place(&h, &f, 0, &[1.0]).unwrap();
    let rpc = place_on(&h, &f, 0, &[1.0], Backend::RPC).unwrap();
    assert!(rpc.host.repack > 0);
    assert_eq!(cuda.host.repack, 0);
    assert_eq!(cuda.host.weights, rpc.host.weights);
}

#[test]
fn under_op_offload_the_gpu_copies_in_a_host_layers_kv_cache_and_mask_for_its_attention() {
    let h = Model::llama(4, 16 * MIB).header();
    let (short, long) = (flags(32768, 1), flags(65536, 1));
    let (ps, pl) = (
        crate::gguf::memory::parts(&h, &short),
        crate::gguf::memory::parts(&h, &long),
    );
    // Its second host layer's value copy lands above the mask the first one's copies are
    // below.
    let grown =
        (pl.kv[0] - ps.kv[0]) + (pl.mask_full - ps.mask_full) + (pl.kv_values[1] - ps.kv_values[1]);
    let cuda = |f: &Flags| place(&h, f, 3, &[1.0]).unwrap().devices[0].compute;
    let rpc = |f: &Flags| place_on(&h, f, 3, &[1.0], Backend::RPC).unwrap().devices[0].compute;
    // The host's KV cache grows with the context, and a CUDA GPU's compute buffer with it.
    assert_eq!(cuda(&long) - cuda(&short), grown);
    assert!(
        rpc(&long) - rpc(&short) < grown,
        "RPC devices run only their own layers"
    );
    // Fully offloaded, nothing is copied in.
    let full = |f: &Flags| place(&h, f, 5, &[1.0]).unwrap().devices[0].compute;
    assert!(full(&long) - full(&short) < grown);
}

#[test]
fn under_op_offload_a_hybrid_models_host_keeps_its_scans_rows_not_the_cpus_prompt() {
    let h = hybrid().header();
    let f = flags(4096, 2);
    let parts = crate::gguf::memory::parts(&h, &f);
    // Two recurrent blocks on the host, the attention block and the output on the GPU; then
    // one.
    let two = place(&h, &f, 3, &[1.0]).unwrap();
    let one = place(&h, &f, 4, &[1.0]).unwrap();
    assert_eq!(
        (two.host.layers.clone(), one.host.layers.clone()),
        (0..2, 0..1)
    );
    // The GPU runs the blocks' matrix multiplies and convolutions, the host their scans: x, B
    // and C copied back, each spanning all but one token's row of the convolution's output
    // (2048 + 2 x 128 values a token), and the scan's output (a ubatch's 2048 values and each
    // slot's 128 x 2048 state), above the embeddings input and the mask.
    let (tokens, row) = (512u64, 2048 + 2 * 128);
    let spanning = |first: u64| ((tokens - 1) * row + first) * 4;
    let scan = spanning(2048) + 2 * spanning(128) + (2048 * tokens + 128 * 2048 * 2) * 4;
    let below = parts.residual + parts.masks + scan;
    for p in [&two, &one] {
        // The rest: the token ids, positions and cache indices, a few KiB.
        let ids = p.host.compute - below;
        assert!(ids < 16 * 1024, "{ids} bytes of ids");
    }
    assert!(two.host.compute < estimate(&h, &f).compute);
    // The attention-only llama's host keeps only the token-by-token graph.
    let llama = Model::llama(4, 16 * MIB).header();
    let q = place(&llama, &f, 3, &[1.0]).unwrap();
    assert!(q.host.compute < estimate(&llama, &f).compute);
}

#[test]
fn the_host_keeps_the_matmul_work_buffer_only_for_the_batches_it_multiplies() {
    let h = Model::llama(4, 16 * MIB).header();
    let f = flags(4096, 2);
    let e = estimate(&h, &f);
    let work = e.engine.work;
    assert!(work > 0);
    let beside = |ngl: u32, on: Backend| {
        let p = place_on(&h, &f, ngl, &[1.0], on).unwrap();
        e.overhead - e.engine.output - p.host.overhead
    };
    // Without GPUs, and where the CPU runs the host's blocks' prompts, a ubatch's.
    assert_eq!(
        place_on(&h, &f, 0, &[], Backend::RPC)
            .unwrap()
            .host
            .overhead
            + e.engine.output,
        e.overhead
    );
    assert_eq!(beside(3, Backend::RPC), 0);
    // Every block and the output on GPUs: the host only gathers embedding rows, no matmul.
    assert_eq!(beside(5, Backend::RPC), work);
    assert_eq!(beside(5, Backend::CUDA), work);
    // Under op offload the GPU takes batches from 32 tokens on: the host's are 31 at most.
    assert_eq!(beside(3, Backend::CUDA), work - (work * 31).div_ceil(512));
    // A hybrid model's host runs its layers' prompts itself.
    let hy = hybrid().header();
    let eh = estimate(&hy, &f);
    let p = place(&hy, &f, 3, &[1.0]).unwrap();
    assert_eq!(p.host.overhead + eh.engine.output, eh.overhead);
}

#[test]
fn under_op_offload_a_host_layers_latent_cache_is_copied_in_as_keys_and_as_values() {
    // From 32768 cells on a layer's cache (36 MiB) no longer fits in the place its query rows
    // leave (11 MiB), so both copies land above them.
    let h = deepseek2().header();
    let (short, long) = (flags(32768, 2), flags(65536, 2));
    let (ps, pl) = (
        crate::gguf::memory::parts(&h, &short),
        crate::gguf::memory::parts(&h, &long),
    );
    assert!(pl.latent_cache);
    let (cache, mask) = (pl.kv[0] - ps.kv[0], pl.mask_full - ps.mask_full);
    let grown = |ngl: u32| {
        let at = |f: &Flags| place(&h, f, ngl, &[1.0]).unwrap().devices[0].compute;
        at(&long) - at(&short)
    };
    // One host layer: the keys' view and the values' view, each the layer's whole cache.
    assert_eq!(place(&h, &short, 4, &[1.0]).unwrap().host.layers, 0..1);
    assert_eq!(grown(4), mask + 2 * cache);
    // From the second host layer on, one of them lands above the mask.
    assert_eq!(place(&h, &short, 1, &[1.0]).unwrap().host.layers, 0..4);
    assert_eq!(grown(1), mask + 3 * cache);
}

#[test]
fn under_op_offload_the_first_of_two_gpus_holds_only_the_masks_its_and_the_hosts_layers_read() {
    // Layers 0-2 slide over a window, layer 3 attends to everything: only the global layer's
    // mask grows with the context (from a size where it sets the GPU's peak: its own layers'
    // rows, not the host's FFN, which it is not copied in beside).
    let h = Model::llama(4, 16 * MIB).windowed().header();
    let (short, long) = (flags(32768, 1), flags(65536, 1));
    let (ps, pl) = (
        crate::gguf::memory::parts(&h, &short),
        crate::gguf::memory::parts(&h, &long),
    );
    let grown = pl.mask_full - ps.mask_full;
    assert!(grown > 0 && pl.mask_window == ps.mask_window && pl.kv[0] == ps.kv[0]);
    let first = |ngl: u32, split: &[f64]| {
        let at = |f: &Flags| place(&h, f, ngl, split).unwrap();
        let (s, l) = (at(&short), at(&long));
        assert_eq!(s.devices[0].layers, l.devices[0].layers);
        (
            s.host.layers,
            s.devices[0].layers.clone(),
            l.devices[0].compute - s.devices[0].compute,
        )
    };
    // The host's window layers and none on the first GPU: the global layer's mask goes to the
    // second GPU, which runs that layer.
    assert_eq!(first(2, &[0.0, 1.0]), (0..3, 0..0, 0));
    // One GPU with the same host layers runs the global layer too, and holds its mask.
    assert_eq!(first(2, &[1.0]), (0..3, 3..4, grown));
    // So does the first of two holding the global layer.
    assert_eq!(first(3, &[2.0, 1.0]), (0..2, 2..4, grown));
}

/// Under op offload, the first GPU's peak for two or more of `Model::llama`'s blocks on the host
/// (parts `p`, the largest host weight `weight`): their FFN's rows with the weight copied in, or
/// an attention's mask and KV cache copied in above the input, norm and query rows, with the
/// second layer's value copy above the mask and the output on top.
pub(super) fn op_offload_peak(p: &crate::gguf::memory::Parts, weight: u64) -> u64 {
    let rows = p.activations - p.residual + p.mask_full + weight;
    let attention = 2 * p.residual + 3 * p.query + p.mask_full + p.kv[0] + p.kv_values[1];
    rows.max(attention)
}

#[test]
fn under_op_offload_the_first_gpu_given_a_host_mamba2_gate_runs_as_a_first_block() {
    // The memory benchmark's scan with small weights, so that no weight copied in sets the
    // peak.
    let mut m = Model::llama(4, MIB);
    (m.arch, m.kv) = ("mamba2", mamba2(4).kv);
    let (h, f) = (m.header(), flags(8192, 2));
    let p = crate::gguf::memory::parts(&h, &f);
    // The host keeps layer 0 alone; the first GPU ran its prompt from the embeddings' copy, so
    // its own layers' chain lies over four residual rows and its conv state's rows, as where
    // the first block runs.
    let first_block = 4 * u128::from(p.residual) + p.scan.state_rows + p.scan.chain;
    let one = place(&h, &f, 4, &[2.0, 1.0]).unwrap();
    assert_eq!(one.host.layers, 0..1);
    assert_eq!(u128::from(one.devices[0].compute), first_block);
    // Over RPC devices (no op offload) the same placement keeps the fitted peak.
    let rpc = place_on(&h, &f, 4, &[2.0, 1.0], Backend::RPC).unwrap();
    assert!(u128::from(rpc.devices[0].compute) < first_block);
}

#[test]
fn under_op_offload_the_gpu_running_the_hosts_unfused_attention_keeps_the_blocks_input() {
    // Granite blocks, attention in 1 and 3: -ngl 3 leaves the host blocks 0 and 1, and the
    // engine turns flash attention off.
    let f = flags(8192, 2);
    let h = granite(&[0, 8, 0, 8]).header();
    let p = crate::gguf::memory::parts(&h, &f);
    let cuda = place(&h, &f, 3, &[1.0]).unwrap();
    assert!(cuda.flash_attention_off);
    // The first GPU runs host block 1's attention on the query, the K and V cache copied in,
    // a score matrix (f32: a stream's 4096 cells by the ubatch by 8 heads), the values made
    // contiguous, the output (two rows), the f32 mask; and, as it ran block 0 too, the block's
    // input, kept for the residual add, above what block 0's FFN left there: its gate rows,
    // its input and its down projection's weight copied in (counted at the largest host
    // weight).
    let row = N_EMBD * 512 * 4;
    let scores = 4096 * 512 * 8 * 4;
    let attention = row + p.kv[1] + scores + p.kv[1] / 2 + 2 * row + 2 * p.mask_full;
    let largest = largest_weight(&h, &["blk.0.", "blk.1."]);
    let ffn_before = p.gate + row + largest;
    assert_eq!(cuda.devices[0].compute, ffn_before + row + attention);
}

#[test]
fn a_hybrid_hosts_attention_runs_on_the_cpu_but_for_its_last_layers() {
    let h = granite(&[0, 0, 2, 0]).header();
    // A context whose mask outweighs a block's rows.
    let f = flags(262_144, 2);
    let mask = crate::gguf::memory::parts(&h, &f).mask_full;
    let first_gpu = |ngl| place(&h, &f, ngl, &[1.0]).unwrap().devices[0].compute;
    // Every block on the host, the last one recurrent: block 2's attention runs on the CPU, and
    // the GPU copies in no mask.
    let cpu = first_gpu(1);
    assert!(cpu < mask, "{cpu} bytes, the mask {mask}");
    // Block 2 the host's last: the GPU runs its attention, the mask copied in.
    assert!(first_gpu(2) > mask);
}

#[test]
fn under_op_offload_the_gpus_own_ffn_lands_above_every_mask_it_holds_after_the_hosts_attention() {
    // gemma3's pattern: window layers 0-2, the global layer 3; layer 0 on the host, the rest
    // and the output on one GPU, which reads the global mask the host does not. Its FFN is
    // narrow, as the tiny gemma3's is.
    let mut m = Model::llama(8, 16 * MIB).windowed();
    m.kv.push(("feed_forward_length", Value::U32(256)));
    let h = m.header();
    let f = flags(16384, 1);
    let p = crate::gguf::memory::parts(&h, &f);
    let one_host = place(&h, &f, 8, &[1.0]).unwrap();
    assert_eq!(one_host.host.layers, 0..1);
    // The host's attention left its input, norm and two query rows below the masks; the
    // GPU's up rows and their product land above both masks.
    let own = 2 * (p.residual + p.query) + p.mask_full + p.mask_window + 2 * p.gate;
    assert_eq!(one_host.devices[0].compute, own + inputs(&p, 2));
    // Counted below the masks, as its own layers' rows alone, it came short.
    let block = p.activations - p.residual;
    assert!(block + p.masks < own);
}

#[test]
fn under_op_offload_a_hybrids_mask_lands_above_the_host_blocks_ffn_and_the_gpus_scan_above_it() {
    // granitehybrid-tiny's pattern: mamba2 blocks but for block 2; block 0 on the host, the
    // rest and the output on two GPUs, 2:1. The first GPU reads the full mask, larger than
    // the place the host block's gate and up rows leave.
    let h = granite(&[0, 0, 8, 0]).header();
    let f = flags(8192, 2);
    let p = crate::gguf::memory::parts(&h, &f);
    assert!(p.mask_full > 2 * p.gate);
    let one_host = place(&h, &f, 4, &[2.0, 1.0]).unwrap();
    assert_eq!(one_host.host.layers, 0..1);
    assert_eq!(one_host.devices[0].layers, 1..4);
    let largest = largest_weight(&h, &["blk.0."]);
    // The host block's FFN below the mask, the GPU's in-projection and gate copy above it.
    let below = 4 * p.residual + 2 * p.gate + largest;
    let scan = (p.scan.input + p.scan.gate) as u64;
    let own = below + p.mask_full + scan;
    assert_eq!(one_host.devices[0].compute, own + inputs(&p, 1));
    // Counted as the host block's FFN beside the mask, it came short.
    let ffn = p.activations - p.residual + p.mask_full + largest;
    assert!(ffn < own, "{ffn} bytes counted before, {own} now");
}

/// The largest weight of the blocks named by `prefixes` (`blk.N.`): the one a GPU copies in.
fn largest_weight(h: &crate::gguf::header::Header, prefixes: &[&str]) -> u64 {
    h.tensors
        .iter()
        .filter(|t| prefixes.iter().any(|b| t.name.starts_with(b)))
        .filter_map(crate::gguf::memory::tensor_bytes)
        .max()
        .unwrap_or(0)
}

#[test]
fn under_op_offload_a_host_layers_first_latent_cache_copy_takes_the_place_its_query_rows_leave() {
    // A small FFN weight, so that the host's attention sets the GPU's peak; at 8192 cells a
    // layer's cache (9 MiB) fits in the place its query and absorbed query leave (11 MiB).
    let h = deepseek2_with(MIB).header();
    let f = flags(8192, 2);
    let p = crate::gguf::memory::parts(&h, &f);
    let at = |ngl: u32| u128::from(place(&h, &f, ngl, &[1.0]).unwrap().devices[0].compute);
    let row = |width: u128| 512 * 4 * width;
    let (query, absorbed, cache) = (row(8 * 192), row(8 * 512), u128::from(p.kv[0]));
    assert!(cache <= query + absorbed && 2 * cache > query + absorbed);
    // Below the copies: the input and its norm, the query, the absorbed query, the roped part
    // (no compressed query here, whose place it would take) and the joined query.
    let rows = 2 * u128::from(p.residual) + query + absorbed + row(8 * 64) + row(8 * 576);
    // One host layer: its second copy and the mask above the rows, its output on top of them.
    let one = rows + cache + u128::from(p.mask_full) + absorbed;
    assert!(
        (one..one + 64 * 1024).contains(&at(4)),
        "{} against {one}",
        at(4)
    );
    // Every host layer: a later layer's second copy above the mask instead of that output.
    assert_eq!(at(1) - at(4), cache - absorbed);
}

#[test]
fn under_op_offload_the_gpu_runs_a_host_mamba2_layers_projections_and_convolution_not_its_scan() {
    let (h, f) = (mamba2(8).header(), flags(8192, 2));
    let p = crate::gguf::memory::parts(&h, &f);
    let (tokens, row) = (512, 4);
    // The in-projection, the convolution's input (with each slot's 3 state columns) and output,
    // and the gate's copy; the scan's output and new states stay on the host.
    let input = (2 * 1536 + 2 * 128 + 24) * tokens * row;
    let conv = (1536 + 2 * 128) * (tokens + 3 * 2) * row;
    let offloaded = input + conv + (1536 + 2 * 128) * tokens * row + 1536 * tokens * row;
    assert_eq!(p.scan.offloaded, offloaded);
    // Every block on the host: above the layer's input and norm, and its conv state rows (this
    // model has no in- or out-projection weights to copy in).
    let all = place(&h, &f, 1, &[1.0]).unwrap();
    assert_eq!(all.host.layers, 0..8);
    let rows = 2 * u128::from(p.residual) + p.scan.state_rows + offloaded;
    let gpu = u128::from(all.devices[0].compute);
    assert!(
        (rows..rows + 64 * 1024).contains(&gpu),
        "{gpu} against {rows}"
    );
    // Not memory's fitted scan phase, which holds the scan's output and states too.
    assert!(gpu < u128::from(p.activations));
    // Each layer's in-projection weight is copied in below its rows, above the copy of the
    // block before's out-projection, freed by then: the largest pair sets the peak.
    let mut hw = mamba2(8).header();
    let f32s = |il: u64, t: &str, n: u64| crate::gguf::header::TensorInfo {
        name: format!("blk.{il}.{t}.weight"),
        dims: vec![64, n],
        ggml_type: 0,
        offset: 0,
    };
    for il in 0..8 {
        let out = if il == 3 { 4096 } else { 1024 };
        hw.tensors
            .extend([f32s(il, "ssm_in", 1024), f32s(il, "ssm_out", out)]);
    }
    let weighted = u128::from(place(&hw, &f, 1, &[1.0]).unwrap().devices[0].compute);
    let (w_in, w_out) = (64 * 1024 * 4, 64 * 4096 * 4);
    assert_eq!(weighted - gpu, w_in + w_out - p.scan.state_rows);
}

/// A phi3-shaped model: four blocks, each a fused f16 `attn_qkv` and an `ffn_up` twice the
/// FFN's width `ff` (f32, or f16 where `f16_up`), no `ffn_gate`.
fn phi3(ff: u64, f16_up: bool) -> crate::gguf::header::Header {
    let mut m = Model::llama(4, 4 * N_EMBD * 2 * ff + 4 * N_EMBD);
    m.kv.push(("feed_forward_length", Value::U32(ff as u32)));
    let mut h = m.header();
    for t in h.tensors.iter_mut() {
        if f16_up && t.name.ends_with("ffn_up.weight") {
            t.ggml_type = 1;
        }
    }
    for il in 0..4 {
        h.tensors.push(crate::gguf::header::TensorInfo {
            name: format!("blk.{il}.attn_qkv.weight"),
            dims: vec![N_EMBD, 3 * N_EMBD],
            ggml_type: 1,
            offset: 0,
        });
    }
    h
}

/// `attn_qkv`'s f16 copy in `phi3`.
const QKV: u128 = (N_EMBD * 3 * N_EMBD * 2) as u128;

#[test]
fn under_op_offload_a_fused_gate_and_up_projection_runs_above_the_first_attentions_rows() {
    let ff = 8192;
    let h = phi3(ff, false);
    // A short context, so that the FFN sets the GPU's peak, not the attention's copies.
    let f = flags(1024, 1);
    let p = crate::gguf::memory::parts(&h, &f);
    let one = place(&h, &f, 4, &[1.0]).unwrap();
    assert_eq!(one.host.layers, 0..1);
    let (r, up) = (u128::from(p.residual), 512 * 4 * 2 * u128::from(ff));
    // The first attention's input and query, the mask in the freed place of `attn_qkv`'s copy
    // (larger), the block's input and norm, the fused rows above `ffn_up`'s copy.
    let ffn = 4 * r + QKV + up + 4 * u128::from(N_EMBD * 2 * ff);
    let gpu = u128::from(one.devices[0].compute);
    assert!((ffn..ffn + 64 * 1024).contains(&gpu), "{gpu} against {ffn}");
    // Memory's FFN phase, three rows of the FFN's width, counts more.
    assert!(
        u128::from(p.activations) - r + u128::from(p.mask_full) + 4 * u128::from(N_EMBD * 2 * ff)
            > ffn
    );
}

#[test]
fn under_op_offload_a_fused_models_later_layer_copies_its_kv_above_its_input_and_query() {
    // A narrow FFN, so that the host layers' attention sets the first GPU's peak.
    let h = phi3(512, false);
    let f = flags(4096, 1);
    let p = crate::gguf::memory::parts(&h, &f);
    let (r, q, mask) = (
        u128::from(p.residual),
        u128::from(p.query),
        u128::from(p.mask_full),
    );
    // The mask and a query row fit in the place `attn_qkv`'s copy leaves.
    assert!(mask + q <= QKV);
    let all = place(&h, &f, 1, &[1.0]).unwrap();
    assert_eq!(all.host.layers, 0..4);
    // Below layer 1's copies: the first layer's two rows, the place (the mask and layer 1's
    // query) and layer 1's input.
    let later = 3 * r + QKV + u128::from(p.kv[1]);
    let gpu = u128::from(all.devices[0].compute);
    assert!(
        (later..later + 64 * 1024).contains(&gpu),
        "{gpu} against {later}"
    );
    // Not its value copy above the mask, over two rows of the first layer's query.
    let values_above = 2 * r + 2 * q + mask + u128::from(p.kv[1] + p.kv_values[1]) + q;
    assert!(values_above > later + 4 * MIB as u128);
    // One host layer: its output beside the mask too, its copies right above the place.
    let one = place(&h, &f, 4, &[1.0]).unwrap();
    assert_eq!(one.host.layers, 0..1);
    let first = 2 * r + QKV + u128::from(p.kv[0]);
    let gpu = u128::from(one.devices[0].compute);
    assert!(
        (first..first + 64 * 1024).contains(&gpu),
        "{gpu} against {first}"
    );
}

#[test]
fn under_op_offload_a_fused_models_mask_above_the_copies_lifts_the_ffn_rows_above_it() {
    // At 8192 cells the mask is larger than `attn_qkv`'s place and lands above the first
    // layer's copies; the FFN's f16 weight fits in their place, its rows beside it do not.
    let ff = 5120;
    let h = phi3(ff, true);
    let f = flags(8192, 1);
    let p = crate::gguf::memory::parts(&h, &f);
    let (r, mask, kv) = (
        u128::from(p.residual),
        u128::from(p.mask_full),
        u128::from(p.kv[0]),
    );
    let (rows, weight) = (
        512 * 4 * 2 * u128::from(ff),
        u128::from(N_EMBD * 2 * ff * 2),
    );
    assert!(mask > QKV && weight <= kv && weight + rows > kv);
    let all = place(&h, &f, 1, &[1.0]).unwrap();
    let top = 2 * r + QKV + kv + mask;
    // The FFN's rows land above the mask; a later layer's value copy, above it too, is smaller.
    assert!(rows > u128::from(p.kv_values[1]));
    let gpu = u128::from(all.devices[0].compute);
    assert!(
        (top + rows..top + rows + 64 * 1024).contains(&gpu),
        "{gpu} against {}",
        top + rows
    );
}
