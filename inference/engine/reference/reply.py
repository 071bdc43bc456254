"""One reply's state, from its admission to its last delta; owned by the engine loop.

A reply goes through: waiting (no KV slot yet) → prefill (prompt chunks into its slot, the
part before `reused` came from the session's prefix cache) → decoding (each step the thinker
feeds the last sampled token, and the talker reads one element of the "reply stream") →
done. The scheduler reads the state to decide what runs; the model runner computes; then
the reply takes the results here (`after_prefill`, `token_fed` and `take_token`,
`after_talker_code`, `take_audio`) and emits its deltas.

The talker trails the thinker by one token, exactly the data dependency of the offline
`generate()`: its step j needs the thinker's hidden state of reply token j. Its reply stream
is reply token j's (final hidden state + input embedding), then the text-eos embedding once
the spoken text is over, then the text-pad embedding for as long as it keeps talking
(`thinker_reply_part` of `Qwen2_5OmniForConditionalGeneration.generate`, built as it comes).
"""

from __future__ import annotations

import enum
import json
import logging
import math
import secrets
import time
import weakref
from collections import deque
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from ..base import AudioDelta, Finished, GenerationRequest, TextDelta, ToolCallDelta
from ..tool_calls import ToolCallParser, new_call_id
from .detokenize import IncrementalDecoder
from .phases import PhaseClock
from .models.base import TalkerFeed
from .prompt import Prompt
from .sampling import SamplingParams, TokenSampler

logger = logging.getLogger(__name__)

# Finished.timings entries measured between PhaseClock marks (GPU time on CUDA): the path to
# the first audio, phase by phase.
PHASES = {
    "prefill_s": ("prefill_start", "prefilled"),              # audio encoder + thinker prefill
    "talker_prefill_s": ("prefilled", "talker_started"),      # + the first thinker step
    "first_chunk_decode_s": ("talker_started", "first_codes"),  # steps until the 1st chunk's codes
    "first_dit_s": ("first_codes", "first_mel"),
    "first_vocoder_s": ("first_mel", "first_wave"),
}


@dataclass(frozen=True)
class GenerationSettings:
    max_new_tokens: int = 512
    max_audio_seconds: float = 60.0
    min_audio_seconds: float = 0.0
    max_tool_argument_tokens: int = 256
    seed: int | None = None
    talker_sampling: SamplingParams = SamplingParams()


@dataclass
class PreparedPrompt:
    """What the engine computes for a request off the loop thread, before it is queued."""
    prompt: Prompt
    thinker_positions: torch.Tensor   # (3, 1, L) rope positions of the prompt
    thinker_rope_delta: int
    talker_positions: torch.Tensor | None  # (3, 1, L + 2): prompt, speaker bos, first reply
    talker_rope_delta: int
    talker_feed: TalkerFeed           # what the talker reads, and when (the family's)
    forced_tools: list[dict] | None   # a call must be made to one of these (tool_choice)
    forced_prefix: str                # teacher-forced start of that call, in the prompt
    max_new_tokens: int


class Phase(enum.Enum):
    WAITING = "waiting"
    PREFILL = "prefill"
    DECODING = "decoding"
    DONE = "done"


@dataclass
class StreamElement:
    """One element of a talker's reply stream: a reply token, with what the thinker made of it
    (`state`, on the device, where the family's talker reads that) or None; `token` None marks
    the end of the spoken text."""
    token: int | None
    state: torch.Tensor | None = None


