"""The contract between the engine and a model family, declared as types.

The loop (core.py), the scheduler, the replies and the engine's face know a family only
through these: a `ModelFamily` (loading, voices, prompt style, rope positions, and what it
builds), the `ModelRunner` it builds (what runs on the device), and one `AudioStream` per
spoken reply (which codes make the next audio chunk, and the audio that comes back). Runners
read replies through `ReplyView` and never write their state: the loop does.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ContextManager, Protocol, Sequence

import numpy as np
import torch

from ...base import ImageSpec
from ..pending_audio import PendingWaves
from ..prompt import Prompt, PromptStyle
from ..sampling import SamplingParams


@dataclass(frozen=True)
class TalkerFeed:
    """What one reply's talker reads, and when: the family's answer, per prompt.

    Its prompt part reads the thinker's states of the prompt tokens at `sources` (in order;
    None: every prompt token, in lockstep with the thinker). In its decode steps it reads each
    reply token as soon as the thinker chooses it (`reads_chosen`), or once a thinker step has
    fed it, with that step's state."""
    prompt_length: int
    reads_chosen: bool
    sources: np.ndarray | None = None

    def tokens_before(self, position: int) -> int:
        """Tokens of the talker's prompt part that come from prompt tokens before `position`
        (its KV slot holds those once the thinker's holds [0, position))."""
        if self.sources is None:
            return position
        return int(np.searchsorted(self.sources, position))

    def source(self, index: int) -> int:
        """The prompt position the talker's prompt token `index` comes from (the prompt's
        length past its last one)."""
        if self.sources is None:
            return index
        return int(self.sources[index]) if index < len(self.sources) else self.prompt_length

    @property
    def length(self) -> int:
        """Tokens in the talker's prompt part."""
        return self.prompt_length if self.sources is None else len(self.sources)


@dataclass
class Positions:
    """The rope positions of a prepared prompt (computed on the CPU, off the loop) and what
    its talker reads."""
    thinker: torch.Tensor             # (3, 1, L)
    thinker_delta: int                # decode position = KV length + delta
    talker: torch.Tensor | None       # (3, 1, T): the talker's prompt part and its start rows
    talker_delta: int
    talker_feed: TalkerFeed


class AudioStream(Protocol):
    """One spoken reply's audio decoding: the codes it has, what the next chunk needs, and
    the audio a chunk gives back. The family's runner decodes chunks in batches
    (`ModelRunner.launch_audio`)."""

    def push(self, frame: list[int]) -> None:
        """A new codec frame from the talker."""

    def ready(self) -> bool:
        """Whether the next chunk's codes are all there."""

    def has_rest(self) -> bool:
        """Whether codes are left that no chunk has read yet (the last chunk, at the end)."""

    @property
    def in_flight(self) -> bool:
        """Whether a chunk is being decoded."""

    def codes_ahead(self) -> int:
        """Codes made beyond what the chunks so far have read."""

    def codes_for_next_chunk(self) -> int:
        """Codes the next chunk waits for."""

    def start_quickly(self) -> None:
        """Make the first chunk without look-ahead (an idle engine's quick start)."""

    def take_audio(self, wave: Any) -> np.ndarray:
        """The chunk's audio as the listener hears it, from what the decoder gave back."""


class ReplyView(Protocol):
    """What a runner reads of a reply (the loop alone writes reply state)."""
    slot: int
    voice: str
    prompt: Prompt
    prepared: Any          # reply.PreparedPrompt: positions and deltas
    generator: torch.Generator | None
    pending_token: int | None
    fed: Sequence
    talker: Any            # reply.TalkerState: length, codes, the reply stream it reads
    audio: AudioStream


@dataclass(frozen=True)
class ProfiledStep:
    """One step of a runner as the GPU benchmark's step profile times it (bench/reference/):
    `prepare` once, then `run` as often as the timing needs. `prepare` points the step's
    inputs at its pool's scratch row, so that running it touches no session's KV."""
    run: Callable[[], object]
    prepare: Callable[[], object] = lambda: None


class ThinkerStepResult(Protocol):
    state: torch.Tensor
    logits: torch.Tensor
    argmax: torch.Tensor


