#!/usr/bin/env bash
# CI's run of deploy/smoke/run.py (.ci/run, after the tests): installs what it needs on a bare
# Debian machine, as root (podman, runc, catatonit for pods, debootstrap for the base image;
# podman-compose from PyPI, as Debian's 1.0.3 cannot read `!reset`), then runs it.
# Needs scripts/setup first (the venv, or PYTHON=its python; the LiveKit server binary). Extra
# arguments go to run.py.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
say() { printf '\n[smoke ci] %s\n' "$*"; }

packages=(podman runc catatonit debootstrap)
missing=()
for pkg in "${packages[@]}"; do
    dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if ((${#missing[@]})); then
    say "installing Debian packages: ${missing[*]}"
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
if [[ ! -x .tools/podman-compose/bin/podman-compose ]]; then
    say "installing podman-compose into .tools/podman-compose"
    python3 -m venv .tools/podman-compose
    .tools/podman-compose/bin/pip install -q "podman-compose>=1.1"
fi

# This project's machines are sandboxes that need runc and explicit rlimits (that file says why).
export CONTAINERS_CONF="$PWD/deploy/smoke/sandbox-containers.conf"
exec "${PYTHON:-.venv/bin/python}" deploy/smoke/run.py --compose .tools/podman-compose/bin/podman-compose "$@"
