#!/usr/bin/env python3
"""Benchmark (not a test): the Check stage's memory estimate against the real llama-server.

For every model and setting it runs `modelserve estimate`, then starts llama-server with the
flags the Catalog stage gives the pods (src/pipeline/catalog/args.rs), reads the buffers the
engine logs at -lv 4, keeps every slot busy at once with a prompt that fills its context (so
the KV cache and the compute buffers are touched as far as full slots touch them; --load ubatch
sends one ubatch-long prompt and short chats instead, quicker and lower) and reads the peak RSS
(VmHWM). One line per row as it completes, then a summary. Sizes are MiB.

  python3 testbed/bench_memory.py [MODEL.gguf ...] [--models GLOB] [--settings 4096x1,16384x4]
                                  [--load full|ubatch]

Without MODEL arguments it takes the set testbed/quantize_models.py writes. The goals a row is
flagged for breaking:
  under   the estimate is below the peak RSS (a pod sized by it would be OOM-killed)
  over    the estimate is above 1.10 x the peak RSS for a file >= 1 GiB, 1.25 x below
  kv      the KV cache or recurrent state estimate differs from the engine's own figure
  ckpt    the context checkpoints the engine kept (its log) are above the estimate's figure
"""
from __future__ import annotations

import argparse
import concurrent.futures
import fnmatch
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MIB = 1 << 20
GIB = 1 << 30
SETTINGS = [(4096, 1), (16384, 4), (32768, 8)]  # (--ctx-size, --parallel)
UBATCH = 512  # crate::pipeline::check::UBATCH, which the Catalog stage passes as --ubatch-size
CTX_CHECKPOINTS = 2  # crate::gguf::memory::CTX_CHECKPOINTS, passed as --ctx-checkpoints
EST_FIELDS = ["total", "weights", "repack", "kv", "recurrent", "checkpoints", "compute", "output", "vocab", "sampler",
              "work", "graph", "engine"]
