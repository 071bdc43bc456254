"""Worker settings: command-line flags over environment variables over defaults."""

from __future__ import annotations

from typing import Any

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
    limits: Limits = Field(default_factory=Limits)
    engine_extra: dict[str, Any] = Field(default_factory=dict, description="engine-specific keyword options")

    def engine_options(self) -> dict[str, Any]:
        base = {"device": self.device, "dtype": self.dtype} if self.engine == "reference" else {}
        return {**base, **self.engine_extra}
