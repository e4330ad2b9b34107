#!/usr/bin/env bash
# Builds the llama.cpp tools the test bed uses (llama-server, llama-quantize, rpc-server and
# llama-fit-params) from the sources vendored in the llama-cpp-python sdist (see llama-sdist.sh),
# all from ONE cmake configuration (with the RPC backend), once, into a cache directory keyed by
# the sdist version and LLAMA_BUILD_CONFIG (versions.env); a second run, for any of them, is a
# no-op. Prints the path of the asked tool's binary on its last line. About 10 to 20 minutes on 2
# cores, most of it ggml.
#
#   testbed/build-llama-tool.sh llama-quantize
#
# LLAMA_ALLOC_TRACE=1 builds the same tools with ggml-alloc's GGML_ALLOCATOR_DEBUG (each compute
# buffer's layout logged as it grows, which alloc-trace.sh prints) into a cache of their own
# (the directory name ends in -alloc-trace); the test suite never asks for it.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/versions.env"
: "${LLAMA_BUILD_CONFIG:?not set in $here/versions.env}"
tool="${1:?usage: build-llama-tool.sh TOOL (llama-server, llama-quantize, rpc-server, llama-fit-params)}"
# rpc-server's cmake target (and binary) is ggml-rpc-server; both names are accepted.
case "$tool" in
  llama-server | llama-quantize | llama-fit-params) bin="$tool" ;;
  rpc-server | ggml-rpc-server) bin=ggml-rpc-server ;;
  *) echo "build-llama-tool: unknown tool '$tool'; valid: llama-server, llama-quantize, rpc-server, llama-fit-params" >&2; exit 2 ;;
esac
targets=(llama-server llama-quantize ggml-rpc-server llama-fit-params)
sdist="$(bash "$here/llama-sdist.sh" | tail -n 1)"
config="$LLAMA_BUILD_CONFIG" cflags=()
if [ -n "${LLAMA_ALLOC_TRACE:-}" ]; then
  config+="-alloc-trace" cflags=(-DCMAKE_C_FLAGS=-DGGML_ALLOCATOR_DEBUG)
fi
out="${MODELSERVE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/modelserve}/llama-cpp-${LLAMA_CPP_PYTHON_VERSION}-${config}"
if [ -x "$out/$bin" ] && [ -f "$out/.complete" ]; then echo "$out/$bin"; exit 0; fi
fail() { echo "build-llama-tool: $1 failed; see the output above" >&2; exit 1; }
command -v cmake >/dev/null || fail "finding cmake (apt-get install cmake)"
command -v g++ >/dev/null || fail "finding g++ (apt-get install g++)"
gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
build="$(mktemp -d)"; trap 'rm -rf "$build"' EXIT
start=$(date +%s)
# Portable code (no -march=native): the cache may outlive this CPU. ggml's defaults then still
# compile AVX, AVX2, FMA, F16C and BMI2 (not AVX-512), so the CPU repack of Q4_0, Q4_K, IQ4_NL
# and MXFP4 is in. No curl, no SSL, no web UI download: the test bed reaches no network.
# GGML_RPC=ON for every tool: llama-server then takes --rpc (each rpc-server is a device), and
# the tools share all of ggml and libllama, so CI compiles llama.cpp once. A copy of the sources
# gets the RPC client's opt-in op offload (rpc-offload.py), which changes nothing unless
# MODELSERVE_RPC_OFFLOAD is set in llama-server's environment.
cp -r "$sdist/vendor/llama.cpp" "$build/src" || fail "copying the llama.cpp sources"
python3 "$here/rpc-offload.py" "$build/src" || fail "adding the RPC op offload"
cmake -S "$build/src" -B "$build/out" "${gen[@]}" "${cflags[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DGGML_NATIVE=OFF -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DGGML_RPC=ON \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
  -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF >"$build/configure.log" 2>&1 \
  || { cat "$build/configure.log" >&2; fail "cmake configure"; }
cmake --build "$build/out" --target "${targets[@]}" -j "$(nproc)" >"$build/build.log" 2>&1 \
  || { tail -50 "$build/build.log" >&2; fail "cmake build of ${targets[*]}"; }
# Fill a scratch directory beside the cache and rename it: an interrupted run leaves no
# half-filled cache behind, and a concurrent run's finished cache is kept.
mkdir -p "$(dirname "$out")"
tmp="$(mktemp -d "$out.tmp.XXXXXX")"; chmod 755 "$tmp"
for t in "${targets[@]}"; do cp "$build/out/bin/$t" "$tmp/$t"; done
touch "$tmp/.complete"
if [ -d "$out" ] && [ ! -f "$out/.complete" ]; then rm -rf "$out"; fi
if ! mv -T "$tmp" "$out" 2>/dev/null; then
  rm -rf "$tmp"
  [ -f "$out/.complete" ] || fail "moving the build into $out"
fi
echo "build-llama-tool: ${targets[*]} done in $(( $(date +%s) - start ))s" >&2
echo "$out/$bin"
