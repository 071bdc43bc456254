#!/usr/bin/env bash
# Starts a one-node Kubernetes cluster on this machine, as root, from the binaries build.sh
# cached: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, containerd (runc),
# kubelet, kube-proxy (iptables), a bridge CNI network, metrics-server and kube-router's
# NetworkPolicy firewall; then imports the images into containerd. down.sh stops it all.
#
#   deploy/cluster/up.sh            # prints the kubeconfig path at the end
#   KUBECONFIG=$(deploy/cluster/up.sh --kubeconfig) kubectl get nodes
#
# What it changes on the host, all undone by down.sh: the node address 10.255.0.1/32 on lo
# (the node's InternalIP: the API server, the kubelet and metrics-server listen there, never
# on the host's own interfaces), the pod bridge omni-cni0 (10.244.0.0/24) the CNI plugin
# makes, kube-proxy's and kube-router's iptables rules and ipsets, net.ipv4.ip_forward
# (the bridge plugin sets it) and the sysctls the kubelet sets (vm.overcommit_memory,
# kernel.panic, kernel.panic_on_oops). Nothing listens on a non-loopback host address.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
# shellcheck source=deploy/cluster/versions.sh
source "$here/versions.sh"
# shellcheck source=deploy/cluster/common.sh
source "$here/common.sh"

if [[ "${1:-}" == "--kubeconfig" ]]; then echo "$KUBECONFIG_ADMIN"; exit 0; fi
[[ $EUID -eq 0 ]] || die "up.sh must run as root (it starts containerd and the kubelet)"

# --- what must be there -----------------------------------------------------------------------
for name in etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl \
            containerd containerd-shim-runc-v2 ctr metrics-server kube-router pause; do
    [[ -x "$BIN/$name" ]] || die "missing $BIN/$name: run deploy/cluster/build.sh first"
done
for cmd in runc openssl iptables ipset ip conntrack podman; do
    command -v "$cmd" >/dev/null || die "missing $cmd: apt-get install runc openssl iptables ipset iproute2 conntrack podman"
done
for plugin in bridge host-local loopback portmap; do
    [[ -x "$CNI_BIN/$plugin" ]] || die "missing CNI plugin $CNI_BIN/$plugin: apt-get install containernetworking-plugins"
done
grep -qw overlay /proc/filesystems || die "the kernel has no overlay file system (containerd's snapshotter)"
[[ -d /proc/sys/net/bridge ]] || die "no br_netfilter (/proc/sys/net/bridge): Services between pods need it"
# kube-router enforces NetworkPolicies with iptables and ipsets (kube-network-policies needs an
# nftables `queue`, which this project's VM kernel, 6.18-fc, does not have).
ipset create omni-probe hash:ip 2>/dev/null && ipset destroy omni-probe \
    || die "the kernel has no ipset (CONFIG_IP_SET): kube-router cannot enforce NetworkPolicies"
[[ ! -S "$RUN/containerd.sock" ]] || ! "$BIN/ctr" --address "$RUN/containerd.sock" version >/dev/null 2>&1 \
    || die "a cluster is already running (deploy/cluster/down.sh stops it)"
for port in 6443 10250 23790 23800 4443; do
    ! ss -Hltn "sport = :$port" | grep -q . || die "port $port is in use (another cluster? deploy/cluster/down.sh)"
done

mkdir -p "$STATE" "$RUN" "$LOGS" "$PKI" "$CONF"
# The omni-models volume (overlay/models-pv.yaml): the worker image's uid 1000 (docker/worker.Dockerfile).
mkdir -p "$STATE/models"
chown 1000:1000 "$STATE/models"
: >"$RUN/pids"

# --- the host settings a node needs, saved for down.sh ---------------------------------------
if [[ ! -f "$STATE/sysctl.saved" ]]; then
    sysctl -e net.ipv4.ip_forward net.bridge.bridge-nf-call-iptables vm.overcommit_memory \
        kernel.panic kernel.panic_on_oops | sed 's/ //g' >"$STATE/sysctl.saved"
fi
sysctl -q -w net.bridge.bridge-nf-call-iptables=1
ip addr show dev lo | grep -q " $NODE_IP/32 " || ip addr add "$NODE_IP/32" dev lo
# The pod bridge, made now rather than by the CNI plugin at the first pod: LiveKit (host network)
# puts its media on the bridge's address and only opens UDP sockets on addresses that exist
# when it starts, which can be before any pod of the pod network.
bridge_ip="${POD_CIDR%.*}.1"
ip link show "$POD_BRIDGE" >/dev/null 2>&1 || ip link add "$POD_BRIDGE" type bridge
ip addr show dev "$POD_BRIDGE" | grep -q " $bridge_ip/" || ip addr add "$bridge_ip/${POD_CIDR#*/}" dev "$POD_BRIDGE"
ip link set "$POD_BRIDGE" up

# --- certificates -----------------------------------------------------------------------------
"$here/pki.sh"

