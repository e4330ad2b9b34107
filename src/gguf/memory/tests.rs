//! The estimate against figures llama-server prints for real shapes.

use super::super::header::{TensorInfo, Value, parse, write};
use super::*;

fn flags(ctx: u64, parallel: u64) -> Flags {
    Flags {
        ctx_size: ctx,
        parallel,
        ubatch: 512,
        build: 10000,
        cpu: repack::Tiers::ANY,
        cpus: crate::gguf::memory::engine::DEFAULT_CPUS,
    }
}

fn header(arch: &str, kv: &[(&str, Value)]) -> Header {
    let mut all = vec![("general.architecture", Value::String(arch.into()))];
    let keys: Vec<(String, Value)> = kv
        .iter()
        .map(|(k, v)| (format!("{arch}.{k}"), v.clone()))
        .collect();
    all.extend(keys.iter().map(|(k, v)| (k.as_str(), v.clone())));
    parse(
        &write::header(&all, &[("token_embd.weight", &[4096, 1000], 1)]),
        true,
    )
    .unwrap()
}

#[test]
fn llama_31_8b_kv_is_128_kib_per_token() {
    let h = header(
        "llama",
        &[
            ("block_count", Value::U32(32)),
            ("embedding_length", Value::U32(4096)),
            ("attention.head_count", Value::U32(32)),
            ("attention.head_count_kv", Value::U32(8)),
        ],
    );
    let e = estimate(&h, &flags(8192, 1));
    assert_eq!(e.kv_bytes_per_token, 128 << 10);
    assert_eq!(e.kv, 1 << 30, "8192 tokens -> 1024 MiB");
    assert_eq!(e.weights, 4096 * 1000 * 2);
    assert!(!e.fallback);
    assert!(
        e.basis
            .starts_with("weights 7.8 MiB + KV 1.0 GiB for 8192 tokens in 1 slot(s)"),
        "{}",
        e.basis
    );
}

#[test]
fn gemma3_27b_sliding_window_layers_keep_only_the_window() {
    let h = header(
        "gemma3",
        &[
            ("block_count", Value::U32(62)),
            ("embedding_length", Value::U32(5376)),
            ("attention.head_count", Value::U32(32)),
            ("attention.head_count_kv", Value::U32(16)),
            ("attention.key_length", Value::U32(128)),
            ("attention.value_length", Value::U32(128)),
            ("attention.sliding_window", Value::U32(1024)),
        ],
    );
    let e = estimate(&h, &flags(32768, 1));
    // 10 global layers x 32768 cells + 52 SWA layers x 1536 cells, 8 KiB per layer per token.
    assert_eq!(e.kv, (10 * 32768 + 52 * 1536) * 8192);
    assert_eq!(e.kv >> 20, 3184);
    // Checkpoints copy the cells the window still sees (1024 of the 1536), with 12 bytes of
    // position and sequence id each, of the sliding-window layers only.
    assert_eq!(e.checkpoints, CTX_CHECKPOINTS * 1024 * (52 * 8192 + 12));
    assert!(
        e.basis
            .contains("(2 per slot of its last 1024 sliding-window tokens)"),
        "{}",
        e.basis
    );
    // A slot shorter than the window checkpoints all of its cells.
    let short = estimate(&h, &flags(2048, 4));
    assert_eq!(
        short.checkpoints,
        CTX_CHECKPOINTS * 4 * 512 * (52 * 8192 + 12)
    );
}

#[test]
fn deepseek_mla_caches_576_k_elements_and_no_v() {
    let h = header(
        "deepseek2",
        &[
            ("block_count", Value::U32(61)),
            ("embedding_length", Value::U32(7168)),
            ("attention.head_count", Value::U32(128)),
            ("attention.head_count_kv", Value::U32(1)),
            ("attention.key_length", Value::U32(576)),
            ("attention.value_length", Value::U32(512)),
            ("attention.key_length_mla", Value::U32(192)),
            ("attention.value_length_mla", Value::U32(128)),
        ],
    );
    assert_eq!(
        estimate(&h, &flags(32768, 1)).kv_bytes_per_token,
        61 * 576 * 2
    );
    let old = Flags {
        build: 7000,
        ..flags(32768, 1)
    };
    assert_eq!(estimate(&h, &old).kv_bytes_per_token, 61 * (576 + 512) * 2);
}

