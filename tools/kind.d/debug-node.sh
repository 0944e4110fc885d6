#!/usr/bin/env bash
# Spike: a node container as kind runs it (no kubeadm), kept for $2 seconds for experiments, then removed.
# Run under: flock /work/notes/node.lock
set -uo pipefail
export CONTAINERS_CONF=${CONTAINERS_CONF:-$HOME/.cache/hubshift/kind-v0.33.0/containers.conf}
IMAGE=$1 KEEP=${2:-300}
NAME=hubshift-kind-debug VOL=hubshift-kind-debug-var
fwd=$(cat /proc/sys/net/ipv4/ip_forward) fwd6=$(cat /proc/sys/net/ipv6/conf/all/forwarding)
cleanup() {
  podman rm -f -t 2 "$NAME" >/dev/null 2>&1; podman volume rm -f "$VOL" >/dev/null 2>&1
  "$(dirname "$0")/netavark-clean.sh" || true
  echo "$fwd" >/proc/sys/net/ipv4/ip_forward; echo "$fwd6" >/proc/sys/net/ipv6/conf/all/forwarding
  echo "debug node removed"
}
trap cleanup EXIT
podman volume create "$VOL" >/dev/null
podman run --name "$NAME" --detach --tty --net none -e container=podman --cgroupns=private \
  --hostname "$NAME" --privileged --tmpfs /tmp --tmpfs /run --volume "$VOL:/var:suid,exec,dev" \
  --volume /lib/modules:/lib/modules:ro "$IMAGE" >/dev/null || exit 1
echo "debug node up"
sleep "$KEEP"
