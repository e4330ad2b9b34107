//! The GPU flags as people write them, their checks against each other, and the offload's
//! JSON and table on a header built by hand.

use clap::Parser;

use super::*;
use crate::cli::Output;
use crate::gguf::header::{Value, write};
use crate::gguf::memory::{estimate, repack};

const GIB: u64 = 1 << 30;
const N_EMBD: u64 = 1024;
const VOCAB: u64 = 32000;

/// A llama-shaped model of `blocks` blocks of 64 MiB of f32 weights each, untied.
fn llama(blocks: u64) -> Header {
    let kv = [
        ("general.architecture", Value::String("llama".into())),
        ("llama.block_count", Value::U64(blocks)),
        ("llama.embedding_length", Value::U64(N_EMBD)),
        ("llama.vocab_size", Value::U64(VOCAB)),
        ("llama.attention.head_count", Value::U32(8)),
        ("llama.attention.head_count_kv", Value::U32(8)),
    ];
    let mut tensors: Vec<(String, Vec<u64>, u32)> = vec![
        ("token_embd.weight".into(), vec![N_EMBD, VOCAB], 1),
        ("output_norm.weight".into(), vec![N_EMBD], 0),
        ("output.weight".into(), vec![N_EMBD, VOCAB], 1),
    ];
    for il in 0..blocks {
        tensors.push((format!("blk.{il}.attn_norm.weight"), vec![N_EMBD], 0));
        tensors.push((format!("blk.{il}.ffn_up.weight"), vec![N_EMBD, 16384], 0));
    }
    write::parsed(&kv, &tensors)
}

fn flags() -> Flags {
    Flags {
        ctx_size: 4096,
        parallel: 1,
        ubatch: 512,
        build: 10000,
        cpu: repack::Tiers::one(repack::Tier::None),
        cpus: crate::gguf::memory::engine::DEFAULT_CPUS,
    }
}

fn gpus(free: &[u64]) -> Vec<Gpu> {
    free.iter()
        .map(|f| Gpu {
            name: None,
            free: *f,
        })
        .collect()
}

/// `modelserve estimate` as clap reads it.
#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: crate::cli::estimate::Args,
}

fn cli(flags: &[&str]) -> Result<crate::cli::estimate::Args, String> {
    let argv = ["estimate", "m.gguf"].iter().chain(flags);
    Cli::try_parse_from(argv)
        .map(|c| c.args)
        .map_err(|e| e.to_string())
}

#[test]
fn gpu_memory_reads_as_people_write_it() {
    assert_eq!(parse_gpu("24GiB").unwrap().free, 24 * GIB);
    assert_eq!(parse_gpu("24Gi").unwrap().free, 24 * GIB);
    assert_eq!(parse_gpu("24gib").unwrap().free, 24 * GIB);
    assert_eq!(parse_gpu("23028MiB").unwrap().free, 23028 << 20);
    assert_eq!(parse_gpu("80GB").unwrap().free, 80_000_000_000);
    assert_eq!(parse_gpu("1.5TiB").unwrap().free, 3 << 39);
    assert_eq!(parse_gpu("1073741824B").unwrap().free, GIB);
    let named = parse_gpu("NVIDIA-A10=22.5GiB").unwrap();
    assert_eq!(named.name.as_deref(), Some("NVIDIA-A10"));
    assert_eq!(named.free, 45 * GIB / 2);
    assert_eq!(parse_gpu("24GiB").unwrap().name, None);
}

#[test]
fn a_malformed_gpu_memory_says_what_a_size_looks_like() {
    for (bad, why) in [
        ("24", "has no unit"),
        ("24QB", "unit this does not know"),
        ("-24GiB", "is not a size"),
        ("NaNGiB", "is not a size"),
        ("GiB", "is not a size"),
        ("", "is not a size"),
        ("1.2.3GiB", "is not a number"),
        ("99999999999TiB", "too large"),
        ("=24GiB", "no name before '='"),
        ("0GiB", "is no memory"),
    ] {
        let e = parse_gpu(bad).unwrap_err();
        assert!(e.contains(why), "{bad}: {e}");
    }
    assert!(parse_gpu("24").unwrap_err().contains("24GiB, 23028MiB"));
    let long = format!("{}=1GiB", "x".repeat(65));
    assert!(parse_gpu(&long).unwrap_err().contains("longer than 64"));
}

