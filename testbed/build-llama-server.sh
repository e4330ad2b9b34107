#!/usr/bin/env bash
# Builds llama-server from the llama.cpp sources vendored in the llama-cpp-python sdist (see
# llama-sdist.sh) into a cache directory keyed by the sdist version, once; a second run is a
# no-op. Prints the path of the binary on its last line. About 13 minutes on 2 cores.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/versions.env"
sdist="$(bash "$here/llama-sdist.sh" | tail -n 1)"
out="${MODELSERVE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/modelserve}/llama-server-${LLAMA_CPP_PYTHON_VERSION}"
if [ -x "$out/llama-server" ] && [ -f "$out/.complete" ]; then echo "$out/llama-server"; exit 0; fi
fail() { echo "build-llama-server: $1 failed; see the output above" >&2; exit 1; }
command -v cmake >/dev/null || fail "finding cmake (apt-get install cmake)"
command -v g++ >/dev/null || fail "finding g++ (apt-get install g++)"
gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
build="$(mktemp -d)"; trap 'rm -rf "$build"' EXIT
start=$(date +%s)
# Portable code (no -march=native): the cache may outlive this CPU. No curl, no SSL, no web UI
# download: the test bed reaches no network.
cmake -S "$sdist/vendor/llama.cpp" -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DGGML_NATIVE=OFF -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
  -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF >"$build/configure.log" 2>&1 \
  || { cat "$build/configure.log" >&2; fail "cmake configure"; }
cmake --build "$build" --target llama-server -j "$(nproc)" >"$build/build.log" 2>&1 \
  || { tail -50 "$build/build.log" >&2; fail "cmake build of llama-server"; }
mkdir -p "$out"
cp "$build/bin/llama-server" "$out/llama-server"
touch "$out/.complete"
echo "build-llama-server: done in $(( $(date +%s) - start ))s" >&2
echo "$out/llama-server"
