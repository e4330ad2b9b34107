//! The placement against the engine's rules, on headers built by hand.

use super::inputs_tests::inputs;
use super::op_offload_tests::op_offload_peak;
use super::*;
use crate::gguf::header::{TensorInfo, Value, parse, write};
use crate::gguf::memory::{estimate, repack};

pub(super) const MIB: u64 = 1 << 20;
pub(super) const GIB: u64 = 1 << 30;
pub(super) const N_EMBD: u64 = 1024;
pub(super) const VOCAB: u64 = 32000;

pub(super) fn flags(ctx: u64, parallel: u64) -> Flags {
    Flags {
        ctx_size: ctx,
        parallel,
        ubatch: 512,
        build: 10000,
        cpu: repack::Tiers::one(repack::Tier::None),
        cpus: crate::gguf::memory::engine::DEFAULT_CPUS,
    }
}

/// A llama-shaped model: `blocks` blocks of `block` bytes (an f32 FFN weight and a small norm),
/// f16 token embeddings and, unless `tied`, an f16 output matrix.
pub(super) struct Model {
    pub(super) arch: &'static str,
    blocks: u64,
    block: u64,
    tied: bool,
    /// Whether each block's FFN has a gate (`blk.N.ffn_gate.weight`, a small f32 one).
    gated: bool,
    pub(super) kv: Vec<(&'static str, Value)>,
}

impl Model {
    pub(super) fn llama(blocks: u64, block: u64) -> Model {
        Model {
            arch: "llama",
            blocks,
            block,
            tied: false,
            gated: false,
            kv: vec![
                ("attention.head_count", Value::U32(8)),
                ("attention.head_count_kv", Value::U32(8)),
            ],
        }
    }

    pub(super) fn tied(mut self) -> Model {
        self.tied = true;
        self
    }

    pub(super) fn gated(mut self) -> Model {
        self.gated = true;
        self
    }

    /// gemma3's attention pattern of 4: three layers slide over a 512-token window, the fourth
    /// attends to everything.
    pub(super) fn windowed(mut self) -> Model {
        self.arch = "gemma3";
        self.kv.push(("attention.sliding_window", Value::U32(512)));
        self.kv
            .push(("attention.sliding_window_pattern", Value::U32(4)));
        self
    }

