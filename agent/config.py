"""The agent's settings, read once from the environment (and a `.env`-free shell on purpose).

LiveKit's own variables (`LIVEKIT_URL`, `LIVEKIT_API_KEY`, `LIVEKIT_API_SECRET`) are read by
the livekit-agents CLI itself; they are listed here too so that a missing one fails with a
clear message before the worker starts, not deep inside a reconnect loop.
"""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import AliasChoices, Field, SecretStr, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_INSTRUCTIONS = (
    "You are a friendly, concise voice assistant. Answer in one or two short spoken "
    "sentences, without lists or markdown. If you do not know something, say so."
)
DEFAULT_GREETING = "Greet the user in one short sentence and offer your help."


class AgentSettings(BaseSettings):
    """Everything `agent.py` needs. Env names are given per field."""

    model_config = SettingsConfigDict(populate_by_name=True, extra="ignore")

    # LiveKit server the agent worker registers with.
    livekit_url: str = Field("ws://127.0.0.1:7880", validation_alias="LIVEKIT_URL")
    livekit_api_key: str = Field("devkey", validation_alias="LIVEKIT_API_KEY")
    livekit_api_secret: SecretStr = Field(SecretStr("secret"), validation_alias="LIVEKIT_API_SECRET")

    # The colocated omni worker.
    omni_url: str = Field("ws://127.0.0.1:8000/v1/realtime", validation_alias="OMNI_URL")
    omni_api_key: SecretStr | None = Field(None, validation_alias="OMNI_API_KEY")
    # Another worker to reconnect through while the colocated one is down (in Kubernetes the
    # omni-worker Service over every pod's worker): the call goes on there, its conversation
    # replayed, instead of waiting for its own worker to load the model again.
    omni_fallback_url: str | None = Field(None, validation_alias="OMNI_FALLBACK_URL")

    # What the agent says and how.
    instructions: str = Field(DEFAULT_INSTRUCTIONS, validation_alias="AGENT_INSTRUCTIONS")
    voice: str = Field("Chelsie", validation_alias="AGENT_VOICE")
    greeting: str = Field(
        DEFAULT_GREETING,
        validation_alias="AGENT_GREETING",
        description="instructions for the first reply when a user joins; empty: wait for the user",
    )

    # Turn taking. Seconds.
    min_interruption_s: float = Field(
        0.15, gt=0, validation_alias="AGENT_MIN_INTERRUPTION_S",
        description="user speech over the agent that pauses the agent's audio",
    )
    min_barge_in_s: float = Field(
        0.4, ge=0, validation_alias="AGENT_MIN_BARGE_IN_S",
        description="user speech over the agent that counts as a turn; shorter is noise",
    )
    false_interruption_timeout_s: float = Field(
        1.0, gt=0, validation_alias="AGENT_FALSE_INTERRUPTION_TIMEOUT_S",
        description="silence after a pause before the agent resumes its reply",
    )
    # The VAD's silence and the endpointing delays are tuned together: the VAD reports the end
    # of speech after `vad_min_silence_s`, which is when a speculative reply starts and the turn
    # detector scores the turn; a confident detector then ends the turn
    # `min_endpointing_delay_s` after the last speech (a shorter delay than the VAD's silence
    # would do nothing), an unsure one after `max_endpointing_delay_s`.
    vad_min_silence_s: float = Field(
        0.25, ge=0.1, le=2.0, validation_alias="AGENT_VAD_MIN_SILENCE_S",
        description="silence after speech before the VAD reports the end of speech",
    )
    min_endpointing_delay_s: float = Field(0.25, ge=0, validation_alias="AGENT_MIN_ENDPOINTING_DELAY_S")
    max_endpointing_delay_s: float = Field(2.5, gt=0, validation_alias="AGENT_MAX_ENDPOINTING_DELAY_S")
    speculative_replies: bool = Field(
        True, validation_alias="AGENT_SPECULATIVE_REPLIES",
        description="start each reply at the VAD's end of speech, before the turn is confirmed",
    )
    auto_gain_control: bool = Field(
        True, validation_alias="AGENT_AUTO_GAIN_CONTROL",
        description="LiveKit's gain control on the caller's audio (off: where the callers' own "
                    "clients level it, as browsers do; about 1 % of a core per call less)",
    )
    input_transcription: bool = Field(
        True, validation_alias="AGENT_INPUT_TRANSCRIPTION",
        description="have the omni worker transcribe the user's turns (user transcripts in the room)",
    )
    realtime_plugin: Literal["omni", "livekit-openai"] = Field(
        "omni", validation_alias="AGENT_REALTIME_PLUGIN",
        description="the model plugin: this project's (omni), or LiveKit's own OpenAI realtime model "
                    "(livekit-plugins-openai, installed with the test extra) pointed at the same worker, to "
                    "compare what a call costs (bench/agent_cost.py); it has no speculative replies and no "
                    "context truncation",
    )
    context_retention_ratio: float = Field(
        0.8, ge=0, le=1, validation_alias="AGENT_CONTEXT_RETENTION_RATIO",
        description="when a long call outgrows the model's context, the worker leaves out the oldest turns "
                    "until the conversation is this share of its budget, then keeps that start for the "
                    "turns after (its prefix cache stays valid); 1: leave out as little as possible each turn",
    )

    # Phone callers (LiveKit SIP, docs/sip.md).
    transfer_to: str = Field(
        "", validation_alias="AGENT_TRANSFER_TO",
        description="where `transfer_call` sends a phone caller: a SIP URI (sip:operator@pbx.example.com) "
                    "or tel:+15105550123; empty: no transfer tool",
    )
    transfer_timeout_s: float = Field(
        30.0, ge=1, le=600, validation_alias="AGENT_TRANSFER_TIMEOUT_S",
        description="how long a transfer may ring at the target before it counts as failed",
    )
    dtmf_actions: str = Field(
        "", validation_alias="AGENT_DTMF_ACTIONS",
        description="keypad keys bound to actions, e.g. `0=transfer,#=hangup` (actions: hangup, transfer)",
    )

    # Worker-level behaviour.
    load_threshold: float = Field(
        0.999, gt=0, le=1, validation_alias="AGENT_LOAD_THRESHOLD",
        description="refuse new jobs at this share of the omni worker's sessions (1.0 = all taken)",
    )
    idle_processes: int = Field(
        2, ge=0, validation_alias="AGENT_IDLE_PROCESSES",
        description="job processes kept started and waiting for a call in start mode (dev: none)",
    )
    drain_timeout_s: int = Field(
        1800, ge=0, validation_alias="AGENT_DRAIN_TIMEOUT_S",
        description="on SIGTERM (start mode), how long running calls may go on",
    )
    agent_name: str = Field(
        "", validation_alias=AliasChoices("AGENT_NAME", "LIVEKIT_AGENT_NAME"),
        description="empty: dispatched to every new room; set: explicit dispatch only",
    )

    # What the agent listens on (docs/agent.md, "What listens where"): loopback unless asked.
    http_host: str = Field(
        "127.0.0.1", validation_alias="AGENT_HTTP_HOST",
        description="address of the health server (GET /, /worker) and the metrics server; "
                    "0.0.0.0 where probes come from outside (Kubernetes)",
    )
    http_port: int | None = Field(
        None, ge=0, le=65535, validation_alias="AGENT_HTTP_PORT",
        description="health server port; unset: livekit-agents' default (8081 in start mode, a free port in dev)",
    )
    metrics_port: int | None = Field(
        None, ge=0, le=65535, validation_alias="AGENT_METRICS_PORT",
        description="Prometheus /metrics port; unset: 8082 in start mode, a free port in dev and console (logged)",
    )

    @model_validator(mode="after")
    def _delays_in_order(self) -> AgentSettings:
        if self.min_endpointing_delay_s > self.max_endpointing_delay_s:
            raise ValueError("AGENT_MIN_ENDPOINTING_DELAY_S must not be above AGENT_MAX_ENDPOINTING_DELAY_S")
        return self

    @field_validator("dtmf_actions")
    @classmethod
    def _dtmf_actions(cls, value: str) -> str:
        from agent.phone import parse_key_actions  # the one parser; ValueError names the bad entry

        parse_key_actions(value)
        return value

    @field_validator("omni_url", "omni_fallback_url")
    @classmethod
    def _websocket_url(cls, value: str | None, info: ValidationInfo) -> str | None:
        if info.field_name == "omni_fallback_url" and not value:
            return None  # unset or empty: no fallback
        if urlsplit(value or "").scheme not in ("ws", "wss"):
            name = "OMNI_URL" if info.field_name == "omni_url" else "OMNI_FALLBACK_URL"
            raise ValueError(f"{name} must be a ws:// or wss:// URL, got {value!r}")
        return value

    @field_validator("livekit_url")
    @classmethod
    def _livekit_url(cls, value: str) -> str:
        if urlsplit(value).scheme not in ("ws", "wss", "http", "https"):
            raise ValueError(f"LIVEKIT_URL must be a ws(s):// or http(s):// URL, got {value!r}")
        return value

    @property
    def omni_health_url(self) -> str:
        """`ws://host:port/v1/realtime` → `http://host:port/health`."""
        parts = urlsplit(self.omni_url)
        scheme = "https" if parts.scheme == "wss" else "http"
        return urlunsplit((scheme, parts.netloc, "/health", "", ""))
