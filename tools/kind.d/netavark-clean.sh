#!/usr/bin/env bash
# Removes the iptables chains netavark (podman's network backend) leaves behind once its last container
# is gone (IPv4 and IPv6: kind's network has both), then the empty iptables-nft tables.
# Refuses while any podman container exists.
set -euo pipefail
if [ -n "$(podman ps -aq)" ]; then echo "netavark-clean: podman containers exist; not touching iptables" >&2; exit 1; fi
for ipt in iptables ip6tables; do
  for t in filter nat; do
    "$ipt" -t "$t" -S | { grep -E '^-A (PREROUTING|OUTPUT|POSTROUTING|FORWARD|INPUT) .*NETAVARK' || true; } |
      while read -r _ chain rest; do eval "$ipt -t $t -D $chain $rest"; done
    for c in $("$ipt" -t "$t" -S | sed -n 's/^-N \(NETAVARK.*\)/\1/p'); do "$ipt" -t "$t" -F "$c"; done
    for c in $("$ipt" -t "$t" -S | sed -n 's/^-N \(NETAVARK.*\)/\1/p'); do "$ipt" -t "$t" -X "$c"; done
  done
done
# iptables-nft leaves its tables behind, empty: delete them if they hold no rule.
for fam in ip ip6; do
  for t in nat filter; do
    if nft list table "$fam" "$t" >/dev/null 2>&1 &&
       ! nft list table "$fam" "$t" 2>/dev/null | grep -qE '^\s+(jump|counter|ip |ip6 |meta |ct |tcp |udp |fib |accept|drop|masquerade|dnat|snat|mark|return)'; then
      nft delete table "$fam" "$t"
    fi
  done
done
