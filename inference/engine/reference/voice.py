"""The spoken side of one reply: thinker states in, codec codes out, audio chunks out.

The talker reads a "reply stream", one element per step: the (final hidden state + input
embedding) of each reply token the thinker has fed, then the text-eos embedding once the
spoken text is over, then the text-pad embedding for as long as it keeps talking. This is
`thinker_reply_part` of `Qwen2_5OmniForConditionalGeneration.generate`, built as it comes.
The first element goes into the talker's prefill; every later one is one decode step.
"""

from __future__ import annotations

import math
import time
from collections import deque
from typing import Callable

import numpy as np
import torch

from .phases import PhaseClock
from .prompt import Prompt
from .sampling import SamplingParams, TokenSampler
from .talker import TalkerRunner, TalkerStaticStep
from .token2wav_runner import Token2WavRunner
from .token2wav_stream import ChunkPlan, StreamingToken2Wav


def codes_per_second(model) -> float:
    """Talker codes per second of speech (50 for Qwen2.5-Omni: 2 mel frames of 240 samples)."""
    dit = model.token2wav.code2wav_dit_model
    samples_per_frame = math.prod(model.token2wav.code2wav_bigvgan_model.config.upsample_rates)
    return 24_000 / (dit.repeats * samples_per_frame)


def max_codes_for(model, seconds: float) -> int:
    return max(1, int(seconds * codes_per_second(model)))


class Voice:
    def __init__(self, model, speaker: str, prompt: Prompt, prompt_states: torch.Tensor,
                 embed: Callable[[int], torch.Tensor], *, token2wav: Token2WavRunner,
                 sampling: SamplingParams, chunk_plan: ChunkPlan, min_seconds: float,
                 max_seconds: float, device: torch.device, generator: torch.Generator,
                 cancelled: Callable[[], bool], on_audio: Callable[[np.ndarray], None],
                 talker_static: TalkerStaticStep | None = None,
                 clock: PhaseClock | None = None) -> None:
        self.model = model
        self.speaker_name = speaker
        self.speaker = model.speaker_map[speaker]
        self.token2wav = token2wav
        self.talker_static = talker_static
        self.clock = clock or PhaseClock(device)
        self.prompt = prompt
        self.prompt_states = prompt_states  # (hidden + embedding) of every prompt token
        self.embed = embed
        self.sampling = sampling
        self.chunk_plan = chunk_plan
        self.device = device
        self.generator = generator
        self.cancelled = cancelled
        self.on_audio = on_audio
        config = model.talker.config
        self.text_eos = embed(config.tts_text_end_token_id)
        self.text_pad = embed(config.tts_text_pad_token_id)
        self.max_codes = max_codes_for(model, max_seconds)
        self.min_codes = min(int(min_seconds * codes_per_second(model)), self.max_codes)
        self.stream: deque[tuple[int | None, torch.Tensor]] = deque()
        self.open = True              # spoken text still coming
        self.talker: TalkerRunner | None = None
        self.audio: StreamingToken2Wav | None = None
        self.codes = 0
        self.token2wav_time = 0.0

    @property
    def idle(self) -> bool:
        """Nothing left to do once the text is over (check after `close()`)."""
        return self.talker.finished if self.talker is not None else not self.stream

    def add(self, token_id: int, state: torch.Tensor) -> None:
        """A reply token the thinker has just fed, with its (hidden + embedding)."""
        if self.open and not (self.talker is not None and self.talker.finished):
            self.stream.append((token_id, state))

    def close(self) -> None:
        """The spoken text is over (end of reply, length limit, or a tool call begins)."""
        if self.open:
            self.stream.append((None, self.text_eos))
            self.open = False

    def step(self) -> None:
        """One talker step, when it has something to read."""
        if self.talker is None:
            if self.stream and self.stream[0][0] is None:
                self.stream.clear()  # the reply has no spoken text: nothing to say
            elif self.stream:
                self._start(*self.stream.popleft())
                self._after_code()
        elif not self.talker.finished:
            if self.stream:
                self.talker.step(self.stream.popleft()[1])
                self._after_code()
            elif not self.open:
                self.talker.step(self.text_pad)
                self._after_code()

    def flush(self) -> None:
        if self.audio is not None:
            self._decode(self.audio.flush)

    def release(self) -> None:
        if self.talker is not None:
            self.talker.release()
        self.stream.clear()
        self.prompt_states = None

    def _start(self, first_id: int, first_state: torch.Tensor) -> None:
        dit = self.model.token2wav.code2wav_dit_model
        self.talker = TalkerRunner(
            self.model.talker, codebook_size=dit.config.num_embeds + 1,
            sampler_factory=lambda suppress: TokenSampler(
                self.sampling, self.device, suppress_ids=suppress, generator=self.generator),
            max_codes=self.max_codes, min_codes=self.min_codes, device=self.device,
            static=self.talker_static)
        audio_lengths = None
        if self.prompt.feature_attention_mask is not None:
            audio_lengths = self.prompt.feature_attention_mask.sum(dim=1)  # the talker wants it on the CPU
        bos_id = int(self.speaker["bos_token"])
        self.talker.start(self.prompt.input_ids, self.prompt_states, bos_id, self.embed(bos_id),
                          first_id, first_state, audio_lengths)
        self.prompt_states = None  # in the talker's KV cache now
        self.clock.mark("talker_started")
        self.audio = StreamingToken2Wav(self.token2wav, self.speaker_name, self.chunk_plan,
                                        self.generator, self.cancelled, self.clock)

    def _after_code(self) -> None:
        code = self.talker.last_code
        if code in self.talker.end_codes:
            return
        self.codes += 1
        self.audio.push(code)
        if self.audio.ready():
            self._decode(self.audio.decode_chunk)

    def _decode(self, decode: Callable[[], np.ndarray]) -> None:
        started = time.monotonic()
        samples = decode()
        self.token2wav_time += time.monotonic() - started
        self.on_audio(samples)