class TalkerTrack:
    """The talker's side of one reply: its reply stream and its codec frames so far."""

    def __init__(self, end_codes: set[int], min_codes: int, max_codes: int) -> None:
        self.stream: deque[StreamElement] = deque()
        self.open = True          # spoken text still coming
        self.started = False      # the talker's prefill tail ran
        self.length = 0           # tokens in the talker's KV slot
        self.end_codes = end_codes
        self.min_codes = min_codes
        self.max_codes = max_codes
        self.last_frame: list[int] | None = None  # the last frame's codes (the first can end it)
        self.codes = 0            # frames made

    @property
    def finished(self) -> bool:
        ended = self.last_frame is not None and self.last_frame[0] in self.end_codes
        return ended or self.codes >= self.max_codes

    @property
    def wants_step(self) -> bool:
        """A talker step (or its start) can run now."""
        if not self.started:
            return bool(self.stream) and self.stream[0].token is not None
        return not self.finished and (bool(self.stream) or not self.open)

    @property
    def silent(self) -> bool:
        """The reply has no spoken text: the talker never starts."""
        return not self.started and bool(self.stream) and self.stream[0].token is None

    def next_element(self) -> StreamElement | None:
        """Take the element the talker's next step reads (None: the stream is used up, the
        talker keeps talking past the text)."""
        return self.stream.popleft() if self.stream else None

    def close(self) -> None:
        """The spoken text is over (the end marker goes into the stream)."""
        if self.open:
            self.stream.append(StreamElement(None))
            self.open = False


