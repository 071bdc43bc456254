"""WEB_VIDEO: callers may publish a camera and a screen share only when the operator says so
(for an agent with AGENT_VISION on); the page learns it from the token response."""

from __future__ import annotations

import pytest

from tests.web.test_token_hardening import claims_of, serve  # noqa: F401 - the fixture
from web.server import ConfigError, TokenConfig


async def test_video_is_off_by_default(serve):  # noqa: F811
    client = await serve()
    body = await (await client.get("/token")).json()
    assert body["video"] is False
    assert claims_of(body["token"]).video.can_publish_sources == ["microphone"]


async def test_with_video_a_caller_may_publish_a_camera_and_a_screen_share(serve):  # noqa: F811
    client = await serve(video=True)
    body = await (await client.get("/token")).json()
    assert body["video"] is True
    grants = claims_of(body["token"]).video
    assert sorted(grants.can_publish_sources) == ["camera", "microphone", "screen_share"]
    assert not grants.can_publish_data  # still no data, no screen share audio
    # LiveKit's POST convention hands out the same grants
    posted = await (await client.post("/token", json={})).json()
    assert sorted(claims_of(posted["participant_token"]).video.can_publish_sources) == \
        ["camera", "microphone", "screen_share"]


@pytest.mark.parametrize("raw, expected", [("", False), ("false", False), ("1", True), ("TRUE", True)])
def test_the_setting(monkeypatch, raw, expected):
    monkeypatch.setenv("WEB_VIDEO", raw)
    assert TokenConfig.from_env().video is expected


def test_a_bad_setting_stops_the_server(monkeypatch):
    monkeypatch.setenv("WEB_VIDEO", "sometimes")
    with pytest.raises(ConfigError, match="WEB_VIDEO"):
        TokenConfig.from_env()
