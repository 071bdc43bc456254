"""POST /token: LiveKit's standard token endpoint (the client SDKs' endpoint TokenSource), over real HTTP."""

from __future__ import annotations

import pytest
from aiohttp.test_utils import TestClient, TestServer
from livekit import api

from web.server import TokenConfig, create_app, signed_link_query

API_KEY = "test-key"
API_SECRET = "test-secret-that-is-long-enough-for-hmac-sha256"
LINK_SECRET = "link-secret-of-the-operator-long-enough"


@pytest.fixture
async def client(tmp_path):
    config = TokenConfig(public_url="wss://livekit.example.com", api_key=API_KEY, api_secret=API_SECRET,
                         agent_name="omni-agent", link_secret=LINK_SECRET, token_burst=100)
    client = TestClient(TestServer(create_app(config, tmp_path)))
    await client.start_server()
    yield client
    await client.close()


async def test_room_identity_and_name_from_the_request_with_a_signed_link(client):
    query = signed_link_query(LINK_SECRET, "support-42", "alice", 600)
    response = await client.post(f"/token?{query}", json={
        "room_name": "support-42", "participant_identity": "alice", "participant_name": "Alice A.",
        "room_config": {"agents": [{"agent_name": "omni-agent"}]},
    })
    assert response.status == 201
    assert response.headers["Cache-Control"] == "no-store"
    body = await response.json()
    assert body["server_url"] == "wss://livekit.example.com"
    claims = api.TokenVerifier(API_KEY, API_SECRET).verify(body["participant_token"])
    assert (claims.identity, claims.name) == ("alice", "Alice A.")
    assert claims.video.room == "support-42" and claims.video.room_join
    assert [a.agent_name for a in claims.room_config.agents] == ["omni-agent"]
    assert (body["room_name"], body["participant_identity"]) == ("support-42", "alice")


async def test_an_empty_request_gets_a_fresh_room_and_identity(client):
    first = await (await client.post("/token")).json()
    second = await (await client.post("/token", json={})).json()
    assert first["room_name"].startswith("omni-") and first["participant_identity"].startswith("web-")
    assert first["room_name"] != second["room_name"]
    claims = api.TokenVerifier(API_KEY, API_SECRET).verify(first["participant_token"])
    assert claims.video.room == first["room_name"]


@pytest.mark.parametrize(("body", "reason"), [
    ({"room_name": "../etc"}, "room_name must be"),
    ({"participant_identity": 7}, "participant_identity must be a string"),
    ({"participant_name": "x" * 129}, "participant_name must be"),
    ({"participant_metadata": "{\"admin\": true}"}, "participant_metadata cannot be set"),
    ({"participant_attributes": {"role": "admin"}}, "participant_attributes cannot be set"),
    ({"room_config": {"agents": [{"agent_name": "someone-else"}]}}, "cannot be dispatched here"),
    ({"room_config": {"max_participants": 100}}, "only `agents`"),
    ({"room_name": "a", "can_publish_sources": ["camera"]}, "unknown fields: can_publish_sources"),
    ([1, 2], "must be a JSON object"),
])
async def test_what_the_server_does_not_allow_is_refused_with_the_reason(client, body, reason):
    response = await client.post("/token", json=body)
    assert response.status == 400
    assert reason in (await response.json())["error"]


async def test_a_body_that_is_not_json_is_refused(client):
    response = await client.post("/token", data=b"room_name=x", headers={"Content-Type": "application/json"})
    assert response.status == 400
    assert "JSON object" in (await response.json())["error"]


async def test_get_still_serves_the_page(client):
    response = await client.get("/token")
    assert response.status == 200
    body = await response.json()
    assert body["room"].startswith("omni-") and body["identity"].startswith("web-")


@pytest.mark.parametrize("body", [{"room_name": "support-42"}, {"participant_identity": "alice"}])
async def test_room_and_identity_chosen_without_the_operator_are_refused(client, body):
    response = await client.post("/token", json=body)
    assert response.status == 403
    assert "this server picks the" in (await response.json())["error"]