class ModelRunner(Protocol):
    """What runs on the device: a family's model over the engine's KV pools and graphs.
    Every method launches work without waiting for the device, except `read`."""
    device: torch.device
    codes_per_frame: int           # codes the talker makes a step (a frame)
    talker_start_rows: int         # talker rows `talker_start` writes after its prompt part
    talker_beside_thinker: bool    # the talker's step goes first, reading earlier steps
    encoder_cache: Any             # encoder_cache.EncoderCache (clips and, where read, pictures)
    audio_decoder: Any             # the family's codes → audio (its `graphed`, its streams)

    def prefill(self, reply: ReplyView, start: int, end: int) -> torch.Tensor | None:
        """Prompt tokens [start, end) into the reply's slot; the logits after the last prompt
        token when `end` is the prompt's end, else None."""

    def thinker_step(self, replies: Sequence[ReplyView]) -> ThinkerStepResult:
        """One thinker decode step for the replies (each feeds its pending token)."""

    def talker_start(self, reply: ReplyView) -> torch.Tensor:
        """The talker's start for one reply (after its prompt part); its first frame."""

    def talker_step(self, replies: Sequence[ReplyView]) -> torch.Tensor:
        """One talker step per reply; each reply's next frame, (B, codes_per_frame)."""

    def launch_audio(self, replies: Sequence[ReplyView]) -> PendingWaves:
        """The replies' next audio chunks as one batch; the audio comes to the host later."""

    def read(self, *ids: torch.Tensor) -> list[list[int]]:
        """Integer tensors on the device as lists on the host, in one copy."""

    def loop_stream(self) -> ContextManager: ...
    def talker_side(self) -> ContextManager: ...
    def synchronize(self) -> None: ...
    def release(self) -> None: ...

    def describe(self) -> dict[str, Any]:
        """What the runner is, for the start-up log, /health and the benchmarks."""

    def profiled_steps(self) -> dict[str, dict[str, ProfiledStep]]:
        """The steps a profile times, by part ("thinker", "vocoder", ...) and shape (a batch
        bucket, "frames/batch", ...): its captured graphs, and on the way to the first audio
        the eager work a family has there. Only while no reply runs: the steps share the
        loop's buffers."""


class PublishedShapes(Protocol):
    """A family's released model at its published sizes with random weights (its `shapes.py`):
    what benchmarks run with nothing downloaded, as vLLM's dummy weights do."""
    NAME: str  # the released model, e.g. "Qwen3-Omni-30B-A3B"

    def published_config(self) -> tuple[Any, Any]:
        """(config, processor): the released config; the processor is the tiny model's."""

    def write_extras(self, config, processor, folder: Path) -> None:
        """What a checkpoint folder holds beside its config and processor (voices, say)."""

    def random_model(self, config, processor, device: torch.device, dtype: torch.dtype,
                     folder: Path | None = None):
        """A `LoadedModel` of random weights for `config`, built on `device` directly;
        `folder`: where `write_extras` wrote, if the model is read from a folder."""


class ModelFamily:
    """A model family: what the engine asks of it. Subclasses are registered in
    models/__init__.py under the checkpoint `model_type`s they read."""
    name: str = ""
    title: str = ""
    model_types: tuple[str, ...] = ()
    tiny_name: str = ""            # its tiny random model's name (`--model tiny-random`, …)
    name_hints: tuple[str, ...] = ()  # what a hub id's name says when it names the family
    published: PublishedShapes  # its released model's shapes, for random weights
    style: PromptStyle
    talker_sampling: SamplingParams   # the talker's sampling, as the family's generate()
    # whether its prompts read pictures (`UserImage`: `style.image` says how, the runner's
    # `encoder_cache` encodes them, `positions` places them); the engine refuses them if not
    reads_images: bool = False
    # whether its prompts read video with its speech (`UserVideo`: `style.video` lays it out,
    # the runner's `encoder_cache` encodes its frames, `positions` places it); refused if not
    reads_video: bool = False
    image_spec: ImageSpec | None = None  # what the worker resizes pictures to (when it reads them)

    def load(self, model: str, device: torch.device, dtype: torch.dtype):
        """A `LoadedModel` (loading.py) of `model`."""
        raise NotImplementedError

    def tiny_model_dir(self) -> Path:
        """Its tiny random model's folder, built on first use and cached."""
        raise NotImplementedError

    def load_with(self, model: str, device: torch.device, dtype: torch.dtype, options):
        """`load` under the family's options (those that change what is loaded, such as the
        weights' precision); by default the options change nothing there."""
        return self.load(model, device, dtype)

    def image_spec_for(self, processor) -> ImageSpec | None:
        """`image_spec` within what the loaded processor reads without resizing again."""
        return self.image_spec

    def voices(self, model) -> tuple[str, ...]:
        """Voice names, the default first."""
        raise NotImplementedError

    def kv_configs(self, model) -> tuple:
        """(thinker text config, talker text config): what sizes the KV pools."""
        raise NotImplementedError

    def codes_per_second(self, model) -> float:
        """Talker frames per second of speech."""
        raise NotImplementedError

    def talker_end_codes(self, model) -> set[int]:
        raise NotImplementedError

    def positions(self, model, prompt: Prompt, voice: str, speaks: bool) -> Positions:
        raise NotImplementedError

    def runner(self, model, processor, **options) -> ModelRunner:
        raise NotImplementedError

    def audio_stream(self, runner: ModelRunner, settings) -> Callable[..., AudioStream]:
        """A factory (voice, noise generator, phase clock) → one reply's audio stream."""
        raise NotImplementedError
