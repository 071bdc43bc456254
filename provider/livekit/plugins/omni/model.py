"""The RealtimeModel: options and capabilities; `session()` opens one conversation."""

from __future__ import annotations

import weakref
from typing import Literal
from urllib.parse import urlparse

import aiohttp

from livekit.agents import llm, utils
from livekit.agents.types import NOT_GIVEN, APIConnectOptions, NotGivenOr
from livekit.agents.utils import is_given

from .options import DEFAULT_CONN_OPTIONS, ModelOptions, Truncation, check_truncation, resolve_api_key, resolve_fallback_url, resolve_url
from .session import RealtimeSession
from .video import VideoInput

DEFAULT_VOICE = "Chelsie"


class RealtimeModel(llm.RealtimeModel):
    """A speech-to-speech model served by our omni worker (`inference/`), for `AgentSession(llm=...)`.

    Args:
        url: the worker's realtime endpoint, `ws://HOST:PORT/v1/realtime` (a base such as
            `http://HOST:PORT` works too). Default: `$OMNI_URL`, else `ws://127.0.0.1:8000/v1/realtime`.
        fallback_url: another worker to reconnect through while the one at `url` is down, in
            the same forms: in Kubernetes, a Service over every replica, so that a call whose
            worker crashed goes on through another one with its conversation (replayed) instead
            of waiting minutes for its own to load again. Reconnection attempts alternate
            between the two, the other one first. Default: `$OMNI_FALLBACK_URL`; none if unset.
        api_key: the worker's key (`Authorization: Bearer`). Default: `$OMNI_API_KEY`; none if unset.
        voice: the speaker (Qwen2.5-Omni: `Chelsie` or `Ethan`); unknown names fall back on the
            worker's default with a warning in the worker's log.
        max_output_tokens: per response; `"inf"` means the worker's own limit.
        tool_choice: `"auto"` (default), `"none"`, `"required"` or a named function.
        conn_options: reconnection policy: `max_retry` attempts, the first `retry_interval`
            seconds after the loss and doubling up to 10 s; `timeout` per connection attempt.
        reply_timeout: seconds `generate_reply` waits for the worker to start a response.
        update_timeout: seconds an update of instructions, tools or chat context waits for the
            worker to confirm it.
        speculative_replies: start each reply when the VAD hears the end of speech, before the
            turn detector confirms the turn, and play it at once when it does (needs
            `SpeculativeReplyTrigger` on the AgentSession; see provider/speculation.py).
        input_transcription: ask the worker to transcribe each user turn; the transcripts
            reach the room and the chat context as the framework's user transcripts.
        truncation: what the worker does when the conversation outgrows the model's context
            (OpenAI Realtime GA's session `truncation`): `"auto"` (the worker's default: the
            oldest items leave the model's context as needed), `"disabled"` (a reply that does
            not fit fails with `context_length_exceeded`), or `{"type": "retention_ratio",
            "retention_ratio": 0.8, "token_limits": {"post_instructions": 3000}}` (cut to that
            share of the budget at once, so the worker's prefix cache serves the turns after).
            Not given: not sent.
        video_frames_per_turn: with video input on (`RoomOptions(video_input=True)`), the newest
            distinct frames sampled since the last turn that go with the next one, as pictures
            in a user item right before its audio (near-identical frames are dropped).
        video_detail: `"low"` (default: frames resized to about 448×448 pixels, ~200-256 image
            tokens) or `"high"` (about 1024×1024).
        video_mode: `"pictures"` (default: the newest frames go as pictures before each turn) or
            `"with_speech"`: the frames sampled while the caller speaks go with the turn's audio,
            each placed in it, and the worker makes the turn one video, read as the models were
            trained on video (about 224×224 pixels a frame; `video_frames_per_turn` and
            `video_detail` are then unused). A worker that does not read video refuses it; the
            frames then go as pictures.
        http_session: an aiohttp session to reuse; by default the job's, or one of our own.
    """

    def __init__(
        self,
        *,
        url: str | None = None,
        fallback_url: str | None = None,
        api_key: str | None = None,
        voice: str = DEFAULT_VOICE,
        max_output_tokens: int | Literal["inf"] = "inf",
        tool_choice: NotGivenOr[llm.ToolChoice | None] = NOT_GIVEN,
        conn_options: APIConnectOptions = DEFAULT_CONN_OPTIONS,
        reply_timeout: float = 10.0,
        update_timeout: float = 5.0,
        speculative_replies: bool = True,
        input_transcription: bool = True,
        truncation: NotGivenOr[Truncation] = NOT_GIVEN,
        video_frames_per_turn: int = 1,
        video_detail: Literal["low", "high"] = "low",
        video_mode: Literal["pictures", "with_speech"] = "pictures",
        http_session: aiohttp.ClientSession | None = None,
    ) -> None:
        super().__init__(
            capabilities=llm.RealtimeCapabilities(
                message_truncation=True,
                turn_detection=False,  # the agent (VAD + turn detector) decides turns
                user_transcription=input_transcription,  # the worker transcribes when asked
                auto_tool_reply_generation=False,
                audio_output=True,
                manual_function_calls=True,
                mutable_chat_context=True,
                mutable_instructions=True,
                mutable_tools=True,
                per_response_tool_choice=True,  # response.create carries tools and tool_choice
            )
        )
        if isinstance(max_output_tokens, int) and max_output_tokens < 1:
            raise ValueError("max_output_tokens must be a positive number or 'inf'")
        self._opts = ModelOptions(
            url=resolve_url(url),
            fallback_url=resolve_fallback_url(fallback_url),
            api_key=resolve_api_key(api_key),
            voice=voice,
            max_output_tokens=max_output_tokens,
            tool_choice=tool_choice if is_given(tool_choice) else None,
            conn_options=conn_options,
            reply_timeout_s=reply_timeout,
            update_timeout_s=update_timeout,
            speculative_replies=speculative_replies,
            input_transcription=input_transcription,
            truncation=check_truncation(truncation) if is_given(truncation) else None,
            video_frames_per_turn=video_frames_per_turn,
            video_detail=video_detail,
            video_mode=video_mode,
        )
        VideoInput(frames_per_turn=video_frames_per_turn, detail=video_detail)  # checks both: ValueError now
        if video_mode not in ("pictures", "with_speech"):
            raise ValueError(f"video_mode must be 'pictures' or 'with_speech', got {video_mode!r}")
        self._http_session = http_session
        self._owns_http_session = False
        self._sessions = weakref.WeakSet[RealtimeSession]()

    @property
    def model(self) -> str:
        return "omni"

    @property
    def provider(self) -> str:
        return urlparse(self._opts.url).netloc

    @property
    def url(self) -> str:
        return self._opts.url

    def session(self, *, turn_detection_disabled: bool = False) -> RealtimeSession:
        # the worker never detects turns for us, so there is nothing to disable
        session = RealtimeSession(self, options=self._opts, http_session=self._ensure_http_session)
        self._sessions.add(session)
        return session

    def _ensure_http_session(self) -> aiohttp.ClientSession:
        if self._http_session is None:
            try:
                self._http_session = utils.http_context.http_session()
            except RuntimeError:  # outside a LiveKit job
                self._http_session = aiohttp.ClientSession()
                self._owns_http_session = True
        return self._http_session

    async def aclose(self) -> None:
        for session in list(self._sessions):
            await session.aclose()
        if self._owns_http_session and self._http_session is not None:
            await self._http_session.close()
            self._http_session = None