LOG_FIELDS = ["model", "repack", "kv", "rs", "ckpt", "compute", "output"]
KEY = "bench-memory-key"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Estimator:
    """`modelserve estimate` for this machine: --cpu avx2 and --node-cpus (this machine's CPUs, by
    which llama-server starts its threads), each while the binary knows the flag."""

    def __init__(self, modelserve: str):
        self.modelserve = modelserve
        self.flags = {"--cpu": "avx2", "--node-cpus": str(os.cpu_count() or 1)}

    def __call__(self, model: Path, ctx: int, parallel: int) -> dict:
        base = [self.modelserve, "estimate", str(model), "--context-size", str(ctx),
                "--context-length", str(ctx // parallel)]
        while True:
            extra = [x for kv in self.flags.items() for x in kv]
            r = subprocess.run(base + extra, capture_output=True, text=True)
            unknown = [f for f in self.flags if r.returncode == 2 and f"'{f}'" in r.stderr]
            if not unknown:
                break
            for f in unknown:  # clap: unexpected argument '--cpu'
                print(f"# this modelserve has no {f} flag: estimating without it", flush=True)
                del self.flags[f]
        if r.returncode != 0:
            raise RuntimeError(f"modelserve estimate: {(r.stderr or r.stdout).strip()}")
        return json.loads(r.stdout)


def server_args(server: str, model: Path, ctx: int, parallel: int, port: int, key_file: str) -> list[str]:
    """The pods' command line (server_args in src/pipeline/catalog/args.rs, at a current build)."""
    return [server, "--model", str(model), "--ctx-size", str(ctx), "--parallel", str(parallel),
            "--ubatch-size", str(UBATCH), "--host", "127.0.0.1", "--port", str(port),
            "--alias", model.stem, "--metrics", "--cache-ram", "0", "--ctx-checkpoints", str(CTX_CHECKPOINTS),
            "--no-webui",
            "--api-key-file", key_file, "-lv", "4"]


def request(url: str, body: dict | None = None, timeout: float = 600) -> dict:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data, {"Content-Type": "application/json",
                                             "Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.load(r)


def prompt_tokens(window: int) -> int:
    """The long prompt's length: UBATCH + 16 tokens fill a whole ubatch, so the compute buffer is
    used as far as any prompt can use it. The engine checkpoints a prompt 4 + UBATCH tokens and
    4 tokens before its end, each checkpoint holding the sliding-window cells the window still
    sees; `window` more tokens make both of them full."""
    return window + UBATCH + 16


def long_prompt(url: str, n: int) -> list[int]:
    """n token ids, from the server's own tokenizer (tokens per item differ by vocabulary: a
    byte-level one takes several times as many, so the text doubles until it is long enough)."""
    items = max(n // 4, UBATCH)
    while True:
        text = " ".join(f"item {i} of the inventory, checked and counted." for i in range(items))
        tokens = request(f"{url}/tokenize", {"content": text}).get("tokens", [])
        if len(tokens) >= n:
            return tokens[:n]
        if items >= 1 << 16:
            raise RuntimeError(f"the tokenizer gave {len(tokens)} tokens for the long prompt of {n}")
        items *= 2


def load(url: str, ctx: int, parallel: int, checkpoints: bool, window: int, full: bool) -> None:
    """What a pod at its peak does: every slot busy at once.

    full (the default): each slot with its own prompt that fills its context but for the 8
    tokens it then generates and a margin, so the KV cache's pages and the compute buffers'
    attention masks (which grow with the cells in use) are touched as far as full slots touch
    them; a model that keeps context checkpoints makes its two as such a prompt passes the
    window. Otherwise (--load ubatch, quicker): one slot with a prompt that fills a ubatch, the
    others with a short chat; a model that keeps context checkpoints (sliding-window or
    recurrent layers) gets the long prompt in every slot, `window` tokens longer where it has
    sliding-window layers, so each slot ends with the CTX_CHECKPOINTS full copies the estimate
    counts (a short chat makes only the second, of a few cells)."""
    if full:
        want = ctx // parallel - 8
        tokens = long_prompt(url, want + 8 * parallel)
        jobs = [(f"{url}/completion", {"prompt": tokens[8 * i:8 * i + want], "n_predict": 4})
                for i in range(parallel)]
    else:
        prompt = long_prompt(url, prompt_tokens(window))
        jobs = [(f"{url}/completion", {"prompt": prompt, "n_predict": 16})]
        for i in range(1, parallel):
            if checkpoints:
                jobs.append((f"{url}/completion", {"prompt": prompt, "n_predict": 16}))
            else:
                jobs.append((f"{url}/v1/chat/completions",
                             {"messages": [{"role": "user", "content": f"Say hello {i}."}], "max_tokens": 16}))
    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
        for f in [pool.submit(request, u, b) for u, b in jobs]:
            answer = f.result()
            read = answer.get("timings", {}).get("prompt_n")
            if full and read is not None and read != ctx // parallel - 8:
                raise RuntimeError(f"the engine read {read} of a prompt of {ctx // parallel - 8} tokens")


def measure(server: str, model: Path, ctx: int, parallel: int, log_path: Path, key_file: str,
            checkpoints: bool, window: int, full: bool) -> dict:
    port = free_port()
    with open(log_path, "w+") as log:
        p = subprocess.Popen(server_args(server, model, ctx, parallel, port, key_file),
                             stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 900
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
                if p.poll() is not None:
                    raise RuntimeError(f"llama-server exited ({p.returncode}); log {log_path}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"llama-server not ready in 900 s; log {log_path}")
                time.sleep(0.2)
            load(f"http://127.0.0.1:{port}", ctx, parallel, checkpoints, window, full)
            with open(f"/proc/{p.pid}/status") as s:
                hwm = next(int(line.split()[1]) * 1024 for line in s if line.startswith("VmHWM:"))
        finally:
            p.terminate()
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        log.seek(0)
        text = log.read()
    return parse_log(text) | {"peak": hwm}


def warm(model: Path) -> None:
    """Reads the file once, so that its pages are in the page cache when llama-server maps it,
    as they are after the init container's download. Read cold, with the page cache full of the
    set's other files, the kernel dropped mapped pages while the engine populated its mapping,
    and the peak came out below the weights alone (qwen2 F16 at 4096x1: 3468.9 MiB against
    3568.3 MiB of weights; 3828.2 MiB when read warm)."""
    with open(model, "rb") as f:
        while f.read(16 * MIB):
            pass


def parse_log(text: str) -> dict:
    """The buffers llama.cpp logs as '<buffer type> <what> buffer size = X MiB', in MiB."""
    def lines(what: str) -> list[tuple[str, float]]:
        return [(m[0], float(m[1])) for m in re.findall(rf"(\S+)\s+{what} buffer size =\s*([\d.]+) MiB", text)]
    model = lines("model")
    kv, rs = lines("KV"), lines("RS")
    return {
        "model": sum(v for b, v in model if b != "CPU_REPACK"),
        "model_buffers": {b: v for b, v in model},
        "repack": sum(v for b, v in model if b == "CPU_REPACK"),
        # The engine prints each buffer rounded to 0.01 MiB: an exact estimate is within that.
        "kv": sum(v for _, v in kv), "kv_lines": len(kv),
        "rs": sum(v for _, v in rs), "rs_lines": len(rs),
        "compute": sum(v for _, v in lines("compute")),
        # Two spaces: "CPU  output buffer size", not the model or KV lines.
        "output": sum(float(m) for m in re.findall(r"\S  output buffer size =\s*([\d.]+) MiB", text)),
        # The context checkpoints alive at the end: those made less those erased (logged at -lv 4).
        "ckpt": sum(float(m) for m in re.findall(r"created context checkpoint .*size = ([\d.]+) MiB", text))
        - sum(float(m) for m in re.findall(r"eras\w+ (?:old |invalidated )?context checkpoint .*size = ([\d.]+) MiB", text)),
    }


def mib(x: object) -> float | None:
    return x / MIB if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def cell(x: float | None, width: int = 8) -> str:
    if x is None:
        return f"{'-':>{width}}"
    return f"{x:>{width}.{2 if abs(x) < 10 else 1}f}"


def same(est: float | None, logged: float, n_lines: int) -> bool:
    """est (MiB) equals the engine's figure, the sum of n_lines values printed to 0.01 MiB."""
    return est is not None and abs(est - logged) <= 0.005 * max(n_lines, 1) + 1e-9


def default_models() -> list[Path]:
    version = next(line.split("=", 1)[1].strip() for line in (HERE / "versions.env").read_text().splitlines()
                   if line.startswith("LLAMA_CPP_PYTHON_VERSION="))
    cache = Path(os.environ.get("MODELSERVE_CACHE")
                 or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "modelserve")
    d = cache / f"models-quant-{version}"
    models = sorted(d.glob("*.gguf"))
    if not models:
        sys.exit(f"bench_memory: no models in {d}; write them with testbed/quantize_models.py")
    return models


def parse_settings(s: str) -> list[tuple[int, int]]:
    out = []
    for item in s.split(","):
        ctx, _, parallel = item.strip().partition("x")
        if not ctx.isdigit() or not parallel.isdigit() or int(parallel) == 0:
            raise argparse.ArgumentTypeError(f"{item!r}: want CTXxPARALLEL, e.g. 16384x4")
        out.append((int(ctx), int(parallel)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="*", type=Path, help="GGUF files (default: the quantize_models.py set)")
    ap.add_argument("--models", dest="glob", default="*", help="only files whose name matches (e.g. 'qwen2-*Q4_K_M*')")
    ap.add_argument("--settings", type=parse_settings, default=SETTINGS,
                    help="CTXxPARALLEL,... (default: 4096x1,16384x4,32768x8)")
    ap.add_argument("--modelserve", default=str(ROOT / "target/release/modelserve"))
    ap.add_argument("--server", help="llama-server binary (default: testbed/build-llama-server.sh)")
    ap.add_argument("--logs", type=Path, default=Path(tempfile.gettempdir()) / "bench-memory",
                    help="where the llama-server logs are kept (default: %(default)s)")
    ap.add_argument("--load", choices=["full", "ubatch"], default="full",
                    help="full: every slot's prompt fills its context (the most a pod's slots touch); "
                         "ubatch: one ubatch-long prompt, the others a short chat (quicker; the peak is lower)")
    args = ap.parse_args()

    models = [m for m in (args.models or default_models()) if fnmatch.fnmatch(m.name, args.glob)]
    if not models:
        sys.exit(f"bench_memory: no model matches {args.glob!r}")
    if not Path(args.modelserve).is_file():
        sys.exit(f"bench_memory: no {args.modelserve}; cargo build --release, or pass --modelserve")
    server = args.server or subprocess.run(["bash", str(HERE / "build-llama-server.sh")], check=True,
                                           stdout=subprocess.PIPE, text=True).stdout.strip().splitlines()[-1]
    args.logs.mkdir(parents=True, exist_ok=True)
    key_file = args.logs / "api-key"
    key_file.write_text(KEY + "\n")
    estimate = Estimator(args.modelserve)

    est_hdr = " ".join(f"{h[:8]:>8}" for h in EST_FIELDS)
    log_hdr = " ".join(f"{h:>8}" for h in LOG_FIELDS)
    name_w = max(len(m.name) for m in models)
    peak = ("VmHWM after a prompt that fills its context in every slot" if args.load == "full" else
            f"VmHWM after a request in every slot, one of them a {UBATCH + 16}-token prompt (all of them "
            "where the model keeps context checkpoints, longer by the sliding window)")
    print(f"# MiB. est: modelserve estimate; log: llama-server's buffers; peak: {peak}")
    print(f"{'model':<{name_w}} {'GiB':>5} {'ctx':>6} {'np':>3} | {est_hdr} | {log_hdr} | {'peak':>8} {'ratio':>6} flags",
          flush=True)
    rows, failing = 0, {"under": [], "over": [], "kv": [], "ckpt": [], "error": []}
    ratios: list[tuple[float, str]] = []
    for model in models:
        size = model.stat().st_size
        limit = 1.10 if size >= GIB else 1.25
        warm(model)
        for ctx, parallel in args.settings:
            rows += 1
            label = f"{model.name:<{name_w}} {size / GIB:>5.2f} {ctx:>6} {parallel:>3}"
            row_id = f"{model.name} {ctx}x{parallel}"
            try:
                e = estimate(model, ctx, parallel)
                m = measure(server, model, ctx, parallel, args.logs / f"{model.stem}-{ctx}x{parallel}.log",
                            str(key_file), (e.get("checkpoints") or 0) > 0,
                            # a slot shorter than the window and the prompt takes what fits (n_predict 16)
                            max(0, min(e.get("checkpointWindow") or 0, ctx // parallel - UBATCH - 48)),
                            args.load == "full")
            except (RuntimeError, OSError, ValueError) as err:
                failing["error"].append(row_id)
                print(f"{label} | error: {err}", flush=True)
                continue
            est = {k: mib(e.get(k)) for k in EST_FIELDS}
            flags = []
            total, peak = est["total"], m["peak"] / MIB
            ratio = total / peak if total is not None else None
            if ratio is not None:
                ratios.append((ratio, row_id))
            if ratio is None or ratio < 1.0:
                flags.append("under")
                failing["under"].append(row_id)
            elif ratio > limit:
                flags.append("over")
                failing["over"].append(row_id)
            # A model without recurrent layers logs no RS buffer; an estimate without the field is 0 then.
            recurrent = est["recurrent"] if est["recurrent"] is not None or m["rs_lines"] else 0.0
            if not (same(est["kv"], m["kv"], m["kv_lines"]) and same(recurrent, m["rs"], m["rs_lines"])):
                flags.append("kv")
                failing["kv"].append(row_id)
            # The checkpoints the engine kept may not exceed what the estimate counts for them.
            if m["ckpt"] > (est["checkpoints"] or 0.0) + 0.001 * max(parallel * CTX_CHECKPOINTS, 1):
                flags.append("ckpt")
                failing["ckpt"].append(row_id)
            others = {b: v for b, v in m["model_buffers"].items() if b not in ("CPU_Mapped", "CPU_REPACK")}
            if others:  # anything but the mapped file and the repack, e.g. an AMX or a plain CPU copy
                flags.append("model:" + ",".join(f"{b}={v:.1f}" for b, v in others.items()))
            print(f"{label} | {' '.join(cell(est[k]) for k in EST_FIELDS)} | "
                  f"{' '.join(cell(m[k]) for k in LOG_FIELDS)} | {peak:>8.1f} "
                  f"{'-' if ratio is None else f'{ratio:.3f}':>6} {' '.join(flags)}", flush=True)

    ratios.sort()
    worst = (f"lowest ratio {ratios[0][0]:.3f} ({ratios[0][1]}), highest {ratios[-1][0]:.3f} ({ratios[-1][1]})"
             if ratios else "no ratios")
    print(f"# {rows} rows; under peak: {len(failing['under'])}; over the margin: {len(failing['over'])}; "
          f"KV/state not exact: {len(failing['kv'])}; checkpoints above the estimate's: {len(failing['ckpt'])}; "
          f"errors: {len(failing['error'])}; {worst}", flush=True)


if __name__ == "__main__":
    main()
