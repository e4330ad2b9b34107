#!/usr/bin/env bash
# `modelserve estimate --gpu` against llama-server on a real GPU. Run ON the device machine (an
# NVIDIA H200: nvcc, cmake, ninja and python3 there; no network, no Rust), from the repository
# root, with .gpu/ carried (made HERE first by testbed/gpu-sources.sh):
#
#   testbed/gpu-sources.sh                      # here: sources, static modelserve, 3 models
#   device tool:  run(command="bash testbed/gpu-check.sh", carry=[".gpu"], timeout_s=540)
#
# then read gpu-check.txt under the reply's files_at and call give_back; if it exited 3 (the build
# ran out of time), make the same call again at once instead: the warm machine resumes the build.
#
# Within 9 minutes (GPU_CHECK_BUDGET, 525 s by default) it
#   1. builds llama-server with CUDA for sm_90 only (Release, ninja, -j16, no curl) from
#      .gpu/llama.cpp-src.tar.gz, in /tmp/gpu-check/build: a second run on the same (still warm)
#      machine resumes that build instead of starting again;
#   2. for each model in .gpu/models x (full offload, partial offload: half the layers) runs
#      llama-server at -lv 4 with -ngl N --fit off and the operator's settings, until it listens,
#      has every slot read a prompt that fills its context, then reads its buffer sizes from the
#      log (CUDA0 model / KV / RS / compute buffers, the CPU ones, the output buffer), its peak
#      RSS, and nvidia-smi's used memory while it runs;
#   3. runs `modelserve estimate MODEL --gpu <free MiB from nvidia-smi> --gpu-layers N --output
#      json` for the same settings;
#   4. prints one table (model, setting, part, estimate, engine, ratio = estimate / engine) and
#      writes it to $OUT/gpu-check.txt, the figures to $OUT/gpu-check.json and the logs to
#      $OUT/gpu-check-logs.tar.gz.
# It exits non-zero when the build fails (2) or runs out of time (3; run it again at once to
# resume the build), or when a server run fails (4), and prints how long each step took.
#
# Variables (defaults for the GPU machine):
#   GPU_CHECK_BUDGET   seconds for the whole script (525)        GPU_CHECK_JOBS   build jobs (16)
#   GPU_CHECK_WORK     scratch folder (/tmp/gpu-check)           GPU_CHECK_CTX    --ctx-size (8192)
#   GPU_CHECK_PARALLEL --parallel (2)                            GPU_CHECK_MODELS folder of .gguf (.gpu/models)
#   GPU_CHECK_SERVER   a llama-server to use instead of building one
#   GPU_CHECK_CUDA     ON; OFF builds for the CPU only (to try the trimmed sources without a GPU)
#   GPU_CHECK_DEVICE   the GPU's name in the engine's log (CUDA0)
#   GPU_CHECK_FREE_MIB the GPU's free memory instead of asking nvidia-smi
#   GPU_CHECK_CPU      the --cpu of modelserve estimate (avx2: the build is not -march=native)
#
# Dry run without a GPU, against the test bed's CPU llama-server (every step but the build):
#   GPU_CHECK_SERVER=$(bash testbed/build-llama-tool.sh llama-server | tail -n 1) GPU_CHECK_DEVICE=CPU \
#     GPU_CHECK_FREE_MIB=81920 OUT=/tmp/gpu-check-out bash testbed/gpu-check.sh
set -euo pipefail