#[test]
fn gpu_layers_are_a_count_all_or_auto() {
    assert_eq!(parse_layers("33"), Ok(Layers::Count(33)));
    assert_eq!(parse_layers("0"), Ok(Layers::Count(0)));
    assert_eq!(parse_layers("all"), Ok(Layers::All));
    assert_eq!(parse_layers("AUTO"), Ok(Layers::Auto));
    for bad in ["-1", "1.5", "some", ""] {
        let e = parse_layers(bad).unwrap_err();
        assert!(e.contains("0 or more") && e.contains("all"), "{bad}: {e}");
    }
}

#[test]
fn a_tensor_split_is_finite_shares_not_all_zero() {
    assert_eq!(parse_split("3,1"), Ok(Split(vec![3.0, 1.0])));
    assert_eq!(parse_split("1/1"), Ok(Split(vec![1.0, 1.0])));
    assert_eq!(parse_split(" 0.5 , 0 "), Ok(Split(vec![0.5, 0.0])));
    for (bad, share) in [
        ("-1,2", "#1"),
        ("1,NaN", "#2"),
        ("inf", "#1"),
        ("1e39", "#1"),
        ("1,,2", "#2"),
        ("x", "#1"),
    ] {
        let e = parse_split(bad).unwrap_err();
        assert!(
            e.contains(share) && e.contains("finite number 0 or more"),
            "{bad}: {e}"
        );
    }
    assert!(
        parse_split("0,0")
            .unwrap_err()
            .contains("no share is above 0")
    );
    let sixteen = vec!["1"; 16].join(",");
    assert!(parse_split(&sixteen).unwrap_err().contains("the 15 GPUs"));
}

#[test]
fn the_fit_target_is_whole_mib() {
    assert_eq!(parse_fit_target("1024"), Ok(1024));
    assert_eq!(parse_fit_target("0"), Ok(0));
    for bad in ["-5", "1.5", "1GiB", "2000000"] {
        let e = parse_fit_target(bad).unwrap_err();
        assert!(e.contains("whole number of MiB"), "{bad}: {e}");
    }
}

#[test]
fn clap_errors_name_the_flag_and_what_is_valid() {
    let e = cli(&["--gpu", "24"]).err().unwrap();
    assert!(e.contains("--gpu") && e.contains("has no unit"), "{e}");
    let e = cli(&["--gpu", "24GiB", "--tensor-split", "-1,2"])
        .err()
        .unwrap();
    assert!(
        e.contains("--tensor-split") && e.contains("0 or more"),
        "{e}"
    );
    let e = cli(&["--gpu", "24GiB", "--gpu-layers", "-1"])
        .err()
        .unwrap();
    assert!(e.contains("--gpu-layers") && e.contains("auto"), "{e}");
    let e = cli(&["--gpu", "24GiB", "--fit-target", "-1"])
        .err()
        .unwrap();
    assert!(e.contains("--fit-target") && e.contains("MiB"), "{e}");
}

