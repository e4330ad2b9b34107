#!/usr/bin/env bash
# Prepares .gpu/ (ignored through .git/info/exclude, never committed) for testbed/gpu-check.sh,
# which runs on a GPU machine that reaches no network and has no Rust toolchain. Run it HERE:
#
#   testbed/gpu-sources.sh            # then, with the device tool: see gpu-check.sh's header
#
# .gpu/ then holds, and nothing else:
#   llama.cpp-src.tar.gz  the llama.cpp sources vendored in the llama-cpp-python sdist
#                         (llama-sdist.sh), trimmed to what a CUDA build of llama-server needs:
#                         ggml with its CPU, CUDA and RPC backends, src, common, tools (server,
#                         mtmd and the small tools tools/CMakeLists.txt adds), vendor, cmake files
#   modelserve.gz         the static (musl) modelserve binary, stripped and gzipped, built as
#                         build-image.sh builds it
#   models/*.gguf         the models testbed/gpu-check.models lists (3 families: llama, dense
#                         with an untied output; gemma3, sliding-window attention and tied 32k
#                         embeddings; granitehybrid, Mamba-2 layers with attention layers),
#                         written by gen_gguf.py with a real 32k tokenizer and quantized by
#                         llama-quantize, as the memory benchmark's models are, in smaller shapes
#   MANIFEST              what each file is, its size and sha256
# and checks that .gpu/ with the rest of the working tree stays under the device tool's 64 MiB.
#
# Each part is remade only when missing (delete .gpu/ or a file in it to remake it). Variables:
#   MODELSERVE_BIN   a static modelserve binary to take instead of building one
#   LLAMA_QUANTIZE   the llama-quantize binary (default: the test bed's cached build, else
#                    build-llama-tool.sh llama-quantize)
#   CARGO_TARGET_DIR where cargo builds (default: target/ of the repository)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
# shellcheck source-path=SCRIPTDIR source=versions.env
. "$here/versions.env"
out="$root/.gpu"
# The device tool's limit on what travels: the working tree and the carried paths together.
limit_mib=64
# What .gpu/ may take, leaving the rest of the working tree room to grow.
budget_mib=52
cache="${MODELSERVE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/modelserve}"
fail() { echo "gpu-sources: $1" >&2; exit 1; }
note() { echo "gpu-sources: $1" >&2; }
mib() { echo $(( ($1 + (1 << 20) - 1) >> 20 )); }
start=$(date +%s)

# Ignored, so it travels only when carried and is never committed.
exclude="$(git -C "$root" rev-parse --git-path info/exclude 2>/dev/null)" \
  || fail "$root is not a git checkout"
