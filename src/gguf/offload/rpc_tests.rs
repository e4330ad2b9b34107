//! The placement against what llama-server logged over llama.cpp's RPC backend (each
//! rpc-server a device; tests/offload_engine.rs runs it), on headers built by hand.

use super::inputs_tests::inputs;
use super::op_offload_tests::op_offload_peak;
use super::tests::{GIB, MIB, Model, N_EMBD, flags, gpus};
use super::*;
use crate::gguf::header::Value;
use crate::gguf::memory::{self, estimate, parts};

/// The parts `memory` computes for `m`'s header at 4096 tokens, one slot.
fn model_parts(m: &Model) -> crate::gguf::memory::Parts {
    parts(&m.header(), &flags(4096, 1))
}

#[test]
fn rpc_devices_do_not_run_the_hosts_matrix_multiplies() {
    let h = Model::llama(4, 64 * MIB).header();
    let f = flags(4096, 1);
    let cuda = place(&h, &f, 3, &[1.0]).unwrap();
    let rpc = place_on(&h, &f, 3, &[1.0], Backend::RPC).unwrap();
    let ffn = 64 * MIB - N_EMBD * 4;
    // CUDA copies the largest host weight in for the FFN, and a host layer's mask and KV
    // cache for its attention.
    let p = parts(&h, &f);
    assert!(p.kv[0] > 0);
    assert_eq!(
        cuda.devices[0].compute,
        rpc.devices[0]
            .compute
            .max(op_offload_peak(&p, ffn) + inputs(&p, 1))
    );
    // The host runs its layers' prompt itself: the CPU's own compute figure.
    assert_eq!(rpc.host.compute, estimate(&h, &f).compute);
    assert!(cuda.host.compute < rpc.host.compute);
}

#[test]
fn a_device_with_only_the_output_layer_needs_only_the_logits_and_their_rows() {
    let m = Model::llama(4, 64 * MIB);
    let p = place_on(&m.header(), &flags(4096, 1), 2, &[1.0, 1.0], Backend::RPC).unwrap();
    assert!(p.devices[1].output && p.devices[1].layers.is_empty());
    let parts = model_parts(&m);
    // The output norm runs where the last block does; its rows are copied in (`norm#0` and the
    // logits, 0.01 MiB, with qwen2-wide's last block on another device; alloc trace).
    assert_eq!(p.devices[1].compute, parts.logits + parts.out_rows);
    assert_eq!(parts.out_rows, N_EMBD * 4, "one slot, one output row");
}

#[test]
fn a_device_reads_only_the_masks_of_its_layers() {
    // Layers 0-2 slide over a window, layer 3 attends to everything.
    let (h, f) = (
        Model::llama(4, 16 * MIB).windowed().header(),
        flags(16384, 1),
    );
    let p = parts(&h, &f);
    assert!(p.mask_full > 0 && p.mask_window > 0);
    let split = place_on(&h, &f, 5, &[1.0, 1.0], Backend::RPC).unwrap();
    assert_eq!(split.devices[0].layers, 0..3);
    // Each device keeps the hole of the query, which is narrower than the gate.
    let block = p.activations - p.residual + p.query;
    assert_eq!(
        split.devices[0].compute,
        block + p.scaled + p.mask_window + 3 * (p.residual + p.mask_window) + 4 * inputs(&p, 1),
        "window layers, the first block with gemma's scaled embeddings"
    );
    assert_eq!(
        split.devices[1].compute,
        block + 4 * (p.residual + p.mask_full) + 4 * inputs(&p, 1),
        "the next device keeps four copies of its input row as well"
    );
}

