#!/usr/bin/env bash
# A real node beside the kwok nodes: containerd (runc, CNI bridge) and a kubelet, joined to the
# test bed's control plane. Called by scripts/testbed; by hand:
#
#   testbed/real-node.sh up   STATE BIN    start it (STATE: the test bed's state dir, BIN: its binaries)
#   testbed/real-node.sh down STATE        stop it and remove every mount, cgroup, bridge and file it made
#
# The node is named $TESTBED_REAL_NODE (default testbed-real), labelled type=real and tainted
# modelserve.dev/real-node=true:NoSchedule, so only pods that tolerate it land there. Its pods get
# addresses of $TESTBED_REAL_POD_CIDR on the bridge $TESTBED_REAL_BRIDGE, in network namespaces
# that containerd creates; nothing is routed off the machine. The bridge's own address (the
# first of the range, in STATE/node-NAME/gateway) is where the pods reach services of the host. The kubelet listens on 127.0.0.1
# only and allows anonymous requests (test bed only: the API server has no client certificate).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
NODE="${TESTBED_REAL_NODE:-testbed-real}"
CIDR="${TESTBED_REAL_POD_CIDR:-10.213.0.0/24}"
BRIDGE="${TESTBED_REAL_BRIDGE:-msbr0}"
KUBELET_PORT="${TESTBED_KUBELET_PORT:-10250}"
CGROUP_ROOT="/modelserve-testbed-$NODE"
TAINT="modelserve.dev/real-node"
HOSTS_MARK="# modelserve test bed node"

say() { echo "testbed real node: $*" >&2; }
die() { say "$*"; exit 1; }

