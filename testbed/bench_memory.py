#!/usr/bin/env python3
"""Benchmark (not a test): the Check stage's memory estimate against the real llama-server.

For every model and setting it starts llama-server with the flags the Catalog stage uses
(--ctx-size, --parallel, --cache-ram 0), reads the engine's own KV cache, recurrent state and
compute buffer sizes from its log, sends one chat completion, reads the peak RSS (VmHWM), and
prints them beside `modelserve estimate` for the same file and flags.

  python3 testbed/bench_memory.py target/release/modelserve LLAMA_SERVER MODEL.gguf...
"""
import json
import re
import socket
import subprocess
import sys
import time
import urllib.request

SETTINGS = [(4096, 1), (16384, 4)]  # (--ctx-size, --parallel)
MIB = 1 << 20


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def estimate(modelserve, model, ctx, parallel):
    out = subprocess.run([modelserve, "estimate", model, "--context-size", str(ctx),
                          "--context-length", str(ctx // parallel)], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def measure(server, model, ctx, parallel):
    port = free_port()
    log = open(f"/tmp/bench-memory-{port}.log", "w+")
    p = subprocess.Popen([server, "-m", model, "--ctx-size", str(ctx), "--parallel", str(parallel),
                          "--cache-ram", "0", "--host", "127.0.0.1", "--port", str(port), "-lv", "4"],
                         stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 300
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.time() > deadline or p.poll() is not None:
                raise SystemExit(f"llama-server did not come up for {model}; log: {log.name}")
            time.sleep(0.2)
        body = json.dumps({"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 16}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=300) as r:
            json.load(r)
        with open(f"/proc/{p.pid}/status") as s:
            hwm = next(int(l.split()[1]) * 1024 for l in s if l.startswith("VmHWM:"))
    finally:
        p.terminate()
        p.wait()
    log.seek(0)
    text = log.read()
    mib = lambda pattern: sum(float(m) for m in re.findall(pattern, text))
    return {
        "kv": mib(r"llama_kv_cache: size =\s*([\d.]+) MiB"),
        "recurrent": mib(r"llama_memory_recurrent: size =\s*([\d.]+) MiB"),
        "compute": mib(r"compute buffer size =\s*([\d.]+) MiB"),
        "output": mib(r"output buffer size =\s*([\d.]+) MiB"),
        "weights": mib(r"model buffer size =\s*([\d.]+) MiB"),
        "peak_rss": hwm,
    }


def main():
    modelserve, server, models = sys.argv[1], sys.argv[2], sys.argv[3:]
    print(f"{'model':<28} {'ctx':>6} {'np':>3} | {'KV est':>9} {'KV real':>9} | {'state est':>9} {'state':>9} | "
          f"{'comp est':>8} {'comp':>8} {'c ratio':>7} | {'total est':>9} {'peak RSS':>9} {'ratio':>6}")
    for model in models:
        for ctx, parallel in SETTINGS:
            e = estimate(modelserve, model, ctx, parallel)
            m = measure(server, model, ctx, parallel)
            name = model.rsplit("/", 1)[-1][:28]
            kv, st, comp = e["kv"] / MIB, e["recurrent"] / MIB, e["compute"] / MIB
            print(f"{name:<28} {ctx:>6} {parallel:>3} | {kv:>9.2f} {m['kv']:>9.2f} | {st:>9.2f} {m['recurrent']:>9.2f} | "
                  f"{comp:>8.2f} {m['compute']:>8.2f} {comp / m['compute'] if m['compute'] else 0:>7.3f} | "
                  f"{e['total'] / MIB:>9.1f} {m['peak_rss'] / MIB:>9.1f} {e['total'] / m['peak_rss']:>6.3f}", flush=True)


if __name__ == "__main__":
    main()
