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
# The first run builds the llama.cpp tools with GGML_ALLOCATOR_DEBUG (ggml-alloc's own switch
# that logs the layout at each growth): build-llama-tool.sh with LLAMA_ALLOC_TRACE=1, into a
# cache directory of its own beside the test bed's, once (10 to 20 minutes on 2 cores).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
model="${1:?usage: alloc-trace.sh MODEL.gguf NGL [llama-server flags...]}"
ngl="${2:?usage: alloc-trace.sh MODEL.gguf NGL [llama-server flags...]}"
shift 2
[ -f "$model" ] || { echo "alloc-trace: no file $model" >&2; exit 2; }
fail() { echo "alloc-trace: $1" >&2; exit 1; }
server_bin="$(LLAMA_ALLOC_TRACE=1 bash "$here/build-llama-tool.sh" llama-server | tail -n 1)" \
  || fail "building llama-server with GGML_ALLOCATOR_DEBUG failed"
rpc_bin="$(LLAMA_ALLOC_TRACE=1 bash "$here/build-llama-tool.sh" rpc-server | tail -n 1)" \
  || fail "building rpc-server with GGML_ALLOCATOR_DEBUG failed"

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
rpc_port="$(port)" http_port="$(port)"
log="$(mktemp)"
"$rpc_bin" -H 127.0.0.1 -p "$rpc_port" >/dev/null 2>&1 &
rpc=$!
server=
cleanup() { kill "$rpc" ${server:+"$server"} 2>/dev/null || true; rm -f "$log"; }
trap cleanup EXIT
sleep 0.5
"$server_bin" -m "$model" --host 127.0.0.1 --port "$http_port" --ctx-size 8192 --parallel 2 \
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
