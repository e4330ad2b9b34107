#!/usr/bin/env python3
"""Write the memory benchmark's model set: 8 families with real vocabularies, 7 types each.

Every family of testbed/gen_gguf.py is written in its --size bench shape with the tokenizer of
one of llama.cpp's models/ggml-vocab-*.gguf (so the set covers 32k, 50k, 128k, 151k and 262k
vocabularies), then llama-quantize turns the F16 file into each of QUANTS. No imatrix: the
weights are random, and every type here quantizes without one.

    python3 testbed/quantize_models.py [--family NAME ...] [--quant TYPE ...] [--keep-f16 small|all]

Files go to $MODELSERVE_CACHE (default ~/.cache/modelserve)/models-quant-<sdist version>/ as
<family>-bench-<vocab>-<type>.gguf, each written under a temporary name and renamed when
complete, so a second run is a no-op and an interrupted one redoes only the file it was on.
llama-quantize's log of each file is kept in logs/ beside them (fallbacks, tensor types).

The three big families are about 3.5 GiB in F16 each; their F16 files are deleted once their
quantized files are written unless --keep-f16 all (it adds about 10.5 GiB; gen_gguf.py writes
the same bytes again on request). Before it starts, the script projects the disk it will use
and refuses when less than --reserve-gib would be left free.

Prints one line per file as it is done, then the set with sizes, the disk used and the time.
On the test bed's 2 cores (a memory benchmark running beside it) the five small families took
4 minutes, llama 9 and qwen2 7.5 (IQ4_XS is the slowest type, about 5 minutes for each big
one), gemma3 8.5: about 29 minutes for the whole set, which is about 29 GiB, 39 with
--keep-f16 all.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import gen_gguf  # noqa: E402

GIB = 1 << 30

# family -> vocab; the vocabularies are each family's own where the sdist ships it.
FAMILIES = {
    "phi3": "phi-3",            # 32,064 SPM
    "mamba2": "gpt-neox",       # 50,432 BPE (Mamba-2's tokenizer)
    "qwen3moe": "qwen2",        # 151,936 BPE
    "granitehybrid": "llama-bpe",  # 128,256 BPE
    "deepseek2": "llama-bpe",   # 128,256 BPE
    "llama": "llama-spm",       # 32,000 SPM
    "qwen2": "qwen2",           # 151,936 BPE
    "gemma3": "gemma-4",        # 262,144 BPE (gemma4 tokenizer model)
}
BIG = {"llama", "qwen2", "gemma3"}  # >= 1 GiB after Q4_K_M; see gen_gguf.BENCH
QUANTS = ["Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_0", "IQ4_XS"]
# Quantized size over F16 size, about the largest llama-quantize gave these shapes (phi3's
# fallbacks to Q8_0 aside; a tied embedding stays Q6_K and raises it); only used to project
# the disk before starting.
SHRINK = {"Q8_0": 0.54, "Q6_K": 0.44, "Q5_K_M": 0.39, "Q4_K_M": 0.35, "Q4_0": 0.34, "IQ4_XS": 0.33}


def version() -> str:
    for line in (HERE / "versions.env").read_text().splitlines():
        if line.startswith("LLAMA_CPP_PYTHON_VERSION="):
            return line.split("=", 1)[1].strip()
    sys.exit("quantize_models: no LLAMA_CPP_PYTHON_VERSION in versions.env")


def cache_root() -> Path:
    if os.environ.get("MODELSERVE_CACHE"):
        return Path(os.environ["MODELSERVE_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "modelserve"


def tool(name: str, explicit: str | None) -> str:
    if explicit:
        return explicit
    r = subprocess.run(["bash", str(HERE / "build-llama-tool.sh"), name], stdout=subprocess.PIPE, text=True)
    lines = r.stdout.strip().splitlines()
    if r.returncode != 0 or not lines:
        sys.exit(f"quantize_models: building {name} failed (exit {r.returncode}); see its messages above")
    return lines[-1]


def name(family: str, kind: str) -> str:
    return f"{family}-bench-{FAMILIES[family]}-{kind.lower() if kind == 'F16' else kind}.gguf"


def f16_bytes(gguf: object, family: str) -> int:
    """The F16 file's tensor bytes, from gen_gguf's plan with a stand-in vocab of the real size."""
    build = gen_gguf.ARCHS[family][0]
    plan = gen_gguf.Plan(gguf, family)
    n_vocab = VOCAB_SIZES[FAMILIES[family]]
    build(plan, dict(gen_gguf.BENCH[family], size="bench"), gen_gguf.Vocab([""] * n_vocab, [], [], 0, 0, 0))
    return plan.weight_bytes(True)


# Only for the projection; the files themselves take the size from the vocab file.
VOCAB_SIZES = {"phi-3": 32064, "gpt-neox": 50432, "qwen2": 151936, "llama-bpe": 128256,
               "llama-spm": 32000, "gemma-4": 262144}
assert set(FAMILIES.values()) <= VOCAB_SIZES.keys()


def recipe(family: str) -> dict:
    """What a family's files are made from; a change invalidates them."""
    return {"vocab": FAMILIES[family], "shape": {k: list(v) if isinstance(v, tuple) else v
                                                 for k, v in gen_gguf.BENCH[family].items()},
            "gen_gguf": 1}  # bump when gen_gguf.py writes other bytes for the same shape


def run_logged(cmd: list[str], log: Path) -> float:
    start = time.monotonic()
    with open(log, "w") as f:
        r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT)
    if r.returncode != 0:
        tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-15:])
        sys.exit(f"quantize_models: {' '.join(cmd)} failed (exit {r.returncode}); log {log}:\n{tail}")
    return time.monotonic() - start


