"""What the agent tells the operator (one latency line per turn in the log) and the room (the
same facts as small JSON messages, so a client, a test or a benchmark can see what the agent
decided and when, without scraping logs).

Room messages go out as reliable data packets on the topic `omni.agent.events`; each is a JSON
object with `type` and `at` (the agent's wall clock, seconds since the epoch):

- `agent_state` {state, old_state}: listening / thinking / speaking. speaking → listening while
  the user talks is the moment the agent decided to stop talking (pause or barge-in).
- `user_state` {state, old_state}: the agent's VAD view of the user.
- `user_turn` {endpointing_s}: the agent decided the user's turn is over (VAD silence, then the
  turn detector's endpointing delay) and asks the model for a reply; endpointing_s is the time
  from the end of the user's speech (as the VAD measured it) to this decision.
- `turn` {turn, voice_to_voice_s, endpointing_s, model_first_audio_s, speculative, interrupted,
  conversation_items}: once per agent reply, when it is over (played out, or cut).
  voice_to_voice_s runs from the end of the user's speech to the reply's first audio frame
  going out to the room; endpointing_s from the end of speech to the end-of-turn decision
  (null for replies no user turn asked for, e.g. the greeting); speculative: the reply was
  started at the VAD's end of speech, before that decision.
- `turn_decision` {detector, v1_mini, smart_turn, score, wait_s, inference_s}: the end-of-turn
  models' answer 0.2 s into a silence (each model's probability, null for one not run, and the
  chosen detector's score) and the silence after the last speech the turn then needs before it is
  committed (agent/turn_detector.py); speech before then withdraws it.
- `speculative_reply` {outcome, started, used, discarded}: a reply started before the turn
  was confirmed, and what became of it (outcome "started", "used" or "discarded"), with the
  call's counts so far.
- `false_interruption` {resumed}: the agent paused for a sound and went on with its reply.
- `sound_ignored` {speech_s}: a short sound over the reply was not taken as a turn.
- `response_done` {response_id, cancelled, model_first_audio_s}: the worker finished a
  response, or cancelled it (a barge-in while it was still generating).

agent/phone.py publishes through the same channel on phone calls: `caller`, `dtmf`, `hangup`,
`transfer`.

The same turns feed the agent's Prometheus metrics (agent/metrics.py).

The agent's *transcripts* are published by livekit-agents itself (text streams on the
`lk.transcription` topic); nothing here duplicates them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

from livekit import rtc
from livekit.agents import (
    AgentFalseInterruptionEvent,
    AgentSession,
    AgentStateChangedEvent,
    MetricsCollectedEvent,
    SpeechCreatedEvent,
    UserStateChangedEvent,
    llm,
)
from livekit.agents.metrics import RealtimeModelMetrics
from livekit.agents.voice import SpeechHandle
from livekit.plugins import omni

from .barge_in import IgnoredSound, SpeechLengthVAD
from .metrics import AgentMetrics
from .turn_detector import TurnDecision

TOPIC = "omni.agent.events"

log = logging.getLogger("omni-agent.turns")


class RoomEvents:
    def __init__(self, session: AgentSession, room: rtc.Room, metrics: AgentMetrics,
                 speech_vad: SpeechLengthVAD | None = None) -> None:
        self._session = session
        self._room = room
        self._metrics = metrics
        self._vad = speech_vad
        self._turn_endpointing: float | None = None  # of the user turn just committed
        self._turns = 0
        self._model_first_audio: dict[str, float] = {}  # response id → seconds
        self._endpointing: dict[str, float] = {}  # reply speech id → its turn's endpointing, s
        self._watched_sessions: set[int] = set()  # realtime sessions whose speculation we report
        self._turn_reply: str | None = None  # speech id of the reply to the latest spoken turn
        self._speculative_replies: set[str] = set()  # speech ids answered by a speculative reply
        self._sending: set[asyncio.Task[None]] = set()

    def attach(self) -> None:
        s = self._session
        s.on("agent_state_changed", self._on_agent_state)
        s.on("user_state_changed", self._on_user_state)
        # Deprecated in livekit-agents 1.8 (it warns once), but the only place where the
        # model's time to first audio and a response's cancellation are reported.
        s.on("metrics_collected", self._on_metrics)
        s.on("speech_created", self._on_speech_created)
        s.on("agent_false_interruption", self._on_false_interruption)

    def turn_decision(self, decision: TurnDecision) -> None:
        """The end-of-turn models answered: the silence this turn needs before it is committed."""
        self.publish("turn_decision", detector=decision.detector, v1_mini=_round(decision.scores.v1_mini),
                     smart_turn=_round(decision.scores.smart_turn), score=_round(decision.score),
                     wait_s=round(decision.wait_s, 3), inference_s=round(decision.inference_s, 3))

    def sound_ignored(self, sound: IgnoredSound) -> None:
        self.publish("sound_ignored", speech_s=round(sound.speech_s, 3))

    def user_turn(self) -> None:
        """The user's turn was committed (called from Agent.on_user_turn_completed)."""
        ended = self._vad.last_speech_ended_at if self._vad is not None else None
        self._turn_endpointing = time.time() - ended if ended is not None else None
        self.publish("user_turn", endpointing_s=self._turn_endpointing)

    async def aclose(self) -> None:
        if self._sending:
            await asyncio.wait(self._sending, timeout=2.0)

    # -- session events

    def _on_agent_state(self, ev: AgentStateChangedEvent) -> None:
        self._watch_realtime_session()
        self.publish("agent_state", state=ev.new_state, old_state=ev.old_state, at=ev.created_at)

    def _on_user_state(self, ev: UserStateChangedEvent) -> None:
        self.publish("user_state", state=ev.new_state, old_state=ev.old_state, at=ev.created_at)

    def _on_metrics(self, ev: MetricsCollectedEvent) -> None:
        m = ev.metrics
        if not isinstance(m, RealtimeModelMetrics):
            return
        first_audio = m.ttft if m.ttft >= 0 else None
        if first_audio is not None:
            self._model_first_audio[m.request_id] = first_audio
        self.publish("response_done", response_id=m.request_id, cancelled=m.cancelled,
                     model_first_audio_s=first_audio)

    def _on_speech_created(self, ev: SpeechCreatedEvent) -> None:
        if ev.speech_handle.input_details.modality == "audio" and self._turn_endpointing is not None:
            # the framework's reply to the spoken turn just committed (created right after it)
            self._endpointing[ev.speech_handle.id] = self._turn_endpointing
            self._turn_endpointing = None
            self._turn_reply = ev.speech_handle.id
        ev.speech_handle.add_done_callback(self._on_reply_over)

    def _on_reply_over(self, reply: SpeechHandle) -> None:
        self._turns += 1
        said = [item for item in reply.chat_items
                if isinstance(item, llm.ChatMessage) and item.role == "assistant"]
        metrics = said[0].metrics if said else {}
        voice_to_voice = metrics.get("e2e_latency")
        model_first_audio = None
        response_ids = metrics.get("provider_request_ids", [])
        for response_id in response_ids:
            model_first_audio = self._model_first_audio.pop(response_id, model_first_audio)
        rt = self._realtime_session()
        speculative = reply.id in self._speculative_replies or (
            rt is not None and any(rt.is_speculative_reply(r) for r in response_ids))
        self._speculative_replies.discard(reply.id)
        endpointing = self._endpointing.pop(reply.id, None)
        items = self._conversation_size()
        self._metrics.reply_over(interrupted=reply.interrupted, voice_to_voice_s=voice_to_voice,
                                 model_first_audio_s=model_first_audio)
        if endpointing is not None:
            self._metrics.user_turn_decided(endpointing)

        log.info(
            "turn %d: voice-to-voice %s (end of user speech → first agent audio out), endpointing %s, "
            "model first audio %s%s, interrupted=%s, conversation items=%s",
            self._turns, _ms(voice_to_voice), _ms(endpointing), _ms(model_first_audio),
            " (started before the turn was confirmed)" if speculative else "", reply.interrupted, items,
        )
        self.publish(
            "turn",
            turn=self._turns,
            voice_to_voice_s=voice_to_voice,
            endpointing_s=endpointing,
            model_first_audio_s=model_first_audio,
            speculative=speculative,
            interrupted=reply.interrupted,
            conversation_items=items,
        )

    def _on_false_interruption(self, ev: AgentFalseInterruptionEvent) -> None:
        log.info("false interruption: %s", "resumed the reply" if ev.resumed else "not resumed")
        self._metrics.false_interruption(resumed=ev.resumed)
        self.publish("false_interruption", resumed=ev.resumed, at=ev.created_at)

    # -- sending

    def publish(self, event_type: str, *, at: float | None = None, **fields: Any) -> None:
        """Fire and forget: never block the session's event handlers on the network."""
        if not self._room.isconnected():
            return
        body = {"type": event_type, "at": at if at is not None else time.time(), **fields}
        payload = json.dumps(body).encode()
        task = asyncio.create_task(self._send(payload))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _send(self, payload: bytes) -> None:
        try:
            await self._room.local_participant.publish_data(payload, reliable=True, topic=TOPIC)
        except Exception as e:  # a closing room must not take the session down
            log.debug("could not publish an agent event: %s", e)


    def _realtime_session(self) -> omni.RealtimeSession | None:
        try:
            rt = self._session.current_agent.realtime_llm_session
        except RuntimeError:  # no agent or no realtime session (the call is ending)
            return None
        return rt if isinstance(rt, omni.RealtimeSession) else None

    def _watch_realtime_session(self) -> None:
        """Report its speculative replies (the session exists once the agent is running)."""
        rt = self._realtime_session()
        if rt is not None and id(rt) not in self._watched_sessions:
            self._watched_sessions.add(id(rt))
            rt.on("omni_speculative_reply", self._on_speculative_reply)

    def _on_speculative_reply(self, ev: dict[str, Any]) -> None:
        if ev["outcome"] == "used" and self._turn_reply is not None:
            # handed over to the framework's reply to the turn just committed
            self._speculative_replies.add(self._turn_reply)
        self.publish("speculative_reply", **ev)

    def _conversation_size(self) -> int | None:
        """Items in the model's conversation, as the omni worker acknowledged them (the
        realtime session mirrors the worker's `conversation.item.added` events)."""
        rt = self._realtime_session()
        return len(rt.chat_ctx.items) if rt is not None else None


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def _ms(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1000:.0f} ms"
