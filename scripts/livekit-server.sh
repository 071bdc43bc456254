#!/usr/bin/env bash
# Start a LiveKit server for local use: --dev keys (devkey / secret), loopback only by default.
#
#   scripts/livekit-server.sh [--port 7880] [--rtc-tcp-port 7881] [--rtc-udp-port 7882] [--bind 127.0.0.1]
#
# --bind 127.0.0.1 (default): signalling on 127.0.0.1:PORT (TCP), media on 127.0.0.1:RTC_UDP_PORT
# (UDP) only, and no RTC TCP port (LiveKit binds that one on every interface, so it stays off).
# --bind 0.0.0.0 (or one address): signalling there, media UDP and the RTC TCP fallback on every
# interface, for phones and other machines on the network.
# Env defaults: LIVEKIT_PORT, LIVEKIT_RTC_TCP_PORT, LIVEKIT_RTC_UDP_PORT, LIVEKIT_BIND,
# LIVEKIT_SERVER_BIN (default .tools/bin/livekit-server, built by install-livekit-server.sh).
# Runs in the foreground; the server replaces this shell, so signals reach it directly.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${LIVEKIT_SERVER_BIN:-$REPO_ROOT/.tools/bin/livekit-server}"
PORT="${LIVEKIT_PORT:-7880}"
RTC_TCP_PORT="${LIVEKIT_RTC_TCP_PORT:-7881}"
RTC_UDP_PORT="${LIVEKIT_RTC_UDP_PORT:-7882}"
BIND="${LIVEKIT_BIND:-127.0.0.1}"

while [[ $# -gt 0 ]]; do
    case "$1" in
        --port) PORT="$2"; shift 2 ;;
        --rtc-tcp-port) RTC_TCP_PORT="$2"; shift 2 ;;
        --rtc-udp-port) RTC_UDP_PORT="$2"; shift 2 ;;
        --bind) BIND="$2"; shift 2 ;;
        -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
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
    # Media over one UDP port on 127.0.0.1 only (ips.includes keeps LiveKit from listening on
    # the other interfaces); the loopback candidate lets clients on this machine connect
    # without any external IP discovery (which would try to reach the internet).
    RTC="
  udp_port: $RTC_UDP_PORT
  tcp_port: 0
  use_external_ip: false
  node_ip: 127.0.0.1
  enable_loopback_candidate: true
  ips:
    includes: [127.0.0.1/32]
  stun_servers: [127.0.0.1:$RTC_UDP_PORT]"
    WHERE="rtc udp 127.0.0.1:$RTC_UDP_PORT, no rtc tcp"
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

echo "[livekit-server] ws://$BIND:$PORT (keys devkey/secret, $WHERE)"
exec "$BIN" --dev --config-body "$CONFIG"
