"""The voice agent: a LiveKit Agents worker whose model is the self-hosted omni worker.

    python agent/agent.py dev        # development: registers with LIVEKIT_URL, debug logs
    python agent/agent.py start      # production: drains running calls on SIGTERM
    python agent/agent.py console    # talk to it from this machine's microphone and speaker
    python agent/agent.py console --text   # type to it (no audio device needed)

Turn taking runs here, fully offline: silero VAD and LiveKit's audio turn detector (`v1-mini`),
both native in livekit-local-inference, or Pipecat's Smart Turn v3 (onnxruntime), whose score sets
how long a turn waits (agent/turn_detector.py), and VAD interruptions with false-interruption
pause and resume. The omni worker only
generates replies (livekit.plugins.omni.RealtimeModel, over WebSocket /v1/realtime). Nothing here calls
LiveKit Cloud. Settings come from the environment: see agent/config.py and docs/agent.md.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from collections.abc import Callable
from concurrent.futures import Executor, Future
from functools import cache
from pathlib import Path

# onnxruntime sends usage telemetry to Microsoft from Linux too since 1.29, unless this is set
# before it starts; the job and inference processes inherit it. The inference process loads it
# for Smart Turn (AGENT_TURN_DETECTOR smart-turn or combined). Nothing in the agent may call out.
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
# livekit-agents watches every process's event loop for blocking code: a heartbeat and a
# watchdog thread, each waking every fifth of the warning threshold (at least every 20 ms). At
# its default of 100 ms that is 100 wake-ups a second in every job and idle process, about
# 1.3 % of a core each (bench/agent_cost.py); at 250 ms, 40 (0.5 %), and stalls of a quarter of
# a second and more, which a caller hears, are still reported. Set it to 100 to see shorter ones.
os.environ.setdefault("LIVEKIT_AGENTS_LOOP_BLOCK_WARN_MS", "250")
# The end-of-turn model runs in livekit-agents' inference process (agent/turn_detector.py): the
# forkserver must not load its weights too, or every job process would carry them again. (This
# also leaves the VAD to each job's prewarm: a few MB.)
os.environ.setdefault("LIVEKIT_AGENTS_PRELOAD_LOCAL_INFERENCE", "0")
# Calls run in job processes: their metrics go to prometheus_client's multiprocess files, which
# the metrics server adds up. Set before anything imports prometheus_client; inherited by jobs.
if "PROMETHEUS_MULTIPROC_DIR" not in os.environ:
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="omni-agent-metrics-")

if __package__ in (None, ""):
    # Run as a script from a checkout: import our packages (agent, and the plugin under
    # provider/) from this checkout, and keep this directory off the path so `config.py` and
    # friends shadow nothing.
    _here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _here]
    sys.path[:0] = [str(_here.parent), str(_here.parent / "provider")]

if __name__ == "__main__":  # `omni-agent` does this in agent/launch.py
    from agent.launch import stop_while_starting

    stop_while_starting()

from livekit import api
from livekit.agents import Agent, AgentSession, JobContext, JobProcess, WorkerOptions, cli, inference, llm, room_io
from livekit.agents.ipc.inference_executor import InferenceExecutor
from livekit.agents.worker import ServerEnvOption
from livekit.local_inference import init_vad
from livekit.plugins import omni

from agent.barge_in import BargeInGate, SpeechLengthVAD
from agent.chat_text import ChatTextGate
from agent.config import AgentSettings
from agent.console import check_audio_devices
from agent.metrics import AgentMetrics
from agent.phone import CallRefusals, PhoneCall, parse_key_actions, refusal_reason, refuse_call
from agent.room_events import RoomEvents
from agent.tools import ALL_TOOLS
from agent.turn_detector import SharedTurnDetector, TurnPolicy, register as register_turn_detector
from agent.vision import VisionWatcher
from agent.worker_load import OmniWorkerLoad

log = logging.getLogger("omni-agent")


@cache
def settings() -> AgentSettings:
    return AgentSettings()


@cache
def metrics() -> AgentMetrics:
    """One set per process (prometheus_client registers each name once)."""
    return AgentMetrics()


class VoiceAgent(Agent):
    def __init__(self, config: AgentSettings, on_user_turn: Callable[[], None],
                 call_tools: list[llm.FunctionTool] | None = None) -> None:
        super().__init__(instructions=config.instructions, tools=[*ALL_TOOLS, *(call_tools or [])])
        self._greeting = config.greeting
        self._on_user_turn = on_user_turn

    async def on_enter(self) -> None:
        if self._greeting:
            self.session.generate_reply(instructions=self._greeting)

    async def on_user_turn_completed(self, turn_ctx: llm.ChatContext, new_message: llm.ChatMessage) -> None:
        # The user's audio is committed; the reply is requested right after this returns.
        self._on_user_turn()


def prewarm(proc: JobProcess) -> None:
    """Load the VAD's weights (native silero, livekit-local-inference) once per job process,
    before a call arrives. The turn detector's are in the inference process (turn_detector.py)."""
    init_vad()
    if settings().realtime_plugin == "livekit-openai":
        # as an agent built on it imports it up front: its import (the openai package's types)
        # blocked a job's loop for seconds when it came with the first call
        import livekit.plugins.openai  # noqa: F401