main() {
  t0=$(date +%s)
  root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
  carried="$root/.gpu"
  budget="${GPU_CHECK_BUDGET:-525}"
  jobs="${GPU_CHECK_JOBS:-16}"
  work="${GPU_CHECK_WORK:-/tmp/gpu-check}"
  cuda="${GPU_CHECK_CUDA:-ON}"
  out="${OUT:-$work/out}"
  mkdir -p "$work" "$out"
  report="$out/gpu-check.txt"

  elapsed() { echo $(( $(date +%s) - t0 )); }
  say() { echo "gpu-check [$(elapsed)s] $*"; }
  step_start=0 step_name=""
  step() { step_name="$1"; step_start=$(date +%s); say "== $1"; }
  step_done() { say "== $step_name took $(( $(date +%s) - step_start ))s"; }
  # A failure: said loudly, kept in the report, and the exit code.
  die() {
    local code="$1"; shift
    echo "gpu-check FAILED after $(elapsed)s: $*" | tee -a "$report" >&2
    exit "$code"
  }
  : >"$report"

  step "environment"
  # The toolchain may be outside PATH: CUDA's usual home, and python3's own bin (pip's cmake, ninja).
  for d in /usr/local/cuda/bin "$(dirname "$(command -v python3 || echo /usr/bin/python3)")"; do
    if [ -d "$d" ]; then
      case ":$PATH:" in *":$d:"*) ;; *) PATH="$PATH:$d" ;; esac
    fi
  done
  export PATH
  need=(python3 tar gzip)
  [ -n "${GPU_CHECK_SERVER:-}" ] || need+=(cmake ninja)
  [ -n "${GPU_CHECK_SERVER:-}" ] || [ "$cuda" != ON ] || need+=(nvcc)
  [ -n "${GPU_CHECK_FREE_MIB:-}" ] || need+=(nvidia-smi)
  for tool in "${need[@]}"; do
    command -v "$tool" >/dev/null || die 2 "$tool is not on PATH ($PATH)"
  done
  say "$(nproc) cores; $(python3 --version 2>&1)"
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,memory.total,memory.free,driver_version --format=csv,noheader | sed 's/^/gpu-check: GPU: /' || true
  fi
  if [ -z "${GPU_CHECK_SERVER:-}" ]; then
    say "$(cmake --version | head -n 1); ninja $(ninja --version)"
    [ "$cuda" != ON ] || say "$(nvcc --version | tail -n 1)"
  fi
  for f in llama.cpp-src.tar.gz modelserve.gz; do
    [ -f "$carried/$f" ] || die 2 "$carried/$f is missing: run testbed/gpu-sources.sh here, and carry .gpu"
  done
  step_done

  step "unpack"
  stamp="$(sha256sum "$carried/llama.cpp-src.tar.gz" | cut -c1-16)"
  if [ "$(cat "$work/llama.cpp.stamp" 2>/dev/null)" != "$stamp" ]; then
    rm -rf "$work/llama.cpp" "$work/build"
    tar -xzf "$carried/llama.cpp-src.tar.gz" -C "$work" || die 2 "unpacking the llama.cpp sources failed"
    echo "$stamp" >"$work/llama.cpp.stamp"
  else
    say "sources already unpacked (a warm machine): the build resumes"
  fi
  gzip -dc "$carried/modelserve.gz" >"$work/modelserve" || die 2 "unpacking modelserve failed"
  chmod 0755 "$work/modelserve"
  say "$("$work/modelserve" --version)"
  python_part >"$work/gpu-check.py"
  step_done

  server="${GPU_CHECK_SERVER:-}"
  if [ -z "$server" ]; then
    build="$work/build"
    step "configure (GGML_CUDA=$cuda, sm_90)"
    cuda_args=(-DGGML_CUDA="$cuda")
    [ "$cuda" != ON ] || cuda_args+=(-DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_CUDA_COMPILER="$(command -v nvcc)")
    if ! cmake -S "$work/llama.cpp" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "${cuda_args[@]}" \
      -DGGML_NATIVE=OFF -DGGML_CCACHE=OFF -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_TOOLS=ON \
      -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF >"$work/configure.log" 2>&1; then
      tail -n 60 "$work/configure.log" | tee "$out/build-tail.log"
      die 2 "cmake configure failed (the end of its log is above and in build-tail.log)"
    fi
    step_done

    step "build llama-server (-j$jobs)"
    # Killed in time to leave the report its say; ninja stops its compilers on SIGTERM.
    left=$(( t0 + budget - 45 - $(date +%s) ))
    [ "$left" -gt 30 ] || die 3 "no time left to build (budget ${budget}s)"
    timeout -k 10 "$left" ninja -C "$build" -j "$jobs" llama-server >"$work/build.log" 2>&1 &
    bpid=$!
    last=$(date +%s)
    while kill -0 "$bpid" 2>/dev/null; do
      sleep 2
      if [ $(( $(date +%s) - last )) -ge 30 ]; then
        last=$(date +%s)
        say "build at $(grep -o '^\[[0-9]*/[0-9]*\]' "$work/build.log" | tail -n 1)"
      fi
    done
    rc=0; wait "$bpid" || rc=$?
    progress="$(grep -o '^\[[0-9]*/[0-9]*\]' "$work/build.log" | tail -n 1 || true)"
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
      tail -n 20 "$work/build.log" >"$out/build-tail.log"
      die 3 "the build ran out of time at $progress; run this again at once: the warm machine keeps $build and resumes"
    elif [ "$rc" -ne 0 ]; then
      grep -n -B2 -A12 -m 5 'error\|FAILED' "$work/build.log" | tail -n 150 | tee "$out/build-tail.log"
      die 2 "the build of llama-server failed at $progress (exit $rc; the errors are above and in build-tail.log)"
    fi
    server="$build/bin/llama-server"
    [ -x "$server" ] || die 2 "the build finished without $server"
    say "built $progress"
    step_done
  fi

  step "runs"
  # The build the sources are (the estimate's --engine-build).
  llama_build="$(sed -n 's/^LLAMA_CPP_BUILD=//p' "$root/testbed/versions.env" 2>/dev/null | head -n 1)"
  rc=0
  GC_WORK="$work" GC_OUT="$out" GC_SERVER="$server" GC_MODELSERVE="$work/modelserve" \
    GC_MODELS="${GPU_CHECK_MODELS:-$carried/models}" GC_DEVICE="${GPU_CHECK_DEVICE:-CUDA0}" \
    GC_FREE_MIB="${GPU_CHECK_FREE_MIB:-}" GC_CPU="${GPU_CHECK_CPU:-avx2}" GC_CTX="${GPU_CHECK_CTX:-8192}" \
    GC_PARALLEL="${GPU_CHECK_PARALLEL:-2}" GC_DEADLINE=$(( t0 + budget - 10 )) GC_BUILD="$llama_build" \
    python3 "$work/gpu-check.py" || rc=$?
  step_done
  say "total $(elapsed)s"
  [ "$rc" -eq 0 ] || die 4 "some runs failed (see FAILED above and $report)"
}

