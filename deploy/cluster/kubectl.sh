#!/usr/bin/env bash
# kubectl on the cluster of up.sh, as its admin:   deploy/cluster/kubectl.sh get pods -A
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/versions.sh"
source "$here/common.sh"
KUBECONFIG="$KUBECONFIG_ADMIN" exec "$BIN/kubectl" "$@"