#[test]
fn gemmas_first_block_on_one_device_keeps_the_querys_hole_where_its_gate_is_wider() {
    let f = flags(16384, 1);
    // What one device holds above the block and the masks.
    let above = |m: &Model| {
        let h = m.header();
        let p = parts(&h, &f);
        let one = place_on(&h, &f, 5, &[1.0], Backend::RPC).unwrap();
        let caches = u64::from(p.mask_full > 0) + u64::from(p.mask_window > 0);
        let base = p.activations - p.residual + p.masks + inputs(&p, caches);
        (one.devices[0].compute - base, p)
    };
    // A gate of n_ff 4096 is wider than the query's 8 heads of 128: their hole stays.
    let (hole, p) = above(&Model::llama(4, 16 * MIB).windowed());
    assert!(p.scaled > 0 && p.gate > p.query);
    assert_eq!(hole, p.query);
    // As wide as the query (n_ff 1024): the gate takes the hole. The scaled rows are the
    // host's, copied in as any model's input, and count nowhere here.
    let mut even = Model::llama(4, 16 * MIB).windowed();
    even.kv.push(("feed_forward_length", Value::U32(1024)));
    let (hole, p) = above(&even);
    assert_eq!((p.gate, hole), (p.query, 0));
    // The CPU alone holds both the gathered and the scaled rows.
    let h = even.header();
    assert_eq!(
        estimate(&h, &f).compute,
        (p.activations + p.scaled + p.masks).max(p.logits + 2 * p.residual + p.out_rows)
    );
    // A llama keeps neither.
    let llama = Model::llama(4, 16 * MIB);
    let (hole, p) = above(&llama);
    assert_eq!((p.scaled, hole), (0, 0));
}

/// A mamba2 model of `blocks` blocks with the memory benchmark's scan (no FFN).
pub(super) fn mamba2(blocks: u64) -> Model {
    let mut m = Model::llama(blocks, 16 * MIB);
    m.arch = "mamba2";
    m.kv = vec![
        ("feed_forward_length", Value::U32(0)),
        ("ssm.conv_kernel", Value::U32(4)),
        ("ssm.inner_size", Value::U32(1536)),
        ("ssm.state_size", Value::U32(128)),
        ("ssm.group_count", Value::U32(1)),
        ("ssm.time_step_rank", Value::U32(24)),
    ];
    m
}

#[test]
fn a_mamba2_layers_chain_is_its_projection_convolution_and_scan() {
    let (h, f) = (mamba2(8).header(), flags(8192, 2));
    let p = parts(&h, &f);
    let (tokens, row) = (512, 4);
    // z, x, B, C, dt; the convolution's input with the 3 state columns of each of 2 sequences;
    // its output; the scan's output (y and each sequence's new state), larger than the
    // convolution's input, so above it.
    let input = (2 * 1536 + 2 * 128 + 24) * tokens * row;
    let conv = (1536 + 2 * 128) * (tokens + 3 * 2) * row;
    let y = (1536 * tokens + 128 * 1536 * 2) * row;
    assert_eq!(p.scan.input, input);
    assert_eq!(
        p.scan.chain,
        input + conv + (1536 + 2 * 128) * tokens * row + y
    );
    assert_eq!(p.scan.gate, 1536 * tokens * row);
    let one = place_on(&h, &f, 9, &[1.0], Backend::RPC).unwrap();
    // Below the chain, the conv state's rows the layer gathers for its 2 slots beside the four
    // residual rows (mamba2-bench on one rpc-server device: 24.13 MiB, the in-projection at
    // 6.04, 0.04 above the rows; alloc trace).
    assert_eq!(p.scan.state_rows, 3 * (1536 + 2 * 128) * 2 * row);
    assert_eq!(
        u128::from(one.devices[0].compute),
        4 * u128::from(p.residual) + p.scan.state_rows + p.scan.chain
    );
}

