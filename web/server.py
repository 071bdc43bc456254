"""Token endpoint and static file server for the browser client.

    python web/server.py --port 8080

GET /token[?room=NAME&identity=NAME] returns {url, token, room, identity}: a LiveKit access
token that lets one participant join one room (publish the microphone, subscribe to the
agent, send data). The API secret never leaves this process. Without a room or identity in
the query, fresh random names are used, so every visitor gets a room of their own, and the
agent worker is dispatched to that new room automatically.

POST /token is LiveKit's standard token endpoint (what the client SDKs' endpoint TokenSource
calls): a JSON body with any of room_name, participant_identity, participant_name and
room_config (only a dispatch of this server's AGENT_NAME), answered 201 with {server_url,
participant_token, room_name, participant_identity, participant_name}. What this server does not let
clients choose (participant_metadata, participant_attributes, other room settings, other
agents) is refused with 400 and the reason, never silently dropped.

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
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web
from livekit import api

logger = logging.getLogger("web.server")

DEV_API_KEY = "devkey"
DEV_API_SECRET = "secret"
DIST_DIR = Path(__file__).resolve().parent / "dist"
TOKEN_TTL = datetime.timedelta(hours=1)
# LiveKit accepts more, but a narrow alphabet keeps names safe to log and put in URLs.
NAME_PATTERN = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
DISPLAY_NAME_MAX = 128
# The fields of LiveKit's token endpoint request; the last two are refused (see handle_token_source)
TOKEN_SOURCE_FIELDS = {"room_name", "participant_identity", "participant_name", "room_config",
                       "participant_metadata", "participant_attributes"}


@dataclass(frozen=True)
class TokenConfig:
    public_url: str  # the LiveKit URL handed to browsers
    api_key: str
    api_secret: str
    agent_name: str | None = None

    @classmethod
    def from_env(cls) -> TokenConfig:
        return cls(
            public_url=os.environ.get("LIVEKIT_PUBLIC_URL") or os.environ.get("LIVEKIT_URL", "ws://127.0.0.1:7880"),
            api_key=os.environ.get("LIVEKIT_API_KEY", DEV_API_KEY),
            api_secret=os.environ.get("LIVEKIT_API_SECRET", DEV_API_SECRET),
            agent_name=os.environ.get("AGENT_NAME") or None,
        )

    @property
    def uses_dev_keys(self) -> bool:
        return self.api_key == DEV_API_KEY and self.api_secret == DEV_API_SECRET


CONFIG = web.AppKey("config", TokenConfig)
PAGE_DIR = web.AppKey("page_dir", Path)


class BadRequest(ValueError):
    """A query parameter the client must fix."""


def checked_name(value: str | None, kind: str, prefix: str) -> str:
    """Returns `value` if it is a safe name, a fresh random one if absent."""
    if value is None or value == "":
        return f"{prefix}-{secrets.token_hex(4)}"
    if not NAME_PATTERN.fullmatch(value):
        raise BadRequest(f"{kind} must be 1-64 characters of A-Z a-z 0-9 _ . - (got {value!r})")
    return value


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
    grants = api.VideoGrants(
        room_join=True,
        room=room,
        can_publish=True,
        can_subscribe=True,
        can_publish_data=True,
    )
    token = (
        api.AccessToken(config.api_key, config.api_secret)
        .with_identity(identity)
        .with_name(name or identity)
        .with_grants(grants)
        .with_ttl(TOKEN_TTL)
    )
    if config.agent_name:
        token = token.with_room_config(
            api.RoomConfiguration(agents=[api.RoomAgentDispatch(agent_name=config.agent_name)])
        )
    return token.to_jwt()


async def handle_token(request: web.Request) -> web.Response:
    config = request.app[CONFIG]
    try:
        room = checked_name(request.query.get("room"), "room", "omni")
        identity = checked_name(request.query.get("identity"), "identity", "web")
    except BadRequest as error:
        return web.json_response({"error": str(error)}, status=400)
    token = create_token(config, room, identity)
    logger.info("issued a token for %s in room %s", identity, room)
    return web.json_response(
        {"url": config.public_url, "token": token, "room": room, "identity": identity},
        headers={"Cache-Control": "no-store"},
    )


async def handle_token_source(request: web.Request) -> web.Response:
    """LiveKit's standard token endpoint (POST, JSON in, 201 {server_url, participant_token})."""
    config = request.app[CONFIG]
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
        room = checked_name(body.get("room_name"), "room_name", "omni")
        identity = checked_name(body.get("participant_identity"), "participant_identity", "web")
        name = checked_display_name(body.get("participant_name"), identity)
        checked_room_config(body.get("room_config"), config)
    except BadRequest as error:
        return web.json_response({"error": str(error)}, status=400)
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


def create_app(config: TokenConfig, page_dir: Path = DIST_DIR) -> web.Application:
    app = web.Application()
    app[CONFIG] = config
    app[PAGE_DIR] = page_dir
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
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    config = TokenConfig.from_env()
    if config.uses_dev_keys:
        logger.warning("using the development API key and secret (devkey/secret): not for production")
    if not DIST_DIR.is_dir():
        logger.warning("%s does not exist: run `npm ci && npm run build` in web/", DIST_DIR)
    logger.info("tokens for %s; page on http://%s:%d/", config.public_url, args.host, args.port)
    web.run_app(create_app(config), host=args.host, port=args.port, print=None)


if __name__ == "__main__":
    main()
