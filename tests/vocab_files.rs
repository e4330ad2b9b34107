//! Every vocab-only GGUF shipped with the llama.cpp sources parses, reads the same as gguf-py
//! (the reference reader from the same sources) reads it, and is within every bound.

mod support;

use std::collections::BTreeMap;
use std::process::Command;

use modelserve::gguf::header::{Value, parse};
use modelserve::gguf::hparams;
use support::testbed_script;

const GGUF_PY: &str = r#"
import json, os, sys
sys.path.insert(0, sys.argv[1])
from gguf import GGUFReader
out = {}
for name in sorted(os.listdir(sys.argv[2])):
    if not name.endswith(".gguf"):
        continue
    r = GGUFReader(os.path.join(sys.argv[2], name))
    arch = r.fields.get("general.architecture")
    tokens = r.fields.get("tokenizer.ggml.tokens")
    out[name] = {
        "architecture": bytes(arch.parts[arch.data[0]]).decode() if arch else None,
        "kv_count": sum(1 for k in r.fields if not k.startswith("GGUF.")),
        "token_count": len(tokens.data) if tokens else None,
        "tensor_count": len(r.tensors),
    }
print(json.dumps(out))
"#;

#[test]
fn every_vocab_gguf_reads_as_gguf_py_reads_it() {
    let root = testbed_script("llama-sdist.sh").join("vendor/llama.cpp");
    let models = root.join("models");
    let out = Command::new("python3")
        .args([
            "-c",
            GGUF_PY,
            root.join("gguf-py").to_str().unwrap(),
            models.to_str().unwrap(),
        ])
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "gguf-py failed (it needs numpy: pip install numpy): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let reference: BTreeMap<String, serde_json::Value> =
        serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        reference.len() >= 10,
        "expected the sdist's vocab files, found {}",
        reference.len()
    );
    for (name, want) in &reference {
        let bytes = std::fs::read(models.join(name)).unwrap();
        let h = parse(&bytes, true).unwrap_or_else(|e| panic!("{name}: {e}"));
        let got = serde_json::json!({
            "architecture": h.architecture(),
            "kv_count": h.metadata.len(),
            "token_count": h.get("tokenizer.ggml.tokens").and_then(Value::array_len),
            "tensor_count": h.tensors.len(),
        });
        assert_eq!(&got, want, "{name}");
        assert!(
            h.data_offset <= bytes.len() as u64,
            "{name}: the header ends past the file"
        );
        if let Err(e) = hparams::validate(&h) {
            panic!("{name}: a real header is out of bounds: {e}");
        }
    }
}