case "$exclude" in /*) ;; *) exclude="$root/$exclude" ;; esac
mkdir -p "$(dirname "$exclude")" "$out/models"
grep -qxF '/.gpu/' "$exclude" 2>/dev/null || echo '/.gpu/' >>"$exclude"
git -C "$root" check-ignore -q .gpu/MANIFEST || fail ".gpu/ is not ignored after adding it to $exclude"

# --- the trimmed llama.cpp sources -------------------------------------------------------------
sdist="$(bash "$here/llama-sdist.sh" | tail -n 1)"
src="$sdist/vendor/llama.cpp"
[ -f "$src/ggml/src/ggml-cuda/CMakeLists.txt" ] || fail "$src has no ggml/src/ggml-cuda"
tarball="$out/llama.cpp-src.tar.gz"
if [ ! -f "$tarball" ] || [ "$0" -nt "$tarball" ]; then
  # Whole subtrees a CUDA llama-server build never reads: other backends (ggml_add_backend adds a
  # backend's folder only when it is on), tests, examples, the unified app and the web UI's
  # sources (off: LLAMA_BUILD_TESTS/EXAMPLES/APP/UI), documentation, models, Python.
  drop=(.github .devops docs models media gguf-py conversion benches examples pocs tests app skills
    ci requirements tools/ui/src tools/ui/tests tools/ui/static tools/ui/package-lock.json
    tools/server/tests tools/server/bench 'tools/mtmd/test-*')
  for b in vulkan opencl sycl metal hexagon cann webgpu openvino et virtgpu zdnn zendnn musa hip blas; do
    drop+=("ggml/src/ggml-$b")
  done
  excludes=(--exclude-vcs)
  for d in "${drop[@]}"; do excludes+=("--exclude=llama.cpp/$d"); done
  tar -C "$(dirname "$src")" "${excludes[@]}" --sort=name --owner=0 --group=0 --numeric-owner \
    --mtime='2000-01-01 00:00:00' -cf - llama.cpp | gzip -9 -n >"$tarball.tmp" \
    || fail "packing $src failed"
  mv "$tarball.tmp" "$tarball"
fi
# What the build reads first and most; a layout change of the sdist shows here, not there.
listing="$(tar -tzf "$tarball")"
for must in llama.cpp/CMakeLists.txt llama.cpp/ggml/src/ggml-cuda/CMakeLists.txt \
  llama.cpp/ggml/src/ggml-cuda/template-instances/ llama.cpp/ggml/src/ggml-cpu/CMakeLists.txt \
  llama.cpp/tools/server/server.cpp llama.cpp/tools/mtmd/CMakeLists.txt llama.cpp/src/llama.cpp \
  llama.cpp/common/CMakeLists.txt llama.cpp/vendor/cpp-httplib/CMakeLists.txt \
  llama.cpp/scripts/ui-assets.cmake llama.cpp/tools/ui/CMakeLists.txt llama.cpp/LICENSE; do
  grep -qxF "$must" <<<"$listing" || fail "the trimmed sources lack $must"
done
note "llama.cpp sources: $(mib "$(stat -c %s "$tarball")") MiB ($(wc -l <<<"$listing") entries)"

# --- the static modelserve, gzipped ------------------------------------------------------------
bin="$out/modelserve.gz"
if [ -n "${MODELSERVE_BIN:-}" ] || [ ! -f "$bin" ]; then
  built="${MODELSERVE_BIN:-}"
  if [ -z "$built" ]; then
    arch="$(uname -m)" target="$(uname -m)-unknown-linux-musl"
    [ "$arch" = x86_64 ] || fail "this machine is $arch; the GPU machine is x86_64: pass MODELSERVE_BIN"
    rustup target list --installed 2>/dev/null | grep -qx "$target" || rustup target add "$target" >&2 \
      || fail "rustup target add $target failed"
    if ! command -v musl-gcc >/dev/null; then
      [ "$(id -u)" = 0 ] || fail "musl-gcc is missing (ring compiles C): apt-get install musl-tools"
      apt-get update -qq || fail "apt-get update failed"
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq musl-tools >/dev/null \
        || fail "apt-get install musl-tools failed"
    fi
    note "building the static modelserve (release, $target): about 20 minutes from scratch on 2 cores"
    CC_x86_64_unknown_linux_musl=musl-gcc cargo build --manifest-path "$root/Cargo.toml" --release --locked \
      --target "$target" --bin modelserve >&2 || fail "cargo build --target $target failed; see above"
    built="${CARGO_TARGET_DIR:-$root/target}/$target/release/modelserve"
  fi
  tmp="$out/modelserve.tmp"
  cp "$built" "$tmp" && chmod 0755 "$tmp"
  strip "$tmp" 2>/dev/null || note "strip failed; carrying the binary unstripped"
  if ldd "$tmp" >/dev/null 2>&1 && ! ldd "$tmp" 2>&1 | grep -q 'statically linked'; then
    fail "$built links shared libraries; the GPU machine needs a static one"
  fi
  "$tmp" estimate --help | grep -q -- '--gpu-layers' \
    || fail "$built has no 'estimate --gpu-layers': build it from a tree that has"
  gzip -9 -n -c "$tmp" >"$bin.part" && mv "$bin.part" "$bin"
  rm -f "$tmp"
fi
note "modelserve: $(mib "$(stat -c %s "$bin")") MiB gzipped, $(gzip -dc "$bin" >"$out/.probe" && chmod +x "$out/.probe" && "$out/.probe" --version; rm -f "$out/.probe")"

# --- the models ----------------------------------------------------------------------------------
quantize="${LLAMA_QUANTIZE:-}"
if [ -z "$quantize" ]; then
  for q in "$cache"/llama-cpp-"$LLAMA_CPP_PYTHON_VERSION"-*/llama-quantize \
    "$cache/llama-quantize-$LLAMA_CPP_PYTHON_VERSION/llama-quantize"; do
    if [ -x "$q" ]; then quantize="$q"; break; fi
  done
