//! Hostile headers end in the bounds error naming field, value and limit, within a second; the
//! largest real shapes still pass.

use std::time::Instant;

use super::super::bounds::{self, Kind, MAX_ESTIMATE, MAX_LAYERS, PARAMS};
use super::super::header::{Value, write};
use super::*;

const BUILD: u32 = 10587;

fn flags(ctx: u64) -> Flags {
    Flags {
        ctx_size: ctx,
        parallel: 1,
        ubatch: 512,
        build: BUILD,
        cpu: crate::gguf::memory::repack::Tiers::ANY,
        cpus: crate::gguf::memory::engine::DEFAULT_CPUS,
    }
}

/// A small llama header with `kv` (keys without the "llama." prefix) replacing or adding keys.
fn llama(kv: &[(&str, Value)]) -> Vec<u8> {
    let mut keys: Vec<(String, Value)> = vec![
        ("block_count".into(), Value::U32(2)),
        ("embedding_length".into(), Value::U32(256)),
        ("attention.head_count".into(), Value::U32(4)),
        ("attention.head_count_kv".into(), Value::U32(2)),
    ];
    for (k, v) in kv {
        keys.retain(|(have, _)| have != k);
        keys.push(((*k).into(), v.clone()));
    }
    let mut all = vec![(
        "general.architecture".to_string(),
        Value::String("llama".into()),
    )];
    all.extend(keys.into_iter().map(|(k, v)| (format!("llama.{k}"), v)));
    let refs: Vec<(&str, Value)> = all.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    write::header(&refs, &[("token_embd.weight", &[256, 512], 1)])
}

/// The bounds error the whole inspection of `bytes` ends in, within a second.
fn refused(bytes: &[u8], f: &Flags) -> BoundsError {
    let start = Instant::now();
    let e = inspect(&[("m.gguf", bytes)], BUILD, f).unwrap_err();
    let took = start.elapsed();
    assert!(took.as_secs_f64() < 1.0, "{e} took {took:?}");
    match e {
        InspectError::Bounds(b) => b,
        InspectError::Read(ReadError::Invalid {
            source: GgufError::Bounds(b),
            ..
        }) => b,
        other => panic!("not a bounds error: {other:?}"),
    }
}

fn above(field: &str, value: u128, limit: u64, unit: &'static str) -> BoundsError {
    BoundsError::AboveLimit {
        field: field.into(),
        value,
        limit,
        unit,
    }
}

#[test]
fn a_block_count_of_0xfffffff0_is_refused_at_4096_layers() {
    let e = refused(
        &llama(&[("block_count", Value::U32(0xFFFF_FFF0))]),
        &flags(4096),
    );
    assert_eq!(
        e.to_string(),
        "llama.block_count is 4294967280, above the limit of 4096 layers"
    );
    assert_eq!(e.reason(), "InvalidHeader");
}

#[test]
fn heads_of_2_pow_32_minus_1_are_refused() {
    let e = refused(
        &llama(&[("attention.head_count", Value::U32(u32::MAX))]),
        &flags(4096),
    );
    assert_eq!(
        e,
        above("llama.attention.head_count", u32::MAX.into(), 4096, "heads")
    );
    let e = refused(
        &llama(&[("attention.head_count_kv", write::u32s(&[8, u32::MAX]))]),
        &flags(4096),
    );
    assert_eq!(
        e,
        above(
            "llama.attention.head_count_kv[1]",
            u32::MAX.into(),
            4096,
            "heads"
        )
    );
}

#[test]
fn a_kv_head_array_longer_than_the_layers_is_refused() {
    let e = refused(
        &llama(&[("attention.head_count_kv", write::u32s(&[8, 8, 8]))]),
        &flags(4096),
    );
    assert_eq!(
        e,
        BoundsError::PerLayerLength {
            field: "llama.attention.head_count_kv".into(),
            len: 3,
            layers: 2
        }
    );
    assert!(e.to_string().contains("has 3 entries"), "{e}");
}

