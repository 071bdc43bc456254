"""What the agent watches (AGENT_VISION): the caller's camera, their screen share, or nothing.

livekit-agents' RoomIO takes the linked participant's camera or screen share, whichever track
arrived last. Here the choice is made on purpose and kept as tracks come and go: with
`camera`, the screen share when the caller shares one (what they show on purpose) and else
the camera; with `screen`, a screen share only; with `off`, no video input at all. The video
input is pinned to the chosen publication (`set_track_sid`), or to none.

The agent says what it watches in its participant attributes (`omni.vision`: the setting,
`omni.vision.watching`: `screen`, `camera` or `none`), and each time frames go to the model
with a caller's turn it publishes a `vision_frame` event (agent/room_events.py's channel:
`frames`, the `item_id` of the pictures on the worker, and the frame counts so far), which
the page shows.

Which frames reach the model is the plugin's business (provider/livekit/plugins/omni/video.py):
livekit-agents samples about one frame a second while the caller speaks, the plugin drops the
near-identical ones and attaches the newest to the turn. With AGENT_VISION_MODE=with_speech
(provider/livekit/plugins/omni/speech_video.py) it sends the turn's frames placed in its
speech instead, and the worker makes the turn one video (the event's `item_id` is then null).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Literal

from livekit import rtc
from livekit.agents import AgentSession
from livekit.plugins import omni

log = logging.getLogger("omni-agent.vision")

Vision = Literal["camera", "screen", "off"]
# a publication id no track has: the video input then takes nothing
NO_TRACK = "TR_none"
# how long after the session starts the watcher looks for RoomIO's linked caller, and how often
LINK_WAIT_S, LINK_POLL_S = 30.0, 0.1
ATTRIBUTE = "omni.vision"
WATCHING_ATTRIBUTE = "omni.vision.watching"


def preferred_track(publications: list[rtc.TrackPublication], vision: Vision) -> rtc.TrackPublication | None:
    """The publication to watch: a screen share before the camera (`camera`), a screen share
    only (`screen`), none (`off`)."""
    if vision == "off":
        return None
    order = [rtc.TrackSource.SOURCE_SCREENSHARE] + ([rtc.TrackSource.SOURCE_CAMERA] if vision == "camera" else [])
    for source in order:
        for publication in publications:
            if publication.source == source and publication.kind == rtc.TrackKind.KIND_VIDEO:
                return publication
    return None


def watching(publication: rtc.TrackPublication | None) -> str:
    if publication is None:
        return "none"
    return "screen" if publication.source == rtc.TrackSource.SOURCE_SCREENSHARE else "camera"


class VisionWatcher:
    """Keeps the session's video input on the preferred track of the caller, and tells the room."""

    ROOM_EVENTS = ("track_published", "track_unpublished", "track_subscribed", "track_unsubscribed",
                   "participant_connected", "participant_disconnected")

    def __init__(self, vision: Vision, room: rtc.Room, session: AgentSession,
                 publish: Callable[..., None]) -> None:
        self._vision = vision
        self._room = room
        self._session = session
        self._publish = publish
        self._watching: str | None = None
        self._pinned: str | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    def attach(self) -> None:
        """After `session.start`: choose now, and again whenever the caller's tracks change."""
        for name in self.ROOM_EVENTS:
            self._room.on(name, self._changed)
        rt = self._realtime_session()
        if rt is not None:
            rt.on("omni_video_frames_attached", self._frames_attached)
        self.update()
        if self._caller() is None:
            # RoomIO links a caller already in the room a moment after the session starts, and
            # no room event follows for tracks published before that: look again once it has
            self._spawn(self._update_once_linked())

    async def _update_once_linked(self) -> None:
        for _ in range(int(LINK_WAIT_S / LINK_POLL_S)):
            await asyncio.sleep(LINK_POLL_S)
            if self._caller() is not None:
                self.update()
                return

    def detach(self) -> None:
        for name in self.ROOM_EVENTS:
            self._room.off(name, self._changed)
        for task in self._tasks:
            task.cancel()

    def _changed(self, *_: Any) -> None:
        self.update()

    def update(self) -> None:
        video_input = self._session.input.video
        caller = self._caller()
        chosen = preferred_track(list(caller.track_publications.values()), self._vision) if caller else None
        pinned = chosen.sid if chosen is not None else NO_TRACK
        if video_input is not None and pinned != self._pinned and hasattr(video_input, "set_track_sid"):
            video_input.set_track_sid(pinned)
            self._pinned = pinned
        if isinstance(chosen, rtc.RemoteTrackPublication) and chosen.subscribed and chosen.simulcasted:
            # the plugin resizes each frame to the model's budget itself: ask the SFU for the top
            # layer, or a shared screen's text may reach the model from a blurred lower one
            chosen.set_video_quality(rtc.VideoQuality.VIDEO_QUALITY_HIGH)
        now = watching(chosen)
        if now != self._watching:
            self._watching = now
            log.info("vision %s: watching %s", self._vision, now)
            self._set_attributes({ATTRIBUTE: self._vision, WATCHING_ATTRIBUTE: now})

    def _caller(self) -> rtc.RemoteParticipant | None:
        try:
            linked = self._session.room_io.linked_participant
        except RuntimeError:  # no RoomIO (the session is not started, or is closing)
            return None
        return linked

    def _frames_attached(self, event: dict[str, Any]) -> None:
        self._publish("vision_frame", frames=event.get("frames", 0), item_id=event.get("item_id"),
                      sent=event.get("sent", 0), dropped=event.get("dropped", 0))

    def _set_attributes(self, attributes: dict[str, str]) -> None:
        if not self._room.isconnected():
            return
        self._spawn(self._send_attributes(attributes))

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send_attributes(self, attributes: dict[str, str]) -> None:
        try:
            await self._room.local_participant.set_attributes(attributes)
        except Exception as e:  # a closing room must not take the session down
            log.debug("could not set the vision attributes: %s", e)

    def _realtime_session(self) -> omni.RealtimeSession | None:
        try:
            rt = self._session.current_agent.realtime_llm_session
        except RuntimeError:
            return None
        return rt if isinstance(rt, omni.RealtimeSession) else None