#[test]
fn the_flags_parse_into_the_request() {
    let a = cli(&[
        "--gpu",
        "24GiB",
        "--gpu",
        "L4=22GiB",
        "--gpu-layers",
        "20",
        "--tensor-split",
        "3,1",
        "--fit-target",
        "512",
        "-o",
        "json",
    ])
    .unwrap();
    assert_eq!(a.output, Some(Output::Json));
    let r = Request::new(&a.gpus, a.gpu_layers, a.tensor_split.as_ref(), a.fit_target).unwrap();
    assert_eq!(
        r.devices,
        vec![
            Device {
                name: "GPU0".into(),
                free: 24 * GIB
            },
            Device {
                name: "L4".into(),
                free: 22 * GIB
            }
        ]
    );
    assert_eq!(r.layers, Some(20));
    assert_eq!(r.split, Some(vec![3.0, 1.0]));
    assert_eq!(r.margin, 512 << 20);

    let plain = cli(&["--gpu", "24GiB"]).unwrap();
    assert_eq!(
        plain.output, None,
        "text by default with --gpu (run decides)"
    );
    let r = Request::new(&plain.gpus, None, None, None).unwrap();
    assert_eq!((r.layers, r.split.clone()), (None, None));
    assert_eq!(r.margin, GIB, "llama.cpp's --fit-target default");
    let all = Request::new(&plain.gpus, Some(Layers::All), None, None).unwrap();
    assert_eq!(all.layers, Some(u32::MAX));
}

#[test]
fn flags_that_need_a_gpu_say_so_without_one() {
    for (layers, split, target, flag) in [
        (Some(Layers::Count(10)), None, None, "--gpu-layers"),
        (Some(Layers::All), None, None, "--gpu-layers"),
        (None, Some(Split(vec![1.0])), None, "--tensor-split"),
        (None, None, Some(512), "--fit-target"),
    ] {
        let e = Request::new(&[], layers, split.as_ref(), target).unwrap_err();
        assert!(
            e.starts_with(flag) && e.contains("at least one --gpu"),
            "{flag}: {e}"
        );
    }
    assert!(Request::new(&[], Some(Layers::Auto), None, None).is_ok());
}

#[test]
fn too_many_gpus_or_a_split_of_another_length_is_refused() {
    let e = Request::new(&gpus(&[GIB; 16]), None, None, None).unwrap_err();
    assert!(e.contains("16 --gpu flags") && e.contains("15"), "{e}");
    assert!(Request::new(&gpus(&[GIB; 15]), None, None, None).is_ok());
    let e = Request::new(&gpus(&[GIB; 2]), None, Some(&Split(vec![1.0; 3])), None).unwrap_err();
    assert!(
        e.contains("3 shares for 2 GPUs") && e.contains("one share per --gpu"),
        "{e}"
    );
}

fn keys(v: &serde_json::Value) -> Vec<&str> {
    let mut k: Vec<&str> = v.as_object().unwrap().keys().map(|k| k.as_str()).collect();
    k.sort();
    k
}

