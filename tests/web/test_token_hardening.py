"""The token endpoint is safe to expose as shipped (web/server.py, docs/hardening.md "The
token endpoint"): the server picks room and identity unless the operator allowed the client's
choice, tokens are short-lived with a caller's grants only, and requests are rate-limited per
client address. Over real HTTP; no LiveKit needed."""

from __future__ import annotations

import datetime
import time

import jwt  # PyJWT, livekit-api's own dependency: a token's raw times
import pytest
from aiohttp.test_utils import TestClient, TestServer
from livekit import api

from web.server import ConfigError, NotAllowed, TokenConfig, create_app, room_and_identity, signed_link_query

API_KEY = "test-key"
API_SECRET = "test-secret-that-is-long-enough-for-hmac-sha256"
LINK_SECRET = "link-secret-of-the-operator-long-enough"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make_config(**overrides) -> TokenConfig:
    values = dict(public_url="wss://livekit.example.com", api_key=API_KEY, api_secret=API_SECRET)
    return TokenConfig(**{**values, **overrides})


@pytest.fixture
async def serve(tmp_path):
    clients = []

    async def start(clock=time.monotonic, **overrides) -> TestClient:
        client = TestClient(TestServer(create_app(make_config(**overrides), tmp_path, clock=clock)))
        await client.start_server()
        clients.append(client)
        return client

    yield start
    for client in clients:
        await client.close()


def claims_of(token: str):
    return api.TokenVerifier(API_KEY, API_SECRET).verify(token)


# --------------------------------------------------------------------------- room and identity


@pytest.mark.parametrize("query", [
    {"room": "attacker-room"},                       # a crafted link puts the victim in this room
    {"identity": "agent-AJ_xyz"},                    # the same identity knocks a participant out
    {"room": "support-42", "identity": "alice"},
])
async def test_a_client_cannot_choose_room_or_identity_by_default(serve, query):
    client = await serve()
    response = await client.get("/token", params=query)
    body = await response.json()
    assert response.status == 403
    assert "token" not in body
    assert "this server picks the" in body["error"]


async def test_without_a_choice_the_server_picks_fresh_unguessable_names(serve):
    client = await serve()
    first = await (await client.get("/token")).json()
    second = await (await client.get("/token")).json()
    assert first["room"] != second["room"] and first["identity"] != second["identity"]
    assert len(first["room"]) >= len("omni-") + 16  # 64 random bits
    assert claims_of(first["token"]).video.room == first["room"]


async def test_rooms_the_operator_lists_may_be_asked_for_but_not_identities(serve):
    client = await serve(allowed_rooms=frozenset({"lobby"}))
    listed = await client.get("/token", params={"room": "lobby"})
    other = await client.get("/token", params={"room": "lobby2"})
    named = await client.get("/token", params={"room": "lobby", "identity": "alice"})
    assert listed.status == 200
    assert claims_of((await listed.json())["token"]).video.room == "lobby"
    assert (other.status, named.status) == (403, 403)


async def test_a_signed_link_gives_its_room_and_identity(serve):
    client = await serve(link_secret=LINK_SECRET)
    response = await client.get(f"/token?{signed_link_query(LINK_SECRET, 'support-42', 'alice', 600)}")
    assert response.status == 200
    claims = claims_of((await response.json())["token"])
    assert (claims.video.room, claims.identity) == ("support-42", "alice")
    # a link for a room only: the identity is still the server's
    response = await client.get(f"/token?{signed_link_query(LINK_SECRET, 'support-42', None, 600)}")
    assert (await response.json())["identity"].startswith("web-")


def tampered(query: str, name: str, value: str) -> str:
    return "&".join(f"{name}={value}" if part.startswith(f"{name}=") else part for part in query.split("&"))