#[test]
fn a_vocabulary_of_2_pow_40_tokens_is_refused() {
    let e = refused(&llama(&[("vocab_size", Value::U64(1 << 40))]), &flags(4096));
    assert_eq!(
        e.to_string(),
        "llama.vocab_size is 1099511627776, above the limit of 4194304 tokens"
    );
}

#[test]
fn an_expert_count_of_2_pow_31_is_refused() {
    let e = refused(
        &llama(&[("expert_count", Value::U32(1 << 31))]),
        &flags(4096),
    );
    assert_eq!(e, above("llama.expert_count", 1 << 31, 4096, "experts"));
}

#[test]
fn every_hyper_parameter_beyond_its_bound_is_refused_naming_it() {
    for p in PARAMS {
        let value = p.limit + 1;
        let e = refused(&llama(&[(p.key, Value::U64(value))]), &flags(4096));
        assert_eq!(
            e,
            above(&format!("llama.{}", p.key), value.into(), p.limit, p.unit),
            "{}",
            p.key
        );
        // At the limit it is not refused for being large.
        let at = inspect(
            &[("m.gguf", &llama(&[(p.key, Value::U64(p.limit))]))],
            BUILD,
            &flags(4096),
        );
        if let Err(InspectError::Bounds(BoundsError::AboveLimit { field, .. })) = &at {
            assert_ne!(field, &format!("llama.{}", p.key), "at its limit");
        }
    }
}

#[test]
fn per_layer_flags_longer_than_the_layer_bound_are_refused() {
    for p in PARAMS.iter().filter(|p| p.kind == Kind::LayerFlags) {
        let long = Value::Array {
            value_type: 7,
            len: MAX_LAYERS + 1,
            items: Some(vec![Value::Bool(false); (MAX_LAYERS + 1) as usize]),
        };
        let e = refused(&llama(&[(p.key, long)]), &flags(4096));
        assert_eq!(
            e,
            above(
                &format!("the length of llama.{}", p.key),
                (MAX_LAYERS + 1).into(),
                MAX_LAYERS,
                "layers"
            )
        );
    }
}

#[test]
fn settings_beyond_their_bounds_are_refused_as_the_spec() {
    let e = refused(&llama(&[]), &flags(1 << 40));
    assert_eq!(e.reason(), "InvalidSpec");
    assert_eq!(
        e.to_string(),
        "the context size (--ctx-size) is 1099511627776, above the limit of 67108864"
    );
}

#[test]
fn counts_each_within_bounds_whose_estimate_passes_a_petabyte_are_refused() {
    let bytes = llama(&[
        ("block_count", Value::U32(4096)),
        ("attention.head_count", Value::U32(4096)),
        ("attention.head_count_kv", Value::U32(4096)),
        ("attention.key_length", Value::U32(1 << 14)),
    ]);
    let e = refused(&bytes, &flags(1 << 26));
    let BoundsError::AboveLimit {
        field,
        value,
        limit,
        ..
    } = &e
    else {
        panic!("{e:?}");
    };
    assert_eq!(field, "the estimated memory of a replica");
    assert!(*value > u128::from(MAX_ESTIMATE));
    assert_eq!(*limit, MAX_ESTIMATE);
    // The unchecked estimate says the most it may, never more.
    let h = header::parse(&bytes, true).unwrap();
    assert_eq!(memory::estimate(&h, &flags(1 << 26)).total, MAX_ESTIMATE);
}

