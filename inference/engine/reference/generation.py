"""One reply, generated step by step in a worker thread: thinker → talker → token2wav.

Each loop iteration is one "decode step": the thinker feeds its last token (which yields
that token's hidden state for the talker) and samples the next; the `Voice` takes one reply
element, samples one codec code and, whenever enough codes are there, turns the next chunk
into audio. Text, audio and tool calls leave through `emit` as they are made.

The talker trails the thinker by one token, exactly the data dependency of the offline
`generate()`: its step j needs the thinker's hidden state of reply token j.
"""

from __future__ import annotations

import json
import logging
import math
import secrets
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..base import AudioDelta, Finished, GenerationRequest, TextDelta, ToolCallDelta
from ..tool_calls import OPEN_TAG, ToolCallParser, new_call_id
from .constrained import CLOSING_LIMIT, GrammarFactory, arguments_schema, call_schema
from .decode_slots import DecodeSlot, DecodeSlots
from .detokenize import IncrementalDecoder
from .loading import LoadedModel
from .phases import PhaseClock
from .prompt import Prompt, build_prompt, tools_offered
from .sampling import TALKER_SAMPLING, SamplingParams, TokenSampler
from .thinker import ThinkerRunner
from .token2wav_runner import Token2WavRunner
from .token2wav_stream import Cancelled, ChunkPlan
from .voice import Voice

logger = logging.getLogger(__name__)