#[test]
fn a_pipeline_splitting_mamba2_layers_copies_the_projection_and_the_gate_across() {
    let (h, f) = (mamba2(8).header(), flags(8192, 2));
    let p = parts(&h, &f);
    let two = place_on(&h, &f, 9, &[1.0, 3.0], Backend::RPC).unwrap();
    assert_eq!(
        (two.devices[0].layers.clone(), two.devices[1].layers.clone()),
        (0..3, 3..8)
    );
    let (r, chain) = (u128::from(p.residual), p.scan.chain);
    assert_eq!(
        u128::from(two.devices[0].compute),
        4 * r + 3 * r + p.scan.state_rows + chain + 4 * p.scan.gate,
        "the embeddings' four copies, the gate's four, and layer 1's chain over the holes and \
         the output layer 0 leaves and its conv state's rows, as dev1's over its inputs"
    );
    assert_eq!(
        u128::from(two.devices[1].compute),
        4 * r + 3 * r + p.scan.state_rows + chain + 4 * p.scan.input
    );
    // Layer 0 alone has no layer before it: one row's hole under its chain.
    let first = place_on(&h, &f, 9, &[1.0, 8.0], Backend::RPC).unwrap();
    assert_eq!(first.devices[0].layers, 0..1);
    assert_eq!(
        u128::from(first.devices[0].compute),
        4 * r + r + p.scan.state_rows + chain + 4 * p.scan.gate
    );
    // Outside a pipeline the boundary's single copies come and go before the chain.
    let partial = place_on(&h, &f, 5, &[1.0, 1.0], Backend::RPC).unwrap();
    assert!(!partial.full());
    assert_eq!(
        u128::from(partial.devices[0].compute),
        u128::from(p.activations - p.residual)
    );
}

/// Granite's hybrid blocks (a mamba2 layer or attention, then an FFN), `kv` heads per block: 0
/// is a mamba2 layer. Tiny widths, as in testbed/gen_gguf.py, where the scan's output fits in
/// the convolution input's place.
pub(super) fn granite(kv: &[u32]) -> Model {
    let mut m = Model::llama(kv.len() as u64, 16 * MIB);
    m.arch = "granitehybrid";
    let per_layer = kv.iter().map(|k| Value::U32(*k)).collect();
    m.kv = vec![
        ("attention.head_count", Value::U32(8)),
        (
            "attention.head_count_kv",
            Value::Array {
                value_type: 4,
                len: kv.len() as u64,
                items: Some(per_layer),
            },
        ),
        ("feed_forward_length", Value::U32(64)),
        ("ssm.conv_kernel", Value::U32(4)),
        ("ssm.inner_size", Value::U32(128)),
        ("ssm.state_size", Value::U32(16)),
        ("ssm.group_count", Value::U32(1)),
        ("ssm.time_step_rank", Value::U32(4)),
    ];
    m
}

#[test]
fn a_second_mamba2_layer_in_a_row_lands_above_the_first_ones_scan() {
    let f = flags(8192, 2);
    let (tokens, row) = (512, 4);
    let (h, p) = {
        let h = granite(&[0, 0, 8, 0]).header();
        let p = parts(&h, &f);
        (h, p)
    };
    // The scan's output (y and two states) fits in the convolution's input (3 state columns of
    // each of 2 sequences before the tokens).
    let (input, xbc) = ((128 + 160 + 4) * tokens * row, 160);
    let y = (128 * tokens + 16 * 128 * 2) * row;
    let rows = 3 * xbc * 2 * row;
    assert!(y <= xbc * (tokens + 3 * 2) * row);
    assert_eq!(
        p.scan.follow,
        rows + input + y + rows + input + 128 * tokens * row
    );
    // Layers 0 and 1, both mamba2, on the first device: the second's in-projection above the
    // first's output, over six residual rows (the pipeline's four copies of the embeddings, the
    // scaled embeddings and the first layer's input).
    let two = place_on(&h, &f, 5, &[1.0, 3.0], Backend::RPC).unwrap();
    assert_eq!(two.devices[0].layers, 0..2);
    let r = u128::from(p.residual);
    assert_eq!(u128::from(two.devices[0].compute), 6 * r + p.scan.follow);
    assert!(
        p.scan.follow > p.scan.chain,
        "the second layer sets the peak"
    );
    // A pure mamba2 model (no FFN after the scan) frees differently: no follow-on rows.
    assert_eq!(parts(&mamba2(8).header(), &f).scan.follow, 0);
}

