"""AGENT_VISION: which of the caller's tracks the agent watches, kept as tracks come and go,
and what it tells the room (attributes, `vision_frame` events)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from livekit import rtc

from agent.agent import room_options
from agent.config import AgentSettings
from agent.vision import ATTRIBUTE, NO_TRACK, WATCHING_ATTRIBUTE, VisionWatcher, preferred_track

CAMERA, SCREEN, MIC = rtc.TrackSource.SOURCE_CAMERA, rtc.TrackSource.SOURCE_SCREENSHARE, rtc.TrackSource.SOURCE_MICROPHONE


def track(sid: str, source: int) -> SimpleNamespace:
    kind = rtc.TrackKind.KIND_AUDIO if source == MIC else rtc.TrackKind.KIND_VIDEO
    return SimpleNamespace(sid=sid, source=source, kind=kind)


@pytest.mark.parametrize("vision, tracks, chosen", [
    ("camera", [track("m", MIC), track("c", CAMERA)], "c"),
    ("camera", [track("c", CAMERA), track("s", SCREEN)], "s"),  # a screen share first
    ("screen", [track("c", CAMERA)], None),
    ("screen", [track("c", CAMERA), track("s", SCREEN)], "s"),
    ("off", [track("c", CAMERA), track("s", SCREEN)], None),
    ("camera", [track("m", MIC)], None),
])
def test_preferred_track(vision, tracks, chosen):
    picked = preferred_track(tracks, vision)
    assert (picked.sid if picked else None) == chosen


class FakeRoom:
    def __init__(self) -> None:
        self.handlers: dict[str, list] = {}
        self.attributes: list[dict[str, str]] = []
        self.local_participant = SimpleNamespace(set_attributes=self._set)

    async def _set(self, attributes: dict[str, str]) -> None:
        self.attributes.append(attributes)

    def on(self, name: str, handler) -> None:
        self.handlers.setdefault(name, []).append(handler)

    def off(self, name: str, handler) -> None:
        self.handlers[name].remove(handler)

    def isconnected(self) -> bool:
        return True

    def emit(self, name: str, *args: Any) -> None:
        for handler in self.handlers.get(name, []):
            handler(*args)


async def test_the_watcher_follows_the_callers_tracks_and_tells_the_room():
    pinned: list[str | None] = []
    caller = SimpleNamespace(track_publications={"m": track("m", MIC)})
    session = SimpleNamespace(input=SimpleNamespace(video=SimpleNamespace(set_track_sid=pinned.append)),
                              room_io=SimpleNamespace(linked_participant=caller),
                              current_agent=SimpleNamespace(realtime_llm_session=None))
    room = FakeRoom()
    published: list[tuple[str, dict]] = []
    watcher = VisionWatcher("camera", room, session, lambda kind, **fields: published.append((kind, fields)))
    watcher.attach()
    caller.track_publications["c"] = track("c", CAMERA)
    room.emit("track_subscribed")
    caller.track_publications["s"] = track("s", SCREEN)
    room.emit("track_published")
    del caller.track_publications["s"]
    room.emit("track_unpublished")
    await asyncio.sleep(0)
    assert pinned == [NO_TRACK, "c", "s", "c"]
    assert [a[WATCHING_ATTRIBUTE] for a in room.attributes] == ["none", "camera", "screen", "camera"]
    assert {a[ATTRIBUTE] for a in room.attributes} == {"camera"}
    watcher._frames_attached({"item_id": "item_1", "frames": 1, "sent": 3, "dropped": 7})
    assert published == [("vision_frame", {"frames": 1, "item_id": "item_1", "sent": 3, "dropped": 7})]
    watcher.detach()
    assert not any(room.handlers.values())


async def test_a_screen_shared_before_the_caller_is_linked_is_watched_once_they_are(monkeypatch):
    """RoomIO links a caller already in the room a moment after the session starts, with no
    room event for tracks published before: the watcher looks again once the caller is linked."""
    monkeypatch.setattr("agent.vision.LINK_POLL_S", 0.01)
    pinned: list[str | None] = []
    room_io = SimpleNamespace(linked_participant=None)
    session = SimpleNamespace(input=SimpleNamespace(video=SimpleNamespace(set_track_sid=pinned.append)),
                              room_io=room_io, current_agent=SimpleNamespace(realtime_llm_session=None))
    room = FakeRoom()
    watcher = VisionWatcher("camera", room, session, lambda kind, **fields: None)
    watcher.attach()
    room_io.linked_participant = SimpleNamespace(track_publications={"s": track("s", SCREEN)})
    for _ in range(50):
        await asyncio.sleep(0.01)
        if pinned[-1:] == ["s"]:
            break
    assert pinned == [NO_TRACK, "s"]
    assert [a[WATCHING_ATTRIBUTE] for a in room.attributes] == ["none", "screen"]
    watcher.detach()


def test_video_input_follows_the_setting(monkeypatch):
    monkeypatch.setenv("AGENT_VISION", "off")
    assert not room_options(AgentSettings()).video_input
    monkeypatch.setenv("AGENT_VISION", "camera")
    assert room_options(AgentSettings()).video_input is True
    monkeypatch.setenv("AGENT_VISION", "everything")
    with pytest.raises(ValueError):
        AgentSettings()
