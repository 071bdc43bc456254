# Names and paths shared by up.sh, down.sh, pki.sh and images.sh (sourced after versions.sh).
BIN="$CLUSTER_CACHE/bin"
CNI_BIN="${CNI_BIN:-/usr/lib/cni}"          # Debian's containernetworking-plugins
STATE="${CLUSTER_STATE:-/var/lib/omni-voice-cluster}"   # etcd, containerd, certificates, logs
RUN=/run/omni-voice-cluster                 # sockets and the pids down.sh stops
LOGS="$STATE/logs"
PKI="$STATE/pki"
CONF="$STATE/conf"
KUBECONFIG_ADMIN="$CONF/admin.kubeconfig"
NODE_NAME=omni-node
NODE_IP=10.255.0.1          # on lo: the node's InternalIP, reachable from pods, not from outside
POD_CIDR=10.244.0.0/24      # the pods, on the bridge below (10.244.0.1: LiveKit's media too)
POD_BRIDGE=omni-cni0
SERVICE_CIDR=10.96.0.0/16   # 10.96.0.1 is the API server's Service
PAUSE_IMAGE=localhost/omni-cluster/pause:local
CONTAINERD_SOCK="$RUN/containerd.sock"

say() { printf '[cluster] %s\n' "$*"; }
die() { printf '[cluster] error: %s\n' "$*" >&2; exit 1; }
ctr_k8s() { "$BIN/ctr" --address "$CONTAINERD_SOCK" -n k8s.io "$@"; }
