#!/usr/bin/env bash
# Spike step 3: kind create cluster on podman with the node image built here, look at it, run a pod,
# delete it; leaves no container, network, volume or iptables rule behind. Run under: flock /work/notes/node.lock
# usage: spike-cluster.sh NODE_IMAGE [CONFIG] [keep-seconds]
set -uo pipefail
node_image=$1 config=${2:-} keep=${3:-0}
C=$HOME/.cache/hubshift/kind-v0.33.0
export PATH=$C/bin:$PATH KIND_EXPERIMENTAL_PROVIDER=podman CONTAINERS_CONF=${CONTAINERS_CONF:-$C/containers.conf}
here=$(cd "$(dirname "$0")" && pwd)
name=hubshift-spike kc=$C/work/kubeconfig
fwd=$(cat /proc/sys/net/ipv4/ip_forward) fwd6=$(cat /proc/sys/net/ipv6/conf/all/forwarding)
cleanup() {
  echo "--- cleanup"
  kind export logs "$C/work/kind-logs" --name "$name" >/dev/null 2>&1 || true
  kind delete cluster --name "$name" --kubeconfig "$kc" 2>&1
  podman network rm -f kind >/dev/null 2>&1 || true
  "$here/netavark-clean.sh" || true
  echo "$fwd" >/proc/sys/net/ipv4/ip_forward; echo "$fwd6" >/proc/sys/net/ipv6/conf/all/forwarding
  rm -f "$kc"
  echo "left: containers=$(podman ps -aq | wc -l) networks=$(podman network ls -q | grep -vc '^podman$') volumes=$(podman volume ls -q | wc -l) nft-lines=$(nft list ruleset | wc -l)"
}
trap cleanup EXIT
x() { echo "+ $*"; "$@"; }
start=$SECONDS
args=(create cluster --name "$name" --image "$node_image" --kubeconfig "$kc" --retain --wait 180s -v 1)
[ -n "$config" ] && args+=(--config "$config")
x kind "${args[@]}" 2>&1
rc=$?
echo "kind create cluster: rc=$rc in $((SECONDS - start)) s"
x podman ps -a --format '{{.Names}} {{.Status}} {{.Ports}}'
k() { echo "+ kubectl $*"; "$C/k/kubectl" --kubeconfig "$kc" "$@" 2>&1; }
k get nodes -o wide
k get pods -A -o wide
if [ "$rc" = 0 ]; then
  for i in $(seq 1 60); do "$C/k/kubectl" --kubeconfig "$kc" -n default get sa default >/dev/null 2>&1 && break; sleep 1; done
  k -n kube-system wait --for=condition=Ready pod --all --timeout=180s
  echo "kube-system Ready after $((SECONDS - start)) s"
  k get pods -A -o wide
  x kind load image-archive "$C/work/busybox.oci.tar" --name "$name" 2>&1
  k run spike-pod --image=localhost/spike/busybox:1 --image-pull-policy=Never --restart=Never -- /bin/busybox sh -c 'echo pod says hello; /bin/busybox ip -4 addr show eth0 | /bin/busybox grep inet; /bin/busybox nslookup kubernetes.default.svc.cluster.local; /bin/busybox nc -z -w 3 10.96.0.1 443 && echo "service 10.96.0.1:443 reachable (kube-proxy)"; /bin/busybox nc -z -w 3 kube-dns.kube-system.svc.cluster.local 53 && echo "kube-dns reachable by name"'
  k wait --for=jsonpath='{.status.phase}'=Succeeded pod/spike-pod --timeout=90s
  k logs spike-pod
  k get pods -A -o wide
  k get --raw /version
  x podman exec "$name-control-plane" sh -c 'ctr -n k8s.io images ls -q | grep -v sha256; ps -o pid,comm --no-headers -e | grep -E "kube|etcd|coredns|containerd$" | head -20'
  [ "$keep" -gt 0 ] && { echo "keeping the cluster for $keep s"; sleep "$keep"; }
else
  x podman exec "$name-control-plane" sh -c 'systemctl status kubelet --no-pager | head -n 20; journalctl -u kubelet --no-pager | tail -n 40; crictl ps -a 2>/dev/null || ctr -n k8s.io c ls'
fi