class Reply:
    def __init__(self, request: GenerationRequest, prepared: PreparedPrompt, *, voice: str,
                 settings: GenerationSettings, tokenizer, thinker_sampling: SamplingParams,
                 stop_ids: set[int], tool_open_id: int | None, grammar, talker_end_codes: set[int],
                 codes_per_second: float, audio_stream: Callable,
                 device: torch.device, emit: Callable[[object], None], arrived: float) -> None:
        self.request = request
        self.prepared = prepared
        self.prompt = prepared.prompt
        self.voice = voice
        self.settings = settings
        self.tokenizer = tokenizer
        self.device = device
        self.emit = emit
        self.arrived = arrived
        self.session_id = request.session_id
        self.background = request.priority == "background"
        self.phase = Phase.WAITING
        self.slot: int | None = None
        self.reused = 0                # prompt tokens that came from the prefix cache
        self.prefilled = 0             # prompt tokens in the thinker's KV slot
        self.talker_prefilled = 0      # prompt tokens in the talker's KV slot
        self.talker_reused = 0         # of those, from the prefix cache
        self.fed: list[int] = []       # reply tokens fed to the thinker (in its KV after the prompt)
        self.pending_token: int | None = None  # the token the next thinker step feeds
        self.thinker_done = False
        self.cancelled = False
        self.failure: BaseException | None = None
        self.clock = PhaseClock(device)
        self.timings: dict[str, float] = {}
        seed = settings.seed if settings.seed is not None else secrets.randbits(63)
        # sampling draws once per decode step; token2wav's noise has a stream of its own, since
        # when its windows are made depends on the scheduler (and the seed must fix the output)
        self.generator = torch.Generator(device=device).manual_seed(seed)
        noise_generator = torch.Generator(device=device).manual_seed(seed ^ 0x2545F4914F6CDD1D)
        self.sampler = TokenSampler(thinker_sampling, device, generator=self.generator)
        self.history: torch.Tensor | None = None  # the ids the penalty reads (made on admission)
        self.stop_ids = stop_ids
        self.tool_open_id = tool_open_id
        self.max_new = prepared.max_new_tokens
        self.reply_tokens = 0
        self.reason = "stop"
        self.tool_calls = 0
        self.audio_samples = 0
        self.first_audio_at: float | None = None
        self.text = _TextChannel(tokenizer, self._emit_text, self._emit_call)
        self.forced = prepared.forced_tools
        self.decoder = None
        self.forced_ids: list[int] = []
        self.forced_fixed = 0
        if self.forced:
            self.decoder = grammar.decoder(*self._forced_grammar(prepared.forced_prefix))
        self.talker: TalkerTrack | None = None
        self.audio = None  # the family's audio stream (token2wav_stream.py, code2wav_stream.py)
        if "audio" in request.modalities and not self.forced:
            max_codes = max(1, int(settings.max_audio_seconds * codes_per_second))
            min_codes = min(int(settings.min_audio_seconds * codes_per_second), max_codes)
            self.talker = TalkerTrack(talker_end_codes, min_codes, max_codes)
            self.audio = audio_stream(voice, noise_generator, self.clock)
        # Qwen3-Omni's talker reads only a token's embedding, so its stream grows as tokens are
        # chosen; Qwen2.5-Omni's reads what the thinker made of a token, once it is fed

    # ----------------------------------------------------------------- state the scheduler reads

    @property
    def needs_talker_prefill(self) -> bool:
        return self.talker is not None

    @property
    def prefill_left(self) -> int:
        return self.prompt.length - self.prefilled

    @property
    def wants_thinker_step(self) -> bool:
        return self.phase is Phase.DECODING and self.pending_token is not None

    @property
    def wants_talker_step(self) -> bool:
        return self.phase is Phase.DECODING and self.talker is not None and self.talker.wants_step

    @property
    def codes_ahead(self) -> tuple[int, int]:
        """(codes the talker has made that are not audio yet, codes the next chunk needs)."""
        if self.audio is None:
            return 0, 1
        return self.audio.codes_ahead(), self.audio.codes_for_next_chunk()

    @property
    def waits_for_first_audio(self) -> bool:
        """A spoken reply whose listener has heard nothing yet (and may still hear something)."""
        return self.talker is not None and self.first_audio_at is None and not self.talker_finished

    def wants_token2wav(self) -> bool:
        """A chunk's codes are there, or the codes are complete and some are not yet audio
        (and no chunk of this reply is in flight)."""
        if self.audio is None or self.phase is not Phase.DECODING or self.audio.in_flight:
            return False
        return self.audio.ready() or (self.talker_finished and self.audio.has_rest())

    @property
    def talker_finished(self) -> bool:
        """No more codes will come (the thinker is done and the talker ended or never starts)."""
        return self.talker is None or (self.thinker_done and (self.talker.finished or self.talker.silent))

    @property
    def complete(self) -> bool:
        if not self.thinker_done:
            return False
        if self.talker is None:
            return True
        return self.talker_finished and not self.audio.has_rest() and not self.audio.in_flight

    def playback_slack(self, now: float) -> float:
        """Seconds of audio the listener has left before running dry (negative: a gap);
        before the first packet, minus the time waited so far, so the first chunk of a reply
        that has waited longest goes first."""
        if self.first_audio_at is None:
            return -(now - self.arrived)
        return self.audio_samples / 24_000 - (now - self.first_audio_at)

    # ----------------------------------------------------------------- admission

    def admit(self, slot: int, reused: int, talker_reused: int, quick_start: bool = False) -> None:
        """A KV slot is the reply's, `reused` prompt tokens of it already there; `quick_start`:
        its first audio chunk is made without look-ahead (the scheduler's call, by load)."""
        self.slot = slot
        if quick_start and self.audio is not None:
            self.audio.start_quickly()
        self.reused = self.prefilled = reused
        self.talker_reused = talker_reused
        self.talker_prefilled = talker_reused if self.talker is not None else 0
        if self.sampler.needs_history:  # on the loop's thread and stream, like all its device work
            self.history = self.prompt.input_ids.to(self.device)
        self.phase = Phase.PREFILL
        self.timings["queue_wait_s"] = time.monotonic() - self.arrived
        self.timings["reused_tokens"] = float(reused)
        self.clock.mark("prefill_start")

    def kv_keys(self) -> np.ndarray:
        """Content keys of what the thinker's KV slot holds now (for the prefix cache)."""
        return np.concatenate([self.prompt.keys[:self.prefilled], np.asarray(self.fed, dtype=np.int64)])

    # ----------------------------------------------------------------- results from the runner

    def after_prefill(self, end: int, logits: torch.Tensor | None = None) -> None:
        """Prompt tokens up to `end` are in the KV slot. Once the whole prompt is in, the first
        token is chosen from `logits` (1, vocab), the logits after the last prompt token, or,
        without them, comes from `take_token` (a reply that `chooses_argmax`: the loop reads
        it with the step's other ids)."""
        self.prefilled = end
        if self.talker is not None:
            self.talker_prefilled = self.prepared.talker_feed.tokens_before(end)
        if end < self.prompt.length:
            return
        self.clock.mark("prefilled")
        self.timings["prefill_tokens"] = float(self.prompt.length - self.reused)
        self.phase = Phase.DECODING
        if logits is not None:
            self.take_token(self._choose(logits))

    def token_fed(self, state: torch.Tensor) -> None:
        """A thinker step fed the pending token; `state` (1, 1, H) is what the talker reads of
        it (its final hidden state + its embedding, on the device). The next token comes from
        `take_token` (the batch's argmax) or `choose` (these logits)."""
        token = self.pending_token
        self.pending_token = None
        self.fed.append(token)
        talker = self.talker
        if (talker is not None and talker.open and not talker.finished
                and not self.prepared.talker_feed.reads_chosen):
            talker.stream.append(StreamElement(token, state))
        if self.history is not None:
            self.history = torch.cat([self.history, torch.tensor([[token]], device=self.device)], 1)

    @property
    def chooses_argmax(self) -> bool:
        """The next token is the logits' argmax (greedy, no processor, no grammar): the loop
        reads it with the step's other ids instead of handing this reply the logits."""
        return self.decoder is None and self.sampler.plain_greedy

    def choose(self, logits: torch.Tensor) -> None:
        """The next token from the (1, vocab) logits of the step that fed the last one."""
        self.take_token(self._choose(logits))

    def after_talker_frame(self, frame: list[int]) -> None:
        """The talker's next frame (its codes; the first may be an end code)."""
        talker = self.talker
        talker.last_frame = frame
        if frame[0] in talker.end_codes:
            return
        talker.codes += 1
        self.audio.push(frame)

    def take_audio(self, samples: np.ndarray) -> None:
        if len(samples) == 0:
            return
        now = time.monotonic()
        if self.first_audio_at is None:
            self.first_audio_at = now
            self.timings["first_audio_s"] = now - self.arrived
        self.audio_samples += len(samples)
        self.emit(AudioDelta(samples))

    def finish(self) -> None:
        """Emit the final delta (the reply is complete)."""
        self.phase = Phase.DONE
        t = self.timings
        t["total_s"] = time.monotonic() - self.arrived
        t["audio_s"] = self.audio_samples / 24_000
        t["decode_steps"] = float(len(self.fed) + (self.talker.codes if self.talker else 0))
        for name, (start, end) in PHASES.items():
            seconds = self.clock.seconds(start, end)
            if seconds is not None:
                t[name] = seconds
        if self.audio is not None and self.audio.first_chunk_codes:
            t["first_chunk_codes"] = float(self.audio.first_chunk_codes)
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("reply %s (%s) done: %s", self.request.request_id, self.request.priority,
                         "  ".join(f"{name} {value:.3f}" for name, value in t.items()))
        # a forced call's teacher-forced envelope went through the prefill but belongs to the reply
        envelope = len(self.tokenizer.encode(self.prepared.forced_prefix, add_special_tokens=False))
        output_tokens = self.forced_fixed + len(self.forced_ids) if self.forced else self.reply_tokens
        self.emit(Finished(
            reason="tool_calls" if self.tool_calls else self.reason,
            input_tokens=self.prompt.length - envelope, input_audio_tokens=self.prompt.audio_tokens,
            input_image_tokens=self.prompt.image_tokens, input_video_tokens=self.prompt.video_tokens,
            output_text_tokens=output_tokens,
            output_audio_tokens=self.talker.codes if self.talker else 0, timings=dict(t)))

    # ----------------------------------------------------------------- thinker tokens

    def _choose(self, logits: torch.Tensor) -> int:
        if self.decoder is not None:
            return self.decoder.choose(logits, lambda masked: self.sampler(masked))
        return self.sampler(logits, self.history)

    def take_token(self, token: int) -> None:
        """A sampled reply token: stop, or feed it at the next step (like generate(), the last
        sampled token is never fed back)."""
        self.reply_tokens += 1
        if self.decoder is not None:
            self.forced_ids.append(token)
            if self.decoder.done:
                self._finish_forced_call()
            else:
                self.pending_token = token
            return
        ended = token in self.stop_ids
        if not ended:
            self.text.push(token)
        if token == self.tool_open_id and self.talker is not None:
            self._close_speech()  # tool calls are not spoken
        if ended or self.reply_tokens >= self.max_new:
            self.reason = "stop" if ended else "length"
            self.text.finish()
            self._end_thinker()
        else:
            self.pending_token = token
            talker = self.talker
            if self.prepared.talker_feed.reads_chosen and talker is not None and talker.open:
                # every token that will be fed, as soon as it is chosen (the last one, never
                # fed, is not spoken: generate() builds the talker's text from the fed ones)
                talker.stream.append(StreamElement(token))

    def _end_thinker(self) -> None:
        self.thinker_done = True
        self._close_speech()

    def _close_speech(self) -> None:
        if self.talker is not None:
            self.talker.close()

    # ----------------------------------------------------------------- forced tool call

    def _forced_grammar(self, prefix: str):
        from .constrained import arguments_schema, call_schema  # xgrammar only when forced
        single = len(self.forced) == 1
        suffix = "}\n</tool_call>" if single else "\n</tool_call>"
        self.forced_fixed = len(self.tokenizer.encode(prefix + suffix, add_special_tokens=False)) + 1
        budget = min(self.settings.max_tool_argument_tokens, max(self.max_new - self.forced_fixed, 0))
        schema = arguments_schema(self.forced[0]) if single else call_schema(self.forced)
        return schema, budget

    def _finish_forced_call(self) -> None:
        body = self.tokenizer.decode(self.forced_ids, skip_special_tokens=True)
        if len(self.forced) == 1:
            self._emit_call(ToolCallDelta(new_call_id(), self.forced[0]["name"], body))
        else:
            payload = json.loads(body)
            self._emit_call(ToolCallDelta(new_call_id(), payload["name"],
                                          json.dumps(payload["arguments"], ensure_ascii=False)))
        self.reason = "tool_calls"
        self.thinker_done = True

    # ----------------------------------------------------------------- output

    def _emit_text(self, text: str) -> None:
        self.timings.setdefault("first_text_s", time.monotonic() - self.arrived)
        self.emit(TextDelta(text))

    def _emit_call(self, call: ToolCallDelta) -> None:
        self.tool_calls += 1
        self.emit(call)