@pytest.mark.parametrize(("change", "status", "reason"), [
    (lambda q: tampered(q, "room", "other-room"), 403, "signature does not match"),
    (lambda q: tampered(q, "identity", "bob"), 403, "signature does not match"),
    (lambda q: tampered(q, "expires", str(int(time.time()) + 10**8)), 403, "signature does not match"),
    (lambda q: q.replace("identity=alice&", ""), 403, "signature does not match"),
    (lambda q: tampered(q, "sig", "A" * 43), 403, "signature does not match"),
    (lambda q: tampered(q, "sig", "%C3%A9t%C3%A9"), 403, "signature does not match"),  # non-ASCII
    (lambda q: tampered(q, "expires", "soon"), 400, "whole number"),
    (lambda q: tampered(q, "expires", "-99999999999999999999"), 400, "whole number"),
    (lambda q: tampered(q, "expires", "1_000"), 400, "whole number"),
    (lambda q: q.split("&sig=")[0], 400, "room, expires and sig together"),
])
async def test_a_changed_or_partial_signed_link_is_refused(serve, change, status, reason):
    client = await serve(link_secret=LINK_SECRET)
    response = await client.get(f"/token?{change(signed_link_query(LINK_SECRET, 'support-42', 'alice', 600))}")
    assert response.status == status
    assert reason in (await response.json())["error"]


async def test_an_expired_link_is_refused(serve):
    client = await serve(link_secret=LINK_SECRET)
    query = signed_link_query(LINK_SECRET, "support-42", None, 60, now=time.time() - 3600)
    response = await client.get(f"/token?{query}")
    assert response.status == 403
    assert "expired" in (await response.json())["error"]


async def test_links_signed_with_another_key_or_on_a_server_without_one_are_refused(serve):
    query = signed_link_query("another-operator-key-that-is-long-enough", "support-42", None, 600)
    with_key = await serve(link_secret=LINK_SECRET)
    without_key = await serve()
    assert (await with_key.get(f"/token?{query}")).status == 403
    response = await without_key.get(f"/token?{query}")
    assert response.status == 403
    assert "does not accept signed links" in (await response.json())["error"]


async def test_the_token_source_endpoint_takes_the_same_signed_link(serve):
    client = await serve(link_secret=LINK_SECRET)
    query = signed_link_query(LINK_SECRET, "support-42", None, 600)
    allowed = await client.post(f"/token?{query}", json={"room_name": "support-42"})
    other = await client.post(f"/token?{query}", json={"room_name": "support-43"})
    assert allowed.status == 201
    assert claims_of((await allowed.json())["participant_token"]).video.room == "support-42"
    assert other.status == 403


# --------------------------------------------------------------------------- the token itself


async def test_the_token_lives_minutes_and_grants_only_what_a_caller_needs(serve):
    client = await serve()
    token = (await (await client.get("/token")).json())["token"]
    claims = claims_of(token)
    raw = jwt.decode(token, options={"verify_signature": False})
    assert 0 < raw["exp"] - raw["nbf"] <= 300
    video = claims.video
    assert video.room_join and video.can_subscribe and video.can_publish
    assert video.can_publish_sources == ["microphone"]
    for grant in ("room_admin", "room_create", "room_list", "room_record", "ingress_admin", "can_publish_data",
                  "can_update_own_metadata", "hidden", "recorder", "agent", "can_manage_agent_session"):
        assert not getattr(video, grant), grant


def test_the_token_lifetime_is_bounded():
    assert make_config(token_ttl_s=120).token_ttl_s == 120
    for ttl in (0, 29, 3601, 86400):
        with pytest.raises(ConfigError, match="WEB_TOKEN_TTL_S"):
            make_config(token_ttl_s=ttl)


@pytest.mark.parametrize(("name", "value", "reason"), [
    ("WEB_LINK_SECRET", "short", "at least 32 characters"),
    ("WEB_ROOMS", "lobby,../etc", "WEB_ROOMS"),
    ("WEB_TOKENS_PER_MINUTE", "many", "must be a number"),
    ("WEB_TOKEN_BURST", "0", "at least 1"),
])
def test_bad_settings_stop_the_server_with_the_reason(monkeypatch, name, value, reason):
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=reason):
        TokenConfig.from_env()


