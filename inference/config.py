"""Worker settings: command-line flags over environment variables over defaults."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class Limits(BaseSettings):
    """Limits that protect the GPU and the other sessions. Env: OMNI_LIMIT_<NAME>."""

    # an empty variable is unset (docker-compose passes OMNI_LIMIT_MAX_SESSIONS empty when not given)
    model_config = SettingsConfigDict(env_prefix="OMNI_LIMIT_", env_ignore_empty=True)

    max_sessions: int | None = Field(None, ge=1, description="concurrent WebSocket sessions (the /health capacity); "
                                     "unset: the measured capacity of the GPU found (inference/capacity.py)")
    max_event_bytes: int = Field(2 * 1024 * 1024, ge=1024, description="one client event, JSON text in UTF-8 bytes")
    max_event_depth: int = Field(32, ge=4, le=200, description="nesting of arrays and objects in one event")
    max_event_audio_s: float = Field(10.0, gt=0, description="audio in one append or item event")
    max_turn_audio_s: float = Field(120.0, gt=0, description="uncommitted input audio buffer")
    max_conversation_audio_s: float = Field(1800.0, gt=0, description="user audio kept in one conversation")
    max_conversation_items: int = Field(1000, ge=1)
    max_instructions_chars: int = Field(32_000, ge=1)
    max_text_chars: int = Field(32_000, ge=1, description="one text in an item: text, transcript, tool arguments or output")
    max_tools: int = Field(64, ge=0, description="tools of a session or a response")
    max_tool_schema_bytes: int = Field(16_384, ge=64, description="one tool's name, description and parameters as JSON")
    max_output_tokens: int = Field(4096, ge=1, description="per response; 'inf' from a client means this")
    idle_timeout_s: float = Field(600.0, gt=0, description="close a session with no client event (pings do not count) for this long")
    max_send_queue_bytes: int = Field(4 * 1024 * 1024, ge=65_536,
                                      description="events waiting for a client that does not read; over it the client is dropped")
    header_timeout_s: float = Field(10.0, gt=0, description="from TCP connect to a whole HTTP request head (also idle keep-alive)")
    handshake_timeout_s: float = Field(10.0, gt=0, description="closing handshake: the queued events and our close frame taken")
    max_pending_connections: int = Field(256, ge=1, description="connections without a session; the oldest goes first")
    client_connections_per_s: float = Field(10.0, gt=0, description="/v1/ requests per client address, sustained")
    client_connection_burst: int = Field(60, ge=1, description="/v1/ requests per client address in a burst")
    shutdown_grace_s: float = Field(5.0, ge=0, description="on SIGTERM, time for sessions to take their close frame")
    # memory and CPU one session may take (docs/hardening.md, "Memory and CPU per session")
    max_session_bytes: int = Field(64 * 1024 * 1024, ge=1024 * 1024,
                                   description="what one session holds: conversation text and audio (as the engine "
                                   "reads it), the input buffer and queued transcriptions")
    max_item_parts: int = Field(32, ge=1, description="content parts in one item")
    max_id_chars: int = Field(128, ge=8, description="an id a client gives: event, item, previous item, call, response")
    max_name_chars: int = Field(64, ge=1, description="a function or tool name")
    # the session's reader paces a client that sends faster: past the burst it reads no further
    # event until the bytes are earned, so a flood waits in the client's socket instead of
    # costing the worker's loop a parse per event while other sessions wait
    client_bytes_per_s: int = Field(8 * 1024 * 1024, ge=64 * 1024, description="client event bytes one session "
                                    "reads per second, sustained (audio in real time is about 43 kB/s)")
    client_bytes_burst: int = Field(32 * 1024 * 1024, ge=64 * 1024, description="client event bytes one session "
                                    "reads at once above that pace (a reconnecting client replays its conversation)")
    max_pending_transcriptions: int = Field(8, ge=1, description="committed turns waiting for their transcription")
    input_audio_speed: float = Field(4.0, gt=0, description="input audio appended per second of wall time, sustained, "
                                     "in seconds of audio (4: four times real time)")
    input_audio_burst_s: float = Field(180.0, gt=0, description="input audio a client may append at once above that "
                                       "pace (a reconnecting client replays its unfinished turns)")
    # pictures (docs/vision.md): what one may be, and how many the model reads at once
    max_image_bytes: int = Field(8 * 1024 * 1024, ge=1024, description="one picture as sent (PNG or JPEG bytes, "
                                 "after base64) or downloaded")
    max_image_source_pixels: int = Field(40_000_000, ge=1024, description="one picture as sent, width × height, "
                                         "checked before it is decoded (a small file can decode to gigabytes)")
    image_low_pixels: int = Field(448 * 448, ge=1024, description="detail 'low': a picture is resized to at most "
                                  "this many pixels")
    image_high_pixels: int = Field(1024 * 1024, ge=1024, description="detail 'high' and 'auto': at most this many "
                                   "pixels (and at most the model's own maximum)")
    max_images_per_response: int = Field(16, ge=1, description="pictures the model reads in one response; the "
                                         "oldest leave the model's context beyond it (their items stay)")
    max_context_image_tokens: int = Field(8192, ge=64, description="image tokens the model reads in one response; "
                                          "the oldest pictures leave the model's context beyond it")
    image_url_hosts: list[str] = Field(default_factory=list, description="hosts an https image_url may name "
                                       "(exact names); none: only data: URLs are taken")
    image_download_timeout_s: float = Field(5.0, gt=0, description="fetching one picture from an allowed host")
    # video with its speech (session `input_video`; docs/worker.md, "Video with its speech")
    video_frame_pixels: int = Field(224 * 224, ge=1024, description="each camera frame of a turn's video is resized "
                                    "to at most this many pixels (and at most the model's own maximum)")
    max_turn_video_frames: int = Field(240, ge=1, description="camera frames the input buffer holds before a commit "
                                       "or clear")
    max_video_frames: int = Field(64, ge=2, description="frames of one turn's video after sampling at the model's "
                                  "rate; a longer turn is sampled more thinly")
    max_context_video_tokens: int = Field(8192, ge=64, description="video tokens the model reads in one response; "
                                          "beyond it the oldest turns' frames leave its context (their audio stays)")
    prepare_threads: int = Field(2, ge=1, le=64, description="threads that render prompts, for all sessions")
    # the worker as a whole: refuse sessions, then close the largest, before the container's
    # memory limit kills the process and every call on it
    max_worker_rss_mb: float | None = Field(None, gt=0, description="resident memory of the worker; at "
                                            "90 % new sessions get 503, over it the session holding the most is "
                                            "closed; unset: 90 % of the container's memory limit (none without one)")


class WorkerSettings(BaseSettings):
    """Everything `omni-worker serve` needs. Env: OMNI_<NAME>."""

    model_config = SettingsConfigDict(env_prefix="OMNI_")

    engine: str = "reference"
    model: str = "tiny-random"
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: SecretStr | None = None
    insecure_no_auth: bool = False
    # Browsers send an Origin header; other clients do not. Without a key, only these origins
    # may open a session (exact "scheme://host:port"), so a web page cannot use the GPU.
    allowed_origins: list[str] = Field(default_factory=list)
    device: str = "auto"
    dtype: str = "auto"
    # the reference engine's defaults: "exact" (the model's own computation) or "fast" (the
    # measured trade-offs that carry more calls); options given one by one win over it
    preset: Literal["exact", "fast"] = "exact"
    limits: Limits = Field(default_factory=Limits)
    engine_extra: dict[str, Any] = Field(default_factory=dict, description="engine-specific keyword options")

    def engine_options(self) -> dict[str, Any]:
        base = ({"device": self.device, "dtype": self.dtype, "preset": self.preset}
                if self.engine == "reference" else {})
        return {**base, **self.engine_extra}
