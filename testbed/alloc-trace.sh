#!/usr/bin/env bash
# Shows where each compute buffer of llama-server peaks: which tensors (and holes) are in it, at
# what offsets, when the graph allocator (ggml-alloc) grows it to its final size. This is how a
# miss of the compute estimate is traced to its cause (`src/gguf/offload/model.rs` cites what
# was traced with it); nothing in the test suite runs it.
#
#   testbed/alloc-trace.sh MODEL.gguf NGL [llama-server flags...]
#
# It runs llama-server over one rpc-server device (as tests/offload_engine.rs does: ctx 8192,
# 2 slots, ubatch 512, --fit off) and prints, per buffer (the host's CPU, each RPCn), the
# layout at each growth of the last worst-case reservation: offset, MiB and tensor. Gaps
# between entries are holes the allocator could not reuse. Set MODELSERVE_RPC_OFFLOAD=1 for
# CUDA's op offload (rpc-offload.py), and pass --no-repack as CUDA's placement has it.
#
# The first run builds llama-server and rpc-server with GGML_ALLOCATOR_DEBUG (ggml-alloc's own
# switch that logs the layout at each growth) from the sdist's sources with rpc-offload.py,
# into its own cache directory beside build-llama-tool.sh's: about 5 minutes on 2 cores.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/versions.env"
model="${1:?usage: alloc-trace.sh MODEL.gguf NGL [llama-server flags...]}"
ngl="${2:?usage: alloc-trace.sh MODEL.gguf NGL [llama-server flags...]}"
shift 2
[ -f "$model" ] || { echo "alloc-trace: no file $model" >&2; exit 2; }
fail() { echo "alloc-trace: $1" >&2; exit 1; }
out="${MODELSERVE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/modelserve}/llama-cpp-${LLAMA_CPP_PYTHON_VERSION}-${LLAMA_BUILD_CONFIG}-alloc-trace"
if [ ! -f "$out/.complete" ]; then
  command -v cmake >/dev/null || fail "cmake not found (apt-get install cmake)"
  sdist="$(bash "$here/llama-sdist.sh" | tail -n 1)"
  build="$(mktemp -d)"; trap 'rm -rf "$build"' EXIT
  cp -r "$sdist/vendor/llama.cpp" "$build/src"
  python3 "$here/rpc-offload.py" "$build/src" || fail "adding the RPC op offload"
  gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
  cmake -S "$build/src" -B "$build/out" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_C_FLAGS=-DGGML_ALLOCATOR_DEBUG -DGGML_NATIVE=OFF -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DGGML_RPC=ON -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
    -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF >"$build/configure.log" 2>&1 \
    || { cat "$build/configure.log" >&2; fail "cmake configure failed"; }
  cmake --build "$build/out" --target llama-server ggml-rpc-server -j "$(nproc)" \
    >"$build/build.log" 2>&1 || { tail -30 "$build/build.log" >&2; fail "the build failed"; }
  mkdir -p "$out"
  cp "$build/out/bin/llama-server" "$build/out/bin/ggml-rpc-server" "$out/"
  touch "$out/.complete"
fi

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
rpc_port="$(port)" http_port="$(port)"
log="$(mktemp)"
"$out/ggml-rpc-server" -H 127.0.0.1 -p "$rpc_port" >/dev/null 2>&1 &
rpc=$!
server=
cleanup() { kill "$rpc" ${server:+"$server"} 2>/dev/null || true; rm -f "$log"; }
trap cleanup EXIT
sleep 0.5
"$out/llama-server" -m "$model" --host 127.0.0.1 --port "$http_port" --ctx-size 8192 --parallel 2 \
  --ubatch-size 512 --cache-ram 0 --no-webui --rpc "127.0.0.1:$rpc_port" -ngl "$ngl" \
  --split-mode layer --fit off -lv 5 "$@" >"$log" 2>&1 &
server=$!
for _ in $(seq 240); do
  grep -q "listening on\|exiting due to\|error loading model" "$log" && break
  kill -0 "$server" 2>/dev/null || break
  sleep 0.5
done
grep -q "compute buffer size =" "$log" || { tail -20 "$log" >&2; fail "llama-server reserved no compute buffer"; }

python3 - "$log" <<'PY'
import re, sys
lines = open(sys.argv[1], errors="replace").read().splitlines()
# The last worst-case (prompt-sized) reservation and the buffers it logged.
start = max((i for i, l in enumerate(lines) if "graph_reserve: reserving a graph" in l
             and "n_tokens =    1" not in l and "n_outputs" in l
             and int(re.search(r"n_tokens = +(\d+)", l).group(1)) > 16), default=0)
entry = re.compile(r"(\S+) \[(\d+): ([0-9a-f]+)-([0-9a-f]+)\] \(([\d.]+) MB\)")
for l in lines[start:]:
    if "compute buffer size =" in l:
        print(l.split("sched_reserve: ", 1)[-1].strip())
        continue
    if "max_size[" not in l:
        continue
    l = re.sub(r"\d+\.\d+\.\d+ D ", "", l)
    size = re.search(r"max_size\[\d+\] = ([\d.]+) MB", l).group(1)
    found = entry.findall(l.split("tensors: ", 1)[-1])
    # A device's copies of its split inputs are named RPCn[host:port]#name#copy.
    buf = next((re.match(r"(?:\d+\.)?(RPC\d+)", n).group(1) for n, *_ in found
                if re.match(r"(?:\d+\.)?RPC\d+\[", n)), "CPU")
    print(f"{buf} grows to {size} MB:")
    for name, chunk, a, b, mb in found:
        name = re.sub(r"^\d+\.", "", name)
        name = re.sub(r"RPC\d+\[[^\]]*\]#", "", name)
        print(f"    {int(a, 16) / 2**20:9.3f} {float(mb):8.3f}  {name}")
PY