#[test]
fn an_attention_after_two_mamba2_layers_in_a_row_keeps_its_mask_under_their_rows() {
    let f = flags(8192, 2);
    // testbed/gpu-check.sh's hybrid: attention in layers 3 and 7 of 8, every layer on one
    // device, outside a pipeline. Layer 7 reads the full mask, a graph input allocated before
    // any layer runs, so it lies under layer 5's chain, which runs above the holes layers 3 and
    // 4 leave (the H200's CUDA0 and an rpc-server's compute buffer, 13.08 MiB, peak there;
    // counted without the mask, 11.53).
    let later = granite(&[0, 0, 0, 8, 0, 0, 0, 8]).header();
    let p = parts(&later, &f);
    let (r, mask) = (u128::from(p.residual), u128::from(p.mask_full));
    assert!(mask > 0 && p.scan.follow > 0);
    let one = place_on(&later, &f, 9, &[1.0], Backend::RPC).unwrap();
    assert_eq!(
        u128::from(one.devices[0].compute),
        4 * r + p.scan.follow + mask + u128::from(inputs(&p, 1))
    );
    // Before the first attention (granitehybrid-tiny's layout: attention in layer 2 of 4), or
    // with none after the scans (the masks' last reader has run), the fitted peak stands.
    for kv in [&[0, 0, 8, 0][..], &[8, 0, 0, 0, 0, 0, 0, 0]] {
        let h = granite(kv).header();
        let q = parts(&h, &f);
        let n = kv.len() as u32;
        let one = place_on(&h, &f, n + 1, &[1.0], Backend::RPC).unwrap();
        assert!(
            u128::from(one.devices[0].compute) < 4 * r + q.scan.follow + mask,
            "{kv:?}"
        );
    }
}

#[test]
fn a_device_with_only_the_last_block_peaks_in_its_attention() {
    // Two blocks with separate query, key and value projections (8 heads of 128, 2 for the
    // keys and values): the last block's FFN runs on the output rows only.
    let mut m = Model::llama(2, 16 * MIB);
    m.kv = vec![
        ("attention.head_count", Value::U32(8)),
        ("attention.head_count_kv", Value::U32(2)),
    ];
    let f = flags(8192, 2);
    let plain = m.header();
    // The header with the last block's query, key and value projections.
    let projected = |plain: &crate::gguf::header::Header| {
        let mut h = plain.clone();
        for t in ["attn_q", "attn_k", "attn_v"] {
            let dims = if t == "attn_q" { N_EMBD } else { 256 };
            h.tensors.push(crate::gguf::header::TensorInfo {
                name: format!("blk.1.{t}.weight"),
                dims: vec![N_EMBD, dims],
                ggml_type: 0,
                offset: 0,
            });
        }
        h
    };
    let h = projected(&plain);
    let p = parts(&h, &f);
    let partial = place_on(&h, &f, 2, &[1.0, 1.0], Backend::RPC).unwrap();
    assert_eq!(partial.devices[0].layers, 1..2);
    // The block's input, its norm, the query and the roped query (as wide as the embeddings).
    assert_eq!(
        partial.devices[0].compute,
        4 * p.residual + p.masks + inputs(&p, 1),
        "the attention, not the FFN"
    );
    assert!(p.activations - p.residual > 3 * p.residual);
    // A fused projection keeps the query, key and value at once, and the roped key.
    let mut fused = plain.clone();
    fused.tensors.push(crate::gguf::header::TensorInfo {
        name: "blk.1.attn_qkv.weight".into(),
        dims: vec![N_EMBD, N_EMBD + 512],
        ggml_type: 0,
        offset: 0,
    });
    let kv = p.residual / 4;
    let fused = place_on(&fused, &f, 2, &[1.0, 1.0], Backend::RPC).unwrap();
    assert_eq!(
        fused.devices[0].compute,
        p.residual + p.residual + (p.residual + 2 * kv) + kv + p.masks + inputs(&p, 1)
    );
    // Without the projections' tensors (the hand-built header's blocks) nothing changes.
    let before = place_on(&plain, &f, 2, &[1.0, 1.0], Backend::RPC).unwrap();
    assert_eq!(
        before.devices[0].compute,
        p.activations - p.residual + p.masks + inputs(&p, 1)
    );
    // Without rope (granite's hybrid with `rope.scaling.finetuned` false) there is no roped
    // query: the query, key and value rows.
    m.arch = "granitehybrid";
    m.kv.push(("rope.scaling.finetuned", Value::Bool(false)));
    let nope = projected(&m.header());
    let p = parts(&nope, &f);
    let partial = place_on(&nope, &f, 2, &[1.0, 1.0], Backend::RPC).unwrap();
    assert_eq!(
        partial.devices[0].compute,
        3 * p.residual + 2 * kv + p.masks + inputs(&p, 1)
    );
}

