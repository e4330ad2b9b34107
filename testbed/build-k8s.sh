#!/usr/bin/env bash
# Builds kube-apiserver, kube-controller-manager, kube-scheduler, kubectl and
# etcd from the Go module proxy through the wrapper module beside this script,
# then kwok and helm with `go install`. Output goes to a directory keyed by
# every version involved, so a second run is a no-op and a version bump
# builds afresh. Prints the directory on its last line.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
. "$here/versions.env"
export GOTOOLCHAIN=local CGO_ENABLED=0 GOWORK=off
gover="$(go env GOVERSION)"
out="${MODELSERVE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/modelserve}/testbed-k8s-${K8S_VERSION}-kwok-${KWOK_VERSION}-helm-${HELM_VERSION}-${gover}"

have() { [ -x "$out/$1" ]; }
if have kube-apiserver && have kube-controller-manager && have kube-scheduler && have kubectl \
   && have etcd && have kwok && have helm && [ -f "$out/.complete" ]; then
  echo "$out"; exit 0
fi
mkdir -p "$out"
minor="$(echo "$K8S_VERSION" | cut -d. -f2)"
ldf="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldf+=" -X $p.gitVersion=${K8S_VERSION} -X $p.gitMajor=1 -X $p.gitMinor=${minor} -X $p.gitTreeState=clean"
done
fail() { echo "testbed build: $1 failed; see the output above. If a module is missing from the proxy, the first '404'/'410' line names it." >&2; exit 1; }

start=$(date +%s)
(cd "$here/k8s" && GOFLAGS=-mod=mod go build -trimpath -tags=selinux,notest,grpcnotrace -ldflags="$ldf" -o "$out/" \
  k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl) || fail "go build of the Kubernetes ${K8S_VERSION} components"
# etcd at exactly the version this Kubernetes release links (the wrapper's graph pins it).
(cd "$here/k8s" && GOFLAGS=-mod=mod go build -trimpath -ldflags="-s -w" -o "$out/etcd" go.etcd.io/etcd/server/v3) \
  || fail "go build of etcd"
GOBIN="$out" go install "sigs.k8s.io/kwok/cmd/kwok@${KWOK_VERSION}" || fail "go install of kwok ${KWOK_VERSION}"
GOBIN="$out" go install "helm.sh/helm/v4/cmd/helm@${HELM_VERSION}" || fail "go install of helm ${HELM_VERSION}"
"$out/kube-apiserver" --version | grep -qx "Kubernetes ${K8S_VERSION}" || fail "version check of kube-apiserver"
touch "$out/.complete"
echo "testbed build: done in $(( $(date +%s) - start ))s, $(du -sh "$out" | cut -f1) in $out" >&2
echo "$out"
