#!/usr/bin/env bash
# Stops what up.sh started and undoes its changes to the host: the pods' containers, the
# processes, the pod bridge, kube-proxy's and kube-router's rules, the node address
# on lo, the sysctls. Keeps the cached binaries, the certificates and containerd's images
# (the next up.sh is quick). `down.sh --reset` also forgets the cluster's objects (etcd's data,
# the kubelet's pods), so the next up.sh starts an empty cluster on the same certificates and
# images; `down.sh --purge` removes the whole state directory.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/versions.sh"
source "$here/common.sh"
[[ $EUID -eq 0 ]] || die "down.sh must run as root"

stop_process() {  # name: SIGTERM, then SIGKILL after 20 s, to the process group up.sh started
    local pid
    pid="$(awk -v n="$1" '$1 == n {print $2}' "$RUN/pids" 2>/dev/null | tail -1)"
    [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null || return 0
    kill -TERM -- "-$pid" 2>/dev/null
    for _ in $(seq 20); do kill -0 "$pid" 2>/dev/null || return 0; sleep 1; done
    kill -KILL -- "-$pid" 2>/dev/null
}

say "stopping"
# The kubelet first, so it does not restart the containers removed next.
stop_process kubelet
if [[ -S "$CONTAINERD_SOCK" ]]; then
    # Every task of the k8s.io namespace, then its containers (the images stay).
    for c in $(ctr_k8s containers ls -q 2>/dev/null); do
        ctr_k8s tasks kill -s SIGKILL "$c" >/dev/null 2>&1
    done
    sleep 2
    for c in $(ctr_k8s containers ls -q 2>/dev/null); do
        ctr_k8s tasks delete -f "$c" >/dev/null 2>&1
        ctr_k8s containers delete "$c" >/dev/null 2>&1
    done
fi
for name in kube-router metrics-server kube-proxy kube-scheduler kube-controller-manager kube-apiserver containerd etcd; do
    stop_process "$name"
done
# Shims left behind by a killed containerd (their command line names our socket).
for pid in $(pgrep -f "containerd-shim-runc-v2 .*-address $CONTAINERD_SOCK" 2>/dev/null); do
    kill -KILL "$pid" 2>/dev/null
done

# Network namespaces of pods (CNI's), the pod bridge, the rules.
for ns in $(ip netns list 2>/dev/null | awk '/^cni-/ {print $1}'); do ip netns delete "$ns"; done
ip link show "$POD_BRIDGE" >/dev/null 2>&1 && ip link delete "$POD_BRIDGE"
rm -rf "$STATE/cni" /var/lib/cni/results/omni-pods-* 2>/dev/null
if command -v iptables >/dev/null; then
    # kube-proxy's own chains (its --cleanup removes them), for IPv4 and IPv6.
    [[ -x "$BIN/kube-proxy" ]] && "$BIN/kube-proxy" --cleanup >/dev/null 2>&1
    # The kubelet's own: KUBE-FIREWALL (drops outside packets to 127/8), its canaries, the hint.
    for tool in iptables ip6tables; do
        for hook in INPUT OUTPUT; do
            while "$tool" -t filter -D "$hook" -j KUBE-FIREWALL 2>/dev/null; do :; done
        done
        for table in filter nat mangle; do
            for chain in KUBE-FIREWALL KUBE-KUBELET-CANARY KUBE-IPTABLES-HINT; do
                "$tool" -t "$table" -F "$chain" 2>/dev/null && "$tool" -t "$table" -X "$chain" 2>/dev/null
            done
        done
    done
fi
# kube-router's chains and ipsets (it removes its own rules, and only those)
[[ -x "$BIN/kube-router" ]] && "$BIN/kube-router" --cleanup-config >/dev/null 2>&1
if command -v nft >/dev/null; then
    for table in kube-proxy; do
        for family in inet ip ip6; do nft delete table "$family" "$table" 2>/dev/null; done
    done
fi
ip addr del "$NODE_IP/32" dev lo 2>/dev/null
if [[ -f "$STATE/sysctl.saved" ]]; then
    sysctl -q -p "$STATE/sysctl.saved" >/dev/null 2>&1
    rm -f "$STATE/sysctl.saved"
fi
# Mounts of pods (volumes, the rootfs of containers) left under our directories.
for dir in "$STATE/kubelet" "$STATE/containerd" "$RUN"; do
    grep -o " $dir[^ ]*" /proc/mounts | sort -r | while read -r m; do umount -l "$m" 2>/dev/null; done
done
rm -rf "$RUN"
case "${1:-}" in
    --purge) rm -rf "$STATE"; say "removed $STATE" ;;
    --reset) rm -rf "$STATE/etcd" "$STATE/kubelet" "$STATE/pod-logs"; say "the cluster's objects removed" ;;
    "") ;;
    *) die "unknown option $1 (--reset, --purge)" ;;
esac
say "down"
