//! The real binary on hostile GGUF headers: `modelserve estimate FILE` exits non-zero within a
//! few seconds, with one line that names the field that is out of bounds.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use modelserve::gguf::header::{Value, write};

/// A llama header with `kv` added to a small valid shape.
fn llama(kv: &[(&str, Value)], tensors: &[(&str, &[u64], u32)]) -> Vec<u8> {
    let mut all = vec![
        ("general.architecture", Value::String("llama".into())),
        ("llama.block_count", Value::U32(2)),
        ("llama.embedding_length", Value::U32(256)),
        ("llama.attention.head_count", Value::U32(4)),
    ];
    for (k, v) in kv {
        all.retain(|(have, _)| have != k);
        all.push((k, v.clone()));
    }
    write::header(&all, tensors)
}

/// Runs `modelserve estimate` on `bytes` and returns its stderr, checking it failed in time.
fn refused(dir: &Path, name: &str, bytes: &[u8]) -> String {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    let start = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_modelserve"))
        .arg("estimate")
        .arg(&path)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = start + Duration::from_secs(10);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("modelserve estimate {name} still ran after 10 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let took = start.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{name}: exited 0: {stderr}");
    assert!(took < Duration::from_secs(5), "{name}: took {took:?}");
    assert!(out.stdout.is_empty(), "{name}: printed an estimate");
    assert_eq!(stderr.lines().count(), 1, "{name}: {stderr}");
    stderr
}

#[test]
fn every_hostile_header_exits_non_zero_in_seconds_with_one_line_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let max = u64::from(u32::MAX);
    let mut tensor_count = write::header(&[], &[]);
    tensor_count[8..16].copy_from_slice(&(1u64 << 40).to_le_bytes());
    let mut long_string = write::header(&[], &[]);
    long_string[16..24].copy_from_slice(&1u64.to_le_bytes());
    write::string(&mut long_string, "general.name");
    long_string.extend(8u32.to_le_bytes());
    long_string.extend((1u64 << 63).to_le_bytes());
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "layers.gguf",
            llama(&[("llama.block_count", Value::U32(0xFFFF_FFF0))], &[]),
            "llama.block_count is 4294967280, above the limit of 4096 layers",
        ),
        (
            "heads.gguf",
            llama(&[("llama.attention.head_count", Value::U32(u32::MAX))], &[]),
            "llama.attention.head_count is 4294967295",
        ),
        (
            "kv-array.gguf",
            llama(
                &[("llama.attention.head_count_kv", write::u32s(&[1, 1, 1]))],
                &[],
            ),
            "llama.attention.head_count_kv has 3 entries",
        ),
        (
            "vocab.gguf",
            llama(&[("llama.vocab_size", Value::U64(1 << 40))], &[]),
            "llama.vocab_size is 1099511627776",
        ),
        (
            "experts.gguf",
            llama(&[("llama.expert_count", Value::U32(1 << 31))], &[]),
            "llama.expert_count is 2147483648",
        ),
        (
            "tokens.gguf",
            llama(
                &[(
                    "tokenizer.ggml.tokens",
                    Value::Array {
                        value_type: 8,
                        len: 1 << 62,
                        items: None,
                    },
                )],
                &[],
            ),
            "the length of array \"tokenizer.ggml.tokens\" is 4611686018427387904",
        ),
        (
            "dims.gguf",
            llama(&[], &[("blk.0.ffn_up.weight", &[max, max, 2], 0)]),
            "the element count of tensor \"blk.0.ffn_up.weight\"",
        ),
        (
            "tensors.gguf",
            tensor_count,
            "the tensor count is 1099511627776",
        ),
        (
            "string.gguf",
            long_string,
            "the length of the value of \"general.name\" is 9223372036854775808",
        ),
    ];
    for (name, bytes, field) in &cases {
        let stderr = refused(dir.path(), name, bytes);
        assert!(stderr.contains(field), "{name}: {stderr}");
        assert!(
            stderr.contains("above the limit") || stderr.contains("per layer"),
            "{name}: {stderr}"
        );
        assert!(
            stderr.trim_end().ends_with("(InvalidHeader)"),
            "{name}: {stderr}"
        );
    }
}

#[test]
fn a_valid_header_still_gets_its_estimate() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ok.gguf");
    std::fs::write(&path, llama(&[], &[("token_embd.weight", &[256, 512], 1)])).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_modelserve"))
        .arg("estimate")
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["architecture"], "llama");
    assert_eq!(json["weights"], 256 * 512 * 2);
}
