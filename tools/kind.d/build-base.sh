#!/usr/bin/env bash
# Spike: kind's base image (images/base/Dockerfile of sigs.k8s.io/kind) rebuilt from Debian bookworm packages
# with mmdebstrap: containerd, runc and the CNI plugins from Debian instead of kind's builds from source.
# usage: build-base.sh KIND_MODULE_DIR OUT_TAR
set -euo pipefail
kmod=$1 out=$2
files=$kmod/images/base/files
PKGS=systemd,systemd-sysv,dbus,conntrack,iptables,nftables,iproute2,ethtool,util-linux,mount,kmod,libseccomp2,pigz,fuse-overlayfs,e2fsprogs,bash,ca-certificates,curl,jq,procps,containerd,runc,containernetworking-plugins,busybox-static
nice -n 10 mmdebstrap --variant=minbase --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
  --include="$PKGS" \
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
  --customize-hook="install -m0755 $files/usr/local/bin/* \"\$1/usr/local/bin/\"" \
  --customize-hook="mkdir -p \"\$1/kind/bin\" && cp -r $files/kind/. \"\$1/kind/\" && chmod 0755 \"\$1\"/kind/bin/*" \
  --customize-hook="cp $files/etc/crictl.yaml \"\$1/etc/\" && mkdir -p \"\$1/etc/containerd\" && cp $files/etc/containerd/* \"\$1/etc/containerd/\"" \
  --customize-hook="cp $files/etc/default/* \"\$1/etc/default/\" && cp $files/etc/sysctl.d/* \"\$1/etc/sysctl.d/\"" \
  --customize-hook="cp -r $files/etc/systemd/system/. \"\$1/etc/systemd/system/\"" \
  --customize-hook='chmod -R u+w,go+rX "$1/kind" "$1/etc/systemd/system" "$1/etc/containerd" "$1/etc/default" "$1/etc/sysctl.d" "$1/etc/crictl.yaml"' \
  --customize-hook='ln -sf /usr/bin/containerd "$1/usr/local/bin/containerd"; ln -sf /usr/bin/ctr "$1/usr/local/bin/ctr"; ln -sf /usr/bin/containerd-shim-runc-v2 "$1/usr/local/bin/containerd-shim-runc-v2"; mkdir -p "$1/usr/local/sbin"; ln -sf /usr/sbin/runc "$1/usr/local/sbin/runc"' \
  --customize-hook='mkdir -p "$1/opt/cni"; rm -rf "$1/opt/cni/bin"; ln -s /usr/lib/cni "$1/opt/cni/bin"' \
  --customize-hook='chroot "$1" sh -c "ctr oci spec | jq \".hooks.createContainer[.hooks.createContainer| length] |= . + {\\\"path\\\": \\\"/kind/bin/mount-product-files.sh\\\"}\" | jq \"del(.process.rlimits)\" > /etc/containerd/cri-base.json"' \
  --customize-hook='chroot "$1" sh -c "find /lib/systemd/system/sysinit.target.wants/ -name systemd-tmpfiles-setup.service -delete; rm -f /lib/systemd/system/multi-user.target.wants/* /etc/systemd/system/*.wants/* /lib/systemd/system/local-fs.target.wants/* /lib/systemd/system/sockets.target.wants/*udev* /lib/systemd/system/sockets.target.wants/*initctl* /lib/systemd/system/basic.target.wants/*; echo ReadKMsg=no >> /etc/systemd/journald.conf; ln -sf /usr/lib/systemd/systemd /sbin/init"' \
  --customize-hook='chroot "$1" sh -c "systemctl enable kubelet.service containerd.service undo-mount-hacks.service; systemctl mask systemd-binfmt.service; mkdir -p /etc/kubernetes/manifests"' \
  --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
  bookworm "$out" \
  "deb http://deb.debian.org/debian bookworm main" "deb http://deb.debian.org/debian bookworm-updates main" \
  "deb http://deb.debian.org/debian-security bookworm-security main"
