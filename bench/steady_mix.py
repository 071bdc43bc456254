"""The steady state's rules for `python -m bench.reference steady`, apart from the GPU so they
can be tested on a CPU: call mixes (each turn's input and reply length drawn from a range), what a
level's replies add up to, and how many calls a GPU carries gap-free and how much audio it
then makes.

A level is *carried* when it ran to its end, every reply made audio, first audio p95 is at
most STEADY_FIRST_AUDIO_S and at most STEADY_GAPPED of its replies left their listener more
than GAP_S of silence after the first packet (a reply with no audio counts as such a reply,
never as a gap-free one). Levels count in ascending order up to the first one not carried:
`calls per GPU` is the last counted level, `gap-free audio per GPU` the most audio seconds per
wall second made at a counted level.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

GAP_S = 0.1                  # silence a listener hears after the first packet that counts
STEADY_FIRST_AUDIO_S = 0.6   # first audio p95 at a level that counts as carried
STEADY_GAPPED = 0.05         # share of replies with silence (or no audio) at such a level


def pct(values: list[float], q: float) -> float:
    """The nearest-rank q-th percentile; NaN values are left out (NaN when none is left)."""
    values = sorted(v for v in values if v == v)
    if not values:
        return float("nan")
    return values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))]


@dataclass(frozen=True)
class Seconds:
    """A length in seconds: fixed ("3") or drawn uniformly from a range ("1-6")."""

    low: float
    high: float

    @classmethod
    def parse(cls, text: str) -> Seconds:
        low, dash, high = str(text).strip().partition("-")
        try:
            seconds = cls(float(low), float(high) if dash else float(low))
        except ValueError:
            raise ValueError(f"{text!r}: seconds, e.g. 3 or 1-6") from None
        if not 0 < seconds.low <= seconds.high or math.isinf(seconds.high):
            raise ValueError(f"{text!r}: lengths must be positive and the range low-high")
        return seconds

    @property
    def mean(self) -> float:
        return (self.low + self.high) / 2

    def draw(self, rng: np.random.Generator) -> float:
        return self.low if self.low == self.high else float(rng.uniform(self.low, self.high))

    def __str__(self) -> str:
        return f"{self.low:g} s" if self.low == self.high else f"{self.low:g}-{self.high:g} s"


@dataclass(frozen=True)
class CallPattern:
    """One steady run's calls: each turn's speech and reply lengths, and the levels (calls at
    once) to run them at. Written IN/REPLY@LEVELS, e.g. "1-6/1-10@24,28" (without @LEVELS the
    bench's --levels), so one engine start can measure several call patterns."""

    speech: Seconds
    reply: Seconds
    levels: tuple[int, ...]

    @classmethod
    def parse(cls, text: str, levels: tuple[int, ...] = ()) -> CallPattern:
        lengths, at, named_levels = str(text).strip().partition("@")
        speech, slash, reply = lengths.partition("/")
        if not slash:
            raise ValueError(f"{text!r}: IN/REPLY[@LEVELS], e.g. 3/4 or 1-6/1-10@24,28")
        try:
            levels = tuple(int(n) for n in named_levels.split(",")) if at else tuple(levels)
        except ValueError:
            raise ValueError(f"{text!r}: levels are call counts, e.g. @24,28") from None
        if not levels or min(levels) < 1:
            raise ValueError(f"{text!r}: no levels (give @LEVELS or --levels)")
        return cls(Seconds.parse(speech), Seconds.parse(reply), tuple(sorted(set(levels))))

    def __str__(self) -> str:
        return f"{self.speech} in, {self.reply} replies"


def turn_lengths(speech: Seconds, reply: Seconds, *, calls: int, call: int, turn: int,
                 seed: int = 0) -> tuple[float, float]:
    """One turn's (caller's speech, reply) seconds. The draw depends only on the seed, the
    level, the call and the turn, so every run makes the same mix whatever order replies
    finish in."""
    rng = np.random.default_rng([seed, calls, call, turn])
    return speech.draw(rng), reply.draw(rng)


@dataclass
class Level:
    """What one steady level's replies came to. Each reply is a dict with `first_audio_s` (NaN
    when it made no audio), `stall_s` (silence after the first packet) and `audio_s`."""

    calls: int
    finished: bool                    # False: cut at the time limit (past capacity)
    wall_s: float                     # the level's wall time, first call's start to last end
    replies: list[dict] = field(default_factory=list)
    call_s: float = 0.0               # the calls' durations summed (start to last reply heard)

    @property
    def silent(self) -> int:
        """Replies that made no audio."""
        return sum(1 for r in self.replies if not r["audio_s"] > 0)

    @property
    def gapped(self) -> list[float]:
        """The silence of each reply with more than GAP_S of it after its first packet."""
        return [r["stall_s"] for r in self.replies if r["audio_s"] > 0 and r["stall_s"] > GAP_S]

    @property
    def failed_share(self) -> float:
        """Replies gapped or without audio, as a share of all (1.0 when there was none)."""
        if not self.replies:
            return 1.0
        return (len(self.gapped) + self.silent) / len(self.replies)

    def first_audio(self, q: float) -> float:
        """First audio's q-th percentile; a reply without audio counts as never (inf)."""
        return pct([r["first_audio_s"] if r["audio_s"] > 0 else math.inf for r in self.replies], q)

    @property
    def audio_per_s(self) -> float:
        """Audio seconds the engine made per wall second over the level."""
        return sum(r["audio_s"] for r in self.replies) / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def talk_share(self) -> float:
        """The share of the calls' time the agent was talking."""
        return sum(r["audio_s"] for r in self.replies) / self.call_s if self.call_s > 0 else 0.0

    @property
    def carried(self) -> bool:
        return (self.finished and bool(self.replies) and self.first_audio(95) <= STEADY_FIRST_AUDIO_S
                and self.failed_share <= STEADY_GAPPED)


def steady_capacity(levels: list[Level]) -> tuple[int, float]:
    """(calls per GPU, gap-free audio seconds per second): the levels in ascending order up
    to the first not carried count; a level above it does not, whatever it measured."""
    calls, audio_per_s = 0, 0.0
    for level in sorted(levels, key=lambda level: level.calls):
        if not level.carried:
            break
        calls, audio_per_s = level.calls, max(audio_per_s, level.audio_per_s)
    return calls, audio_per_s
