# The versions deploy/cluster/ builds and runs (sourced by build.sh, up.sh, down.sh).
K8S_VERSION="${K8S_VERSION:-v1.37.2}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
CONTAINERD_VERSION="${CONTAINERD_VERSION:-v2.4.2}"
METRICS_SERVER_VERSION="${METRICS_SERVER_VERSION:-v0.8.0}"
# The only kube-router the module proxy serves here (advisories are reported against it: it
# enforces the test cluster's NetworkPolicy, nothing more; docs/deploy.md)
KUBE_ROUTER_VERSION="${KUBE_ROUTER_VERSION:-v2.1.0}"
GO_MIN=1.26.0  # what k8s.io/kubernetes v1.37 asks for
# Where the binaries are cached, once per machine.
CLUSTER_CACHE="${CLUSTER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/omni-voice-agent/cluster/${K8S_VERSION}}"