def build_vad(config: AgentSettings) -> SpeechLengthVAD:
    """Silero VAD, natively: livekit-local-inference's build gives the same speech probability as
    livekit-plugins-silero's ONNX model, window for window, at a sixth of the CPU, without
    onnxruntime in the process. Unlike that plugin it does not smooth the probability, so an
    end of speech is reported one 32 ms window sooner. Each 32 ms window's prediction (about
    50 µs, the GIL released) runs right on the event loop: handing it to a thread and back, the
    framework's default, costs more than the prediction."""
    return SpeechLengthVAD(inference.VAD(min_silence_duration=config.vad_min_silence_s, executor=_AtOnce()))


class _AtOnce(Executor):
    """Runs what it is given there and then, on the caller's thread."""

    def submit(self, fn, /, *args, **kwargs):  # type: ignore[no-untyped-def, override]
        future: Future = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as e:  # noqa: BLE001 - the future carries it, as a pool's would
            future.set_exception(e)
        return future


def realtime_model(config: AgentSettings) -> llm.RealtimeModel:
    api_key = config.omni_api_key.get_secret_value() if config.omni_api_key else None
    if config.realtime_plugin == "livekit-openai":
        return livekit_openai_model(config, api_key)
    return omni.RealtimeModel(
        url=config.omni_url,
        fallback_url=config.omni_fallback_url,
        api_key=api_key,
        voice=config.voice,
        speculative_replies=config.speculative_replies,
        input_transcription=config.input_transcription,
        # a call of any length keeps answering: its oldest turns leave the model's context,
        # the agent's chat context (transcripts) keeps them all
        truncation={"type": "retention_ratio", "retention_ratio": config.context_retention_ratio},
        video_mode=config.vision_mode,
    )


def livekit_openai_model(config: AgentSettings, api_key: str | None) -> llm.RealtimeModel:
    """LiveKit's own OpenAI realtime model (livekit-plugins-openai) pointed at the omni worker,
    which speaks that protocol: the yardstick for what this project's plugin costs a call
    (bench/agent_cost.py). The turns are the agent's, as with ours (turn_detection=None: the
    VAD and turn detector here commit each turn and ask for the reply)."""
    from livekit.plugins import openai  # the test extra installs it; the agent's image does not

    return openai.realtime.RealtimeModel(
        base_url=config.omni_url,  # ws://host:port/v1/realtime, taken as it is
        api_key=api_key or "no-key",  # the plugin wants one; a worker without a key ignores it
        voice=config.voice,
        turn_detection=None,
        **({} if config.input_transcription else {"input_audio_transcription": None}),
    )


