//! Every number of a header at the edges (each metadata number, each tensor's first dimension
//! and type), through the whole estimate: the CPU figure, the placement on one to three GPUs
//! of either backend at several `-ngl`, and the fit. A header the parser accepts may hold any
//! value within its bounds, and none may panic or loop.

use std::panic::{AssertUnwindSafe, catch_unwind};

use super::layout_tests::deepseek2;
use super::rpc_tests::mamba2;
use super::tests::{GIB, MIB, Model, flags, gpus, hybrid};
use super::*;
use crate::gguf::header::{Value, parse, write};
use crate::gguf::memory::estimate;

/// The edge values of one metadata value of its own type; none for strings.
fn edges(v: &Value) -> Vec<Value> {
    match v {
        Value::U32(_) => [0, 1, 3, 1_000_003, u32::MAX].map(Value::U32).to_vec(),
        Value::U64(_) => [0, 1, 3, 1 << 40, u64::MAX].map(Value::U64).to_vec(),
        Value::I32(_) => [0, -1, i32::MIN, i32::MAX].map(Value::I32).to_vec(),
        Value::F32(_) => [0.0, -1.0, f32::NAN, f32::INFINITY, 1e30]
            .map(Value::F32)
            .to_vec(),
        Value::Bool(b) => vec![Value::Bool(!b)],
        Value::Array {
            value_type: 4, len, ..
        } => [0, 1, u32::MAX]
            .map(|x| write::u32s(&vec![x; usize::try_from(*len).unwrap_or(0)]))
            .to_vec(),
        _ => vec![],
    }
}

/// The header `h` with a metadata key set to a value, or a tensor's (by index) first
/// dimension and type set to a shape, written and parsed again as the operator reads a file:
/// `None` where the parser refuses it (its bounds are its own tests').
fn with(
    h: &Header,
    metadata: Option<(&str, &Value)>,
    tensor: Option<(usize, (u64, u32))>,
) -> Option<Header> {
    let kv: Vec<(&str, Value)> = h
        .metadata
        .iter()
        .map(|(k, v)| match metadata {
            Some((key, value)) if key == k => (k.as_str(), value.clone()),
            _ => (k.as_str(), v.clone()),
        })
        .collect();
    let dims: Vec<Vec<u64>> = h
        .tensors
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let mut d = t.dims.clone();
            if let (Some((at, (first, _))), Some(d0)) = (tensor, d.first_mut())
                && at == i
            {
                *d0 = first;
            }
            d
        })
        .collect();
    let tensors: Vec<(&str, &[u64], u32)> = h
        .tensors
        .iter()
        .zip(&dims)
        .enumerate()
        .map(|(i, (t, d))| {
            let ty = match tensor {
                Some((at, (_, ty))) if at == i => ty,
                _ => t.ggml_type,
            };
            (t.name.as_str(), d.as_slice(), ty)
        })
        .collect();
    parse(&write::header(&kv, &tensors), true).ok()
}

/// Everything the operator computes from a header and a GPU list.
fn everything(h: &Header) {
    let f = flags(8192, 2);
    let _ = estimate(h, &f);
    for backend in [Backend::RPC, Backend::CUDA] {
        for ngl in [0, 1, 2, 99] {
            for split in [&[1.0][..], &[1.0, 3.0], &[1.0, 1.0, 1.0]] {
                let _ = place_on(h, &f, ngl, split, backend);
            }
        }
    }
    let _ = decide(h, &f, &gpus(&[24 * GIB, 16 * GIB]), 1024 * MIB);
    let _ = decide(h, &f, &gpus(&[GIB]), 0);
}

#[test]
fn every_header_number_at_its_edges_is_estimated_placed_and_fitted_without_a_panic() {
    let families: [(&str, Model); 5] = [
        ("llama", Model::llama(4, 16 * MIB)),
        (
            "gemma3",
            Model::llama(6, 16 * MIB).tied().gated().windowed(),
        ),
        ("granitehybrid", hybrid()),
        ("deepseek2", deepseek2()),
        ("mamba2", mamba2(8)),
    ];
    let (mut cases, mut failed) = (0, Vec::new());
    for (family, model) in &families {
        let h = model.header();
        let mut tries: Vec<(String, Option<Header>)> = Vec::new();
        for (key, value) in &h.metadata {
            for edge in edges(value) {
                let hostile = with(&h, Some((key, &edge)), None);
                tries.push((format!("{key} = {edge:?}"), hostile));
            }
        }
        for (i, t) in h.tensors.iter().enumerate() {
            let first = t.dims.first().copied().unwrap_or(0);
            for shape in [
                (0, t.ggml_type),
                (1 << 40, t.ggml_type),
                (first, 2),
                (first, 39),
            ] {
                let hostile = with(&h, None, Some((i, shape)));
                tries.push((format!("{} as {shape:?}", t.name), hostile));
            }
        }
        for (what, hostile) in tries {
            let Some(hostile) = hostile else { continue };
            cases += 1;
            if catch_unwind(AssertUnwindSafe(|| everything(&hostile))).is_err() {
                failed.push(format!("{family}: {what}"));
            }
        }
    }
    assert!(cases > 400, "only {cases} headers were accepted");
    assert!(failed.is_empty(), "panicked on {failed:?}");
}
