#!/usr/bin/env bash
# Builds the test bed's images as OCI archives with no daemon and no base image pulled, cached by
# version, and optionally imports them into a containerd. Prints each archive's path on a line.
#
#   testbed/build-image.sh [modelserve|engine|all] [--import CONTAINERD_SOCKET]
#
#   modelserve  ghcr.io/modelserve/modelserve:<Cargo version>: the static (musl) modelserve binary
#               alone, uid 65532, entrypoint the binary: the image the top-level Dockerfile builds,
#               the chart's default and the Deployments' `pull` init container.
#   engine      localhost/modelserve-testbed/llama.cpp:server-b<LLAMA_CPP_BUILD>: the test bed's
#               llama-server (testbed/build-llama-server.sh) with the shared libraries it links,
#               uid 65532, entrypoint /app/llama-server, tagged by its upstream build like the
#               official server-bNNNN images, so the operator reads the build from the tag. Like
#               the official images it has a shell and the usual tools (busybox, for kubectl exec).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
. "$here/versions.env"
what=all sock=""
while [ $# -gt 0 ]; do
  case "$1" in
    modelserve | engine | all) what="$1" ;;
    --import) sock="${2:?--import needs the containerd socket, e.g. /run/containerd/containerd.sock}"; shift ;;
    *) echo "build-image: unknown argument '$1'; usage: build-image.sh [modelserve|engine|all] [--import SOCKET]" >&2; exit 2 ;;
  esac
  shift
done
cache="${MODELSERVE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/modelserve}/images"
mkdir -p "$cache"
fail() { echo "build-image: $1" >&2; exit 1; }
version="$(sed -n 's/^version = "\(.*\)"$/\1/p' "$root/Cargo.toml" | head -n 1)"
[ -n "$version" ] || fail "no version in Cargo.toml"
arch="$(uname -m)"
images=()
# A package from Debian, installed when missing (as root, as the test bed runs).
debian() {
  [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null || return 1
  echo "build-image: installing $1 from Debian" >&2
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$1" >/dev/null; }
}

modelserve_image() {
  local target="$arch-unknown-linux-musl" out="$cache/modelserve-$version-$arch.tar"
  rustup target list --installed 2>/dev/null | grep -qx "$target" || rustup target add "$target" >&2 \
    || fail "the Rust target $target is missing, and rustup target add $target failed"
  command -v musl-gcc >/dev/null || debian musl-tools \
    || fail "musl-gcc is missing (ring compiles C): apt-get install musl-tools"
  # cargo decides whether the binary is stale; the archive follows the binary.
  CC_x86_64_unknown_linux_musl=musl-gcc CC_aarch64_unknown_linux_musl=musl-gcc \
    cargo build --manifest-path "$root/Cargo.toml" --release --locked --target "$target" --bin modelserve >&2 \
    || fail "cargo build --target $target failed; see the output above"
  local bin="${CARGO_TARGET_DIR:-$root/target}/$target/release/modelserve"
  # ldd fails on a static binary, and says so of a static PIE
  if ldd "$bin" >/dev/null 2>&1 && ! ldd "$bin" 2>&1 | grep -q 'statically linked'; then
    fail "$bin links shared libraries; a FROM scratch image needs it static"
  fi
  if [ ! -f "$out" ] || [ "$bin" -nt "$out" ]; then
    python3 "$here/oci_image.py" --out "$out" --name "ghcr.io/modelserve/modelserve:$version" \
      --user 65532:65532 --entrypoint /usr/local/bin/modelserve --env PATH=/usr/local/bin \
      --label "org.opencontainers.image.version=$version" --label org.opencontainers.image.title=modelserve \
      --label org.opencontainers.image.licenses=Apache-2.0 \
      --dir /tmp "$bin=/usr/local/bin/modelserve:0755"
  fi
  images+=("$out")
}

engine_image() {
  local server out="$cache/llama-server-b$LLAMA_CPP_BUILD-$LLAMA_CPP_PYTHON_VERSION-$arch.tar"
  server="$(bash "$here/build-llama-server.sh" | tail -n 1)"
  [ -x /bin/busybox ] || debian busybox-static \
    || fail "busybox is missing (the engine image's shell): apt-get install busybox-static"
  if [ ! -f "$out" ] || [ "$server" -nt "$out" ] || [ "$0" -nt "$out" ]; then
    # Every library the binary links, under the path the loader finds it at (links resolved).
    local libs=() lib
    while read -r lib; do libs+=("$lib=$lib:0755"); done < <(ldd "$server" | grep -o '/[^ ]*' | sort -u)
    [ ${#libs[@]} -gt 0 ] || fail "ldd found no libraries for $server"
    python3 "$here/oci_image.py" --out "$out" \
      --name "localhost/modelserve-testbed/llama.cpp:server-b$LLAMA_CPP_BUILD" \
      --user 65532:65532 --entrypoint /app/llama-server --env LLAMA_ARG_HOST=0.0.0.0 \
      --label "org.opencontainers.image.version=b$LLAMA_CPP_BUILD" \
      --label "org.opencontainers.image.source=llama-cpp-python $LLAMA_CPP_PYTHON_VERSION sdist (vendor/llama.cpp)" \
      --env PATH=/app:/bin --dir /tmp "$server=/app/llama-server:0755" /bin/busybox=/bin/busybox:0755 \
      /bin/busybox=/bin/sh:0755 "${libs[@]}"
  fi
  images+=("$out")
}

case "$what" in
  modelserve) modelserve_image ;;
  engine) engine_image ;;
  all) modelserve_image; engine_image ;;
esac
if [ -n "$sock" ]; then
  ctr="$(command -v ctr || true)"
  [ -n "$ctr" ] || fail "ctr is not on PATH: it comes with the test bed's containerd"
  for image in "${images[@]}"; do
    "$ctr" --address "$sock" -n k8s.io images import "$image" >&2 \
      || fail "ctr images import $image into $sock failed"
  done
fi
printf '%s\n' "${images[@]}"
