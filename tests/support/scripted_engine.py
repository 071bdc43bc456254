"""A test double for the engine: plays a fixed script and records every request it gets.

Used only by gateway tests that must see exactly what the gateway hands the engine
(context after truncation, tools, voice); everything user-facing is also tested against the
real reference engine on tiny-random.
"""

from __future__ import annotations

import asyncio
from typing import AsyncIterator

import numpy as np

from inference import engine as eng


class ScriptedEngine(eng.OmniEngine):
    name = "scripted"
    voices = ("Chelsie", "Ethan")

    def __init__(self, words: int = 5, samples_per_word: int = 4800, step_s: float = 0.01,
                 tool_call: eng.ToolCallDelta | None = None, reads_images: bool = False,
                 image_spec: eng.ImageSpec | None = None, reads_video: bool = False,
                 video_spec: eng.VideoSpec | None = None) -> None:
        super().__init__("scripted-model")
        # pictures and video: read (and counted in usage) when declared, else refused as a real
        # engine must
        self.reads_images = reads_images or reads_video
        self.reads_video = reads_video
        if video_spec is not None:
            self.video_spec = video_spec
        if image_spec is not None:
            self.image_spec = image_spec
        self.cached_image_tokens = 0  # what Finished reports as cached of the pictures' tokens
        self.words, self.samples_per_word, self.step_s = words, samples_per_word, step_s
        self.tool_call = tool_call
        self.fail_after: int | None = None  # raise EngineError after this many words
        self.refuse: eng.EngineError | None = None  # raised before any work, as a refusal is
        self.load_report: eng.EngineLoad | None = None  # what load() answers
        self.keep_items: int | None = None  # truncate: the model reads only the newest this many items
        self.cached_tokens = 0  # what Finished reports as taken from a cache
        self.cached_audio_tokens = 0  # of those, the audio ones
        # seconds between taking a request and its cut (ContextTruncated): an engine renders the
        # prompt off the event loop, so the session handles client events meanwhile
        self.prepare_s = 0.0
        self.ended_sessions: list[str] = []
        self.requests: list[eng.GenerationRequest] = []
        self.steps_run = 0
        self.active = 0

    async def start(self) -> None:
        pass

    async def generate(self, request: eng.GenerationRequest) -> AsyncIterator[eng.Delta]:
        self.requests.append(request)
        if self.refuse is not None:
            raise self.refuse
        self.refuse_unread_media(request)
        self.active += 1
        try:
            if self.prepare_s:
                await asyncio.sleep(self.prepare_s)
            ids = list(dict.fromkeys(item.item_id for item in request.context if item.item_id is not None))
            if self.keep_items is not None and len(ids) > self.keep_items:
                yield eng.ContextTruncated(first_item_id=ids[-self.keep_items],
                                           dropped_items=len(ids) - self.keep_items, dropped_tokens=10)
            kept = set(ids[-self.keep_items:]) if self.keep_items is not None else None
            image_tokens = sum(item.tokens for item in request.context if isinstance(item, eng.UserImage)
                               and (kept is None or item.item_id is None or item.item_id in kept))
            # a video's tokens: frame groups × the tokens of one frame (counted among the image tokens)
            video_tokens = sum(
                item.frames.shape[0] // self.video_spec.frames_per_token * (item.frames.shape[1] // self.image_spec.token_px)
                * (item.frames.shape[2] // self.image_spec.token_px) for item in request.context
                if isinstance(item, eng.UserVideo) and (kept is None or item.item_id is None or item.item_id in kept))
            image_tokens += video_tokens
            yield eng.PromptRead(input_tokens=10 + image_tokens, input_audio_tokens=4, input_image_tokens=image_tokens,
                                 input_video_tokens=video_tokens)
            if self.tool_call and request.tools:
                yield self.tool_call
                yield eng.Finished(reason="tool_calls", input_tokens=10 + image_tokens, output_text_tokens=5,
                                   input_image_tokens=image_tokens)
                return
            for i in range(self.words):
                if i == self.fail_after:
                    raise eng.EngineError("scripted failure")
                await asyncio.sleep(self.step_s)
                self.steps_run += 1
                yield eng.TextDelta(f"word{i} ")
                if "audio" in request.modalities:
                    yield eng.AudioDelta(np.full(self.samples_per_word, 0.1, np.float32))
            yield eng.Finished(input_tokens=10 + image_tokens, input_audio_tokens=4, output_text_tokens=self.words,
                               input_image_tokens=image_tokens, cached_image_tokens=self.cached_image_tokens,
                               input_video_tokens=video_tokens,
                               cached_tokens=self.cached_tokens, cached_audio_tokens=self.cached_audio_tokens,
                               output_audio_tokens=self.words * 10, timings={"queue_wait_s": 0.0})
        finally:
            self.active -= 1

    def load(self) -> eng.EngineLoad | None:
        return self.load_report

    def end_session(self, session_id: str) -> None:
        self.ended_sessions.append(session_id)
