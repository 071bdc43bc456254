"""What runs at each step of the engine loop: policy only, no model code.

The loop asks three questions per step, in this order, and runs the answers:

1. `schedule()`: which waiting replies get a KV slot (and how much of their prompt the
   session's prefix cache already holds), which prompt chunks are prefilled (a token budget
   per step, so running replies keep decoding while a long prompt goes in), and which replies
   take a thinker decode step (all that have a token to feed: one batch).
2. `talker_batch()`: which replies take a talker step (all whose reply stream has an element
   for it, or that keep talking after the text: one batch), but for a talker that is already
   `AHEAD_CHUNKS` chunks' worth of codes ahead of its audio: it waits for token2wav. Codes
   far ahead of the audio help no listener, and on a busy GPU their decode steps would take
   the device from the token2wav batches that make the audio (which run beside the decode
   steps at a lower priority): this keeps decoding and audio in step under any load.
3. `token2wav_batch(now)`: whose audio chunks are made now. This is where the scheduler is a
   *realtime* one: each reply has a playback clock (audio sent vs. wall time since its first
   packet). A DiT window costs about as much for one reply as for sixteen, so chunks are made
   in batches, every ready chunk at once, most urgent first: at once when a reply waits for
   its first packet, or a listener has audio left but less than `URGENT_S` (it can still be
   saved); when some listener has less than `playback_margin_s` left, or none at all, but at
   most every `token2wav_interval_s` counted from the end of the last batch: a listener that
   has already run dry waits for the interval like the rest, because when listeners run dry
   the engine is behind, and a batch per step of whoever is ready (one or two replies) would
   spend the GPU on DiT windows instead of the decode steps that would catch it up;
   otherwise token2wav waits and decode steps go on. `bench/schedule_sim.py` runs this policy
   on a cost model, to see what a change does before it runs on a GPU.

A reply admitted while fewer than `quick_start_below` other realtime replies are running or
waiting starts quickly: its first chunk is made without look-ahead, one block of codes (12
decode steps) sooner. On a quiet engine the decode steps are fast enough to make up that
block before the first chunk has played; on a busy one they are not, and the listener would
hear a gap, so a busy engine keeps the look-ahead.

Background replies (input transcription) are admitted only when no realtime reply waits, get
prefill budget only when no realtime prompt needs it, and ride along in decode batches.

`SlotTable` is the memory side: who holds which KV slot (a running reply, a session's cached
prefix, nobody), with least-recently-used eviction of cached prefixes.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field

import numpy as np

from ..exceptions import EngineOverloaded
from .prompt import common_prefix
from .reply import Phase, Reply


# a talker this many chunks (codes and look-ahead) ahead of its audio waits for token2wav
AHEAD_CHUNKS = 2

# a listener with less audio than this left (but some) gets its chunk now, whatever the
# interval: about what one batch of DiT windows and vocoder chunks takes on a GPU, with room
# to spare
URGENT_S = 0.15


@dataclass
class CachedPrefix:
    """What a session's idle KV slot holds: thinker tokens by content key, and how many of
    the leading ones the talker's slot holds too (its prompt part)."""
    session_id: str
    thinker_keys: np.ndarray
    talker_tokens: int


class SlotTable:
    def __init__(self, count: int) -> None:
        self.count = count
        self.free: list[int] = list(range(count - 1, -1, -1))
        self.cached: OrderedDict[int, CachedPrefix] = OrderedDict()  # least recently used first
        self.busy: set[int] = set()
        self.evictions = 0

    @property
    def available(self) -> int:
        """Slots a new reply could get now (free, or holding an evictable cache)."""
        return len(self.free) + len(self.cached)

    def acquire(self, session_id: str | None) -> tuple[int, CachedPrefix | None] | None:
        """A slot for a reply of `session_id`: its own cached one, else a free one, else the
        least recently used cache evicted; None when every slot runs a reply."""
        if session_id is not None:
            for slot, prefix in self.cached.items():
                if prefix.session_id == session_id:
                    del self.cached[slot]
                    self.busy.add(slot)
                    return slot, prefix
        if self.free:
            slot = self.free.pop()
        elif self.cached:
            slot, _ = self.cached.popitem(last=False)
            self.evictions += 1
        else:
            return None
        self.busy.add(slot)
        return slot, None

    def release(self, slot: int, prefix: CachedPrefix | None) -> None:
        """The reply on `slot` is over; keep what the slot holds as its session's cache."""
        self.busy.discard(slot)
        if prefix is None or not len(prefix.thinker_keys):
            self.free.append(slot)
            return
        self.drop_session(prefix.session_id)  # one cached prefix per session: the newest
        self.cached[slot] = prefix

    def drop_session(self, session_id: str) -> None:
        for slot in [slot for slot, prefix in self.cached.items() if prefix.session_id == session_id]:
            del self.cached[slot]
            self.free.append(slot)


@dataclass
class StepPlan:
    prefill: list[tuple[Reply, int, int]] = field(default_factory=list)  # (reply, start, end)
    thinker: list[Reply] = field(default_factory=list)


