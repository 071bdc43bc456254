#!/usr/bin/env bash
# Build the LiveKit server from source (Go module proxy) into .tools/bin/livekit-server.
#
# No package registry ships the server binary, but the Go module proxy serves its
# source, and it is pure Go (no cgo), so `go install` is all we need. The tag is pinned:
# later master adds `replace` directives that `go install` refuses.
#
# Idempotent: does nothing when the right version is already installed.
# Env: LIVEKIT_SERVER_VERSION (default v1.13.5), TOOLS_BIN (default <repo>/.tools/bin).
set -euo pipefail

VERSION="${LIVEKIT_SERVER_VERSION:-v1.13.5}"
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS_BIN="${TOOLS_BIN:-$REPO_ROOT/.tools/bin}"
TARGET="$TOOLS_BIN/livekit-server"
MODULE="github.com/livekit/livekit-server/cmd/server@$VERSION"

say() { printf '[install-livekit-server] %s\n' "$*"; }

if [[ -x "$TARGET" ]] && "$TARGET" --version 2>/dev/null | grep -qx "livekit-server version ${VERSION#v}"; then
    say "already installed: $TARGET ($VERSION)"
    exit 0
fi

if ! command -v go >/dev/null 2>&1; then
    say "error: 'go' is not on PATH. Install Go >= 1.26 (https://go.dev/dl/) and run this again."
    exit 1
fi
say "using $(go version)"

build_dir="$(mktemp -d)"
trap 'rm -rf "$build_dir"' EXIT

# The binary `go install` produces is named after its package directory: `server`.
try_install() {
    say "go install $MODULE${*:+ (with $*)}"
    env GOBIN="$build_dir" "$@" go install "$MODULE"
}

say "building LiveKit server $VERSION (first build downloads ~200 modules and takes a few minutes)"
# Fallbacks from DESIGN.md: a checksum database that cannot be reached, then module mode.
if ! try_install; then
    say "retrying with GOSUMDB=off (checksum database unreachable?)"
    if ! try_install GOSUMDB=off; then
        say "retrying with GOSUMDB=off GOFLAGS=-mod=mod"
        if ! try_install GOSUMDB=off GOFLAGS=-mod=mod; then
            say "error: could not build the LiveKit server (go's messages above); is the Go module proxy reachable (GOPROXY=$(go env GOPROXY))?"
            exit 1
        fi
    fi
fi

mkdir -p "$TOOLS_BIN"
mv -f "$build_dir/server" "$TARGET"
say "installed $("$TARGET" --version) at $TARGET"