def build_turn_detector(config: AgentSettings, inference_executor: InferenceExecutor) -> SharedTurnDetector:
    """The local end-of-turn models (in dev mode livekit-agents would pick the cloud `v1`), run
    in the worker's inference process for every call, and the wait their score sets."""
    sure, unsure, unlikely = config.turn_thresholds
    policy = TurnPolicy(detector=config.turn_detector, min_delay_s=config.min_endpointing_delay_s,
                        max_delay_s=config.max_endpointing_delay_s, unsure_delay_s=config.unsure_delay_s,
                        sure=sure, unsure=unsure, unlikely=unlikely)
    return SharedTurnDetector(inference_executor, policy)


def build_session(config: AgentSettings, vad: SpeechLengthVAD, turn_detector: SharedTurnDetector) -> AgentSession:
    model = realtime_model(config)
    return AgentSession(
        vad=vad,
        llm=model,
        turn_handling={
            "turn_detection": turn_detector,
            "endpointing": {
                "min_delay": config.min_endpointing_delay_s,
                "max_delay": config.max_endpointing_delay_s,
            },
            # `vad`, not `adaptive`: adaptive interruption detection is a LiveKit Cloud service.
            "interruption": {
                "mode": "vad",
                "min_duration": config.min_interruption_s,
                "resume_false_interruption": True,
                "false_interruption_timeout": config.false_interruption_timeout_s,
            },
        },
    )


def room_options(config: AgentSettings, chat: ChatTextGate | None = None) -> room_io.RoomOptions:
    """The caller's audio as the VAD, the turn detector and the worker all take it: 16 kHz, so
    nothing resamples it again in Python, in 40 ms frames. Every frame's trip through the
    session (the room's stream, its gain control, the VAD, the turn detector, the plugin) costs
    the same whatever its length: 25 a second here, 50 with 20 ms frames. What it costs in
    latency: a VAD window (32 ms) is decided when the frame holding its last sample arrives, on
    average 16 ms after that sample (8 ms with 20 ms frames; 24 ms with the framework's default
    of 50 ms). LiveKit's gain control takes multiples of 10 ms, so frames cannot be the VAD's
    windows themselves.

    Chat messages go through `chat` (size, rate, phone calls: agent/chat_text.py); with
    AGENT_TEXT_INPUT off, or no gate, the room's chat is not read at all."""
    text_input = room_io.TextInputOptions(text_input_cb=chat) if config.text_input and chat is not None else False
    return room_io.RoomOptions(text_input=text_input, audio_input=room_io.AudioInputOptions(
        sample_rate=16000, frame_size_ms=40, auto_gain_control=config.auto_gain_control),
        video_input=config.vision != "off")  # which track: agent/vision.py


async def entrypoint(ctx: JobContext) -> None:
    if (reason := refusal_reason(ctx.job.metadata)) is not None:
        # a call no trunk accepts that reached a job all the same (CallRefusals declines those
        # offered by the refuse rule; a dispatch made by hand is not): no session, no model
        await refuse_call(ctx.api, ctx.job.room.name, reason)
        ctx.shutdown(reason=f"refused: {reason}")
        return
    config = settings()
    vad = build_vad(config)
    turn_detector = build_turn_detector(config, ctx.inference_executor)
    session = build_session(config, vad, turn_detector)
    events = RoomEvents(session, ctx.room, metrics(), vad)
    events.attach()
    turn_detector.on_decision = events.turn_decision
    metrics().session_started()
    ctx.add_shutdown_callback(_session_ended)
    barge_in = BargeInGate(session, vad, min_speech_s=config.min_barge_in_s, on_ignored=events.sound_ignored)
    barge_in.attach()
    turn_detector.barging_in = lambda: barge_in.barging_in
    # The VAD's end of speech starts the reply; the turn detector's decision plays it. Speech
    # over a reply that the gate lets through as a turn ends that reply, so the next one starts
    # at its end of speech too.
    if config.realtime_plugin == "omni":  # LiveKit's plugin has no speculative replies
        omni.SpeculativeReplyTrigger(session, ends_reply=barge_in.speech_is_a_turn).attach()
    ctx.add_shutdown_callback(events.aclose)
    phone = PhoneCall(ctx.room, lambda: ctx.api, publish=events.publish, session=session,
                      transfer_to=config.transfer_to, transfer_timeout_s=config.transfer_timeout_s,
                      key_actions=parse_key_actions(config.dtmf_actions))
    phone.attach()
    ctx.add_shutdown_callback(phone.aclose)
    chat = ChatTextGate(max_chars=config.text_max_chars, per_minute=config.text_per_minute, burst=config.text_burst,
                        phone_text_input=config.phone_text_input, is_phone_call=lambda: phone.caller is not None,
                        publish=events.publish)
    # The caller hung up (or was hung up on): end the job now, which flushes its metrics, rather
    # than when LiveKit closes the empty room (its departure timeout, 20 s). Deleting the room
    # first ends the job as done (an agent that just leaves is reported as a failed job).
    session.on("close", lambda ev: _end_job(ctx, f"session closed: {ev.reason}"))

    agent = VoiceAgent(config, on_user_turn=events.user_turn, call_tools=phone.tools())
    log.info("call in room %s: omni worker %s, voice %s", ctx.room.name, config.omni_url, config.voice)
    # record=False: no audio, transcript or trace upload anywhere. session_host=False: no
    # livekit-agents RemoteSession over the room (topic lk.agent.session), through which any
    # participant could read the agent's instructions and the chat history and make it answer
    # text; nothing of ours uses it, and it sent every state change and item to the room again.
    await session.start(agent=agent, room=ctx.room, record=False, session_host=False,
                        room_options=room_options(config, chat))
    if config.vision != "off":
        VisionWatcher(config.vision, ctx.room, session, events.publish).attach()
    phone.find_caller()