class Scheduler:
    def __init__(self, slots: SlotTable, *, prefill_chunk_tokens: int, max_waiting: int,
                 max_queue_wait_s: float, playback_margin_s: float,
                 token2wav_interval_s: float = 0.0, quick_start_below: int = 0,
                 ahead_chunks: int = AHEAD_CHUNKS) -> None:
        self.slots = slots
        self.ahead_chunks = ahead_chunks  # 0: talkers run ahead without limit
        self.quick_start_below = quick_start_below
        self.prefill_chunk_tokens = prefill_chunk_tokens
        self.max_waiting = max_waiting
        self.max_queue_wait_s = max_queue_wait_s
        self.playback_margin_s = playback_margin_s
        self.token2wav_interval_s = token2wav_interval_s
        self.last_token2wav = float("-inf")
        self.waiting: deque[Reply] = deque()
        self.running: list[Reply] = []

    # ----------------------------------------------------------------- requests in and out

    def add(self, reply: Reply) -> None:
        """Queue a reply; refuse it at once when the queue is already as long as it may get."""
        if len(self.waiting) >= self.max_waiting:
            raise EngineOverloaded(f"{len(self.waiting)} replies are already waiting for memory")
        self.waiting.append(reply)

    def remove(self, reply: Reply) -> None:
        """Take a reply out (done, cancelled or failed) and free or cache its slot."""
        if reply in self.waiting:
            self.waiting.remove(reply)
        if reply in self.running:
            self.running.remove(reply)
        if reply.slot is not None:
            self.slots.release(reply.slot, self._prefix_of(reply))
            reply.slot = None

    def expired(self, now: float) -> list[Reply]:
        """Waiting replies that have waited longer than the bound (the loop fails them)."""
        return [reply for reply in self.waiting if now - reply.arrived > self.max_queue_wait_s]

    @property
    def has_work(self) -> bool:
        return bool(self.running) or bool(self.waiting and self.slots.available)

    # ----------------------------------------------------------------- the three questions

    def schedule(self) -> StepPlan:
        self._admit()
        plan = StepPlan()
        # Background work (prefill chunks and decode steps) waits while a listener waits for a
        # first packet: where it costs something (a CPU, a full GPU) it would delay that packet.
        hold_background = any(r.waits_for_first_audio for r in self.running if not r.background)
        budget = self.prefill_chunk_tokens
        prefilling = [r for r in self.running if r.phase is Phase.PREFILL]
        realtime_prefilling = any(not r.background for r in prefilling)
        for reply in sorted(prefilling, key=lambda r: (r.background, r.arrived)):
            if budget <= 0 or (reply.background and (hold_background or realtime_prefilling)):
                break
            count = min(reply.prefill_left, budget)
            plan.prefill.append((reply, reply.prefilled, reply.prefilled + count))
            budget -= count
        plan.thinker = [r for r in self.running
                        if r.wants_thinker_step and not (r.background and hold_background)]
        return plan

    def talker_batch(self) -> list[Reply]:
        return [r for r in self.running if r.wants_talker_step and not self._far_ahead(r)]

    def token2wav_batch(self, now: float) -> list[Reply]:
        ready = [r for r in self.running if r.wants_token2wav()]
        if not ready:
            return []
        slacks = [r.playback_slack(now) for r in ready]
        first = any(r.first_audio_at is None for r in ready)
        saveable = any(0 <= slack < URGENT_S for slack in slacks)
        short = min(slacks) < self.playback_margin_s and now - self.last_token2wav >= self.token2wav_interval_s
        if not (first or saveable or short):
            return []
        return sorted(ready, key=lambda r: r.playback_slack(now))

    def token2wav_ran(self, now: float) -> None:
        """A token2wav batch has just finished (the interval counts from its end, so replies
        a step or two behind the batch's join the next one instead of running alone)."""
        self.last_token2wav = now

    # ----------------------------------------------------------------- internals

    def _admit(self) -> None:
        while self.waiting:
            realtime = [r for r in self.waiting if not r.background]
            reply = realtime[0] if realtime else self.waiting[0]
            granted = self.slots.acquire(reply.session_id)
            if granted is None:
                return
            slot, prefix = granted
            self.waiting.remove(reply)
            reused, talker_reused = self._reusable(reply, prefix)
            others = len(realtime) - 1 + sum(not r.background for r in self.running)
            reply.admit(slot, reused, talker_reused,
                        quick_start=not reply.background and others < self.quick_start_below)
            self.running.append(reply)

    def _far_ahead(self, reply: Reply) -> bool:
        ahead, next_chunk = reply.codes_ahead
        return bool(self.ahead_chunks) and ahead >= self.ahead_chunks * next_chunk

    @staticmethod
    def _reusable(reply: Reply, prefix: CachedPrefix | None) -> tuple[int, int]:
        """(thinker tokens, talker tokens) of the reply's prompt its slot already holds. At
        least one prompt token is always prefilled (its logits start the reply). A spoken
        reply's talker reads the thinker's states of the prompt tokens its prompt part comes
        from, so the thinker starts again at the first of those the talker does not hold
        (with Qwen2.5-Omni's lockstep talker: the same token)."""
        if prefix is None:
            return 0, 0
        prompt, feed = reply.prompt, reply.prepared.talker_feed
        shared = min(common_prefix(prefix.thinker_keys, prompt.keys), prompt.length - 1)
        talker = min(feed.tokens_before(shared), prefix.talker_tokens)
        if reply.needs_talker_prefill:
            shared = min(shared, feed.source(talker))
        return shared, talker

    @staticmethod
    def _prefix_of(reply: Reply) -> CachedPrefix | None:
        if reply.session_id is None:
            return None
        keys = reply.kv_keys()
        # the talker's slot holds the prompt part it prefilled (a reply that did not speak
        # left the talker's earlier content, valid as far as the thinker's reuse went)
        talker = reply.talker_prefilled if reply.needs_talker_prefill else reply.talker_reused
        return CachedPrefix(reply.session_id, keys, min(talker, len(keys)))

