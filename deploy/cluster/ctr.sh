#!/usr/bin/env bash
# containerd's ctr on the cluster's containerd, in the kubelet's namespace (k8s.io):
#   deploy/cluster/ctr.sh images ls
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/versions.sh"
source "$here/common.sh"
exec "$BIN/ctr" --address "$CONTAINERD_SOCK" -n k8s.io "$@"
