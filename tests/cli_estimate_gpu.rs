//! The real binary: `modelserve estimate FILE --gpu MEMORY ...` on a generated GGUF header
//! prints the offload as a table or as JSON, and refuses bad GPU flags with one line naming the
//! flag and what is valid.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use modelserve::gguf::header::{Value, write};

const GIB: u64 = 1 << 30;

/// A llama header of 8 blocks of 64 MiB (f32), f16 embeddings and output over a 32k vocabulary.
fn model(dir: &Path) -> PathBuf {
    let kv = [
        ("general.architecture", Value::String("llama".into())),
        ("llama.block_count", Value::U32(8)),
        ("llama.embedding_length", Value::U32(1024)),
        ("llama.vocab_size", Value::U32(32000)),
        ("llama.attention.head_count", Value::U32(8)),
        ("llama.attention.head_count_kv", Value::U32(8)),
    ];
    let mut names = Vec::new();
    for il in 0..8 {
        names.push((format!("blk.{il}.attn_norm.weight"), vec![1024u64], 0u32));
        names.push((format!("blk.{il}.ffn_up.weight"), vec![1024, 16384], 0));
    }
    let mut tensors: Vec<(&str, &[u64], u32)> = vec![
        ("token_embd.weight", &[1024, 32000], 1),
        ("output_norm.weight", &[1024], 0),
        ("output.weight", &[1024, 32000], 1),
    ];
    tensors.extend(names.iter().map(|(n, d, t)| (n.as_str(), d.as_slice(), *t)));
    let path = dir.join("llama-8.gguf");
    std::fs::write(&path, write::header(&kv, &tensors)).unwrap();
    path
}

fn estimate(file: &Path, flags: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_modelserve"))
        .arg("estimate")
        .arg(file)
        .args(flags)
        .output()
        .unwrap()
}

fn json(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Checks the command failed with one line on stderr, and returns it.
fn refused(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "exited 0: {stderr}");
    assert!(out.stdout.is_empty(), "printed: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    stderr
}

#[test]
fn one_big_gpu_takes_every_layer_and_the_json_has_the_figures() {
    let dir = tempfile::tempdir().unwrap();
    let file = model(dir.path());
    let j = json(&estimate(&file, &["--gpu", "24GiB", "--output", "json"]));
    assert_eq!(
        j["architecture"], "llama",
        "the CPU estimate is still there"
    );
    assert!(j["total"].as_u64().unwrap() > 0);
    let o = &j["offload"];
    assert_eq!(o["decision"], "full");
    assert_eq!(
        (o["ngl"].as_u64(), o["layers"].as_u64()),
        (Some(9), Some(9))
    );
    assert_eq!(o["tensorSplit"], "9");
    let d = &o["devices"][0];
    assert_eq!(
        (d["name"].as_str(), d["free"].as_u64()),
        (Some("GPU0"), Some(24 * GIB))
    );
    assert_eq!(d["layers"]["count"], 9);
    assert!(d["weights"].as_u64().unwrap() > 8 * (64 << 20));
    assert!(d["kv"].as_u64().unwrap() > 0 && d["compute"].as_u64().unwrap() > 0);
    assert_eq!(
        o["host"]["weights"],
        1024 * 32000 * 2,
        "the token embeddings stay on the host"
    );
}

#[test]
fn a_forced_layer_count_and_split_place_as_llama_server_would() {
    let dir = tempfile::tempdir().unwrap();
    let file = model(dir.path());
    let j = json(&estimate(
        &file,
        &[
            "--gpu",
            "A=24GiB",
            "--gpu",
            "B=24GiB",
            "--gpu-layers",
            "5",
            "--tensor-split",
            "3,2",
            "--fit-target",
            "512",
            "-o",
            "json",
        ],
    ));
    let o = &j["offload"];
    assert_eq!(
        (o["decision"].as_str(), o["ngl"].as_u64()),
        (Some("forced"), Some(5))
    );
    assert_eq!(o["fitTarget"], 512 << 20);
    assert_eq!(o["tensorSplit"], "3,2");
    let count = |i: usize| o["devices"][i]["layers"]["count"].as_u64().unwrap();
    assert_eq!((count(0), count(1)), (3, 2));
    assert_eq!(o["devices"][1]["layers"]["output"], true);
    assert_eq!(o["host"]["layers"]["start"], 0);
    assert_eq!(o["host"]["layers"]["end"], 4);
}

#[test]
fn with_a_gpu_the_default_output_is_the_sentence_and_a_table() {
    let dir = tempfile::tempdir().unwrap();
    let file = model(dir.path());
    let out = estimate(&file, &["--gpu", "L4=1.5GiB"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.starts_with("llama, first build b"), "{text}");
    assert!(text.contains(" of 9 layers on L4 ("), "{text}");
    assert!(text.contains("llama-server flags: -ngl "), "{text}");
    let header = text.lines().find(|l| l.starts_with("device")).unwrap();
    assert_eq!(
        header.split_whitespace().collect::<Vec<_>>(),
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
    assert!(text.lines().any(|l| l.starts_with("L4 ")), "{text}");
    assert!(text.lines().any(|l| l.starts_with("host ")), "{text}");
}

#[test]
fn without_gpu_flags_the_json_is_as_before() {
    let dir = tempfile::tempdir().unwrap();
    let file = model(dir.path());
    let j = json(&estimate(&file, &[]));
    assert!(j.get("offload").is_none());
    assert_eq!(j["architecture"], "llama");
}

#[test]
fn bad_gpu_flags_are_refused_with_the_flag_and_what_is_valid() {
    let dir = tempfile::tempdir().unwrap();
    let file = model(dir.path());
    let sixteen: Vec<&str> = ["--gpu", "8GiB"].repeat(16);
    for (flags, says) in [
        (
            &["--gpu-layers", "10"][..],
            "--gpu-layers needs at least one --gpu",
        ),
        (
            &["--tensor-split", "1"][..],
            "--tensor-split needs at least one --gpu",
        ),
        (&["--gpu", "24"][..], "has no unit"),
        (&["--gpu", "24XB"][..], "24GiB, 23028MiB"),
        (&["--gpu", "8GiB", "--tensor-split", "-1"][..], "0 or more"),
        (
            &["--gpu", "8GiB", "--tensor-split", "NaN"][..],
            "finite number",
        ),
        (
            &["--gpu", "8GiB", "--tensor-split", "1,1"][..],
            "2 shares for 1 GPUs",
        ),
        (&["--gpu", "8GiB", "--gpu-layers", "-3"][..], "all, or auto"),
        (&sixteen[..], "16 --gpu flags are more than the 15"),
    ] {
        let e = refused(&estimate(&file, flags));
        assert!(e.contains(says), "{flags:?}: {e}");
        let flag = flags
            .iter()
            .rev()
            .find(|f| f.starts_with("--"))
            .copied()
            .unwrap();
        assert!(e.contains(flag), "{flags:?}: the error names {flag}: {e}");
    }
}