# The runs and the comparison (python3 "$work/gpu-check.py"; with --parse it reads a
# llama-server log on stdin and prints the figures it finds, as JSON).
python_part() {
  cat <<'PY'
"""Runs llama-server and modelserve estimate for each model and setting, and compares them."""
import glob, json, os, re, socket, subprocess, sys, tarfile, time

E = os.environ
WORK = E.get("GC_WORK", "/tmp/gpu-check")
OUT, SERVER, MODELSERVE = E.get("GC_OUT", f"{WORK}/out"), E.get("GC_SERVER", ""), E.get("GC_MODELSERVE", "")
DEVICE, CPU, BUILD = E.get("GC_DEVICE", "CUDA0"), E.get("GC_CPU", "avx2"), E.get("GC_BUILD", "")
CTX, PARALLEL = int(E.get("GC_CTX", "8192")), int(E.get("GC_PARALLEL", "2"))
DEADLINE = float(E.get("GC_DEADLINE", time.time() + 500))
UBATCH, CHECKPOINTS = 512, 2  # pipeline::check::UBATCH and memory::CTX_CHECKPOINTS, as the operator passes them
MIB = 1 << 20
LOGS = os.path.join(WORK, "logs")

# "load_tensors:        CUDA0 model buffer size =   123.45 MiB", "llama_kv_cache:  CPU KV buffer size = ...",
# "llama_memory_recurrent: CUDA0 RS buffer size", "sched_reserve:  CUDA_Host compute buffer size",
# "llama_context:  CUDA_Host  output buffer size".
BUFFER = re.compile(r"([A-Za-z][A-Za-z0-9_]*)\s+(model|KV|RS|compute|output) buffer size\s*=\s*([0-9.]+) MiB")
OFFLOADED = re.compile(r"offloaded (\d+)/(\d+) layers to GPU")
READY = re.compile(r"server is listening|listening on http")


def parse_log(text: str) -> dict:
    """Buffer sizes in MiB by (buffer type, kind), summed over repeated lines (an iSWA model logs
    two KV caches), and the offloaded layers the engine reports."""
    buffers: dict = {}
    for dev, kind, mib in BUFFER.findall(text):
        buffers[(dev, kind)] = buffers.get((dev, kind), 0.0) + float(mib)
    m = OFFLOADED.search(text)
    return {"buffers": buffers, "offloaded": int(m.group(1)) if m else None}


def engine_parts(parsed: dict, device: str) -> dict:
    """The engine's figures in the estimate's parts: the GPU's, and the host's."""
    b = parsed["buffers"]
    on = lambda dev, kind: b.get((dev, kind), 0.0)
    host = [d for d in {d for d, _ in b} if d != device and not re.fullmatch(r"CUDA\d+", d)]
    mapped = {"CPU", "CPU_Mapped", "CUDA_Host"}
    gpu = {k: on(device, kind) for k, kind in
           [("weights", "model"), ("kv", "KV"), ("recurrent", "RS"), ("compute", "compute")]}
    gpu["total"] = sum(gpu.values())
    return {
        "gpu": gpu,
        "host": {
            "weights": sum(on(d, "model") for d in host if d in mapped),
            "repack": sum(on(d, "model") for d in host if d not in mapped),
            "kv": sum(on(d, "KV") for d in host),
            "recurrent": sum(on(d, "RS") for d in host),
            "compute": sum(on(d, "compute") for d in host),
            "output": sum(v for (d, kind), v in b.items() if kind == "output"),
        },
        "offloaded": parsed["offloaded"],
    }


def smi(field: str):
    """nvidia-smi's figure (MiB) for GPU 0, or None without nvidia-smi."""
    try:
        r = subprocess.run(["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader,nounits", "-i", "0"],
                           capture_output=True, text=True, timeout=30)
        return int(float(r.stdout.strip().splitlines()[0]))
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return None


def free_mib() -> int:
    if E.get("GC_FREE_MIB"):
        return int(E["GC_FREE_MIB"])
    free = smi("memory.free")
    if free is None:
        raise RuntimeError("nvidia-smi gave no free memory; set GPU_CHECK_FREE_MIB")
    return free


def estimate_args(model: str, free: int, ngl: str) -> list:
    build = ["--engine-build", BUILD] if BUILD else []
    return [MODELSERVE, "estimate", model, "--context-size", str(CTX), "--context-length", str(CTX // PARALLEL),
            "--cpu", CPU, "--node-cpus", str(os.cpu_count() or 1), *build, "--gpu", f"{free}MiB", "--gpu-layers", ngl, "--output", "json"]


def server_args(model: str, ngl: int, port: int) -> list:
    """The operator's command line (pipeline/catalog/args.rs) with the offload made explicit."""
    return [SERVER, "--model", model, "--ctx-size", str(CTX), "--parallel", str(PARALLEL),
            "--ubatch-size", str(UBATCH), "--cache-ram", "0", "--ctx-checkpoints", str(CHECKPOINTS),
            "--no-webui", "--host", "127.0.0.1", "--port", str(port), "--api-key", "gpu-check",
            "-ngl", str(ngl), "--fit", "off", "-lv", "4"]


def estimate(model: str, free: int, ngl: str) -> dict:
    r = subprocess.run(estimate_args(model, free, ngl), capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise RuntimeError(f"modelserve estimate: {r.stderr.strip() or r.stdout.strip()}")
    return json.loads(r.stdout)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(model: str, ngl: int, log_path: str) -> tuple:
    """Starts llama-server, waits until it listens (or exits), reads nvidia-smi's used memory and
    the server's peak RSS, stops it; returns (its log, MiB used on the GPU while it ran or None,
    peak RSS MiB or None). The peak holds the CUDA runtime's host memory, which the host part
    must cover too: the pod's memory limit is that part."""
    before = smi("memory.used")
    with open(log_path, "w") as log:
        port = free_port()
        p = subprocess.Popen(server_args(model, ngl, port), stdout=log, stderr=subprocess.STDOUT)
        used, peak, ready = None, None, False
        try:
            limit = min(time.time() + 120, DEADLINE)
            while time.time() < limit and p.poll() is None:
                time.sleep(0.5)
                with open(log_path, errors="replace") as f:
                    if READY.search(f.read()):
                        ready = True
                        break
            if ready:
                fill_every_slot(port)
                after = smi("memory.used")
                used = after - before if after is not None and before is not None else None
                peak = peak_rss_mib(p.pid)
        finally:
            p.terminate()
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    with open(log_path, errors="replace") as f:
        text = f.read()
    if not ready:
        tail = "\n".join(text.splitlines()[-15:])
        why = "exited with " + str(p.returncode) if p.returncode not in (None, -15) else "did not listen in time"
        raise RuntimeError(f"llama-server {why}; the end of its log:\n{tail}")
    return text, used, peak


def fill_every_slot(port: int) -> None:
    """Every slot reads a prompt that fills its context, all at once, as the operator's smoke
    test and clients do: the prompt's kernels (loaded on first use) and buffers are then in the
    peak RSS and in nvidia-smi's figure. Token ids, so no tokenizer shapes the length."""
    import threading, urllib.request
    n = CTX // PARALLEL - 16
    errors = []

    def one(slot: int) -> None:
        body = json.dumps({"prompt": [1] + [100 + (slot * 7919 + i * 31) % 20000 for i in range(n)],
                           "n_predict": 4, "cache_prompt": False}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", data=body,
                                     headers={"Content-Type": "application/json", "Authorization": "Bearer gpu-check"})
        try:
            with urllib.request.urlopen(req, timeout=max(5, DEADLINE - time.time())) as r:
                r.read()
        except Exception as e:  # the run of this model fails: its peak would be too low
            errors.append(f"slot {slot}: {e}")

    threads = [threading.Thread(target=one, args=(s,)) for s in range(PARALLEL)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError("a prompt that fills the slots failed: " + "; ".join(errors))


def peak_rss_mib(pid: int):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def compare(est: dict, eng: dict, used, peak) -> list:
    """(part, estimate, engine) in MiB, the layer count as is; parts both sides have as 0 left out."""
    o = est["offload"]
    d, h = o["devices"][0], o["host"]
    m = lambda b: b / MIB
    rows = [("gpu layers (-ngl)", o["ngl"], eng["offloaded"])]
    for part in ("weights", "kv", "recurrent", "compute", "total"):
        rows.append((f"gpu {part}", m(d[part]), eng["gpu"][part]))
    if used is not None:
        rows.append(("gpu used (smi) vs total+margin", m(d["total"] + o["fitTarget"]), used))
    for part, key in (("weights", "weights"), ("repack", "repack"), ("kv", "kv"), ("recurrent", "recurrent"),
                      ("compute", "compute"), ("output", "outputBuffer")):
        rows.append((f"host {part}", m(h[key]), eng["host"][part]))
    if peak is not None:
        rows.append(("host total vs peak RSS", m(h["total"]), peak))
        # What the GPU runtime took: the peak less the host part's other figures.
        rows.append(("host runtime vs peak - rest", m(h["runtime"]), peak - m(h["total"] - h["runtime"])))
    return [r for r in rows if r[0].startswith("gpu layers") or (r[1] or 0) > 0.005 or (r[2] or 0) > 0.005]


def main() -> int:
    os.makedirs(LOGS, exist_ok=True)
    models = sorted(glob.glob(os.path.join(E["GC_MODELS"], "*.gguf")))
    if not models:
        print(f"gpu-check: no models in {E['GC_MODELS']}", file=sys.stderr)
        return 4
    # Full offloads first: if time runs out, the partial ones are what is missing.
    plan = []
    for setting in ("full", "partial"):
        for model in models:
            plan.append((model, setting))
    results, failures, layers = [], [], {}
    for model, setting in plan:
        name = os.path.basename(model).removesuffix(".gguf")
        if time.time() > DEADLINE - 15:
            failures.append(f"{name} {setting}: skipped, out of time")
            continue
        start = time.time()
        try:
            free = free_mib()
            if model not in layers:
                layers[model] = estimate(model, free, "all")["offload"]["layers"]
            ngl = layers[model] if setting == "full" else max(1, layers[model] // 2)
            est = estimate(model, free, str(ngl))
            log_path = os.path.join(LOGS, f"{name}-{setting}.log")
            with open(os.path.join(LOGS, f"{name}-{setting}.estimate.json"), "w") as f:
                json.dump(est, f, indent=1)
            text, used, peak = serve(model, ngl, log_path)
            eng = engine_parts(parse_log(text), DEVICE)
            rows = compare(est, eng, used, peak)
            results.append({"model": name, "setting": setting, "ngl": ngl, "free_mib": free, "rows": rows,
                            "message": est["offload"]["message"], "seconds": round(time.time() - start, 1)})
            print(f"gpu-check: {name} {setting} (-ngl {ngl}, {free} MiB free) took {time.time() - start:.1f}s: "
                  f"{est['offload']['message']}", flush=True)
        except Exception as e:  # one failed run must not hide the others
            failures.append(f"{name} {setting}: {e}")
            print(f"gpu-check: {name} {setting} FAILED after {time.time() - start:.1f}s: {e}", flush=True)

    lines = [f"# modelserve estimate vs llama-server ({DEVICE}): MiB; ratio = estimate / engine; "
             f"ctx {CTX}, parallel {PARALLEL}, ubatch {UBATCH}, --cpu {CPU}, --engine-build {BUILD or 'default'}",
             f"{'model':34} {'setting':8} {'part':32} {'estimate':>10} {'engine':>10} {'ratio':>7}"]
    for r in results:
        for part, e, g in r["rows"]:
            count = part.startswith("gpu layers")
            fmt = (lambda v: "-" if v is None else str(v)) if count else (lambda v: "-" if v is None else f"{v:.2f}")
            ratio = f"{e / g:.3f}" if g else "-"
            flag = "  UNDER" if g and not count and e < 0.98 * g and part != "gpu used (smi) vs total+margin" else ""
            lines.append(f"{r['model']:34} {r['setting']:8} {part:32} {fmt(e):>10} {fmt(g):>10} {ratio:>7}{flag}")
    lines += [f"FAILED {f}" for f in failures]
    table = "\n".join(lines) + "\n"
    print(table, flush=True)
    with open(os.path.join(OUT, "gpu-check.txt"), "a") as f:
        f.write(table)
    with open(os.path.join(OUT, "gpu-check.json"), "w") as f:
        json.dump({"results": results, "failures": failures}, f, indent=1)
    with tarfile.open(os.path.join(OUT, "gpu-check-logs.tar.gz"), "w:gz") as t:
        t.add(LOGS, arcname="logs")
    return 4 if failures else 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--parse":  # a log on stdin: its figures, as JSON
        print(json.dumps(engine_parts(parse_log(sys.stdin.read()), DEVICE), indent=1))
        sys.exit(0)
    sys.exit(main())
PY
}

main "$@"; exit
