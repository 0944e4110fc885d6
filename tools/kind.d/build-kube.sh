#!/usr/bin/env bash
# Spike: kubeadm v$KUBERNETES_VERSION from the tools/kube/kind wrapper, with tools/control-plane's flags and
# Go caches (so the packages it shares with the control plane and the node compile once).
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
source "$repo/tools/kube/versions"
cache=${HUBSHIFT_CACHE:-$HOME/.cache/hubshift}
out=$1; mkdir -p "$out"
kv=$KUBERNETES_VERSION; kminor=${kv#v1.}; kminor=${kminor%%.*}
kx="-X k8s.io/component-base/version.gitVersion=$kv -X k8s.io/component-base/version.gitMajor=1"
kx+=" -X k8s.io/component-base/version.gitMinor=$kminor -X k8s.io/component-base/version.gitTreeState=clean"
kx+=" -X k8s.io/component-base/version.buildDate=1970-01-01T00:00:00Z"
kx+=" -X k8s.io/client-go/pkg/version.gitVersion=$kv -X k8s.io/client-go/pkg/version.gitMajor=1"
kx+=" -X k8s.io/client-go/pkg/version.gitMinor=$kminor"
cd "$repo/tools/kube/kind"
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false" GOMODCACHE=$cache/go/mod GOCACHE=$cache/go/build
go mod download
nice -n 10 go build -trimpath -ldflags "-s -w $kx" -tags selinux,notest -o "$out/" k8s.io/kubernetes/cmd/kubeadm
