#!/usr/bin/env python3
"""Write tiny (or deliberately large) GGUF model files with random weights.

The files are meant to be loadable by the llama.cpp that the pinned
llama-cpp-python sdist vendors: the metadata keys, tensor names and tensor
shapes follow that version's loader (src/llama-model.cpp and
src/models/<arch>.cpp), and the names come from the gguf-py package shipped
in the same sdist, so a llama.cpp bump that renames something fails here
instead of in a cluster test.

    python3 testbed/gen_gguf.py OUT_DIR [--arch NAME ...] [--size tiny|large|bench|gpu|wide] [--vocab NAME]

Prints one line per file written: "<path> <arch> <size in bytes>".

By default the files carry a toy byte-level BPE vocab of a few hundred tokens. --vocab NAME
copies the real tokenizer of the sdist's models/ggml-vocab-NAME.gguf instead (llama-spm,
llama-bpe, qwen2, gemma-4, phi-3, gpt-neox, command-r, ...), and token_embd/output take its
size: a 262k vocabulary is what makes the output buffer and the logits of a real model big.
--size bench gives the shapes testbed/quantize_models.py quantizes for bench_memory.py, --size
gpu those testbed/gpu-check.sh runs on a GPU, --size wide four blocks of real widths for the
op-offload table.

The sdist directory comes from $MODELSERVE_LLAMA_SDIST, or --sdist, or by
running llama-sdist.sh next to this script (which downloads it once).
Needs numpy and pyyaml (gguf-py imports yaml): pip install numpy pyyaml.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
GIB = 1 << 30

try:
    import numpy as np
except ImportError:
    sys.exit("gen_gguf: numpy is missing; install it with: python3 -m pip install numpy pyyaml")


def die(msg: str) -> None:
    sys.exit(f"gen_gguf: {msg}")


def sdist_dir(explicit: str | None) -> Path:
    """Directory of the unpacked llama-cpp-python sdist."""
    if explicit or os.environ.get("MODELSERVE_LLAMA_SDIST"):
        d = Path(explicit or os.environ["MODELSERVE_LLAMA_SDIST"])
    else:
        # llama-sdist.sh is a no-op after the first run; its last stdout line is the directory.
        script = HERE / "llama-sdist.sh"
        r = subprocess.run(["bash", str(script)], stdout=subprocess.PIPE, text=True)
        lines = r.stdout.strip().splitlines()
        if r.returncode != 0 or not lines:
            die(f"{script} failed (exit {r.returncode}); see its messages above")
        d = Path(lines[-1])
    if not (d / "vendor/llama.cpp/gguf-py/gguf/__init__.py").is_file():
        die(f"{d} does not look like an unpacked llama-cpp-python sdist (no vendor/llama.cpp/gguf-py)")
    return d


def import_gguf(d: Path) -> Any:
    """Import the gguf-py that matches the vendored llama.cpp, not whatever is installed."""
    sys.path.insert(0, str(d / "vendor/llama.cpp/gguf-py"))
    try:
        import gguf  # noqa: PLC0415
    except ImportError as e:
        die(f"importing the vendored gguf-py failed ({e}); install its dependencies: python3 -m pip install numpy pyyaml")
    if not Path(gguf.__file__).resolve().is_relative_to(d.resolve()):
        die(f"imported gguf from {gguf.__file__}, not from {d}; uninstall the pip 'gguf' package or fix sys.path")
    return gguf


# --------------------------------------------------------------------------
# Tokenizer: a byte-level BPE ("gpt2") vocab small enough to keep files tiny.
# --------------------------------------------------------------------------

def byte_symbols() -> list[str]:
    """The printable stand-in character GPT-2 style BPE uses for each byte value.

    Bytes that are visible Latin-1 characters stand for themselves; the rest
    (controls, space, etc.) are shifted to code points from U+0100 upwards, in
    byte order. llama.cpp's BPE tokenizer falls back to exactly these symbols
    for any byte no merge covers, so all 256 must be in the vocab.
    """
    keep = set(range(ord("!"), ord("~") + 1)) | set(range(0xA1, 0xAC + 1)) | set(range(0xAE, 0xFF + 1))
    out, shifted = [], 0
    for b in range(256):
        if b in keep:
            out.append(chr(b))
        else:
            out.append(chr(256 + shifted))
            shifted += 1
    return out


# A handful of merges ("Ġ" is the symbol for a space byte), each building on
# tokens that already exist, so tokenizing English exercises the merge path.
MERGE_PAIRS = [
    ("Ġ", "t"), ("h", "e"), ("i", "n"), ("e", "r"), ("a", "n"), ("o", "n"), ("r", "e"),
    ("Ġ", "a"), ("Ġ", "s"), ("Ġ", "w"), ("Ġ", "o"), ("Ġ", "c"), ("Ġ", "h"), ("Ġ", "i"),
    ("o", "u"), ("e", "n"), ("i", "s"), ("a", "t"), ("o", "r"), ("Ġt", "he"),
    ("Ġa", "n"), ("Ġ", "in"), ("l", "l"), ("Ġh", "e"), ("Ġ", "is"), ("Ġw", "or"), ("l", "d"),
]
# <unk>/<s>/</s> are unused by the template, but llama.cpp's vocab loader looks them up
# by text for some model names (general.name containing "phi3"), and fails without them.
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>", "<s>", "</s>"]

# Minimal ChatML template so llama-server's /v1/chat/completions has something to render.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@dataclass
class Vocab:
    tokens: list[str]
    types: list[int]
    merges: list[str]
    bos: int
    eos: int
    pad: int
    # A real tokenizer's tokenizer.* keys as (key, value, type, array element type), in file
    # order; None for the toy vocab, whose keys common_meta writes itself.
    copied: list[tuple[str, Any, Any, Any]] | None = None


def build_vocab(gguf: Any) -> Vocab:
    tokens = byte_symbols()
    types = [int(gguf.TokenType.NORMAL)] * len(tokens)
    merges = []
    known = set(tokens)
    for a, b in MERGE_PAIRS:
        # llama.cpp looks merge results up by text, so both halves and the result must be tokens
        assert a in known and b in known, f"merge {a!r} {b!r} uses an unknown token"
        merges.append(f"{a} {b}")
        if a + b not in known:
            tokens.append(a + b)
            types.append(int(gguf.TokenType.NORMAL))
            known.add(a + b)
    first_special = len(tokens)
    tokens += SPECIALS
    types += [int(gguf.TokenType.CONTROL)] * len(SPECIALS)
    assert len(set(tokens)) == len(tokens), "duplicate token text (llama.cpp asserts on this)"
    return Vocab(tokens, types, merges, bos=first_special, eos=first_special + 2, pad=first_special)


def vocab_names(sdist: Path) -> list[str]:
    return sorted(f.name[len("ggml-vocab-"):-len(".gguf")]
                  for f in (sdist / "vendor/llama.cpp/models").glob("ggml-vocab-*.gguf"))


def read_vocab(gguf: Any, sdist: Path, name: str) -> Vocab:
    """Every tokenizer.* key of models/ggml-vocab-NAME.gguf, as llama.cpp's tests ship it.

    These files are the real tokenizers of their model families without the weights, so a
    model written with one tokenizes (and sizes its vocab-bound buffers) like the real thing.
    """
    path = sdist / "vendor/llama.cpp/models" / f"ggml-vocab-{name}.gguf"
    if not path.is_file():
        die(f"no vocab {name!r}: {path} is missing; known: {', '.join(vocab_names(sdist))}")
    r = gguf.GGUFReader(path)
    copied = []
    for key, f in r.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = f.types[0]
        sub = f.types[1] if vtype == gguf.GGUFValueType.ARRAY else None
        if sub == gguf.GGUFValueType.ARRAY:
            die(f"{path}: {key} is a nested array, which this copy does not handle")
        copied.append((key, f.contents(), vtype, sub))
    keys = {k: v for k, v, _, _ in copied}
    tokens = keys.get("tokenizer.ggml.tokens")
    if not tokens:
        die(f"{path} has no tokenizer.ggml.tokens")
    return Vocab(tokens, keys.get("tokenizer.ggml.token_type", []), keys.get("tokenizer.ggml.merges", []),
                 bos=keys.get("tokenizer.ggml.bos_token_id", -1), eos=keys.get("tokenizer.ggml.eos_token_id", -1),
                 pad=keys.get("tokenizer.ggml.padding_token_id", -1), copied=copied)


# --------------------------------------------------------------------------
# Tensor plans: name, ggml shape (ne, innermost first) and how to fill it.
# --------------------------------------------------------------------------

@dataclass
class Tensor:
    name: str
    ne: tuple[int, ...]   # ggml order, as written in llama.cpp's create_tensor calls
    init: str             # weight | ones | zeros | ssm_a | dt_bias
    f32: bool             # stored as F32 regardless of --dtype

    @property
    def np_shape(self) -> tuple[int, ...]:
        return tuple(reversed(self.ne))  # numpy is outermost-first

    @property
    def n(self) -> int:
        return int(np.prod(self.ne))


class Plan:
    """Collects the metadata and tensors for one file, checking names against gguf-py."""

    def __init__(self, gguf: Any, arch: str):
        self.gguf = gguf
        self.arch = arch
        arch_id = next((k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch), None)
        if arch_id is None:
            die(f"the vendored gguf-py does not know architecture {arch!r}")
        # The vendored gguf-py lists which tensors each architecture may carry. Compare
        # by name: some archs list an alias enum (gemma3: FFN_PRE_NORM is "ffn_norm").
        self.allowed = {gguf.TENSOR_NAMES[k] for k in gguf.MODEL_TENSORS[arch_id]}
        self.tensors: list[Tensor] = []
        self.kv: list[Callable[[Any], None]] = []

    def meta(self, fn: Callable[[Any], None]) -> None:
        self.kv.append(fn)

    def t(self, kind: Any, ne: tuple[int, ...], bid: int | None = None, suffix: str | None = "weight",
          init: str | None = None, f32: bool = False) -> None:
        template = self.gguf.TENSOR_NAMES[kind]
        if template not in self.allowed:
            die(f"{self.arch}: tensor {template} is not in gguf-py's MODEL_TENSORS for this arch")
        name = template.format(bid=bid)
        if suffix:
            name += "." + suffix
        if init is None:
            init = "ones" if name.endswith("norm.weight") else ("zeros" if suffix == "bias" else "weight")
        # Same rule the converter applies: 1-D tensors, norms, router and conv weights and
        # anything not named *.weight stay F32 (several ggml ops only take F32 there).
        f32 = (f32 or len(ne) == 1 or name.endswith("_norm.weight") or not name.endswith(".weight")
               or kind in (self.gguf.MODEL_TENSOR.FFN_GATE_INP, self.gguf.MODEL_TENSOR.SSM_CONV1D))
        self.tensors.append(Tensor(name, tuple(int(x) for x in ne), init, f32))

    def weight_bytes(self, f16: bool) -> int:
        return sum(t.n * (4 if (t.f32 or not f16) else 2) for t in self.tensors)


def common_meta(p: Plan, c: dict, vocab: Vocab, pre: str, add_bos: bool) -> None:
    """Keys every architecture here needs: general.*, base hparams and the tokenizer."""
    g = p.gguf

    def fn(w: Any) -> None:
        w.add_type("model")
        w.add_name(f"modelserve-test-{p.arch}-{c['size']}")
        w.add_quantization_version(g.GGML_QUANT_VERSION)
        w.add_context_length(c["ctx"])
        w.add_embedding_length(c["n_embd"])
        w.add_block_count(c["n_layer"])
        w.add_layer_norm_rms_eps(c.get("eps", 1e-6))
        if vocab.copied is not None:
            for key, value, vtype, sub in vocab.copied:
                w.add_key_value(key, value, vtype, sub)
            if not any(k == g.Keys.Tokenizer.CHAT_TEMPLATE for k, *_ in vocab.copied):
                # Without ChatML tokens in the vocab the markers are tokenized as plain text,
                # which is all a chat completion against random weights needs.
                w.add_chat_template(CHAT_TEMPLATE)
            return
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(pre)
        w.add_token_list(vocab.tokens)
        w.add_token_types(vocab.types)
        w.add_token_merges(vocab.merges)
        w.add_bos_token_id(vocab.bos)
        w.add_eos_token_id(vocab.eos)
        w.add_pad_token_id(vocab.pad)
        w.add_add_bos_token(add_bos)
        w.add_chat_template(CHAT_TEMPLATE)
    p.meta(fn)


def embed_and_head(p: Plan, c: dict, n_vocab: int, tied: bool = False) -> None:
    T = p.gguf.MODEL_TENSOR
    tied = c.get("tied", tied)
    p.t(T.TOKEN_EMBD, (c["n_embd"], n_vocab))
    p.t(T.OUTPUT_NORM, (c["n_embd"],))
    if not tied:  # without output.weight, llama.cpp reuses token_embd (tied embeddings)
        p.t(T.OUTPUT, (c["n_embd"], n_vocab))


def attn_gqa(p: Plan, i: int, n_embd: int, n_head: int, n_head_kv: int, head_dim: int, bias: bool = False) -> None:
    """Separate Q/K/V/O projections, as create_tensor_qkv() loads them when attn_qkv is absent."""
    T = p.gguf.MODEL_TENSOR
    p.t(T.ATTN_Q, (n_embd, n_head * head_dim), i)
    p.t(T.ATTN_K, (n_embd, n_head_kv * head_dim), i)
    p.t(T.ATTN_V, (n_embd, n_head_kv * head_dim), i)
    if bias:
        p.t(T.ATTN_Q, (n_head * head_dim,), i, "bias")
        p.t(T.ATTN_K, (n_head_kv * head_dim,), i, "bias")
        p.t(T.ATTN_V, (n_head_kv * head_dim,), i, "bias")
    p.t(T.ATTN_OUT, (n_head * head_dim, n_embd), i)


def ffn_swiglu(p: Plan, i: int, n_embd: int, n_ff: int) -> None:
    T = p.gguf.MODEL_TENSOR
    p.t(T.FFN_GATE, (n_embd, n_ff), i)
    p.t(T.FFN_UP, (n_embd, n_ff), i)
    p.t(T.FFN_DOWN, (n_ff, n_embd), i)


def mamba2_mixer(p: Plan, i: int, c: dict) -> None:
    """Mamba-2 layer tensors as llama_model_mamba2 / granite_hybrid load them."""
    T = p.gguf.MODEL_TENSOR
    d_inner, d_state, n_group, n_ssm_head = c["d_inner"], c["d_state"], c["n_group"], c["ssm_heads"]
    conv_dim = d_inner + 2 * n_group * d_state
    p.t(T.SSM_IN, (c["n_embd"], 2 * d_inner + 2 * n_group * d_state + n_ssm_head), i)  # z, xBC, dt
    p.t(T.SSM_CONV1D, (c["d_conv"], conv_dim), i)
    p.t(T.SSM_CONV1D, (conv_dim,), i, "bias")
    p.t(T.SSM_DT, (n_ssm_head,), i, "bias", init="dt_bias")
    p.t(T.SSM_A, (1, n_ssm_head), i, None, init="ssm_a")   # stored as -exp(A_log), no suffix
    p.t(T.SSM_D, (1, n_ssm_head), i, None, init="ones")    # no suffix either
    p.t(T.SSM_NORM, (d_inner // n_group, n_group), i)
    p.t(T.SSM_OUT, (d_inner, c["n_embd"]), i)


def mamba2_meta(c: dict) -> Callable[[Any], None]:
    def fn(w: Any) -> None:
        w.add_ssm_conv_kernel(c["d_conv"])
        w.add_ssm_inner_size(c["d_inner"])
        w.add_ssm_state_size(c["d_state"])
        w.add_ssm_time_step_rank(c["ssm_heads"])  # llama.cpp uses this as the SSM head count
        w.add_ssm_group_count(c["n_group"])
    return fn


# --------------------------------------------------------------------------
# Architectures. Each has tiny and large dimensions; large ones are checked
# to reach 1 GiB of weights. Comments name the llama.cpp source each follows.
# --------------------------------------------------------------------------

def arch_llama(p: Plan, c: dict, v: Vocab) -> None:
    # src/models/llama.cpp; load_hparams insists rope.dimension_count == head size for llama.
    T = p.gguf.MODEL_TENSOR
    hd = c["n_embd"] // c["n_head"]
    common_meta(p, c, v, "llama-bpe", add_bos=True)

    def fn(w: Any) -> None:
        w.add_feed_forward_length(c["n_ff"])
        w.add_head_count(c["n_head"])
        w.add_head_count_kv(c["n_head_kv"])
        w.add_rope_freq_base(500000.0)
        w.add_rope_dimension_count(hd)
        w.add_vocab_size(len(v.tokens))
    p.meta(fn)
    embed_and_head(p, c, len(v.tokens))
    for i in range(c["n_layer"]):
        p.t(T.ATTN_NORM, (c["n_embd"],), i)
        attn_gqa(p, i, c["n_embd"], c["n_head"], c["n_head_kv"], hd)
        p.t(T.FFN_NORM, (c["n_embd"],), i)
        ffn_swiglu(p, i, c["n_embd"], c["n_ff"])


def arch_qwen2(p: Plan, c: dict, v: Vocab) -> None:
    # src/models/qwen2.cpp: Q is n_embd wide; real Qwen2 checkpoints carry Q/K/V biases.
    T = p.gguf.MODEL_TENSOR
    hd = c["n_embd"] // c["n_head"]
    common_meta(p, c, v, "qwen2", add_bos=False)

    def fn(w: Any) -> None:
        w.add_feed_forward_length(c["n_ff"])
        w.add_head_count(c["n_head"])
        w.add_head_count_kv(c["n_head_kv"])
        w.add_rope_freq_base(1000000.0)
    p.meta(fn)
    embed_and_head(p, c, len(v.tokens))
    for i in range(c["n_layer"]):
        p.t(T.ATTN_NORM, (c["n_embd"],), i)
        attn_gqa(p, i, c["n_embd"], c["n_head"], c["n_head_kv"], hd, bias=True)
        p.t(T.FFN_NORM, (c["n_embd"],), i)
        ffn_swiglu(p, i, c["n_embd"], c["n_ff"])


def arch_qwen3moe(p: Plan, c: dict, v: Vocab) -> None:
    # src/models/qwen3moe.cpp: head size from key_length (n_head*head_dim != n_embd on purpose),
    # per-head Q/K norms, router + stacked experts sized by expert_feed_forward_length.
    T = p.gguf.MODEL_TENSOR
    hd, E = c["head_dim"], c["n_expert"]
    common_meta(p, c, v, "qwen2", add_bos=False)

    def fn(w: Any) -> None:
        w.add_feed_forward_length(c["n_ff"])
        w.add_expert_feed_forward_length(c["n_ff_exp"])
        w.add_head_count(c["n_head"])
        w.add_head_count_kv(c["n_head_kv"])
        w.add_key_length(hd)
        w.add_value_length(hd)
        w.add_rope_freq_base(1000000.0)
        w.add_expert_count(E)
        w.add_expert_used_count(c["n_expert_used"])
    p.meta(fn)
    embed_and_head(p, c, len(v.tokens))
    for i in range(c["n_layer"]):
        p.t(T.ATTN_NORM, (c["n_embd"],), i)
        attn_gqa(p, i, c["n_embd"], c["n_head"], c["n_head_kv"], hd)
        p.t(T.ATTN_Q_NORM, (hd,), i)
        p.t(T.ATTN_K_NORM, (hd,), i)
        p.t(T.FFN_NORM, (c["n_embd"],), i)
        p.t(T.FFN_GATE_INP, (c["n_embd"], E), i)
        p.t(T.FFN_GATE_EXP, (c["n_embd"], c["n_ff_exp"], E), i)
        p.t(T.FFN_UP_EXP, (c["n_embd"], c["n_ff_exp"], E), i)
        p.t(T.FFN_DOWN_EXP, (c["n_ff_exp"], c["n_embd"], E), i)


def arch_gemma3(p: Plan, c: dict, v: Vocab) -> None:
    # src/models/gemma3.cpp: attention.sliding_window switches on iSWA with the default
    # pattern of 6 (layers i%6 < 5 are SWA, every 6th is global); tied output.
    T = p.gguf.MODEL_TENSOR
    hd = c["head_dim"]
    assert c["n_layer"] >= 6, "gemma3 needs >= 6 layers to have both SWA and global layers"
    common_meta(p, c, v, "gpt-2", add_bos=True)

    def fn(w: Any) -> None:
        w.add_feed_forward_length(c["n_ff"])
        w.add_head_count(c["n_head"])
        w.add_head_count_kv(c["n_head_kv"])
        w.add_key_length(hd)
        w.add_value_length(hd)
        w.add_rope_freq_base(1000000.0)
        w.add_rope_freq_base_swa(10000.0)
        w.add_sliding_window(c["swa"])
    p.meta(fn)
    embed_and_head(p, c, len(v.tokens), tied=True)
    for i in range(c["n_layer"]):
        p.t(T.ATTN_NORM, (c["n_embd"],), i)
        attn_gqa(p, i, c["n_embd"], c["n_head"], c["n_head_kv"], hd)
        p.t(T.ATTN_Q_NORM, (hd,), i)
        p.t(T.ATTN_K_NORM, (hd,), i)
        p.t(T.ATTN_POST_NORM, (c["n_embd"],), i)
        p.t(T.FFN_NORM, (c["n_embd"],), i)
        ffn_swiglu(p, i, c["n_embd"], c["n_ff"])
        p.t(T.FFN_POST_NORM, (c["n_embd"],), i)


def arch_deepseek2(p: Plan, c: dict, v: Vocab) -> None:
    # src/models/deepseek2.cpp + conversion/deepseek.py (MLA layout): the cache holds one
    # compressed "head" of kv_lora_rank + rope dims, kv_b is pre-split into k_b / v_b.
    # DeepSeek-V3 flavour: q_lora, sigmoid router with exp_probs_b, 1 dense lead layer.
    T = p.gguf.MODEL_TENSOR
    n_embd, H = c["n_embd"], c["n_head"]
    rope, nope, vdim = c["qk_rope"], c["qk_nope"], c["v_head"]
    q_lora, kv_lora, E = c["q_lora"], c["kv_lora"], c["n_expert"]
    n_ff_exp, n_shared = c["n_ff_exp"], c["n_shared"]
    # n_layer 26/27 would make llama.cpp treat it as a "lite" model without q_lora
    assert c["n_layer"] not in (26, 27)
    common_meta(p, c, v, "deepseek-v3", add_bos=True)

    def fn(w: Any) -> None:
        w.add_feed_forward_length(c["n_ff"])
        w.add_head_count(H)
        w.add_head_count_kv(1)                      # MLA runs as MQA over the latent
        w.add_rope_freq_base(10000.0)
        w.add_vocab_size(len(v.tokens))
        w.add_leading_dense_block_count(c["n_dense"])
        w.add_q_lora_rank(q_lora)
        w.add_kv_lora_rank(kv_lora)
        w.add_key_length(kv_lora + rope)
        w.add_value_length(kv_lora)
        w.add_key_length_mla(nope + rope)
        w.add_value_length_mla(vdim)
        w.add_rope_dimension_count(rope)
        w.add_expert_feed_forward_length(n_ff_exp)
        w.add_expert_count(E)
        w.add_expert_used_count(c["n_expert_used"])
        w.add_expert_group_count(c["n_group"])
        w.add_expert_group_used_count(c["n_group_used"])
        w.add_expert_shared_count(n_shared)
        w.add_expert_weights_scale(2.5)
        w.add_expert_weights_norm(True)
        w.add_expert_gating_func(p.gguf.ExpertGatingFuncType.SIGMOID)
    p.meta(fn)
    embed_and_head(p, c, len(v.tokens))
    for i in range(c["n_layer"]):
        p.t(T.ATTN_NORM, (n_embd,), i)
        p.t(T.ATTN_Q_A, (n_embd, q_lora), i)
        p.t(T.ATTN_Q_A_NORM, (q_lora,), i)
        p.t(T.ATTN_Q_B, (q_lora, H * (nope + rope)), i)
        p.t(T.ATTN_KV_A_MQA, (n_embd, kv_lora + rope), i)
        p.t(T.ATTN_KV_A_NORM, (kv_lora,), i)
        # F32 although the converter writes F16: on AMX CPUs this llama.cpp puts F16 weights in
        # the AMX buffer, whose matmul rejects the permuted activations k_b/v_b are applied to,
        # and context creation aborts (GGML_ASSERT(*cur_backend_id != -1) in ggml-backend.cpp).
        p.t(T.ATTN_K_B, (nope, kv_lora, H), i, f32=True)
        p.t(T.ATTN_V_B, (kv_lora, vdim, H), i, f32=True)
        p.t(T.ATTN_OUT, (H * vdim, n_embd), i)
        p.t(T.FFN_NORM, (n_embd,), i)
        if i < c["n_dense"]:
            ffn_swiglu(p, i, n_embd, c["n_ff"])
            continue
        p.t(T.FFN_GATE_INP, (n_embd, E), i)
        p.t(T.FFN_EXP_PROBS_B, (E,), i, "bias")
        p.t(T.FFN_GATE_EXP, (n_embd, n_ff_exp, E), i)
        p.t(T.FFN_UP_EXP, (n_embd, n_ff_exp, E), i)
        p.t(T.FFN_DOWN_EXP, (n_ff_exp, n_embd, E), i)
        p.t(T.FFN_GATE_SHEXP, (n_embd, n_ff_exp * n_shared), i)
        p.t(T.FFN_UP_SHEXP, (n_embd, n_ff_exp * n_shared), i)
        p.t(T.FFN_DOWN_SHEXP, (n_ff_exp * n_shared, n_embd), i)


def arch_mamba2(p: Plan, c: dict, v: Vocab) -> None:
    # src/models/mamba2.cpp; head_count/feed_forward_length 0 as conversion/mamba.py writes them.
    T = p.gguf.MODEL_TENSOR
    common_meta(p, c, v, "gpt-2", add_bos=False)

    def fn(w: Any) -> None:
        w.add_feed_forward_length(0)
        w.add_head_count(0)
    p.meta(fn)
    p.meta(mamba2_meta(c))
    embed_and_head(p, c, len(v.tokens))
    for i in range(c["n_layer"]):
        p.t(T.ATTN_NORM, (c["n_embd"],), i)
        mamba2_mixer(p, i, c)


def arch_granitehybrid(p: Plan, c: dict, v: Vocab) -> None:
    # src/models/granite-hybrid.cpp (Granite 4.0-H, dense FFN): a layer is recurrent iff its
    # head_count_kv entry is 0; d_inner must be 2*n_embd; NoPE (rope.scaling.finetuned=false).
    T = p.gguf.MODEL_TENSOR
    assert c["d_inner"] == 2 * c["n_embd"], "granitehybrid only supports an expansion factor of 2"
    hd = c["n_embd"] // c["n_head"]
    kv = [c["n_head_kv"] if i in c["attn_layers"] else 0 for i in range(c["n_layer"])]
    assert 0 in kv and any(kv), "want both recurrent and attention layers"
    common_meta(p, c, v, "gpt-2", add_bos=False)

    def fn(w: Any) -> None:
        w.add_feed_forward_length(c["n_ff"])
        w.add_head_count(c["n_head"])
        w.add_head_count_kv(kv)                     # per-layer array, 0 = Mamba-2 layer
        w.add_rope_freq_base(10000.0)
        w.add_rope_scaling_finetuned(False)
        w.add_attention_scale(1.0 / hd)
        w.add_embedding_scale(12.0)
        w.add_residual_scale(0.22)
        w.add_logit_scale(6.0)
    p.meta(fn)
    p.meta(mamba2_meta(c))
    embed_and_head(p, c, len(v.tokens), tied=True)
    for i in range(c["n_layer"]):
        p.t(T.ATTN_NORM, (c["n_embd"],), i)
        if kv[i] == 0:
            mamba2_mixer(p, i, c)
        else:
            attn_gqa(p, i, c["n_embd"], c["n_head"], kv[i], hd)
        p.t(T.FFN_NORM, (c["n_embd"],), i)
        ffn_swiglu(p, i, c["n_embd"], c["n_ff"])


def arch_phi3(p: Plan, c: dict, v: Vocab) -> None:
    # src/models/phi3.cpp: fused attn_qkv and a fused gate+up in ffn_up ({n_embd, 2*n_ff}).
    T = p.gguf.MODEL_TENSOR
    n_embd = c["n_embd"]
    hd = n_embd // c["n_head"]
    common_meta(p, c, v, "gpt-2", add_bos=False)

    def fn(w: Any) -> None:
        w.add_feed_forward_length(c["n_ff"])
        w.add_head_count(c["n_head"])
        w.add_head_count_kv(c["n_head_kv"])
        w.add_rope_dimension_count(hd)
        w.add_rope_freq_base(10000.0)
    p.meta(fn)
    embed_and_head(p, c, len(v.tokens))
    for i in range(c["n_layer"]):
        p.t(T.ATTN_NORM, (n_embd,), i)
        p.t(T.ATTN_QKV, (n_embd, n_embd + 2 * c["n_head_kv"] * hd), i)
        p.t(T.ATTN_OUT, (n_embd, n_embd), i)
        p.t(T.FFN_NORM, (n_embd,), i)
        p.t(T.FFN_UP, (n_embd, 2 * c["n_ff"]), i)
        p.t(T.FFN_DOWN, (c["n_ff"], n_embd), i)


MAMBA_TINY = dict(d_inner=128, d_state=16, n_group=1, ssm_heads=4, d_conv=4)
MAMBA_LARGE = dict(d_inner=4096, d_state=128, n_group=1, ssm_heads=64, d_conv=4)

# (builder, tiny dims, large dims). Large dims are loosely modelled on real 1-3B checkpoints.
ARCHS: dict[str, tuple[Callable[[Plan, dict, Vocab], None], dict, dict]] = {
    "llama": (arch_llama,
              dict(ctx=4096, n_embd=64, n_head=4, n_head_kv=2, n_ff=128, n_layer=2, eps=1e-5),
              dict(ctx=8192, n_embd=2048, n_head=16, n_head_kv=8, n_ff=5632, n_layer=16, eps=1e-5)),
    "qwen2": (arch_qwen2,
              dict(ctx=32768, n_embd=64, n_head=4, n_head_kv=2, n_ff=128, n_layer=2),
              dict(ctx=32768, n_embd=1536, n_head=12, n_head_kv=2, n_ff=8960, n_layer=14)),
    "qwen3moe": (arch_qwen3moe,
                 dict(ctx=40960, n_embd=64, n_head=4, n_head_kv=2, head_dim=32, n_ff=128,
                      n_ff_exp=32, n_expert=4, n_expert_used=2, n_layer=2),
                 dict(ctx=40960, n_embd=1024, n_head=16, n_head_kv=4, head_dim=128, n_ff=3072,
                      n_ff_exp=512, n_expert=32, n_expert_used=4, n_layer=12)),
    "gemma3": (arch_gemma3,
               dict(ctx=32768, n_embd=64, n_head=4, n_head_kv=1, head_dim=32, n_ff=128, n_layer=6, swa=32),
               dict(ctx=32768, n_embd=1152, n_head=4, n_head_kv=1, head_dim=256, n_ff=6912, n_layer=26, swa=512)),
    "deepseek2": (arch_deepseek2,
                  dict(ctx=4096, n_embd=64, n_head=4, q_lora=32, kv_lora=32, qk_rope=8, qk_nope=16, v_head=16,
                       n_ff=128, n_dense=1, n_expert=4, n_expert_used=2, n_group=2, n_group_used=1,
                       n_ff_exp=32, n_shared=1, n_layer=3),
                  dict(ctx=163840, n_embd=2048, n_head=16, q_lora=768, kv_lora=512, qk_rope=64, qk_nope=128,
                       v_head=128, n_ff=5632, n_dense=1, n_expert=16, n_expert_used=4, n_group=4,
                       n_group_used=2, n_ff_exp=1024, n_shared=1, n_layer=7)),
    "mamba2": (arch_mamba2,
               dict(ctx=1 << 20, n_embd=64, n_layer=2, eps=1e-5, **MAMBA_TINY),
               dict(ctx=1 << 20, n_embd=2048, n_layer=24, eps=1e-5, **MAMBA_LARGE)),
    "granitehybrid": (arch_granitehybrid,
                      dict(ctx=1 << 20, n_embd=64, n_head=4, n_head_kv=2, n_ff=128, n_layer=4,
                           attn_layers=(2,), eps=1e-5, **MAMBA_TINY),
                      dict(ctx=1 << 20, n_embd=2048, n_head=16, n_head_kv=4, n_ff=4096, n_layer=12,
                           attn_layers=(5, 11), eps=1e-5, **MAMBA_LARGE)),
    "phi3": (arch_phi3,
             dict(ctx=4096, n_embd=64, n_head=4, n_head_kv=4, n_ff=128, n_layer=2, eps=1e-5),
             dict(ctx=4096, n_embd=3072, n_head=32, n_head_kv=32, n_ff=8192, n_layer=6, eps=1e-5)),
}

# Shapes for the memory benchmark (testbed/quantize_models.py). llama, qwen2 and gemma3 are
# big enough to stay >= 1 GiB after Q4_K_M (about 3.5 GiB in F16), where the estimate has to
# be within 10% of the peak RSS; the rest are a few hundred MB, mostly vocabulary, to keep
# quantizing and serving them quick. Widths follow real checkpoints where that is cheap: phi3
# is 896 wide like Qwen2.5-0.5B, which is no multiple of 256, so llama-quantize has to fall
# back from the k-quants on nearly every matrix of it (and deepseek2's attn_k_b, 128 wide).
BENCH: dict[str, dict] = {
    # a Llama-2-style 2B: SPM vocab, GQA 20/4, untied
    "llama": dict(ctx=4096, n_embd=2560, n_head=20, n_head_kv=4, n_ff=6912, n_layer=26, eps=1e-5),
    # Qwen2.5-1.5B with 30 layers and an untied output (the real one ties it, and is < 1 GiB at Q4_K_M)
    "qwen2": dict(ctx=32768, n_embd=1536, n_head=12, n_head_kv=2, n_ff=8960, n_layer=30, tied=False),
    "qwen3moe": dict(ctx=40960, n_embd=512, n_head=8, n_head_kv=4, head_dim=128, n_ff=1536,
                     n_ff_exp=256, n_expert=16, n_expert_used=4, n_layer=4),
    # Gemma-2-2B widths with 16 layers: 262k tied vocab, 2 of the 16 layers global
    "gemma3": dict(ctx=32768, n_embd=2304, n_head=8, n_head_kv=4, head_dim=256, n_ff=9216, n_layer=16,
                   swa=1024),
    "deepseek2": dict(ctx=163840, n_embd=768, n_head=8, q_lora=512, kv_lora=512, qk_rope=64, qk_nope=128,
                      v_head=128, n_ff=2816, n_dense=1, n_expert=8, n_expert_used=4, n_group=4,
                      n_group_used=2, n_ff_exp=512, n_shared=1, n_layer=4),
    # mamba2-130m widths with 8 layers, tied like it
    "mamba2": dict(ctx=1 << 20, n_embd=768, n_layer=8, eps=1e-5, tied=True,
                   d_inner=1536, d_state=128, n_group=1, ssm_heads=24, d_conv=4),
    "granitehybrid": dict(ctx=1 << 20, n_embd=768, n_head=12, n_head_kv=4, n_ff=2048, n_layer=8,
                          attn_layers=(3, 7), eps=1e-5, d_inner=1536, d_state=128, n_group=1,
                          ssm_heads=24, d_conv=4),
    "phi3": dict(ctx=4096, n_embd=896, n_head=14, n_head_kv=14, n_ff=4864, n_layer=4, eps=1e-5),
}
assert BENCH.keys() == ARCHS.keys()

# Shapes for testbed/gpu-check.sh's run on a real GPU (testbed/gpu-sources.sh carries them there,
# with a real 32k vocabulary so that the output layer and the logits weigh what a real model's
# do), which tests/offload_engine.rs also holds over rpc-server devices: a dense model with an
# untied output, one with sliding-window layers (1 global, 5 of 512 tokens), and a hybrid of
# Mamba-2 layers with attention in layers 3 and 7; small enough that the three carry in 36 MiB.
GPU: dict[str, dict] = {
    "llama": dict(ctx=8192, n_embd=256, n_head=4, n_head_kv=2, n_ff=512, n_layer=8, eps=1e-5),
    "gemma3": dict(ctx=8192, n_embd=256, n_head=4, n_head_kv=2, head_dim=128, n_ff=512, n_layer=6,
                   swa=512),
    "granitehybrid": dict(ctx=8192, n_embd=256, n_head=4, n_head_kv=2, n_ff=512, n_layer=8,
                          attn_layers=(3, 7), eps=1e-5, d_inner=512, d_state=128, n_group=1,
                          ssm_heads=8, d_conv=4),
}

# Four blocks of real models' widths, for tests/offload_engine.rs's op-offload table: a GPU that
# runs the host's layers lays their copies, mask and FFN out by the sizes of the weights and rows,
# which the tiny shapes do not reach (a 1024-wide llama with 4 KV heads of 16, Qwen2.5-1.5B's
# widths).
WIDE: dict[str, dict] = {
    "llama": dict(ctx=4096, n_embd=1024, n_head=16, n_head_kv=4, n_ff=2816, n_layer=4, eps=1e-5),
    "qwen2": dict(ctx=32768, n_embd=1536, n_head=12, n_head_kv=2, n_ff=8960, n_layer=4, tied=False),
}


# --------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------

def fill(t: Tensor, rng: np.random.Generator) -> np.ndarray:
    """Random but numerically tame values (no inf/NaN in F16, sane activations)."""
    shape = t.np_shape
    if t.init == "ones":
        a = np.ones(shape, dtype=np.float32)
    elif t.init == "zeros":
        a = np.zeros(shape, dtype=np.float32)
    elif t.init == "ssm_a":   # A = -exp(A_log) must be negative for a stable scan
        a = -rng.uniform(1.0, 16.0, size=shape).astype(np.float32)
    elif t.init == "dt_bias":
        a = rng.uniform(-4.0, -2.0, size=shape).astype(np.float32)
    else:                     # matmul weight: std 1/sqrt(fan_in), fan_in = ne[0]
        a = rng.standard_normal(shape, dtype=np.float32)
        a *= np.float32(1.0 / np.sqrt(t.ne[0]))
    return a


def write_file(gguf: Any, plan: Plan, path: Path, f16: bool, seed: int) -> int:
    w = gguf.GGUFWriter(None, plan.arch)
    for fn in plan.kv:
        fn(w)
    w.add_file_type(int(gguf.LlamaFileType.MOSTLY_F16 if f16 else gguf.LlamaFileType.ALL_F32))
    for t in plan.tensors:
        dt = np.dtype(np.float32 if (t.f32 or not f16) else np.float16)
        w.add_tensor_info(t.name, t.np_shape, dt, t.n * dt.itemsize)
    # Stream tensors one at a time so a >1 GiB file never sits in memory whole, and
    # write under a temporary name so an interrupted run leaves no half-valid file.
    tmp = path.with_name(path.name + ".part")
    w.write_header_to_file(path=tmp)
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    for t in plan.tensors:
        a = fill(t, rng)
        w.write_tensor_data(a if (t.f32 or not f16) else a.astype(np.float16))
    w.close()
    tmp.replace(path)
    return path.stat().st_size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--arch", action="extend", nargs="+", choices=sorted(ARCHS), metavar="NAME",
                    help=f"architectures to write (default: all of {', '.join(ARCHS)})")
    ap.add_argument("--size", choices=("tiny", "large", "bench", "gpu", "wide"), default="tiny",
                    help="tiny: well under 1 MiB each; large: >= 1 GiB of weights each; "
                         "bench: the benchmark shapes (see BENCH); gpu: the GPU check's (see GPU); "
                         "wide: four blocks of real widths (see WIDE)")
    ap.add_argument("--vocab", metavar="NAME",
                    help="copy the tokenizer of the sdist's models/ggml-vocab-NAME.gguf "
                         "(default: a toy BPE vocab of a few hundred tokens)")
    ap.add_argument("--dtype", choices=("f16", "f32"), default="f16", help="type of the matmul weights")
    ap.add_argument("--sdist", help="unpacked llama-cpp-python sdist (default: run llama-sdist.sh)")
    args = ap.parse_args()

    sdist = sdist_dir(args.sdist)
    gguf = import_gguf(sdist)
    vocab = read_vocab(gguf, sdist, args.vocab) if args.vocab else build_vocab(gguf)
    f16 = args.dtype == "f16"
    args.out_dir.mkdir(parents=True, exist_ok=True)

    only = {"gpu": GPU, "wide": WIDE}.get(args.size)
    archs = list(dict.fromkeys(args.arch or (only or ARCHS)))  # keep order, drop repeats
    if only is not None and any(a not in only for a in archs):
        die(f"--size {args.size} has shapes for {', '.join(only)} only, "
            f"not {', '.join(a for a in archs if a not in only)}")
    for arch in archs:
        build, tiny, large = ARCHS[arch]
        shapes = {"tiny": tiny, "large": large, "bench": BENCH.get(arch), "gpu": GPU.get(arch),
                  "wide": WIDE.get(arch)}
        c = dict(shapes[args.size], size=args.size)
        plan = Plan(gguf, arch)
        build(plan, c, vocab)
        if args.size == "large" and plan.weight_bytes(f16) < GIB:
            die(f"{arch}: large dimensions give only {plan.weight_bytes(f16)} bytes of weights (< 1 GiB)")
        # The toy vocab keeps the names the tests know; a real one is part of the name.
        vocab_part = f"-{args.vocab}" if args.vocab else ""
        path = args.out_dir / f"{arch}-{args.size}{vocab_part}-{args.dtype}.gguf"
        # A per-arch seed keeps each file identical run to run, whichever --arch subset is chosen.
        size = write_file(gguf, plan, path, f16, seed=zlib.crc32(f"{arch}-{args.size}".encode()))
        print(f"{path} {arch} {size}", flush=True)


if __name__ == "__main__":
    main()
