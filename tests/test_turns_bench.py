"""`python -m bench.turns --phone` without a call: its options and result file, and how a call's
utterances are judged from the phone's recordings and the agent's events (the real run is the
measurement, bench/results/*-vm-turns-phone*.log)."""

from __future__ import annotations

import datetime

import numpy as np
import pytest

from bench.turns import PHONE_LEAD_S, PHONE_LISTEN_S, RATE, Clip, out_path, parse_args, phone_results, phone_script
from tests.e2e.phone import RATE as PHONE_RATE
from tests.e2e.phone import Recording

DATE = datetime.datetime(2026, 12, 5, tzinfo=datetime.UTC)
T0 = 1_800_000_000.0  # the wall clock of the phone's first sent sample


def test_the_phone_run_is_named_apart_and_refuses_what_it_cannot_do():
    assert out_path(parse_args(["--phone"]), DATE).name == "2026-12-05-vm-turns-phone.log"
    assert out_path(parse_args(["--phone", "--tag", "x"]), DATE).name == "2026-12-05-vm-turns-phone-x.log"
    assert out_path(parse_args([]), DATE).name == "2026-12-05-vm-turns-defaults.log"
    for other in (["--livekit-url", "ws://127.0.0.1:7880"], ["--score"]):
        with pytest.raises(SystemExit):
            parse_args(["--phone", *other])


class Events:
    def __init__(self, events: list[dict]) -> None:
        self.events = events

    def events_of(self, event_type: str, *, after: float = 0.0) -> list[dict]:
        return [e for e in self.events if e["type"] == event_type and e["at"] > after]


def clip(name: str, seconds: float, pause: tuple[float, float] | None = None) -> Clip:
    samples = np.full(int(seconds * RATE), 3000, np.int16)
    if pause is None:
        return Clip(name, "festival", name, 0.0, samples)
    a, b = (int(t * RATE) for t in pause)
    samples[a:b] = 0
    return Clip(name, "festival", name, round((b - a) / RATE, 1), samples, pause_at=a, pause_end=b)


def test_a_call_is_judged_from_the_phone_recordings_on_the_wall_clock():
    clips = [clip("whole", 2.0), clip("paused", 3.0, pause=(1.0, 1.7)), clip("over", 1.0)]
    script = phone_script(clips)
    starts = [script.marks[str(i)][0] for i in range(3)]
    ends = [script.marks[str(i)][1] for i in range(3)]
    assert starts[0] == pytest.approx(PHONE_LEAD_S)
    assert starts[1] == pytest.approx(ends[0] + PHONE_LISTEN_S)
    # the agent's voice as the phone heard it, on the sent time line: an answer 0.8 s after the
    # first end; one into the second's pause that runs on; talk up to the third's start
    heard_from = 0.5
    heard = np.zeros(int((script.duration - heard_from) * PHONE_RATE), np.int16)

    def voice(start: float, end: float) -> None:
        heard[int((start - heard_from) * PHONE_RATE):int((end - heard_from) * PHONE_RATE)] = 1000

    voice(ends[0] + 0.8, ends[0] + 3.0)
    voice(starts[1] + 1.4, ends[1] + 2.0)
    voice(starts[2] - 0.5, starts[2] + 0.1)
    voice(ends[2] + 0.5, ends[2] + 1.0)
    rec = Recording(sent=script.samples(), heard=heard, sent_started_at=T0, heard_started_at=T0 + heard_from)
    events = Events([
        {"type": "turn_decision", "at": T0 + ends[0] + 0.2, "score": 0.7, "wait_s": 0.25},
        {"type": "user_turn", "at": T0 + ends[0] + 0.3, "endpointing_s": 0.3},
        {"type": "turn_decision", "at": T0 + starts[1] + 1.2, "score": 0.8, "wait_s": 0.25},
        {"type": "user_turn", "at": T0 + starts[1] + 1.3, "endpointing_s": 0.3},
        {"type": "user_turn", "at": T0 + ends[2] + 0.3, "endpointing_s": 2.5},
    ])

    whole, paused, over = phone_results(clips, script, rec, events, ready_at=T0 + 1.0, max_delay=2.5)

    assert whole.failed is None and not whole.cut_in
    assert whole.voice_to_voice == pytest.approx(0.8, abs=0.03)
    assert whole.endpointing == 0.3 and whole.decision["score"] == 0.7
    assert paused.cut_in and paused.heard_in_pause and paused.early_turn
    assert paused.voice_to_voice is None and paused.pause_decision["score"] == 0.8
    assert over.failed == "the agent was still speaking when it began"
    assert over.waited_max

    late = phone_results(clips, script, rec, events, ready_at=T0 + starts[0] + 0.1, max_delay=2.5)[0]
    assert late.failed == "spoken before the agent was in the room"
