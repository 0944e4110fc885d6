#!/usr/bin/env bash
# Spike step 2: run the kind-like base image the way kind's podman provider runs a node
# (sigs.k8s.io/kind@v0.33.0 pkg/cluster/internal/providers/podman/provision.go), then check
# systemd, containerd and a nested container. Removes everything it creates (container, volume, network)
# and restores net.ipv4.ip_forward. Run under: flock /work/notes/node.lock
set -uo pipefail
export CONTAINERS_CONF=${CONTAINERS_CONF:-$HOME/.cache/hubshift/kind-v0.33.0/containers.conf}
IMAGE=${1:-localhost/hubshift-kind-base:spike}
ARCHIVE=${2:-$HOME/.cache/hubshift/kind-v0.33.0/work/busybox.oci.tar}
NAME=hubshift-kind-spike NET=hubshift-kind-spike VOL=hubshift-kind-spike-var
fwd=$(cat /proc/sys/net/ipv4/ip_forward) fwd6=$(cat /proc/sys/net/ipv6/conf/all/forwarding)
cleanup() {
  echo "--- cleanup"
  podman rm -f -t 5 "$NAME" >/dev/null 2>&1
  podman volume rm -f "$VOL" >/dev/null 2>&1
  podman network rm -f "$NET" >/dev/null 2>&1; "$(dirname "$0")/netavark-clean.sh" || true
  echo "$fwd" >/proc/sys/net/ipv4/ip_forward; echo "$fwd6" >/proc/sys/net/ipv6/conf/all/forwarding
  podman ps -a --format '{{.Names}}' | grep -c hubshift-kind || true
}
trap cleanup EXIT
x() { echo "+ $*"; "$@"; }
x podman network create -d=bridge "$NET"
x podman volume create "$VOL"
x podman run --name "$NAME" --detach --tty --net "$NET" --label io.x-k8s.kind.cluster=spike \
  -e container=podman --cgroupns=private \
  --hostname "$NAME" --label io.x-k8s.kind.role=control-plane --privileged \
  --tmpfs /tmp --tmpfs /run --volume "$VOL:/var:suid,exec,dev" --volume /lib/modules:/lib/modules:ro \
  -e KIND_EXPERIMENTAL_CONTAINERD_SNAPSHOTTER \
  --publish=127.0.0.1:46443:6443/tcp -e KUBECONFIG=/etc/kubernetes/admin.conf "$IMAGE" || exit 1
for i in $(seq 1 60); do
  s=$(podman exec "$NAME" systemctl is-system-running 2>/dev/null)
  case $s in running|degraded) break ;; esac
  sleep 1
done
echo "systemctl is-system-running after ${i}s: $s"
echo "--- podman logs (entrypoint + systemd)"; podman logs "$NAME" 2>&1 | tail -n 40
x podman exec "$NAME" cat /proc/1/cgroup
x podman exec "$NAME" sh -c 'systemctl --failed --no-pager; systemctl status containerd --no-pager | head -n 12'
x podman exec "$NAME" ctr version
x podman cp "$ARCHIVE" "$NAME:/tmp/busybox.oci.tar"
x podman exec "$NAME" ctr -n spike images import /tmp/busybox.oci.tar
x podman exec "$NAME" ctr -n spike images ls -q
x podman exec "$NAME" ctr -n spike run --rm localhost/spike/busybox:1 t1
x podman exec "$NAME" ctr -n spike run --rm --runc-systemd-cgroup localhost/spike/busybox:1 t2 /bin/busybox sh -c 'echo systemd-cgroup ok; cat /proc/self/cgroup | head -3'
x podman exec "$NAME" sh -c 'journalctl -u containerd --no-pager | tail -n 15'
