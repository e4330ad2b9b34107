//! The placement against what llama-server logged over llama.cpp's RPC backend (each
//! rpc-server a device; tests/offload_engine.rs runs it), on headers built by hand.

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
    assert_eq!(
        cuda.devices[0].compute,
        rpc.devices[0].compute + ffn,
        "CUDA copies the largest host weight in"
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
    assert_eq!(p.devices[1].compute, parts.logits + 2 * parts.out_rows);
    assert_eq!(parts.out_rows, N_EMBD * 4, "one slot, one output row");
}

#[test]
fn the_host_keeps_the_graphs_inputs_and_the_pipeline_four_copies() {
    let m = Model::llama(4, 64 * MIB);
    let (h, f, p) = (m.header(), flags(4096, 1), model_parts(&m));
    let inputs = 2 * p.residual + p.masks;
    let one = place_on(&h, &f, 5, &[1.0], Backend::RPC).unwrap();
    assert_eq!(one.host.compute, inputs);
    assert_eq!(
        one.devices[0].compute,
        p.activations - p.residual + p.masks,
        "the blocks' peak; the logits come after it"
    );
    let two = place_on(&h, &f, 5, &[1.0, 1.0], Backend::RPC).unwrap();
    let copies = 3 * (p.residual + p.masks);
    assert_eq!(two.host.compute, inputs + copies);
    assert_eq!(two.devices[0].compute, one.devices[0].compute + copies);
}

#[test]
fn a_device_reads_only_the_masks_of_its_layers() {
    // Layers 0-2 slide over a window, layer 3 attends to everything (gemma3's pattern of 4).
    let mut m = Model::llama(4, 16 * MIB);
    m.arch = "gemma3";
    m.kv.push(("attention.sliding_window", Value::U32(512)));
    m.kv.push(("attention.sliding_window_pattern", Value::U32(4)));
    let (h, f) = (m.header(), flags(16384, 1));
    let p = parts(&h, &f);
    assert!(p.mask_full > 0 && p.mask_window > 0);
    let split = place_on(&h, &f, 5, &[1.0, 1.0], Backend::RPC).unwrap();
    assert_eq!(split.devices[0].layers, 0..3);
    let block = p.activations - p.residual;
    assert_eq!(
        split.devices[0].compute,
        block + p.scaled + p.mask_window + 3 * (p.residual + p.mask_window),
        "window layers, the first block with gemma's scaled embeddings"
    );
    assert_eq!(
        split.devices[1].compute,
        block + p.mask_full + 3 * (p.residual + p.mask_full)
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