# Finished.timings entries measured between PhaseClock marks (GPU time on CUDA): the path to
# the first audio, phase by phase.
PHASES = {
    "prefill_s": ("prefill_start", "prefilled"),              # audio encoder + thinker prefill
    "audio_encoder_s": ("prefill_start", "audio_encoded"),
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
    chunk_plan: ChunkPlan = field(default_factory=ChunkPlan)
    seed: int | None = None
    talker_sampling: SamplingParams = TALKER_SAMPLING


class Generation:
    """Run with `run()`; it returns when the reply is complete or `cancelled()` turns true."""

    def __init__(self, loaded: LoadedModel, grammar: GrammarFactory,
                 settings: GenerationSettings, request: GenerationRequest, voice: str,
                 emit: Callable[[object], None], cancelled: Callable[[], bool],
                 on_step: Callable[[], None], arrived: float, queue_wait: float,
                 token2wav: Token2WavRunner, slots: DecodeSlots | None = None) -> None:
        self.model = loaded.model
        self.token2wav = token2wav
        self.slots = slots
        self.processor = loaded.processor
        self.tokenizer = loaded.processor.tokenizer
        self.device = loaded.device
        self.grammar = grammar
        self.settings = settings
        self.request = request
        self.voice_name = voice
        self._emit = emit
        self.cancelled = cancelled
        self.on_step = on_step
        self.arrived = arrived
        self.timings: dict[str, float] = {"queue_wait_s": queue_wait}
        self.audio_samples = 0
        self.output_tokens = 0
        self.decode_steps = 0
        self.decode_time = 0.0
        self.tool_calls = 0
        self.prompt_tokens_in_reply = 0
        self.voice: Voice | None = None
        self.clock = PhaseClock(self.device)
        seed = settings.seed if settings.seed is not None else secrets.randbits(63)
        self.generator = torch.Generator(device=self.device).manual_seed(seed)

    # ----------------------------------------------------------------- entry point

    def run(self) -> None:
        slot = thinker = None
        try:
            with torch.inference_mode():
                started = time.monotonic()
                forced = self._forced_tools()
                prefix = self._forced_prefix(forced)
                prompt = build_prompt(self.processor, self.request, forced_prefix=prefix)
                self.timings["prompt_s"] = time.monotonic() - started
                slot = self._borrow_slot(prompt, forced)
                thinker = ThinkerRunner(self.model.thinker, self.device,
                                        slot.thinker if slot is not None else None, self.clock)
                self.clock.mark("prefill_start")
                out = thinker.prefill(prompt)
                self.clock.mark("prefilled")
                if forced:
                    reason = self._forced_call(thinker, out.logits, forced, prefix)
                else:
                    reason = self._reply(thinker, prompt, out, slot)
        finally:
            if thinker is not None:
                thinker.release()
            if self.voice is not None:
                self.voice.release()
            if slot is not None:  # later GPU work on the slot is queued after this reply's
                self.slots.release(slot)
        self.timings["static_decode"] = float(slot is not None)
        self._finish(reason, prompt)

    def _borrow_slot(self, prompt: Prompt, forced) -> DecodeSlot | None:
        """A decode slot of the fast path, if there is one and the reply surely fits in it."""
        if self.slots is None:
            return None
        needed = prompt.input_ids.shape[1] + self._max_new_tokens()
        if forced:
            needed += CLOSING_LIMIT  # a forced call may run past its budget to close its JSON
        if needed > self.slots.thinker_capacity:
            logger.info("prompt (%d tokens) + reply may exceed the static KV cache (%d tokens): "
                        "decoding eagerly", prompt.input_ids.shape[1], self.slots.thinker_capacity)
            return None
        return self.slots.acquire()

    # ----------------------------------------------------------------- free reply

    def _reply(self, thinker: ThinkerRunner, prompt: Prompt, prefill,
               slot: DecodeSlot | None) -> str:
        """A free reply: text (and speech) until the end of turn or a length limit."""
        sampler = TokenSampler(SamplingParams.from_generation_config(
            self.model.thinker.generation_config), self.device, generator=self.generator)
        stop_ids = self._stop_ids()
        tool_open_id = self._single_token_id(OPEN_TAG)
        max_new = self._max_new_tokens()
        text = _TextChannel(self.tokenizer, self._emit_text, self._emit_call)
        voice = None
        if "audio" in self.request.modalities:
            voice = Voice(
                self.model, self.voice_name, prompt, prefill.hidden + prefill.embeds, thinker.embed,
                token2wav=self.token2wav, sampling=self.settings.talker_sampling,
                chunk_plan=self.settings.chunk_plan, min_seconds=self.settings.min_audio_seconds,
                max_seconds=self.settings.max_audio_seconds, device=self.device,
                generator=self.generator, cancelled=self.cancelled, on_audio=self._emit_audio,
                talker_static=slot.talker if slot is not None else None, clock=self.clock)
        self.voice = voice

        history = prompt.input_ids.to(self.device)  # for a repetition penalty, if configured
        token = sampler(prefill.logits, history if sampler.needs_history else None)
        reply_tokens = 0
        thinker_done = False
        reason = "stop"
        while True:
            if self.cancelled():
                raise Cancelled()
            step_started = time.monotonic()
            if not thinker_done:
                reply_tokens += 1
                ended = token in stop_ids
                if not ended:
                    text.push(token)
                if token == tool_open_id and voice is not None:
                    voice.close()  # tool calls are not spoken
                if ended or reply_tokens >= max_new:
                    # like generate(), the last sampled token is never fed back
                    thinker_done = True
                    reason = "stop" if ended else "length"
                    text.finish()
                    if voice is not None:
                        voice.close()
                else:
                    fed = thinker.step([token])
                    if voice is not None:
                        voice.add(token, fed.hidden + fed.embeds)
                    if sampler.needs_history:
                        history = torch.cat([history, torch.tensor([[token]], device=self.device)], 1)
                    token = sampler(fed.logits, history if sampler.needs_history else None)
            if voice is not None:
                voice.step()
            self._count_step(step_started)
            if thinker_done and (voice is None or voice.idle):
                break

        self.output_tokens = reply_tokens
        if voice is not None:
            flush_started = time.monotonic()
            voice.flush()
            self.decode_time += time.monotonic() - flush_started
        if self.tool_calls:
            reason = "tool_calls"
        return reason

    def _count_step(self, started: float) -> None:
        self.decode_steps += 1
        self.decode_time += time.monotonic() - started
        self.on_step()

    # ----------------------------------------------------------------- forced tool call

    def _forced_tools(self) -> list[dict] | None:
        """The tools a call must be made to, or None when the model is free to answer."""
        choice = self.request.tool_choice
        if choice in ("auto", "none"):
            return None
        tools = [entry["function"] for entry in tools_offered(self.request)]
        if not tools:
            raise ValueError(f"tool_choice {choice!r} needs at least one tool")
        if choice == "required":
            return tools
        named = [tool for tool in tools if tool["name"] == choice]
        if not named:
            raise ValueError(f"tool_choice names an unknown tool: {choice!r}")
        return named

    @staticmethod
    def _forced_prefix(forced: list[dict] | None) -> str:
        if not forced:
            return ""
        if len(forced) == 1:  # the envelope and the name are known: teacher-force them
            return f'{OPEN_TAG}\n{{"name": "{forced[0]["name"]}", "arguments": '
        return f"{OPEN_TAG}\n"

    def _forced_call(self, thinker: ThinkerRunner, logits: torch.Tensor, forced: list[dict],
                     prefix: str) -> str:
        single = len(forced) == 1
        suffix = "}\n</tool_call>" if single else "\n</tool_call>"
        fixed_tokens = len(self.tokenizer.encode(prefix + suffix, add_special_tokens=False)) + 1
        budget = min(self.settings.max_tool_argument_tokens,
                     max(self._max_new_tokens() - fixed_tokens, 0))
        schema = arguments_schema(forced[0]) if single else call_schema(forced)
        decoder = self.grammar.decoder(schema, budget)
        sampler = TokenSampler(SamplingParams.from_generation_config(
            self.model.thinker.generation_config), self.device, generator=self.generator)
        ids: list[int] = []
        while True:
            if self.cancelled():
                raise Cancelled()
            step_started = time.monotonic()
            ids.append(decoder.choose(logits, lambda masked: sampler(masked)))
            done = decoder.done
            if not done:
                logits = thinker.step([ids[-1]]).logits
            self._count_step(step_started)
            if done:
                break
        body = self.tokenizer.decode(ids, skip_special_tokens=True)
        self.output_tokens = fixed_tokens + len(ids)
        # the teacher-forced envelope went through the prefill but belongs to the reply
        self.prompt_tokens_in_reply = len(self.tokenizer.encode(prefix, add_special_tokens=False))
        if single:
            self._emit_call(ToolCallDelta(new_call_id(), forced[0]["name"], body))
        else:
            payload = json.loads(body)
            self._emit_call(ToolCallDelta(new_call_id(), payload["name"],
                                       json.dumps(payload["arguments"], ensure_ascii=False)))
        return "tool_calls"

    # ----------------------------------------------------------------- output

    def _emit_text(self, text: str) -> None:
        self.timings.setdefault("first_text_s", time.monotonic() - self.arrived)
        self._emit(TextDelta(text))

    def _emit_call(self, call: ToolCallDelta) -> None:
        self.tool_calls += 1
        self._emit(call)

    def _emit_audio(self, samples) -> None:
        if len(samples) == 0:
            return
        self.timings.setdefault("first_audio_s", time.monotonic() - self.arrived)
        self.audio_samples += len(samples)
        self._emit(AudioDelta(samples))

    def _finish(self, reason: str, prompt: Prompt) -> None:
        self.timings["total_s"] = time.monotonic() - self.arrived
        self.timings["audio_s"] = self.audio_samples / 24_000
        self.timings["decode_steps"] = float(self.decode_steps)
        self.timings["decode_s"] = self.decode_time  # all decode steps, token2wav included
        voice = self.voice
        self.timings["token2wav_s"] = voice.token2wav_time if voice is not None else 0.0
        for name, (start, end) in PHASES.items():
            seconds = self.clock.seconds(start, end)
            if seconds is not None:
                self.timings[name] = seconds
        if voice is not None and voice.audio is not None and voice.audio.first_chunk_codes:
            self.timings["first_chunk_codes"] = float(voice.audio.first_chunk_codes)
        self._emit(Finished(
            reason=reason, input_tokens=int(prompt.input_ids.shape[1]) - self.prompt_tokens_in_reply,
            input_audio_tokens=prompt.audio_tokens, output_text_tokens=self.output_tokens,
            output_audio_tokens=voice.codes if voice is not None else 0, timings=dict(self.timings)))

    # ----------------------------------------------------------------- helpers

    def _max_new_tokens(self) -> int:
        limit = self.settings.max_new_tokens
        requested = self.request.max_output_tokens
        if requested is not None and not (isinstance(requested, float) and math.isinf(requested)):
            limit = min(limit, int(requested))
        return max(limit, 1)

    def _stop_ids(self) -> set[int]:
        eos = self.model.thinker.generation_config.eos_token_id
        ids = set(eos if isinstance(eos, (list, tuple)) else [eos] if eos is not None else [])
        for marker in ("<|im_end|>", "<|endoftext|>"):  # end of turn / of text in Qwen chats
            token_id = self._single_token_id(marker)
            if token_id is not None:
                ids.add(token_id)
        return ids

    def _single_token_id(self, text: str) -> int | None:
        token_id = self.tokenizer.convert_tokens_to_ids(text)
        return token_id if isinstance(token_id, int) and token_id != self.tokenizer.unk_token_id else None



class _TextChannel:
    """Token ids → transcript TextDeltas and ToolCallDeltas."""

    def __init__(self, tokenizer, on_text, on_call) -> None:
        self.decoder = IncrementalDecoder(tokenizer)
        self.parser = ToolCallParser()
        self.on_text = on_text
        self.on_call = on_call

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