#[test]
fn the_host_maps_the_file_from_its_first_tensor_to_its_last() {
    // The file holds token_embd, output_norm, output, then the blocks: with the output on a
    // device and block 0 on the host, the mapping spans the output too.
    let mut h = Model::llama(4, 64 * MIB).header();
    let mut offset = 0;
    for t in &mut h.tensors {
        t.offset = offset;
        offset += memory::tensor_bytes(t).unwrap().div_ceil(32) * 32;
    }
    let f = flags(4096, 1);
    let p = place_on(&h, &f, 4, &[1.0], Backend::RPC).unwrap();
    assert_eq!(p.host.layers, 0..1);
    let output: u64 = h
        .tensors
        .iter()
        .filter(|t| t.name.starts_with("output"))
        .map(|t| memory::tensor_bytes(t).unwrap())
        .sum();
    assert!(p.host.mapped >= p.host.weights + output);
    assert!(p.host.mapped < p.host.weights + output + MIB);
    // Every layer offloaded: the token embeddings alone.
    let full = place_on(&h, &f, 5, &[1.0], Backend::RPC).unwrap();
    assert_eq!(full.host.mapped, full.host.weights);
    assert!(p.host.total >= p.host.mapped + p.host.compute);
}

#[test]
fn each_device_keeps_its_own_margin() {
    let h = Model::llama(32, 256 * MIB).header();
    let f = flags(8192, 1);
    let devices = gpus(&[6 * GIB, 6 * GIB]);
    let one = decide(&h, &f, &devices, DEFAULT_MARGIN).unwrap();
    assert_eq!(
        one,
        decide_on(&h, &f, &devices, &[DEFAULT_MARGIN], Backend::CUDA).unwrap(),
        "one margin is every device's"
    );
    assert!(matches!(one, Decision::Full(_)), "{one:?}");
    // A margin of 3 GiB on the first device leaves it 3: it takes fewer layers, the last
    // device (filled first) as many as it holds.
    let margins = [3 * GIB, DEFAULT_MARGIN];
    let uneven = decide_on(&h, &f, &devices, &margins, Backend::CUDA).unwrap();
    let Decision::Partial(p) = &uneven else {
        panic!("{uneven:?}")
    };
    assert!(p.split[0] < p.split[1], "{:?}", p.split);
    for (id, margin) in margins.iter().enumerate() {
        assert!(p.devices[id].total + margin <= 6 * GIB, "device {id}");
        let mut counts = p.split.clone();
        counts[id] += 1.0;
        let more = place(&h, &f, p.ngl + 1, &counts).unwrap();
        assert!(
            more.devices[id].total + margin > 6 * GIB,
            "device {id} holds one more"
        );
    }
}

