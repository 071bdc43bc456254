#!/usr/bin/env bash
# Start a LiveKit server for local use: --dev keys (devkey / secret), loopback only.
#
#   scripts/livekit-server.sh [--port 7880] [--rtc-tcp-port 7881] [--rtc-udp-port 7882]
#
# Env defaults: LIVEKIT_PORT, LIVEKIT_RTC_TCP_PORT, LIVEKIT_RTC_UDP_PORT,
# LIVEKIT_SERVER_BIN (default .tools/bin/livekit-server, built by install-livekit-server.sh).
# Runs in the foreground; the server replaces this shell, so signals reach it directly.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${LIVEKIT_SERVER_BIN:-$REPO_ROOT/.tools/bin/livekit-server}"
PORT="${LIVEKIT_PORT:-7880}"
RTC_TCP_PORT="${LIVEKIT_RTC_TCP_PORT:-7881}"
RTC_UDP_PORT="${LIVEKIT_RTC_UDP_PORT:-7882}"

while [[ $# -gt 0 ]]; do
    case "$1" in
        --port) PORT="$2"; shift 2 ;;
        --rtc-tcp-port) RTC_TCP_PORT="$2"; shift 2 ;;
        --rtc-udp-port) RTC_UDP_PORT="$2"; shift 2 ;;
        -h|--help) sed -n '2,8p' "$0"; exit 0 ;;
        *) echo "livekit-server.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
    esac
done

if [[ ! -x "$BIN" ]]; then
    echo "livekit-server.sh: no server binary at $BIN; run scripts/install-livekit-server.sh first" >&2
    exit 1
fi

# Everything on 127.0.0.1: signalling on PORT, WebRTC media over one UDP port (muxed)
# with TCP as fallback. The loopback candidate lets clients on this machine connect
# without any external IP discovery (which would try to reach the internet).
# stun_servers: the STUN server the server hands to its clients. Left empty, it hands out
# public ones (global.stun.twilio.com, stun.l.google.com) and every client, the agent
# included, looks them up and tries to reach them. Loopback needs no STUN at all.
CONFIG="
port: $PORT
bind_addresses: [127.0.0.1]
rtc:
  udp_port: $RTC_UDP_PORT
  tcp_port: $RTC_TCP_PORT
  use_external_ip: false
  node_ip: 127.0.0.1
  enable_loopback_candidate: true
  stun_servers: [127.0.0.1:$RTC_UDP_PORT]
logging:
  level: info
"

echo "[livekit-server] ws://127.0.0.1:$PORT (keys devkey/secret, rtc tcp $RTC_TCP_PORT udp $RTC_UDP_PORT)"
exec "$BIN" --dev --config-body "$CONFIG"
