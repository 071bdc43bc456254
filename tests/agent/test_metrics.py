"""The agent's Prometheus metrics, fed the way RoomEvents feeds them during a call."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from agent.metrics import AgentMetrics


def value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def test_a_call_with_two_replies_one_cut_and_a_false_interruption() -> None:
    registry = CollectorRegistry()
    m = AgentMetrics(registry)
    m.session_started()
    assert value(registry, "omni_agent_sessions_active") == 1
    m.reply_over(interrupted=False, voice_to_voice_s=None, model_first_audio_s=0.2)  # the greeting
    m.user_turn_decided(0.8)
    m.false_interruption(resumed=True)
    m.reply_over(interrupted=True, voice_to_voice_s=1.1, model_first_audio_s=0.25)
    m.session_ended()

    assert value(registry, "omni_agent_sessions_active") == 0
    assert value(registry, "omni_agent_sessions_total") == 1
    assert value(registry, "omni_agent_replies_total", interrupted="true") == 1
    assert value(registry, "omni_agent_replies_total", interrupted="false") == 1
    assert value(registry, "omni_agent_false_interruptions_total", resumed="true") == 1
    assert value(registry, "omni_agent_false_interruptions_total", resumed="false") is None
    # a reply nobody spoke before has no voice-to-voice time
    assert value(registry, "omni_agent_voice_to_voice_seconds_count") == 1
    assert value(registry, "omni_agent_voice_to_voice_seconds_sum") == 1.1
    assert value(registry, "omni_agent_voice_to_voice_seconds_bucket", le="1.0") == 0
    assert value(registry, "omni_agent_voice_to_voice_seconds_bucket", le="1.5") == 1
    assert value(registry, "omni_agent_endpointing_delay_seconds_sum") == 0.8
    assert value(registry, "omni_agent_model_first_audio_seconds_count") == 2
    assert b"# HELP omni_agent_voice_to_voice_seconds" in generate_latest(registry)
