//! Where the graph allocator's holes set a compute buffer's peak, as llama-server laid them
//! out over an rpc-server device (`testbed/alloc-trace.sh` prints those layouts).

use super::inputs_tests::inputs;
use super::rpc_tests::{granite, mamba2};
use super::tests::{MIB, Model, N_EMBD, flags};
use super::*;
use crate::gguf::header::Value;
use crate::gguf::memory::parts;

#[test]
fn a_gated_ffns_device_keeps_the_hole_its_input_leaves() {
    // llama-server over an rpc-server device (GGML_ALLOCATOR_DEBUG): the split's input, freed
    // by the first layer, leaves a residual-wide hole below the gate, up and product rows.
    let (plain, gated) = (Model::llama(4, 64 * MIB), Model::llama(4, 64 * MIB).gated());
    let f = flags(4096, 1);
    let p = parts(&gated.header(), &f);
    assert_eq!(p.activations, parts(&plain.header(), &f).activations);
    let one = |m: &Model, ngl, split: &[f64]| place_on(&m.header(), &f, ngl, split, Backend::RPC);
    let (with, without) = (
        one(&gated, 5, &[1.0]).unwrap(),
        one(&plain, 5, &[1.0]).unwrap(),
    );
    assert_eq!(
        with.devices[0].compute,
        p.activations + p.masks + inputs(&p, 1),
        "the CPU's own peak"
    );
    assert_eq!(
        without.devices[0].compute + p.residual,
        with.devices[0].compute
    );
    // A partial offload's device takes the host's rows as its input: the same hole.
    let partial = one(&gated, 3, &[1.0]).unwrap();
    assert_eq!(partial.devices[0].layers, 2..4);
    assert_eq!(
        partial.devices[0].compute,
        p.activations + p.masks + inputs(&p, 1)
    );
    // A pipeline keeps its inputs, so leaves no hole.
    let (a, b) = (
        one(&gated, 5, &[1.0, 1.0]).unwrap(),
        one(&plain, 5, &[1.0, 1.0]).unwrap(),
    );
    let compute = |p: &Placement| p.devices.iter().map(|d| d.compute).collect::<Vec<_>>();
    assert_eq!(compute(&a), compute(&b));
}

/// deepseek2's shapes (8 heads, a 512-wide latent with 64 rotary elements, a 192-wide query per
/// head), a dense block, then MoE blocks.
pub(super) fn deepseek2() -> Model {
    deepseek2_with(16 * MIB)
}

/// [`deepseek2`] with blocks of `block` bytes.
pub(super) fn deepseek2_with(block: u64) -> Model {
    let mut m = Model::llama(4, block);
    m.arch = "deepseek2";
    m.kv = vec![
        ("attention.head_count", Value::U32(8)),
        ("attention.head_count_kv", Value::U32(1)),
        ("attention.key_length", Value::U32(576)),
        ("attention.value_length", Value::U32(512)),
        ("attention.key_length_mla", Value::U32(192)),
        ("attention.kv_lora_rank", Value::U32(512)),
        ("feed_forward_length", Value::U32(2816)),
        ("expert_count", Value::U32(8)),
        ("expert_used_count", Value::U32(4)),
        ("expert_feed_forward_length", Value::U32(512)),
        ("leading_dense_block_count", Value::U32(1)),
    ];
    m
}

#[test]
fn latent_attention_after_one_moe_block_at_most_peaks_as_traced() {
    let (h, f) = (deepseek2().header(), flags(8192, 2));
    let p = parts(&h, &f);
    // Three residual rows and, per head, the roped query, the query, the absorbed query and
    // the joined one; the ids 16 bytes a token and the outputs' slot; the masks.
    let traced = 512 * (4 * (3 * N_EMBD as u128 + 8 * (64 + 192 + 512 + 576)) + 16) + 32;
    assert_eq!(u128::from(p.latent_compute), traced + u128::from(p.masks));
    assert!(p.latent_compute < p.estimate.compute);
    // The host holds the dense block and the first MoE block: no block after a MoE one.
    let partial = place_on(&h, &f, 3, &[1.0, 1.0], Backend::RPC).unwrap();
    assert_eq!(partial.host.layers, 0..2);
    assert_eq!(partial.host.compute, p.latent_compute);
    // Its device runs blocks 2 and 3: one MoE block before block 3's attention, as traced.
    assert_eq!(partial.devices[0].layers, 2..4);
    assert_eq!(partial.devices[0].compute, p.latent_compute);
    // One MoE block before the host's last attention still leaves it as traced.
    let more = place_on(&h, &f, 2, &[1.0, 1.0], Backend::RPC).unwrap();
    assert_eq!(more.host.layers, 0..3);
    assert_eq!(more.host.compute, p.latent_compute);
    // Two MoE blocks before an attention: the fitted figure, the CPU's, and a device's whole,
    // its norm in the input's place.
    let all = place_on(&h, &f, 1, &[1.0], Backend::RPC).unwrap();
    assert_eq!(all.host.layers, 0..4);
    assert_eq!(all.host.compute, p.estimate.compute);
    let most = place_on(&h, &f, 4, &[1.0], Backend::RPC).unwrap();
    assert_eq!(most.devices[0].layers, 1..4);
    assert_eq!(
        most.devices[0].compute,
        p.activations + p.masks + inputs(&p, 1)
    );
    // A pipeline keeps its input copies: block 3's attention after block 2's MoE on the second
    // device stacks the fitted rows above them; above all four copies of the first, whose
    // attention follows no MoE block, block 0's output under block 1's norm and, per head,
    // the roped query, the query, the absorbed query and the joined one (46.02 MiB logged).
    let (r, m) = (p.residual, p.masks);
    let query = 512 * 4 * (N_EMBD + 8 * (64 + 192 + 512 + 576));
    let pipeline = place_on(&h, &f, 5, &[1.0, 3.0], Backend::RPC).unwrap();
    assert_eq!(pipeline.devices[1].layers, 2..4);
    assert_eq!(
        pipeline.devices[1].compute,
        4 * r + 4 * m + 4 * inputs(&p, 1) + p.activations
    );
    assert_eq!(pipeline.devices[0].layers, 0..2);
    assert_eq!(
        pipeline.devices[0].compute,
        4 * r + 4 * m + 4 * inputs(&p, 1) + r + query
    );
    // At 1:1 the second device runs block 3 alone: the same rows right above its copies, no
    // MoE block's before them (44.52 logged; memory's fitted rows had 48.52).
    let even = place_on(&h, &f, 5, &[1.0, 1.0], Backend::RPC).unwrap();
    assert_eq!(
        (even.devices[1].layers.clone(), even.devices[1].output),
        (3..4, true)
    );
    assert_eq!(
        even.devices[1].compute,
        4 * r + 4 * m + 4 * inputs(&p, 1) + query
    );
    assert!(even.devices[1].compute < pipeline.devices[1].compute);
}