# --- configuration files ----------------------------------------------------------------------
kubeconfig() {  # name, user cert base name
    local file="$CONF/$1.kubeconfig"
    cat >"$file" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: omni
  cluster:
    certificate-authority: $PKI/ca.crt
    server: https://$NODE_IP:6443
users:
- name: $1
  user:
    client-certificate: $PKI/$2.crt
    client-key: $PKI/$2.key
contexts:
- name: omni
  context: {cluster: omni, user: $1}
current-context: omni
EOF
}
kubeconfig admin admin
kubeconfig controller-manager controller-manager
kubeconfig scheduler scheduler
kubeconfig kubelet kubelet
kubeconfig kube-proxy kube-proxy

mkdir -p "$CONF/cni"
cat >"$CONF/cni/10-omni.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "omni-pods",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$POD_BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {"type": "host-local", "dataDir": "$STATE/cni", "ranges": [[{"subnet": "$POD_CIDR"}]], "routes": [{"dst": "0.0.0.0/0"}]}
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF

# Can this host lower an OOM score? (Not in some sandboxes, even as root.)
restrict_oom=false
bash -c 'echo -1 >/proc/self/oom_score_adj' 2>/dev/null || restrict_oom=true
cat >"$CONF/containerd.toml" <<EOF
version = 3
root = "$STATE/containerd"
state = "$RUN/containerd"
[grpc]
  address = "$RUN/containerd.sock"
[ttrpc]
  address = "$RUN/containerd.sock.ttrpc"
# No NRI socket under the host's /var/run/nri.
[plugins.'io.containerd.nri.v1.nri']
  disable = true
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "$PAUSE_IMAGE"
[plugins.'io.containerd.cri.v1.runtime']
  # The kubelet asks for negative OOM scores (-998 for a pod's sandbox); a sandbox like this
  # project's refuses them even to root, and runc then fails with "failed to update
  # /proc/self/oom_score_adj: Permission denied". This keeps them at containerd's own score.
  restrict_oom_score_adj = $restrict_oom
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["$CNI_BIN"]
    conf_dir = "$CONF/cni"
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "$(command -v runc)"
        Root = "$RUN/runc"
        SystemdCgroup = false
EOF

# The host's cgroups decide the kubelet's driver: cgroupfs without systemd as PID 1; cgroup v1
# (this project's sandbox) needs failCgroupV1: false since Kubernetes 1.35.
cgroup_v1=false
[[ "$(stat -fc %T /sys/fs/cgroup)" == cgroup2fs ]] || cgroup_v1=true
cgroup_driver=cgroupfs
[[ "$(cat /proc/1/comm)" == systemd ]] && cgroup_driver=systemd
cat >"$CONF/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
healthzBindAddress: 127.0.0.1
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization: {mode: Webhook}
tlsCertFile: $PKI/kubelet-serving.crt
tlsPrivateKeyFile: $PKI/kubelet-serving.key
cgroupDriver: $cgroup_driver
failCgroupV1: $( $cgroup_v1 && echo false || echo true )
containerRuntimeEndpoint: unix://$RUN/containerd.sock
staticPodPath: ""
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
failSwapOn: false
serializeImagePulls: false
# A development machine: the disk and memory thresholds of a real node would evict pods here.
evictionHard: {memory.available: 200Mi, nodefs.available: 2%, imagefs.available: 2%}
imageGCHighThresholdPercent: 99
imageGCLowThresholdPercent: 98
maxPods: 40
podLogsDir: $STATE/pod-logs
EOF

cat >"$CONF/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clientConnection: {kubeconfig: $CONF/kube-proxy.kubeconfig}
hostnameOverride: $NODE_NAME
clusterCIDR: $POD_CIDR
bindAddress: 127.0.0.1
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
# NodePorts only on the node address: no route_localnet, nothing on the host's interfaces.
nodePortAddresses: ["$NODE_IP/32"]
conntrack: {maxPerCore: 0}
EOF

# --- the processes ----------------------------------------------------------------------------
start() {  # name, argv...: runs detached, its output in $LOGS/name.log, its pid in $RUN/pids
    local name="$1"; shift
    setsid "$@" >"$LOGS/$name.log" 2>&1 < /dev/null &
    echo "$name $!" >>"$RUN/pids"
}
wait_for() {  # what, seconds, command...
    local what="$1" seconds="$2"; shift 2
    local deadline=$((SECONDS + seconds))
    until "$@" >/dev/null 2>&1; do
        ((SECONDS < deadline)) || die "$what did not come up within ${seconds}s (log: $LOGS)"
        sleep 1
    done
}

say "etcd"
start etcd "$BIN/etcd" --name omni --data-dir "$STATE/etcd" \
    --listen-client-urls http://127.0.0.1:23790 --advertise-client-urls http://127.0.0.1:23790 \
    --listen-peer-urls http://127.0.0.1:23800 --initial-advertise-peer-urls http://127.0.0.1:23800 \
    --initial-cluster omni=http://127.0.0.1:23800 --listen-metrics-urls http://127.0.0.1:23810
wait_for etcd 60 curl -fsS http://127.0.0.1:23790/health