#[test]
fn the_first_device_after_a_hosts_moe_block_runs_that_blocks_tail() {
    let mut m = Model::llama(4, 16 * MIB);
    m.arch = "qwen3moe";
    m.kv.extend([
        ("expert_count", Value::U32(16)),
        ("expert_used_count", Value::U32(4)),
        ("expert_feed_forward_length", Value::U32(256)),
    ]);
    let (h, f) = (m.header(), flags(8192, 2));
    let p = parts(&h, &f);
    // The host block's 4 expert outputs and residual below the masks; the next block's up
    // rows and their product above them, then its 4 expert outputs.
    let up = 4 * 256 * 512 * 4;
    assert_eq!(
        p.moe_tail,
        4 * p.residual + p.residual + 2 * up + 4 * p.residual
    );
    let partial = place_on(&h, &f, 3, &[1.0], Backend::RPC).unwrap();
    assert_eq!(partial.host.layers, 0..2);
    assert!(p.moe_tail > p.activations);
    assert_eq!(
        partial.devices[0].compute,
        p.moe_tail + p.masks + inputs(&p, 1)
    );
    let full = place_on(&h, &f, 5, &[1.0], Backend::RPC).unwrap();
    assert_eq!(
        full.devices[0].compute,
        p.activations - p.residual + p.masks + inputs(&p, 1)
    );
}

#[test]
fn a_host_ending_in_attention_before_a_gpus_recurrent_layer_turns_flash_attention_off() {
    // Granite blocks, attention in 1 and 3: -ngl 3 leaves the host blocks 0 and 1, the GPU
    // starting with block 2, recurrent.
    let f = flags(8192, 2);
    let h = granite(&[0, 8, 0, 8]).header();
    let p = parts(&h, &f);
    let off = place_on(&h, &f, 3, &[1.0], Backend::RPC).unwrap();
    assert_eq!(off.host.layers, 0..2);
    assert!(off.flash_attention_off);
    for (ngl, host) in [(2, 0..3), (4, 0..1), (5, 0..0)] {
        let on = place_on(&h, &f, ngl, &[1.0], Backend::RPC).unwrap();
        assert_eq!(on.host.layers, host);
        assert!(!on.flash_attention_off, "-ngl {ngl}");
    }
    // The GPU keeps a score matrix for its attention (f32, a stream's 4096 cells by the
    // ubatch by 8 heads) and reads the masks in f32; so do the host's inputs.
    let engine = super::model::Model::new(&h, &f, Backend::RPC);
    let (fused, fused_host, _) = engine.shares_as(3, 1, &[1.0], false);
    let scores = 4096 * 512 * 8 * 4;
    assert!(off.devices[0].compute >= fused[0].compute + scores);
    assert_eq!(off.host.compute, fused_host.compute + p.masks);
    assert!(
        Decision::Partial(off)
            .message(&gpus(&[GIB]))
            .contains("flash attention off")
    );
}

#[test]
fn the_fit_never_picks_a_placement_that_turns_flash_attention_off() {
    let f = flags(8192, 2);
    let h = granite(&[0, 8, 0, 8]).header();
    let engine = super::model::Model::new(&h, &f, Backend::RPC);
    let need = |ngl: u32, unfused: bool| engine.shares_as(ngl, 1, &[1.0], unfused).0[0].total;
    // Room for 3 layers with flash attention on, not for 4: the first GPU gives one back.
    let decided = |free: u64| {
        let d = decide_on(
            &h,
            &f,
            &[Device {
                name: "RPC".into(),
                free,
            }],
            &[0],
            Backend::RPC,
        );
        d.unwrap().placement().clone()
    };
    let p = decided(need(3, false) + (need(4, false) - need(3, false)) / 2);
    assert_eq!((p.ngl, p.flash_attention_off), (2, false));
    // The score matrix makes -ngl 3 need more than -ngl 4: room for 4 is 4, though the
    // engine's -ngl 3 would not fit.
    assert!(need(3, true) > need(4, false));
    let p = decided(need(4, false));
    assert_eq!((p.ngl, p.flash_attention_off), (4, false));
}

