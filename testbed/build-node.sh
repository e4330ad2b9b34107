#!/usr/bin/env bash
# Builds what a real node of the test bed runs: the kubelet (from k8s.io/kubernetes, through the
# wrapper module beside this script, like the control plane), containerd with its runc shim and
# ctr (from the Go module proxy), and the pause image (pause.c from the same Kubernetes module,
# static, in an OCI archive). runc and the CNI plugins come from Debian. Output goes to a directory
# keyed by every version involved; a second run is a no-op. Prints the directory on its last line.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
. "$here/versions.env"
export GOTOOLCHAIN=local CGO_ENABLED=0 GOWORK=off
gover="$(go env GOVERSION)"
out="${MODELSERVE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/modelserve}/testbed-node-${K8S_VERSION}-containerd-${CONTAINERD_VERSION}-${gover}"
fail() { echo "testbed build-node: $1 failed; see the output above" >&2; exit 1; }
# Debian's packages, installed when missing (the test bed runs as root).
missing=()
for pair in runc:runc /usr/lib/cni/bridge:containernetworking-plugins gcc:gcc ip:iproute2 pkill:procps; do
  command -v "${pair%%:*}" >/dev/null || [ -x "${pair%%:*}" ] || missing+=("${pair#*:}")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "testbed build-node: installing ${missing[*]} from Debian" >&2
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null; } \
    || fail "apt-get install ${missing[*]}"
fi
have() { [ -x "$out/$1" ]; }
if have kubelet && have containerd && have containerd-shim-runc-v2 && have ctr && [ -f "$out/pause.tar" ] \
   && [ -f "$out/.complete" ]; then
  echo "$out"; exit 0
fi
mkdir -p "$out"
start=$(date +%s)
minor="$(echo "$K8S_VERSION" | cut -d. -f2)"
ldf="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldf+=" -X $p.gitVersion=${K8S_VERSION} -X $p.gitMajor=1 -X $p.gitMinor=${minor} -X $p.gitTreeState=clean"
done
(cd "$here/k8s" && GOFLAGS=-mod=mod go build -trimpath -tags=selinux,notest,grpcnotrace -ldflags="$ldf" \
  -o "$out/" k8s.io/kubernetes/cmd/kubelet) || fail "go build of the kubelet ${K8S_VERSION}"
GOBIN="$out" go install -trimpath -ldflags="-s -w" -tags no_btrfs,no_devmapper,no_zfs \
  "github.com/containerd/containerd/v2/cmd/containerd@${CONTAINERD_VERSION}" \
  "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@${CONTAINERD_VERSION}" \
  "github.com/containerd/containerd/v2/cmd/ctr@${CONTAINERD_VERSION}" || fail "go install of containerd ${CONTAINERD_VERSION}"
# The sandbox image: Kubernetes' own pause.c, static, alone in an image.
kmod="$(cd "$here/k8s" && GOFLAGS=-mod=mod go list -m -f '{{.Dir}}' k8s.io/kubernetes)"
[ -f "$kmod/build/pause/linux/pause.c" ] || fail "finding build/pause/linux/pause.c in $kmod"
gcc -Os -static -o "$out/pause" "$kmod/build/pause/linux/pause.c" || fail "gcc -static of pause.c"
python3 "$here/oci_image.py" --out "$out/pause.tar" --name "registry.k8s.io/pause:testbed" \
  --user 65535:65535 --entrypoint /pause "$out/pause=/pause:0755" || fail "writing the pause image"
"$out/kubelet" --version | grep -qx "Kubernetes ${K8S_VERSION}" || fail "version check of the kubelet"
"$out/containerd" --version | grep -q " ${CONTAINERD_VERSION#v}" || fail "version check of containerd"
touch "$out/.complete"
echo "testbed build-node: done in $(( $(date +%s) - start ))s, $(du -sh "$out" | cut -f1) in $out" >&2
echo "$out"
