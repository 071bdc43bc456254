"""Token endpoint and static file server for the browser client.

    python web/server.py --port 8080
    python web/server.py --sign-link support-42 [--link-identity alice] [--valid-for 86400]

GET /token returns {url, token, room, identity}: a LiveKit access token that lets one
participant join one room (publish its microphone, subscribe to the agent), valid for a few
minutes (it only has to last until the join; LiveKit refreshes it for the connected
participant). The API secret never leaves this process. The server picks the room and the
identity (fresh random names, so every visitor gets a room of their own and the agent worker
is dispatched to it). A client may ask for a room (`?room=`) only where the operator allows it:
a room listed in WEB_ROOMS, or a link the operator signed with WEB_LINK_SECRET
(`?room=&expires=&sig=`, optionally with `identity=`; --sign-link makes one). Anything else is
refused with 403 and the reason. Token requests are rate-limited per client address.

POST /token is LiveKit's standard token endpoint (what the client SDKs' endpoint TokenSource
calls): a JSON body with any of room_name, participant_identity, participant_name and
room_config (only a dispatch of this server's AGENT_NAME), answered 201 with {server_url,
participant_token, room_name, participant_identity, participant_name}. room_name and
participant_identity follow the rules of GET (a signed link's expires and sig go in the query
string). What this server does not let clients choose (participant_metadata,
participant_attributes, other room settings, other agents) is refused with 400 and the reason,
never silently dropped.

GET / serves the built page from web/dist/ (build it with `npm ci && npm run build` in web/).
GET /health answers 200 for load balancers.

Configuration (environment):
  LIVEKIT_URL          the LiveKit server, as browsers reach it (default ws://127.0.0.1:7880)
  LIVEKIT_PUBLIC_URL   overrides LIVEKIT_URL for browsers, where the rest of the deployment
                       shares a LIVEKIT_URL that browsers cannot reach (e.g. ws://livekit:7880)
  LIVEKIT_API_KEY      (default devkey, the key of `livekit-server --dev`)
  LIVEKIT_API_SECRET   (default secret)
  AGENT_NAME           when set, the token asks LiveKit to dispatch the agent registered
                       under this name into the room; leave unset for agent workers that
                       register without a name (they are dispatched to every new room)
  WEB_ROOMS            room names clients may ask for by name, comma-separated (default none)
  WEB_LINK_SECRET      the key of signed links (at least 32 characters; default none: no links)
  WEB_TOKEN_TTL_S      lifetime of a token in seconds (default 300)
  WEB_VIDEO            true: callers may also publish a camera and a screen share (for an agent
                       with AGENT_VISION on; default false: a microphone only)
  WEB_TOKENS_PER_MINUTE, WEB_TOKEN_BURST
                       the rate limit per client address (default 6 a minute, 5 at once)
  WEB_TRUSTED_PROXY_HEADER
                       the header a proxy in front writes the client's address into, e.g.
                       X-Forwarded-For (default none: the connection's own address is used)
  WEB_TRUSTED_PROXY_HOPS
                       how many proxies append to that header (default 1: its last address)
"""

from __future__ import annotations

import argparse
import base64
import datetime
import hashlib
import hmac
import ipaddress
import json
import logging
import math
import os
import re
import secrets
import sys
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlencode

from aiohttp import web
from livekit import api

logger = logging.getLogger("web.server")

DEV_API_KEY = "devkey"
DEV_API_SECRET = "secret"
DIST_DIR = Path(__file__).resolve().parent / "dist"
# A token is only used to join; LiveKit hands the connected participant fresh ones, so a
# leaked or logged token is worth little after a few minutes.
DEFAULT_TOKEN_TTL_S = 300
TOKEN_TTL_RANGE_S = (30, 3600)
DEFAULT_TOKENS_PER_MINUTE = 6.0
DEFAULT_TOKEN_BURST = 5
# Above this many client addresses the least recently seen are forgotten, so a flood from many
# addresses cannot grow the table without bound.
MAX_TRACKED_CLIENTS = 65536
LINK_SECRET_MIN_CHARS = 32
# LiveKit accepts more, but a narrow alphabet keeps names safe to log and put in URLs.
NAME_PATTERN = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
DISPLAY_NAME_MAX = 128
# The fields of LiveKit's token endpoint request; the last two are refused (see handle_token_source)
TOKEN_SOURCE_FIELDS = {"room_name", "participant_identity", "participant_name", "room_config",
                       "participant_metadata", "participant_attributes"}