def test_settings_from_the_environment(monkeypatch):
    monkeypatch.setenv("WEB_ROOMS", " lobby , demo ")
    monkeypatch.setenv("WEB_TOKEN_TTL_S", "120")
    monkeypatch.setenv("WEB_TRUSTED_PROXY_HEADER", "X-Forwarded-For")
    config = TokenConfig.from_env()
    assert config.allowed_rooms == {"lobby", "demo"}
    assert (config.token_ttl_s, config.trusted_proxy_header, config.trusted_proxy_hops) == (120, "X-Forwarded-For", 1)
    assert config.link_secret is None and config.tokens_per_minute == 6 and config.token_burst == 5


# --------------------------------------------------------------------------- rate limit


async def test_token_requests_are_limited_per_client_address(serve):
    clock = FakeClock()
    client = await serve(clock=clock, token_burst=3, tokens_per_minute=6)
    statuses = [(await client.get("/token")).status for _ in range(3)]
    refused = await client.get("/token")
    posted = await client.post("/token", json={})
    assert statuses == [200, 200, 200]
    assert (refused.status, posted.status) == (429, 429)
    assert "too many token requests" in (await refused.json())["error"]
    assert refused.headers["Retry-After"] == "10"  # 6 a minute: one every 10 s
    assert (await client.get("/health")).status == 200  # probes are never limited
    clock.now += 10
    assert (await client.get("/token")).status == 200
    assert (await client.get("/token")).status == 429


async def test_refused_requests_count_too(serve):
    client = await serve(clock=FakeClock(), token_burst=2)
    for _ in range(2):
        assert (await client.get("/token", params={"room": "guess"})).status == 403
    assert (await client.get("/token")).status == 429


async def test_a_forwarding_header_is_ignored_unless_the_operator_trusts_it(serve):
    client = await serve(clock=FakeClock(), token_burst=2)
    for n in range(2):
        assert (await client.get("/token", headers={"X-Forwarded-For": f"192.0.2.{n}"})).status == 200
    # a made-up address per request buys no fresh allowance
    assert (await client.get("/token", headers={"X-Forwarded-For": "192.0.2.99"})).status == 429


async def test_the_trusted_header_counts_the_address_the_proxy_saw(serve):
    client = await serve(clock=FakeClock(), token_burst=1, trusted_proxy_header="X-Forwarded-For")

    async def status(forwarded: str) -> int:
        return (await client.get("/token", headers={"X-Forwarded-For": forwarded})).status

    assert await status("198.51.100.7") == 200
    assert await status("198.51.100.8") == 200  # another client behind the same proxy
    # the client writes what it likes in front; the proxy appends what it saw, which counts
    assert await status("10.9.9.9, 198.51.100.7") == 429
    assert await status("2001:db8:1:2::1") == 200
    assert await status("2001:db8:1:2::ffff") == 429  # the same /64


async def test_several_trusted_proxies(serve):
    client = await serve(clock=FakeClock(), token_burst=1, trusted_proxy_header="X-Forwarded-For",
                         trusted_proxy_hops=2)
    assert (await client.get("/token", headers={"X-Forwarded-For": "spoof, 198.51.100.7, 10.0.0.2"})).status == 200
    assert (await client.get("/token", headers={"X-Forwarded-For": "other, 198.51.100.7, 10.0.0.3"})).status == 429


def test_the_expired_link_names_when(monkeypatch):
    # the reason shows the expiry in UTC, so the operator can see which link it was
    expires = datetime.datetime(2030, 1, 2, 3, 4, 5, tzinfo=datetime.UTC).timestamp()
    config = make_config(link_secret=LINK_SECRET)
    query = dict(part.split("=") for part in signed_link_query(LINK_SECRET, "r1", None, 0, now=expires).split("&"))
    monkeypatch.setattr(time, "time", lambda: expires + 1)
    with pytest.raises(NotAllowed, match="2030-01-02T03:04:05"):
        room_and_identity(config, "r1", None, query)
