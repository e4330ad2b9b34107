#!/usr/bin/env bash
# Builds one llama.cpp tool (llama-server, llama-quantize, rpc-server, ...) from the sources
# vendored in the llama-cpp-python sdist (see llama-sdist.sh) into a cache directory keyed by the
# tool and the sdist version, once; a second run is a no-op. Prints the path of the binary on its
# last line. About 7 to 15 minutes on 2 cores, most of it ggml.
#
#   testbed/build-llama-tool.sh llama-quantize
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/versions.env"
tool="${1:?usage: build-llama-tool.sh TARGET (llama-server, llama-quantize, rpc-server)}"
case "$tool" in
  llama-server | llama-quantize | rpc-server) ;;
  *) echo "build-llama-tool: unknown target '$tool'; valid: llama-server, llama-quantize, rpc-server" >&2; exit 2 ;;
esac
sdist="$(bash "$here/llama-sdist.sh" | tail -n 1)"
out="${MODELSERVE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/modelserve}/${tool}-${LLAMA_CPP_PYTHON_VERSION}"
if [ -x "$out/$tool" ] && [ -f "$out/.complete" ]; then echo "$out/$tool"; exit 0; fi
fail() { echo "build-llama-tool: $1 failed; see the output above" >&2; exit 1; }
command -v cmake >/dev/null || fail "finding cmake (apt-get install cmake)"
command -v g++ >/dev/null || fail "finding g++ (apt-get install g++)"
gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
build="$(mktemp -d)"; trap 'rm -rf "$build"' EXIT
start=$(date +%s)
# Portable code (no -march=native): the cache may outlive this CPU. ggml's defaults then still
# compile AVX, AVX2, FMA, F16C and BMI2 (not AVX-512), so the CPU repack of Q4_0, Q4_K, IQ4_NL
# and MXFP4 is in. No curl, no SSL, no web UI download: the test bed reaches no network.
rpc=OFF; [ "$tool" = rpc-server ] && rpc=ON
cmake -S "$sdist/vendor/llama.cpp" -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DGGML_NATIVE=OFF -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DGGML_RPC="$rpc" \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
  -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF >"$build/configure.log" 2>&1 \
  || { cat "$build/configure.log" >&2; fail "cmake configure"; }
# llama-server and llama-quantize share one configuration and all of ggml and libllama: a build
# of either makes both (the second costs seconds), and each is cached in its own directory.
targets=("$tool")
case "$tool" in
  llama-server | llama-quantize) targets=(llama-server llama-quantize) ;;
esac
cmake --build "$build" --target "${targets[@]}" -j "$(nproc)" >"$build/build.log" 2>&1 \
  || { tail -50 "$build/build.log" >&2; fail "cmake build of ${targets[*]}"; }
cache="$(dirname "$out")"
for t in "${targets[@]}"; do
  dir="$cache/${t}-${LLAMA_CPP_PYTHON_VERSION}"
  if [ "$t" != "$tool" ] && [ -x "$dir/$t" ] && [ -f "$dir/.complete" ]; then continue; fi
  mkdir -p "$dir"
  cp "$build/bin/$t" "$dir/$t.tmp" && mv "$dir/$t.tmp" "$dir/$t"
  touch "$dir/.complete"
done
echo "build-llama-tool: ${targets[*]} done in $(( $(date +%s) - start ))s" >&2
echo "$out/$tool"