#[test]
fn the_largest_real_shapes_still_pass() {
    // 160 layers, 256 experts of which 8 are used, a 262,144-token vocabulary written out,
    // 16k embedding, 128 heads, per-layer KV heads, 1M tokens of context.
    let tokens: Vec<String> = (0..262_144).map(|i| format!("tok{i}")).collect();
    let token_refs: Vec<&str> = tokens.iter().map(String::as_str).collect();
    let kv_heads: Vec<u32> = (0..160).map(|il| if il % 4 == 3 { 0 } else { 8 }).collect();
    let kv: Vec<(&str, Value)> = vec![
        ("general.architecture", Value::String("deepseek2".into())),
        ("deepseek2.block_count", Value::U32(160)),
        ("deepseek2.context_length", Value::U32(1 << 20)),
        ("deepseek2.embedding_length", Value::U32(16_384)),
        ("deepseek2.feed_forward_length", Value::U32(53_248)),
        ("deepseek2.attention.head_count", Value::U32(128)),
        ("deepseek2.attention.head_count_kv", write::u32s(&kv_heads)),
        ("deepseek2.attention.key_length", Value::U32(576)),
        ("deepseek2.attention.value_length", Value::U32(512)),
        ("deepseek2.attention.kv_lora_rank", Value::U32(512)),
        ("deepseek2.attention.q_lora_rank", Value::U32(1536)),
        ("deepseek2.expert_count", Value::U32(256)),
        ("deepseek2.expert_used_count", Value::U32(8)),
        ("deepseek2.expert_shared_count", Value::U32(1)),
        ("deepseek2.expert_feed_forward_length", Value::U32(2048)),
        ("deepseek2.leading_dense_block_count", Value::U32(3)),
        ("tokenizer.ggml.tokens", write::strings(&token_refs)),
    ];
    let bytes = write::header(
        &kv,
        &[
            ("token_embd.weight", &[16_384, 262_144], 12),
            ("blk.3.ffn_gate_exps.weight", &[16_384, 2048, 256], 12),
            ("output.weight", &[16_384, 262_144], 14),
        ],
    );
    let start = Instant::now();
    let (h, v) = inspect(&[("big.gguf", &bytes)], BUILD, &flags(131_072)).unwrap();
    assert!(
        start.elapsed().as_secs_f64() < 1.0,
        "took {:?}",
        start.elapsed()
    );
    assert_eq!(h.tensors.len(), 3);
    assert_eq!(
        v.first_build,
        support::first_build(&h, false, BUILD).unwrap()
    );
    assert!(!v.estimate.fallback);
    // 120 attention layers of 8 KV heads x 576 K elements, f16, no V (MLA from b7832: not
    // here, there is no key_length_mla), 131072 cells.
    assert_eq!(v.estimate.kv_bytes_per_token, 120 * 8 * (576 + 512) * 2);
    assert_eq!(v.estimate, memory::estimate(&h, &flags(131_072)));
}

#[test]
fn shards_together_may_not_pass_the_tensor_bound() {
    let shard = Header {
        version: 3,
        metadata: Default::default(),
        tensors: vec![
            header::TensorInfo {
                name: "t".into(),
                dims: vec![1],
                ggml_type: 0,
                offset: 0,
            };
            (bounds::MAX_TENSORS / 2 + 1) as usize
        ],
        alignment: 32,
        data_offset: 0,
    };
    let mut model = None;
    merge(&mut model, shard.clone(), "a.gguf").unwrap();
    let e = merge(&mut model, shard, "b.gguf").unwrap_err();
    assert_eq!(e.reason(), "InvalidHeader");
    assert_eq!(
        e.to_string(),
        "b.gguf: the tensor count of all shards is 262146, above the limit of 262144 tensors"
    );
}

#[test]
fn an_unsupported_architecture_keeps_its_reason() {
    let bytes = write::header(
        &[("general.architecture", Value::String("no-such-arch".into()))],
        &[],
    );
    let e = inspect(&[("m.gguf", &bytes)], BUILD, &flags(4096)).unwrap_err();
    assert_eq!(e.reason(), "UnsupportedArchitecture");
    let e = inspect(&[("m.gguf", b"GGUF\x03\x00")], BUILD, &flags(4096)).unwrap_err();
    assert_eq!(e.reason(), "InvalidGGUF");
}
