//! The graph's inputs on each device and on the host: the embeddings and masks, and the small
//! ones beside them (positions, cache indices, token ids), as llama-server allocated them over
//! rpc-server devices (`testbed/alloc-trace.sh`).

use super::tests::{MIB, Model, flags};
use super::*;
use crate::gguf::header::Value;
use crate::gguf::memory::{Parts, parts};

/// The small graph inputs of a split whose layers write `caches` KV caches
/// (`Model::small_inputs`): their positions and each cache's cell indices.
pub(super) fn inputs(p: &Parts, caches: u64) -> u64 {
    p.positions + caches * p.cache_indices
}

#[test]
fn each_split_holds_its_positions_and_the_cell_indices_of_the_caches_its_layers_write() {
    // A ubatch of 512: positions (i32) and, per cache, each token's key and value cell (i64).
    let (h, f) = (
        Model::llama(4, 16 * MIB).windowed().header(),
        flags(16384, 1),
    );
    let p = parts(&h, &f);
    assert_eq!((p.positions, p.cache_indices), (512 * 4, 512 * 2 * 8));
    // gemma3-gpu on one rpc-server device logged 9.02 MiB where its rows came to 9.00: the
    // 18 KiB of both caches' indices and the positions under them.
    assert_eq!(inputs(&p, 2), 18 * 1024);
    // Under every row the device allocates, beside gemma's query hole (its gate is wider).
    let one = place_on(&h, &f, 5, &[1.0], Backend::RPC).unwrap();
    assert_eq!(
        one.devices[0].compute,
        p.activations - p.residual + p.masks + p.query + inputs(&p, 2)
    );
    // A latent cache has keys only.
    let mut latent = Model::llama(4, 16 * MIB);
    latent.arch = "deepseek2";
    latent.kv.extend([
        ("attention.kv_lora_rank", Value::U32(512)),
        ("attention.key_length_mla", Value::U32(192)),
    ]);
    let q = parts(&latent.header(), &f);
    assert_eq!(q.cache_indices, 512 * 8);
    // Without attention there is nothing to index.
    let mut scan = Model::llama(4, 16 * MIB);
    scan.arch = "mamba2";
    scan.kv = vec![
        ("ssm.inner_size", Value::U32(1536)),
        ("ssm.state_size", Value::U32(128)),
    ];
    let s = parts(&scan.header(), &f);
    assert_eq!((s.positions, s.cache_indices), (0, 0));
}

#[test]
fn the_host_keeps_the_graphs_inputs_and_the_pipeline_four_copies() {
    let m = Model::llama(4, 64 * MIB);
    let (h, f) = (m.header(), flags(4096, 1));
    let p = parts(&h, &f);
    // The embeddings twice and the masks; the token ids (i32, as wide as the positions) and
    // the small inputs beside them.
    let small = p.positions + inputs(&p, 1);
    let host = 2 * p.residual + p.masks + small;
    let one = place_on(&h, &f, 5, &[1.0], Backend::RPC).unwrap();
    assert_eq!(one.host.compute, host);
    assert_eq!(
        one.devices[0].compute,
        p.activations - p.residual + p.masks + inputs(&p, 1),
        "the blocks' peak; the logits come after it"
    );
    let two = place_on(&h, &f, 5, &[1.0, 1.0], Backend::RPC).unwrap();
    let copies = 3 * (p.residual + p.masks);
    assert_eq!(two.host.compute, host + copies + 3 * small);
    // The first device keeps all four copies of its input below the block's own rows (its
    // attention's output and its norm's hole; llama-tiny, 1:3: 17.54 MiB logged). A scan's
    // fitted rows hold one of them (rpc_tests: a pipeline's first mamba2 device).
    assert_eq!(
        two.devices[0].compute,
        p.activations - p.residual + 4 * (p.residual + p.masks + inputs(&p, 1))
    );
}

#[test]
fn a_pipelines_output_device_keeps_its_input_copies_beside_the_logits() {
    // A narrow FFN and many slots: the slots' logits outweigh the block.
    let mut m = Model::llama(4, MIB);
    m.kv.push(("feed_forward_length", Value::U32(64)));
    let (h, f) = (m.header(), flags(4096, 64));
    let p = parts(&h, &f);
    assert!(p.logits > p.activations);
    let two = place_on(&h, &f, 5, &[1.0, 1.0], Backend::RPC).unwrap();
    assert_eq!(
        two.devices[1].compute,
        4 * (p.residual + p.masks + inputs(&p, 1)) + p.logits + 2 * p.out_rows
    );
}
