"""The agent's settings: env names, defaults that work with `scripts/dev`, clear errors."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from agent.config import AgentSettings


def test_defaults_match_the_local_stack(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("LIVEKIT_URL", "LIVEKIT_API_KEY", "LIVEKIT_API_SECRET", "OMNI_URL", "OMNI_API_KEY",
                 "OMNI_FALLBACK_URL", "AGENT_VOICE", "AGENT_GREETING", "AGENT_NAME", "LIVEKIT_AGENT_NAME"):
        monkeypatch.delenv(name, raising=False)
    s = AgentSettings()
    assert s.livekit_url == "ws://127.0.0.1:7880"
    assert (s.livekit_api_key, s.livekit_api_secret.get_secret_value()) == ("devkey", "secret")
    assert s.omni_url == "ws://127.0.0.1:8000/v1/realtime"
    assert s.omni_api_key is None
    assert s.omni_fallback_url is None
    assert s.agent_name == ""


def test_reads_the_documented_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMNI_URL", "wss://gpu-7.internal:9000/v1/realtime")
    monkeypatch.setenv("OMNI_API_KEY", "k")
    monkeypatch.setenv("OMNI_FALLBACK_URL", "ws://omni-worker:8000/v1/realtime")
    monkeypatch.setenv("AGENT_INSTRUCTIONS", "Speak like a pirate.")
    monkeypatch.setenv("AGENT_VOICE", "Ethan")
    monkeypatch.setenv("AGENT_GREETING", "")
    monkeypatch.setenv("AGENT_FALSE_INTERRUPTION_TIMEOUT_S", "1.5")
    s = AgentSettings()
    assert s.instructions == "Speak like a pirate."
    assert s.voice == "Ethan"
    assert s.greeting == ""
    assert s.false_interruption_timeout_s == 1.5
    assert s.omni_api_key is not None and s.omni_api_key.get_secret_value() == "k"
    assert s.omni_fallback_url == "ws://omni-worker:8000/v1/realtime"
    # The load check talks to the same worker over HTTP(S).
    assert s.omni_health_url == "https://gpu-7.internal:9000/health"


@pytest.mark.parametrize(("name", "value"), [
    ("OMNI_URL", "http://127.0.0.1:8000/v1/realtime"),
    ("OMNI_FALLBACK_URL", "omni-worker:8000"),
    ("LIVEKIT_URL", "127.0.0.1:7880"),
    ("AGENT_LOAD_THRESHOLD", "1.5"),
    ("AGENT_MIN_INTERRUPTION_S", "0"),
    ("AGENT_IDLE_PROCESSES", "-1"),
    ("AGENT_AUTO_GAIN_CONTROL", "sometimes"),
])
def test_bad_values_are_refused_with_the_setting_named(monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ValidationError, match=name):
        AgentSettings()


def test_turn_taking_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AGENT_SPECULATIVE_REPLIES", "AGENT_VAD_MIN_SILENCE_S", "AGENT_MIN_ENDPOINTING_DELAY_S",
                 "AGENT_MAX_ENDPOINTING_DELAY_S"):
        monkeypatch.delenv(name, raising=False)
    s = AgentSettings()
    # on by default; a confident turn detector ends the turn well under the VAD's old 0.55 s
    assert s.speculative_replies is True
    assert max(s.vad_min_silence_s, s.min_endpointing_delay_s) <= 0.3
    monkeypatch.setenv("AGENT_SPECULATIVE_REPLIES", "false")
    monkeypatch.setenv("AGENT_VAD_MIN_SILENCE_S", "0.4")
    s = AgentSettings()
    assert (s.speculative_replies, s.vad_min_silence_s) == (False, 0.4)
    monkeypatch.setenv("AGENT_MIN_ENDPOINTING_DELAY_S", "3")
    with pytest.raises(ValidationError, match="AGENT_MIN_ENDPOINTING_DELAY_S"):
        AgentSettings()


def test_cost_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AGENT_AUTO_GAIN_CONTROL", "AGENT_IDLE_PROCESSES"):
        monkeypatch.delenv(name, raising=False)
    s = AgentSettings()
    assert s.auto_gain_control is True and s.idle_processes == 2  # livekit's gain control, as before
    monkeypatch.setenv("AGENT_AUTO_GAIN_CONTROL", "false")
    monkeypatch.setenv("AGENT_IDLE_PROCESSES", "0")
    s = AgentSettings()
    assert s.auto_gain_control is False and s.idle_processes == 0


def test_the_model_plugin_can_be_livekits_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """AGENT_REALTIME_PLUGIN=livekit-openai (bench/agent_cost.py's yardstick): LiveKit's OpenAI
    realtime model on the same worker URL, the agent's VAD and turn detector taking the turns
    (no server turn detection), and no input transcription when the agent turns it off."""
    from livekit.plugins import omni, openai

    from agent.agent import realtime_model

    monkeypatch.setenv("OMNI_URL", "ws://10.0.0.5:9000/v1/realtime")
    assert isinstance(realtime_model(AgentSettings()), omni.RealtimeModel)
    monkeypatch.setenv("AGENT_REALTIME_PLUGIN", "livekit-openai")
    model = realtime_model(AgentSettings())
    assert isinstance(model, openai.realtime.RealtimeModel)
    assert model._opts.base_url == "ws://10.0.0.5:9000/v1/realtime"
    assert model._opts.turn_detection is None and not model.capabilities.turn_detection
    assert model._opts.input_audio_transcription is not None
    monkeypatch.setenv("AGENT_INPUT_TRANSCRIPTION", "false")
    assert realtime_model(AgentSettings())._opts.input_audio_transcription is None
    monkeypatch.setenv("AGENT_REALTIME_PLUGIN", "openai")
    with pytest.raises(ValidationError, match="AGENT_REALTIME_PLUGIN"):
        AgentSettings()


def test_vision_mode_sends_the_camera_as_video_with_the_speech(monkeypatch: pytest.MonkeyPatch) -> None:
    """AGENT_VISION_MODE=with_speech: the plugin sends the turn's frames with its audio; the
    default stays pictures, and nothing else is taken."""
    from agent.agent import realtime_model

    assert AgentSettings().vision_mode == "pictures"
    assert realtime_model(AgentSettings())._opts.video_mode == "pictures"
    monkeypatch.setenv("AGENT_VISION", "camera")
    monkeypatch.setenv("AGENT_VISION_MODE", "with_speech")
    assert realtime_model(AgentSettings())._opts.video_mode == "with_speech"
    monkeypatch.setenv("AGENT_VISION_MODE", "video")
    with pytest.raises(ValidationError, match="AGENT_VISION_MODE"):
        AgentSettings()


def test_the_turn_detector_and_its_wait(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # noqa: ANN001
    s = AgentSettings()
    assert (s.turn_detector, s.unsure_delay_s) == ("v1-mini", 1.3)
    assert s.turn_thresholds == (0.65, 0.45, 0.01)
    monkeypatch.setenv("AGENT_TURN_SURE_SCORE", "0.8")
    monkeypatch.setenv("AGENT_UNSURE_DELAY_S", "1.7")
    s = AgentSettings()
    assert s.turn_thresholds == (0.8, 0.45, 0.01) and s.unsure_delay_s == 1.7
    monkeypatch.setenv("AGENT_TURN_SURE_SCORE", "0.3")  # below the unsure score
    with pytest.raises(ValidationError, match="AGENT_TURN_UNLIKELY_SCORE <= AGENT_TURN_UNSURE_SCORE"):
        AgentSettings()
    monkeypatch.delenv("AGENT_TURN_SURE_SCORE")
    monkeypatch.setenv("AGENT_UNSURE_DELAY_S", "3")  # above the maximum delay
    with pytest.raises(ValidationError, match="AGENT_UNSURE_DELAY_S"):
        AgentSettings()
    monkeypatch.delenv("AGENT_UNSURE_DELAY_S")
    # Smart Turn needs its model file: a missing one is named, with the command that fetches it
    monkeypatch.setenv("AGENT_TURN_DETECTOR", "combined")
    monkeypatch.setenv("AGENT_SMART_TURN_MODEL", str(tmp_path / "absent.onnx"))
    with pytest.raises(ValidationError, match="agent.smart_turn fetch"):
        AgentSettings()
    with pytest.raises(ValidationError):
        AgentSettings(AGENT_TURN_DETECTOR="semantic")