#[test]
fn mamba_state_is_per_slot_and_has_no_kv() {
    let h = header(
        "mamba",
        &[
            ("block_count", Value::U32(64)),
            ("embedding_length", Value::U32(2560)),
            ("ssm.conv_kernel", Value::U32(4)),
            ("ssm.inner_size", Value::U32(5120)),
            ("ssm.state_size", Value::U32(16)),
        ],
    );
    let one = estimate(&h, &flags(4096, 1));
    assert_eq!(one.kv, 0);
    // (3 x 5120 + 16 x 5120) x 4 B x 64 layers = 23.75 MiB per sequence.
    assert_eq!(one.recurrent, 24_903_680);
    let four = estimate(&h, &flags(4096, 4));
    assert_eq!(four.recurrent, 4 * 24_903_680);
    // The server keeps up to CTX_CHECKPOINTS copies of each slot's state.
    assert_eq!(four.checkpoints, CTX_CHECKPOINTS * 4 * 24_903_680);
    assert!(four.basis.contains("context checkpoints"), "{}", four.basis);
    let old = estimate(
        &h,
        &Flags {
            build: CHECKPOINTS_FROM - 1,
            ..flags(4096, 4)
        },
    );
    assert_eq!(
        old.checkpoints, 0,
        "no checkpoints before b{CHECKPOINTS_FROM}"
    );
    assert_eq!(
        four.total - old.total,
        four.checkpoints.div_ceil(1 << 20) << 20
    );
}

#[test]
fn a_full_attention_model_keeps_no_checkpoints() {
    let h = header(
        "llama",
        &[
            ("block_count", Value::U32(32)),
            ("embedding_length", Value::U32(4096)),
            ("attention.head_count", Value::U32(32)),
            ("attention.head_count_kv", Value::U32(8)),
        ],
    );
    assert_eq!(estimate(&h, &flags(4096, 4)).checkpoints, 0);
}

#[test]
fn a_hybrid_counts_kv_on_attention_layers_and_state_on_the_others() {
    let h = header(
        "granitehybrid",
        &[
            ("block_count", Value::U32(4)),
            ("embedding_length", Value::U32(1024)),
            ("attention.head_count", Value::U32(8)),
            ("attention.head_count_kv", write::u32s(&[0, 0, 0, 2])),
            ("ssm.conv_kernel", Value::U32(4)),
            ("ssm.inner_size", Value::U32(2048)),
            ("ssm.state_size", Value::U32(128)),
            ("ssm.group_count", Value::U32(1)),
        ],
    );
    let e = estimate(&h, &flags(4096, 2));
    assert_eq!(
        e.kv_bytes_per_token,
        2 * 128 * 2 * 2,
        "one attention layer, 2 KV heads of 128, K+V, f16"
    );
    assert_eq!(e.kv, e.kv_bytes_per_token * 4096);
    assert_eq!(e.recurrent, 3 * (3 * (2048 + 2 * 128) + 128 * 2048) * 4 * 2);
    assert!(
        e.basis.contains("recurrent state") && e.basis.contains("(3 layers)"),
        "{}",
        e.basis
    );
}

#[test]
fn a_header_without_shapes_gets_a_labelled_fallback() {
    let h = header("llama", &[]);
    let e = estimate(&h, &flags(4096, 1));
    assert!(e.fallback);
    assert!(e.basis.starts_with("FALLBACK"), "{}", e.basis);
    assert!(e.total > e.weights);
}

#[test]
fn context_is_padded_and_split_across_slots() {
    let h = header(
        "llama",
        &[
            ("block_count", Value::U32(1)),
            ("embedding_length", Value::U32(128)),
            ("attention.head_count", Value::U32(1)),
        ],
    );
    // 1000 tokens -> 1024 cells; 3 slots -> PAD(1024/3=341) = 512 cells each.
    assert_eq!(estimate(&h, &flags(1000, 1)).kv, 1024 * 128 * 2 * 2);
    assert_eq!(estimate(&h, &flags(1000, 3)).kv, 3 * 512 * 128 * 2 * 2);
}

#[test]
fn an_unchecked_absurd_header_and_settings_are_clamped_never_overflowed() {
    // Built by hand, past the parser and its checks: every count as large as a u64 goes.
    let arch = "granitehybrid";
    let mut metadata = std::collections::BTreeMap::new();
    metadata.insert(
        "general.architecture".to_string(),
        Value::String(arch.into()),
    );
    for key in super::super::bounds::PARAMS {
        metadata.insert(format!("{arch}.{}", key.key), Value::U64(u64::MAX));
    }
    let h = Header {
        version: 3,
        metadata,
        tensors: vec![
            TensorInfo {
                name: "t".into(),
                dims: vec![u64::MAX; 8],
                ggml_type: 0,
                offset: 0,
            };
            4
        ],
        alignment: 32,
        data_offset: 0,
    };
    let f = Flags {
        ctx_size: u64::MAX,
        parallel: u64::MAX,
        ubatch: u64::MAX,
        build: u32::MAX,
        cpu: repack::Tiers::ANY,
        cpus: crate::gguf::memory::engine::DEFAULT_CPUS,
    };
    let start = std::time::Instant::now();
    let e = estimate(&h, &f);
    assert!(
        start.elapsed().as_secs_f64() < 1.0,
        "took {:?}",
        start.elapsed()
    );
    assert_eq!(e.total, MAX_ESTIMATE);
    assert!(e.kv <= MAX_ESTIMATE && e.weights <= MAX_ESTIMATE);
    assert!(estimate_checked(&h, &f).is_err());
}

