#!/usr/bin/env bash
# Shows where each compute buffer of llama-server peaks: which tensors (and holes) are in it, at
# what offsets, when the graph allocator (ggml-alloc) grows it to its final size. This is how a
# miss of the compute estimate is traced to its cause (`src/gguf/offload/model.rs` cites what
# was traced with it); nothing in the test suite runs it.
#
#   testbed/alloc-trace.sh MODEL.gguf NGL [--devices N] [llama-server flags...]
#
# It runs llama-server over N rpc-server devices, one by default (as tests/offload_engine.rs
# does: ctx 8192, 2 slots, ubatch 512, --fit off; pass the split as -ts a,b) and prints, per
# buffer (the host's CPU, each RPCn), the
# layout at each growth of the last worst-case reservation: offset, MiB and tensor. Gaps
# between entries are holes the allocator could not reuse. Set MODELSERVE_RPC_OFFLOAD=1 for
# CUDA's op offload (rpc-offload.py), and pass --no-repack as CUDA's placement has it.
#
# The first run builds the llama.cpp tools with GGML_ALLOCATOR_DEBUG (ggml-alloc's own switch
# that logs the layout at each growth): build-llama-tool.sh with LLAMA_ALLOC_TRACE=1, into a
# cache directory of its own beside the test bed's, once (10 to 20 minutes on 2 cores).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
usage="usage: alloc-trace.sh MODEL.gguf NGL [--devices N] [llama-server flags...]"
model="${1:?$usage}"
ngl="${2:?$usage}"
shift 2
devices=1
if [ "${1:-}" = --devices ]; then
  devices="${2:-}"
  shift 2 || true
fi
case "$devices" in
  [1-8]) ;;
  *) echo "alloc-trace: --devices takes 1 to 8 rpc-server devices, not '$devices'" >&2; exit 2 ;;
esac
[ -f "$model" ] || { echo "alloc-trace: no file $model" >&2; exit 2; }
fail() { echo "alloc-trace: $1" >&2; exit 1; }
server_bin="$(LLAMA_ALLOC_TRACE=1 bash "$here/build-llama-tool.sh" llama-server | tail -n 1)" \
  || fail "building llama-server with GGML_ALLOCATOR_DEBUG failed"
rpc_bin="$(LLAMA_ALLOC_TRACE=1 bash "$here/build-llama-tool.sh" rpc-server | tail -n 1)" \
  || fail "building rpc-server with GGML_ALLOCATOR_DEBUG failed"

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
http_port="$(port)"
log="$(mktemp)"
rpcs=() endpoints=() server=
# Every rpc-server started is stopped on any exit, the failed ones included.
cleanup() { kill "${rpcs[@]}" ${server:+"$server"} 2>/dev/null || true; rm -f "$log"; }
trap cleanup EXIT
for _ in $(seq "$devices"); do
  rpc_port="$(port)"
  "$rpc_bin" -H 127.0.0.1 -p "$rpc_port" >/dev/null 2>&1 &
  rpcs+=("$!")
  endpoints+=("127.0.0.1:$rpc_port")
done
sleep 0.5
"$server_bin" -m "$model" --host 127.0.0.1 --port "$http_port" --ctx-size 8192 --parallel 2 \
  --ubatch-size 512 --cache-ram 0 --no-webui --rpc "$(IFS=,; echo "${endpoints[*]}")" -ngl "$ngl" \
  --split-mode layer --fit off -lv 5 "$@" >"$log" 2>&1 &
server=$!
for _ in $(seq 240); do
  grep -q "listening on\|exiting due to\|error loading model" "$log" && break
  kill -0 "$server" 2>/dev/null || break
  sleep 0.5
done
grep -q "compute buffer size =" "$log" || { tail -20 "$log" >&2; fail "llama-server reserved no compute buffer"; }

python3 - "$log" "${endpoints[@]}" <<'PY'
import re, sys
lines = open(sys.argv[1], errors="replace").read().splitlines()
# Each device by its endpoint, in --rpc order: dev0, dev1, ...
devs = {e: f"dev{i}" for i, e in enumerate(sys.argv[2:])}
# The last worst-case (prompt-sized) reservation and the buffers it logged.
start = max((i for i, l in enumerate(lines) if "graph_reserve: reserving a graph" in l
             and "n_tokens =    1" not in l and "n_outputs" in l
             and int(re.search(r"n_tokens = +(\d+)", l).group(1)) > 16), default=0)
entry = re.compile(r"(\S+) \[(\d+): ([0-9a-f]+)-([0-9a-f]+)\] \(([\d.]+) MB\)")
# A device's copies of its split inputs are named RPCn[host:port]#name#copy. A growth naming
# none is the buffer whose last growth shares a tensor with it (same name, offset and size: the
# allocator moves nothing alive), else the one that grew before it where it is no smaller (a
# buffer only grows and the next one starts small), else the host's CPU buffer; and where that
# buffer cannot have it (it had grown larger, or ends smaller: the sizes it logs after), the one
# buffer that can (a device's growths between two of the host's share no tensor with its last
# one where the layers it runs have moved on, and a device's first growths name no input).
def device(endpoint):
    return f"{devs.get(endpoint, '?')} (RPC {endpoint})"
def buffer(l):
    at = re.search(r"RPC\d+\[([^\]]*)\]", l)
    return device(at.group(1)) if at else "CPU"
final = {}
for l in lines[start:]:
    if "compute buffer size =" in l:
        final.setdefault(buffer(l), float(re.search(r"= +([\d.]+) MiB", l).group(1)))
def possible(k, size):
    # A buffer only grows, and ends at the size it logs.
    return grown.get(k, 0.0) <= size + 0.005 and final.get(k, size) + 0.005 >= size
label, last, logged, layouts, grown = "CPU", 0.0, False, {}, {}
for l in lines[start:]:
    if logged and "max_size[" in l:
        break  # the next reservation's (a token's graph)
    if "compute buffer size =" in l:
        logged = True
        l = l.split("sched_reserve: ", 1)[-1].strip()
        at = re.search(r"RPC\d+\[([^\]]*)\]", l)
        print(f"{devs.get(at.group(1), '?')} {l}" if at else l)
        continue
    if "max_size[" not in l:
        continue
    l = re.sub(r"\d+\.\d+\.\d+ D ", "", l)
    size = float(re.search(r"max_size\[\d+\] = ([\d.]+) MB", l).group(1))
    found = entry.findall(l.split("tensors: ", 1)[-1])
    layout = {(n, a, b) for n, _, a, b, _ in found if a != b}
    named = next((m.group(1) for n, *_ in found
                  if (m := re.match(r"(?:\d+\.)?RPC\d+\[([^\]]*)\]#", n))), None)
    shares = [k for k, v in layouts.items() if v & layout]
    if named is not None:
        label = device(named)
    elif len(shares) == 1:
        label = shares[0]
    elif size < last or label == "CPU":
        label = "CPU"
    if named is None and not possible(label, size):
        fits = [k for k in final if possible(k, size)]
        if len(fits) == 1:
            label = fits[0]
    last, layouts[label], grown[label] = size, layout, size
    print(f"{label} grows to {size:.2f} MB:")
    for name, chunk, a, b, mb in found:
        name = re.sub(r"^\d+\.", "", name)
        name = re.sub(r"RPC\d+\[[^\]]*\]#", "", name)
        print(f"    {int(a, 16) / 2**20:9.3f} {float(mb):8.3f}  {name}")
PY
