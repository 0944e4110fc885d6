#!/usr/bin/env bash
# Spike: the images a kind node preloads (kubeadm's control plane, kube-proxy, etcd, pause, coredns),
# made from Go-module binaries with buildah into OCI archives named as kubeadm v1.34 expects them.
# usage: build-images.sh OUT_DIR CP_BIN NODE_BIN [COREDNS_BIN]
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
source "$repo/tools/kube/versions"
out=$1 cp_bin=$2 node_bin=$3 coredns_bin=${4:-}
mkdir -p "$out"
B() { buildah --root "$out/storage" --runroot "$out/run" "$@"; }
kv=$KUBERNETES_VERSION
push() { B push --quiet "$1" "oci-archive:$out/$2.oci.tar:$1"; echo "$out/$2.oci.tar $1"; }
PATHENV=PATH=/usr/local/bin:/usr/local/sbin:/usr/bin:/usr/sbin:/bin:/sbin

# pause: the repository's pause.c, static, from scratch (as tools/image builds the node tier's)
gcc -static -Os -s -o "$out/pause" "$repo/tools/images/pause/pause.c"
c=$(B from --quiet scratch); B copy --quiet "$c" "$out/pause" /pause
B config --entrypoint '["/pause"]' --user 65535:65535 "$c"; B commit --quiet --rm "$c" registry.k8s.io/pause:3.10.1 >/dev/null
push registry.k8s.io/pause:3.10.1 pause

# control plane from scratch: kubeadm's static pods run `command: [kube-apiserver, ...]`, found on PATH
for n in kube-apiserver kube-controller-manager kube-scheduler; do
  c=$(B from --quiet scratch); B copy --quiet "$c" "$cp_bin/$n" /usr/local/bin/$n
  B config --env "$PATHENV" --entrypoint "[\"/usr/local/bin/$n\"]" "$c"
  B commit --quiet --rm "$c" "registry.k8s.io/$n:$kv" >/dev/null; push "registry.k8s.io/$n:$kv" "$n"
done
c=$(B from --quiet scratch); B copy --quiet "$c" "$cp_bin/etcd" /usr/local/bin/etcd
B config --env "$PATHENV" --entrypoint '["/usr/local/bin/etcd"]' "$c"
B commit --quiet --rm "$c" registry.k8s.io/etcd:3.6.5-0 >/dev/null; push registry.k8s.io/etcd:3.6.5-0 etcd

# kube-proxy needs iptables/nft and conntrack: Debian minbase with them
if [ ! -f "$out/proxy-rootfs.tar" ]; then
  nice -n 10 mmdebstrap --quiet --variant=minbase --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
    --include=iptables,nftables,conntrack,ipset,kmod --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
    bookworm "$out/proxy-rootfs.tar" "deb http://deb.debian.org/debian bookworm main" \
    "deb http://deb.debian.org/debian-security bookworm-security main"
fi
c=$(B from --quiet scratch); B add --quiet "$c" "$out/proxy-rootfs.tar" / >/dev/null
B copy --quiet "$c" "$node_bin/kube-proxy" /usr/local/bin/kube-proxy
B config --env "$PATHENV" --entrypoint '["/usr/local/bin/kube-proxy"]' "$c"
B commit --quiet --rm "$c" "registry.k8s.io/kube-proxy:$kv" >/dev/null; push "registry.k8s.io/kube-proxy:$kv" kube-proxy

if [ -n "$coredns_bin" ]; then
  c=$(B from --quiet scratch); B copy --quiet "$c" "$coredns_bin" /coredns
  B config --entrypoint '["/coredns"]' "$c"
  B commit --quiet --rm "$c" registry.k8s.io/coredns/coredns:v1.12.1 >/dev/null; push registry.k8s.io/coredns/coredns:v1.12.1 coredns
fi