class _TextChannel:
    """Token ids → transcript TextDeltas and ToolCallDeltas.

    It holds its reply's callbacks weakly: strong bound methods made a reference cycle
    (reply → channel → reply), so every finished reply, with its request's whole context
    (all of the conversation's audio), waited for Python's full garbage collection, which a
    busy worker runs rarely: memory grew by megabytes a turn between collections."""

    def __init__(self, tokenizer, on_text, on_call) -> None:
        self.decoder = IncrementalDecoder(tokenizer)
        self.parser = ToolCallParser()
        self._on_text = weakref.WeakMethod(on_text)
        self._on_call = weakref.WeakMethod(on_call)

    def on_text(self, item) -> None:
        self._on_text()(item)

    def on_call(self, item) -> None:
        self._on_call()(item)

    def push(self, token_id: int) -> None:
        self._route(self.parser.feed(self.decoder.push(token_id)))

    def finish(self) -> None:
        self._route(self.parser.feed(self.decoder.flush()))
        self._route(self.parser.finish())

    def _route(self, items) -> None:
        for item in items:
            if isinstance(item, ToolCallDelta):
                self.on_call(item)
            else:
                self.on_text(item)


def max_new_tokens(settings: GenerationSettings, request: GenerationRequest) -> int:
    limit = settings.max_new_tokens
    requested = request.max_output_tokens
    if requested is not None and not (isinstance(requested, float) and math.isinf(requested)):
        limit = min(limit, int(requested))
    return max(limit, 1)
