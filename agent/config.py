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
    turn_detector: Literal["v1-mini", "smart-turn", "combined"] = Field(
        "v1-mini", validation_alias="AGENT_TURN_DETECTOR",
        description="the end-of-turn model: LiveKit's v1-mini (last 1.2 s of audio), Pipecat's Smart Turn v3 "
                    "(last 8 s; `python -m agent.smart_turn fetch` first), or both combined",
    )
    # How the detector's score sets the wait (agent/turn_detector.py, TurnPolicy): at or above
    # `sure` the minimum delay; from there down to `unsure` the wait grows to the unsure delay,
    # which holds below; at or below `unlikely` the maximum. Unset: the detector's defaults.
    unsure_delay_s: float = Field(
        1.3, gt=0, validation_alias="AGENT_UNSURE_DELAY_S",
        description="silence after the last speech before a turn the detector is unsure of is committed: "
                    "the longest pause inside a sentence the agent rides out",
    )
    turn_sure_score: float | None = Field(None, ge=0, le=1, validation_alias="AGENT_TURN_SURE_SCORE")
    turn_unsure_score: float | None = Field(None, ge=0, le=1, validation_alias="AGENT_TURN_UNSURE_SCORE")
    turn_unlikely_score: float | None = Field(None, ge=0, le=1, validation_alias="AGENT_TURN_UNLIKELY_SCORE")
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

    # Typed chat in the room (agent/chat_text.py): each message interrupts the agent and costs
    # a reply on the GPU, so it is bounded.
    text_input: bool = Field(
        True, validation_alias="AGENT_TEXT_INPUT",
        description="answer chat messages (LiveKit text input, topic lk.chat) from the caller",
    )
    phone_text_input: bool = Field(
        False, validation_alias="AGENT_PHONE_TEXT_INPUT",
        description="answer chat messages on phone calls too (a phone caller cannot type: any chat there is "
                    "someone else's)",
    )
    text_max_chars: int = Field(
        2000, ge=1, le=32000, validation_alias="AGENT_TEXT_MAX_CHARS",
        description="longest chat message answered, in characters (the worker takes at most 32000)",
    )
    text_per_minute: float = Field(
        10.0, gt=0, le=600, validation_alias="AGENT_TEXT_PER_MINUTE",
        description="chat messages a call answers per minute, sustained; more are refused",
    )
    text_burst: int = Field(
        3, ge=1, le=100, validation_alias="AGENT_TEXT_BURST",
        description="chat messages a call answers at once before AGENT_TEXT_PER_MINUTE applies",
    )

    # Vision (docs/vision.md): the caller's video goes to the model with their turns.
    vision: Literal["camera", "screen", "off"] = Field(
        "off", validation_alias="AGENT_VISION",
        description="what the agent watches: camera (the caller's screen share when there is one, else their "
                    "camera), screen (screen shares only) or off; the worker's model must read pictures",
    )
    vision_mode: Literal["pictures", "with_speech"] = Field(
        "pictures", validation_alias="AGENT_VISION_MODE",
        description="how what the agent watches goes to the model: pictures (the newest frame before each turn) "
                    "or with_speech (the frames taken while the caller speaks, as one video with the turn's audio; "
                    "the worker's model must read video, else frames go as pictures)",
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
    sip_refusals_per_s: float = Field(
        1.0, gt=0, le=100, validation_alias="AGENT_SIP_REFUSALS_PER_S",
        description="calls of the refuse rule (deploy/sip/refuse-rule.json) refused per second, sustained; "
                    "more are left ringing for LiveKit SIP to give up on",
    )
    sip_refusal_burst: int = Field(
        10, ge=1, le=1000, validation_alias="AGENT_SIP_REFUSAL_BURST",
        description="calls of the refuse rule refused at once before AGENT_SIP_REFUSALS_PER_S applies",
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
        if not self.min_endpointing_delay_s <= self.unsure_delay_s <= self.max_endpointing_delay_s:
            raise ValueError("AGENT_UNSURE_DELAY_S must lie between AGENT_MIN_ENDPOINTING_DELAY_S and "
                             "AGENT_MAX_ENDPOINTING_DELAY_S")
        if self.turn_detector != "v1-mini":
            from agent.smart_turn import model_path

            if not model_path().is_file():
                raise ValueError(f"AGENT_TURN_DETECTOR={self.turn_detector} needs Smart Turn v3's model at "
                                 f"{model_path()}: run `python -m agent.smart_turn fetch` once (or set "
                                 "AGENT_SMART_TURN_MODEL)")
        sure, unsure, unlikely = self.turn_thresholds
        if not unlikely <= unsure <= sure:
            raise ValueError("the turn scores must be in order: AGENT_TURN_UNLIKELY_SCORE <= AGENT_TURN_UNSURE_SCORE "
                             f"<= AGENT_TURN_SURE_SCORE (got {unlikely}, {unsure}, {sure} with the detector's defaults)")
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
    def turn_thresholds(self) -> tuple[float, float, float]:
        """(sure, unsure, unlikely) for the chosen detector: the settings, or its defaults."""
        from agent.turn_detector import DEFAULT_THRESHOLDS

        defaults = DEFAULT_THRESHOLDS[self.turn_detector]
        given = (self.turn_sure_score, self.turn_unsure_score, self.turn_unlikely_score)
        return tuple(d if g is None else g for g, d in zip(given, defaults, strict=True))  # type: ignore[return-value]

    @property
    def omni_health_url(self) -> str:
        """`ws://host:port/v1/realtime` → `http://host:port/health`."""
        parts = urlsplit(self.omni_url)
        scheme = "https" if parts.scheme == "wss" else "http"
        return urlunsplit((scheme, parts.netloc, "/health", "", ""))
