#!/usr/bin/env bash
# Fetches the llama-cpp-python source distribution from PyPI once and unpacks
# it into a cache directory keyed by its version. The sdist vendors llama.cpp,
# which gives the test bed gguf-py (to write GGUF files whose names match that
# llama.cpp version), its loader source (to check what it requires) and the
# reference vocab-only GGUF files under vendor/llama.cpp/models/.
# A second run is a no-op. Prints the directory on its last stdout line.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
. "$here/versions.env"
: "${LLAMA_CPP_PYTHON_VERSION:?not set in $here/versions.env}"
v="$LLAMA_CPP_PYTHON_VERSION"
out="${MODELSERVE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/modelserve}/llama-cpp-python-${v}"

complete() {
  [ -f "$out/.complete" ] && [ -d "$out/vendor/llama.cpp/gguf-py/gguf" ]
}
if complete; then
  echo "$out"; exit 0
fi

fail() { echo "llama-sdist: $1" >&2; exit 1; }
command -v python3 >/dev/null || fail "python3 not found on PATH"
python3 -m pip --version >/dev/null 2>&1 || fail "pip is not available for python3 (python3 -m pip)"

# Work in a scratch directory beside the target so the final rename is atomic
# and an interrupted run never leaves a half-filled cache directory behind.
parent="$(dirname "$out")"
mkdir -p "$parent"
tmp="$(mktemp -d "$parent/.llama-cpp-python-${v}.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

start=$(date +%s)
# --no-binary :all: forces the sdist (the wheel has no vendored sources);
# --no-deps because only the tarball is wanted, not an install.
python3 -m pip download --quiet --disable-pip-version-check --no-deps \
  --no-binary :all: "llama-cpp-python==${v}" -d "$tmp/dl" >&2 \
  || fail "pip download of llama-cpp-python==${v} (sdist) failed; see pip's output above (is PyPI reachable, does the version exist?)"

shopt -s nullglob
# PyPI normalises the file name (llama_cpp_python-V.tar.gz); accept either spelling.
tarballs=("$tmp"/dl/llama[_-]cpp[_-]python-"${v}".tar.gz)
shopt -u nullglob
[ "${#tarballs[@]}" -eq 1 ] || fail "expected one sdist tarball in $tmp/dl, found: $(ls "$tmp/dl" 2>/dev/null | tr '\n' ' ')"

mkdir -p "$tmp/src"
# The tarball has a single top-level directory; strip it so paths are $out/vendor/...
tar -xzf "${tarballs[0]}" -C "$tmp/src" --strip-components=1 \
  || fail "extracting ${tarballs[0]} failed"
[ -d "$tmp/src/vendor/llama.cpp/gguf-py/gguf" ] \
  || fail "the sdist has no vendor/llama.cpp/gguf-py; its layout changed"
compgen -G "$tmp/src/vendor/llama.cpp/models/*.gguf" >/dev/null \
  || fail "the sdist has no vendor/llama.cpp/models/*.gguf; its layout changed"

touch "$tmp/src/.complete"
rm -rf "$out"   # a stale, incomplete directory from an older run
mv "$tmp/src" "$out"
echo "llama-sdist: done in $(( $(date +%s) - start ))s, $(du -sh "$out" | cut -f1) in $out" >&2
echo "$out"
