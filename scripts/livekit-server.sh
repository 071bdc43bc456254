#!/usr/bin/env bash
# Start a LiveKit server for local use: --dev keys (devkey / secret), loopback only by default.
#
#   scripts/livekit-server.sh [--port 7880] [--rtc-tcp-port 7881] [--rtc-udp-port 7882] [--bind 127.0.0.1]
#                             [--redis 127.0.0.1:6379]
#
# --bind 127.0.0.1 (default): signalling on 127.0.0.1:PORT (TCP) only, no RTC TCP port; media
# on RTC_UDP_PORT (UDP), which LiveKit opens on each interface's address (see below).
# --bind 0.0.0.0 (or one address): signalling there, and the RTC TCP fallback on every interface
# too, for phones and other machines on the network.
# --redis HOST:PORT: keep rooms in that Redis and talk to LiveKit's SIP service through it
# (phone callers, docs/sip.md); without it the server is on its own (in memory).
# Env defaults: LIVEKIT_PORT, LIVEKIT_RTC_TCP_PORT, LIVEKIT_RTC_UDP_PORT, LIVEKIT_BIND, LIVEKIT_REDIS,
# LIVEKIT_SERVER_BIN (default .tools/bin/livekit-server, built by install-livekit-server.sh).
# Runs in the foreground; the server replaces this shell, so signals reach it directly.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${LIVEKIT_SERVER_BIN:-$REPO_ROOT/.tools/bin/livekit-server}"
PORT="${LIVEKIT_PORT:-7880}"
RTC_TCP_PORT="${LIVEKIT_RTC_TCP_PORT:-7881}"
RTC_UDP_PORT="${LIVEKIT_RTC_UDP_PORT:-7882}"
BIND="${LIVEKIT_BIND:-127.0.0.1}"
REDIS="${LIVEKIT_REDIS:-}"

while [[ $# -gt 0 ]]; do
    case "$1" in
        --port) PORT="$2"; shift 2 ;;
        --rtc-tcp-port) RTC_TCP_PORT="$2"; shift 2 ;;
        --rtc-udp-port) RTC_UDP_PORT="$2"; shift 2 ;;
        --bind) BIND="$2"; shift 2 ;;
        --redis) REDIS="$2"; shift 2 ;;
        -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
        *) echo "livekit-server.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
    esac
done

if [[ ! -x "$BIN" ]]; then
    echo "livekit-server.sh: no server binary at $BIN; run scripts/install-livekit-server.sh first" >&2
    exit 1
fi

# stun_servers: the STUN server the server hands to its clients. Left empty, it hands out
# public ones (global.stun.twilio.com, stun.l.google.com) and every client, the agent
# included, looks them up and tries to reach them. Loopback needs no STUN at all.
if [[ $BIND == 127.0.0.1 ]]; then
    # No RTC TCP port: LiveKit binds it on every interface whatever bind_addresses says, and
    # clients on this machine need only UDP. Media UDP cannot be kept on 127.0.0.1: libwebrtc
    # clients (the agent, Chromium) offer only their non-loopback addresses as candidates and
    # ignore media coming from a loopback address, so with `rtc.ips.includes: [127.0.0.1/32]`
    # calls do not connect. It listens on every interface's address; docs/architecture.md says so.
    RTC="
  udp_port: $RTC_UDP_PORT
  tcp_port: 0
  use_external_ip: false
  node_ip: 127.0.0.1
  enable_loopback_candidate: true
  stun_servers: [127.0.0.1:$RTC_UDP_PORT]"
    WHERE="rtc udp $RTC_UDP_PORT on every interface address, no rtc tcp"
else
    RTC="
  udp_port: $RTC_UDP_PORT
  tcp_port: $RTC_TCP_PORT
  use_external_ip: false
  enable_loopback_candidate: true
  stun_servers: [127.0.0.1:$RTC_UDP_PORT]"
    WHERE="rtc tcp $RTC_TCP_PORT and udp $RTC_UDP_PORT on every interface"
fi
CONFIG="
port: $PORT
bind_addresses: [$BIND]
rtc:$RTC
logging:
  level: info
"
if [[ -n $REDIS ]]; then
    CONFIG+="redis:
  address: $REDIS
"
    WHERE+=", redis $REDIS"
fi

echo "[livekit-server] ws://$BIND:$PORT (keys devkey/secret, $WHERE)"
exec "$BIN" --dev --config-body "$CONFIG"