#[test]
fn the_checked_estimate_equals_the_estimate_of_a_valid_header() {
    let h = header(
        "llama",
        &[
            ("block_count", Value::U32(32)),
            ("embedding_length", Value::U32(4096)),
            ("attention.head_count", Value::U32(32)),
            ("attention.head_count_kv", Value::U32(8)),
        ],
    );
    assert_eq!(
        estimate_checked(&h, &flags(8192, 2)),
        Ok(estimate(&h, &flags(8192, 2)))
    );
}

/// The compute buffer of a shape the memory benchmark serves, in MiB.
fn compute_mib(arch: &str, kv: &[(&str, Value)], ctx: u64, parallel: u64) -> f64 {
    let h = header(arch, kv);
    estimate(&h, &flags(ctx, parallel)).compute as f64 / f64::from(1u32 << 20)
}

#[test]
fn compute_is_within_five_percent_of_what_llama_server_logged_for_real_widths() {
    let dense = |arch: &str, embd: u32, ff: u32, heads: u32, head_dim: u32| {
        vec![
            ("block_count", Value::U32(4)),
            ("embedding_length", Value::U32(embd)),
            ("feed_forward_length", Value::U32(ff)),
            ("attention.head_count", Value::U32(heads)),
            ("attention.head_count_kv", Value::U32(heads / 2)),
            ("attention.key_length", Value::U32(head_dim)),
            ("attention.value_length", Value::U32(head_dim)),
        ]
        .into_iter()
        .chain(if arch == "gemma3" {
            vec![("attention.sliding_window", Value::U32(1024))]
        } else {
            vec![]
        })
        .collect::<Vec<_>>()
    };
    // (arch, keys, ctx, slots, what b11312's CPU backend logged)
    let cases = [
        ("phi3", dense("phi3", 896, 4864, 14, 64), 16384, 4, 37.76),
        // gemma3 scales its embeddings: one more residual row where block 0 runs.
        (
            "gemma3",
            dense("gemma3", 2304, 9216, 8, 256),
            16384,
            4,
            77.02,
        ),
    ];
    for (arch, kv, ctx, parallel, logged) in cases {
        let got = compute_mib(arch, &kv, ctx, parallel);
        assert!(
            (got / logged - 1.0).abs() <= 0.05,
            "{arch}: {got:.2} MiB, llama-server logged {logged}"
        );
    }
    // mamba2 at 768 wide: the scan keeps each slot's new state (0.77 MiB a slot).
    let mamba = [
        ("block_count", Value::U32(8)),
        ("embedding_length", Value::U32(768)),
        ("ssm.conv_kernel", Value::U32(4)),
        ("ssm.inner_size", Value::U32(1536)),
        ("ssm.state_size", Value::U32(128)),
        ("ssm.group_count", Value::U32(1)),
        ("ssm.time_step_rank", Value::U32(24)),
    ];
    for (parallel, logged) in [(1, 22.34), (4, 24.71)] {
        let got = compute_mib("mamba2", &mamba, 16384, parallel);
        assert!(
            (got / logged - 1.0).abs() <= 0.05,
            "mamba2 x{parallel}: {got:.2} MiB, llama-server logged {logged}"
        );
    }
}

#[test]
fn logits_do_not_add_to_the_peak_of_the_blocks() {
    // A 64-wide model with a 262k vocabulary: the logits of 4 slots (4 MiB) come after the
    // blocks have freed their rows, so the peak is the blocks' and masks', as llama-server
    // logged (5.9 MiB), not the sum (9.9).
    let kv = [
        ("block_count", Value::U32(2)),
        ("embedding_length", Value::U32(64)),
        ("feed_forward_length", Value::U32(128)),
        ("attention.head_count", Value::U32(4)),
        ("attention.head_count_kv", Value::U32(2)),
        ("vocab_size", Value::U32(262_144)),
    ];
    let got = compute_mib("llama", &kv, 16384, 4);
    assert!((got - 5.125).abs() < 0.01, "{got}");
    let outputs_only = compute_mib("llama", &kv, 16384, 64);
    assert!(
        outputs_only > 64.0,
        "64 slots' logits (64 MiB) are the peak: {outputs_only}"
    );
}