def _livekit_api(config: AgentSettings) -> api.LiveKitAPI:
    return api.LiveKitAPI(config.livekit_url, config.livekit_api_key, config.livekit_api_secret.get_secret_value())


def _end_job(ctx: JobContext, reason: str) -> None:
    ctx.delete_room().add_done_callback(lambda _: ctx.shutdown(reason=reason))


async def _session_ended() -> None:
    metrics().session_ended()


def _port(configured: int | None, start_mode_default: int, mode: str) -> int:
    """An unset port is the default in `start` mode and a free one (0) in dev and console, so
    several agents can run on one machine (livekit-agents does the same for its health port)."""
    if configured is not None:
        return configured
    return start_mode_default if mode == "start" else 0


def worker_options(config: AgentSettings, mode: str) -> WorkerOptions:
    """`mode`: the command (dev, start, console)."""
    return WorkerOptions(
        entrypoint_fnc=entrypoint,
        # calls no trunk accepts are refused here, in the worker's process, without a job
        # process and at a bounded rate (agent/phone.py, docs/sip.md)
        request_fnc=CallRefusals(lambda: _livekit_api(config), per_s=config.sip_refusals_per_s,
                                 burst=config.sip_refusal_burst),
        prewarm_fnc=prewarm,
        load_fnc=OmniWorkerLoad(config.omni_health_url),
        # Set in dev mode too (livekit-agents ignores load there by default): the GPU is shared.
        load_threshold=config.load_threshold,
        drain_timeout=config.drain_timeout_s,
        # livekit-agents' default is one per CPU, up to 4: each waits with ~310 MB RSS (most of it
        # shared with the others) and 0.6 % of a core; two cover calls that arrive together,
        # and the pool refills in about half a second
        num_idle_processes=ServerEnvOption(dev_default=0, prod_default=config.idle_processes),
        agent_name=config.agent_name,
        ws_url=config.livekit_url,
        api_key=config.livekit_api_key,
        api_secret=config.livekit_api_secret.get_secret_value(),
        host=config.http_host,
        port=_port(config.http_port, 8081, mode),
        prometheus_port=_port(config.metrics_port, 8082, mode),
    )


def main() -> None:
    try:
        config = settings()
    except ValueError as e:  # pydantic's ValidationError: say which setting, then stop
        sys.exit(f"agent: bad configuration:\n{e}")
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    register_turn_detector()
    if mode == "console" and "--text" not in sys.argv[2:]:
        check_audio_devices(sys.argv[2:])  # exits with a clear message when there are none
    cli.run_app(worker_options(config, mode))


if __name__ == "__main__":
    main()