#[test]
fn a_pipeline_device_with_the_output_layer_alone_copies_in_the_output_rows_not_the_residual() {
    let (h, f) = (deepseek2().header(), flags(8192, 2));
    let p = parts(&h, &f);
    // The blocks split over two devices, the third gets the output layer alone (1.01 MiB
    // logged with deepseek2-bench): four copies of the gathered output rows, the output norm
    // and the logits; four residual copies had made it 6.99.
    let three = place_on(&h, &f, 5, &[1.0, 1.0, 1.0], Backend::RPC).unwrap();
    let last = &three.devices[2];
    assert!(last.layers.is_empty() && last.output);
    assert_eq!(last.compute, p.logits + 5 * p.out_rows);
    assert!(last.compute < 4 * p.residual);
}

#[test]
fn a_later_pipeline_device_running_one_mamba2_layer_has_the_gate_on_top_where_no_hole_holds_it() {
    let f = flags(8192, 2);
    // The benchmark's scan: its output is wider than the convolution's input, whose freed
    // place then holds the gate's copy.
    let h = mamba2(8).header();
    let p = parts(&h, &f);
    assert!(!p.scan.gate_spills);
    let last = place_on(&h, &f, 9, &[3.0, 1.0], Backend::RPC).unwrap();
    assert_eq!(last.devices[1].layers, 7..8);
    let (r, chain, input) = (u128::from(p.residual), p.scan.chain, p.scan.input);
    assert_eq!(
        u128::from(last.devices[1].compute),
        4 * r + r + p.scan.state_rows + chain + 4 * input,
        "four input copies, one row's hole, the conv state's rows, the chain and the \
         in-projection's four copies"
    );
    // mamba2-tiny's widths: the output takes the convolution input's place, and the gate,
    // wider than what is left of it, lands on top.
    let h = scan_widths(mamba2(8), 128, 16).header();
    let p = parts(&h, &f);
    assert!(p.scan.gate_spills);
    let last = place_on(&h, &f, 9, &[3.0, 1.0], Backend::RPC).unwrap();
    assert_eq!(last.devices[1].layers, 7..8);
    let (r, chain, input) = (u128::from(p.residual), p.scan.chain, p.scan.input);
    assert_eq!(
        u128::from(last.devices[1].compute),
        4 * r + r + p.scan.state_rows + chain + p.scan.gate + 4 * input
    );
}

#[test]
fn a_host_running_two_mamba2_layers_in_a_row_holds_the_second_above_the_firsts_output() {
    // granitehybrid-tiny's pattern, blocks 0 and 1 on the host: above the graph's inputs (the
    // embeddings twice, the mask, the token ids and the small inputs), the first block's
    // output and the second scan's rows (6.05 MiB logged over two rpc-server devices, memory's
    // fitted figure 5.84; alloc trace). Its scan is wide beside the residual, as the tiny
    // model's is, and its output fits in the convolution input's place.
    let f = flags(8192, 2);
    let h = scan_widths(granite(&[0, 0, 8, 0]), 2048, 4).header();
    let p = parts(&h, &f);
    let partial = place_on(&h, &f, 3, &[1.0, 1.0], Backend::RPC).unwrap();
    assert_eq!(partial.host.layers, 0..2);
    let r = u128::from(p.residual);
    let graph_inputs = 2 * r + u128::from(p.masks) + u128::from(512 * 4 + inputs(&p, 1));
    let follow = graph_inputs + r + p.scan.follow;
    assert!(follow > u128::from(p.estimate.compute));
    assert_eq!(u128::from(partial.host.compute), follow);
}

/// `m` with its mamba2 layers' inner and state widths set.
fn scan_widths(mut m: Model, inner: u32, state: u32) -> Model {
    for (key, value) in &mut m.kv {
        match *key {
            "ssm.inner_size" => *value = Value::U32(inner),
            "ssm.state_size" => *value = Value::U32(state),
            _ => {}
        }
    }
    m
}