#[test]
fn falcon_h1_layers_attending_and_recurrent_at_once_keep_flash_attention_on() {
    // Every layer opens with the attention's norm (a GPU weight), not with its state reads:
    // no split turns flash attention off, and the fit keeps what fits.
    let f = flags(8192, 2);
    let mut m = granite(&[8, 8, 8, 8]);
    m.arch = "falcon-h1";
    let h = m.header();
    for ngl in 1..=5 {
        let p = place_on(&h, &f, ngl, &[1.0], Backend::RPC).unwrap();
        assert!(!p.flash_attention_off, "-ngl {ngl}");
    }
    let engine = super::model::Model::new(&h, &f, Backend::RPC);
    let need = engine.shares_as(3, 1, &[1.0], false).0[0].total;
    let d = decide_on(
        &h,
        &f,
        &[Device {
            name: "RPC".into(),
            free: need,
        }],
        &[0],
        Backend::RPC,
    );
    assert_eq!(d.unwrap().placement().ngl, 3);
}

/// Granite's hybrid blocks (`granite`) with separate query, key and value weights in the
/// attention blocks.
fn granite_with_projections(kv: &[u32]) -> crate::gguf::header::Header {
    let mut h = granite(kv).header();
    for (il, _) in kv.iter().enumerate().filter(|(_, k)| **k > 0) {
        for t in ["attn_q", "attn_k", "attn_v"] {
            h.tensors.push(crate::gguf::header::TensorInfo {
                name: format!("blk.{il}.{t}.weight"),
                dims: vec![N_EMBD, N_EMBD],
                ggml_type: 0,
                offset: 0,
            });
        }
    }
    h
}

#[test]
fn a_devices_lone_attention_layer_frees_the_masks_for_the_recurrent_layers_after_it() {
    let f = flags(8192, 2);
    let h = granite_with_projections(&[0, 0, 8, 0]);
    let p = parts(&h, &f);
    let (r, block) = (p.residual, p.activations - p.residual);
    // Attention block 2, then recurrent block 3, on the first device.
    let partial = place_on(&h, &f, 3, &[1.0, 1.0], Backend::RPC).unwrap();
    assert_eq!(partial.devices[0].layers, 2..4);
    assert!(!partial.flash_attention_off);
    // The input, its norm, the query, a roped query, the key and the value (8 heads of 128
    // for each: as wide as the embeddings) beside the masks; the scan after them, alone.
    assert_eq!(
        partial.devices[0].compute,
        (6 * r + p.masks).max(block) + inputs(&p, 1)
    );
    // Attention after a recurrent block: the masks stay through that block's peak.
    let later = place_on(&h, &f, 4, &[1.0, 1.0], Backend::RPC).unwrap();
    assert_eq!(later.devices[0].layers, 1..3);
    assert_eq!(later.devices[0].compute, block + p.masks + inputs(&p, 1));
    // Without the projections' weights their rows are unknown: memory's block beside the masks.
    let plain = granite(&[0, 0, 8, 0]).header();
    let unknown = place_on(&plain, &f, 3, &[1.0, 1.0], Backend::RPC).unwrap();
    assert_eq!(unknown.devices[0].compute, block + p.masks + inputs(&p, 1));
}

#[test]
fn a_hosts_only_mamba2_layer_hands_its_gate_to_the_next_devices_layer() {
    let f = flags(8192, 2);
    let h = mamba2(2).header();
    let p = parts(&h, &f);
    let (tokens, row) = (512, 4);
    assert_eq!(p.scan.state_rows, 3 * (1536 + 2 * 128) * 2 * row);
    let partial = place_on(&h, &f, 2, &[1.0, 1.0], Backend::RPC).unwrap();
    assert_eq!(partial.host.layers, 0..1);
    // The token ids (and two small ids, an aligned slot each), the embeddings input, its
    // gathered copy, the norm's freed row, the conv state's rows and the chain.
    let ids = tokens * row + 2 * 32;
    assert_eq!(
        u128::from(partial.host.compute),
        3 * u128::from(p.residual) + p.scan.state_rows + p.scan.chain + ids
    );
    assert!(partial.host.compute < estimate(&h, &f).compute);
    // With another block before it, that block runs its gate here: the CPU's fitted figure.
    let h = mamba2(4).header();
    let more = place_on(&h, &f, 3, &[1.0, 1.0], Backend::RPC).unwrap();
    assert_eq!(more.host.layers, 0..2);
    assert_eq!(more.host.compute, estimate(&h, &f).compute);
}