fi
# The models, as testbed/gpu-check.models lists them (family, vocabulary, size, type: gen_gguf.py's
# GPU shapes), which tests/offload_engine.rs also reads and holds over rpc-server devices.
list="$here/gpu-check.models"
models=()
while read -r family vocab size quant extra; do
  case "$family" in '' | '#'*) continue ;; esac
  [ -n "$quant" ] && [ -z "$extra" ] \
    || fail "$list: '$family $vocab $size $quant $extra' is not 'family vocabulary size type'"
  models+=("$family $vocab $size $quant")
done <"$list"
[ ${#models[@]} -gt 0 ] || fail "$list lists no model"
recipe_id="$(printf 'gen_gguf:%s list:%s' "$(sha256sum "$here/gen_gguf.py" | cut -c1-12)" \
  "$(sha256sum "$list" | cut -c1-12)" | sha256sum | cut -c1-16)"
if [ "$(cat "$out/models/.recipe" 2>/dev/null)" != "$recipe_id" ]; then
  rm -f "$out"/models/*.gguf "$out/models/.recipe"
fi
missing=()
for m in "${models[@]}"; do
  read -r family vocab size quant <<<"$m"
  [ -f "$out/models/$family-$size-$vocab-$quant.gguf" ] || missing+=("$m")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ -z "$quantize" ]; then
    quantize="$(bash "$here/build-llama-tool.sh" llama-quantize | tail -n 1)" || fail "building llama-quantize failed"
  fi
  [ -x "$quantize" ] || fail "llama-quantize not found at '$quantize'"
  scratch="$(mktemp -d)"
  trap 'rm -rf "$scratch"' EXIT
  for m in "${missing[@]}"; do
    read -r family vocab size quant <<<"$m"
    f16="$scratch/$family-$size-$vocab-f16.gguf" dst="$out/models/$family-$size-$vocab-$quant.gguf"
    python3 "$here/gen_gguf.py" "$scratch" --arch "$family" --size "$size" --vocab "$vocab" --sdist "$sdist" \
      >/dev/null || fail "writing $family failed"
    if [ "$quant" = F16 ]; then
      mv "$f16" "$dst"
    else
      "$quantize" "$f16" "$dst.part" "$quant" >"$scratch/$family.quantize.log" 2>&1 \
        || { tail -20 "$scratch/$family.quantize.log" >&2; fail "llama-quantize $family $quant failed"; }
      mv "$dst.part" "$dst"
      rm -f "$f16"
    fi
    note "$(basename "$dst"): $(mib "$(stat -c %s "$dst")") MiB"
  done
  echo "$recipe_id" >"$out/models/.recipe"
fi

# --- the manifest and the size -------------------------------------------------------------------
{
  echo "# .gpu/ for testbed/gpu-check.sh, made by testbed/gpu-sources.sh on $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "# llama-cpp-python $LLAMA_CPP_PYTHON_VERSION sdist (llama.cpp b$LLAMA_CPP_BUILD); models from testbed/gpu-check.models; recipe $recipe_id"
  (cd "$out" && find . -type f ! -name MANIFEST ! -name '.*' -printf '%P\n' | sort | while read -r f; do
    printf '%s %10d %s\n' "$(sha256sum "$f" | cut -c1-16)" "$(stat -c %s "$f")" "$f"
  done)
} >"$out/MANIFEST"
gpu_bytes="$(du -sb "$out" | cut -f1)"
# What else travels: tracked files and untracked ones git does not ignore.
tree_size() {
  cd "$root" || return
  git ls-files -z --cached --others --exclude-standard | xargs -0 -r stat -c %s 2>/dev/null \
    | awk '{s += $1} END {print s + 0}'
}
tree_bytes="$(tree_size || true)"
cat "$out/MANIFEST" >&2
note ".gpu/ is $(mib "$gpu_bytes") MiB, the rest of the working tree $(mib "$tree_bytes") MiB (limit $limit_mib MiB together); done in $(( $(date +%s) - start ))s"
[ "$gpu_bytes" -le $((budget_mib << 20)) ] || fail ".gpu/ is over its $budget_mib MiB budget: make the models smaller"
[ $((gpu_bytes + tree_bytes)) -le $((limit_mib << 20)) ] || fail ".gpu/ and the working tree are over $limit_mib MiB together"
echo "$out"
