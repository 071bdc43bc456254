"""Prometheus metrics of the agent: what a LiveKit operator scrapes next to the worker's own.

Calls run in job processes (one per call), so the values live in prometheus_client's
multiprocess files (PROMETHEUS_MULTIPROC_DIR, set by agent.py before anything imports
prometheus_client) and livekit-agents' metrics server adds them up on `GET /metrics`
(AGENT_METRICS_PORT), together with its own `lk_agents_*` series. See docs/agent.md.

    omni_agent_sessions_active                      calls running now
    omni_agent_sessions_total                       calls started
    omni_agent_voice_to_voice_seconds               end of the user's speech → first reply audio out
    omni_agent_endpointing_delay_seconds            end of the user's speech → the agent decides the turn is over
    omni_agent_model_first_audio_seconds            response.create → the worker's first audio
    omni_agent_replies_total{interrupted}           replies over, cut by the user or not
    omni_agent_false_interruptions_total{resumed}   pauses for a sound, then resumed (or not)
"""

from __future__ import annotations

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

# seconds: voice-to-voice and endpointing run from ~0.2 s to the 2.5 s maximum delay and beyond
TURN_BUCKETS = (0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 6.0, 10.0)
MODEL_BUCKETS = (0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0)


class AgentMetrics:
    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        self.sessions_active = Gauge("omni_agent_sessions_active", "calls running now",
                                     registry=registry, multiprocess_mode="livesum")
        self.sessions = Counter("omni_agent_sessions", "calls started", registry=registry)
        self.voice_to_voice = Histogram(
            "omni_agent_voice_to_voice_seconds",
            "end of the user's speech to the reply's first audio frame going out to the room",
            buckets=TURN_BUCKETS, registry=registry)
        self.endpointing_delay = Histogram(
            "omni_agent_endpointing_delay_seconds",
            "end of the user's speech (VAD) to the agent's decision that the turn is over",
            buckets=TURN_BUCKETS, registry=registry)
        self.model_first_audio = Histogram(
            "omni_agent_model_first_audio_seconds", "the omni worker's time to first audio of a response",
            buckets=MODEL_BUCKETS, registry=registry)
        self.replies = Counter("omni_agent_replies", "agent replies over (played out or cut by the user)",
                               ["interrupted"], registry=registry)
        self.false_interruptions = Counter(
            "omni_agent_false_interruptions", "the agent paused for a sound that was not a turn",
            ["resumed"], registry=registry)

    def session_started(self) -> None:
        self.sessions.inc()
        self.sessions_active.inc()

    def session_ended(self) -> None:
        self.sessions_active.dec()

    def reply_over(self, *, interrupted: bool, voice_to_voice_s: float | None,
                   model_first_audio_s: float | None) -> None:
        self.replies.labels(interrupted=_label(interrupted)).inc()
        if voice_to_voice_s is not None:  # None for a reply nobody spoke before (the greeting)
            self.voice_to_voice.observe(voice_to_voice_s)
        if model_first_audio_s is not None:
            self.model_first_audio.observe(model_first_audio_s)

    def user_turn_decided(self, endpointing_delay_s: float) -> None:
        self.endpointing_delay.observe(endpointing_delay_s)

    def false_interruption(self, *, resumed: bool) -> None:
        self.false_interruptions.labels(resumed=_label(resumed)).inc()


def _label(flag: bool) -> str:
    return "true" if flag else "false"
