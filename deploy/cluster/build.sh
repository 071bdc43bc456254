#!/usr/bin/env bash
# Builds the binaries of a one-node Kubernetes cluster from the Go module proxy, once per machine:
#   kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kube-proxy, kubectl
#   (k8s.io/kubernetes), etcd, containerd + its runc shim + ctr, metrics-server,
#   kube-router (its NetworkPolicy firewall only), and a pause binary for the pod sandbox image.
# Output: $CLUSTER_CACHE/bin (default ~/.cache/omni-voice-agent/cluster/<k8s version>/bin).
# A binary already there is not built again; delete it (or the directory) to rebuild.
# runc and the CNI plugins come from Debian (up.sh installs them).
# Cold on a 2-core VM this takes tens of minutes (docs/deploy.md has the measured time).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=deploy/cluster/versions.sh
source "$here/versions.sh"

say() { printf '[cluster build] %s\n' "$*"; }
die() { printf '[cluster build] error: %s\n' "$*" >&2; exit 1; }

command -v go >/dev/null || die "go is not installed (Go >= ${GO_MIN} is needed to build Kubernetes ${K8S_VERSION})"

bin="$CLUSTER_CACHE/bin"
src="$CLUSTER_CACHE/src"
mkdir -p "$bin" "$src"
export CGO_ENABLED=0 GOFLAGS="-buildvcs=false -trimpath" GOTOOLCHAIN=local

missing() {  # the names in "$@" that are not yet in $bin
    local name
    for name in "$@"; do [[ -x "$bin/$name" ]] || echo "$name"; done
}

# One module per program family: `go build` of a package from a module that the main module
# requires, with the replace lines that module's own go.mod would have used.
build_module() {  # dir, go.mod body; then `go mod tidy` once
    local dir="$src/$1" body="$2"
    mkdir -p "$dir"
    if [[ ! -f "$dir/go.mod" ]] || [[ "$(cat "$dir/go.mod.in" 2>/dev/null)" != "$body" ]]; then
        printf '%s\n' "$body" >"$dir/go.mod"
        printf '%s\n' "$body" >"$dir/go.mod.in"
        cat >"$dir/tools.go" <<EOF
//go:build tools

// Package tools names the programs this module builds, so that go mod tidy keeps them.
package tools
EOF
        for pkg in "${@:3}"; do printf 'import _ "%s"\n' "$pkg" >>"$dir/tools.go"; done
        (cd "$dir" && go mod tidy) || die "go mod tidy failed in $dir"
    fi
}

