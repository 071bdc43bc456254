"""Video with its speech (AGENT_VISION_MODE=with_speech, docs/vision.md) in a real LiveKit room.

The shared stack's agent sends pictures; this module starts a second agent process of its own,
with AGENT_VISION=camera and AGENT_VISION_MODE=with_speech, against the same LiveKit server and
omni worker. It registers under an agent name, so only a room that asks for it by name gets it
(the caller's token's room configuration), and the shared stack's agent, registered without a
name, stays out of that room. It greets no one: the caller speaks first, which saves a reply.

A caller publishes a camera whose picture changes every half second (a synthetic 640×360
scene) and asks one question of about 4 s. What is checked, through what the caller and the
worker's metrics show:
- the room holds this agent alone, and it says it watches the camera;
- the turn goes with several frames (the `vision_frame` event of its commit: the scene moved
  while the caller spoke, so the plugin kept more than the one frame it carries over);
- the worker reads the turn as a video: `omni_input_video_tokens_total` rises, by whole frame
  groups of 280×168 frames (60 video tokens each for Qwen2.5-Omni, the tiny model's family),
  and the turn's frame count is what 2 frames a second give over the turn's audio (the speech,
  plus what the agent's VAD keeps around it);
- the agent answers (its voice is heard after the question).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator

import numpy as np
import pytest
from livekit import rtc

from scripts.stack import Process, Stack, voice_agent

from .caller import Caller, MovingScreen, load_wav
from .conftest import WORKER_PORT, LocalStack

pytestmark = pytest.mark.e2e

AGENT_NAME = "vision-with-speech"  # explicit dispatch: only this module's rooms get this agent
TIMEOUT_S = 60.0
WIDTH, HEIGHT = 640, 360
# the worker's frame budget (224² pixels) on Qwen2.5-Omni's 28 px grid: 640×360 → 280×168
FRAME_W, FRAME_H, TOKEN_PX = 280, 168, 28
TOKENS_PER_GROUP = (FRAME_W // TOKEN_PX) * (FRAME_H // TOKEN_PX)  # one video token covers 2 frames
FPS, FRAMES_PER_GROUP = 2.0, 2  # Qwen2.5-Omni's processor defaults (VideoSpec)
# audio a committed turn holds beyond the speech itself: the VAD's padding before it and the
# silence after it up to the commit (a speculative one at the VAD's end of speech, or the
# turn detector's, at most AGENT_MAX_ENDPOINTING_DELAY_S later)
MAX_EXTRA_AUDIO_S = 4.0


def scene(step: int) -> np.ndarray:
    """A dark room with a bright square that moves a fifth of the picture each step."""
    y, x = np.mgrid[0:HEIGHT, 0:WIDTH]
    pixels = np.stack([x * 60 // WIDTH, y * 60 // HEIGHT, np.full_like(x, 40)], axis=-1).astype(np.uint8)
    left = (step % 5) * WIDTH // 5
    pixels[HEIGHT // 3:2 * HEIGHT // 3, left:left + WIDTH // 5] = (230, 200, 60)
    return pixels


@pytest.fixture(scope="module")
def speech_video_agent(local_stack: LocalStack) -> Iterator[Process]:
    service = voice_agent(livekit_url=local_stack.livekit_url,
                          omni_url=f"ws://127.0.0.1:{WORKER_PORT}/v1/realtime",
                          env={"AGENT_NAME": AGENT_NAME, "AGENT_VISION": "camera",
                               "AGENT_VISION_MODE": "with_speech", "AGENT_GREETING": ""})
    service.name = "agent-video"
    stack = Stack(echo=None, log_dir=local_stack.log_dir)
    try:
        yield stack.start(service, width=11)
    finally:
        stack.stop()


async def wait_for_attribute(caller: Caller, name: str, value: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        agent = caller.room.remote_participants.get(caller.agent_identity or "")
        if agent is not None and agent.attributes.get(name) == value:
            return
        await asyncio.sleep(0.05)
    agent = caller.room.remote_participants.get(caller.agent_identity or "")
    raise AssertionError(f"the agent's {name} is not {value!r}: {agent.attributes if agent else 'no agent'}")


async def test_a_turn_goes_to_the_worker_as_a_video_with_its_speech(
        local_stack: LocalStack, speech_video_agent: Process) -> None:
    caller = await Caller.join(local_stack.livekit_url, f"vision-speech-{uuid.uuid4().hex[:8]}",
                               agent_name=AGENT_NAME)
    camera = MovingScreen([scene(step) for step in range(5)], hold_s=0.5)
    try:
        await camera.publish(caller.room, rtc.TrackSource.SOURCE_CAMERA)
        audio = await caller.wait_for_agent(timeout=TIMEOUT_S)
        await wait_for_attribute(caller, "omni.vision.watching", "camera", timeout=TIMEOUT_S)
        agents = [p.identity for p in caller.room.remote_participants.values()
                  if p.kind == rtc.ParticipantKind.PARTICIPANT_KIND_AGENT]
        assert agents == [caller.agent_identity], f"agents in the room: {agents}"
        assert caller.room.remote_participants[caller.agent_identity].attributes.get("omni.vision") == "camera"

        metric = local_stack.worker_metric
        tokens_before = metric("omni_input_video_tokens_total")
        fresh_before = metric("omni_input_video_tokens_total", cached="false")
        question = np.concatenate([load_wav("e2e_q1_time.wav"), load_wav("e2e_q2_weather.wav")])
        said = await caller.mic.say(question)
        spoken_s = said.ended_at - said.started_at
        answered_at = await audio.first_voice_after(said.ended_at, timeout=TIMEOUT_S)
        attached = await caller.wait_for_event("vision_frame", after=said.started_at, timeout=TIMEOUT_S)
        # the reply's usage reaches the metrics once it is generated (before its audio has
        # played out: no need to listen to the end)
        await local_stack.wait_for_metric_above("omni_input_video_tokens_total", tokens_before, timeout=TIMEOUT_S)
        await asyncio.sleep(1.0)  # and a withdrawn speculative reply's, if there was one

        read = metric("omni_input_video_tokens_total") - tokens_before
        fresh = metric("omni_input_video_tokens_total", cached="false") - fresh_before
        turns = caller.events_of("vision_frame", after=said.started_at)
        print(f"\nquestion {spoken_s:.2f} s; frames sent with it {[e['frames'] for e in turns]} "
              f"(plugin: {attached}); video tokens read {read:.0f}, {fresh:.0f} not from the prefix cache "
              f"({fresh / TOKENS_PER_GROUP:.1f} groups of {TOKENS_PER_GROUP}); answered "
              f"{answered_at - said.ended_at:.2f} s after the question")

        assert attached["item_id"] is None, attached  # frames went with the audio, not as a picture item
        assert attached["frames"] >= 2, f"the camera moved while the caller spoke: {attached}"
        assert read > 0 and read % TOKENS_PER_GROUP == 0, read
        # the turn's video, sampled at 2 frames a second over its audio, was read once; a
        # speculative reply withdrawn and its turn committed again with more audio would
        # read a second, longer video of the same turn: each is within the bounds
        assert fresh > 0 and fresh % TOKENS_PER_GROUP == 0, fresh
        frames = int(fresh // TOKENS_PER_GROUP) * FRAMES_PER_GROUP
        least = int(spoken_s * FPS) // FRAMES_PER_GROUP * FRAMES_PER_GROUP
        most = int(np.ceil((spoken_s + MAX_EXTRA_AUDIO_S) * FPS / FRAMES_PER_GROUP)) * FRAMES_PER_GROUP
        assert least <= frames <= most * len(turns), (frames, least, most, turns)
    finally:
        await camera.aclose()
        await caller.aclose()
