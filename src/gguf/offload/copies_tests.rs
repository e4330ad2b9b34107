//! Under op offload, what a wide dense model's first GPU puts past a host layer's copies once
//! the mask lies above them (`Model::past_the_copies`), against the alloc traces of the two
//! models these headers copy (testbed/alloc-trace.sh over an rpc-server device given CUDA's
//! offload rule, `-ngl 1` and `-ngl 4`, 2 slots).

use super::tests::MIB;
use super::*;
use crate::gguf::header::{Value, write};

/// A four-block dense model with f16 weights and a gated FFN, as testbed/gen_gguf.py writes
/// one (289 tokens): `arch`, its width, heads, KV heads, FFN width, and whether the
/// projections have biases (qwen2).
fn dense(arch: &str, n_embd: u64, heads: u32, kv_heads: u32, ff: u64, bias: bool) -> Header {
    let kv_width = n_embd / u64::from(heads) * u64::from(kv_heads);
    let kv: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String(arch.into())),
        (format!("{arch}.block_count"), Value::U32(4)),
        (format!("{arch}.context_length"), Value::U32(32768)),
        (
            format!("{arch}.embedding_length"),
            Value::U32(n_embd as u32),
        ),
        (format!("{arch}.feed_forward_length"), Value::U32(ff as u32)),
        (format!("{arch}.attention.head_count"), Value::U32(heads)),
        (
            format!("{arch}.attention.head_count_kv"),
            Value::U32(kv_heads),
        ),
        (format!("{arch}.vocab_size"), Value::U32(289)),
    ];
    let mut tensors: Vec<(String, Vec<u64>, u32)> = vec![
        ("token_embd.weight".into(), vec![n_embd, 289], 1),
        ("output_norm.weight".into(), vec![n_embd], 0),
        ("output.weight".into(), vec![n_embd, 289], 1),
    ];
    for il in 0..4 {
        let b = |name: &str| format!("blk.{il}.{name}");
        tensors.push((b("attn_norm.weight"), vec![n_embd], 0));
        tensors.push((b("attn_q.weight"), vec![n_embd, n_embd], 1));
        tensors.push((b("attn_k.weight"), vec![n_embd, kv_width], 1));
        tensors.push((b("attn_v.weight"), vec![n_embd, kv_width], 1));
        if bias {
            tensors.push((b("attn_q.bias"), vec![n_embd], 0));
            tensors.push((b("attn_k.bias"), vec![kv_width], 0));
            tensors.push((b("attn_v.bias"), vec![kv_width], 0));
        }
        tensors.push((b("attn_output.weight"), vec![n_embd, n_embd], 1));
        tensors.push((b("ffn_norm.weight"), vec![n_embd], 0));
        tensors.push((b("ffn_gate.weight"), vec![n_embd, ff], 1));
        tensors.push((b("ffn_up.weight"), vec![n_embd, ff], 1));
        tensors.push((b("ffn_down.weight"), vec![ff, n_embd], 1));
    }
    write::parsed(&kv, &tensors)
}

/// Asserts that the first GPU's compute buffer at `ctx` cells of 2 slots and `-ngl ngl` is
/// the `logged` MiB (which llama-server rounds to two decimals) or up to 0.05 MiB more (the
/// small inputs and their alignment).
fn first_gpu(h: &Header, ctx: u64, ngl: u32, logged: f64) {
    let f = super::tests::flags(ctx, 2);
    let p = place(h, &f, ngl, &[1.0]).unwrap();
    let mib = p.devices[0].compute as f64 / MIB as f64;
    assert!(
        (logged - 0.005..logged + 0.05).contains(&mib),
        "{ctx} cells, -ngl {ngl}: {mib:.2} MiB counted, {logged} logged"
    );
}

#[test]
fn a_wide_llamas_ffn_rows_and_a_later_layers_copies_land_above_the_mask_over_the_copies() {
    let h = dense("llama", 1024, 16, 4, 2816, false);
    // 16384 cells: the 8 MiB mask above 16 MiB of copies; the FFN's up rows above it, then
    // layer 1's output in the gate rows' place, its copies above the mask (46.00 logged).
    first_gpu(&h, 16384, 1, 46.0);
    // One host layer: its FFN's up rows above the mask (35.50).
    first_gpu(&h, 16384, 4, 35.5);
    // 8192 cells: the gate and up rows above the 4 MiB mask, the weight below (29.00).
    first_gpu(&h, 8192, 1, 29.0);
}

#[test]
fn a_wide_qwen2s_ffn_weight_and_rows_land_above_the_mask_over_the_copies() {
    let h = dense("qwen2", 1536, 12, 2, 8960, true);
    // The 26.25 MiB weight and both 17.5 MiB rows above the mask: 94.26 and 82.26 logged;
    // at 8192 cells the 4 MiB mask does not fit the 1.5 MiB the query leaves of its weight's
    // place.
    first_gpu(&h, 16384, 1, 94.26);
    first_gpu(&h, 8192, 1, 82.26);
    first_gpu(&h, 8192, 4, 82.26);
}
