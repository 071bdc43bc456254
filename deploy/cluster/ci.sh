#!/usr/bin/env bash
# CI's run of the cluster test (.ci/run, after deploy/smoke/ci.sh, which builds the images):
# installs what it needs on a bare Debian machine (as root), builds the cluster's binaries
# once per machine (build.sh; cached under ~/.cache/omni-voice-agent/cluster), starts the
# one-node cluster, runs tests/cluster/run.py against it and stops the cluster, whatever happens.
# Needs scripts/setup first (the venv and the LiveKit server binary). Extra arguments go to run.py.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
say() { printf '\n[cluster ci] %s\n' "$*"; }

packages=(podman runc catatonit debootstrap containernetworking-plugins iptables ipset conntrack nftables curl iproute2 openssl)
missing=()
for pkg in "${packages[@]}"; do
    dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if ((${#missing[@]})); then
    say "installing Debian packages: ${missing[*]}"
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

say "binaries (deploy/cluster/build.sh)"
started=$SECONDS
deploy/cluster/build.sh
say "binaries ready in $((SECONDS - started)) s"

trap 'say "stopping the cluster"; deploy/cluster/down.sh' EXIT
# a cluster left by an interrupted run or an earlier one: each run starts an empty cluster
deploy/cluster/down.sh --reset >/dev/null 2>&1 || true
say "starting the cluster (deploy/cluster/up.sh)"
deploy/cluster/up.sh
say "tests/cluster/run.py"
# CI's run is a check, not a kept result: its report goes to .ci/logs, not bench/results
# (a later --results among the extra arguments wins)
"${PYTHON:-.venv/bin/python}" tests/cluster/run.py --results .ci/logs/k8s-cluster.log "$@"