    pub(super) fn header(&self) -> Header {
        let arch = self.arch;
        let mut kv: Vec<(String, Value)> = vec![
            ("general.architecture".into(), Value::String(arch.into())),
            (format!("{arch}.block_count"), Value::U64(self.blocks)),
            (format!("{arch}.embedding_length"), Value::U64(N_EMBD)),
            (format!("{arch}.vocab_size"), Value::U64(VOCAB)),
        ];
        kv.extend(
            self.kv
                .iter()
                .map(|(k, v)| (format!("{arch}.{k}"), v.clone())),
        );
        let mut tensors: Vec<(String, Vec<u64>, u32)> = vec![
            ("token_embd.weight".into(), vec![N_EMBD, VOCAB], 1),
            ("output_norm.weight".into(), vec![N_EMBD], 0),
        ];
        if !self.tied {
            tensors.push(("output.weight".into(), vec![N_EMBD, VOCAB], 1));
        }
        for il in 0..self.blocks {
            tensors.push((format!("blk.{il}.attn_norm.weight"), vec![N_EMBD], 0));
            let rest = (self.block - N_EMBD * 4) / 4 / N_EMBD;
            tensors.push((format!("blk.{il}.ffn_up.weight"), vec![N_EMBD, rest], 0));
            if self.gated {
                tensors.push((format!("blk.{il}.ffn_gate.weight"), vec![N_EMBD], 0));
            }
        }
        crate::gguf::header::write::parsed(&kv, &tensors)
    }
}

const EMBD_BYTES: u64 = N_EMBD * VOCAB * 2;
const OUTPUT_BYTES: u64 = N_EMBD * VOCAB * 2 + N_EMBD * 4;

pub(super) fn gpus(free: &[u64]) -> Vec<Device> {
    free.iter()
        .map(|f| Device {
            name: "NVIDIA-A10".into(),
            free: *f,
        })
        .collect()
}

fn fits(p: &Placement, devices: &[Device], margin: u64) -> bool {
    p.devices
        .iter()
        .zip(devices)
        .all(|(s, d)| s.total + margin <= d.free)
}

#[test]
fn the_output_layer_counts_as_one_more_than_the_blocks() {
    let h = Model::llama(4, 64 * MIB).header();
    let f = flags(4096, 1);
    let one = place(&h, &f, 1, &[1.0]).unwrap();
    assert_eq!(one.ngl, 1);
    assert!(one.devices[0].output && one.devices[0].layers.is_empty());
    assert_eq!(one.host.layers, 0..4);
    assert!(!one.host.output && !one.full());

    let four = place(&h, &f, 4, &[1.0]).unwrap();
    assert_eq!(
        four.devices[0].layers,
        1..4,
        "the first block stays on the host"
    );
    assert_eq!(four.host.layers, 0..1);

    let five = place(&h, &f, 5, &[1.0]).unwrap();
    assert_eq!(five.devices[0].layers, 0..4);
    assert!(five.host.layers.is_empty() && five.full());
    assert_eq!(place(&h, &f, 999, &[1.0]).unwrap(), five);
}

#[test]
fn token_embeddings_stay_on_the_host() {
    let h = Model::llama(4, 64 * MIB).header();
    let p = place(&h, &flags(4096, 1), 5, &[1.0]).unwrap();
    assert_eq!(p.host.weights, EMBD_BYTES);
    assert_eq!(p.devices[0].weights, 4 * 64 * MIB + OUTPUT_BYTES);
    assert_eq!(p.output_copy, 0);
}

#[test]
fn weights_on_the_gpus_and_the_host_add_up_to_the_model_for_any_ngl_and_split() {
    for m in [Model::llama(6, 32 * MIB), Model::llama(6, 32 * MIB).tied()] {
        let h = m.header();
        let f = flags(4096, 2);
        let e = estimate(&h, &f);
        for split in [&[][..], &[1.0], &[1.0, 1.0], &[3.0, 0.0, 2.0]] {
            for ngl in 0..9 {
                let p = place(&h, &f, ngl, split).unwrap();
                let sum: u64 = p.devices.iter().map(|d| d.weights).sum::<u64>() + p.host.weights;
                assert_eq!(sum, e.weights + p.output_copy, "ngl {ngl}, split {split:?}");
                let kv: u64 = p.devices.iter().map(|d| d.kv).sum::<u64>() + p.host.kv;
                assert_eq!(kv, e.kv);
                let blocks: usize = p.devices.iter().map(|d| d.layers.len()).sum();
                assert_eq!(blocks + p.host.layers.len(), 6);
            }
        }
    }
}

#[test]
fn tied_embeddings_are_copied_to_the_gpu_that_holds_the_output() {
    let h = Model::llama(4, 64 * MIB).tied().header();
    let f = flags(4096, 1);
    let p = place(&h, &f, 1, &[1.0]).unwrap();
    assert_eq!(p.output_copy, EMBD_BYTES);
    assert_eq!(p.devices[0].weights, EMBD_BYTES + N_EMBD * 4);
    assert_eq!(p.host.weights, EMBD_BYTES + 4 * 64 * MIB);
    let cpu = place(&h, &f, 0, &[1.0]).unwrap();
    assert_eq!(
        cpu.output_copy, 0,
        "on the host the output shares the embeddings"
    );
}

/// A granitehybrid-shaped model: three mamba2 blocks, then one attending block.
pub(super) fn hybrid() -> Model {
    let mut m = Model::llama(4, 16 * MIB);
    m.arch = "granitehybrid";
    m.kv = vec![
        ("attention.head_count", Value::U32(8)),
        ("attention.head_count_kv", write::u32s(&[0, 0, 0, 2])),
        ("ssm.conv_kernel", Value::U32(4)),
        ("ssm.inner_size", Value::U32(2048)),
        ("ssm.state_size", Value::U32(128)),
        ("ssm.group_count", Value::U32(1)),
    ];
    m
}

#[test]
fn kv_cache_and_recurrent_state_live_with_their_layer() {
    let h = hybrid().header();
    let f = flags(4096, 2);
    let e = estimate(&h, &f);
    assert!(e.kv > 0 && e.recurrent > 0);
    // The output and the last block (the attention layer) on the GPU.
    let p = place(&h, &f, 2, &[1.0]).unwrap();
    assert_eq!((p.devices[0].kv, p.devices[0].recurrent), (e.kv, 0));
    assert_eq!((p.host.kv, p.host.recurrent), (0, e.recurrent));
    // One recurrent layer more.
    let p = place(&h, &f, 3, &[1.0]).unwrap();
    assert_eq!(p.devices[0].recurrent, e.recurrent / 3);
    assert_eq!(p.host.recurrent, 2 * e.recurrent / 3);
    assert_eq!(p.host.checkpoints, e.checkpoints, "checkpoints stay in RAM");
    // The CUDA runtime kept more host memory for the hybrid model on an H200; RPC keeps none.
    let cuda = Backend::CUDA;
    assert_eq!(
        p.host.runtime,
        cuda.runtime_host + cuda.runtime_host_recurrent
    );
    let rpc = place_on(&h, &f, 3, &[1.0], Backend::RPC).unwrap();
    assert_eq!(rpc.host.runtime, 0);
    let attention = place(&Model::llama(4, 16 * MIB).header(), &f, 3, &[1.0]).unwrap();
    assert_eq!(attention.host.runtime, cuda.runtime_host);
    assert_eq!(place(&h, &f, 3, &[]).unwrap().host.runtime, 0, "no GPU");
}

#[test]
fn a_cpu_only_placement_is_the_cpu_estimate() {
    let mut m = Model::llama(6, 32 * MIB);
    m.kv.push(("attention.sliding_window", Value::U32(512)));
    let h = m.header();
    let f = Flags {
        cpu: repack::Tiers::ANY,
        ..flags(8192, 4)
    };
    let e = estimate(&h, &f);
    for ngl in [0, 7] {
        let p = place(&h, &f, ngl, &[]).unwrap();
        assert_eq!(p.ngl, 0);
        let host = &p.host;
        assert_eq!(host.layers, 0..6);
        assert!(host.output);
        assert_eq!(
            (host.weights, host.repack, host.kv, host.recurrent),
            (e.weights, e.repack, e.kv, e.recurrent)
        );
        assert_eq!((host.compute, host.checkpoints), (e.compute, e.checkpoints));
        assert_eq!(host.output_buffer + host.overhead, e.overhead);
        assert_eq!(host.total, e.total);
    }
}

#[test]
fn the_host_repacks_only_the_weights_it_keeps() {
    let h = Model::llama(4, 64 * MIB).header();
    let f = Flags {
        cpu: repack::Tiers::ANY,
        ..flags(4096, 1)
    };
    // F32 blocks and F16 matrices: only AMX repacks F16, the output among them.
    let all = estimate(&h, &f).repack;
    assert!(all > 0);
    let full = place_on(&h, &f, 5, &[1.0], Backend::RPC).unwrap();
    assert_eq!(full.host.repack, 0, "token_embd is never repacked");
    let cpu = place_on(&h, &f, 0, &[1.0], Backend::RPC).unwrap();
    assert_eq!(cpu.host.repack, all);
    assert_eq!(place(&h, &f, 0, &[]).unwrap().host.repack, all, "no GPU");
}

#[test]
fn an_uneven_tensor_split_moves_layers_to_the_larger_gpu() {
    let h = Model::llama(7, 16 * MIB).header();
    let f = flags(4096, 1);
    let even = place(&h, &f, 8, &[1.0, 1.0]).unwrap();
    assert_eq!(
        even.devices[0].layers,
        0..4,
        "layer 4 sits at 0.5: upper_bound sends it on"
    );
    assert_eq!(even.devices[1].layers, 4..7);
    assert!(even.devices[1].output && !even.devices[0].output);
    let uneven = place(&h, &f, 8, &[1.0, 3.0]).unwrap();
    assert_eq!(uneven.devices[0].layers, 0..2);
    assert_eq!(uneven.devices[1].layers, 2..7);
    assert!(uneven.devices[1].weights > 2 * uneven.devices[0].weights);
    // Layer counts as the split place exactly those counts.
    let counts = place(&h, &f, 8, &[3.0, 5.0]).unwrap();
    assert_eq!(counts.devices[0].layers, 0..3);
    assert_eq!(counts.tensor_split_arg(), "3,5");
    // A GPU with no share holds nothing.
    let skip = place(&h, &f, 8, &[1.0, 0.0, 1.0]).unwrap();
    assert!(skip.devices[1].layers.is_empty() && skip.devices[1].weights == 0);
}

#[test]
fn a_gpu_running_any_layer_needs_one_layers_compute_and_the_first_copies_host_weights() {
    let h = Model::llama(4, 64 * MIB).header();
    let f = flags(4096, 1);
    let full = place(&h, &f, 5, &[1.0]).unwrap();
    let some = place(&h, &f, 3, &[1.0]).unwrap();
    // The prompt's multiplies with weights left on the host run on the GPU, which copies the
    // largest of them (a block's FFN weight) into its compute buffer beside the FFN's rows,
    // and so does the attention after them, with its mask and the layer's KV cache copied in
    // above the input, norm and query rows (the second layer's value copy above the mask), and
    // its output on top.
    let ffn = 64 * MIB - N_EMBD * 4;
    let p = crate::gguf::memory::parts(&h, &f);
    assert!(p.query > 0 && p.kv_values[1] == p.kv[1] / 2);
    assert_eq!(
        some.devices[0].compute,
        full.devices[0]
            .compute
            .max(op_offload_peak(&p, ffn) + inputs(&p, 1))
    );
    assert!(
        some.host.compute > full.host.compute,
        "the host runs its layers' token graph"
    );
    // Under the op-offload batch the host computes its layers itself.
    let f16 = Flags { ubatch: 16, ..f };
    let small = place(&h, &f16, 3, &[1.0]).unwrap();
    let small_full = place(&h, &f16, 5, &[1.0]).unwrap();
    assert_eq!(small.devices[0].compute, small_full.devices[0].compute);
    assert!(small.host.compute > small_full.host.compute);
    // With no layer at all, the first GPU still runs the prompt's multiplies.
    let none = place(&h, &f, 0, &[1.0, 1.0]).unwrap();
    assert!(none.devices[0].compute > OUTPUT_BYTES);
    assert_eq!(none.devices[1].compute, 0);
}

#[test]
fn several_gpus_with_every_layer_keep_copies_of_their_inputs_for_the_pipeline() {
    let h = Model::llama(4, 64 * MIB).header();
    let f = flags(4096, 1);
    let one = place(&h, &f, 5, &[1.0]).unwrap();
    let two = place(&h, &f, 5, &[1.0, 1.0]).unwrap();
    assert!(two.devices[0].compute > one.devices[0].compute);
    let partial = place(&h, &f, 4, &[1.0, 1.0]).unwrap();
    assert!(partial.devices[1].compute < two.devices[1].compute);
}

#[test]
fn full_offload_when_every_gpu_holds_its_share_with_headroom() {
    let h = Model::llama(32, 256 * MIB).header();
    let f = flags(8192, 1);
    let devices = gpus(&[24 * GIB, 24 * GIB]);
    let d = decide(&h, &f, &devices, DEFAULT_MARGIN).unwrap();
    let Decision::Full(p) = &d else {
        panic!("{d:?}")
    };
    assert!(p.full() && fits(p, &devices, DEFAULT_MARGIN));
    assert_eq!(p.split.iter().sum::<f64>(), 33.0, "{:?}", p.split);
    assert_eq!(
        p.split,
        vec![17.0, 16.0],
        "the free-memory split, as layer counts"
    );
    assert_eq!(place(&h, &f, 33, &p.split).unwrap(), *p);
    let msg = d.message(&devices);
    assert!(msg.starts_with("all 33 layers on 2× NVIDIA-A10 ("), "{msg}");
    assert!(
        msg.contains(" of 24.0 GiB), the token embeddings and buffers in "),
        "{msg}"
    );
}

#[test]
fn the_largest_ngl_that_fits_is_chosen() {
    let h = Model::llama(32, 256 * MIB).header();
    let f = flags(8192, 1);
    for free in [3 * GIB, 5 * GIB, 8 * GIB + 300 * MIB] {
        let devices = gpus(&[free]);
        let d = decide(&h, &f, &devices, DEFAULT_MARGIN).unwrap();
        let Decision::Partial(p) = &d else {
            panic!("{free}: {d:?}")
        };
        assert!(fits(p, &devices, DEFAULT_MARGIN));
        let more = place(&h, &f, p.ngl + 1, &[1.0]).unwrap();
        assert!(
            !fits(&more, &devices, DEFAULT_MARGIN),
            "ngl {} fits too",
            p.ngl + 1
        );
        assert_eq!(p.split, vec![f64::from(p.ngl)]);
    }
}

#[test]
fn several_gpus_are_filled_back_to_front_like_fit() {
    let h = Model::llama(32, 256 * MIB).header();
    let f = flags(8192, 1);
    let devices = gpus(&[4 * GIB, 3 * GIB]);
    let d = decide(&h, &f, &devices, DEFAULT_MARGIN).unwrap();
    let Decision::Partial(p) = &d else {
        panic!("{d:?}")
    };
    assert!(fits(p, &devices, DEFAULT_MARGIN));
    assert!(p.devices[1].output, "the last GPU takes the last layers");
    assert_eq!(p.devices[0].layers.end, p.devices[1].layers.start);
    assert_eq!(p.host.layers.end, p.devices[0].layers.start);
    // Neither GPU could take one more layer.
    for id in 0..2 {
        let mut counts = p.split.clone();
        counts[id] += 1.0;
        let more = place(&h, &f, p.ngl + 1, &counts).unwrap();
        assert!(more.devices[id].total + DEFAULT_MARGIN > devices[id].free);
    }
    let msg = d.message(&devices);
    let want = format!("{} of 33 layers on 2× NVIDIA-A10 (", p.ngl);
    assert!(msg.starts_with(&want), "{msg}");
    assert!(
        msg.contains(" of 4.0 and ") && msg.contains(" of 3.0 GiB), "),
        "{msg}"
    );
    assert!(
        msg.contains(&format!(", {} layers in ", 33 - p.ngl)),
        "{msg}"
    );
}

#[test]
fn no_fit_reports_each_gpus_need_against_its_free_memory() {
    let h = Model::llama(8, 256 * MIB).header();
    let f = flags(8192, 1);
    let devices = gpus(&[GIB + 100 * MIB, GIB]);
    let d = decide(&h, &f, &devices, DEFAULT_MARGIN).unwrap();
    let Decision::NoFit { placement, needs } = &d else {
        panic!("{d:?}")
    };
    assert_eq!(needs.len(), 2);
    assert!(needs.iter().all(|n| n.needed > n.free));
    assert_eq!(needs[1].free, GIB);
    assert!(placement.devices.is_empty() && placement.ngl == 0);
    assert_eq!(placement.host.total, estimate(&h, &f).total);
    let msg = d.message(&devices);
    assert!(
        msg.starts_with("not one of 9 layers fits on 2× NVIDIA-A10: all of them need "),
        "{msg}"
    );
    assert!(
        msg.contains(" of 1.1 and ") && msg.contains(" of 1.0 GiB with the headroom"),
        "{msg}"
    );
    let none = decide(&h, &f, &[], DEFAULT_MARGIN).unwrap();
    assert!(
        none.message(&[]).starts_with("no GPU: all 9 layers in "),
        "{}",
        none.message(&[])
    );
}

#[test]
fn gpus_of_different_kinds_are_named_each() {
    let h = Model::llama(4, 16 * MIB).header();
    let f = flags(4096, 1);
    let devices = vec![
        Device {
            name: "NVIDIA-A10".into(),
            free: 24 * GIB,
        },
        Device {
            name: "NVIDIA-L4".into(),
            free: 23 * GIB,
        },
        Device {
            name: "NVIDIA-L4".into(),
            free: 23 * GIB,
        },
    ];
    let d = decide(&h, &f, &devices, DEFAULT_MARGIN).unwrap();
    let msg = d.message(&devices);
    assert!(
        msg.starts_with("all 5 layers on NVIDIA-A10, NVIDIA-L4 and NVIDIA-L4 ("),
        "{msg}"
    );
    assert!(
        msg.contains(" of 24.0, ") && msg.contains(" of 23.0 GiB)"),
        "{msg}"
    );
}

#[test]
fn hostile_splits_and_device_lists_are_refused() {
    let h = Model::llama(4, 16 * MIB).header();
    let f = flags(4096, 1);
    for bad in [f64::NAN, -1.0, f64::INFINITY, 1e39] {
        assert!(
            matches!(
                place(&h, &f, 5, &[1.0, bad]),
                Err(OffloadError::BadShare { index: 1, .. })
            ),
            "{bad}"
        );
    }
    assert_eq!(place(&h, &f, 5, &[0.0, 0.0]), Err(OffloadError::NoShare));
    assert_eq!(
        place(&h, &f, 5, &[f64::from(f32::MAX); 2]),
        Err(OffloadError::NoShare),
        "a sum beyond f32 is no share"
    );
    let many = gpus(&[GIB; MAX_DEVICES + 1]);
    let e = decide(&h, &f, &many, DEFAULT_MARGIN).unwrap_err();
    assert_eq!(
        e,
        OffloadError::TooManyDevices {
            count: MAX_DEVICES + 1
        }
    );
    assert_eq!(e.reason(), "InvalidPlacement");
    assert!(place(&h, &f, 5, &[1.0; MAX_DEVICES + 1]).is_err());
}

#[test]
fn an_absurd_header_is_placed_and_decided_quickly_without_overflow() {
    let arch = "granitehybrid";
    let mut metadata = std::collections::BTreeMap::new();
    metadata.insert(
        "general.architecture".to_string(),
        Value::String(arch.into()),
    );
    for key in crate::gguf::bounds::PARAMS {
        metadata.insert(format!("{arch}.{}", key.key), Value::U64(u64::MAX));
    }
    let tensors = (0..4096)
        .map(|i| TensorInfo {
            name: format!("blk.{i}.ffn_up.weight"),
            dims: vec![u64::MAX; 4],
            ggml_type: 0,
            offset: 0,
        })
        .chain([TensorInfo {
            name: "blk.99999999999999999999.x".into(),
            dims: vec![u64::MAX],
            ggml_type: 9999,
            offset: 0,
        }])
        .collect();
    let h = Header {
        version: 3,
        metadata,
        tensors,
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
    let p = place(&h, &f, u32::MAX, &[1.0, 2.0]).unwrap();
    assert_eq!(p.ngl, 4097);
    let d = decide(&h, &f, &gpus(&[u64::MAX; MAX_DEVICES]), u64::MAX).unwrap();
    assert!(matches!(d, Decision::NoFit { .. }), "{d:?}");
    let d = decide(&h, &f, &gpus(&[u64::MAX; MAX_DEVICES]), 0).unwrap();
    assert!(!d.message(&gpus(&[u64::MAX; MAX_DEVICES])).is_empty());
    assert!(
        start.elapsed().as_secs_f64() < 5.0,
        "took {:?}",
        start.elapsed()
    );
}

#[test]
fn a_header_without_shapes_is_placed_roughly_and_says_so() {
    let h = parse(
        &write::header(
            &[("general.architecture", Value::String("llama".into()))],
            &[
                ("token_embd.weight", &[N_EMBD, VOCAB], 1),
                ("output.weight", &[N_EMBD, VOCAB], 1),
            ],
        ),
        true,
    )
    .unwrap();
    let f = flags(4096, 1);
    let d = decide(&h, &f, &gpus(&[24 * GIB]), DEFAULT_MARGIN).unwrap();
    assert!(d.placement().fallback);
    assert!(
        d.message(&gpus(&[24 * GIB]))
            .ends_with("(rough: the header lacks the model's shapes)")
    );
}
