"""The engine loop: one thread owns the device and runs every reply's work, step by step.

Requests come in and go out through `inbox` (add, abort, end a session, stop), applied
between steps, never during one. Each step asks the scheduler what to run (scheduler.py),
has the model runner run it (runner.py) and hands the results to the replies (reply.py),
which emit their deltas to their asyncio consumers. When nothing is running the loop sleeps
on the inbox; when replies run but none has work this step (audio in flight, or not due
yet) it naps briefly on it, never spinning (a spinning thread would take the GIL from the
gateway's).

token2wav is asynchronous: a batch of chunks is launched on token2wav's own CUDA stream
(token2wav_runner.py) and the loop goes on with decode steps; each step collects whatever
audio has arrived on the host. One batch is in flight at a time, and a reply with a chunk in
flight waits for it before its next one; a batch still out after TOKEN2WAV_STALL_S (a bound
well above a normal batch's time, so it never acts in normal running; the journal has the
batch times) is waited for before the next step.

A failure inside one reply's own work (its prefill, its talker's start, its sampling) fails
that reply only; a failure inside a batched step fails the replies of that batch. Either way
the loop goes on with the others.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Callable, TypeVar

import torch

from ..exceptions import EngineError, EngineOverloaded
from .reply import Phase, Reply
from .models.base import ModelRunner
from .pending_audio import PendingWaves
from .scheduler import Scheduler

logger = logging.getLogger(__name__)

T = TypeVar("T")

# how long the loop naps when replies are running but nothing could be done this step
NAP_S = 0.001
# a token2wav batch out longer than this holds the decode steps until its audio is out (a
# bound several times what a busy GPU's batches take beside the decode steps; should one ever
# fall this far behind, listeners need audio more than codes)
TOKEN2WAV_STALL_S = 0.5
# how long the loop waits on its inbox when nothing runs
IDLE_WAIT_S = 0.5
# the longest a round of the loop takes when all is well (a step takes milliseconds)
ROUND_S = 2 * IDLE_WAIT_S


class EngineCore:
    def __init__(self, runner: ModelRunner, scheduler: Scheduler) -> None:
        self.runner = runner
        self.scheduler = scheduler
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self.stats = LoopStats()
        # token2wav launched and not yet collected: (replies, their audio), in launch order
        self.in_flight: list[tuple[list[Reply], PendingWaves]] = []
        self._token2wav_launched = 0.0
        self.came_round_at = time.monotonic()  # when the loop last began a round

    # ----------------------------------------------------------------- the asyncio side

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="omni-engine-loop", daemon=True)
        self._thread.start()

    def add(self, reply: Reply) -> None:
        self.inbox.put(("add", reply))

    def abort(self, reply: Reply) -> None:
        self.inbox.put(("abort", reply))

    def end_session(self, session_id: str) -> None:
        self.inbox.put(("end_session", session_id))

    @property
    def token2wav_launched_at(self) -> float:
        """When the loop last launched token2wav (time.monotonic()), for a stall report."""
        return self._token2wav_launched

    def stalled_s(self) -> float:
        """Seconds the loop has been inside one round beyond ROUND_S: a long time means it
        is blocked (the device hung, say). 0 while it comes round, or when it is not running."""
        if self._thread is None or not self._thread.is_alive():
            return 0.0
        return max(0.0, time.monotonic() - self.came_round_at - ROUND_S)

    def stop(self) -> None:
        if self._thread is not None:
            self.inbox.put(("stop", None))
            self._thread.join()
            self._thread = None

    # ----------------------------------------------------------------- the loop

    def _run(self) -> None:
        with torch.inference_mode(), self.runner.loop_stream():
            self.runner.synchronize()  # what other threads put on the device is there
            worked = False
            while True:
                self.came_round_at = time.monotonic()
                try:
                    if not self.scheduler.has_work:
                        command = self.inbox.get(timeout=IDLE_WAIT_S)
                    elif not worked:
                        command = self.inbox.get(timeout=NAP_S)
                    else:
                        command = self.inbox.get_nowait()
                except queue.Empty:
                    command = None
                while command is not None:
                    if not self._apply(*command):
                        self._stop_all()
                        return
                    try:
                        command = self.inbox.get_nowait()
                    except queue.Empty:
                        command = None
                self._expire_waiting()
                worked = self.step() if self.scheduler.has_work else False

    def _apply(self, kind: str, value) -> bool:
        if kind == "add":
            try:
                self.scheduler.add(value)
            except EngineOverloaded as error:
                self._fail([value], error)
            else:  # the clips and pictures its session's context no longer reads leave the encoder cache
                self.runner.encoder_cache.read_by(value.session_id, value.prompt.media_keys)
        elif kind == "abort":
            value.cancelled = True
            self.scheduler.remove(value)
        elif kind == "end_session":
            self.scheduler.slots.drop_session(value)
            self.runner.encoder_cache.end_session(value)
        elif kind == "stop":
            return False
        return True

    def _expire_waiting(self) -> None:
        now = time.monotonic()
        for reply in self.scheduler.expired(now):
            self._fail([reply], EngineOverloaded(
                f"no memory for the reply after {now - reply.arrived:.1f} s in the queue"))

    def _stop_all(self) -> None:
        self.in_flight.clear()
        for reply in list(self.scheduler.running) + list(self.scheduler.waiting):
            self._fail([reply], EngineError("the engine is shutting down"))

    # ----------------------------------------------------------------- one step

    def step(self) -> bool:
        """One step: prompt chunks, then the thinker's decode step, the talkers' starts and
        step (the step first with `talker_beside_thinker`), all launched without waiting; then
        one copy brings every sampled id to the host (the step's only wait for the device) and
        the replies take their results; then the audio that has arrived goes out, and
        token2wav is launched for the replies whose audio is due. Returns whether anything was
        done."""
        runner, scheduler = self.runner, self.scheduler
        started = time.monotonic()
        if self.in_flight and started - self._token2wav_launched > TOKEN2WAV_STALL_S:
            starved, pending = self.in_flight[0]
            self._guard(starved, pending.wait)  # collected below, with what came with it
        plan = scheduler.schedule()
        worked = False
        # what the step's one read brings back: (ids on the device, who takes them)
        pending: list[tuple[torch.Tensor, Callable[[list[int]], None]]] = []
        # With the talker beside the thinker its step goes first and reads what earlier steps
        # made, on a stream of its own beside the prompt chunks and the thinker's step ("Two
        # streams"); else it goes last and reads the states this step's thinker makes.
        beside = runner.talker_beside_thinker
        talkers = scheduler.talker_batch() if beside else []
        stepping = [r for r in talkers if r.talker.started]
        if stepping:
            worked = True
            self._launch_talker_step(stepping, pending)
        if plan.prefill:
            self._encode_pictures_together(plan.prefill)
        for reply, start, end in plan.prefill:
            worked = True
            first = self._guard([reply], lambda: self._prefill(reply, start, end))
            if first is not None:
                pending.append((first, lambda ids, reply=reply: self._take([reply], ids, Reply.take_token)))
        thinker = [r for r in plan.thinker if r.phase is Phase.DECODING]
        if thinker:
            worked = True
            launched = self._guard(thinker, lambda: self._thinker_step(thinker))
            if launched is not None:
                tokens, greedy = launched
                pending.insert(0, (tokens, lambda ids: self._take(greedy, ids, Reply.take_token)))
        if not beside:
            talkers = scheduler.talker_batch()
            stepping = [r for r in talkers if r.talker.started]
        for reply in [r for r in talkers if not r.talker.started and r.phase is Phase.DECODING]:
            worked = True
            code = self._guard([reply], lambda: self._talker_start(reply))
            if code is not None:
                pending.append((code, lambda ids, reply=reply: self._take_frames([reply], ids)))
        if stepping and not beside:
            worked = True
            self._launch_talker_step(stepping, pending)
        launched = time.monotonic()
        if pending:
            ids = self._guard(thinker + talkers, lambda: runner.read(*(t for t, _ in pending)))
            read = time.monotonic()
            for (_, take), values in zip(pending, ids or []):
                take(values)
        else:
            read = launched
        decoded = time.monotonic()
        worked = self._collect_audio() or worked
        speaking = [] if self.in_flight else scheduler.token2wav_batch(decoded)
        if speaking:
            worked = True
            self._launch_token2wav(speaking)
            self._collect_audio()  # at once where it is (a CPU's is), not a step later
        for reply in list(scheduler.running):
            if reply.phase is Phase.DECODING and reply.complete:
                scheduler.remove(reply)  # before its consumer hears it is done
                self._guard([reply], reply.finish)
        if worked:
            self.stats.count(started, launched, read, decoded, time.monotonic(), len(thinker),
                             len(stepping), len(speaking))
        return worked

    def _encode_pictures_together(self, chunks: list[tuple[Reply, int, int]]) -> None:
        """When the step's prompt chunks read a picture the encoder cache lacks: every new
        picture the prompts being prefilled read, this step's and those of their later chunks
        (the next steps'), of all sessions, through the vision encoder as one batch, one pass
        over its weights instead of one a picture; the chunks then find them cached. Should it
        fail, each chunk encodes its own pictures, so a bad one fails only its reply."""
        cache = self.runner.encoder_cache
        if not any(p.key not in cache.entries for reply, start, end in chunks
                   for p in reply.prompt.pictures_in(start, end)):
            return
        pictures = [p for reply in self.scheduler.running if reply.phase is Phase.PREFILL
                    for p in reply.prompt.pictures_in(reply.prefilled, reply.prompt.length)]
        try:
            cache.encode_together(pictures)
        except Exception:
            logger.exception("encoding %d pictures as one batch failed; each is encoded on its own", len(pictures))

    def _prefill(self, reply: Reply, start: int, end: int) -> torch.Tensor | None:
        """A chunk of the reply's prompt. Once the whole prompt is in, its first token: chosen
        now from the logits, or, where it is their argmax, returned on the device for the
        step's one read (choosing it here would wait for the device in the middle of the
        step, a visible share of a busy loop's time)."""
        logits = self.runner.prefill(reply, start, end)
        if logits is None or not reply.chooses_argmax:
            reply.after_prefill(end, logits)
            return None
        reply.after_prefill(end)
        return logits.argmax(dim=-1)

    def _thinker_step(self, replies: list[Reply]) -> tuple[torch.Tensor, list[Reply]]:
        """Launch the step; replies whose next token is not the plain argmax choose it now
        from the logits, the others get it from the step's one read."""
        result = self.runner.thinker_step(replies)
        greedy = []
        for row, reply in enumerate(replies):
            reply.token_fed(result.state[row:row + 1])
            if reply.chooses_argmax:
                greedy.append(reply)
            else:
                self._guard([reply], lambda: reply.choose(result.logits[row:row + 1]))
        rows = [row for row, reply in enumerate(replies) if reply.chooses_argmax]
        return result.argmax[rows] if len(rows) < len(replies) else result.argmax, greedy

    def _launch_talker_step(self, stepping: list[Reply], pending: list) -> None:
        with self.runner.talker_side():
            codes = self._guard(stepping, lambda: self._talker_step(stepping))
        if codes is not None:
            pending.append((codes, lambda ids: self._take_frames(stepping, ids)))

    def _talker_start(self, reply: Reply) -> torch.Tensor:
        codes = self.runner.talker_start(reply)
        reply.talker.length = reply.prepared.talker_feed.length + self.runner.talker_start_rows
        reply.talker.started = True
        reply.clock.mark("talker_started")
        return codes.reshape(-1)

    def _talker_step(self, replies: list[Reply]) -> torch.Tensor:
        codes = self.runner.talker_step(replies)
        for reply in replies:
            reply.talker.length += 1
        return codes.reshape(-1)

    def _take(self, replies: list[Reply], ids: list[int], take: Callable[[Reply, int], None]) -> None:
        """Each still running reply takes its id (a token) from the step's read."""
        for reply, value in zip(replies, ids):
            if reply.phase is Phase.DECODING:
                self._guard([reply], lambda: take(reply, value))

    def _take_frames(self, replies: list[Reply], ids: list[int]) -> None:
        """Each still running reply takes its codec frame (`runner.codes_per_frame` codes, the
        first the one that can end the speech) from the step's read."""
        width = self.runner.codes_per_frame
        for row, reply in enumerate(replies):
            if reply.phase is Phase.DECODING:
                frame = ids[row * width:(row + 1) * width]
                self._guard([reply], lambda: reply.after_talker_frame(frame))

    def _launch_token2wav(self, replies: list[Reply]) -> None:
        self._token2wav_launched = time.monotonic()
        for part in token2wav_parts(replies):
            pending = self._guard(part, lambda: self._launch_part(part))
            if pending is not None:
                self.in_flight.append((part, pending))

    def _launch_part(self, replies: list[Reply]) -> PendingWaves:
        """The replies' next chunks as one batch, on the audio decoder's stream; their audio
        comes back later (`_collect_audio`)."""
        return self.runner.launch_audio(replies)

    def _collect_audio(self) -> bool:
        """Every launched part whose audio is on the host (in launch order): each of its
        replies still running emits its chunk. Returns whether any part was collected."""
        collected = False
        while self.in_flight and self.in_flight[0][1].ready():
            replies, pending = self.in_flight.pop(0)
            collected = True
            waves = self._guard(replies, pending.waves)
            for reply, wave in zip(replies, waves or []):
                if reply.phase is Phase.DECODING:
                    self._guard([reply], lambda: reply.take_audio(reply.audio.take_audio(wave)))
        if collected and not self.in_flight:
            now = time.monotonic()
            self.scheduler.token2wav_ran(now)
            self.stats.token2wav_batch_s += now - self._token2wav_launched
        return collected

    # ----------------------------------------------------------------- failures

    def _guard(self, replies: list[Reply], work: Callable[[], T]) -> T | None:
        """`work()`, or None when it failed: then those replies fail, the loop goes on."""
        try:
            return work()
        except Exception as error:  # noqa: BLE001 - reported to those replies' consumers
            logger.exception("reply work failed (%d replies affected)", len(replies))
            self._fail(replies, error)
            return None

    def _fail(self, replies: list[Reply], error: BaseException) -> None:
        for reply in replies:
            if reply.phase is Phase.DONE:
                continue
            reply.phase = Phase.DONE
            self.scheduler.remove(reply)
            reply.emit(error)


@dataclass
class LoopStats:
    """What the loop did, for benchmarks and tests: steps that did any work, their host time
    and batch sizes. A step's decoding splits into launching its work (host), waiting in its
    one read for the device, and the replies taking their ids (host): a long wait means the
    device is the bottleneck, a short one that the host is. `token2wav_s` is the host's part
    of audio (collecting it, launching batches); a batch itself runs beside the decode steps,
    `token2wav_batch_s` from its launch until its audio is out."""
    steps: int = 0
    decode_s: float = 0.0
    launch_s: float = 0.0
    read_wait_s: float = 0.0
    token2wav_batch_s: float = 0.0
    token2wav_s: float = 0.0
    token2wav_runs: int = 0
    token2wav_rows: int = 0
    thinker_rows: int = 0
    talker_rows: int = 0
    largest_batch: int = 0

    def count(self, started: float, launched: float, read: float, decoded: float, ended: float,
              thinker: int, talker: int, speaking: int) -> None:
        self.steps += 1
        self.decode_s += decoded - started
        self.launch_s += launched - started
        self.read_wait_s += read - launched
        self.thinker_rows += thinker
        self.talker_rows += talker
        self.largest_batch = max(self.largest_batch, thinker, talker)
        self.token2wav_s += ended - decoded
        if speaking:
            self.token2wav_runs += 1
            self.token2wav_rows += speaking


def token2wav_parts(replies: list[Reply]) -> list[list[Reply]]:
    """A token2wav batch in the order it runs: the replies whose listeners wait for their first
    packet on their own first (their short solve, their vocoder chunk, their audio out), then
    the rest, so a first packet never waits for a batch of later chunks."""
    first = [r for r in replies if r.first_audio_at is None]
    rest = [r for r in replies if r.first_audio_at is not None]
    return [part for part in (first, rest) if part]
