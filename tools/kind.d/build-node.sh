#!/usr/bin/env bash
# Spike: a kind node image = the base image + kubeadm/kubelet/kubectl + the preloaded images (imported
# into the node's containerd, namespace k8s.io, not unpacked: what `kind build node-image` does), with
# podman. Run under: flock /work/notes/node.lock
# usage: build-node.sh BASE_IMAGE NODE_IMAGE KUBE_VERSION IMAGES_DIR KUBEADM KUBELET KUBECTL
set -euo pipefail
base=$1 node=$2 kv=$3 imgs=$4 kubeadm=$5 kubelet=$6 kubectl=$7
export CONTAINERS_CONF=${CONTAINERS_CONF:-$HOME/.cache/hubshift/kind-v0.33.0/containers.conf}
here=$(cd "$(dirname "$0")" && pwd)
b=hubshift-kind-build
trap 'podman rm -f -t 0 $b >/dev/null 2>&1 || true' EXIT
podman rm -f -t 0 $b >/dev/null 2>&1 || true
podman run -d --name $b --net none --privileged --entrypoint sleep "$base" infinity >/dev/null
podman cp "$kubeadm" $b:/usr/bin/kubeadm
podman cp "$kubelet" $b:/usr/bin/kubelet
podman cp "$kubectl" $b:/usr/bin/kubectl
podman exec $b sh -c "echo $kv > /kind/version && mkdir -p /kind/manifests /etc/cni/net.d"
podman cp "$here/node-files/default-cni.yaml" $b:/kind/manifests/default-cni.yaml
podman cp "$here/node-files/10-bridge.conflist" $b:/etc/cni/net.d/10-bridge.conflist
podman exec $b sed -i 's#sandbox_image = .*#sandbox_image = "registry.k8s.io/pause:3.10.1"#' /etc/containerd/config.toml
# This machine withholds CAP_SYS_RESOURCE even from root: runc cannot lower oom_score_adj (kubelet asks -998
# for static pods: "nsexec: failed to update /proc/self/oom_score_adj: Permission denied"). Clamp it, as
# tools/node does for the node tier.
podman exec $b sed -i 's#restrict_oom_score_adj = false#restrict_oom_score_adj = true#' /etc/containerd/config.toml
podman exec $b grep -n 'restrict_oom_score_adj\|sandbox_image' /etc/containerd/config.toml
podman exec $b mkdir -p /kind/images
for f in "$imgs"/*.oci.tar; do podman cp "$f" $b:/kind/images/; done
podman exec -d $b sh -c 'containerd >/tmp/containerd.log 2>&1'
for i in $(seq 1 30); do podman exec $b ctr version >/dev/null 2>&1 && break; sleep 1; done
podman exec $b sh -c 'for f in /kind/images/*.oci.tar; do ctr -n k8s.io images import --no-unpack "$f" || exit 1; done'
podman exec $b ctr -n k8s.io images ls -q
podman exec $b sh -c 'pkill -x containerd; sleep 2; rm -rf /kind/images /tmp/containerd.log'
podman stop -t 1 $b >/dev/null || true
podman commit --quiet \
  --change 'ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]' --change 'CMD []' \
  --change 'STOPSIGNAL SIGRTMIN+3' --change 'ENV container=docker' $b "$node"
podman inspect --format '{{json .Config.Entrypoint}} {{json .Config.Cmd}} {{.Config.StopSignal}}' "$node"
