"""The browser client's token endpoint and page server (web/server.py), over real HTTP.

No LiveKit server is needed: tokens are checked by verifying their signature and grants.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer
from livekit import api

from web.server import TokenConfig, create_app, signed_link_query

API_KEY = "test-key"
API_SECRET = "test-secret-that-is-long-enough-for-hmac-sha256"
LINK_SECRET = "link-secret-of-the-operator-long-enough"


def make_config(**overrides) -> TokenConfig:
    values = dict(
        public_url="wss://livekit.example.com",
        api_key=API_KEY,
        api_secret=API_SECRET,
    )
    return TokenConfig(**{**values, **overrides})


@pytest.fixture
def built_page(tmp_path: Path) -> Path:
    (tmp_path / "index.html").write_text("<!doctype html><title>client</title>")
    (tmp_path / "app.js").write_text("console.log('client')")
    return tmp_path


async def client_for(config: TokenConfig, page_dir: Path) -> TestClient:
    client = TestClient(TestServer(create_app(config, page_dir)))
    await client.start_server()
    return client


async def test_token_lets_one_participant_join_one_room(built_page):
    client = await client_for(make_config(link_secret=LINK_SECRET), built_page)
    try:
        response = await client.get(f"/token?{signed_link_query(LINK_SECRET, 'support-42', 'alice', 600)}")
        assert response.status == 200
        assert response.headers["Cache-Control"] == "no-store"
        body = await response.json()
    finally:
        await client.close()

    assert body["url"] == "wss://livekit.example.com"
    assert (body["room"], body["identity"]) == ("support-42", "alice")
    assert API_SECRET not in str(body)

    claims = api.TokenVerifier(API_KEY, API_SECRET).verify(body["token"])
    assert claims.identity == "alice"
    assert claims.video.room_join is True
    assert claims.video.room == "support-42"
    assert claims.video.can_publish and claims.video.can_subscribe
    assert claims.video.can_publish_sources == ["microphone"]
    assert not claims.video.can_publish_data and not claims.video.can_update_own_metadata
    assert not claims.video.room_admin and not claims.video.room_create and not claims.video.room_list
    assert claims.room_config is None  # no explicit dispatch: agents without a name join every room


async def test_token_signed_with_another_secret_is_rejected(built_page):
    client = await client_for(make_config(), built_page)
    try:
        body = await (await client.get("/token")).json()
    finally:
        await client.close()
    with pytest.raises(Exception):
        api.TokenVerifier(API_KEY, "some-other-secret-that-is-long-enough-too").verify(body["token"])


async def test_every_visitor_gets_a_fresh_room_and_identity(built_page):
    client = await client_for(make_config(), built_page)
    try:
        first = await (await client.get("/token")).json()
        second = await (await client.get("/token")).json()
    finally:
        await client.close()
    assert first["room"].startswith("omni-") and first["identity"].startswith("web-")
    assert first["room"] != second["room"]
    assert first["identity"] != second["identity"]


@pytest.mark.parametrize("query", [{"room": "../etc"}, {"room": "a b"}, {"identity": "x" * 65}])
async def test_bad_names_are_refused_with_a_reason(built_page, query):
    client = await client_for(make_config(), built_page)
    try:
        response = await client.get("/token", params=query)
        body = await response.json()
    finally:
        await client.close()
    assert response.status == 400
    assert "must be 1-64 characters" in body["error"]


async def test_named_agent_is_dispatched_through_the_token(built_page):
    client = await client_for(make_config(agent_name="omni-agent"), built_page)
    try:
        body = await (await client.get("/token")).json()
    finally:
        await client.close()
    claims = api.TokenVerifier(API_KEY, API_SECRET).verify(body["token"])
    assert [dispatch.agent_name for dispatch in claims.room_config.agents] == ["omni-agent"]


async def test_serves_the_built_page_and_nothing_outside_it(built_page):
    (built_page.parent / "secret.txt").write_text("not for browsers")
    client = await client_for(make_config(), built_page)
    try:
        index = await client.get("/")
        script = await client.get("/app.js")
        escape = await client.get("/..%2Fsecret.txt")
        missing = await client.get("/nope.js")
        health = await (await client.get("/health")).json()
        assert "<title>client</title>" in await index.text()
        assert script.status == 200
    finally:
        await client.close()
    assert escape.status == 404
    assert missing.status == 404
    assert health == {"status": "ok", "page_built": True}


async def test_unbuilt_page_says_how_to_build_it(tmp_path):
    client = await client_for(make_config(), tmp_path / "dist")
    try:
        response = await client.get("/")
        text = await response.text()
    finally:
        await client.close()
    assert response.status == 503
    assert "npm ci && npm run build" in text


def test_config_defaults_to_the_livekit_dev_server(monkeypatch):
    for name in ("LIVEKIT_URL", "LIVEKIT_PUBLIC_URL", "LIVEKIT_API_KEY", "LIVEKIT_API_SECRET", "AGENT_NAME"):
        monkeypatch.delenv(name, raising=False)
    config = TokenConfig.from_env()
    assert config.public_url == "ws://127.0.0.1:7880"
    assert config.uses_dev_keys and config.agent_name is None

    monkeypatch.setenv("LIVEKIT_URL", "ws://livekit:7880")
    monkeypatch.setenv("LIVEKIT_API_SECRET", "prod-secret")
    assert TokenConfig.from_env().public_url == "ws://livekit:7880"
    assert not TokenConfig.from_env().uses_dev_keys

    monkeypatch.setenv("LIVEKIT_PUBLIC_URL", "wss://livekit.example.com")
    assert TokenConfig.from_env().public_url == "wss://livekit.example.com"