say "kube-apiserver"
start kube-apiserver "$BIN/kube-apiserver" \
    --etcd-servers http://127.0.0.1:23790 \
    --bind-address "$NODE_IP" --advertise-address "$NODE_IP" --secure-port 6443 \
    --service-cluster-ip-range "$SERVICE_CIDR" \
    --client-ca-file "$PKI/ca.crt" \
    --tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
    --kubelet-client-certificate "$PKI/apiserver-kubelet-client.crt" \
    --kubelet-client-key "$PKI/apiserver-kubelet-client.key" \
    --kubelet-certificate-authority "$PKI/ca.crt" --kubelet-preferred-address-types InternalIP \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-account-key-file "$PKI/sa.pub" --service-account-signing-key-file "$PKI/sa.key" \
    --authorization-mode Node,RBAC \
    --requestheader-client-ca-file "$PKI/front-proxy-ca.crt" \
    --requestheader-allowed-names front-proxy-client \
    --requestheader-username-headers X-Remote-User --requestheader-group-headers X-Remote-Group \
    --requestheader-extra-headers-prefix X-Remote-Extra- \
    --proxy-client-cert-file "$PKI/front-proxy-client.crt" \
    --proxy-client-key-file "$PKI/front-proxy-client.key" \
    --enable-aggregator-routing=true --allow-privileged=true
export KUBECONFIG="$KUBECONFIG_ADMIN"
wait_for kube-apiserver 180 "$BIN/kubectl" get --raw /readyz

say "kube-controller-manager, kube-scheduler"
start kube-controller-manager "$BIN/kube-controller-manager" \
    --kubeconfig "$CONF/controller-manager.kubeconfig" \
    --authentication-kubeconfig "$CONF/controller-manager.kubeconfig" \
    --authorization-kubeconfig "$CONF/controller-manager.kubeconfig" \
    --bind-address 127.0.0.1 --leader-elect=false \
    --service-account-private-key-file "$PKI/sa.key" --root-ca-file "$PKI/ca.crt" \
    --cluster-signing-cert-file "$PKI/ca.crt" --cluster-signing-key-file "$PKI/ca.key" \
    --use-service-account-credentials --service-cluster-ip-range "$SERVICE_CIDR" \
    --horizontal-pod-autoscaler-sync-period 10s
start kube-scheduler "$BIN/kube-scheduler" --kubeconfig "$CONF/scheduler.kubeconfig" \
    --authentication-kubeconfig "$CONF/scheduler.kubeconfig" \
    --authorization-kubeconfig "$CONF/scheduler.kubeconfig" \
    --bind-address 127.0.0.1 --leader-elect=false

say "containerd (runc)"
start containerd "$BIN/containerd" --config "$CONF/containerd.toml"
wait_for containerd 60 "$BIN/ctr" --address "$RUN/containerd.sock" version

say "images into containerd"
"$here/images.sh"

say "kubelet ($cgroup_driver cgroups$($cgroup_v1 && echo ', v1'))"
start kubelet env PATH="$BIN:$PATH" "$BIN/kubelet" --config "$CONF/kubelet.yaml" \
    --kubeconfig "$CONF/kubelet.kubeconfig" --root-dir "$STATE/kubelet" --hostname-override "$NODE_NAME" --node-ip "$NODE_IP"
wait_for "the node" 120 "$BIN/kubectl" get node "$NODE_NAME"

say "kube-proxy (iptables)"
start kube-proxy "$BIN/kube-proxy" --config "$CONF/kube-proxy.yaml"

say "add-ons: metrics-server (a process on the node, as an APIService), kube-router's NetworkPolicy firewall"
"$BIN/kubectl" apply -f "$here/addons/" >"$LOGS/addons.log"
start metrics-server "$BIN/metrics-server" --kubeconfig "$KUBECONFIG_ADMIN" \
    --authentication-kubeconfig "$KUBECONFIG_ADMIN" --authorization-kubeconfig "$KUBECONFIG_ADMIN" \
    --bind-address "$NODE_IP" --secure-port 4443 --cert-dir "$STATE/metrics-server" \
    --kubelet-certificate-authority "$PKI/ca.crt" \
    --kubelet-client-certificate "$PKI/apiserver-kubelet-client.crt" \
    --kubelet-client-key "$PKI/apiserver-kubelet-client.key" \
    --kubelet-preferred-address-types InternalIP --metric-resolution 15s
# The firewall part of kube-router only: routes and Services stay with the bridge and kube-proxy.
start kube-router "$BIN/kube-router" --kubeconfig "$KUBECONFIG_ADMIN" --hostname-override "$NODE_NAME" \
    --run-firewall=true --run-router=false --run-service-proxy=false --enable-cni=false \
    --health-port 0 --metrics-port 0 --iptables-sync-period 30s

wait_for "the node Ready" 180 bash -c \
    "'$BIN/kubectl' get node '$NODE_NAME' -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}' | grep -qx True"
say "up: KUBECONFIG=$KUBECONFIG_ADMIN $BIN/kubectl get pods -A (logs: $LOGS)"
