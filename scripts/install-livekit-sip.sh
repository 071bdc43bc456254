#!/usr/bin/env bash
# Build LiveKit's SIP service (livekit/sip, cmd/livekit-sip) into .tools/bin/livekit-sip.
#
# The Go module proxy does not serve github.com/livekit/sip, nor the exact versions of
# livekit/media-sdk and livekit/protocol that it names, so their sources come as tarballs in
# ../shared/vendor/ (README.md there). They are unpacked side by side in a temporary folder,
# outside this project's tree; two `replace` lines in sip/go.mod point at the two libraries,
# and every other module comes from the module proxy. It needs cgo with libopus, libopusfile
# and libsoxr (Debian's -dev packages and pkg-config, installed here when run as root).
#
# On a machine with the open internet, instead: clone github.com/livekit/sip at a release tag
# (its go.mod then names published versions) and `go build -o .tools/bin/livekit-sip
# ./cmd/livekit-sip`, or run the published image livekit/sip (docs/sip.md).
#
# Cached: does nothing when .tools/bin/livekit-sip exists and was built from the same three
# tarballs (their sha256 is kept next to the binary); a binary built from them before on this
# machine (by any checkout: CI's clean clones too) is copied from
# ~/.cache/omni-voice-agent/livekit-sip/<sha256>/ instead of built again.
# Env: SIP_VENDOR_DIR (default <repo>/../shared/vendor), TOOLS_BIN (default <repo>/.tools/bin),
# OMNI_CACHE_DIR (default ~/.cache/omni-voice-agent).
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENDOR="${SIP_VENDOR_DIR:-$REPO_ROOT/../shared/vendor}"
TOOLS_BIN="${TOOLS_BIN:-$REPO_ROOT/.tools/bin}"
TARGET="$TOOLS_BIN/livekit-sip"
STAMP="$TARGET.sources-sha256"
# the folder each tarball unpacks to, and the tarball
TARBALLS=(sip:livekit-sip-be5d3f5.tar.gz
          media-sdk:livekit-media-sdk-5a5218b19550.tar.gz
          protocol:livekit-protocol-24e126c61d3e.tar.gz)
BUILD_DEBS=(libopus-dev libopusfile-dev libsoxr-dev pkg-config)

say() { printf '[install-livekit-sip] %s\n' "$*"; }
die() { say "error: $*" >&2; exit 1; }

paths=()
for entry in "${TARBALLS[@]}"; do
    tarball="$VENDOR/${entry#*:}"
    [[ -f $tarball ]] || die "missing $tarball (the vendored LiveKit SIP sources; set SIP_VENDOR_DIR to the folder that holds them)"
    paths+=("$tarball")
done
sources_sha="$(cat "${paths[@]}" | sha256sum | cut -d' ' -f1)"

if [[ -x $TARGET && -f $STAMP && $(cat "$STAMP") == "$sources_sha" ]]; then
    say "already installed: $TARGET (built from the vendored sources, sha256 ${sources_sha:0:12})"
    exit 0
fi
CACHED="${OMNI_CACHE_DIR:-$HOME/.cache/omni-voice-agent}/livekit-sip/$sources_sha/livekit-sip"
install_from_cache() {
    mkdir -p "$TOOLS_BIN"
    cp -f "$CACHED" "$TARGET.tmp" && mv -f "$TARGET.tmp" "$TARGET"
    echo "$sources_sha" >"$STAMP"
}
if [[ -x $CACHED ]] && "$CACHED" --help >/dev/null 2>&1; then
    install_from_cache
    say "installed $TARGET from this machine's cache ($CACHED)"
    exit 0
fi

command -v go >/dev/null 2>&1 || die "'go' is not on PATH; install Go >= 1.26 (https://go.dev/dl/) and run this again"

missing=()
for pkg in "${BUILD_DEBS[@]}"; do
    dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if ((${#missing[@]})); then
    if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null 2>&1; then
        say "installing the build dependencies: ${missing[*]}"
        apt-get update -q
        DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
    elif ! pkg-config --exists opus opusfile soxr 2>/dev/null; then
        die "missing the C libraries livekit-sip links with: install ${missing[*]} (as root: apt-get install ${missing[*]})"
    fi
fi

build_dir="$(mktemp -d)"
trap 'rm -rf "$build_dir"' EXIT
for entry in "${TARBALLS[@]}"; do
    mkdir -p "$build_dir/${entry%%:*}"
    # each tarball's entries sit under one top folder (sip/, media-sdk/, protocol/)
    tar -xzf "$VENDOR/${entry#*:}" -C "$build_dir/${entry%%:*}" --strip-components=1
done

say "building livekit-sip with $(go version | cut -d' ' -f3) (the first build downloads its modules; about a minute after that)"
cd "$build_dir/sip"
go mod edit -replace github.com/livekit/media-sdk=../media-sdk -replace github.com/livekit/protocol=../protocol
# -trimpath: the temporary folder's name stays out of the binary, so Go's build cache is reused
if ! CGO_ENABLED=1 go build -trimpath -o "$build_dir/livekit-sip" ./cmd/livekit-sip; then
    die "go build of livekit-sip failed (go's messages above); is the Go module proxy reachable (GOPROXY=$(go env GOPROXY))?"
fi
"$build_dir/livekit-sip" --help >/dev/null || die "the built livekit-sip does not run (--help failed)"

mkdir -p "$(dirname "$CACHED")"
mv -f "$build_dir/livekit-sip" "$CACHED"
install_from_cache
say "installed $TARGET (kept in $CACHED for the next checkout)"