def fallbacks(log: Path) -> str:
    """llama-quantize's fallback warnings, condensed to 'Q4_K->Q5_0 x12'."""
    counts: dict[str, int] = {}
    for line in log.read_text(errors="replace").splitlines():
        if "not divisible by" in line and "falling back to" in line:
            target = line.split("required for type")[1].split(")")[0].strip()
            to = line.split("falling back to")[1].strip()
            counts[f"{target}->{to}"] = counts.get(f"{target}->{to}", 0) + 1
    return ", ".join(f"{k} x{v}" for k, v in sorted(counts.items()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--family", action="extend", nargs="+", choices=list(FAMILIES), metavar="NAME",
                    help=f"families to write (default: all of {', '.join(FAMILIES)})")
    ap.add_argument("--quant", action="extend", nargs="+", choices=QUANTS, metavar="TYPE",
                    help=f"types to write besides F16 (default: {' '.join(QUANTS)})")
    ap.add_argument("--keep-f16", choices=("small", "all"), default="small",
                    help="keep the F16 files of the small families only (default), or of all")
    ap.add_argument("--out", type=Path, help="directory (default: <cache>/models-quant-<version>)")
    ap.add_argument("--quantize", help="llama-quantize binary (default: build-llama-tool.sh llama-quantize)")
    ap.add_argument("--reserve-gib", type=float, default=8.0, help="free disk to leave (default 8)")
    ap.add_argument("--dry-run", action="store_true", help="print the projection and stop")
    args = ap.parse_args()

    families = list(dict.fromkeys(args.family or FAMILIES))
    quants = [q for q in QUANTS if q in (args.quant or QUANTS)]
    out = args.out or cache_root() / f"models-quant-{version()}"
    out.mkdir(parents=True, exist_ok=True)
    (out / "logs").mkdir(exist_ok=True)
    recipes_path = out / "recipes.json"
    recipes = json.loads(recipes_path.read_text()) if recipes_path.is_file() else {}

    def keep_f16(family: str) -> bool:
        return args.keep_f16 == "all" or family not in BIG

    # Files made from another recipe are stale: remove them before projecting.
    for family in families:
        if recipes.get(family) not in (None, recipe(family)):
            for f in out.glob(f"{family}-bench-*.gguf"):
                print(f"stale (recipe changed): removing {f.name}", flush=True)
                f.unlink()
        recipes[family] = recipe(family)
    recipes_path.write_text(json.dumps(recipes, indent=1, sort_keys=True) + "\n")

    # Projection: what is still to be written, and the one F16 file that exists only meanwhile.
    gguf = gen_gguf.import_gguf(gen_gguf.sdist_dir(None))
    todo, transient = 0, 0
    for family in families:
        f16 = f16_bytes(gguf, family)
        missing = [q for q in quants if not (out / name(family, q)).is_file()]
        todo += sum(int(f16 * SHRINK[q]) for q in missing)
        if keep_f16(family) and not (out / name(family, "F16")).is_file():
            todo += f16
        elif missing and not (out / name(family, "F16")).is_file():
            transient = max(transient, f16)
    free = shutil.disk_usage(out).free
    print(f"projection: {(todo + transient) / GIB:.1f} GiB to write (peak), {free / GIB:.1f} GiB free "
          f"on {out}, {args.reserve_gib:.0f} GiB to be left", flush=True)
    if args.dry_run:
        return
    if todo + transient + args.reserve_gib * GIB > free:
        sys.exit("quantize_models: not enough disk; free some, pass fewer --family/--quant, "
                 "or lower --reserve-gib")

    quantize = tool("llama-quantize", args.quantize) if any(
        not (out / name(f, q)).is_file() for f in families for q in quants) else None
    start = time.monotonic()
    for family in families:
        vocab = FAMILIES[family]
        src = out / name(family, "F16")
        missing = [q for q in quants if not (out / name(family, q)).is_file()]
        if (missing or keep_f16(family)) and not src.is_file():
            cmd = [sys.executable, str(HERE / "gen_gguf.py"), str(out), "--arch", family,
                   "--size", "bench", "--vocab", vocab]
            took = run_logged(cmd, out / "logs" / f"{src.name}.log")
            print(f"{src.name:44} {src.stat().st_size / GIB:7.2f} GiB  {took:6.0f} s  written", flush=True)
        for q in missing:
            dst = out / name(family, q)
            tmp = dst.with_name(dst.name + ".part")
            log = out / "logs" / f"{dst.name}.log"
            took = run_logged([quantize, str(src), str(tmp), q], log)
            tmp.replace(dst)
            fb = fallbacks(log)
            print(f"{dst.name:44} {dst.stat().st_size / GIB:7.2f} GiB  {took:6.0f} s  quantized"
                  + (f"  fallbacks: {fb}" if fb else ""), flush=True)
        if not keep_f16(family) and src.is_file() and all((out / name(family, q)).is_file() for q in QUANTS):
            src.unlink()
            print(f"{src.name:44} deleted (--keep-f16 small; gen_gguf.py rewrites it)", flush=True)
    elapsed = time.monotonic() - start

    print(f"\n{'file':44} {'GiB':>7} {'vocab':>10}")
    total = 0
    for family in FAMILIES:  # the whole set as it is on disk, not only this run's families
        for kind in ["F16", *QUANTS]:
            f = out / name(family, kind)
            if f.is_file():
                total += f.stat().st_size
                print(f"{f.name:44} {f.stat().st_size / GIB:7.3f} {FAMILIES[family]:>10}")
    print(f"total {total / GIB:.1f} GiB in {out}; this run took {elapsed:.0f} s", flush=True)


if __name__ == "__main__":
    main()