class ConfigError(ValueError):
    """A setting the operator must fix before the server starts."""


def _env_number(name: str, default: float, kind: type = float) -> float:
    raw = os.environ.get(name, "")
    if raw == "":
        return default
    try:
        return kind(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number (got {raw!r})") from None


def _env_flag(name: str) -> bool:
    raw = os.environ.get(name, "").strip().lower()
    if raw in ("", "0", "false", "no", "off"):
        return False
    if raw in ("1", "true", "yes", "on"):
        return True
    raise ConfigError(f"{name} must be true or false (got {raw!r})")


@dataclass(frozen=True)
class TokenConfig:
    public_url: str  # the LiveKit URL handed to browsers
    api_key: str
    api_secret: str
    agent_name: str | None = None
    allowed_rooms: frozenset[str] = frozenset()
    link_secret: str | None = None
    token_ttl_s: int = DEFAULT_TOKEN_TTL_S
    tokens_per_minute: float = DEFAULT_TOKENS_PER_MINUTE
    token_burst: int = DEFAULT_TOKEN_BURST
    trusted_proxy_header: str | None = None
    trusted_proxy_hops: int = 1
    video: bool = False  # callers may publish a camera and a screen share (docs/vision.md)

    def __post_init__(self) -> None:
        for room in self.allowed_rooms:
            if not NAME_PATTERN.fullmatch(room):
                raise ConfigError(f"WEB_ROOMS: {room!r} is not 1-64 characters of A-Z a-z 0-9 _ . -")
        if self.link_secret is not None and len(self.link_secret) < LINK_SECRET_MIN_CHARS:
            raise ConfigError(f"WEB_LINK_SECRET must be at least {LINK_SECRET_MIN_CHARS} characters "
                              "(e.g. `openssl rand -hex 32`)")
        low, high = TOKEN_TTL_RANGE_S
        if not low <= self.token_ttl_s <= high:
            raise ConfigError(f"WEB_TOKEN_TTL_S must be between {low} and {high} seconds (got {self.token_ttl_s})")
        if not (math.isfinite(self.tokens_per_minute) and self.tokens_per_minute > 0):
            raise ConfigError(f"WEB_TOKENS_PER_MINUTE must be above 0 (got {self.tokens_per_minute})")
        if self.token_burst < 1:
            raise ConfigError(f"WEB_TOKEN_BURST must be at least 1 (got {self.token_burst})")
        if self.trusted_proxy_hops < 1:
            raise ConfigError(f"WEB_TRUSTED_PROXY_HOPS must be at least 1 (got {self.trusted_proxy_hops})")

    @classmethod
    def from_env(cls) -> TokenConfig:
        rooms = os.environ.get("WEB_ROOMS", "")
        return cls(
            public_url=os.environ.get("LIVEKIT_PUBLIC_URL") or os.environ.get("LIVEKIT_URL", "ws://127.0.0.1:7880"),
            api_key=os.environ.get("LIVEKIT_API_KEY", DEV_API_KEY),
            api_secret=os.environ.get("LIVEKIT_API_SECRET", DEV_API_SECRET),
            agent_name=os.environ.get("AGENT_NAME") or None,
            allowed_rooms=frozenset(r.strip() for r in rooms.split(",") if r.strip()),
            link_secret=os.environ.get("WEB_LINK_SECRET") or None,
            token_ttl_s=int(_env_number("WEB_TOKEN_TTL_S", DEFAULT_TOKEN_TTL_S, int)),
            tokens_per_minute=_env_number("WEB_TOKENS_PER_MINUTE", DEFAULT_TOKENS_PER_MINUTE),
            token_burst=int(_env_number("WEB_TOKEN_BURST", DEFAULT_TOKEN_BURST, int)),
            trusted_proxy_header=os.environ.get("WEB_TRUSTED_PROXY_HEADER") or None,
            trusted_proxy_hops=int(_env_number("WEB_TRUSTED_PROXY_HOPS", 1, int)),
            video=_env_flag("WEB_VIDEO"),
        )

    @property
    def uses_dev_keys(self) -> bool:
        return self.api_key == DEV_API_KEY and self.api_secret == DEV_API_SECRET


class RateLimiter:
    """A token bucket per client: `burst` requests at once, then `per_minute` a minute."""

    def __init__(self, per_minute: float, burst: int, clock: Callable[[], float] = time.monotonic,
                 max_clients: int = MAX_TRACKED_CLIENTS) -> None:
        self.rate = per_minute / 60.0
        self.burst = float(burst)
        self.clock = clock
        self.max_clients = max_clients
        self.buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # key -> (tokens, when)

    def take(self, key: str) -> float:
        """0 when the request may go ahead (and it is counted), else the seconds until it may."""
        now = self.clock()
        tokens, when = self.buckets.pop(key, (self.burst, now))
        tokens = min(self.burst, tokens + (now - when) * self.rate)
        self.buckets[key] = (tokens - 1.0, now) if tokens >= 1.0 else (tokens, now)
        while len(self.buckets) > self.max_clients:
            self.buckets.popitem(last=False)
        return 0.0 if tokens >= 1.0 else (1.0 - tokens) / self.rate


def client_key(request: web.Request, config: TokenConfig) -> str:
    """The address a rate limit counts: the peer's, or the one the trusted proxy reports.

    The header is read only when the operator names it: otherwise any client could send its
    own and get a fresh allowance with each made-up address. Of a comma-separated list (each
    proxy appends the address it saw) the entry `trusted_proxy_hops` from the end is taken:
    everything before it was written by the client. IPv6 clients are counted per /64, the
    block one subscriber usually holds.
    """
    address = request.remote or "unknown"
    if config.trusted_proxy_header:
        values = [v.strip() for line in request.headers.getall(config.trusted_proxy_header, [])
                  for v in line.split(",") if v.strip()]
        if len(values) >= config.trusted_proxy_hops:
            address = values[-config.trusted_proxy_hops]
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address[:64]
    if ip.version == 6:
        if ip.ipv4_mapped is not None:  # ::ffff:a.b.c.d, an IPv4 client on a dual-stack socket
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


CONFIG = web.AppKey("config", TokenConfig)
PAGE_DIR = web.AppKey("page_dir", Path)
LIMITER = web.AppKey("limiter", RateLimiter)


class BadRequest(ValueError):
    """A request the client must fix (400)."""

    status = 400


class NotAllowed(BadRequest):
    """A request this server's operator does not allow (403)."""

    status = 403


def checked_name(value: str | None, kind: str) -> str | None:
    """`value` if it is a safe name, None if absent."""
    if value is None or value == "":
        return None
    if not NAME_PATTERN.fullmatch(value):
        raise BadRequest(f"{kind} must be 1-64 characters of A-Z a-z 0-9 _ . - (got {value!r})")
    return value


def link_signature(secret: str, room: str, identity: str | None, expires: int) -> str:
    message = "\n".join(("omni-voice-link", room, identity or "", str(expires))).encode()
    digest = hmac.new(secret.encode(), message, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def signed_link_query(secret: str, room: str, identity: str | None, valid_for_s: int,
                      now: float | None = None) -> str:
    """The query string of a link that lets its holder ask for `room` (and `identity`)."""
    expires = int((time.time() if now is None else now) + valid_for_s)
    params = {"room": room, **({"identity": identity} if identity else {}), "expires": str(expires),
              "sig": link_signature(secret, room, identity, expires)}
    return urlencode(params)


def room_and_identity(config: TokenConfig, room: str | None, identity: str | None,
                      query: dict) -> tuple[str, str]:
    """The room and identity a token is for: the server's own fresh names, unless the operator
    allowed the ones asked for (a room in WEB_ROOMS, or a link signed with WEB_LINK_SECRET)."""
    sig, expires = query.get("sig"), query.get("expires")
    if sig is not None or expires is not None:
        if room is None or not sig or not expires:
            raise BadRequest("a signed link needs room, expires and sig together")
        if config.link_secret is None:
            raise NotAllowed("this server does not accept signed links (no WEB_LINK_SECRET)")
        if not re.fullmatch(r"[0-9]{1,12}", expires):
            raise BadRequest(f"expires must be a whole number of seconds since 1970 (got {expires[:32]!r})")
        expires_at = int(expires)
        # as bytes: compare_digest refuses str with non-ASCII characters, which a client may send
        expected = link_signature(config.link_secret, room, identity, expires_at)
        if not hmac.compare_digest(sig.encode(), expected.encode()):
            raise NotAllowed("the link's signature does not match its room and identity: ask for a new link")
        if expires_at < time.time():
            when = datetime.datetime.fromtimestamp(expires_at, datetime.UTC).isoformat(timespec="seconds")
            raise NotAllowed(f"the link expired at {when}: ask for a new link")
    else:
        if identity is not None:
            raise NotAllowed("this server picks the participant identity; choosing one needs a link "
                             "signed by the operator")
        if room is not None and room not in config.allowed_rooms:
            raise NotAllowed(f"this server picks the room; room {room!r} needs a link signed by the "
                             "operator (or the operator's WEB_ROOMS)")
    return (room or f"omni-{secrets.token_hex(8)}", identity or f"web-{secrets.token_hex(8)}")


def checked_display_name(value: object, identity: str) -> str:
    if value is None or value == "":
        return identity
    if not isinstance(value, str) or len(value) > DISPLAY_NAME_MAX or not value.isprintable():
        raise BadRequest(f"participant_name must be printable text of at most {DISPLAY_NAME_MAX} characters")
    return value


def checked_room_config(value: object, config: TokenConfig) -> None:
    """Clients may only ask for what the token carries anyway: this server's agent, dispatched."""
    if value is None or value == {}:
        return
    agents = value.get("agents") if isinstance(value, dict) else None
    if not isinstance(value, dict) or set(value) != {"agents"} or not isinstance(agents, list):
        raise BadRequest("room_config: only `agents` (the dispatch of this server's agent) may be set")
    for agent in agents:
        name = agent.get("agent_name") if isinstance(agent, dict) else None
        if not isinstance(agent, dict) or set(agent) - {"agent_name", "metadata"} or agent.get("metadata"):
            raise BadRequest("room_config.agents: only agent_name may be set")
        if name != (config.agent_name or ""):
            allowed = repr(config.agent_name) if config.agent_name else "none (the agent joins every room)"
            raise BadRequest(f"room_config.agents: agent {name!r} cannot be dispatched here; allowed: {allowed}")


def create_token(config: TokenConfig, room: str, identity: str, name: str | None = None) -> str:
    # What a caller needs and nothing more: join this one room, publish a microphone (and, with
    # WEB_VIDEO, a camera and a screen share, for an agent that watches), hear the agent. No
    # data publishing (the page sends none), no metadata of its own, no admin rights.
    grants = api.VideoGrants(
        room_join=True,
        room=room,
        can_publish=True,
        can_publish_sources=["microphone", "camera", "screen_share"] if config.video else ["microphone"],
        can_subscribe=True,
        can_publish_data=False,
        can_update_own_metadata=False,
        room_create=False,
        room_list=False,
        room_record=False,
        room_admin=False,
        ingress_admin=False,
    )
    token = (
        api.AccessToken(config.api_key, config.api_secret)
        .with_identity(identity)
        .with_name(name or identity)
        .with_grants(grants)
        .with_ttl(datetime.timedelta(seconds=config.token_ttl_s))
    )
    if config.agent_name:
        token = token.with_room_config(
            api.RoomConfiguration(agents=[api.RoomAgentDispatch(agent_name=config.agent_name)])
        )
    return token.to_jwt()


def refusal(error: BadRequest) -> web.Response:
    return web.json_response({"error": str(error)}, status=error.status, headers={"Cache-Control": "no-store"})


def rate_limited(request: web.Request) -> web.Response | None:
    wait_s = request.app[LIMITER].take(client_key(request, request.app[CONFIG]))
    if wait_s <= 0:
        return None
    retry = max(1, math.ceil(wait_s))
    return web.json_response({"error": f"too many token requests from your address: try again in {retry} s"},
                             status=429, headers={"Retry-After": str(retry), "Cache-Control": "no-store"})


async def handle_token(request: web.Request) -> web.Response:
    config = request.app[CONFIG]
    if limited := rate_limited(request):
        return limited
    try:
        room, identity = room_and_identity(
            config, checked_name(request.query.get("room"), "room"),
            checked_name(request.query.get("identity"), "identity"), request.query)
    except BadRequest as error:
        return refusal(error)
    token = create_token(config, room, identity)
    logger.info("issued a token for %s in room %s", identity, room)
    return web.json_response(
        {"url": config.public_url, "token": token, "room": room, "identity": identity, "video": config.video},
        headers={"Cache-Control": "no-store"},
    )


async def handle_token_source(request: web.Request) -> web.Response:
    """LiveKit's standard token endpoint (POST, JSON in, 201 {server_url, participant_token})."""
    config = request.app[CONFIG]
    if limited := rate_limited(request):
        return limited
    try:
        try:
            body = await request.json() if request.can_read_body else {}
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise BadRequest(f"the body must be a JSON object ({error})") from None
        if not isinstance(body, dict):
            raise BadRequest("the body must be a JSON object")
        if unknown := set(body) - TOKEN_SOURCE_FIELDS:
            raise BadRequest(f"unknown fields: {', '.join(sorted(unknown))}")
        for field in ("participant_metadata", "participant_attributes"):
            if body.get(field):
                raise BadRequest(f"{field} cannot be set by clients of this server")
        for field in ("room_name", "participant_identity"):
            if body.get(field) is not None and not isinstance(body[field], str):
                raise BadRequest(f"{field} must be a string")
        room, identity = room_and_identity(
            config, checked_name(body.get("room_name"), "room_name"),
            checked_name(body.get("participant_identity"), "participant_identity"), request.query)
        name = checked_display_name(body.get("participant_name"), identity)
        checked_room_config(body.get("room_config"), config)
    except BadRequest as error:
        return refusal(error)
    token = create_token(config, room, identity, name)
    logger.info("issued a token for %s in room %s", identity, room)
    return web.json_response(
        {"server_url": config.public_url, "participant_token": token, "room_name": room,
         "participant_identity": identity, "participant_name": name},
        status=201,
        headers={"Cache-Control": "no-store"},
    )


async def handle_health(request: web.Request) -> web.Response:
    page_dir = request.app[PAGE_DIR]
    return web.json_response({"status": "ok", "page_built": (page_dir / "index.html").is_file()})


async def handle_page_file(request: web.Request) -> web.StreamResponse:
    # The built page is flat (index.html, app.js, style.css, app.js.map) and the route's pattern has
    # no "/", so a request cannot reach outside it.
    page_dir = request.app[PAGE_DIR]
    name = request.match_info.get("name") or "index.html"
    path = page_dir / name
    if path.is_file():
        return web.FileResponse(path)
    if not (page_dir / "index.html").is_file():
        return web.Response(
            status=503,
            text="The page is not built yet: run `npm ci && npm run build` in web/, then reload.\n",
        )
    raise web.HTTPNotFound()


def create_app(config: TokenConfig, page_dir: Path = DIST_DIR,
               clock: Callable[[], float] = time.monotonic) -> web.Application:
    app = web.Application()
    app[CONFIG] = config
    app[PAGE_DIR] = page_dir
    app[LIMITER] = RateLimiter(config.tokens_per_minute, config.token_burst, clock)
    app.router.add_get("/token", handle_token)
    app.router.add_post("/token", handle_token_source)
    app.router.add_get("/health", handle_health)
    app.router.add_get("/", handle_page_file)
    app.router.add_get("/{name:[A-Za-z0-9_.-]+}", handle_page_file)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description="Serve the browser client and its LiveKit tokens.")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8080, help="port to listen on (default 8080)")
    parser.add_argument("--sign-link", metavar="ROOM",
                        help="print a link to the page that lets its holder join ROOM (needs WEB_LINK_SECRET), "
                             "then exit")
    parser.add_argument("--link-identity", metavar="ID", help="with --sign-link: the participant identity too")
    parser.add_argument("--valid-for", type=int, default=86400, metavar="SECONDS",
                        help="with --sign-link: how long the link works (default 86400)")
    parser.add_argument("--page-url", default="https://voice.example.com/",
                        help="with --sign-link: the page's address (default https://voice.example.com/)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    try:
        config = TokenConfig.from_env()
        if args.sign_link is not None:
            if config.link_secret is None:
                raise ConfigError("--sign-link needs WEB_LINK_SECRET (the same key the server runs with)")
            for value, kind in ((args.sign_link, "room"), (args.link_identity, "identity")):
                checked_name(value, kind)
            if args.valid_for < 1:
                raise ConfigError("--valid-for must be at least 1 second")
    except (ConfigError, BadRequest) as error:
        sys.exit(f"web/server.py: {error}")
    if args.sign_link is not None:
        query = signed_link_query(config.link_secret, args.sign_link, args.link_identity, args.valid_for)
        print(f"{args.page_url}?{query}")
        return
    if config.uses_dev_keys:
        logger.warning("using the development API key and secret (devkey/secret): not for production")
    if not DIST_DIR.is_dir():
        logger.warning("%s does not exist: run `npm ci && npm run build` in web/", DIST_DIR)
    logger.info("tokens for %s (valid %d s; %g a minute per client address, %d at once%s); page on http://%s:%d/",
                config.public_url, config.token_ttl_s, config.tokens_per_minute, config.token_burst,
                f"; client address from {config.trusted_proxy_header}" if config.trusted_proxy_header else "",
                args.host, args.port)
    web.run_app(create_app(config), host=args.host, port=args.port, print=None)


if __name__ == "__main__":
    main()