alive() { local f="$1/$2.pid"; [ -f "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null; }

stop() { # pidfile
  [ -f "$1" ] || return 0
  local pid; pid="$(cat "$1")"
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$1"
}

# The v1 hierarchies (or the one v2 hierarchy) the kubelet's cgroups live in; with "all", also
# the v2 hierarchy of a hybrid host, where the runtime makes them too.
hierarchies() {
  if [ -f /sys/fs/cgroup/cgroup.controllers ]; then echo /sys/fs/cgroup; return; fi
  local d
  for d in /sys/fs/cgroup/*/; do
    d="${d%/}"
    [ "$(basename "$d")" = unified ] && [ "${1:-}" != all ] && continue
    mountpoint -q "$d" && echo "$d"
  done
}

cmd_up() {
  local state="$1" bin="$2"
  local dir="$state/node-$NODE" nodebin
  nodebin="$(bash "$here/build-node.sh" | tail -n 1)" || die "building the kubelet and containerd failed"
  command -v runc >/dev/null || die "runc is missing: apt-get install runc"
  [ -x /usr/lib/cni/bridge ] || die "the CNI plugins are missing: apt-get install containernetworking-plugins"
  mkdir -p "$dir"/{containerd/root,containerd/state,kubelet,pki,cni/net.d,cni/ipam,logs}
  echo "$nodebin" >"$dir/bin"
  [ -d /run/netns ] || touch "$dir/made-run-netns"  # the CNI plugins create it for the pods
  local sock="$dir/containerd/containerd.sock"

  # The bridge and its gateway address exist before the first pod (the CNI plugin takes them as
  # they are), so that a service of the test bed can listen on the gateway for the pods: they
  # reach the host there, and nothing else off their namespace.
  local gateway="${CIDR%.*}.1" prefix="${CIDR#*/}"
  ip link show "$BRIDGE" >/dev/null 2>&1 || ip link add "$BRIDGE" type bridge || die "creating the bridge $BRIDGE"
  ip addr show dev "$BRIDGE" | grep -q "inet $gateway/$prefix " || ip addr add "$gateway/$prefix" dev "$BRIDGE" \
    || die "giving $BRIDGE the address $gateway/$prefix"
  ip link set "$BRIDGE" up || die "bringing $BRIDGE up"
  echo "$gateway" >"$dir/gateway"
  cat >"$dir/cni/net.d/10-testbed.conflist" <<EOF
{"cniVersion": "1.0.0", "name": "testbed-$NODE", "plugins": [
  {"type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "dataDir": "$dir/cni/ipam", "ranges": [[{"subnet": "$CIDR"}]],
            "routes": [{"dst": "0.0.0.0/0"}]}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}
EOF
  # restrict_oom_score_adj: root here lacks CAP_SYS_RESOURCE, and the pause container's -998
  # would fail every sandbox. The sandbox image is the pause image build-node.sh made.
  cat >"$dir/containerd/config.toml" <<EOF
version = 3
root = "$dir/containerd/root"
state = "$dir/containerd/state"
[grpc]
  address = "$sock"
[ttrpc]
  address = "$sock.ttrpc"
[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = "registry.k8s.io/pause:testbed"
[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = "$dir/cni/net.d"
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
    BinaryName = "$(command -v runc)"
[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
EOF
  PATH="$nodebin:$PATH" "$nodebin/containerd" --config "$dir/containerd/config.toml" \
    >"$dir/logs/containerd.log" 2>&1 &
  echo $! >"$dir/containerd.pid"
  local deadline=$(( $(date +%s) + 30 ))
  until "$nodebin/ctr" --address "$sock" version >/dev/null 2>&1; do
    alive "$dir" containerd || die "containerd exited; its log: $dir/logs/containerd.log"
    [ "$(date +%s)" -lt "$deadline" ] || die "containerd did not answer within 30s; its log: $dir/logs/containerd.log"
    sleep 0.3
  done
  "$nodebin/ctr" --address "$sock" -n k8s.io images import "$nodebin/pause.tar" >/dev/null \
    || die "importing the pause image failed"

  # kubectl logs/exec reach the kubelet through the API server, which dials the node's name (a
  # kubelet refuses a loopback node IP): the name maps to the loopback address the kubelet serves on.
  grep -q " $NODE $HOSTS_MARK\$" /etc/hosts || echo "127.0.0.1 $NODE $HOSTS_MARK" >>/etc/hosts

  # The kubelet's own cgroup root, in every hierarchy, so that down removes exactly its cgroups.
  local h
  for h in $(hierarchies); do mkdir -p "$h$CGROUP_ROOT"; done
  [ -d /sys/fs/cgroup/cpuset ] && [ ! -f /sys/fs/cgroup/cgroup.controllers ] && {
    cat /sys/fs/cgroup/cpuset/cpuset.cpus >"/sys/fs/cgroup/cpuset$CGROUP_ROOT/cpuset.cpus"
    cat /sys/fs/cgroup/cpuset/cpuset.mems >"/sys/fs/cgroup/cpuset$CGROUP_ROOT/cpuset.mems"
  }
  cat >"$dir/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: $KUBELET_PORT
readOnlyPort: 0
healthzPort: 0
containerRuntimeEndpoint: unix://$sock
cgroupDriver: cgroupfs
cgroupRoot: $CGROUP_ROOT
failCgroupV1: false
failSwapOn: false
authentication: {anonymous: {enabled: true}, webhook: {enabled: false}}
authorization: {mode: AlwaysAllow}
registerWithTaints: [{key: $TAINT, value: "true", effect: NoSchedule}]
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%}
imageGCHighThresholdPercent: 100
serializeImagePulls: false
resolvConf: ""
podLogsDir: $dir/pod-logs
EOF
  "$nodebin/kubelet" --config="$dir/kubelet.yaml" --kubeconfig="$state/kubeconfig" \
    --hostname-override="$NODE" --root-dir="$dir/kubelet" --cert-dir="$dir/pki" \
    --node-labels="type=real,kubernetes.io/hostname=$NODE" \
    >"$dir/logs/kubelet.log" 2>&1 &
  echo $! >"$dir/kubelet.pid"
  deadline=$(( $(date +%s) + 90 ))
  until KUBECONFIG="$state/kubeconfig" "$bin/kubectl" wait --for=condition=Ready "node/$NODE" --timeout=2s >/dev/null 2>&1; do
    alive "$dir" kubelet || die "the kubelet exited; its log: $dir/logs/kubelet.log"
    [ "$(date +%s)" -lt "$deadline" ] || die "node $NODE was not Ready within 90s; its log: $dir/logs/kubelet.log"
    sleep 0.5
  done
  say "node $NODE Ready (containerd $sock, pods in $CIDR on $BRIDGE)"
}

cmd_down() {
  local state="$1"
  local dir="$state/node-$NODE"
  [ -d "$dir" ] || return 0
  local nodebin kubectl=""
  nodebin="$(cat "$dir/bin" 2>/dev/null || true)"
  [ -f "$state/bin" ] && kubectl="$(cat "$state/bin")/kubectl"
  local sock="$dir/containerd/containerd.sock" api=false
  if [ -n "$kubectl" ] && KUBECONFIG="$state/kubeconfig" "$kubectl" get --raw /readyz >/dev/null 2>&1; then api=true; fi
  # The pods first, while the kubelet still runs to stop their containers.
  if $api && alive "$dir" kubelet; then
    KUBECONFIG="$state/kubeconfig" "$kubectl" delete pods -A --field-selector "spec.nodeName=$NODE" \
      --wait=false >/dev/null 2>&1 || true
    local deadline=$(( $(date +%s) + 60 ))
    while [ -n "$("$nodebin/ctr" --address "$sock" -n k8s.io tasks ls -q 2>/dev/null)" ] && [ "$(date +%s)" -lt "$deadline" ]; do
      sleep 0.5
    done
  fi
  stop "$dir/kubelet.pid"
  if $api; then
    KUBECONFIG="$state/kubeconfig" "$kubectl" delete node "$NODE" --wait=false >/dev/null 2>&1 || true
    KUBECONFIG="$state/kubeconfig" "$kubectl" delete lease -n kube-node-lease "$NODE" >/dev/null 2>&1 || true
  fi
  # Whatever the kubelet left running: kill the tasks, then remove their sandboxes' network.
  if [ -n "$nodebin" ] && alive "$dir" containerd; then
    local t
    for t in $("$nodebin/ctr" --address "$sock" -n k8s.io tasks ls -q 2>/dev/null); do
      "$nodebin/ctr" --address "$sock" -n k8s.io tasks kill -s SIGKILL "$t" >/dev/null 2>&1 || true
    done
    sleep 1
  fi
  stop "$dir/containerd.pid"
  # Shims outlive containerd: stop those of this node (their command line names its state dir).
  pkill -9 -f "containerd-shim-runc-v2 .*-address $sock" 2>/dev/null || true
  # Mounts under the node's directories, deepest first.
  local m
  while read -r m; do umount -l "$m" 2>/dev/null || true; done < <(
    awk -v d="$dir" 'index($2, d) == 1 {print $2}' /proc/self/mounts | sort -r)
  # Network namespaces containerd made for the pods (bind mounts under its state) are gone with
  # their mounts; the bridge is this node's own.
  ip link delete "$BRIDGE" 2>/dev/null || true
  # libcni caches each attachment's result under /var/lib/cni, named after the network.
  rm -f /var/lib/cni/results/"testbed-$NODE"-* 2>/dev/null || true
  rmdir /var/lib/cni/results /var/lib/cni 2>/dev/null || true
  # The cgroups: deepest first; empty once the tasks are gone.
  local h c
  for h in $(hierarchies all); do
    [ -d "$h$CGROUP_ROOT" ] || continue
    while read -r c; do rmdir "$c" 2>/dev/null || true; done < <(find "$h$CGROUP_ROOT" -depth -type d)
  done
  # Our line of /etc/hosts only, in place (it may be a bind mount that cannot be replaced).
  if grep -q " $NODE $HOSTS_MARK\$" /etc/hosts; then
    local kept; kept="$(grep -v " $NODE $HOSTS_MARK\$" /etc/hosts)"
    printf '%s\n' "$kept" >/etc/hosts
  fi
  # Made by the CNI plugins for the first pod, if one ran; removed only if it was not there before.
  if [ -f "$dir/made-run-netns" ]; then rmdir /run/netns 2>/dev/null || true; fi
  rm -rf "$dir"
  say "node $NODE removed"
}

case "${1:-}" in
  up) cmd_up "${2:?state dir}" "${3:?binaries dir}" ;;
  down) cmd_down "${2:?state dir}" ;;
  *) echo "usage: testbed/real-node.sh up STATE BIN | down STATE" >&2; exit 2 ;;
esac
