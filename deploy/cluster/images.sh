#!/usr/bin/env bash
# The images the cluster runs, into containerd's k8s.io namespace (up.sh calls it once
# containerd is up; run it again after a rebuild):
# - the project's images, built with podman by the smoke run's own code when missing or
#   changed (deploy/smoke/run.py --images-only), re-tagged :cluster so the kubelet never tries
#   to pull them (a :latest tag would mean imagePullPolicy Always);
# - two made here from files on this machine, since no registry is reachable: the pod
#   sandbox (pause) and LiveKit (the server binary of
#   scripts/install-livekit-server.sh in the smoke run's Debian base image).
# An image whose podman id is already in containerd is not imported again.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
source "$here/versions.sh"
source "$here/common.sh"
cd "$repo"
export CONTAINERS_CONF="${CONTAINERS_CONF:-$repo/deploy/smoke/sandbox-containers.conf}"
python="${PYTHON:-$repo/.venv/bin/python}"
[[ -x "$python" ]] || die "no $python: run scripts/setup first"

if [[ "${SKIP_PROJECT_IMAGES:-0}" != 1 ]]; then
    say "project images (podman, deploy/smoke/run.py --images-only)"
    "$python" deploy/smoke/run.py --images-only >"$LOGS/images-build.log" 2>&1 \
        || die "building the images failed: $(tail -3 "$LOGS/images-build.log" | tr '\n' ' ')"
fi

from_binary() {  # image, binary, [base image]: a one-binary image
    local image="$1" binary="$2" base="${3:-scratch}" dir
    dir="$(mktemp -d)"
    cp "$binary" "$dir/"
    printf 'FROM %s\nCOPY %s /%s\nENTRYPOINT ["/%s"]\n' "$base" "$(basename "$binary")" \
        "$(basename "$binary")" "$(basename "$binary")" >"$dir/Containerfile"
    podman build -q --format docker -t "$image" "$dir" >/dev/null || die "podman build of $image failed"
    rm -rf "$dir"
}
from_binary "$PAUSE_IMAGE" "$BIN/pause"
livekit_bin="$("$python" -c 'from scripts.stack import find_livekit_server as f; p = f(); print(p.resolve() if p else "")')"
[[ -n "$livekit_bin" ]] || die "no LiveKit server binary: run scripts/install-livekit-server.sh"
from_binary localhost/omni-cluster/livekit-server:local "$livekit_bin" localhost/debian-base:bookworm

import_image() {  # podman image, name in containerd
    local id
    id="$(podman image inspect --format '{{.Id}}' "$1")" || die "no podman image $1"
    if [[ "$(cat "$STATE/imported/${2//\//_}" 2>/dev/null)" == "$id" ]] && ctr_k8s images ls -q 2>/dev/null | grep -qx "$2"; then
        return
    fi
    say "  $2"
    podman save "$1" | ctr_k8s images import - >>"$LOGS/images-import.log" 2>&1 || die "importing $1 failed (log $LOGS/images-import.log)"
    [[ "$1" == "$2" ]] || ctr_k8s images tag --force "$1" "$2" >>"$LOGS/images-import.log" 2>&1
    mkdir -p "$STATE/imported"
    echo "$id" >"$STATE/imported/${2//\//_}"
}
import_image "$PAUSE_IMAGE" "$PAUSE_IMAGE"
import_image localhost/omni-cluster/livekit-server:local localhost/omni-cluster/livekit-server:local
import_image localhost/omni-voice-agent/omni-worker-cpu:latest localhost/omni-voice-agent/omni-worker-cpu:cluster
import_image localhost/omni-voice-agent/agent:latest localhost/omni-voice-agent/agent:cluster
import_image localhost/omni-voice-agent/web:latest localhost/omni-voice-agent/web:cluster