# --- Kubernetes -------------------------------------------------------------------------------
k8s_programs=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl)
mapfile -t todo < <(missing "${k8s_programs[@]}")
if ((${#todo[@]})); then
    say "Kubernetes ${K8S_VERSION}: ${todo[*]}"
    go mod download -json "k8s.io/kubernetes@${K8S_VERSION}" >/dev/null \
        || die "cannot download k8s.io/kubernetes@${K8S_VERSION} from the module proxy"
    k8s_mod="$(go env GOMODCACHE)/cache/download/k8s.io/kubernetes/@v/${K8S_VERSION}.mod"
    # Kubernetes' go.mod replaces each staging module with ./staging/src/k8s.io/X; published,
    # each is k8s.io/X at v0.<minor>.<patch>.
    staging_version="v0.${K8S_VERSION#v1.}"
    replaces="$(sed -n 's|^\s*\(k8s.io/[a-z0-9-]*\) => ./staging/src/.*|\t\1 => \1 '"$staging_version"'|p' "$k8s_mod")"
    [[ -n "$replaces" ]] || die "no staging modules found in $k8s_mod"
    body="module omni-voice-agent/cluster/kubernetes

go ${GO_MIN}

require k8s.io/kubernetes ${K8S_VERSION}

replace (
${replaces}
)"
    pkgs=()
    for p in "${todo[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$p"); done
    build_module kubernetes "$body" "${pkgs[@]}"
    # The version stamps of hack/lib/version.sh; without them the binaries say v0.0.0-master.
    minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
    ldflags="-s -w"
    for v in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        ldflags+=" -X $v.gitVersion=${K8S_VERSION} -X $v.gitMajor=1 -X $v.gitMinor=${minor}"
        ldflags+=" -X $v.gitTreeState=clean -X $v.buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    done
    (cd "$src/kubernetes" && go build -ldflags "$ldflags" -o "$bin/" "${pkgs[@]}") \
        || die "building Kubernetes failed"
fi

# --- etcd -------------------------------------------------------------------------------------
if [[ -n "$(missing etcd)" ]]; then
    say "etcd ${ETCD_VERSION}"
    build_module etcd "module omni-voice-agent/cluster/etcd

go ${GO_MIN}

require go.etcd.io/etcd/server/v3 ${ETCD_VERSION}" go.etcd.io/etcd/server/v3
    (cd "$src/etcd" && go build -ldflags "-s -w" -o "$bin/etcd" go.etcd.io/etcd/server/v3) \
        || die "building etcd failed"
fi

# --- containerd -------------------------------------------------------------------------------
mapfile -t todo < <(missing containerd containerd-shim-runc-v2 ctr)
if ((${#todo[@]})); then
    say "containerd ${CONTAINERD_VERSION}: ${todo[*]}"
    pkgs=()
    for p in "${todo[@]}"; do pkgs+=("github.com/containerd/containerd/v2/cmd/$p"); done
    build_module containerd "module omni-voice-agent/cluster/containerd

go ${GO_MIN}

require github.com/containerd/containerd/v2 ${CONTAINERD_VERSION}" "${pkgs[@]}"
    # CGO off drops the btrfs snapshotter (overlayfs is the one used); the version stamp is
    # what `containerd --version` and the kubelet's runtime check print.
    (cd "$src/containerd" && go build -tags no_btrfs,no_devmapper,no_zfs \
        -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=${CONTAINERD_VERSION}" \
        -o "$bin/" "${pkgs[@]}") || die "building containerd failed"
fi

# --- metrics-server and kube-router (processes on the node, started by up.sh) ----------------
if [[ -n "$(missing metrics-server)" ]]; then
    say "metrics-server ${METRICS_SERVER_VERSION}"
    build_module metrics-server "module omni-voice-agent/cluster/metrics-server

go ${GO_MIN}

require sigs.k8s.io/metrics-server ${METRICS_SERVER_VERSION}" sigs.k8s.io/metrics-server/cmd/metrics-server
    (cd "$src/metrics-server" && go build -ldflags "-s -w" -o "$bin/metrics-server" \
        sigs.k8s.io/metrics-server/cmd/metrics-server) || die "building metrics-server failed"
fi
if [[ -n "$(missing kube-router)" ]]; then
    say "kube-router ${KUBE_ROUTER_VERSION}"
    build_module kube-router "module omni-voice-agent/cluster/kube-router

go ${GO_MIN}

require github.com/cloudnativelabs/kube-router/v2 ${KUBE_ROUTER_VERSION}" \
        github.com/cloudnativelabs/kube-router/v2/cmd/kube-router
    (cd "$src/kube-router" && go build -ldflags "-s -w" -o "$bin/kube-router" \
        github.com/cloudnativelabs/kube-router/v2/cmd/kube-router) || die "building kube-router failed"
fi

# --- pause: the pod sandbox's process (no registry for registry.k8s.io/pause here) ------------
if [[ -n "$(missing pause)" ]]; then
    say "pause"
    mkdir -p "$src/pause"
    cp "$here/pause/main.go" "$src/pause/main.go"
    printf 'module omni-voice-agent/cluster/pause\n\ngo %s\n' "$GO_MIN" >"$src/pause/go.mod"
    (cd "$src/pause" && go build -ldflags "-s -w" -o "$bin/pause" .) || die "building pause failed"
fi

say "done: $bin"
"$bin/kubectl" version --client 2>/dev/null | head -1 || true
