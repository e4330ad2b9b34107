#!/usr/bin/env python3
"""Writes the seed corpus of the gguf_header fuzz target (the corpus itself is not committed).

    python3 fuzz/seeds.py OUT_DIR

Seeds are real headers cut at their tensor data: the test models of testbed/gen_gguf.py
(written by llama.cpp's gguf-py) and hand-built headers of the other architectures the
estimate knows, each followed by 16 bytes of settings that the target reads from the tail.
"""
import os
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SDIST = Path(os.environ.get("MODELSERVE_LLAMA_SDIST",
                            Path.home() / ".cache/modelserve/llama-cpp-python-0.3.36"))


def tail(ctx, parallel, ubatch, build, split=0, shift=0):
    return struct.pack("<QHHHBB", ctx, parallel, ubatch, build, split, shift)


TAILS = [tail(16384, 4, 512, 10587), tail(4096, 1, 512, 7000, 1), tail(1 << 40, 300, 9, 65535, 0, 3)]


def s(x):
    b = x.encode()
    return struct.pack("<Q", len(b)) + b


def value(v):
    """(type, bytes) of a Python value: int -> u32 (u64 if large), bool, str, list of ints/bools."""
    if isinstance(v, bool):
        return 7, bytes([v])
    if isinstance(v, int):
        return (4, struct.pack("<I", v)) if v < 1 << 32 else (10, struct.pack("<Q", v))
    if isinstance(v, str):
        return 8, s(v)
    if isinstance(v, list):
        kinds = [value(x) for x in v]
        t = kinds[0][0] if kinds else 4
        return 9, struct.pack("<IQ", t, len(v)) + b"".join(k[1] for k in kinds)
    raise TypeError(v)


def header(arch, kv, tensors):
    items = [("general.architecture", arch)] + [(f"{arch}.{k}", v) for k, v in kv.items()]
    items.append(("tokenizer.ggml.tokens", [f"t{i}" for i in range(64)]))
    b = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(items))
    for k, v in items:
        t, data = value(v)
        if t == 9 and isinstance(v, list) and v and isinstance(v[0], str):
            data = struct.pack("<IQ", 8, len(v)) + b"".join(s(x) for x in v)
        b += s(k) + struct.pack("<I", t) + data
    for i, (name, dims, ty) in enumerate(tensors):
        b += s(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        b += struct.pack("<IQ", ty, 32 * i)
    return b + b"\0" * ((-len(b)) % 32)


BASE = {"block_count": 4, "embedding_length": 256, "attention.head_count": 4,
        "attention.head_count_kv": 2, "feed_forward_length": 512, "context_length": 4096}
TENSORS = [("token_embd.weight", [256, 64], 1), ("blk.0.attn_q.weight", [256, 256], 12),
           ("blk.0.ffn_gate_exps.weight", [256, 512, 8], 8), ("output_norm.weight", [256], 0)]
BUILT = {
    "gemma2": {},
    "gemma3": {"attention.sliding_window": 512, "attention.key_length": 64,
               "attention.sliding_window_pattern": [True, True, True, False]},
    "llama4": {"expert_count": 16, "expert_used_count": 1, "expert_feed_forward_length": 256},
    "deepseek2": {"attention.key_length_mla": 192, "attention.kv_lora_rank": 512,
                  "attention.q_lora_rank": 1536, "expert_count": 64, "expert_shared_count": 2,
                  "leading_dense_block_count": 1, "expert_feed_forward_length": 128,
                  "expert_used_count": 6},
    "rwkv7": {"wkv.head_size": 64, "token_shift_count": 2, "attention.decay_lora_rank": 64},
    "lfm2": {"shortconv.l_cache": 3, "attention.head_count_kv": [0, 2, 0, 2]},
    "kimi-linear": {"ssm.conv_kernel": 4, "kda.head_dim": 128, "attention.head_count_kv": [0, 0, 0, 2]},
    "qwen3next": {"full_attention_interval": 4, "ssm.inner_size": 512, "ssm.state_size": 128,
                  "ssm.group_count": 2, "ssm.conv_kernel": 4, "ssm.time_step_rank": 16},
    "nemotron_h": {"attention.head_count_kv": [0, 2, 0, 0], "feed_forward_length": [0, 0, 512, 0],
                   "ssm.inner_size": 512, "ssm.state_size": 128, "ssm.group_count": 8},
    "falcon-h1": {"ssm.inner_size": 512, "ssm.state_size": 16, "ssm.conv_kernel": 4},
    "jamba": {"attention.head_count_kv": [0, 0, 0, 2], "ssm.inner_size": 512, "ssm.state_size": 16,
              "ssm.conv_kernel": 4, "expert_count": 16, "expert_used_count": 2},
    "plamo2": {"attention.recurrent_layers": [True, False, True, False]},
    "bert": {"vocab_size": 30522},
}


def main():
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(SDIST / "vendor/llama.cpp/gguf-py"))
    from gguf import GGUFReader
    n = 0
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, str(HERE.parent / "testbed/gen_gguf.py"), tmp,
                        "--sdist", str(SDIST)], check=True, stdout=subprocess.DEVNULL)
        for f in sorted(Path(tmp).iterdir()):
            head = f.read_bytes()[: GGUFReader(str(f)).data_offset]
            for i, t in enumerate(TAILS):
                (out / f"{f.stem}-{i}").write_bytes(head + t)
                n += 1
    for arch, kv in BUILT.items():
        head = header(arch, {**BASE, **kv}, TENSORS)
        for i, t in enumerate(TAILS):
            (out / f"built-{arch}-{i}").write_bytes(head + t)
            n += 1
    print(f"{n} seeds in {out}")


if __name__ == "__main__":
    main()
