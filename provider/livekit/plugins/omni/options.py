"""Options of the plugin and where their defaults come from (arguments, then env vars)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Union
from urllib.parse import urlparse, urlunparse

from livekit.agents import llm
from livekit.agents.types import APIConnectOptions

DEFAULT_URL = "ws://127.0.0.1:8000/v1/realtime"
URL_ENV = "OMNI_URL"
FALLBACK_URL_ENV = "OMNI_FALLBACK_URL"
API_KEY_ENV = "OMNI_API_KEY"

# A restarting worker needs a while to load and warm up (its /health says 503 meanwhile), so the
# default retry budget is about a minute: 0.5 s, doubling, at most 10 s apart, ten times.
DEFAULT_CONN_OPTIONS = APIConnectOptions(max_retry=10, retry_interval=0.5, timeout=10.0)
MAX_RETRY_INTERVAL_S = 10.0

# What the worker does when the conversation outgrows the model's context (OpenAI Realtime GA's
# session `truncation`): "auto", "disabled", or
# {"type": "retention_ratio", "retention_ratio": 0.8, "token_limits": {"post_instructions": n}}.
Truncation = Union[Literal["auto", "disabled"], Mapping[str, Any]]


@dataclass
class ModelOptions:
    url: str
    fallback_url: str | None
    """Another worker to reconnect through while `url`'s is down (a Service over every replica)."""
    api_key: str | None
    voice: str
    max_output_tokens: int | Literal["inf"]
    tool_choice: llm.ToolChoice | None
    conn_options: APIConnectOptions
    reply_timeout_s: float
    """How long generate_reply waits for the worker's response.created."""
    update_timeout_s: float
    """How long an update of instructions, tools or chat context waits for the worker's answer."""
    speculative_replies: bool = True
    """Start each reply at the VAD's end of speech, before the turn is confirmed (speculation.py)."""
    input_transcription: bool = True
    """Ask the worker to transcribe every committed user turn (user transcripts for the room)."""
    modalities: list[Literal["text", "audio"]] = field(default_factory=lambda: ["audio"])
    truncation: Truncation | None = None
    """Sent in the session when given; None: the worker's default ("auto")."""
    video_frames_per_turn: int = 1
    """The newest distinct video frames attached to a user turn (video.py)."""
    video_detail: Literal["low", "high"] = "low"
    """The pixel budget frames are resized to before encoding: low ~448×448, high ~1024×1024."""
    video_mode: Literal["pictures", "with_speech"] = "pictures"
    """How the camera goes to the worker: the newest frames as pictures before each turn
    (video.py), or the turn's frames placed in its speech, read as video (speech_video.py)."""


def resolve_url(url: str | None, *, env: str = URL_ENV) -> str:
    """The worker's realtime WebSocket URL from an argument, $OMNI_URL (or `env`) or the default.

    Accepts `ws(s)://host:port/v1/realtime`, or a base URL (`http://host:port`,
    `ws://host:port/v1`) to which `/v1/realtime` is added.
    """
    raw = url or os.environ.get(env) or DEFAULT_URL
    parsed = urlparse(raw)
    scheme = {"http": "ws", "https": "wss"}.get(parsed.scheme, parsed.scheme)
    if scheme not in ("ws", "wss") or not parsed.hostname:
        raise ValueError(
            f"invalid omni worker URL {raw!r}: expected ws://HOST:PORT/v1/realtime "
            f"(or http://HOST:PORT); set it with url= or ${env}"
        )
    try:
        parsed.port  # noqa: B018 - raises ValueError on a port that is not a number
    except ValueError:
        raise ValueError(f"invalid omni worker URL {raw!r}: the port is not a number") from None
    path = parsed.path.rstrip("/")
    if path in ("", "/v1"):
        path = "/v1/realtime"
    return urlunparse((scheme, parsed.netloc, path, "", parsed.query, ""))


def resolve_fallback_url(url: str | None) -> str | None:
    """The fallback worker's URL from an argument or $OMNI_FALLBACK_URL; None when neither."""
    raw = url or os.environ.get(FALLBACK_URL_ENV)
    return resolve_url(raw, env=FALLBACK_URL_ENV) if raw else None


def resolve_api_key(api_key: str | None) -> str | None:
    return api_key if api_key is not None else os.environ.get(API_KEY_ENV) or None


def retry_delay(conn_options: APIConnectOptions, attempt: int) -> float:
    """Seconds to wait before reconnection attempt number `attempt` (0-based): doubling."""
    return min(conn_options.retry_interval * (2**attempt), MAX_RETRY_INTERVAL_S)


def check_truncation(truncation: Truncation | None) -> Truncation | None:
    """A `truncation` option as the worker takes it, or ValueError saying what is wrong."""
    if truncation is None or truncation in ("auto", "disabled"):
        return truncation
    if not isinstance(truncation, Mapping) or truncation.get("type") != "retention_ratio":
        raise ValueError(f'truncation must be "auto", "disabled" or {{"type": "retention_ratio", ...}}, '
                         f"got {truncation!r}")
    ratio = truncation.get("retention_ratio")
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0.0 <= ratio <= 1.0:
        raise ValueError(f"truncation's retention_ratio must be a number from 0 to 1, got {ratio!r}")
    limit = (truncation.get("token_limits") or {}).get("post_instructions")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"truncation's token_limits.post_instructions must be a positive integer, got {limit!r}")
    return dict(truncation)