#[test]
fn the_json_has_every_figure_per_device_and_host() {
    let h = llama(4);
    let f = flags();
    let r = Request::new(&gpus(&[64 * GIB, 64 * GIB]), None, None, None).unwrap();
    let o = offload(&h, &f, &r).unwrap();
    let j = o.json();
    assert_eq!(
        keys(&j),
        [
            "decision",
            "devices",
            "fallback",
            "fitTarget",
            "fits",
            "flashAttentionOff",
            "host",
            "layers",
            "message",
            "ngl",
            "outputCopy",
            "split",
            "tensorSplit"
        ]
    );
    assert_eq!(j["decision"], "full");
    assert_eq!(j["fits"], true);
    assert_eq!(j["flashAttentionOff"], false, "llama's blocks all attend");
    assert_eq!(
        (j["ngl"].as_u64(), j["layers"].as_u64()),
        (Some(5), Some(5))
    );
    assert_eq!(j["fitTarget"], GIB);
    let split: Vec<f64> = serde_json::from_value(j["split"].clone()).unwrap();
    assert_eq!(split.iter().sum::<f64>(), 5.0, "the split is layer counts");
    assert_eq!(j["tensorSplit"].as_str().unwrap().split(',').count(), 2);
    let devices = j["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 2);
    for d in devices {
        assert_eq!(
            keys(d),
            [
                "compute",
                "fits",
                "free",
                "fullOffloadNeeds",
                "index",
                "kv",
                "layers",
                "name",
                "recurrent",
                "total",
                "weights"
            ]
        );
        assert_eq!(keys(&d["layers"]), ["count", "end", "output", "start"]);
        let sum = ["weights", "kv", "recurrent", "compute"]
            .iter()
            .map(|k| d[*k].as_u64().unwrap())
            .sum::<u64>();
        assert_eq!(d["total"].as_u64(), Some(sum));
        assert!(d["fullOffloadNeeds"].is_null());
    }
    assert_eq!(devices[0]["name"], "GPU0");
    assert_eq!(devices[1]["layers"]["output"], true, "the output goes last");
    assert_eq!(
        keys(&j["host"]),
        [
            "checkpoints",
            "compute",
            "kv",
            "layers",
            "outputBuffer",
            "overhead",
            "recurrent",
            "repack",
            "runtime",
            "total",
            "weights"
        ]
    );
    assert_eq!(j["host"]["layers"]["count"], 0);
    // A GPU server's host memory holds the CUDA runtime's own too: the pod's limit must.
    assert_eq!(
        j["host"]["runtime"].as_u64(),
        Some(crate::gguf::offload::Backend::CUDA.runtime_host)
    );
    let e = estimate(&h, &f);
    let weights: u64 = devices
        .iter()
        .map(|d| d["weights"].as_u64().unwrap())
        .sum::<u64>()
        + j["host"]["weights"].as_u64().unwrap();
    assert_eq!(weights, e.weights + j["outputCopy"].as_u64().unwrap());
    let kv: u64 = devices.iter().map(|d| d["kv"].as_u64().unwrap()).sum();
    assert_eq!(kv, e.kv);
}

#[test]
fn a_forced_layer_count_leaves_the_first_blocks_on_the_host() {
    let h = llama(4);
    let r = Request::new(&gpus(&[64 * GIB]), Some(Layers::Count(2)), None, None).unwrap();
    let j = offload(&h, &flags(), &r).unwrap().json();
    assert_eq!(j["decision"], "forced");
    assert_eq!(j["ngl"], 2);
    let d = &j["devices"][0]["layers"];
    assert_eq!((d["start"].as_u64(), d["end"].as_u64()), (Some(3), Some(4)));
    assert_eq!(
        (d["count"].as_u64(), d["output"].as_bool()),
        (Some(2), Some(true))
    );
    let host = &j["host"]["layers"];
    assert_eq!(
        (host["start"].as_u64(), host["end"].as_u64()),
        (Some(0), Some(3))
    );
    assert!(j["message"].as_str().unwrap().contains("-ngl 2 as given"));
    assert!(
        j["tensorSplit"].is_null(),
        "the engine splits by free memory itself"
    );
}

#[test]
fn a_forced_count_that_does_not_fit_says_which_gpu_is_over() {
    let h = llama(4);
    let r = Request::new(&gpus(&[GIB]), Some(Layers::All), None, None).unwrap();
    let o = offload(&h, &flags(), &r).unwrap();
    let j = o.json();
    assert_eq!(
        (j["decision"].as_str(), j["fits"].as_bool()),
        (Some("forced"), Some(false))
    );
    assert_eq!(j["ngl"], 5);
    assert!(
        o.message.contains("does not fit: GPU0 needs"),
        "{}",
        o.message
    );
}

#[test]
fn a_forced_split_takes_the_most_layers_that_fit() {
    let h = llama(8);
    let f = flags();
    // Room for about half the blocks on each GPU, all on the first by the split.
    let free = 2 * GIB / 2 + 300 * (1 << 20);
    let r = Request::new(
        &gpus(&[free, free]),
        None,
        Some(&Split(vec![1.0, 0.0])),
        None,
    )
    .unwrap();
    let j = offload(&h, &f, &r).unwrap().json();
    assert_eq!(j["decision"], "forced");
    assert_eq!(j["fits"], true);
    let ngl = j["ngl"].as_u64().unwrap();
    assert!(ngl > 0 && ngl < 9, "ngl {ngl}");
    assert_eq!(j["devices"][1]["layers"]["count"], 0);
    assert_eq!(j["tensorSplit"], "1,0");
    // One more layer would not fit.
    let more = Request::new(
        &gpus(&[free, free]),
        Some(Layers::Count(ngl as u32 + 1)),
        Some(&Split(vec![1.0, 0.0])),
        None,
    )
    .unwrap();
    assert_eq!(offload(&h, &f, &more).unwrap().json()["fits"], false);
}

#[test]
fn gpus_too_small_for_one_layer_get_their_full_offload_needs() {
    let h = llama(4);
    let r = Request::new(&gpus(&[GIB / 2]), None, None, None).unwrap();
    let j = offload(&h, &flags(), &r).unwrap().json();
    assert_eq!(j["decision"], "noFit");
    assert_eq!(j["ngl"], 0);
    assert_eq!(j["tensorSplit"], serde_json::Value::Null);
    let d = &j["devices"][0];
    assert_eq!(
        (d["total"].as_u64(), d["layers"]["count"].as_u64()),
        (Some(0), Some(0))
    );
    assert!(d["fullOffloadNeeds"].as_u64().unwrap() > GIB / 2);
    assert_eq!(j["host"]["layers"]["count"], 5);
}

#[test]
fn the_table_has_a_row_per_gpu_and_the_host() {
    let h = llama(4);
    let r = Request::new(
        &gpus(&[64 * GIB, 64 * GIB]),
        Some(Layers::Count(3)),
        None,
        None,
    )
    .unwrap();
    let o = offload(&h, &flags(), &r).unwrap();
    let text = o.text();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], o.message);
    assert!(
        lines[1].starts_with("llama-server flags: -ngl 3 (kept free"),
        "the engine splits by free memory itself: {}",
        lines[1]
    );
    let header = lines.iter().position(|l| l.starts_with("device")).unwrap();
    let words: Vec<&str> = lines[header].split_whitespace().collect();
    assert_eq!(
        words,
        [
            "device",
            "layers",
            "weights",
            "KV",
            "recurrent",
            "compute",
            "total",
            "free"
        ]
    );
    let row = |name: &str| -> Vec<&str> {
        lines
            .iter()
            .find(|l| l.starts_with(name))
            .unwrap()
            .split_whitespace()
            .collect()
    };
    assert_eq!(row("GPU0")[1], "2-3");
    assert_eq!(row("GPU1")[1], "out");
    assert_eq!(row("GPU1")[7], "65536.0");
    assert_eq!(row("host")[1], "0-1");
    assert_eq!(row("host")[7], "-");
    let twins = Request::new(
        &[
            parse_gpu("A10=24GiB").unwrap(),
            parse_gpu("A10=24GiB").unwrap(),
        ],
        None,
        None,
        None,
    )
    .unwrap();
    let text = offload(&h, &flags(), &twins).unwrap().text();
    assert!(
        text.lines().any(|l| l.starts_with("A10#0 "))
            && text.lines().any(|l| l.starts_with("A10#1 ")),
        "{text}"
    );
    assert!(text.contains("the host's total also holds: repack"));
}

#[test]
fn without_a_gpu_the_table_is_the_host_alone() {
    let h = llama(2);
    let r = Request::new(&[], None, None, None).unwrap();
    let o = offload(&h, &flags(), &r).unwrap();
    assert!(
        o.message.starts_with("no GPU: all 3 layers"),
        "{}",
        o.message
    );
    let text = o.text();
    assert!(!text.contains("llama-server flags"));
    assert!(text.lines().any(|l| l.starts_with("host")));
    assert!(!text.lines().any(|l| l.starts_with("GPU")));
}

#[test]
fn layer_ranges_read_short() {
    assert_eq!(layer_range(&(0..32), true), "0-31+out");
    assert_eq!(layer_range(&(5..6), false), "5");
    assert_eq!(layer_range(&(0..0), true), "out");
    assert_eq!(layer_range(&(0..0), false), "-");
}
